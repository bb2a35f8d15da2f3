// Tests of the plaintext file system driven directly, without FUSE, on a vault in a
// temp dir: lookup and forget counts, readdir offsets, renames with long-name
// sidecars, the modes of new entries, and descriptors after failed opens.
@testable import CofferCrypto
import CofferSystem
import CofferVault
@testable import CofferFileSystem
import Foundation
import Glibc
import Synchronization
import TestSupport
import XCTest

final class PlainFileSystemTests: FileSystemTestCase {
    /// Creates a file and closes the handle; the kernel would then hold one lookup.
    @discardableResult
    func makeFile(_ text: String, in parent: UInt64? = nil, contents: [UInt8] = [], mode: mode_t = 0o644) throws -> UInt64 {
        let (entry, handle) = try fs.create(parent: parent ?? root, name: name(text), mode: mode, flags: O_RDWR, caller: me)
        if !contents.isEmpty {
            XCTAssertEqual(try contents.withUnsafeBytes { try fs.write(handle, $0, at: 0, caller: me) }, contents.count)
        }
        fs.release(handle)
        return entry.node
    }

    func contents(of node: UInt64) throws -> [UInt8] {
        let handle = try fs.open(node, flags: O_RDONLY, caller: me)
        defer { fs.release(handle) }
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        let n = try buffer.withUnsafeMutableBytes { try fs.read(handle, into: $0, at: 0) }
        return Array(buffer.prefix(n))
    }

    func listing(_ node: UInt64) throws -> [String] {
        let handle = try fs.opendir(node)
        defer { fs.releasedir(handle) }
        return try fs.readdir(handle, from: 0).map { String(decoding: $0.name, as: UTF8.self) }
    }

    /// Backing entries below the vault whose name starts with `prefix`.
    func backing(prefix: String) -> [String] {
        dir.allFiles().map { ($0 as NSString).lastPathComponent }.filter { $0.hasPrefix(prefix) }.sorted()
    }

    func assertErrno(_ code: Int32, _ body: @autoclosure () throws -> Any, _ message: String = "",
                     file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertThrowsError(try body(), message, file: file, line: line) {
            XCTAssertEqual(($0 as? Errno)?.code, code, "\($0) \(message)", file: file, line: line)
        }
    }

    // MARK: Lookup and forget

    func testLookupsAreCountedAndForgetFreesTheNodeAtZero() throws {
        let created = try makeFile("a")
        XCTAssertEqual(fs.nodeCount, 1)
        let first = try fs.lookup(parent: root, name: name("a"))
        let second = try fs.lookup(parent: root, name: name("a"))
        XCTAssertEqual(first.node, created, "one backing inode, one node")
        XCTAssertEqual(second.node, created)
        XCTAssertEqual(fs.nodeCount, 1)
        XCTAssertEqual(fs.nodes.lookups(created), 3, "create and two lookups")

        fs.forget(created, count: 2)
        XCTAssertEqual(fs.nodeCount, 1, "one lookup is left")
        XCTAssertTrue(fs.knownNodes().contains(created))
        fs.forget(created, count: 1)
        XCTAssertEqual(fs.nodeCount, 0, "the last forget frees the node")
        XCTAssertFalse(fs.knownNodes().contains(created))
        XCTAssertEqual(fs.knownNodes(), [root], "only the root stays known")

        fs.forget(root, count: 5)
        XCTAssertEqual(try fs.getattr(root).st_mode & S_IFMT, S_IFDIR, "forgetting the root is ignored")

        assertErrno(ENOENT, try fs.lookup(parent: root, name: name("missing")))
        XCTAssertEqual(fs.nodeCount, 0, "a failed lookup adds no node")
        let again = try fs.lookup(parent: root, name: name("a"))
        XCTAssertEqual(fs.nodeCount, 1)
        XCTAssertEqual(fs.nodes.lookups(again.node), 1)
    }

    func testALinkIsOneMoreLookupOfTheSameNode() throws {
        let file = try makeFile("a")
        let linked = try fs.link(file, newParent: root, newName: name("b"))
        XCTAssertEqual(linked.node, file)
        XCTAssertEqual(fs.nodes.lookups(file), 2, "create and link")
        XCTAssertEqual(linked.attributes.st_nlink, 2)
        XCTAssertEqual(try fs.lookup(parent: root, name: name("b")).node, file)
        XCTAssertEqual(fs.nodes.lookups(file), 3)
        XCTAssertEqual(fs.nodeCount, 1)
    }

    func testAFailedCreateAddsNoLookup() throws {
        let node = try makeFile("a")
        assertErrno(EEXIST, try fs.create(parent: root, name: name("a"), mode: 0o644, flags: O_RDWR | O_EXCL, caller: me))
        XCTAssertEqual(fs.nodes.lookups(node), 1)
        XCTAssertEqual(fs.nodeCount, 1)
    }

    // MARK: Readdir

    /// Past its threshold the node table has its least recently entered names dropped
    /// from the kernel's caches, off the thread that entered the last node (the kernel
    /// may hold that request's directory lock), down to three quarters of the threshold.
    func testNodePressureInvalidatesTheColdestNamesOffTheRequestThread() throws {
        let seen = Mutex<[(parent: UInt64, name: String, thread: pthread_t)]>([])
        let relief = NodePressureRelief(invalidateEntry: { parent, name in
            let entry = (parent, String(decoding: name, as: UTF8.self), pthread_self())
            seen.withLock { $0.append(entry) }
        })
        let rootFD = try FileDescriptor.open(dir.path, flags: O_PATH | O_DIRECTORY)
        let rootStat = try Sys.stat(rootFD.rawValue)
        let table = NodeTable(root: Node(fd: rootFD, stat: rootStat), pressureThreshold: 4, onPressure: relief.relieve)
        for i in 0..<5 {
            let file = "f\(i)"
            XCTAssertTrue(FileManager.default.createFile(atPath: dir.path + "/" + file, contents: nil))
            let fd = try FileDescriptor.open(dir.path + "/" + file, flags: O_PATH)
            let st = try Sys.stat(fd.rawValue)
            table.remember(fd: fd, stat: st).node.setName(name(file), parent: table.root)
        }
        let deadline = Date().addingTimeInterval(30)
        while seen.withLock({ $0.count }) < 2 && Date() < deadline { usleep(10_000) }
        let entries = seen.withLock { $0 }
        XCTAssertEqual(entries.map(\.name), ["f0", "f1"], "5 nodes, threshold 4: the two coldest go")
        XCTAssertEqual(entries.map(\.parent), [root, root])
        XCTAssertFalse(entries.contains { pthread_equal($0.thread, pthread_self()) != 0 }, "not on the request's thread")
    }

    /// An fsync makes the IV files from the file's directory up to the vault root
    /// durable, walking up by "..", and touches nothing above the root or outside it.
    func testDurableDirectoriesWalkUpToTheRootAndNoFurther() throws {
        let top = dir.path + "/top"
        for d in ["vault", "vault/a", "vault/a/b", "outside"] {
            try FileManager.default.createDirectory(atPath: top + "/" + d, withIntermediateDirectories: true)
        }
        for d in ["vault", "vault/a", "vault/a/b"] {
            XCTAssertTrue(FileManager.default.createFile(atPath: "\(top)/\(d)/\(DirectoryIV.fileName)", contents: Data([1])))
        }
        for d in ["vault/a/b", "outside"] {
            XCTAssertTrue(FileManager.default.createFile(atPath: "\(top)/\(d)/file", contents: nil))
        }
        let vault = try FileDescriptor.open(top + "/vault", flags: O_PATH | O_DIRECTORY)
        let file = try FileDescriptor.open(top + "/vault/a/b/file", flags: O_PATH)
        let b = try FileDescriptor.open(top + "/vault/a/b", flags: O_PATH | O_DIRECTORY)
        let outside = try FileDescriptor.open(top + "/outside/file", flags: O_PATH)
        XCTAssertNoThrow(try DurableDirectories().makeDurable(from: file.rawValue, isDirectory: false, root: vault.rawValue))
        // outside/ and top/ have no IV file: a walk that went there would throw.
        XCTAssertNoThrow(try DurableDirectories().makeDurable(from: outside.rawValue, isDirectory: false, root: vault.rawValue))
        // Without a/'s IV file, the walk from b (or from the file in it) must fail there.
        try FileManager.default.removeItem(atPath: "\(top)/vault/a/\(DirectoryIV.fileName)")
        XCTAssertThrowsError(try DurableDirectories().makeDurable(from: file.rawValue, isDirectory: false, root: vault.rawValue))
        XCTAssertThrowsError(try DurableDirectories().makeDurable(from: b.rawValue, isDirectory: true, root: vault.rawValue))
        // A directory known as synced is not synced again (once per directory and daemon).
        let durable = DurableDirectories()
        try FileManager.default.removeItem(atPath: "\(top)/vault/a")
        XCTAssertNoThrow(try durable.makeDurable(from: vault.rawValue, isDirectory: true, root: vault.rawValue))
        try FileManager.default.removeItem(atPath: "\(top)/vault/\(DirectoryIV.fileName)")
        XCTAssertNoThrow(try durable.makeDurable(from: vault.rawValue, isDirectory: true, root: vault.rawValue))
    }

    func testReaddirOffsetsContinueOneListing() throws {
        let names = (0..<6).map { "file-\($0)" }
        for text in names { try makeFile(text) }
        let handle = try fs.opendir(root)
        defer { fs.releasedir(handle) }
        let all = Array(try fs.readdir(handle, from: 0))
        XCTAssertEqual(all.map { String(decoding: $0.name, as: UTF8.self) }.sorted(), ([".", ".."] + names).sorted(),
                       "the plaintext names, and none of the vault's own files")
        XCTAssertEqual(Array(all.prefix(2)).map(\.isDotOrDotDot), [true, true])

        // A name made after the listing is not in it until offset 0 reads it again.
        try makeFile("late")
        for offset in 1...all.count {
            XCTAssertEqual(try fs.readdir(handle, from: offset).map(\.name), all.dropFirst(offset).map(\.name),
                           "offset \(offset)")
        }
        XCTAssertTrue(try fs.readdir(handle, from: all.count + 3).isEmpty)
        let reread = try fs.readdir(handle, from: 0)
        XCTAssertEqual(reread.count, all.count + 1)
        XCTAssertTrue(reread.contains { $0.name == name("late") })
    }

    func testReaddirPlusEntersWithoutAnotherLookup() throws {
        try makeFile("x", contents: [1, 2, 3])
        let handle = try fs.opendir(root)
        defer { fs.releasedir(handle) }
        let listed = try XCTUnwrap(try fs.readdir(handle, from: 0).first { $0.name == name("x") })
        let entry = try fs.lookupListed(handle, listed)
        XCTAssertEqual(entry.attributes.st_size, 3, "plaintext size")
        XCTAssertEqual(fs.nodes.lookups(entry.node), 2, "create and readdirplus")
    }

    // MARK: Rename and long names

    func testRenameBetweenLongAndShortNamesKeepsSidecarsInStep() throws {
        let long = String(repeating: "L", count: 200)
        let longer = String(repeating: "M", count: 255)
        try makeFile(long, contents: Array("long".utf8))
        XCTAssertEqual(backing(prefix: NameTransform.longNamePrefix).count, 2, "a long name has its entry and its sidecar")

        try fs.rename(parent: root, name: name(long), newParent: root, newName: name("short"), flags: 0)
        XCTAssertEqual(backing(prefix: NameTransform.longNamePrefix), [], "renamed to a short name: the sidecar is gone")
        assertErrno(ENOENT, try fs.lookup(parent: root, name: name(long)))
        XCTAssertEqual(try contents(of: try fs.lookup(parent: root, name: name("short")).node), Array("long".utf8))

        let sub = try fs.mkdir(parent: root, name: name("sub"), mode: 0o755, caller: me).node
        try fs.rename(parent: root, name: name("short"), newParent: sub, newName: name(longer), flags: 0)
        let inSub = backing(prefix: NameTransform.longNamePrefix)
        XCTAssertEqual(inSub.count, 2)
        XCTAssertEqual(inSub.filter { $0.hasSuffix(NameTransform.sidecarSuffix) }.count, 1)
        XCTAssertEqual(try listing(sub).sorted(), [".", "..", longer])

        // Over an existing long name: one entry and one sidecar remain.
        try makeFile(long, in: sub, contents: Array("other".utf8))
        XCTAssertEqual(backing(prefix: NameTransform.longNamePrefix).count, 4)
        try fs.rename(parent: sub, name: name(long), newParent: sub, newName: name(longer), flags: 0)
        XCTAssertEqual(backing(prefix: NameTransform.longNamePrefix).count, 2, "the replaced name's sidecar went with it")
        XCTAssertEqual(try contents(of: try fs.lookup(parent: sub, name: name(longer)).node), Array("other".utf8))
        XCTAssertEqual(try listing(sub).sorted(), [".", "..", longer])
    }

    func testRenameFlags() throws {
        let long = String(repeating: "x", count: 230)
        try makeFile("a", contents: [1])
        try makeFile(long, contents: [2])
        assertErrno(EEXIST, try fs.rename(parent: root, name: name("a"), newParent: root, newName: name(long),
                                          flags: RENAME_NOREPLACE))
        XCTAssertEqual(try contents(of: try fs.lookup(parent: root, name: name(long)).node), [2], "nothing replaced")

        try fs.rename(parent: root, name: name("a"), newParent: root, newName: name(long), flags: RENAME_EXCHANGE)
        XCTAssertEqual(try contents(of: try fs.lookup(parent: root, name: name(long)).node), [1])
        XCTAssertEqual(try contents(of: try fs.lookup(parent: root, name: name("a")).node), [2])
        XCTAssertEqual(backing(prefix: NameTransform.longNamePrefix).count, 2, "both names exist after an exchange")
        assertErrno(ENOENT, try fs.rename(parent: root, name: name("none"), newParent: root, newName: name("b"), flags: 0))
    }

    func testUnlinkOfALongNameRemovesItsSidecar() throws {
        let long = String(repeating: "é", count: 120)  // 240 bytes
        try makeFile(long)
        XCTAssertEqual(backing(prefix: NameTransform.longNamePrefix).count, 2)
        try fs.unlink(parent: root, name: name(long))
        XCTAssertEqual(backing(prefix: NameTransform.longNamePrefix), [])
        XCTAssertThrowsError(try fs.lookup(parent: root, name: Array(repeating: 0x61, count: 256))) {
            XCTAssertEqual($0 as? VaultError, .nameTooLong)
        }
        XCTAssertNoThrow(try makeFile(String(repeating: "a", count: 255)), "255 bytes is the longest name")
    }

    // MARK: Modes

    func testNewEntriesGetTheModeTheyWereMadeWith() throws {
        for mode: mode_t in [0o640, 0o600, 0o666, 0o4755, 0o2750, 0o000] {
            let (entry, handle) = try fs.create(parent: root, name: name("f\(mode)"), mode: S_IFREG | mode, flags: O_RDWR, caller: me)
            fs.release(handle)
            XCTAssertEqual(entry.attributes.st_mode, S_IFREG | mode, String(mode, radix: 8))
            XCTAssertEqual(try fs.getattr(entry.node).st_mode, S_IFREG | mode, String(mode, radix: 8))
        }
        for mode: mode_t in [0o755, 0o700, 0o1777, 0o750] {
            let entry = try fs.mkdir(parent: root, name: name("d\(mode)"), mode: mode, caller: me)
            XCTAssertEqual(try fs.getattr(entry.node).st_mode, S_IFDIR | mode, String(mode, radix: 8))
        }
        let fifo = try fs.mknod(parent: root, name: name("fifo"), mode: S_IFIFO | 0o620, device: 0, caller: me)
        XCTAssertEqual(try fs.getattr(fifo.node).st_mode, S_IFIFO | 0o620)
    }

    // MARK: Descriptors

    func openDescriptors() -> Int { (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1 }

    func testFailedOpensLeaveNoDescriptorBehind() throws {
        let file = try makeFile("f", contents: Array(repeating: 7, count: 5000))
        let sub = try fs.mkdir(parent: root, name: name("d"), mode: 0o755, caller: me).node
        // A length no write leaves: cut inside the second block's nonce.
        let backingFile = try XCTUnwrap(dir.allFiles().first { path in
            var st = stat()
            return lstat(path, &st) == 0 && UInt64(st.st_ino) == fs.nodes.node(file).ino
        })
        var st = stat()
        stat(backingFile, &st)
        XCTAssertEqual(truncate(backingFile, off_t(BlockLayout.unbound.headerSize + BlockLayout.cipherBlockSize + 5)), 0)

        let before = openDescriptors()
        for _ in 0..<20 {
            XCTAssertThrowsError(try fs.open(file, flags: O_RDONLY, caller: me), "damaged length")
            XCTAssertThrowsError(try fs.open(file, flags: O_RDWR, caller: me), "damaged length")
            assertErrno(EISDIR, try fs.open(sub, flags: O_RDWR, caller: me))
            assertErrno(EEXIST, try fs.create(parent: root, name: name("f"), mode: 0o644, flags: O_RDWR | O_EXCL, caller: me))
            assertErrno(ENOENT, try fs.lookup(parent: sub, name: name("nothing")))
        }
        XCTAssertEqual(openDescriptors(), before, "every failed open closed what it opened")

        fs.lock()
        assertErrno(EACCES, try fs.open(file, flags: O_RDONLY, caller: me))
        assertErrno(EACCES, try fs.create(parent: root, name: name("g"), mode: 0o644, flags: O_RDWR, caller: me))
        XCTAssertEqual(openDescriptors(), before)
    }

    // MARK: The key gate

    func testLockedViewAnswersOnlyTheRoot() throws {
        let file = try makeFile("f", contents: [1, 2])
        fs.lock()
        XCTAssertFalse(fs.isUnlocked)
        XCTAssertNoThrow(try fs.getattr(root))
        XCTAssertNoThrow(try fs.statfs())
        assertErrno(EACCES, try fs.getattr(file))
        assertErrno(EACCES, try fs.lookup(parent: root, name: name("f")))
        assertErrno(EACCES, try fs.opendir(root))
    }

    // MARK: Protection classes (format 6)

    /// A file open at a lock in an unless-open directory keeps working through its handle,
    /// with a key of its own that is retired at its last close; a closed file of the same
    /// directory, and everything in a complete one, is refused.
    func testAFileOpenAtALockKeepsOnlyItsOwnKeyUntilItsLastClose() throws {
        let bg = try fs.mkdir(parent: root, name: name("bg"), mode: 0o755, caller: me).node
        try fs.setxattr(bg, name: PlainFileSystem.classAttribute, value: Array("unless-open".utf8), flags: 0, caller: me)
        let (entry, handle) = try fs.create(parent: bg, name: name("kept"), mode: 0o644, flags: O_RDWR, caller: me)
        let closed = try makeFile("closed", in: bg, contents: [1, 2, 3])
        let plain = try makeFile("plain", contents: [4])
        fs.lock(kernelCaches: false)
        XCTAssertEqual(try ([7, 8, 9] as [UInt8]).withUnsafeBytes { try fs.write(handle, $0, at: 0, caller: me) }, 3)
        try fs.fsync(handle, dataOnly: false)
        var buffer = [UInt8](repeating: 0, count: 3)
        XCTAssertEqual(try buffer.withUnsafeMutableBytes { try fs.read(handle, into: $0, at: 0) }, 3)
        XCTAssertEqual(buffer, [7, 8, 9])
        var shorter = AttributeChanges()
        shorter.size = 2
        XCTAssertEqual(try fs.setattr(entry.node, changes: shorter, handle: handle).st_size, 2, "ftruncate of the kept file")
        for node in [closed, plain] {
            XCTAssertThrowsError(try fs.open(node, flags: O_RDONLY, caller: me)) { XCTAssertEqual(($0 as? Errno)?.code, EACCES) }
        }
        let kept = try XCTUnwrap(fs.nodes.node(entry.node).keptKey)
        XCTAssertNotNil(kept.onlyFile, "a key of the file alone")
        XCTAssertNoThrow(try kept.keyBytesForTests())
        fs.release(handle)
        XCTAssertNil(fs.nodes.node(entry.node).keptKey)
        XCTAssertThrowsError(try kept.keyBytesForTests(), "the key outlived the file's last close")
    }
}

// Tests of the locked view driven without FUSE: files made while locked in unless-open
// directories by many threads at once (each directory's names locked apart, renames
// between two taking both in one order), the same name made twice at once, what changes
// without a key, and the transition that holds back operations while a lock or an
// unlock decides.
import CofferCrypto
@testable import CofferFileSystem
import CofferSystem
import CofferVault
import Dispatch
import Foundation
import Glibc
import Synchronization
import TestSupport
import XCTest

final class LockedViewTests: FileSystemTestCase {
    /// A directory of class unless-open under the root.
    func unlessOpenDirectory(_ text: String) throws -> UInt64 {
        let node = try fs.mkdir(parent: root, name: name(text), mode: 0o755, caller: me).node
        try fs.setxattr(node, name: PlainFileSystem.classAttribute, value: Array("unless-open".utf8), flags: 0, caller: me)
        return node
    }

    func listing(_ node: UInt64) throws -> [String] {
        let handle = try fs.opendir(node)
        defer { fs.releasedir(handle) }
        return try fs.readdir(handle, from: 0).map { String(decoding: $0.name, as: UTF8.self) }.filter { $0 != "." && $0 != ".." }
    }

    func contents(_ text: String, in parent: UInt64) throws -> String {
        let node = try fs.lookup(parent: parent, name: name(text)).node
        let handle = try fs.open(node, flags: O_RDONLY, caller: me)
        defer { fs.release(handle) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = try buffer.withUnsafeMutableBytes { try fs.read(handle, into: $0, at: 0) }
        return String(decoding: buffer.prefix(n), as: UTF8.self)
    }

    /// Runs `body(i)` for i in 0..<threads on threads of their own; fails the test if they
    /// have not all returned within 120 s (a deadlock).
    func concurrently(_ threads: Int, _ body: @escaping @Sendable (Int) throws -> Void) {
        let group = DispatchGroup()
        let failures = Mutex<[String]>([])
        for i in 0..<threads {
            group.enter()
            Thread.detachNewThread {
                do { try body(i) } catch { failures.withLock { $0.append("thread \(i): \(error)") } }
                group.leave()
            }
        }
        XCTAssertEqual(group.wait(timeout: .now() + 120), .success, "the threads did not all end: a deadlock")
        XCTAssertEqual(failures.withLock { $0 }, [])
    }

    /// Four threads make, write, rename (between the two directories, both ways) and
    /// remove files while locked; the unlock converts every one that is left, under the
    /// name it was last given, with its content.
    func testFilesMadeAtOnceInTwoDirectoriesWhileLockedAreAllThereAfterTheUnlock() throws {
        let a = try unlessOpenDirectory("a"), b = try unlessOpenDirectory("b")
        fs.lock(kernelCaches: false)
        let fs = self.fs!, me = self.me
        concurrently(4) { t in
            let (here, there) = t % 2 == 0 ? (a, b) : (b, a)
            for k in 0..<25 {
                let made = Array("t\(t)-\(k)".utf8)
                let (_, handle) = try fs.create(parent: here, name: made, mode: 0o644, flags: O_RDWR, caller: me)
                let text = Array("file \(t)-\(k)".utf8)
                _ = try text.withUnsafeBytes { try fs.write(handle, $0, at: 0, caller: me) }
                fs.release(handle)
                switch k % 3 {
                case 0: try fs.rename(parent: here, name: made, newParent: there, newName: made + Array(".moved".utf8), flags: 0)
                case 1: try fs.unlink(parent: here, name: made)
                default: break
                }
            }
        }
        fs.unlock(try vault.unlock(recoveryKey: recovery))
        var expected: [UInt64: Set<String>] = [a: [], b: []]
        for t in 0..<4 {
            let (here, there) = t % 2 == 0 ? (a, b) : (b, a)
            for k in 0..<25 where k % 3 != 1 {
                expected[k % 3 == 0 ? there : here]!.insert("t\(t)-\(k)" + (k % 3 == 0 ? ".moved" : ""))
            }
        }
        XCTAssertEqual(Set(try listing(a)), expected[a])
        XCTAssertEqual(Set(try listing(b)), expected[b])
        XCTAssertEqual(try contents("t0-3.moved", in: b), "file 0-3")
        XCTAssertEqual(try contents("t1-5", in: b), "file 1-5")
    }

    /// While locked, what needs no key changes without one: the mode, owner and times of
    /// an unless-open directory and of a file from before the lock that the kernel knew
    /// there. Its size, which needs its key, does not change, nor does anything of a file
    /// in a complete directory.
    func testModesAndTimesChangeWhileLockedSizesDoNot() throws {
        let dir = try unlessOpenDirectory("bg")
        let complete = try fs.mkdir(parent: root, name: name("plain"), mode: 0o755, caller: me).node
        let (early, handle) = try fs.create(parent: dir, name: name("early"), mode: 0o644, flags: O_WRONLY, caller: me)
        fs.release(handle)
        let (kept, keptHandle) = try fs.create(parent: complete, name: name("kept"), mode: 0o644, flags: O_WRONLY, caller: me)
        fs.release(keptHandle)
        fs.lock(kernelCaches: false)
        var mode = AttributeChanges()
        mode.mode = 0o600
        XCTAssertEqual(try fs.setattr(early.node, changes: mode, handle: nil).st_mode & 0o7777, 0o600)
        var times = AttributeChanges()
        times.modificationTime = timespec(tv_sec: 1_614_816_000, tv_nsec: 0)
        XCTAssertEqual(try fs.setattr(dir, changes: times, handle: nil).st_mtim.tv_sec, 1_614_816_000)
        XCTAssertEqual(try fs.setattr(early.node, changes: times, handle: nil).st_mtim.tv_sec, 1_614_816_000)
        var size = AttributeChanges()
        size.size = 0
        XCTAssertThrowsError(try fs.setattr(early.node, changes: size, handle: nil)) { XCTAssertEqual(($0 as? Errno)?.code, EACCES) }
        XCTAssertThrowsError(try fs.setattr(kept.node, changes: mode, handle: nil)) { XCTAssertEqual(($0 as? Errno)?.code, EACCES) }
        XCTAssertThrowsError(try fs.setattr(complete, changes: times, handle: nil)) { XCTAssertEqual(($0 as? Errno)?.code, EACCES) }
        fs.unlock(try vault.unlock(recoveryKey: recovery))
        XCTAssertEqual(try fs.getattr(early.node).st_mode & 0o7777, 0o600)
        XCTAssertEqual(try fs.getattr(kept.node).st_mode & 0o7777, 0o644)
    }

    /// Eight threads create one name at once while locked: without O_EXCL every one opens
    /// the same file, and one file is made; with O_EXCL exactly one create succeeds.
    func testOneNameCreatedByManyAtOnceWhileLockedIsOneFile() throws {
        let a = try unlessOpenDirectory("a")
        fs.lock(kernelCaches: false)
        let fs = self.fs!, me = self.me
        let nodes = Mutex<Set<UInt64>>([])
        concurrently(8) { _ in
            let (entry, handle) = try fs.create(parent: a, name: Array("shared".utf8), mode: 0o644, flags: O_RDWR, caller: me)
            nodes.withLock { _ = $0.insert(entry.node) }
            fs.release(handle)
        }
        XCTAssertEqual(nodes.withLock { $0.count }, 1, "one file for one name")
        XCTAssertEqual(try listing(a), ["shared"])
        let made = Atomic<Int>(0), refused = Atomic<Int>(0)
        concurrently(8) { _ in
            do {
                let (_, handle) = try fs.create(parent: a, name: Array("once".utf8), mode: 0o644, flags: O_RDWR | O_EXCL, caller: me)
                fs.release(handle)
                made.add(1, ordering: .relaxed)
            } catch let error as Errno where error.code == EEXIST {
                refused.add(1, ordering: .relaxed)
            }
        }
        XCTAssertEqual(made.load(ordering: .relaxed), 1)
        XCTAssertEqual(refused.load(ordering: .relaxed), 7)
        fs.unlock(try vault.unlock(recoveryKey: recovery))
        XCTAssertEqual(try listing(a).sorted(), ["once", "shared"])
    }

    /// Renames between two directories in both directions at once take the two
    /// directories' names in one order: none waits for the other for good.
    func testRenamesBothWaysBetweenTwoDirectoriesAtOnceEnd() throws {
        let a = try unlessOpenDirectory("a"), b = try unlessOpenDirectory("b")
        fs.lock(kernelCaches: false)
        let fs = self.fs!, me = self.me
        for t in 0..<2 {
            let (_, handle) = try fs.create(parent: t == 0 ? a : b, name: name("f\(t)"), mode: 0o644, flags: O_RDWR, caller: me)
            fs.release(handle)
        }
        concurrently(2) { t in
            let (from, to) = t == 0 ? (a, b) : (b, a)
            let file = Array("f\(t)".utf8)
            for _ in 0..<3000 {
                try fs.rename(parent: from, name: file, newParent: to, newName: file, flags: 0)
                try fs.rename(parent: to, name: file, newParent: from, newName: file, flags: 0)
            }
        }
        XCTAssertEqual(try listing(a), ["f0"])
        XCTAssertEqual(try listing(b), ["f1"])
    }

    /// Each directory's names are locked apart: while one directory's are held (as
    /// through a rename there), a file is made, written, renamed and listed in another.
    func testADirectoryBusyWhileLockedHoldsNoOtherBack() throws {
        let a = try unlessOpenDirectory("a"), b = try unlessOpenDirectory("b")
        fs.lock(kernelCaches: false)
        let fs = self.fs!, me = self.me
        let view = try XCTUnwrap(fs.lockedGate.enter())
        defer { fs.lockedGate.leave() }
        let busy = try XCTUnwrap(view.directory(fs.nodes.node(a)))
        let done = DispatchSemaphore(value: 0)
        let outcome = Mutex<String>("not done")
        busy.names.withLock { _ in
            Thread.detachNewThread {
                do {
                    let (_, handle) = try fs.create(parent: b, name: Array("new".utf8), mode: 0o644, flags: O_RDWR, caller: me)
                    _ = try Array("x".utf8).withUnsafeBytes { try fs.write(handle, $0, at: 0, caller: me) }
                    fs.release(handle)
                    try fs.rename(parent: b, name: Array("new".utf8), newParent: b, newName: Array("renamed".utf8), flags: 0)
                    let handle2 = try fs.opendir(b)
                    defer { fs.releasedir(handle2) }
                    outcome.withLock { $0 = "listed \(try! fs.readdir(handle2, from: 0).count - 2)" }
                } catch {
                    outcome.withLock { $0 = "\(error)" }
                }
                done.signal()
            }
            XCTAssertEqual(done.wait(timeout: .now() + 60), .success, "b waited for a's names")
        }
        XCTAssertEqual(outcome.withLock { $0 }, "listed 1")
    }

    /// The transition holds a waiter until its end, and no one while none is under way.
    func testATransitionHoldsItsWaitersUntilItEnds() {
        let transition = ViewTransition()
        transition.waitUntilSettled()  // none under way: returns at once
        transition.begin()
        let released = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            transition.waitUntilSettled()
            released.signal()
        }
        XCTAssertEqual(released.wait(timeout: .now() + 0.3), .timedOut, "released before the end")
        transition.end()
        XCTAssertEqual(released.wait(timeout: .now() + 30), .success, "not released at the end")
        transition.waitUntilSettled()
    }
}

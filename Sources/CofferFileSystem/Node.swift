// Node is one backing inode the kernel knows about: an O_PATH descriptor and the
// per-inode state shared by every open file of it (its lookup count is the NodeTable's).
import CofferCrypto
import CofferSystem
import CofferVault
import Glibc
import Synchronization

public final class Node: Sendable {
    /// O_PATH descriptor of the backing inode; every operation is relative to it.
    private let descriptor: FileDescriptor
    /// Its number, borrowed for calls (valid while the node lives).
    var fd: Int32 { descriptor.rawValue }
    let dev: UInt64
    let ino: UInt64
    /// File type bits (S_IFMT) of the backing inode.
    let type: mode_t

    /// Serialises content writes and truncates against reads of this inode. Lock order:
    /// see PlainFileSystem's `gate`.
    let contentLock = ReadWriteLock()
    /// The content file ID, shared by every open file of this inode; guarded by `contentLock`.
    let fileIDs = FileIDCache()
    /// Blocks written since this inode's last fsync (their rewrites need no durable undo record).
    let volatileBlocks = VolatileBlocks()

    /// Milliseconds (CLOCK_MONOTONIC) when another program last changed this backing
    /// directory, 0 if never seen (OtherWriters); the kernel caches its entries briefly
    /// for a while after such a change.
    let changedByOthersAt = Atomic<Int64>(0)
    /// This directory is watched for other programs' changes (OtherWriters): the kernel
    /// may cache its entries for long.
    let isWatched = Atomic<Bool>(false)
    /// The backing inode lost its last name through this mount (unlink, rename over
    /// it): its open files keep working, as on a local file system. Any other way an
    /// inode loses its last name is another program's doing.
    let removedThroughMount = Atomic<Bool>(false)

    /// The inode is in the after-first-unlock key domain (format 8, docs/FORMAT.md §12): a
    /// directory of that class, or an entry of such a directory; set when it is entered,
    /// false until then and in every vault before format 8. Not secret: kept through locks.
    private let inAfterFirstUnlockDomain = Atomic<Bool>(false)
    /// The key domain of this inode's names, tags, keys and records (`inAfterFirstUnlockDomain`).
    var keyDomain: KeyDomain { inAfterFirstUnlockDomain.load(ordering: .acquiring) ? .afterFirstUnlock : .vault }
    func setKeyDomain(_ domain: KeyDomain) { inAfterFirstUnlockDomain.store(domain == .afterFirstUnlock, ordering: .releasing) }

    /// The open files of this inode, and the key a lock left it (an `unless-open` file
    /// open at the lock: PlainFileSystem+Classes); a leaf lock.
    private let opened = Mutex<(count: Int, keptKey: ContentCipher?)>((0, nil))

    private struct State: Sendable {
        var cachedDirIV: [UInt8]?
        /// The IV last read for this directory, kept when the cache is dropped: an IV file
        /// that reads the same again needs no place to be checked (format 5).
        var lastDirIV: [UInt8]?
        /// The IVs of the IV file's conflict copies (a directory made on two machines),
        /// by file name; nil until read.
        var cachedAlternateIVs: [DirectoryNames.Alternate]?
        /// The directory this node was last entered in; unlike `parent`, kept through a
        /// lock (it names no plaintext), for the cache policy of OtherWriters.
        var directory: Node?
        /// This directory's key with OtherWriters while it is watched.
        var watchKey: [UInt8]?
        /// True once a regular file was checked for blocks a crash tore (UndoJournal).
        var crashChecked = false
        /// Last known parent and plaintext name, only for naming the file in damage reports.
        var parent: Node?
        var name: [UInt8] = []
        /// Names the kernel may cache in this directory; made on first use.
        var cachedNames: EntryNames?
    }

    /// The node's mutable state; a leaf lock (nothing is taken under it).
    private let state = Mutex(State())

    init(fd: consuming FileDescriptor, stat st: stat) {
        descriptor = fd
        self.dev = UInt64(st.st_dev)
        self.ino = UInt64(st.st_ino)
        self.type = st.st_mode & S_IFMT
    }

    /// A node the kernel forgot takes its plaintext name with it, zeroed.
    deinit { state.withLock { $0.name.zeroInPlace() } }

    var isDirectory: Bool { type == S_IFDIR }
    var isRegular: Bool { type == S_IFREG }
    var isSymlink: Bool { type == S_IFLNK }

    /// "/proc/self/fd/N": a path to the backing inode for calls that take no O_PATH fd.
    var procPath: String { Sys.procPath(fd) }

    /// The directory IV, read once by `read` (which checks it, given the IV last read
    /// before the cache was dropped) and then cached.
    func directoryIV(read: (_ last: [UInt8]?) throws -> [UInt8]) throws -> [UInt8] {
        let (cached, last) = state.withLock { ($0.cachedDirIV, $0.lastDirIV) }
        if let cached { return cached }
        let iv = try read(last)
        state.withLock {
            $0.cachedDirIV = iv
            $0.lastDirIV = iv
        }
        return iv
    }

    /// Whether this inode's content (of the file ID given) has its key in a key record
    /// (a file made while locked, format 6: the cipher holding that key) or derives it
    /// (nil); read once per file ID, a leaf lock.
    private let sealedKey = Mutex<(id: FileID, cipher: ContentCipher?)?>(nil)

    /// The cipher of content `id` if its key is sealed, from `load` the first time.
    func sealedCipher(for id: FileID, load: () throws -> ContentCipher?) rethrows -> ContentCipher? {
        if let known = sealedKey.withLock({ $0 }), known.id == id { return known.cipher }
        let cipher = try load()
        sealedKey.withLock { $0 = (id, cipher) }
        return cipher
    }

    /// Zeroes the key `sealedCipher` holds (the lock): read again from the key record
    /// with the keys, after the unlock. A file that keeps its key through the lock holds
    /// a copy of its own (`keep`).
    func forgetSealedKey() {
        let known = sealedKey.withLock { known -> ContentCipher? in
            defer { known = nil }
            return known?.cipher
        }
        known?.retire()
    }

    /// The prepared block key of this inode's content while a file of it is open
    /// (the per-file key, for AES-256-GCM expanded): wiped at the last close and the lock.
    let blockKeys = BlockKeySlot()

    /// An open file of this inode was made.
    func fileOpened() {
        opened.withLock { $0.count += 1 }
        blockKeys.fileOpened()
    }

    /// An open file of this inode ended: with the last one, its prepared block key goes,
    /// and so does a key the lock left it (zeroed; an operation still using it fails
    /// instead).
    func fileClosed() {
        blockKeys.fileClosed()
        let ending = opened.withLock { opened -> ContentCipher? in
            opened.count -= 1
            guard opened.count == 0 else { return nil }
            defer { opened.keptKey = nil }
            return opened.keptKey
        }
        ending?.retire()
    }

    /// Whether any open file of this inode is left.
    var isOpen: Bool { opened.withLock { $0.count > 0 } }

    /// Leaves this inode `key`, its own key, through a lock: kept while a file of it is
    /// open (false, and the key zeroed, if none is, or if it already has one).
    @discardableResult
    func keep(_ key: ContentCipher) -> Bool {
        let kept = opened.withLock { opened -> Bool in
            guard opened.count > 0, opened.keptKey == nil else { return false }
            opened.keptKey = key
            return true
        }
        if !kept { key.retire() }
        return kept
    }

    /// The key a lock left this inode, while one of its files is open.
    var keptKey: ContentCipher? { opened.withLock { $0.keptKey } }

    /// Marks the file as checked after a crash; false if it already was.
    func markCrashChecked() -> Bool {
        state.withLock { state in
            defer { state.crashChecked = true }
            return !state.crashChecked
        }
    }

    /// Whether the directory IV is cached (read, or made by this daemon).
    var hasDirectoryIV: Bool { state.withLock { $0.cachedDirIV != nil } }

    /// The IVs of the IV file's conflict copies that `read` accepts, read once (one
    /// listing) and then cached.
    func alternateIVs(read: () throws -> [DirectoryNames.Alternate]) throws -> [DirectoryNames.Alternate] {
        if let ivs = state.withLock({ $0.cachedAlternateIVs }) { return ivs }
        let ivs = try read()
        state.withLock { $0.cachedAlternateIVs = ivs }
        return ivs
    }

    /// The IV of a directory this daemon just made: it has no conflict copies.
    func setDirectoryIV(_ iv: [UInt8]) {
        state.withLock { state in
            state.cachedDirIV = iv
            state.lastDirIV = iv
            state.cachedAlternateIVs = []
        }
    }

    /// Drops the cached IVs: the IV file or a conflict copy of it changed.
    func forgetDirectoryIV() {
        state.withLock { state in
            state.cachedDirIV = nil
            state.cachedAlternateIVs = nil
        }
        dropsChecked.store(false, ordering: .releasing)
    }

    /// This directory was looked through for entries made while locked and not converted
    /// yet (PlainFileSystem+Drops); cleared with the IV caches when another program
    /// changes the directory.
    let dropsChecked = Atomic<Bool>(false)

    /// The directory this node was last entered in (nil for the root).
    var directory: Node? { state.withLock { $0.directory } }

    /// The key OtherWriters watches this directory under; set once it is watched, taken
    /// back when the watch ends.
    var watchKey: [UInt8]? {
        get { state.withLock { $0.watchKey } }
        set { state.withLock { $0.watchKey = newValue } }
    }

    /// Copies of the names the kernel may cache here (to invalidate them outside any lock).
    func cachedNameCopies() -> [[UInt8]] {
        guard let names = state.withLock({ $0.cachedNames }) else { return [] }
        var copies: [[UInt8]] = []
        names.forEach { name in copies.append(name.withUnsafeBufferPointer { Array($0) }) }
        return copies
    }

    /// Records that the kernel may cache an entry (positive or negative) `name` here.
    func rememberEntry(_ name: [UInt8]) {
        state.withLock { state in
            if state.cachedNames == nil { state.cachedNames = EntryNames() }
            return state.cachedNames!
        }.insert(name)
    }

    /// Hands over the names the kernel may cache here, and starts a new record.
    func takeCachedNames() -> EntryNames? {
        state.withLock { state in
            defer { state.cachedNames = nil }
            return state.cachedNames
        }
    }

    /// The last known (parent, name), if any.
    var entry: (parent: Node, name: [UInt8])? {
        state.withLock { state in state.parent.map { ($0, state.name) } }
    }

    func forgetName() {
        state.withLock { state in
            state.name.zeroInPlace()
            state.name = []
            state.parent = nil
        }
    }

    /// Keeps a copy of `name` of its own (zeroed when it goes: the caller's may be zeroed
    /// or shared), and zeroes the name it replaces.
    func setName(_ name: [UInt8], parent: Node?) {
        let own = name.withUnsafeBufferPointer { [UInt8]($0) }
        state.withLock { state in
            state.name.zeroInPlace()
            state.name = own
            state.parent = parent
            if let parent { state.directory = parent }
        }
    }

    /// Best-known plaintext path below the mount root, for damage reports only.
    var plaintextPath: String {
        var parts: [String] = []
        var node: Node? = self
        var depth = 0
        while let current = node, depth < 256 {
            let (name, parent) = current.state.withLock { ($0.name, $0.parent) }
            if parent == nil { break }
            parts.append(String(decoding: name, as: UTF8.self))
            node = parent
            depth += 1
        }
        return "/" + parts.reversed().joined(separator: "/")
    }
}

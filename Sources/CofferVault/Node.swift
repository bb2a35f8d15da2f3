// Node is one backing inode the kernel knows about: an O_PATH descriptor, its lookup
// count, and the per-inode state shared by every open file of it.
import Glibc

public final class Node: @unchecked Sendable {
    /// O_PATH descriptor of the backing inode; every operation is relative to it.
    let fd: Int32
    let dev: UInt64
    let ino: UInt64
    /// File type bits (S_IFMT) of the backing inode.
    let type: mode_t

    /// Kernel lookup count; guarded by the NodeTable's lock.
    var lookups: UInt64 = 0
    /// When the node was last entered (NodeTable tick); guarded by the NodeTable's lock.
    var lastEntered: UInt64 = 0

    /// Serialises content writes and truncates against reads of this inode.
    let content = ReadWriteLock()
    /// The content file ID, shared by every open file of this inode; guarded by `content`.
    let fileIDs = FileIDCache()
    /// Blocks written since this inode's last fsync (their rewrites need no durable undo record).
    let volatileBlocks = VolatileBlocks()

    /// Guards `dirIV`, `parent` and `name`.
    private let stateLock = Lock()
    private var cachedDirIV: [UInt8]?
    /// True once a regular file was checked for blocks a crash tore (UndoJournal).
    private var crashChecked = false
    /// Last known parent and plaintext name, only for naming the file in damage reports.
    private var parent: Node?
    private var name: [UInt8] = []
    /// Names the kernel may cache in this directory; made on first use.
    private var cachedNames: EntryNames?

    init(fd: Int32, stat st: stat) {
        self.fd = fd
        self.dev = UInt64(st.st_dev)
        self.ino = UInt64(st.st_ino)
        self.type = st.st_mode & S_IFMT
    }

    deinit { Sys.close(fd) }

    var isDirectory: Bool { type == S_IFDIR }
    var isRegular: Bool { type == S_IFREG }
    var isSymlink: Bool { type == S_IFLNK }

    /// "/proc/self/fd/N": a path to the backing inode for calls that take no O_PATH fd.
    var procPath: String { Sys.procPath(fd) }

    /// The directory IV, read once from the backing directory and then cached.
    func directoryIV() throws -> [UInt8] {
        if let iv = stateLock.withLock({ cachedDirIV }) { return iv }
        let iv = try DirectoryIV.read(in: fd)
        stateLock.withLock { cachedDirIV = iv }
        return iv
    }

    /// Marks the file as checked after a crash; false if it already was.
    func markCrashChecked() -> Bool {
        stateLock.withLock {
            defer { crashChecked = true }
            return !crashChecked
        }
    }

    func setDirectoryIV(_ iv: [UInt8]) { stateLock.withLock { cachedDirIV = iv } }

    /// Records that the kernel may cache an entry (positive or negative) `name` here.
    func rememberEntry(_ name: [UInt8]) {
        stateLock.withLock {
            if cachedNames == nil { cachedNames = EntryNames() }
            return cachedNames!
        }.insert(name)
    }

    /// Hands over the names the kernel may cache here, and starts a new record.
    func takeCachedNames() -> EntryNames? {
        stateLock.withLock {
            defer { cachedNames = nil }
            return cachedNames
        }
    }

    /// The last known (parent, name), if any.
    var entry: (parent: Node, name: [UInt8])? {
        stateLock.withLock { parent.map { ($0, name) } }
    }

    func forgetName() {
        stateLock.withLock {
            for i in name.indices { name[i] = 0 }
            name = []
            parent = nil
        }
    }

    func setName(_ name: [UInt8], parent: Node?) {
        stateLock.withLock {
            self.name = name
            self.parent = parent
        }
    }

    /// Best-known plaintext path below the mount root, for damage reports only.
    var plaintextPath: String {
        var parts: [String] = []
        var node: Node? = self
        var depth = 0
        while let current = node, depth < 256 {
            let (name, parent) = current.stateLock.withLock { (current.name, current.parent) }
            if parent == nil { break }
            parts.append(String(decoding: name, as: UTF8.self))
            node = parent
            depth += 1
        }
        return "/" + parts.reversed().joined(separator: "/")
    }
}

// Node is one backing inode the kernel knows about: an O_PATH descriptor and the
// per-inode state shared by every open file of it (its lookup count is the NodeTable's).
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

    private struct State: Sendable {
        var cachedDirIV: [UInt8]?
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

    var isDirectory: Bool { type == S_IFDIR }
    var isRegular: Bool { type == S_IFREG }
    var isSymlink: Bool { type == S_IFLNK }

    /// "/proc/self/fd/N": a path to the backing inode for calls that take no O_PATH fd.
    var procPath: String { Sys.procPath(fd) }

    /// The directory IV, read once from the backing directory and then cached.
    func directoryIV() throws -> [UInt8] {
        if let iv = state.withLock({ $0.cachedDirIV }) { return iv }
        let iv = try DirectoryIV.read(in: fd)
        state.withLock { $0.cachedDirIV = iv }
        return iv
    }

    /// Marks the file as checked after a crash; false if it already was.
    func markCrashChecked() -> Bool {
        state.withLock { state in
            defer { state.crashChecked = true }
            return !state.crashChecked
        }
    }

    func setDirectoryIV(_ iv: [UInt8]) { state.withLock { $0.cachedDirIV = iv } }

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
            for i in state.name.indices { state.name[i] = 0 }
            state.name = []
            state.parent = nil
        }
    }

    func setName(_ name: [UInt8], parent: Node?) {
        state.withLock { state in
            state.name = name
            state.parent = parent
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

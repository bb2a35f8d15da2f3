// DurableDirectories makes the IV files of the directories above a synced file durable.
// mkdir writes a directory's IV without an fsync, and of a directory made by an earlier
// daemon (or moved since) nothing is known; so before an fsync below it is answered,
// each directory on the backing path up to the vault root gets its IV fsynced — once
// per directory and daemon. A file's own directory is opened by the path the kernel
// shows for its descriptor, and taken only if its entry there still is that inode; from
// there the walk goes up by descriptor (".."), never by path name, so a rename at the
// same time cannot point it at another directory.
import CofferSystem
import CofferVault
import Glibc
import Synchronization

final class DurableDirectories: Sendable {
    private struct Key: Hashable {
        let dev: UInt64
        let ino: UInt64
        init(_ st: stat) { dev = UInt64(st.st_dev); ino = UInt64(st.st_ino) }
    }

    private let synced = Mutex<Set<Key>>([])
    /// Directories on the way up past which the vault root is not looked for any more.
    private static let deepest = 4096

    /// Makes the IVs of the directories from the one holding backing inode `fd` (or
    /// from `fd` itself, a directory) up to the vault root `root` durable. A file or
    /// directory already removed, or no longer below the root, has nothing above it to
    /// make durable (and nothing outside the vault is synced).
    func makeDurable(from fd: Int32, isDirectory: Bool, root: Int32) throws {
        guard let rootKey = try? Key(Sys.stat(root)),
              let start = isDirectory ? try? FileDescriptor.open(".", in: fd, flags: O_PATH | O_DIRECTORY)
                                      : Self.directory(holding: fd) else { return }
        _ = try syncUp(from: start, below: nil, root: rootKey, depth: 0)
    }

    /// If the walk up by ".." from `dir` (the parent of `below`) reaches the root, syncs
    /// the IVs on the way, the root's first, and returns true.
    private func syncUp(from dir: borrowing FileDescriptor, below: Key?, root: Key, depth: Int) throws -> Bool {
        // "/" is its own parent: the walk left the vault.
        guard depth < Self.deepest, let key = try? Key(Sys.stat(dir.rawValue)), key != below else { return false }
        if key != root {
            guard let up = try? FileDescriptor.open("..", in: dir.rawValue, flags: O_PATH | O_DIRECTORY),
                  try syncUp(from: up, below: key, root: root, depth: depth + 1) else { return false }
        }
        if !synced.withLock({ $0.contains(key) }) {
            try DirectoryIV.sync(in: dir.rawValue)
            synced.withLock { _ = $0.insert(key) }
        }
        return true
    }

    /// The directory that holds the (non-directory) inode `fd` under one of its names:
    /// found by the name the kernel shows for it, and taken only if that entry of the
    /// opened directory still is this inode.
    private static func directory(holding fd: Int32) -> FileDescriptor? {
        guard let path = try? Sys.readlink(Sys.procPath(fd), in: AT_FDCWD), path.hasPrefix("/"),
              let slash = path.lastIndex(of: "/"), let own = try? Key(Sys.stat(fd)) else { return nil }
        let name = String(path[path.index(after: slash)...])
        guard let dir = try? FileDescriptor.open(slash == path.startIndex ? "/" : String(path[..<slash]),
                                                 flags: O_PATH | O_DIRECTORY | O_NOFOLLOW),
              let entry = try? Key(Sys.stat(name, in: dir.rawValue)), entry == own else { return nil }
        return dir
    }

    /// A directory is going away; its inode number may come back for a new one.
    func forget(_ st: stat) { synced.withLock { _ = $0.remove(Key(st)) } }
}

// DurableDirectories makes the IV files of the directories above a synced file durable.
// mkdir writes a directory's IV without an fsync, and of a directory made by an earlier
// daemon (or moved since) nothing is known; so before an fsync below it is answered,
// each directory on the backing path up to the vault root gets its IV fsynced — once
// per directory and daemon.
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

    /// Makes the IVs of the directories from the one holding backing inode `fd` (or
    /// from `fd` itself, a directory) up to the vault root `root` durable. A file or
    /// directory already removed has nothing above it to make durable.
    func makeDurable(from fd: Int32, isDirectory: Bool, root: Int32) throws {
        guard let rootPath = try? Sys.readlink(Sys.procPath(root), in: AT_FDCWD),
              var path = try? Sys.readlink(Sys.procPath(fd), in: AT_FDCWD) else { return }
        if !isDirectory { path = Self.parent(of: path) }
        while path == rootPath || path.hasPrefix(rootPath == "/" ? "/" : rootPath + "/") {
            let dir: FileDescriptor
            do { dir = try FileDescriptor.open(path, flags: O_PATH | O_DIRECTORY | O_NOFOLLOW) } catch { return }
            let key = Key(try Sys.stat(dir.rawValue))
            if !synced.withLock({ $0.contains(key) }) {
                try DirectoryIV.sync(in: dir.rawValue)
                synced.withLock { _ = $0.insert(key) }
            }
            if path == rootPath { return }
            path = Self.parent(of: path)
        }
    }

    /// A directory is going away; its inode number may come back for a new one.
    func forget(_ st: stat) { synced.withLock { _ = $0.remove(Key(st)) } }

    private static func parent(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/"), slash != path.startIndex else { return "/" }
        return String(path[..<slash])
    }
}

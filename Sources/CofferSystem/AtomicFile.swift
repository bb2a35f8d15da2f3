// AtomicFile replaces a small file so that a crash leaves either the old or the new
// content, never a mix: write a temp file, fsync, rename over, fsync the directory.
import Glibc

public enum AtomicFile {
    /// Writes `bytes` to `name` in directory `dir` atomically with permissions `mode`.
    public static func write(_ bytes: [UInt8], to name: String, in dir: Int32, mode: mode_t = 0o400) throws {
        var temp = ""
        let fd = try createTemp(of: name, in: dir, mode: mode, named: &temp)
        do {
            try bytes.withUnsafeBytes { try Sys.writeFully(fd.rawValue, $0, at: 0) }
            try Sys.fsync(fd.rawValue)
            fd.close()
        } catch {
            try? Sys.unlink(temp, in: dir)
            throw error
        }
        do {
            try Sys.rename(temp, in: dir, to: name, in: dir)
        } catch {
            try? Sys.unlink(temp, in: dir)
            throw error
        }
        try syncDirectory(dir)
    }

    /// How the names of the temp files of `name` begin (a crash may leave one behind).
    public static func tempPrefix(of name: String) -> String { ".\(name).tmp." }

    /// Attempts at a free temp name before giving up (EEXIST): each name is random, so
    /// only a directory filled with guesses could use them up.
    static let tempAttempts = 16

    /// Creates a new temp file of `name` in `dir`, `.NAME.tmp.PID.RANDOM`: the random
    /// part keeps an entry planted under a predictable name (another writer of the
    /// directory) from blocking the write; O_EXCL | O_NOFOLLOW never opens what is there.
    /// `temp` is set to the name made.
    static func createTemp(of name: String, in dir: Int32, mode: mode_t, named temp: inout String) throws -> FileDescriptor {
        var attempt = 1
        while true {
            temp = tempPrefix(of: name) + "\(getpid())." + String(UInt64.random(in: 0...UInt64.max), radix: 16)
            do {
                return try FileDescriptor.open(temp, in: dir, flags: O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode: mode)
            } catch let error as Errno where error.code == EEXIST && attempt < tempAttempts {
                attempt += 1
            }
        }
    }

    /// fsync of a directory, so that a rename or create in it is durable.
    public static func syncDirectory(_ dir: Int32) throws {
        let fd = try FileDescriptor.open(".", in: dir, flags: O_RDONLY | O_DIRECTORY)
        try Sys.fsync(fd.rawValue)
    }
}

// SystemCalls wraps the POSIX calls the vault makes: each throws an `Errno` naming the
// call, and EINTR is retried in exactly one place.
import Glibc

/// A failed system call: the errno value and the call that returned it.
public struct Errno: Error, Equatable, CustomStringConvertible {
    public let code: Int32
    public let call: String

    public init(_ code: Int32, _ call: String = "") {
        self.code = code
        self.call = call
    }

    /// The current thread's errno, tagged with `call`.
    package static func current(_ call: String) -> Errno { Errno(errno, call) }

    /// What strerror(3) says of the code.
    public var text: String { String(cString: strerror(code)) }

    public var description: String { call.isEmpty ? text : "\(call): \(text)" }

    public static func == (a: Errno, b: Errno) -> Bool { a.code == b.code }
}

/// Runs `body` until it does not fail with EINTR; throws `Errno` when it returns -1.
@discardableResult
package func retryOnInterrupt<T: BinaryInteger>(_ call: String, _ body: () -> T) throws -> T {
    while true {
        let rc = body()
        if rc != -1 { return rc }
        if errno == EINTR { continue }
        throw Errno.current(call)
    }
}

public enum Sys {
    /// openat(2) with O_CLOEXEC, returning the bare number. Only `FileDescriptor.open`
    /// calls it: outside this module every descriptor opened is owned.
    static func open(_ name: String, in dir: Int32 = AT_FDCWD, flags: Int32, mode: mode_t = 0) throws -> Int32 {
        try retryOnInterrupt("openat") { Glibc.openat(dir, name, flags | O_CLOEXEC, mode) }
    }

    /// "/proc/self/fd/N": a path that names what descriptor `fd` names, for calls that
    /// take a path but no descriptor (chmod, the xattr calls, readlink of the path).
    public static func procPath(_ fd: Int32) -> String { "/proc/self/fd/\(fd)" }

    /// clock_gettime(CLOCK_MONOTONIC), in seconds: a clock that never jumps, for
    /// delays, deadlines and idle time.
    public static func monotonicNow() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    /// close(2); errors are ignored because the descriptor is gone either way.
    public static func close(_ fd: Int32) { _ = Glibc.close(fd) }

    /// fstat(2).
    public static func stat(_ fd: Int32) throws -> stat {
        var st = Glibc.stat()
        try retryOnInterrupt("fstat") { Glibc.fstat(fd, &st) }
        return st
    }

    /// fstatat(2) without following a final symlink.
    public static func stat(_ name: String, in dir: Int32) throws -> stat {
        var st = Glibc.stat()
        try retryOnInterrupt("fstatat") { Glibc.fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) }
        return st
    }

    /// stat(2) of `path`, following symlinks: for /proc's links (/proc/PID/fd/N), which
    /// lead to what the descriptor names. Never for a path in CIPHERDIR.
    public static func stat(following path: String) throws -> stat {
        var st = Glibc.stat()
        try retryOnInterrupt("stat") { Glibc.fstatat(AT_FDCWD, path, &st, 0) }
        return st
    }

    /// pread(2) until `buffer` is full or end of file; returns the bytes read.
    public static func readFully(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        var done = 0
        while done < buffer.count {
            let n = try retryOnInterrupt("pread") {
                Glibc.pread(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset) + off_t(done))
            }
            if n == 0 { break }
            done += n
        }
        return done
    }

    /// pwrite(2) until every byte of `buffer` is written.
    public static func writeFully(_ fd: Int32, _ buffer: UnsafeRawBufferPointer, at offset: Int64) throws {
        var done = 0
        while done < buffer.count {
            let n = try retryOnInterrupt("pwrite") {
                Glibc.pwrite(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset) + off_t(done))
            }
            done += n
        }
    }

    /// write(2) until every byte of `buffer` is written (pipes and sockets).
    public static func send(_ fd: Int32, _ buffer: UnsafeRawBufferPointer) throws {
        var done = 0
        while done < buffer.count {
            let n = try retryOnInterrupt("write") { Glibc.write(fd, buffer.baseAddress! + done, buffer.count - done) }
            guard n > 0 else { throw Errno(EPIPE, "write") }
            done += n
        }
    }

    /// read(2) until `buffer` is full; false if the stream ends (or times out) first.
    public static func receive(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) -> Bool {
        var done = 0
        while done < buffer.count {
            guard let n = try? retryOnInterrupt("read", { Glibc.read(fd, buffer.baseAddress! + done, buffer.count - done) }),
                  n > 0 else { return false }
            done += n
        }
        return true
    }

    /// ftruncate(2).
    public static func truncate(_ fd: Int32, to size: Int64) throws {
        try retryOnInterrupt("ftruncate") { Glibc.ftruncate(fd, off_t(size)) }
    }

    /// fsync(2).
    public static func fsync(_ fd: Int32) throws {
        try retryOnInterrupt("fsync") { Glibc.fsync(fd) }
    }

    /// fdatasync(2).
    public static func fdatasync(_ fd: Int32) throws {
        try retryOnInterrupt("fdatasync") { Glibc.fdatasync(fd) }
    }

    /// chmod(2) of `path` (a /proc path reaches an O_PATH descriptor's inode).
    public static func chmod(_ path: String, _ mode: mode_t) throws {
        try retryOnInterrupt("chmod") { Glibc.chmod(path, mode) }
    }

    /// fchmod(2).
    public static func chmod(_ fd: Int32, _ mode: mode_t) throws {
        try retryOnInterrupt("fchmod") { Glibc.fchmod(fd, mode) }
    }

    /// fchown(2).
    public static func chown(_ fd: Int32, uid: uid_t, gid: gid_t) throws {
        try retryOnInterrupt("fchown") { Glibc.fchown(fd, uid, gid) }
    }

    /// fchownat(2) without following a symlink; an empty `name` is `dir` itself. An ID
    /// of `.max` is left as it is.
    public static func chown(_ name: String, in dir: Int32, uid: uid_t, gid: gid_t) throws {
        let flags = AT_SYMLINK_NOFOLLOW | (name.isEmpty ? AT_EMPTY_PATH : 0)
        try retryOnInterrupt("fchownat") { Glibc.fchownat(dir, name, uid, gid, flags) }
    }

    /// utimensat(2) of descriptor `fd` itself (O_PATH too); `times`: atime, mtime.
    public static func setTimes(_ fd: Int32, _ times: [timespec]) throws {
        try retryOnInterrupt("utimensat") { Glibc.utimensat(fd, "", times, AT_EMPTY_PATH) }
    }

    /// futimens(2) of an open descriptor; `times`: atime, mtime.
    public static func setTimes(open fd: Int32, _ times: [timespec]) throws {
        try retryOnInterrupt("futimens") { Glibc.futimens(fd, times) }
    }

    /// access(2) of `path`.
    public static func access(_ path: String, _ mask: Int32) throws {
        try retryOnInterrupt("access") { Glibc.access(path, mask) }
    }

    /// fstatvfs(2).
    public static func statvfs(_ fd: Int32) throws -> statvfs {
        var st = Glibc.statvfs()
        try retryOnInterrupt("fstatvfs") { Glibc.fstatvfs(fd, &st) }
        return st
    }

    /// mknodat(2).
    public static func mknod(_ name: String, in dir: Int32, mode: mode_t, device: dev_t) throws {
        try retryOnInterrupt("mknodat") { Glibc.mknodat(dir, name, mode, device) }
    }

    /// linkat(2): a new name `name` in `dir` for the file at `path` (a /proc path reaches
    /// an O_PATH descriptor's inode; followed).
    public static func link(_ path: String, to name: String, in dir: Int32) throws {
        try retryOnInterrupt("linkat") { Glibc.linkat(AT_FDCWD, path, dir, name, AT_SYMLINK_FOLLOW) }
    }

    /// renameat(2).
    public static func rename(_ from: String, in fromDir: Int32, to: String, in toDir: Int32) throws {
        try retryOnInterrupt("renameat") { Glibc.renameat(fromDir, from, toDir, to) }
    }

    /// unlinkat(2); `directory` removes an empty directory.
    public static func unlink(_ name: String, in dir: Int32, directory: Bool = false) throws {
        try retryOnInterrupt("unlinkat") { Glibc.unlinkat(dir, name, directory ? AT_REMOVEDIR : 0) }
    }

    /// mkdirat(2).
    public static func mkdir(_ name: String, in dir: Int32, mode: mode_t) throws {
        try retryOnInterrupt("mkdirat") { Glibc.mkdirat(dir, name, mode) }
    }

    /// symlinkat(2).
    public static func symlink(target: String, name: String, in dir: Int32) throws {
        try retryOnInterrupt("symlinkat") { Glibc.symlinkat(target, dir, name) }
    }

    /// readlinkat(2); an empty name reads the link an O_PATH descriptor refers to.
    public static func readlink(_ name: String, in dir: Int32) throws -> String {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = try retryOnInterrupt("readlinkat") { Glibc.readlinkat(dir, name, &buffer, buffer.count - 1) }
        buffer[n] = 0
        return buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    }

    /// Reads a whole small regular file relative to `dir` (see `FileDescriptor.openRegular`).
    public static func readFile(_ name: String, in dir: Int32 = AT_FDCWD, limit: Int = 1 << 20) throws -> [UInt8] {
        let fd = try FileDescriptor.openRegular(name, in: dir)
        var out = [UInt8](repeating: 0, count: limit + 1)
        let n = try out.withUnsafeMutableBytes { try readFully(fd.rawValue, into: $0, at: 0) }
        guard n <= limit else { throw Errno(EFBIG, "read \(name)") }
        return Array(out.prefix(n))
    }

    /// An entry of a backing directory as getdents reports it.
    public struct DirectoryEntry {
        public let name: String
        public let ino: UInt64
        /// d_type (DT_REG, DT_DIR, …).
        public let type: UInt8

        /// The entry the kernel (through readdir) laid out at `entry`. A `dirent` is only
        /// as long as its name: `d_name` is read in place, up to its NUL, never copied as
        /// the 256-byte field Swift imports (that reads past a short entry's end, into an
        /// unmapped page when the entry ends one).
        public init(_ entry: UnsafePointer<dirent>) {
            let offset = MemoryLayout<dirent>.offset(of: \dirent.d_name)!
            let start = UnsafeRawPointer(entry).advanced(by: offset).assumingMemoryBound(to: CChar.self)
            name = String(cString: start)
            ino = UInt64(entry.pointee.d_ino)
            type = entry.pointee.d_type
        }
    }

    /// The entries of directory `dir` (without "." and ".."), read through a new descriptor.
    public static func readDirectory(_ dir: Int32) throws -> [DirectoryEntry] {
        var entries: [DirectoryEntry] = []
        try forEachEntry(in: dir) { entry in
            let found = DirectoryEntry(entry)
            if found.name != "." && found.name != ".." { entries.append(found) }
        }
        return entries
    }

    /// Calls `body` with each entry of directory `dir` as readdir lays it out ("." and ".."
    /// included), read through a new descriptor.
    static func forEachEntry(in dir: Int32, _ body: (UnsafePointer<dirent>) throws -> Void) throws {
        let fd = try FileDescriptor.open(".", in: dir, flags: O_RDONLY | O_DIRECTORY)
        guard let stream = fdopendir(fd.rawValue) else { throw Errno.current("fdopendir") }
        // The stream owns the descriptor now: closedir closes it.
        _ = fd.release()
        defer { closedir(stream) }
        while let entry = readdir(stream) { try body(entry) }
    }

    /// The names in directory `dir` (without "." and "..").
    public static func listDirectory(_ dir: Int32) throws -> [String] {
        try readDirectory(dir).map(\.name)
    }
}

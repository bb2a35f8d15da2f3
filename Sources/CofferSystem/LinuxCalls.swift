// LinuxCalls reaches the Linux-only calls and flags that Swift's Glibc module does not
// export (they sit behind _GNU_SOURCE): renameat2, fallocate, syncfs, pipe2, malloc_trim
// and the xattr family, through the CLinux shim, which is compiled against glibc's
// real declarations.
import CLinux
import Glibc

/// open(2): a descriptor that only names a file (no read or write access).
public var O_PATH: Int32 { clinux_O_PATH }
/// *at(2): operate on the descriptor itself when the path is empty.
public var AT_EMPTY_PATH: Int32 { clinux_AT_EMPTY_PATH }
/// renameat2(2) flags.
public var RENAME_NOREPLACE: UInt32 { clinux_RENAME_NOREPLACE }
public var RENAME_EXCHANGE: UInt32 { clinux_RENAME_EXCHANGE }
/// fallocate(2): reserve blocks without changing the size.
public var FALLOC_FL_KEEP_SIZE: Int32 { clinux_FALLOC_FL_KEEP_SIZE }
/// utimensat(2) special nanosecond values.
public var UTIME_NOW: Int { clinux_UTIME_NOW }
public var UTIME_OMIT: Int { clinux_UTIME_OMIT }

extension Sys {
    /// The two ends of a pipe, each owned: an end can be closed (consumed) on its own.
    /// Frozen so that a caller in another module may consume one end and keep the other.
    @frozen public struct Pipe: ~Copyable {
        public var read: FileDescriptor
        public var write: FileDescriptor
    }

    /// pipe2(2) with O_CLOEXEC: never inherited by a child unless a spawn maps an end
    /// explicitly.
    public static func pipe() throws -> Pipe {
        var fds: [Int32] = [-1, -1]
        try retryOnInterrupt("pipe2") { clinux_pipe2(&fds, O_CLOEXEC) }
        return Pipe(read: FileDescriptor(owning: fds[0]), write: FileDescriptor(owning: fds[1]))
    }

    /// posix_spawn_file_actions_addclosefrom_np (glibc 2.34): the child closes every
    /// descriptor from `lowest` up, without this process touching its own.
    public static func addCloseFrom(_ actions: UnsafeMutablePointer<posix_spawn_file_actions_t>, _ lowest: Int32) throws {
        let rc = clinux_spawn_file_actions_addclosefrom(actions, lowest)
        guard rc == 0 else { throw Errno(rc, "posix_spawn_file_actions_addclosefrom_np") }
    }

    /// malloc_trim(3) with no padding: free heap pages go back to the kernel, which
    /// hands out only zeroed pages, so what freed memory held is gone.
    public static func releaseFreeMemory() { _ = clinux_malloc_trim(0) }

    /// renameat2(2).
    public static func rename(_ from: String, in fromDir: Int32, to: String, in toDir: Int32, flags: UInt32) throws {
        try retryOnInterrupt("renameat2") { clinux_renameat2(fromDir, from, toDir, to, flags) }
    }

    /// sync_file_range(2) of the whole file, waiting: its data pages are written to the
    /// disk (not its metadata, and with no cache flush) before this returns.
    public static func writeOut(_ fd: Int32) throws {
        try retryOnInterrupt("sync_file_range") { clinux_write_out(fd) }
    }

    /// sync_file_range(2) of `length` bytes at `offset` with SYNC_FILE_RANGE_WRITE only:
    /// the disk starts writing the range's dirty pages; nothing is waited for.
    public static func startWriteOut(_ fd: Int32, offset: Int64, length: Int64) throws {
        try retryOnInterrupt("sync_file_range") { clinux_start_write_out(fd, off_t(offset), off_t(length)) }
    }

    /// syncfs(2): every file of the file system holding `fd` reaches the disk.
    public static func syncFileSystem(_ fd: Int32) throws {
        try retryOnInterrupt("syncfs") { clinux_syncfs(fd) }
    }

    /// fallocate(2).
    public static func fallocate(_ fd: Int32, mode: Int32, offset: Int64, length: Int64) throws {
        try retryOnInterrupt("fallocate") { clinux_fallocate(fd, mode, off_t(offset), off_t(length)) }
    }

    /// setxattr(2) on `path`.
    public static func setXattr(_ path: String, _ name: String, _ value: [UInt8], flags: Int32) throws {
        try retryOnInterrupt("setxattr") { value.withUnsafeBytes { clinux_setxattr(path, name, $0.baseAddress, $0.count, flags) } }
    }

    /// getxattr(2) on `path`: the whole value.
    public static func getXattr(_ path: String, _ name: String) throws -> [UInt8] {
        try readingSized("getxattr") { clinux_getxattr(path, name, $0.baseAddress, $0.count) }
    }

    /// fsetxattr(2) on open descriptor `fd` (not O_PATH): no walk through /proc.
    public static func setXattr(_ fd: Int32, _ name: String, _ value: [UInt8], flags: Int32) throws {
        try retryOnInterrupt("fsetxattr") { value.withUnsafeBytes { clinux_fsetxattr(fd, name, $0.baseAddress, $0.count, flags) } }
    }

    /// fgetxattr(2) on open descriptor `fd` (not O_PATH): the whole value.
    public static func getXattr(_ fd: Int32, _ name: String) throws -> [UInt8] {
        try readingSized("fgetxattr") { clinux_fgetxattr(fd, name, $0.baseAddress, $0.count) }
    }

    /// listxattr(2) on `path`: the names.
    public static func listXattrs(_ path: String) throws -> [String] {
        let list = try readingSized("listxattr") {
            clinux_listxattr(path, $0.baseAddress?.assumingMemoryBound(to: CChar.self), $0.count)
        }
        return list.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
    }

    /// Calls `body` with a small uninitialized buffer, and with one of the largest size
    /// the kernel allows for xattrs (64 KiB) only when it answers ERANGE. Most answers
    /// are ENODATA or a few dozen bytes: a zeroed 64 KiB buffer per call used to cost
    /// more than the call itself (memset and page faults on every `ls -l`'s getxattr).
    private static func readingSized(_ call: String, _ body: (UnsafeMutableRawBufferPointer) -> Int) throws -> [UInt8] {
        for capacity in [4096, 65536] {
            do {
                return try [UInt8](unsafeUninitializedCapacity: capacity) { buffer, count in
                    count = try retryOnInterrupt(call) { body(UnsafeMutableRawBufferPointer(buffer)) }
                }
            } catch let error as Errno where error.code == ERANGE && capacity < 65536 {
                continue
            }
        }
        throw Errno(ERANGE, call)
    }

    /// removexattr(2) on `path`.
    public static func removeXattr(_ path: String, _ name: String) throws {
        try retryOnInterrupt("removexattr") { clinux_removexattr(path, name) }
    }
}

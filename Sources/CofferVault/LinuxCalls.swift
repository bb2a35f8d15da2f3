// LinuxCalls reaches the Linux-only calls that Swift's Glibc module does not export
// (they sit behind _GNU_SOURCE): renameat2, fallocate, syncfs and the xattr family, resolved
// once from the C library with dlsym, plus their flag values.
import Glibc

/// renameat2(2) flags (<linux/fs.h>).
public let RENAME_NOREPLACE: UInt32 = 1
public let RENAME_EXCHANGE: UInt32 = 2
/// fallocate(2) flag (<linux/falloc.h>).
public let FALLOC_FL_KEEP_SIZE: Int32 = 1
/// utimensat(2) special nanosecond values (<sys/stat.h>).
public let UTIME_NOW: Int = (1 << 30) - 1
public let UTIME_OMIT: Int = (1 << 30) - 2
/// setxattr(2) flags (<sys/xattr.h>).
public let XATTR_CREATE: Int32 = 1
public let XATTR_REPLACE: Int32 = 2

enum LinuxCalls {
    private static func resolve<T>(_ name: String, as type: T.Type) -> T {
        // RTLD_DEFAULT is the null handle: search the process's global symbols (libc).
        guard let symbol = dlsym(nil, name) else { fatalError("the C library has no \(name)") }
        return unsafeBitCast(symbol, to: type)
    }

    typealias PathPtr = UnsafePointer<CChar>?

    static let renameat2 = resolve("renameat2", as: (@convention(c) (Int32, PathPtr, Int32, PathPtr, UInt32) -> Int32).self)
    static let fallocate = resolve("fallocate", as: (@convention(c) (Int32, Int32, off_t, off_t) -> Int32).self)
    static let setxattr = resolve("setxattr", as: (@convention(c) (PathPtr, PathPtr, UnsafeRawPointer?, Int, Int32) -> Int32).self)
    static let getxattr = resolve("getxattr", as: (@convention(c) (PathPtr, PathPtr, UnsafeMutableRawPointer?, Int) -> Int).self)
    static let listxattr = resolve("listxattr", as: (@convention(c) (PathPtr, UnsafeMutablePointer<CChar>?, Int) -> Int).self)
    static let removexattr = resolve("removexattr", as: (@convention(c) (PathPtr, PathPtr) -> Int32).self)
    static let syncfs = resolve("syncfs", as: (@convention(c) (Int32) -> Int32).self)
    static let mallocTrim = resolve("malloc_trim", as: (@convention(c) (Int) -> Int32).self)
    static let pipe2 = resolve("pipe2", as: (@convention(c) (UnsafeMutablePointer<Int32>?, Int32) -> Int32).self)
    static let addClosefrom = resolve("posix_spawn_file_actions_addclosefrom_np",
                                      as: (@convention(c) (UnsafeMutableRawPointer?, Int32) -> Int32).self)
}

extension Sys {
    /// pipe2(2) with O_CLOEXEC: (read end, write end), never inherited by a child unless
    /// a spawn maps it explicitly.
    public static func pipe() throws -> (read: Int32, write: Int32) {
        var fds: [Int32] = [-1, -1]
        try retryOnInterrupt("pipe2") { LinuxCalls.pipe2(&fds, O_CLOEXEC) }
        return (fds[0], fds[1])
    }

    /// posix_spawn_file_actions_addclosefrom_np (glibc 2.34): the child closes every
    /// descriptor from `lowest` up, without this process touching its own.
    public static func addCloseFrom(_ actions: UnsafeMutablePointer<posix_spawn_file_actions_t>, _ lowest: Int32) throws {
        let rc = LinuxCalls.addClosefrom(actions, lowest)
        guard rc == 0 else { throw Errno(rc, "posix_spawn_file_actions_addclosefrom_np") }
    }

    /// malloc_trim(3) with no padding: free heap pages go back to the kernel, which
    /// hands out only zeroed pages, so what freed memory held is gone.
    public static func releaseFreeMemory() { _ = LinuxCalls.mallocTrim(0) }

    /// renameat2(2).
    public static func rename(_ from: String, in fromDir: Int32, to: String, in toDir: Int32, flags: UInt32) throws {
        try retryOnInterrupt("renameat2") { LinuxCalls.renameat2(fromDir, from, toDir, to, flags) }
    }

    /// syncfs(2): every file of the file system holding `fd` reaches the disk.
    public static func syncFileSystem(_ fd: Int32) throws {
        try retryOnInterrupt("syncfs") { LinuxCalls.syncfs(fd) }
    }

    /// fallocate(2).
    public static func fallocate(_ fd: Int32, mode: Int32, offset: Int64, length: Int64) throws {
        try retryOnInterrupt("fallocate") { LinuxCalls.fallocate(fd, mode, off_t(offset), off_t(length)) }
    }

    /// setxattr(2) on `path`.
    public static func setXattr(_ path: String, _ name: String, _ value: [UInt8], flags: Int32) throws {
        try retryOnInterrupt("setxattr") { value.withUnsafeBytes { LinuxCalls.setxattr(path, name, $0.baseAddress, $0.count, flags) } }
    }

    /// getxattr(2) on `path`: the whole value.
    public static func getXattr(_ path: String, _ name: String) throws -> [UInt8] {
        try readingSized("getxattr") { LinuxCalls.getxattr(path, name, $0.baseAddress, $0.count) }
    }

    /// listxattr(2) on `path`: the names.
    public static func listXattrs(_ path: String) throws -> [String] {
        let list = try readingSized("listxattr") {
            LinuxCalls.listxattr(path, $0.baseAddress?.assumingMemoryBound(to: CChar.self), $0.count)
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
        try retryOnInterrupt("removexattr") { LinuxCalls.removexattr(path, name) }
    }
}

// KernelFiles reads what the kernel generates under /proc and /sys, and writes its settings
// there (a mount's readahead): the one door to them.
// The kernel makes such a file a page (about 4 KiB) per read(2), so every read here loops
// until read returns 0; a reader that stops at the first read sees the start of
// /proc/net/unix, /proc/locks or mountinfo and silently misses the rest (it did, twice).
import Glibc

public enum KernelFiles {
    /// Most bytes one file is read to (a 64 MiB guard against a runaway file).
    static let limit = 64 << 20

    /// The whole of the file at `path`, read to its end.
    public static func read(_ path: String) throws -> [UInt8] {
        let fd = try FileDescriptor.open(path, flags: O_RDONLY)
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let n = try chunk.withUnsafeMutableBytes { buffer in
                try retryOnInterrupt("read \(path)") { Glibc.read(fd.rawValue, buffer.baseAddress, buffer.count) }
            }
            if n == 0 { return out }
            out += chunk.prefix(n)
            guard out.count <= limit else { throw Errno(EFBIG, "read \(path)") }
        }
    }

    /// The whole of the file at `path` as text; nil if it cannot be read (a process that
    /// ended, a file this user may not read).
    public static func text(_ path: String) -> String? {
        (try? read(path)).map { String(decoding: $0, as: UTF8.self) }
    }

    /// The names in directory `path` (/proc, /proc/PID/fd); empty if it cannot be read.
    public static func names(in path: String) -> [String] {
        guard let fd = try? FileDescriptor.open(path, flags: O_RDONLY | O_DIRECTORY) else { return [] }
        return (try? Sys.listDirectory(fd.rawValue)) ?? []
    }

    /// Where the link at `path` points (/proc/PID/exe, /proc/PID/fd/N); nil if unreadable.
    public static func link(_ path: String) -> String? {
        try? Sys.readlink(path, in: AT_FDCWD)
    }

    /// Writes `text` to the setting at `path` (/sys/class/bdi/…), in one write(2) as the
    /// kernel takes a setting.
    public static func write(_ path: String, _ text: String) throws {
        let fd = try FileDescriptor.open(path, flags: O_WRONLY)
        let bytes = Array(text.utf8)
        let n = try bytes.withUnsafeBytes { buffer in
            try retryOnInterrupt("write \(path)") { Glibc.write(fd.rawValue, buffer.baseAddress, buffer.count) }
        }
        guard n == bytes.count else { throw Errno(EIO, "write \(path) (short)") }
    }
}

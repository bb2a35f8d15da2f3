// ByteNames are the *at calls for names given as bytes: a plaintext directory's names are
// whatever bytes its programs chose (not always UTF-8), and a String would change them.
import CLinux
import Glibc

extension Sys {
    /// An entry of a directory as getdents reports it, its name as bytes.
    public struct ByteEntry: Sendable {
        public let name: [UInt8]
        public let ino: UInt64
        /// d_type (DT_REG, DT_DIR, …).
        public let type: UInt8
    }

    /// The entries of directory `dir` (without "." and ".."), read through a new descriptor.
    public static func readDirectoryBytes(_ dir: Int32) throws -> [ByteEntry] {
        var entries: [ByteEntry] = []
        let offset = MemoryLayout<dirent>.offset(of: \dirent.d_name)!
        try forEachEntry(in: dir) { entry in
            // d_name read in place up to its NUL (DirectoryEntry says why).
            let start = UnsafeRawPointer(entry).advanced(by: offset).assumingMemoryBound(to: CChar.self)
            let name = [UInt8](UnsafeRawBufferPointer(start: start, count: strlen(start)))
            if name != [0x2e] && name != [0x2e, 0x2e] {
                entries.append(ByteEntry(name: name, ino: UInt64(entry.pointee.d_ino), type: entry.pointee.d_type))
            }
        }
        return entries
    }

    /// fstatat(2) of `name` in `dir`, without following a final symlink.
    public static func stat(bytes name: [UInt8], in dir: Int32) throws -> stat {
        var st = Glibc.stat()
        try withCName(name) { c in try retryOnInterrupt("fstatat") { Glibc.fstatat(dir, c, &st, AT_SYMLINK_NOFOLLOW) } }
        return st
    }

    /// readlinkat(2) of `name` in `dir`: the target's bytes.
    public static func readlink(bytes name: [UInt8], in dir: Int32) throws -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX))
        let n = try withCName(name) { c in
            try retryOnInterrupt("readlinkat") {
                buffer.withUnsafeMutableBytes { Glibc.readlinkat(dir, c, $0.baseAddress!.assumingMemoryBound(to: CChar.self), $0.count) }
            }
        }
        return Array(buffer[..<n])
    }

    /// Runs `body` with `name` as a C string.
    private static func withCName<R>(_ name: [UInt8], _ body: (UnsafePointer<CChar>) throws -> R) rethrows -> R {
        try (name + [0]).withUnsafeBufferPointer { try $0.withMemoryRebound(to: CChar.self) { try body($0.baseAddress!) } }
    }
}

extension Sys {
    /// openat2(2) of `path` (bytes; empty: `dir` itself) below directory `dir`, with
    /// O_CLOEXEC and O_NOFOLLOW, following no symlink in any component and never leaving
    /// `dir` (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS): a path walk a symlink swapped in
    /// anywhere along it cannot lead elsewhere.
    public static func open(beneath dir: Int32, path: [UInt8], flags: Int32) throws -> FileDescriptor {
        let fd = try ((path.isEmpty ? [0x2e] : path) + [0]).withUnsafeBufferPointer { bytes in
            try bytes.withMemoryRebound(to: CChar.self) { c in
                try retryOnInterrupt("openat2") { clinux_open_beneath(dir, c.baseAddress!, flags | O_NOFOLLOW) }
            }
        }
        return FileDescriptor(owning: fd)
    }
}

// FileDescriptor owns one open descriptor and closes it when it goes away, so that no
// path (a throw, an early return) can leak it or close it twice.
import Glibc

/// An open descriptor that this value owns: it is closed in `deinit` unless ownership
/// is given up with `release()` or it is closed earlier with `close()`. Noncopyable, so
/// there is exactly one owner at a time; passing it on is a `consume`.
///
/// Owned descriptors are this type; descriptors that are only borrowed for the length
/// of a call stay `Int32` (every `Sys` call, `ContentFile`, the `*at` helpers): pass
/// `rawValue`, which is valid while the owner is alive.
public struct FileDescriptor: ~Copyable, Sendable {
    /// The descriptor number, for system calls (borrowed: the owner still closes it).
    public let rawValue: Int32

    /// Takes ownership of `rawValue`, an open descriptor nobody else will close.
    public init(owning rawValue: Int32) {
        self.rawValue = rawValue
    }

    deinit { Sys.close(rawValue) }

    /// Gives up ownership: the caller (or whatever it hands the number to) closes it.
    public consuming func release() -> Int32 {
        let fd = rawValue
        discard self
        return fd
    }

    /// Closes the descriptor now (close(2); errors are ignored, as in `Sys.close`).
    public consuming func close() {
        Sys.close(release())
    }

    /// openat(2) with O_CLOEXEC, as `Sys.open`, returning an owned descriptor.
    public static func open(_ name: String, in dir: Int32 = AT_FDCWD, flags: Int32, mode: mode_t = 0) throws -> FileDescriptor {
        FileDescriptor(owning: try Sys.open(name, in: dir, flags: flags, mode: mode))
    }

    /// openat(fd, ".", flags): a new descriptor — a new open file description, with its
    /// own flags and its own flock — of the directory this one names. It reaches the same
    /// inode whatever has happened to the directory's path since this one was opened.
    public borrowing func reopenDirectory(flags: Int32) throws -> FileDescriptor {
        try FileDescriptor.open(".", in: rawValue, flags: flags | O_DIRECTORY)
    }

    /// A new descriptor, opened with `flags`, of the inode this one names (typically an
    /// O_PATH descriptor), through /proc/self/fd: whatever has been renamed or swapped in
    /// at its name since, this reaches the same inode.
    public borrowing func reopen(flags: Int32) throws -> FileDescriptor {
        try FileDescriptor.open(Sys.procPath(rawValue), flags: flags)
    }

    /// Runs `body` with the inode of this descriptor (typically O_PATH; `st` its stat)
    /// opened anew with `flags` (a write mode), through /proc/self/fd. Where that is
    /// refused (EACCES) and the file is this process's user's — coffer's own file, which
    /// its owner made read-only, or an IV file (mode 0400) — it is made owner-writable for
    /// the open and its mode put back after `body`.
    public borrowing func withReopened<R>(flags: Int32, owner st: stat, _ body: (Int32) throws -> R) throws -> R {
        let path = Sys.procPath(rawValue)
        let fd: FileDescriptor
        do {
            fd = try FileDescriptor.open(path, flags: flags)
        } catch let error as Errno where error.code == EACCES {
            guard st.st_uid == geteuid() else { throw error }
            try Sys.chmod(path, (st.st_mode & 0o7777) | 0o600)
            defer { try? Sys.chmod(path, st.st_mode & 0o7777) }
            let writable = try FileDescriptor.open(path, flags: flags)
            return try body(writable.rawValue)
        }
        return try body(fd.rawValue)
    }

    /// Opens a backing file that coffer reads itself (config, directory IV, long-name
    /// sidecar, journal, content file during fsck): CIPHERDIR may be hostile, so the open
    /// never follows a symlink and never blocks (O_NONBLOCK: a FIFO would wait for a
    /// writer), and anything but a regular file is refused with EINVAL. O_NONBLOCK is
    /// cleared again before the descriptor is returned.
    public static func openRegular(_ name: String, in dir: Int32 = AT_FDCWD, flags: Int32 = O_RDONLY,
                                   mode: mode_t = 0) throws -> FileDescriptor {
        let fd = try open(name, in: dir, flags: flags | O_NONBLOCK | O_NOFOLLOW, mode: mode)
        guard try Sys.stat(fd.rawValue).st_mode & S_IFMT == S_IFREG else { throw Errno(EINVAL, "\(name) is not a regular file") }
        let status = try retryOnInterrupt("fcntl") { fcntl(fd.rawValue, F_GETFL) }
        try retryOnInterrupt("fcntl") { fcntl(fd.rawValue, F_SETFL, status & ~O_NONBLOCK) }
        return fd
    }
}

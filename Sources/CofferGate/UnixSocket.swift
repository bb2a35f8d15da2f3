// UnixSocket wraps the few socket calls the control channel needs: bind/listen with a
// private mode, connect, the peer's credentials (SO_PEERCRED), a receive timeout.
import CofferSystem
import Glibc

enum UnixSocket {
    /// The peer's pid, uid and gid (SO_PEERCRED's struct ucred).
    typealias Credentials = PeerCredentials

    private static func stream() throws -> FileDescriptor {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw Errno.current("socket") }
        return FileDescriptor(owning: fd)
    }

    /// A listening socket at `path`, mode 0600 (bound under umask 077, then chmod'ed).
    static func listen(at path: String) throws -> FileDescriptor {
        let socket = try stream()
        let address = try UnixSocketAddress(path)
        let saved = umask(0o077)
        let rc = address.withSockaddr { bind(socket.rawValue, $0, $1) }
        umask(saved)
        guard rc == 0 else { throw Errno.current("bind \(path)") }
        guard chmod(path, 0o600) == 0, Glibc.listen(socket.rawValue, 16) == 0 else { throw Errno.current("listen \(path)") }
        return socket
    }

    /// A socket connected to `path`.
    static func connect(to path: String) throws -> FileDescriptor {
        let socket = try stream()
        let address = try UnixSocketAddress(path)
        guard address.withSockaddr({ Glibc.connect(socket.rawValue, $0, $1) }) == 0 else { throw Errno.current("connect \(path)") }
        return socket
    }

    static func peer(_ fd: Int32) -> Credentials? { Sys.peerCredentials(fd) }

    static func setTimeout(_ fd: Int32, seconds: Int) {
        var tv = timeval(tv_sec: seconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }
}

/// A Unix socket's address (sockaddr_un) and its length: a path, or, if `abstract`
/// allows it and it starts with '@', a name in the abstract namespace (as systemd
/// writes $NOTIFY_SOCKET).
public struct UnixSocketAddress {
    private var address = sockaddr_un()
    private let length: socklen_t

    /// Throws ENAMETOOLONG when the name does not fit in sun_path with its leading or
    /// trailing NUL byte.
    public init(_ path: String, abstract allowed: Bool = false) throws {
        address.sun_family = sa_family_t(AF_UNIX)
        let abstract = allowed && path.hasPrefix("@")
        // An abstract name starts with a NUL byte instead of '@'; a path ends with one.
        let bytes = abstract ? [0] + Array(path.utf8.dropFirst()) : Array(path.utf8) + [0]
        guard bytes.count <= MemoryLayout.size(ofValue: address.sun_path) else {
            throw Errno(ENAMETOOLONG, "socket path \(path)")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count)
    }

    /// Calls `body` with the address as a sockaddr and its length (bind, connect, sendto).
    public func withSockaddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> R) -> R {
        withUnsafePointer(to: address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, length) } }
    }
}

// UnixSocket wraps the few socket calls the control channel needs: bind/listen with a
// private mode, connect, the peer's credentials (SO_PEERCRED), a receive timeout.
import CLinux
import CofferVault
import Glibc

enum UnixSocket {
    /// The peer's pid, uid and gid (SO_PEERCRED's struct ucred).
    struct Credentials { var pid: Int32 = 0; var uid: UInt32 = 0; var gid: UInt32 = 0 }

    private static func address(_ path: String) throws -> sockaddr_un {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { throw Errno(ENAMETOOLONG, "socket path \(path)") }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes + [0]) }
        return address
    }

    private static func stream() throws -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw Errno(errno, "socket") }
        return fd
    }

    /// A listening socket at `path`, mode 0600 (bound under umask 077, then chmod'ed).
    static func listen(at path: String) throws -> Int32 {
        let fd = try stream()
        var address = try address(path)
        let saved = umask(0o077)
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        umask(saved)
        guard rc == 0 else { let e = Errno(errno, "bind \(path)"); close(fd); throw e }
        guard chmod(path, 0o600) == 0, Glibc.listen(fd, 16) == 0 else {
            let e = Errno(errno, "listen \(path)"); close(fd); throw e
        }
        return fd
    }

    /// A socket connected to `path`.
    static func connect(to path: String) throws -> Int32 {
        let fd = try stream()
        var address = try address(path)
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard rc == 0 else { let e = Errno(errno, "connect \(path)"); close(fd); throw e }
        return fd
    }

    static func peer(_ fd: Int32) -> Credentials? {
        var credentials = Credentials()
        return clinux_peer_credentials(fd, &credentials.pid, &credentials.uid, &credentials.gid) == 0 ? credentials : nil
    }

    static func setTimeout(_ fd: Int32, seconds: Int) {
        var tv = timeval(tv_sec: seconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }
}

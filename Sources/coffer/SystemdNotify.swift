// SystemdNotify tells systemd (Type=notify) that the mount is live (READY=1) or going
// away (STOPPING=1), by a datagram to $NOTIFY_SOCKET; without it, nothing happens.
import Foundation
import Glibc

enum SystemdNotify {
    static func send(_ state: String) {
        guard var path = ProcessInfo.processInfo.environment["NOTIFY_SOCKET"], !path.isEmpty else { return }
        let abstract = path.hasPrefix("@")
        if abstract { path.removeFirst() }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) - 1 else { return }
        // An abstract socket's name starts with a NUL byte instead of '@'.
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: (abstract ? [0] : []) + bytes) }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + (abstract ? 1 : 0))
        var message = Array(state.utf8)
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(fd, &message, message.count, 0, $0, length) }
        }
    }
}

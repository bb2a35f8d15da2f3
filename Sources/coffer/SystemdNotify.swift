// SystemdNotify tells systemd (Type=notify) that the mount is live (READY=1) or going
// away (STOPPING=1), and whether it is locked (STATUS=, the unit's status line), by a
// datagram to $NOTIFY_SOCKET; without it, nothing happens.
import CofferGate
import CofferSystem
import Foundation
import Glibc

enum SystemdNotify {
    static func send(_ state: String) {
        guard let path = ProcessInfo.processInfo.environment["NOTIFY_SOCKET"], !path.isEmpty,
              let address = try? UnixSocketAddress(path, abstract: true) else { return }
        let raw = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard raw >= 0 else { return }
        let fd = FileDescriptor(owning: raw)
        let message = Array(state.utf8)
        // Never waits (a lock sends it): a datagram that does not fit now is not sent.
        _ = address.withSockaddr { sendto(fd.rawValue, message, message.count, Int32(MSG_DONTWAIT), $0, $1) }
    }
}

// DetachedBus makes D-Bus messages without a bus: an sd-bus connection on one end of a
// socket pair that nothing answers, and the calls a test needs that CofferBus does not
// make (sealing a message to read it back, appending and reading `u` and `d`).
import CSystemd
@testable import CofferBus
import Glibc

/// An sd-bus connection that is started (sd-bus makes messages only then) and never
/// processed: nothing is sent on it, nothing arrives.
final class DetachedBus {
    let raw: OpaquePointer
    /// The other end of the socket pair, never read.
    private let peer: Int32
    private var cookie: UInt64 = 0

    init() throws {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0 else { throw BusError("socketpair", -errno) }
        var made: OpaquePointer?
        guard sd_bus_new(&made) >= 0, let bus = made else {
            close(fds[0]); close(fds[1])
            throw BusError("sd_bus_new", -ENOMEM)
        }
        raw = bus
        peer = fds[1]
        // The bus owns fds[0] from here on.
        try check("sd_bus_set_fd", sd_bus_set_fd(raw, fds[0], fds[0]))
        try check("sd_bus_start", sd_bus_start(raw))
    }

    deinit {
        close(peer)
        // Closed without a flush: a flush would wait for an authentication nobody answers.
        sd_bus_close_unref(raw)
    }

    /// A signal of object `path`, to be filled in.
    func signal(_ interface: String, _ member: String, path: String = "/test") throws -> BusMessage {
        var message: OpaquePointer?
        try check("sd_bus_message_new_signal", sd_bus_message_new_signal(raw, &message, path, interface, member))
        return BusMessage(owning: message!)
    }

    /// A method call to object `path`, to be filled in and sealed.
    func methodCall(_ interface: String, _ member: String, path: String = "/test") throws -> BusMessage {
        var message: OpaquePointer?
        try check("sd_bus_message_new_method_call",
                  sd_bus_message_new_method_call(raw, &message, "io.github.coffer.Test", path, interface, member))
        return BusMessage(owning: message!)
    }

    /// `message`, sealed as sending seals it (every message that arrives is sealed), and
    /// at its first argument: ready to be read, or answered.
    @discardableResult
    func sealed(_ message: BusMessage) throws -> BusMessage {
        cookie += 1
        try check("sd_bus_message_seal", sd_bus_message_seal(message.raw, cookie, 0))
        try check("sd_bus_message_rewind", sd_bus_message_rewind(message.raw, 1))
        return message
    }
}

extension BusMessage {
    func append(uint32 value: UInt32) throws {
        var u = value
        try check("append u", sd_bus_message_append_basic(raw, CChar(UInt8(ascii: "u")), &u))
    }

    func readDouble() throws -> Double {
        var d = 0.0
        guard try check("read d", sd_bus_message_read_basic(raw, CChar(UInt8(ascii: "d")), &d)) > 0 else {
            throw BusError("read d", -ENXIO)
        }
        return d
    }
}

// BusMessage is one D-Bus message (an sd_bus_message reference): its header fields, and
// its arguments appended or read one basic value at a time (sd-bus's variadic calls do
// not reach Swift).
import CSystemd
import CofferSystem
import Glibc

public final class BusMessage {
    let raw: OpaquePointer

    /// Takes over a reference sd-bus gave us.
    init(owning raw: OpaquePointer) { self.raw = raw }

    /// Takes a reference of its own to a message sd-bus lends a handler.
    init(borrowing raw: OpaquePointer) {
        self.raw = raw
        sd_bus_message_ref(raw)
    }

    deinit { sd_bus_message_unref(raw) }

    public var path: String? { sd_bus_message_get_path(raw).map { String(cString: $0) } }
    public var interface: String? { sd_bus_message_get_interface(raw).map { String(cString: $0) } }
    public var member: String? { sd_bus_message_get_member(raw).map { String(cString: $0) } }
    public var sender: String? { sd_bus_message_get_sender(raw).map { String(cString: $0) } }

    /// The error a reply carries ("name: message"), nil for a method return.
    public var error: String? {
        guard let error = sd_bus_message_get_error(raw), let name = error.pointee.name else { return nil }
        return String(cString: name) + (error.pointee.message.map { ": " + String(cString: $0) } ?? "")
    }

    /// A method call's (empty) return, to be appended to and sent.
    public func methodReturn() throws -> BusMessage {
        var reply: OpaquePointer?
        try check("sd_bus_message_new_method_return", sd_bus_message_new_method_return(raw, &reply))
        return BusMessage(owning: reply!)
    }

    /// Answers this method call with D-Bus error `name`; 1, what a handler returns once it replied.
    @discardableResult
    public func replyError(_ name: String, _ text: String) -> Int32 {
        var error = sd_bus_error(name: nil, message: nil, _need_free: 0)
        defer { sd_bus_error_free(&error) }
        sd_bus_error_set(&error, name, text)
        return sd_bus_reply_method_error(raw, &error) < 0 ? -1 : 1
    }

    private static func type(_ c: Unicode.Scalar) -> CChar { CChar(UInt8(ascii: c)) }

    // MARK: Appending

    public func append(_ value: String) throws {
        _ = try value.withCString { try check("append s", sd_bus_message_append_basic(raw, Self.type("s"), $0)) }
    }

    public func append(objectPath value: String) throws {
        _ = try value.withCString { try check("append o", sd_bus_message_append_basic(raw, Self.type("o"), $0)) }
    }

    public func append(_ value: Bool) throws {
        var b: Int32 = value ? 1 : 0
        try check("append b", sd_bus_message_append_basic(raw, Self.type("b"), &b))
    }

    public func append(_ value: Double) throws {
        var d = value
        try check("append d", sd_bus_message_append_basic(raw, Self.type("d"), &d))
    }

    public func append(_ value: UInt64) throws {
        var t = value
        try check("append t", sd_bus_message_append_basic(raw, Self.type("t"), &t))
    }

    /// Opens container `type` ("a", "v", "e", "r") of `contents` ("{sv}", "b"…); `close` ends it.
    public func open(_ type: Unicode.Scalar, _ contents: String) throws {
        try check("open \(type)\(contents)", sd_bus_message_open_container(raw, Self.type(type), contents))
    }

    public func close() throws {
        try check("close container", sd_bus_message_close_container(raw))
    }

    // MARK: Reading

    /// Reads one basic value of `type` into `value`; throws where there is none — past
    /// the last argument, or at the end of an array (where sd-bus answers 0, not an error).
    private func readBasic(_ type: Unicode.Scalar, into value: UnsafeMutableRawPointer) throws {
        guard try check("read \(type)", sd_bus_message_read_basic(raw, Self.type(type), value)) > 0 else {
            throw BusError("read \(type)", -ENXIO)
        }
    }

    /// Reads a string (`s`, or `o` with `objectPath`).
    public func readString(objectPath: Bool = false) throws -> String {
        var p: UnsafePointer<CChar>?
        try readBasic(objectPath ? "o" : "s", into: &p)
        guard let p else { throw BusError("read s", -ENXIO) }
        return String(cString: p)
    }

    public func readBool() throws -> Bool {
        var b: Int32 = 0
        try readBasic("b", into: &b)
        return b != 0
    }

    public func readUInt32() throws -> UInt32 {
        var u: UInt32 = 0
        try readBasic("u", into: &u)
        return u
    }

    public func readUInt64() throws -> UInt64 {
        var t: UInt64 = 0
        try readBasic("t", into: &t)
        return t
    }

    /// Reads a descriptor (`h`) and returns a duplicate the caller owns (close-on-exec):
    /// the message's own closes with the message.
    public func readDescriptor() throws -> Int32 {
        var fd: Int32 = -1
        try check("read h", sd_bus_message_read_basic(raw, Self.type("h"), &fd))
        let copy = fcntl(fd, F_DUPFD_CLOEXEC, 3)
        guard copy >= 0 else { throw Errno.current("fcntl(F_DUPFD_CLOEXEC)") }
        return copy
    }

    /// Enters container `type` of `contents`; false at the end of the enclosing one.
    public func enter(_ type: Unicode.Scalar, _ contents: String) throws -> Bool {
        try check("enter \(type)\(contents)", sd_bus_message_enter_container(raw, Self.type(type), contents)) > 0
    }

    public func exit() throws {
        try check("exit container", sd_bus_message_exit_container(raw))
    }

    /// Skips the values of signature `types`.
    public func skip(_ types: String) throws {
        try check("skip \(types)", sd_bus_message_skip(raw, types))
    }
}

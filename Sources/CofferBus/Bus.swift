// Bus is one D-Bus connection (sd-bus) and the thread that owns it: sd-bus is not
// thread-safe, so everything done with the connection — replies, signals, calls, the
// handlers of what arrives — runs on that thread; other threads hand it work with
// `perform`, which never waits.
import CSystemd
import CofferSystem
import Dispatch
import Foundation
import Glibc
import Logging
import Synchronization

/// A failed sd-bus call: its name and the errno it returned.
public struct BusError: Error, CustomStringConvertible {
    public let call: String
    public let code: Int32
    /// The D-Bus error's name and message, when the failure is a remote one.
    public let remote: String?

    init(_ call: String, _ rc: Int32, remote: String? = nil) {
        self.call = call
        code = -rc
        self.remote = remote
    }

    public var description: String { remote.map { "\(call): \($0)" } ?? "\(call): \(String(cString: strerror(code)))" }
}

/// Throws a `BusError` for a negative sd-bus return value; returns the value otherwise.
@discardableResult
func check(_ call: String, _ rc: Int32) throws -> Int32 {
    guard rc >= 0 else { throw BusError(call, rc) }
    return rc
}

/// @unchecked Sendable: `bus` and `handlers` are used only on the bus thread once it runs
/// (`init` and the setup given to `start` run before it does); the work queue and the
/// stop flag are in a Mutex, and the wake pipe's ends are written and read whole.
public final class Bus: @unchecked Sendable {
    public enum Address: Sendable {
        /// The user's session bus: $DBUS_SESSION_BUS_ADDRESS, else $XDG_RUNTIME_DIR/bus.
        case session
        /// The system bus, or the bus at `address` instead (tests: a private bus).
        case system(address: String?)
    }

    let bus: OpaquePointer
    /// Handlers registered for the connection's life (objects, matches): they are the
    /// userdata sd-bus passes back, so they are kept here as long as the connection.
    private var handlers: [Handler] = []
    /// Method calls kept for a reply sent later (after work done on another thread), by
    /// token: a message is referenced and released on this thread only.
    private var held: [Int: BusMessage] = [:]
    private var nextToken = 0
    private struct Queue {
        var work: [@Sendable () -> Void] = []
        var stopping = false
        var started = false
    }
    private let queue = Mutex(Queue())
    private let wakeRead: Int32, wakeWrite: Int32
    /// Signalled by the thread once it has flushed and closed the connection.
    private let finished = DispatchSemaphore(value: 0)
    let logger: Logger
    /// What this bus is, for log lines ("session bus", "system bus").
    public let name: String

    /// Connects (and says hello to the bus); throws when there is no bus to reach.
    public init(_ address: Address, logger: Logger) throws {
        var raw: OpaquePointer?
        switch address {
        case .session:
            name = "session bus"
            try check("sd_bus_open_user", sd_bus_open_user(&raw))
        case .system(nil):
            name = "system bus"
            try check("sd_bus_open_system", sd_bus_open_system(&raw))
        case .system(let address?):
            name = "system bus (\(address))"
            try check("sd_bus_new", sd_bus_new(&raw))
            do {
                try check("sd_bus_set_address", sd_bus_set_address(raw, address))
                try check("sd_bus_set_bus_client", sd_bus_set_bus_client(raw, 1))
                try check("sd_bus_start", sd_bus_start(raw))
            } catch {
                sd_bus_unref(raw)
                throw error
            }
        }
        bus = raw!
        let pipe = try Sys.pipe()
        wakeRead = pipe.read.release()
        wakeWrite = pipe.write.release()
        self.logger = logger
    }

    /// Starts the thread that owns the connection from now on.
    public func start() {
        queue.withLock { $0.started = true }
        BackgroundThread.start("coffer-bus") { [self] in run() }
    }

    /// Runs `body` on the bus thread, soon; never waits for it.
    public func perform(_ body: @escaping @Sendable () -> Void) {
        let accepted = queue.withLock { queue -> Bool in
            guard !queue.stopping else { return false }
            queue.work.append(body)
            return true
        }
        if accepted { wake() }
    }

    /// Ends the thread once the work handed to it so far is done and sent (the last
    /// signals of a daemon that is ending), waiting for that at most `seconds`. Once.
    public func stop(waiting seconds: Double = 1) {
        let started = queue.withLock { queue in
            queue.stopping = true
            return queue.started
        }
        // Never started (its setup failed): closed here, on the thread that made it.
        guard started else { return _ = sd_bus_flush_close_unref(bus) }
        wake()
        _ = finished.wait(timeout: .now() + seconds)
    }

    private func wake() {
        var byte: UInt8 = 1
        _ = Glibc.write(wakeWrite, &byte, 1)
    }

    /// Processes what arrives and the work handed over until stopped or disconnected.
    private func run() {
        defer {
            sd_bus_flush_close_unref(bus)
            Sys.close(wakeRead)
            finished.signal()
        }
        while true {
            let (work, stopping) = queue.withLock { queue in
                defer { queue.work = [] }
                return (queue.work, queue.stopping)
            }
            work.forEach { $0() }
            while true {
                let rc = sd_bus_process(bus, nil)
                if rc < 0 {
                    logger.warning("D-Bus: the \(name) went away (\(BusError("sd_bus_process", rc))); the daemon goes on without it")
                    return
                }
                if rc == 0 { break }
            }
            if stopping { return }
            var timeout: UInt64 = 0
            var milliseconds: Int32 = -1
            if sd_bus_get_timeout(bus, &timeout) >= 0 && timeout != UInt64.max {
                // sd-bus's timeouts are on the monotonic clock, in microseconds.
                let nowMicros = UInt64(Sys.monotonicNow() * 1_000_000)
                milliseconds = timeout <= nowMicros ? 0 : Int32(min((timeout - nowMicros + 999) / 1000, UInt64(Int32.max)))
            }
            var polled = [pollfd(fd: sd_bus_get_fd(bus), events: Int16(truncatingIfNeeded: sd_bus_get_events(bus)), revents: 0),
                          pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0)]
            _ = try? Sys.poll(&polled, timeout: milliseconds)
            if polled[1].revents != 0 {
                var drain = [UInt8](repeating: 0, count: 64)
                _ = drain.withUnsafeMutableBytes { try? Sys.read(wakeRead, into: $0) }
            }
        }
    }

    // MARK: On the bus thread

    /// A Swift closure as sd-bus userdata.
    final class Handler {
        let body: (BusMessage) -> Int32
        init(_ body: @escaping (BusMessage) -> Int32) { self.body = body }
    }

    /// The handler called for every message sd-bus routes to a `Handler`.
    private static let dispatch: sd_bus_message_handler_t = { message, userdata, _ in
        let handler = Unmanaged<Handler>.fromOpaque(userdata!).takeUnretainedValue()
        return handler.body(BusMessage(borrowing: message!))
    }

    /// The handler of an asynchronous call's reply: called once, then released.
    private static let dispatchOnce: sd_bus_message_handler_t = { message, userdata, _ in
        let handler = Unmanaged<Handler>.fromOpaque(userdata!).takeRetainedValue()
        return handler.body(BusMessage(borrowing: message!))
    }

    /// Calls `body` for every message (method call) sent to object `path`; it answers
    /// 1 when it replied, 0 to let sd-bus answer (an unknown method).
    public func addObject(_ path: String, _ body: @escaping (BusMessage) -> Int32) throws {
        let handler = Handler(body)
        try check("sd_bus_add_object", sd_bus_add_object(bus, nil, path, Self.dispatch, Unmanaged.passUnretained(handler).toOpaque()))
        handlers.append(handler)
    }

    /// Calls `body` for every message matching the match rule `rule`.
    public func addMatch(_ rule: String, _ body: @escaping (BusMessage) -> Void) throws {
        let handler = Handler { body($0); return 0 }
        try check("sd_bus_add_match", sd_bus_add_match(bus, nil, rule, Self.dispatch, Unmanaged.passUnretained(handler).toOpaque()))
        handlers.append(handler)
    }

    /// Asks for well-known name `name` (failing if another connection has it).
    public func requestName(_ name: String) throws {
        try check("sd_bus_request_name(\(name))", sd_bus_request_name(bus, name, 0))
    }

    /// A method call to be filled in and sent with `call` or `callAsync`.
    public func methodCall(_ destination: String, _ path: String, _ interface: String, _ member: String) throws -> BusMessage {
        var raw: OpaquePointer?
        try check("sd_bus_message_new_method_call", sd_bus_message_new_method_call(bus, &raw, destination, path, interface, member))
        return BusMessage(owning: raw!)
    }

    /// A signal from object `path`, to be filled in and sent with `send`.
    public func signal(_ path: String, _ interface: String, _ member: String) throws -> BusMessage {
        var raw: OpaquePointer?
        try check("sd_bus_message_new_signal", sd_bus_message_new_signal(bus, &raw, path, interface, member))
        return BusMessage(owning: raw!)
    }

    /// Sends `message` (a signal or a reply) without waiting.
    public func send(_ message: BusMessage) throws {
        try check("sd_bus_send", sd_bus_send(bus, message.raw, nil))
    }

    /// Sends method call `message` and waits for its reply (for calls whose answer the
    /// daemon needs before it goes on: at startup, or the bus driver's own answers).
    public func call(_ message: BusMessage, timeoutSeconds: Double = 10) throws -> BusMessage {
        var error = sd_bus_error(name: nil, message: nil, _need_free: 0)
        defer { sd_bus_error_free(&error) }
        var reply: OpaquePointer?
        let rc = sd_bus_call(bus, message.raw, UInt64(timeoutSeconds * 1_000_000), &error, &reply)
        guard rc >= 0, let reply else {
            let remote = error.name.map { name in String(cString: name) + (error.message.map { ": " + String(cString: $0) } ?? "") }
            throw BusError("\(message.interface ?? "").\(message.member ?? "")", rc, remote: remote)
        }
        return BusMessage(owning: reply)
    }

    /// Sends method call `message`; `body` gets the reply (or the error) later, on this thread.
    public func callAsync(_ message: BusMessage, timeoutSeconds: Double = 25, _ body: @escaping (BusMessage) -> Void) throws {
        let handler = Unmanaged.passRetained(Handler { body($0); return 0 })
        let rc = sd_bus_call_async(bus, nil, message.raw, Self.dispatchOnce, handler.toOpaque(), UInt64(timeoutSeconds * 1_000_000))
        if rc < 0 {
            handler.release()
            throw BusError("\(message.interface ?? "").\(message.member ?? "")", rc)
        }
    }

    /// Keeps `message` until `release(token)`; the token may travel to other threads.
    public func hold(_ message: BusMessage) -> Int {
        nextToken += 1
        held[nextToken] = message
        return nextToken
    }

    public func release(_ token: Int) -> BusMessage? { held.removeValue(forKey: token) }

    /// The uid of the connection that sent `message`, as the bus driver knows it.
    public func senderUID(of message: BusMessage) throws -> uid_t {
        guard let sender = message.sender else { throw BusError("sender", -EBADMSG) }
        let ask = try methodCall("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetConnectionUnixUser")
        try ask.append(sender)
        return try call(ask, timeoutSeconds: 5).readUInt32()
    }
}

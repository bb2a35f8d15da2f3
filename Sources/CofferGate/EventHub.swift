// EventHub tells the programs subscribed on the control socket what happens to the mount
// (docs/CONTROL.md, "Events"): each event is one frame, sent without waiting — a
// subscriber that does not read is dropped once its socket's buffer is full, so none can
// hold up the daemon or a lock — and one thread reads what subscribers send back (`done`
// after a `will-lock`) and notices those that hang up. Listeners in the process get the
// typed `MountEvent`; only the frames carry its text.
import CofferSystem
import Foundation
import Glibc
import Logging
import Synchronization

/// Sendable: the subscribers live in a Mutex (a leaf lock, held for no system call that
/// can wait). Each subscriber's descriptor is the hub's own, held by a `Connection` and
/// closed only when the last reference to it goes: a send, a shutdown or a read the hub
/// makes on a descriptor number always reaches the connection it was given, never one
/// that took the number after it was closed.
public final class EventHub: Sendable {
    /// Version of the event objects (their fields), independent of the request protocol.
    public static let version = 1
    /// Bytes a subscriber's socket may hold unread before it is dropped: some hundreds of
    /// events, set small so that one that never reads costs the daemon little.
    static let sendBuffer: Int32 = 64 << 10

    /// A subscriber's connection. The table holds it, and so does each send, shutdown or
    /// read in progress; its descriptor is closed when the last of them lets go.
    private final class Connection: Sendable {
        let descriptor: FileDescriptor
        /// The descriptor number, valid as long as this connection is referenced.
        var fd: Int32 { descriptor.rawValue }

        init(_ descriptor: consuming FileDescriptor) {
            self.descriptor = descriptor
        }
    }

    private struct Subscriber {
        let connection: Connection
        /// It asked for time before an announced lock (`delays`), and has said `done`
        /// since the last `will-lock`.
        let delays: Bool
        var done = true
        /// A frame arriving in parts.
        var inbox: [UInt8] = []
        /// Dropped (a send that did not fit, the end of its stream, an oversized frame):
        /// the reading thread takes it out of the table.
        var dropped = false
    }

    private struct Subscribers {
        /// By their descriptor numbers, distinct while in the table (each is open).
        var byDescriptor: [Int32: Subscriber] = [:]
        var stopped = false
        /// In-process listeners (the D-Bus object, systemd's status line), in order.
        var listeners: [@Sendable (MountEvent) -> Void] = []
    }

    private let subscribers = Mutex(Subscribers())
    /// Wakes the reading thread when a subscriber joins or is dropped, or the hub stops.
    private let wakePipe: Sys.Pipe
    private let logger: Logger

    public init(logger: Logger = Logger(label: "coffer", factory: { _ in SwiftLogNoOpLogHandler() })) throws {
        wakePipe = try Sys.pipe()
        self.logger = logger
        BackgroundThread.start("coffer-events") { [self] in readLoop() }
    }

    /// Takes `connection` (whose subscribe request was answered) as a subscriber: the hub
    /// owns it from now on and closes it. `delays`: it may ask for time before an
    /// announced lock.
    public func add(_ connection: consuming FileDescriptor, delays: Bool) {
        var size = Self.sendBuffer
        setsockopt(connection.rawValue, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        let subscriber = Connection(connection)
        let added = subscribers.withLock { state -> Bool in
            guard !state.stopped else { return false }
            state.byDescriptor[subscriber.fd] = Subscriber(connection: subscriber, delays: delays)
            return true
        }
        // Once stopped it is refused: closed as `subscriber` goes.
        if added { wake() }
    }

    /// Calls `listener` with every event published from now on, on the publishing thread
    /// and after the subscribers were sent it: it must not wait (hand the event on).
    public func listen(_ listener: @escaping @Sendable (MountEvent) -> Void) {
        subscribers.withLock { $0.listeners.append(listener) }
    }

    /// The number of subscribers now (for status and tests).
    public var count: Int { subscribers.withLock { $0.byDescriptor.values.filter { !$0.dropped }.count } }

    /// Sends `event` to every subscriber, without waiting for any, then hands it to the
    /// listeners. A `will-lock` also starts a new wait for `done` from those that delay a
    /// lock.
    public func publish(_ event: MountEvent) {
        let frame = Frames.encode(Event(event))
        let (targets, listeners) = subscribers.withLock { state -> ([Connection], [@Sendable (MountEvent) -> Void]) in
            if case .willLock = event.change {
                for fd in state.byDescriptor.keys { state.byDescriptor[fd]!.done = !state.byDescriptor[fd]!.delays }
            }
            return (state.byDescriptor.values.filter { !$0.dropped }.map(\.connection), state.listeners)
        }
        // `targets` and `full` keep these connections, and so their descriptors, open
        // until this function is done with them, whatever the reading thread lets go of.
        var full: [Connection] = []
        for connection in targets where !frame.withUnsafeBytes({ Sys.sendWithoutWaiting(connection.fd, $0) }) {
            full.append(connection)
        }
        listeners.forEach { $0(event) }
        guard !full.isEmpty else { return }
        subscribers.withLock { state in
            for connection in full where state.byDescriptor[connection.fd]?.connection === connection {
                state.byDescriptor[connection.fd]?.dropped = true
            }
        }
        // Its reader sees the end at once; the reading thread lets go of it.
        for connection in full { shutdown(connection.fd, Int32(SHUT_RDWR)) }
        logger.notice("""
            events: \(full.count) subscriber\(full.count == 1 ? "" : "s") dropped: \(full.count == 1 ? "it does" : "they do") not read what is sent
            """)
        wake()
    }

    /// Waits until every subscriber that delays a lock has said `done` since the last
    /// `will-lock`, or until `deadline` (seconds on the monotonic clock), whichever
    /// comes first; holds no lock while it waits.
    public func waitForDone(until deadline: Double) {
        while Sys.monotonicNow() < deadline {
            let pending = subscribers.withLock { $0.byDescriptor.values.contains { !$0.done && !$0.dropped } }
            if !pending { return }
            usleep(20_000)
        }
    }

    /// Ends every subscription (the daemon is ending): their programs read the end.
    public func stop() {
        subscribers.withLock { $0.stopped = true }
        wake()
    }

    private func wake() {
        var byte: UInt8 = 1
        _ = Glibc.write(wakePipe.write.rawValue, &byte, 1)
    }

    /// Polls the subscribers and the wake pipe: reads `done` frames, lets go of those that
    /// hung up or were dropped, and of every one once the hub stops.
    private func readLoop() {
        while !letGoOfDropped() {
            let connections = subscribers.withLock { $0.byDescriptor.values.filter { !$0.dropped }.map(\.connection) }
            var polled = [pollfd(fd: wakePipe.read.rawValue, events: Int16(POLLIN), revents: 0)]
                + connections.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
            guard (try? Sys.poll(&polled, timeout: -1)) != nil else { continue }
            if polled[0].revents != 0 {
                var drain = [UInt8](repeating: 0, count: 64)
                _ = drain.withUnsafeMutableBytes { try? Sys.read(wakePipe.read.rawValue, into: $0) }
            }
            for (connection, entry) in zip(connections, polled.dropFirst()) where entry.revents != 0 {
                receive(from: connection)
            }
        }
    }

    /// Reads what `connection` sent: `done` frames; the end of its stream drops it.
    private func receive(from connection: Connection) {
        var chunk = [UInt8](repeating: 0, count: 4096)
        let received = chunk.withUnsafeMutableBytes { (try? Sys.read(connection.fd, into: $0)) ?? 0 }
        subscribers.withLock { state in
            guard var subscriber = state.byDescriptor[connection.fd], subscriber.connection === connection else { return }
            if received <= 0 {
                subscriber.dropped = true
            } else {
                subscriber.inbox += chunk.prefix(received)
                while subscriber.inbox.count >= 4, let length = try? Frames.length(of: Array(subscriber.inbox.prefix(4))),
                      subscriber.inbox.count >= 4 + length {
                    let body = Array(subscriber.inbox[4..<4 + length])
                    subscriber.inbox.removeFirst(4 + length)
                    if let request = try? JSONDecoder().decode(Reply.self, from: Data(body)), request.op == "done" {
                        subscriber.done = true
                    }
                }
                if subscriber.inbox.count > ControlProtocol.maxFrame + 4 { subscriber.dropped = true }
            }
            state.byDescriptor[connection.fd] = subscriber
        }
    }

    /// Takes the dropped subscribers out of the table (every one once the hub stops) and
    /// says whether it stopped. Their descriptors close as the last reference goes:
    /// right after the lock is left, or after a send that still holds one.
    private func letGoOfDropped() -> Bool {
        let (_, stopped) = subscribers.withLock { state -> ([Connection], Bool) in
            let ending = state.stopped
            let gone = state.byDescriptor.values.filter { ending || $0.dropped }.map(\.connection)
            for connection in gone { state.byDescriptor[connection.fd] = nil }
            return (gone, ending)
        }
        return stopped
    }

    /// What a subscriber may send: `{"op": "done"}` after a will-lock.
    private struct Reply: Decodable { let op: String }
}

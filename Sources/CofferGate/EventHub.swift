// EventHub tells the programs subscribed on the control socket what happens to the mount
// (docs/CONTROL.md, "Events"): each event is one frame, sent without waiting — a
// subscriber that does not read is dropped once its socket's buffer is full, so none can
// hold up the daemon or a lock — and one thread reads what subscribers send back (`done`
// after a `will-lock`) and notices those that hang up.
import CofferSystem
import Foundation
import Glibc
import Logging
import Synchronization

/// Sendable: the subscribers live in a Mutex (a leaf lock, held for no system call that
/// can wait); only the reading thread closes a subscriber's descriptor.
public final class EventHub: Sendable {
    /// Version of the event objects (their fields), independent of the request protocol.
    public static let version = 1
    /// Bytes a subscriber's socket may hold unread before it is dropped: some hundreds of
    /// events, set small so that one that never reads costs the daemon little.
    static let sendBuffer: Int32 = 64 << 10

    private struct Subscriber {
        /// It asked for time before an announced lock (`delays`), and has said `done`
        /// since the last `will-lock`.
        let delays: Bool
        var done = true
        /// A frame arriving in parts.
        var inbox: [UInt8] = []
        /// Dropped by a send that did not fit: the reading thread closes it.
        var dropped = false
    }

    private struct Subscribers {
        var byDescriptor: [Int32: Subscriber] = [:]
        var stopped = false
        /// In-process listeners (the D-Bus object, systemd's status line), in order.
        var listeners: [@Sendable (Event) -> Void] = []
    }

    private let subscribers = Mutex(Subscribers())
    /// Wakes the reading thread when a subscriber joins or the hub stops.
    private let wakeRead: Int32, wakeWrite: Int32
    private let logger: Logger

    public init(logger: Logger = Logger(label: "coffer", factory: { _ in SwiftLogNoOpLogHandler() })) throws {
        let pipe = try Sys.pipe()
        wakeRead = pipe.read.release()
        wakeWrite = pipe.write.release()
        self.logger = logger
        BackgroundThread.start("coffer-events") { [self] in readLoop() }
    }

    /// Takes connection `fd` (whose subscribe request was answered) as a subscriber; the
    /// hub owns it from now on. `delays`: it may ask for time before an announced lock.
    public func add(_ fd: Int32, delays: Bool) {
        var size = Self.sendBuffer
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        let added = subscribers.withLock { state -> Bool in
            guard !state.stopped else { return false }
            state.byDescriptor[fd] = Subscriber(delays: delays)
            return true
        }
        guard added else {
            close(fd)
            return
        }
        wake()
    }

    /// Calls `listener` with every event published from now on, on the publishing thread
    /// and after the subscribers were sent it: it must not wait (hand the event on).
    public func listen(_ listener: @escaping @Sendable (Event) -> Void) {
        subscribers.withLock { $0.listeners.append(listener) }
    }

    /// The number of subscribers now (for status and tests).
    public var count: Int { subscribers.withLock { $0.byDescriptor.values.filter { !$0.dropped }.count } }

    /// Sends `event` to every subscriber, without waiting for any. A `will-lock` also
    /// starts a new wait for `done` from those that delay a lock.
    public func publish(_ event: Event) {
        let frame = Frames.encode(event)
        let (targets, listeners) = subscribers.withLock { state in
            if event.event == Event.Kind.willLock.rawValue {
                for fd in state.byDescriptor.keys { state.byDescriptor[fd]!.done = !state.byDescriptor[fd]!.delays }
            }
            return (state.byDescriptor.filter { !$0.value.dropped }.map(\.key), state.listeners)
        }
        var full: [Int32] = []
        for fd in targets where !frame.withUnsafeBytes({ Sys.sendWithoutWaiting(fd, $0) }) { full.append(fd) }
        listeners.forEach { $0(event) }
        guard !full.isEmpty else { return }
        subscribers.withLock { state in
            for fd in full { state.byDescriptor[fd]?.dropped = true }
        }
        // Its reader sees the end at once; the reading thread closes it.
        for fd in full { shutdown(fd, Int32(SHUT_RDWR)) }
        logger.notice("events: \(full.count) subscriber\(full.count == 1 ? "" : "s") dropped: \(full.count == 1 ? "it does" : "they do") not read what is sent")
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
        _ = Glibc.write(wakeWrite, &byte, 1)
    }

    /// Polls the subscribers and the wake pipe: reads `done` frames, closes those that
    /// hung up or were dropped, and every one once the hub stops.
    private func readLoop() {
        while true {
            let (fds, stopped) = subscribers.withLock { state in
                (state.byDescriptor.filter { !$0.value.dropped }.map(\.key), state.stopped)
            }
            closeDropped()
            if stopped {
                let all = subscribers.withLock { state -> [Int32] in
                    defer { state.byDescriptor = [:] }
                    return Array(state.byDescriptor.keys)
                }
                all.forEach { close($0) }
                return
            }
            var polled = [pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0)]
                + fds.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
            guard (try? Sys.poll(&polled, timeout: -1)) != nil else { continue }
            if polled[0].revents != 0 {
                var drain = [UInt8](repeating: 0, count: 64)
                _ = drain.withUnsafeMutableBytes { try? Sys.read(wakeRead, into: $0) }
            }
            for entry in polled.dropFirst() where entry.revents != 0 { receive(from: entry.fd) }
        }
    }

    /// Reads what subscriber `fd` sent: `done` frames; the end of its stream drops it.
    private func receive(from fd: Int32) {
        var chunk = [UInt8](repeating: 0, count: 4096)
        let received = chunk.withUnsafeMutableBytes { (try? Sys.read(fd, into: $0)) ?? 0 }
        subscribers.withLock { state in
            guard var subscriber = state.byDescriptor[fd] else { return }
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
            state.byDescriptor[fd] = subscriber
        }
    }

    /// Closes the subscribers marked dropped.
    private func closeDropped() {
        let gone = subscribers.withLock { state -> [Int32] in
            let gone = state.byDescriptor.filter { $0.value.dropped }.map(\.key)
            gone.forEach { state.byDescriptor[$0] = nil }
            return gone
        }
        gone.forEach { close($0) }
    }

    /// What a subscriber may send: `{"op": "done"}` after a will-lock.
    private struct Reply: Decodable { let op: String }
}

/// One event, as a subscriber receives it (docs/CONTROL.md, "Events").
public struct Event: Codable, Equatable, Sendable {
    public enum Kind: String, Sendable {
        case willLock = "will-lock", locked, unlocked, unmounting, conflict, damage
    }

    /// Why a lock comes: a command (`coffer lock`, D-Bus Lock), the idle timer, a wipe,
    /// the end of the daemon, the desktop's screen lock, or a suspend (`--lock-on`).
    public enum Reason: String, Sendable {
        case command, idle, wipe, unmount, screen, suspend
    }

    public var events = EventHub.version
    /// The kind (`Kind`'s raw value).
    public var event: String
    /// ISO 8601, when it happened (for will-lock: when it was announced).
    public var at: String
    /// will-lock, locked: `Reason`'s raw value.
    public var reason: String?
    /// will-lock: when the lock comes at the latest (ISO 8601), and how many seconds
    /// that is after `at`.
    public var deadline: String?
    public var graceSeconds: Double?
    /// conflict, damage: the plaintext path in the mount (the owner's own names).
    public var path: String?
    /// damage: what is wrong.
    public var what: String?

    public init(_ kind: Kind, reason: Reason? = nil, grace: Double? = nil, path: String? = nil, what: String? = nil) {
        let now = Date()
        let formatter = ISO8601DateFormatter()
        event = kind.rawValue
        at = formatter.string(from: now)
        self.reason = reason?.rawValue
        deadline = grace.map { formatter.string(from: now.addingTimeInterval($0)) }
        graceSeconds = grace
        self.path = path
        self.what = what
    }
}

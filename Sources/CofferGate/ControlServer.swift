// ControlServer listens on a mount's control socket: it serves only the mount's owner
// and root (SO_PEERCRED, checked before any work), on a fixed number of threads, reads
// one request per connection by a whole-request deadline, and answers every malformed,
// oversized, truncated or unknown request with an error instead of failing.
import CofferCrypto
import CofferSystem
import CofferVault
import Foundation
import Glibc
import Logging
import Synchronization

/// Sendable: every stored property is a `let` of a Sendable type. The queue of accepted
/// connections is owned by a Mutex, workers wait for it on a semaphore, and what only
/// the accepting thread uses (overflow connections, the refusal count) is that thread's
/// own `Acceptance`, passed along by its functions.
public final class ControlServer: Sendable {
    public let path: String
    private let owner: uid_t
    private let gate: Gate
    private let logger: Logger
    /// The listening socket (-1 before start and after stop): set by start and stop,
    /// read by the accepting thread.
    private let listener = Atomic<Int32>(-1)

    public init(path: String, owner: uid_t, gate: Gate,
                logger: Logger = Logger(label: "coffer", factory: { _ in SwiftLogNoOpLogHandler() })) {
        self.path = path
        self.owner = owner
        self.gate = gate
        self.logger = logger
    }

    public enum StartError: Error, CustomStringConvertible {
        case inUse(String)

        public var description: String {
            switch self {
            case .inUse(let path): return "another coffer daemon is listening on \(path)"
            }
        }
    }

    /// Binds the socket (replacing a stale one, never a live one) and starts serving:
    /// `ControlProtocol.maxConnections` threads for the owner's connections, started
    /// now, so that serving never depends on creating a thread, and one accepting.
    public func start() throws {
        var st = stat()
        if lstat(path, &st) == 0 {
            if (try? UnixSocket.connect(to: path)) != nil { throw StartError.inUse(path) }
            guard st.st_mode & S_IFMT == S_IFSOCK else { throw Errno(EEXIST, "\(path) exists and is not a socket") }
            unlink(path)  // stale: its daemon is gone
        }
        // The listener's number lives in an atomic (the accepting thread reads it, stop
        // closes it), so ownership passes from the FileDescriptor to `stop`.
        listener.store(try UnixSocket.listen(at: path).release(), ordering: .releasing)
        for i in 0..<ControlProtocol.maxConnections {
            BackgroundThread.start("coffer-ctl-\(i)") { [self] in serveQueued() }
        }
        BackgroundThread.start("coffer-control") { [self] in acceptLoop() }
    }

    /// Stops accepting, drops queued connections and removes the socket file. A request
    /// already being served finishes; the gate refuses unlocks once it is shut down.
    public func stop() {
        let queued: [Int32] = queue.withLock { queue in
            queue.stopped = true
            defer { queue.pending = [] }
            return queue.pending
        }
        // Every worker wakes once to see `stopped`.
        for _ in 0..<ControlProtocol.maxConnections { ready.signal() }
        queued.forEach { close($0) }
        let fd = listener.load(ordering: .acquiring)
        if fd >= 0 {
            shutdown(fd, Int32(SHUT_RDWR))
            close(fd)
            listener.store(-1, ordering: .releasing)
        }
        unlink(path)
    }

    // MARK: Accepting

    /// The connections handed from the accepting thread to the workers.
    private struct Queue {
        /// Accepted connections of the owner or root, waiting for a worker.
        var pending: [Int32] = []
        /// Workers waiting for a connection, or woken and about to take one.
        var idle = 0
        var stopped = false
    }
    private let queue = Mutex(Queue())
    /// Signalled once per connection queued, and once per worker at stop.
    private let ready = DispatchSemaphore(value: 0)

    /// A connection of the owner accepted while every worker was busy: the accepting
    /// thread collects its request without blocking, and answers a lock or a status
    /// itself.
    private struct Overflow {
        let fd: Int32
        let peer: UnixSocket.Credentials
        let deadline: Deadline
        var bytes: [UInt8] = []
    }

    /// What only the accepting thread uses.
    private struct Acceptance {
        var overflow: [Overflow] = []
        /// Refusals so far, to log a flood by powers of two only.
        var refusals = 0
    }

    /// Waits (poll) for new connections and for the requests of overflow connections.
    private func acceptLoop() {
        var acceptance = Acceptance()
        while true {
            let overflow = acceptance.overflow
            var fds = [pollfd(fd: listener.load(ordering: .acquiring), events: Int16(POLLIN), revents: 0)]
                + overflow.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
            let timeout = overflow.map(\.deadline.remainingMilliseconds).min() ?? -1
            guard (try? Sys.poll(&fds, timeout: timeout)) != nil else { return }
            for i in overflow.indices.reversed() {
                if fds[i + 1].revents != 0 {
                    advance(i, &acceptance)
                } else if overflow[i].deadline.remainingMilliseconds == 0 {
                    reply(overflow[i].fd, .failure(ControlError.timeout, "the request did not arrive in time"))
                    close(acceptance.overflow.remove(at: i).fd)
                }
            }
            if fds[0].revents != 0 && !acceptOne(&acceptance) { return }
        }
    }

    /// Accepts one connection; false once the listener is closed (stop()).
    private func acceptOne(_ acceptance: inout Acceptance) -> Bool {
        let fd: Int32
        do {
            fd = try Sys.accept(listener.load(ordering: .acquiring))
        } catch let error as Errno {
            switch error.code {
            case ECONNABORTED, EAGAIN: return true
            case EMFILE, ENFILE, ENOBUFS, ENOMEM:
                // Out of descriptors or memory for a moment: the socket must stay
                // usable (it is how the owner locks the vault), so wait and retry.
                usleep(100_000)
                return true
            default: return false
            }
        } catch {
            return false
        }
        // The peer is checked before anything else: another user's connection costs
        // no thread and no wait, so a flood of them cannot hold up the owner.
        guard let peer = UnixSocket.peer(fd), peer.uid == owner || peer.uid == 0 else {
            refuse(fd, uid: UnixSocket.peer(fd)?.uid, &acceptance)
            return true
        }
        let queued = queue.withLock { queue in
            let queued = !queue.stopped && queue.idle > queue.pending.count
            if queued { queue.pending.append(fd) }
            return queued
        }
        if queued {
            ready.signal()
            return true
        }
        // Every worker is busy: collect the request here, without blocking. The oldest
        // overflow connection makes room for the newest, so a flood of silent
        // connections cannot keep out the owner's lock.
        if acceptance.overflow.count >= ControlProtocol.maxOverflow {
            let oldest = acceptance.overflow.removeFirst()
            reply(oldest.fd, .failure(ControlError.busy, "the daemon is busy; try again"))
            close(oldest.fd)
        }
        acceptance.overflow.append(Overflow(fd: fd, peer: peer, deadline: Deadline(seconds: ControlProtocol.overflowDeadline)))
        advance(acceptance.overflow.count - 1, &acceptance)
        return true
    }

    /// Reads what has arrived on overflow connection `i`; once its request is complete,
    /// answers a status or a lock, and anything else with `busy`.
    private func advance(_ i: Int, _ acceptance: inout Acceptance) {
        var chunk = [UInt8](repeating: 0, count: 4096)
        let received: Int?
        do {
            received = try chunk.withUnsafeMutableBytes { try Sys.receiveAvailable(acceptance.overflow[i].fd, into: $0) }
        } catch {
            received = 0
        }
        guard let n = received else { return }  // nothing there yet
        guard n > 0 else { close(acceptance.overflow.remove(at: i).fd); return }
        acceptance.overflow[i].bytes += chunk.prefix(n)
        let connection = acceptance.overflow[i]
        guard connection.bytes.count >= 4 else { return }
        let length: Int
        do {
            length = try Frames.length(of: Array(connection.bytes.prefix(4)))
        } catch {
            reply(connection.fd, .failure(ControlError.tooLarge, "the request exceeds the limit of \(ControlProtocol.maxFrame) bytes"))
            close(acceptance.overflow.remove(at: i).fd)
            return
        }
        guard connection.bytes.count >= 4 + length else { return }
        acceptance.overflow.remove(at: i)
        let body = Array(connection.bytes[4..<4 + length])
        // Only what answers at once is answered here: an unlock (Argon2id) or a lock that
        // waits out a grace would hold up the accepting thread.
        if case .success(let request) = ControlRequest.decode(body),
           request.op == ControlRequest.Operation.unlock.rawValue || request.grace == true {
            reply(connection.fd, .failure(ControlError.busy, "the daemon is busy; try again"))
        } else {
            answer(connection.fd, body: body, peer: connection.peer, deadline: connection.deadline)
        }
        close(connection.fd)
    }

    private func serveQueued() {
        while true {
            queue.withLock { $0.idle += 1 }
            ready.wait()
            // Each signal before stop stands for one queued connection.
            let taken: Int32? = queue.withLock { queue in
                queue.idle -= 1
                return queue.stopped ? nil : queue.pending.removeFirst()
            }
            guard let fd = taken else { return }
            if let peer = UnixSocket.peer(fd) {
                serve(fd, peer: peer, deadline: Deadline(seconds: ControlProtocol.requestDeadline))
            }
            close(fd)
        }
    }

    /// Answers another user's connection at once, without waiting for it: whatever of
    /// the request has arrived is read (so that the peer sees the answer rather than a
    /// reset connection), then the refusal is sent and the connection closed.
    private func refuse(_ fd: Int32, uid: uid_t?, _ acceptance: inout Acceptance) {
        var scratch = [UInt8](repeating: 0, count: 4096)
        // What has arrived, 4 KiB at a time, up to 17 reads: stops at the first that
        // finds nothing (the flood path makes no read it does not need).
        let drain = {
            for _ in 0..<17 {
                guard scratch.withUnsafeMutableBytes({ ((try? Sys.receiveAvailable(fd, into: $0)) ?? 0) > 0 }) else { return }
            }
        }
        drain()
        UnixSocket.setTimeout(fd, seconds: 1)
        reply(fd, .failure(ControlError.permissionDenied, "only the mount's owner may use its control socket"))
        shutdown(fd, Int32(SHUT_WR))
        drain()
        close(fd)
        acceptance.refusals += 1
        let refusals = acceptance.refusals
        if refusals.nonzeroBitCount == 1 || refusals < 10 {
            logger.warning("control socket: refused a connection from uid \(uid.map(String.init) ?? "?") (\(refusals) refused so far)")
        }
    }

    // MARK: Serving one request

    private func serve(_ fd: Int32, peer: UnixSocket.Credentials, deadline: Deadline) {
        UnixSocket.setTimeout(fd, seconds: Int(ControlProtocol.requestDeadline))
        do {
            answer(fd, body: try Frames.readFrame(fd, by: deadline), peer: peer, deadline: deadline)
        } catch Frames.ReadError.tooLarge(let length) {
            reply(fd, .failure(ControlError.tooLarge, "a request of \(length) bytes exceeds the limit of \(ControlProtocol.maxFrame)"))
        } catch {
            reply(fd, .failure(ControlError.timeout, "the request was truncated or did not arrive in time"))
        }
    }

    /// Answers the request frame `body`; an unlock's secret is read from `fd` by `deadline`.
    private func answer(_ fd: Int32, body: [UInt8], peer: UnixSocket.Credentials, deadline: Deadline) {
        let request: ControlRequest
        switch ControlRequest.decode(body) {
        case .success(let decoded): request = decoded
        case .failure(let refusal): return reply(fd, refusal)
        }
        switch ControlRequest.Operation(rawValue: request.op) {
        case .status:
            reply(fd, .success("ok", status: gate.status()))
        case .lock:
            let reason: Event.Reason = request.reason == Event.Reason.wipe.rawValue ? .wipe : .command
            if request.grace == true && reason == .command {
                gate.lockAnnounced(reason: reason, detail: "requested by uid \(peer.uid)", grace: gate.lockGrace)
            } else {
                gate.lock(reason: reason, detail: "requested by uid \(peer.uid)", all: request.all == true)
            }
            reply(fd, .success("locked", status: gate.status()))
        case .subscribe:
            guard let events = gate.events else {
                return reply(fd, .failure(ControlError.unknownOperation, "this daemon sends no events"))
            }
            reply(fd, .success("subscribed", status: gate.status()))
            // The hub owns a descriptor of its own of the connection (this one is closed
            // when the request is done), close-on-exec as every descriptor of the daemon.
            let kept = fcntl(fd, F_DUPFD_CLOEXEC, 0)
            if kept >= 0 { events.add(FileDescriptor(owning: kept), delays: request.delays == true) }
        case .unlock:
            guard let kind = request.secret, let length = request.secretLength,
                  length > 0, length <= ControlProtocol.maxSecret else {
                return reply(fd, .failure(ControlError.malformed,
                                          "unlock needs a secret kind and a length of 1…\(ControlProtocol.maxSecret) bytes"))
            }
            if kind == .slotKey, !(request.slot.map(SlotFile.isID) ?? false) {
                return reply(fd, .failure(ControlError.malformed, "unlock with a slot key needs the slot's id (32 lowercase hex digits)"))
            }
            if let slot = request.slot, kind == .recoveryKey || !SlotFile.isID(slot) {
                return reply(fd, .failure(ControlError.malformed,
                                          "a slot is named by its id (32 lowercase hex digits), with a passphrase or a slot key"))
            }
            guard let secret = Frames.readSecret(fd, length: length, by: deadline) else {
                return reply(fd, .failure(ControlError.timeout, "the secret was truncated or did not arrive in time"))
            }
            reply(fd, gate.unlock(secret: secret, kind: kind, slot: request.slot, peer: peer.uid))
            secret.wipe()
        case nil:
            reply(fd, .failure(ControlError.unknownOperation, "unknown operation \"\(request.op.prefix(40))\""))
        }
    }

    private func reply(_ fd: Int32, _ response: ControlResponse) {
        _ = Frames.write(fd, Frames.encode(response))
    }
}

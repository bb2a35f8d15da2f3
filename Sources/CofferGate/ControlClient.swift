// ControlClient sends one request to a mount's control socket and returns the answer.
import CofferCrypto
import CofferSystem
import Foundation
import Glibc

public enum ControlClient {
    public enum Failure: Error, CustomStringConvertible {
        case noDaemon(String)
        case badAnswer
        case timedOut(Double)
        /// The daemon answered with this failure.
        case refused(ControlResponse)

        public var description: String {
            switch self {
            case .noDaemon(let path): return "no coffer daemon answers on \(path)"
            case .badAnswer: return "the daemon's answer was malformed"
            case .timedOut(let seconds): return String(format: "the daemon did not answer within %.0f s", seconds)
            case .refused(let response): return response.message ?? response.error ?? "refused"
            }
        }
    }

    /// Seconds a client waits for the answer to `op`: an unlock runs Argon2id, a lock
    /// writes back dirty pages first; a status answers at once.
    public static func timeout(for op: ControlRequest.Operation) -> Double {
        switch op {
        case .status, .subscribe: return 10
        case .lock, .unlock: return 120
        }
    }

    /// Subscribes to the events of the daemon at `path` (`delays`: this subscriber may
    /// delay an announced lock until it sends `{"op": "done"}`, docs/CONTROL.md): the
    /// connection, once the daemon has answered (`Failure.refused` if it refused); read
    /// each event with `nextEvent`.
    public static func subscribe(to path: String, delays: Bool = false) throws -> FileDescriptor {
        let socket = try connect(to: path)
        let response = try exchange(ControlRequest(op: .subscribe, delays: delays), secret: nil, on: socket.rawValue,
                                    seconds: timeout(for: .subscribe), path: path)
        guard response.ok else { throw Failure.refused(response) }
        return socket
    }

    /// The next event on a subscription, waiting as long as it takes; nil once the daemon
    /// ends it (the mount ends).
    public static func nextEvent(_ subscription: borrowing FileDescriptor) -> Event? {
        guard let body = try? Frames.readFrame(subscription.rawValue, by: Deadline(seconds: Double(Int32.max))) else { return nil }
        return try? JSONDecoder().decode(Event.self, from: Data(body))
    }

    /// Sends `request` (and `secret`, for unlock) to the socket at `path` and waits for
    /// the answer no longer than `timeout` seconds.
    public static func send(_ request: ControlRequest, secret: SecureBytes? = nil, to path: String,
                            timeout: Double? = nil) throws -> ControlResponse {
        let seconds = timeout ?? ControlRequest.Operation(rawValue: request.op).map(Self.timeout) ?? 10
        let socket = try connect(to: path)
        UnixSocket.setTimeout(socket.rawValue, seconds: Int(seconds.rounded(.up)))
        return try exchange(request, secret: secret, on: socket.rawValue, seconds: seconds, path: path)
    }

    private static func connect(to path: String) throws -> FileDescriptor {
        do {
            return try UnixSocket.connect(to: path)
        } catch {
            throw Failure.noDaemon(path)
        }
    }

    /// Sends `request` (and `secret`) on connection `fd` and reads the answer within
    /// `seconds`.
    private static func exchange(_ request: ControlRequest, secret: SecureBytes?, on fd: Int32, seconds: Double,
                                 path: String) throws -> ControlResponse {
        let deadline = Deadline(seconds: seconds)
        // A daemon that refuses (another user) answers without reading: if sending
        // fails, its answer may still be there to read.
        var sent = Frames.write(fd, Frames.encode(request))
        if sent, let secret {
            sent = (try? secret.withUnsafeBytes({ try Sys.send(fd, $0) })) != nil
        }
        let body: [UInt8]
        do {
            body = try Frames.readFrame(fd, by: deadline)
        } catch {
            if !sent { throw Failure.noDaemon(path) }
            if deadline.remainingMilliseconds == 0 { throw Failure.timedOut(seconds) }
            throw Failure.badAnswer
        }
        guard let response = try? JSONDecoder().decode(ControlResponse.self, from: Data(body)) else {
            throw Failure.badAnswer
        }
        return response
    }
}

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

        public var description: String {
            switch self {
            case .noDaemon(let path): return "no coffer daemon answers on \(path)"
            case .badAnswer: return "the daemon's answer was malformed"
            case .timedOut(let seconds): return String(format: "the daemon did not answer within %.0f s", seconds)
            }
        }
    }

    /// Seconds a client waits for the answer to `op`: an unlock runs Argon2id, a lock
    /// writes back dirty pages first; a status answers at once.
    public static func timeout(for op: ControlRequest.Operation) -> Double {
        switch op {
        case .status: return 10
        case .lock, .unlock: return 120
        }
    }

    /// Sends `request` (and `secret`, for unlock) to the socket at `path` and waits for
    /// the answer no longer than `timeout` seconds.
    public static func send(_ request: ControlRequest, secret: SecureBytes? = nil, to path: String,
                            timeout: Double? = nil) throws -> ControlResponse {
        let seconds = timeout ?? ControlRequest.Operation(rawValue: request.op).map(Self.timeout) ?? 10
        let deadline = Deadline(seconds: seconds)
        let socket: FileDescriptor
        do {
            socket = try UnixSocket.connect(to: path)
        } catch {
            throw Failure.noDaemon(path)
        }
        let fd = socket.rawValue
        UnixSocket.setTimeout(fd, seconds: Int(seconds.rounded(.up)))
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

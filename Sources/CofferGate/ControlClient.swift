// ControlClient sends one request to a mount's control socket and returns the answer.
import CofferCrypto
import CofferVault
import Foundation
import Glibc

public enum ControlClient {
    public enum Failure: Error, CustomStringConvertible {
        case noDaemon(String)
        case badAnswer

        public var description: String {
            switch self {
            case .noDaemon(let path): return "no coffer daemon answers on \(path)"
            case .badAnswer: return "the daemon's answer was malformed"
            }
        }
    }

    /// Sends `request` (and `secret`, for unlock) to the socket at `path`.
    public static func send(_ request: ControlRequest, secret: SecureBytes? = nil, to path: String) throws -> ControlResponse {
        let fd: Int32
        do {
            fd = try UnixSocket.connect(to: path)
        } catch {
            throw Failure.noDaemon(path)
        }
        defer { close(fd) }
        guard Frames.write(fd, Frames.encode(request)) else { throw Failure.noDaemon(path) }
        if let secret {
            guard (try? secret.withUnsafeBytes({ try Sys.send(fd, $0) })) != nil else { throw Failure.noDaemon(path) }
        }
        guard let body = try? Frames.readFrame(fd),
              let response = try? JSONDecoder().decode(ControlResponse.self, from: Data(body)) else {
            throw Failure.badAnswer
        }
        return response
    }
}

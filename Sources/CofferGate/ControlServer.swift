// ControlServer listens on a mount's control socket: it serves only the mount's owner
// and root (SO_PEERCRED), reads one request per connection with a size limit and a
// timeout, and answers every malformed, oversized, truncated or unknown request with an
// error instead of failing.
import CofferCrypto
import CofferVault
import Foundation
import Glibc

public final class ControlServer: @unchecked Sendable {
    public let path: String
    private let owner: uid_t
    private let gate: Gate
    private let log: @Sendable (String) -> Void
    private var listener: Int32 = -1

    public init(path: String, owner: uid_t, gate: Gate, log: @escaping @Sendable (String) -> Void) {
        self.path = path
        self.owner = owner
        self.gate = gate
        self.log = log
    }

    public enum StartError: Error, CustomStringConvertible {
        case inUse(String)

        public var description: String {
            switch self {
            case .inUse(let path): return "another coffer daemon is listening on \(path)"
            }
        }
    }

    /// Binds the socket (replacing a stale one, never a live one) and starts serving.
    public func start() throws {
        var st = stat()
        if lstat(path, &st) == 0 {
            if let probe = try? UnixSocket.connect(to: path) {
                close(probe)
                throw StartError.inUse(path)
            }
            guard st.st_mode & S_IFMT == S_IFSOCK else { throw Errno(EEXIST, "\(path) exists and is not a socket") }
            unlink(path)  // stale: its daemon is gone
        }
        listener = try UnixSocket.listen(at: path)
        let thread = Thread { [self] in acceptLoop() }
        thread.name = "coffer-control"
        thread.start()
    }

    /// Stops accepting and removes the socket file.
    public func stop() {
        if listener >= 0 {
            shutdown(listener, Int32(SHUT_RDWR))
            close(listener)
            listener = -1
        }
        unlink(path)
    }

    private func acceptLoop() {
        while true {
            let fd = accept(listener, nil, nil)
            if fd < 0 {
                switch errno {
                case EINTR, ECONNABORTED: continue
                case EMFILE, ENFILE, ENOBUFS, ENOMEM:
                    // Out of descriptors or memory for a moment: the socket must stay
                    // usable (it is how the owner locks the vault), so wait and retry.
                    usleep(100_000)
                    continue
                default: return  // the listener was closed by stop()
                }
            }
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            // One thread per connection: a slow client cannot hold up the others.
            let thread = Thread { [self] in
                serve(fd)
                close(fd)
            }
            thread.start()
        }
    }

    private func serve(_ fd: Int32) {
        guard let peer = UnixSocket.peer(fd), peer.uid == owner || peer.uid == 0 else {
            let uid = UnixSocket.peer(fd).map { String($0.uid) } ?? "?"
            log("control socket: refused a connection from uid \(uid)")
            reply(fd, .failure(ControlError.permissionDenied, "only the mount's owner may use its control socket"))
            return
        }
        UnixSocket.setTimeout(fd, seconds: ControlProtocol.readTimeout)
        let request: ControlRequest
        do {
            let body = try Frames.readFrame(fd)
            struct Versioned: Decodable { var version: Int }
            guard let version = try? JSONDecoder().decode(Versioned.self, from: Data(body)) else {
                return reply(fd, .failure(ControlError.malformed, "the request is not a JSON object with a version"))
            }
            guard version.version == ControlProtocol.version else {
                return reply(fd, .failure(ControlError.unsupportedVersion,
                                          "protocol version \(version.version) is not supported (this daemon speaks \(ControlProtocol.version))"))
            }
            guard let decoded = try? JSONDecoder().decode(ControlRequest.self, from: Data(body)) else {
                return reply(fd, .failure(ControlError.malformed, "the request does not have the fields of protocol version 1"))
            }
            request = decoded
        } catch Frames.ReadError.tooLarge(let length) {
            return reply(fd, .failure(ControlError.tooLarge, "a request of \(length) bytes exceeds the limit of \(ControlProtocol.maxFrame)"))
        } catch {
            return reply(fd, .failure(ControlError.timeout, "the request was truncated or did not arrive in time"))
        }

        switch ControlRequest.Operation(rawValue: request.op) {
        case .status:
            reply(fd, .success("ok", status: gate.status()))
        case .lock:
            gate.lock(reason: "requested by uid \(peer.uid)")
            reply(fd, .success("locked", status: gate.status()))
        case .unlock:
            guard let kind = request.secret, let length = request.secretLength,
                  length > 0, length <= ControlProtocol.maxSecret else {
                return reply(fd, .failure(ControlError.malformed, "unlock needs a secret kind and a length of 1…\(ControlProtocol.maxSecret) bytes"))
            }
            guard let secret = Frames.readSecret(fd, length: length) else {
                return reply(fd, .failure(ControlError.timeout, "the secret was truncated or did not arrive in time"))
            }
            reply(fd, gate.unlock(secret: secret, kind: kind, peer: peer.uid))
            secret.wipe()
        case nil:
            reply(fd, .failure(ControlError.unknownOperation, "unknown operation \"\(request.op.prefix(40))\""))
        }
    }

    private func reply(_ fd: Int32, _ response: ControlResponse) {
        _ = Frames.write(fd, Frames.encode(response))
    }
}

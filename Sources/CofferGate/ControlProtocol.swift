// ControlProtocol is the wire format of the control socket (docs/CONTROL.md): frames of
// a 4-byte big-endian length and a JSON object; an unlock request is followed by the
// raw secret bytes, so the secret never passes through a JSON string.
import CofferCrypto
import CofferVault
import Foundation
import Glibc

public enum ControlProtocol {
    /// Protocol version spoken by this build.
    public static let version = 1
    /// Largest JSON frame accepted, in bytes.
    public static let maxFrame = 64 << 10
    /// Largest secret accepted after an unlock request, in bytes.
    public static let maxSecret = 4096
    /// Seconds a peer may take to send its request before the server gives up.
    public static let readTimeout = 5
}

/// What a client asks.
public struct ControlRequest: Codable, Equatable {
    public enum Operation: String, Codable {
        case status, unlock, lock
    }

    /// Which secret follows an unlock request.
    public enum SecretKind: String, Codable {
        case passphrase, recoveryKey
    }

    public var version: Int
    public var op: String
    public var secret: SecretKind?
    /// Number of raw secret bytes that follow this frame (unlock only).
    public var secretLength: Int?

    public init(op: Operation, secret: SecretKind? = nil, secretLength: Int? = nil) {
        version = ControlProtocol.version
        self.op = op.rawValue
        self.secret = secret
        self.secretLength = secretLength
    }
}

/// The state a `status` request reports.
public struct GateStatus: Codable, Equatable {
    public var state: String            // "locked" or "unlocked"
    public var since: String            // ISO 8601 time of the last change of state
    public var idleSeconds: Int64
    public var idleLockSeconds: Int64?  // nil: no idle lock
    public var failedAttempts: Int
    public var retryAfter: Double       // seconds before another unlock attempt is accepted
    public var mountpoint: String
    public var vault: String
    public var formatVersion: Int
    public var socket: String
    public var pid: Int32
    public var wiped: Bool
}

/// What the server answers. `error` is a stable code; `message` is for people.
public struct ControlResponse: Codable, Equatable {
    public var version: Int = ControlProtocol.version
    public var ok: Bool
    public var error: String?
    public var message: String?
    public var retryAfter: Double?
    public var status: GateStatus?

    public static func success(_ message: String, status: GateStatus? = nil) -> ControlResponse {
        ControlResponse(ok: true, message: message, status: status)
    }

    public static func failure(_ error: String, _ message: String, retryAfter: Double? = nil) -> ControlResponse {
        ControlResponse(ok: false, error: error, message: message, retryAfter: retryAfter)
    }
}

/// Error codes of failed responses.
public enum ControlError {
    public static let malformed = "malformed-request"
    public static let tooLarge = "request-too-large"
    public static let unsupportedVersion = "unsupported-version"
    public static let unknownOperation = "unknown-operation"
    public static let timeout = "timeout"
    public static let permissionDenied = "permission-denied"
    public static let wrongPassphrase = "wrong-passphrase"
    public static let wrongRecoveryKey = "wrong-recovery-key"
    public static let throttled = "retry-later"
    public static let wiped = "vault-wiped"
    public static let failed = "failed"
}

/// Reading and writing frames on a connected socket.
enum Frames {
    static func encode<T: Encodable>(_ value: T) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let body = Array((try? encoder.encode(value)) ?? Data("{}".utf8))
        return withUnsafeBytes(of: UInt32(body.count).bigEndian, Array.init) + body
    }

    static func readExactly(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer) -> Bool {
        Sys.receive(fd, into: buffer)
    }

    enum ReadError: Error { case closed, tooLarge(Int) }

    /// Reads one frame's JSON bytes (at most `ControlProtocol.maxFrame`).
    static func readFrame(_ fd: Int32) throws -> [UInt8] {
        var header = [UInt8](repeating: 0, count: 4)
        guard header.withUnsafeMutableBytes({ readExactly(fd, $0) }) else { throw ReadError.closed }
        let length = Int(UInt32(header[0]) << 24 | UInt32(header[1]) << 16 | UInt32(header[2]) << 8 | UInt32(header[3]))
        guard length <= ControlProtocol.maxFrame else { throw ReadError.tooLarge(length) }
        var body = [UInt8](repeating: 0, count: length)
        guard body.withUnsafeMutableBytes({ readExactly(fd, $0) }) else { throw ReadError.closed }
        return body
    }

    static func write(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        (try? bytes.withUnsafeBytes { try Sys.send(fd, $0) }) != nil
    }

    /// Reads `length` secret bytes straight into secure memory.
    static func readSecret(_ fd: Int32, length: Int) -> SecureBytes? {
        let secret = SecureBytes(count: length)
        return secret.withUnsafeMutableBytes { readExactly(fd, $0) } ? secret : nil
    }
}

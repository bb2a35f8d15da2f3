// ControlProtocol is the wire format of the control socket (docs/CONTROL.md): frames of
// a 4-byte big-endian length and a JSON object; an unlock request is followed by the
// raw secret bytes, so the secret never passes through a JSON string.
import CofferCrypto
import CofferSystem
import Foundation
import Glibc

public enum ControlProtocol {
    /// Protocol version spoken by this build.
    public static let version = 1
    /// Largest JSON frame accepted, in bytes.
    public static let maxFrame = 64 << 10
    /// Largest secret accepted after an unlock request, in bytes.
    public static let maxSecret = 4096
    /// Seconds a peer may take to send its whole request (frame and secret) before the
    /// server answers `timeout` and closes: a deadline for the request, not per read.
    public static let requestDeadline = 5.0
    /// Connections of the owner (or root) served at once, each by a thread started with
    /// the server; for a connection beyond them the accepting thread collects the
    /// request without blocking and answers a lock or status itself, so that a `lock`
    /// always gets through.
    public static let maxConnections = 8
    /// Seconds the accepting thread waits for the request of a connection beyond
    /// `maxConnections`, and how many such connections it waits on at once (a newer
    /// one replaces the oldest).
    public static let overflowDeadline = 1.0
    public static let maxOverflow = 64
}

/// A point on the monotonic clock after which a read gives up.
public struct Deadline {
    let end: Double

    public init(seconds: Double) { end = Sys.monotonicNow() + seconds }

    /// Milliseconds left (0 once passed), for poll(2).
    var remainingMilliseconds: Int32 { Int32(max(0, min((end - Sys.monotonicNow()) * 1000, Double(Int32.max))).rounded(.up)) }
}

/// What a client asks.
public struct ControlRequest: Codable, Equatable {
    public enum Operation: String, Codable {
        case status, unlock, lock, subscribe
    }

    /// Which secret follows an unlock request: a passphrase, the recovery key, or the
    /// 32-byte slot key of the keyed slot (tpm2, keyring) that `slot` names.
    public enum SecretKind: String, Codable {
        case passphrase, recoveryKey, slotKey
    }

    public var version: Int
    public var op: String
    public var secret: SecretKind?
    /// Number of raw secret bytes that follow this frame (unlock only).
    public var secretLength: Int?
    /// unlock: the id of the key slot the secret opens — required with a slotKey; with a
    /// passphrase, that passphrase slot file alone is tried, whatever its costs.
    public var slot: String?
    /// lock: "command" (the default) or "wipe", for the events' `reason`.
    public var reason: String?
    /// lock: announce it and wait the mount's grace (`--lock-grace`) first.
    public var grace: Bool?
    /// lock: the after-first-unlock class's keys go too (format 8; `coffer lock --all`).
    public var all: Bool?
    /// subscribe: this subscriber may delay an announced lock until it says `done`.
    public var delays: Bool?

    public init(op: Operation, secret: SecretKind? = nil, secretLength: Int? = nil, slot: String? = nil,
                reason: String? = nil, grace: Bool? = nil, delays: Bool? = nil, all: Bool? = nil) {
        version = ControlProtocol.version
        self.all = all
        self.op = op.rawValue
        self.secret = secret
        self.secretLength = secretLength
        self.slot = slot
        self.reason = reason
        self.grace = grace
        self.delays = delays
    }
}

extension ControlRequest {
    /// Decodes a request frame's JSON, or the failure to answer: not JSON, no version,
    /// another version, or fields of the wrong type.
    static func decode(_ body: [UInt8]) -> Result<ControlRequest, ControlResponse> {
        struct Versioned: Decodable { var version: Int }
        guard let version = try? JSONDecoder().decode(Versioned.self, from: Data(body)) else {
            return .failure(.failure(ControlError.malformed, "the request is not a JSON object with a version"))
        }
        guard version.version == ControlProtocol.version else {
            return .failure(.failure(ControlError.unsupportedVersion,
                                     "protocol version \(version.version) is not supported (this daemon speaks \(ControlProtocol.version))"))
        }
        guard let decoded = try? JSONDecoder().decode(ControlRequest.self, from: Data(body)) else {
            return .failure(.failure(ControlError.malformed, "the request does not have the fields of protocol version 1"))
        }
        return .success(decoded)
    }
}

extension ControlResponse: Error {}

/// The state a `status` request reports.
public struct GateStatus: Codable, Equatable, Sendable {
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
    /// How requests reach the daemon: "io_uring" or "/dev/fuse" (nil from a daemon
    /// older than the field).
    public var transport: String?
    /// Programs subscribed to the daemon's events now (nil from a daemon without events).
    public var subscribers: Int?
    /// Seconds an announced lock waits (`--lock-grace`; nil from an older daemon).
    public var lockGraceSeconds: Double?
    /// The protection classes the vault's format has ("complete", and from format 6
    /// "unless-open"; nil from an older daemon).
    public var protectionClasses: [String]?
    /// Files a lock left their keys, still open (unless-open; nil from an older daemon).
    public var filesKeptOpen: Int?
    /// The mount's well-known name on the owner's session bus (nil: not on D-Bus).
    public var busName: String?
    /// Why the mount is not on the session bus, where it could have been (its name held
    /// by another program, a bus that refused it); nil otherwise.
    public var busProblem: String?
    /// What of the desktop session locks the vault (`--lock-on`: "screen", "suspend").
    public var lockOn: [String]?
    /// Locked, the classes whose keys the lock kept ("after-first-unlock", format 8;
    /// empty after `lock --all`; nil while unlocked or from an older daemon).
    public var keptClasses: [String]?
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

/// Messages of successful responses that a client tells apart (both sides use these).
public enum ControlMessage {
    /// An unlock of a view that was unlocked already: nothing was done.
    public static let alreadyUnlocked = "already unlocked"
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
    public static let wrongSlotKey = "wrong-slot-key"
    public static let throttled = "retry-later"
    public static let wiped = "vault-wiped"
    public static let configDamaged = "config-damaged"
    public static let busy = "busy"
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

    /// Fills `buffer` from the stream, waiting (poll) no longer than `deadline` in all;
    /// false if the stream ends or the deadline passes first.
    static func readExactly(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer, by deadline: Deadline) -> Bool {
        var done = 0
        while done < buffer.count {
            var ready = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0)]
            guard let rc = try? Sys.poll(&ready, timeout: deadline.remainingMilliseconds), rc > 0 else { return false }
            let n: Int
            do {
                n = try Sys.read(fd, into: UnsafeMutableRawBufferPointer(rebasing: buffer[done...]))
            } catch let error as Errno where error.code == EAGAIN {
                continue
            } catch {
                return false
            }
            guard n > 0 else { return false }
            done += n
        }
        return true
    }

    enum ReadError: Error { case closed, tooLarge(Int) }

    /// Reads one frame's JSON bytes (at most `ControlProtocol.maxFrame`) by `deadline`.
    static func readFrame(_ fd: Int32, by deadline: Deadline) throws -> [UInt8] {
        var header = [UInt8](repeating: 0, count: 4)
        guard header.withUnsafeMutableBytes({ readExactly(fd, $0, by: deadline) }) else { throw ReadError.closed }
        return try readBody(fd, header: header, by: deadline)
    }

    /// The length in a frame's 4-byte header, if within `ControlProtocol.maxFrame`.
    static func length(of header: [UInt8]) throws -> Int {
        let length = Int(UInt32(header[0]) << 24 | UInt32(header[1]) << 16 | UInt32(header[2]) << 8 | UInt32(header[3]))
        guard length <= ControlProtocol.maxFrame else { throw ReadError.tooLarge(length) }
        return length
    }

    static func readBody(_ fd: Int32, header: [UInt8], by deadline: Deadline) throws -> [UInt8] {
        var body = [UInt8](repeating: 0, count: try length(of: header))
        guard body.withUnsafeMutableBytes({ readExactly(fd, $0, by: deadline) }) else { throw ReadError.closed }
        return body
    }

    static func write(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        (try? bytes.withUnsafeBytes { try Sys.send(fd, $0) }) != nil
    }

    /// Reads `length` secret bytes straight into secure memory by `deadline`.
    static func readSecret(_ fd: Int32, length: Int, by deadline: Deadline) -> SecureBytes? {
        let secret = SecureBytes(count: length)
        guard secret.withUnsafeMutableBytes({ readExactly(fd, $0, by: deadline) }) else {
            secret.wipe()
            return nil
        }
        return secret
    }
}

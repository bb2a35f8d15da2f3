// MountEvent is what happens to a mount as the daemon's parts hand it to each other:
// typed, with its time. Event is its JSON object on the control socket (docs/CONTROL.md,
// "Events"), made from it only where it leaves the process (EventHub's frames).
import Foundation

/// What happened to the mount, and when (for a will-lock: when it was announced).
public struct MountEvent: Sendable, Equatable {
    public enum Change: Sendable, Equatable {
        /// A lock comes for `reason` within `grace` seconds of `at` (0: at once).
        case willLock(Event.Reason, grace: Double)
        /// The keys are wiped.
        case locked(Event.Reason)
        /// The keys are in memory again.
        case unlocked
        /// The daemon is ending.
        case unmounting
        /// A sync engine's conflict copy appeared: its plaintext path in the mount.
        case conflict(path: String)
        /// A damaged block, name or IV file was refused: its plaintext path, what is wrong.
        case damage(path: String, what: String)
    }

    public let change: Change
    public let at: Date

    public init(_ change: Change, at: Date = Date()) {
        self.change = change
        self.at = at
    }

    /// A will-lock's deadline: when the lock comes at the latest. Nil for other events.
    public var deadline: Date? {
        guard case .willLock(_, let grace) = change else { return nil }
        return at.addingTimeInterval(grace)
    }

    /// The event's name on the socket.
    public var kind: Event.Kind {
        switch change {
        case .willLock: return .willLock
        case .locked: return .locked
        case .unlocked: return .unlocked
        case .unmounting: return .unmounting
        case .conflict: return .conflict
        case .damage: return .damage
        }
    }
}

/// One event, as a subscriber receives it (docs/CONTROL.md, "Events"): the wire's text,
/// which a client decodes; inside the daemon an event is a `MountEvent`.
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

    /// The object that says `happened` on the socket.
    public init(_ happened: MountEvent) {
        let formatter = ISO8601DateFormatter()
        event = happened.kind.rawValue
        at = formatter.string(from: happened.at)
        deadline = happened.deadline.map { formatter.string(from: $0) }
        switch happened.change {
        case .willLock(let reason, let grace):
            self.reason = reason.rawValue
            graceSeconds = grace
        case .locked(let reason):
            self.reason = reason.rawValue
        case .conflict(let path):
            self.path = path
        case .damage(let path, let what):
            self.path = path
            self.what = what
        case .unlocked, .unmounting:
            break
        }
    }
}

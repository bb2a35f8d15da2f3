// SessionLock follows the owner's desktop session through logind, on the system bus
// (`--lock-on screen,suspend`): a screen lock of one of the owner's sessions (logind's
// Lock signal, or its LockedHint turning true) and a coming suspend (PrepareForSleep)
// lock the vault. For the suspend it holds a logind delay inhibitor from the start, and
// lets go of it only once the vault is locked: the machine never sleeps unlocked.
import CofferSystem
import Foundation
import Glibc
import Logging
import Synchronization

public final class SessionLock: Sendable {
    public enum Reason: Sendable {
        case screen, suspend
    }

    static let logind = "org.freedesktop.login1"
    static let managerPath = "/org/freedesktop/login1"
    static let manager = "org.freedesktop.login1.Manager"
    static let session = "org.freedesktop.login1.Session"
    /// logind's InhibitDelayMaxSec when the property cannot be read: its default.
    static let defaultDelayMax = 5.0

    public let bus: Bus
    private let owner: uid_t
    private let why: String
    /// Locks for `reason` and returns once the vault is locked (or was already); for a
    /// suspend, `graceLimit` is the most an announced lock may wait (logind sleeps after
    /// its InhibitDelayMaxSec whatever the inhibitors say). Called on a thread of its own.
    private let lock: @Sendable (_ reason: Reason, _ graceLimit: Double?) -> Void
    /// The delay inhibitor held now (nil: none); taken and closed on the bus thread only.
    private let inhibitor = Mutex<Int32?>(nil)
    /// Half of logind's InhibitDelayMaxSec: the rest is for the lock itself.
    private let suspendGrace: Double

    /// Subscribes to what `screen` and `suspend` ask for and, for `suspend`, takes the
    /// first inhibitor; throws when logind cannot be reached or refuses. Call before the
    /// bus starts (its thread owns it from then on).
    public init(bus: Bus, owner: uid_t, screen: Bool, suspend: Bool, mountpoint: String,
                lock: @escaping @Sendable (_ reason: Reason, _ graceLimit: Double?) -> Void) throws {
        self.bus = bus
        self.owner = owner
        self.lock = lock
        why = "lock the vault mounted on \(mountpoint) before sleep"
        let delayMax = (try? Self.readDelayMax(bus)) ?? Self.defaultDelayMax
        suspendGrace = delayMax / 2
        let sent = "type='signal',sender='\(Self.logind)'"
        if screen {
            // Also the check that logind is there at all.
            _ = try Self.sessions(of: try bus.call(try bus.methodCall(Self.logind, Self.managerPath, Self.manager, "ListSessions")))
            try bus.addMatch("\(sent),interface='\(Self.session)',member='Lock'") { [self] message in
                guard let path = message.path else { return }
                lockIfOwners(path, why: "screen lock")
            }
            let hintChanged = "\(sent),interface='org.freedesktop.DBus.Properties',member='PropertiesChanged',arg0='\(Self.session)'"
            try bus.addMatch(hintChanged) { [self] message in
                guard let path = message.path, (try? Self.lockedHintTurnsTrue(message)) == true else { return }
                lockIfOwners(path, why: "screen locked")
            }
        }
        if suspend {
            try bus.addMatch("\(sent),path='\(Self.managerPath)',interface='\(Self.manager)',member='PrepareForSleep'") { [self] message in
                guard let sleeping = try? message.readBool() else { return }
                sleeping ? lockBeforeSleep() : takeInhibitor()
            }
            // A restarted logind knows no inhibitor of before: take a new one from it.
            let ownerChanged = "type='signal',sender='org.freedesktop.DBus',interface='org.freedesktop.DBus',member='NameOwnerChanged',"
                + "arg0='\(Self.logind)'"
            try bus.addMatch(ownerChanged) { [self] message in
                guard (try? message.readString()) == Self.logind, let old = try? message.readString(),
                      let new = try? message.readString() else { return }
                if new.isEmpty {
                    dropInhibitor()
                    bus.logger.warning("session: logind left the system bus: a suspend now will not wait for the lock")
                } else {
                    dropInhibitor()
                    bus.logger.notice("session: logind is on the system bus again (\(old.isEmpty ? "started" : "replaced")): taking a new inhibitor")
                    takeInhibitor()
                }
            }
            let fd = try bus.call(try inhibitCall()).readDescriptor()
            inhibitor.withLock { $0 = fd }
            bus.logger.notice("""
                session: a suspend waits for the vault's lock (logind delay inhibitor held; grace before sleep at most \(suspendGrace) s)
                """)
        }
    }

    // MARK: On the bus thread

    /// Locks if the session at `path` is one of the owner's: logind's session list says.
    private func lockIfOwners(_ path: String, why: String) {
        do {
            try bus.callAsync(try bus.methodCall(Self.logind, Self.managerPath, Self.manager, "ListSessions")) { [self] reply in
                if let error = reply.error { return bus.logger.warning("session: \(why) of \(path) not followed: ListSessions: \(error)") }
                guard let owned = try? Self.sessions(of: reply).contains(where: { $0.path == path && $0.uid == owner }), owned else { return }
                bus.logger.notice("session: \(why) (\(path)): locking")
                let lock = self.lock
                BackgroundThread.start("coffer-screen") { lock(.screen, nil) }
            }
        } catch {
            bus.logger.warning("session: \(why) of \(path) not followed: \(error)")
        }
    }

    /// A suspend is coming: lock (on a thread of its own, the grace cut to what logind
    /// waits), then let go of the inhibitor so that the machine may sleep.
    private func lockBeforeSleep() {
        let held = inhibitor.withLock { held in
            defer { held = nil }
            return held
        }
        bus.logger.notice("session: suspend coming: locking before sleep")
        let lock = self.lock, grace = suspendGrace
        BackgroundThread.start("coffer-suspend") { [bus] in
            lock(.suspend, grace)
            bus.perform {
                if let held {
                    Sys.close(held)
                    bus.logger.notice("session: locked before sleep; inhibitor released")
                } else {
                    bus.logger.warning("session: locked, but the suspend did not wait for it (no inhibitor was held)")
                }
            }
        }
    }

    /// Lets go of the inhibitor held (logind left or restarted: it is nothing to logind now).
    private func dropInhibitor() {
        if let stale = inhibitor.withLock({ held -> Int32? in defer { held = nil }; return held }) { Sys.close(stale) }
    }

    /// After a resume (or at a failed suspend), a new inhibitor for the next suspend.
    private func takeInhibitor() {
        guard inhibitor.withLock({ $0 == nil }) else { return }
        do {
            try bus.callAsync(try inhibitCall()) { [self] reply in
                if let error = reply.error {
                    return bus.logger.error("session: no inhibitor after resume (\(error)): the next suspend will not wait for the lock")
                }
                do {
                    let fd = try reply.readDescriptor()
                    let surplus = inhibitor.withLock { held -> Int32? in
                        if held != nil { return fd }
                        held = fd
                        return nil
                    }
                    if let surplus { Sys.close(surplus) }
                    bus.logger.notice("session: inhibitor taken again")
                } catch {
                    bus.logger.error("session: no inhibitor after resume (\(error)): the next suspend will not wait for the lock")
                }
            }
        } catch {
            bus.logger.error("session: no inhibitor after resume (\(error)): the next suspend will not wait for the lock")
        }
    }

    // MARK: Messages

    private func inhibitCall() throws -> BusMessage {
        let call = try bus.methodCall(Self.logind, Self.managerPath, Self.manager, "Inhibit")
        for argument in ["sleep", "coffer", why, "delay"] { try call.append(argument) }
        return call
    }

    /// logind's InhibitDelayMaxUSec, in seconds.
    private static func readDelayMax(_ bus: Bus) throws -> Double {
        let get = try bus.methodCall(logind, managerPath, "org.freedesktop.DBus.Properties", "Get")
        try get.append(manager)
        try get.append("InhibitDelayMaxUSec")
        let reply = try bus.call(get, timeoutSeconds: 5)
        guard try reply.enter("v", "t") else { throw BusError("InhibitDelayMaxUSec", -EBADMSG) }
        return Double(try reply.readUInt64()) / 1_000_000
    }

    /// The sessions of a ListSessions reply: a(susso) — id, uid, user, seat, object path.
    static func sessions(of reply: BusMessage) throws -> [(uid: uid_t, path: String)] {
        var found: [(uid: uid_t, path: String)] = []
        guard try reply.enter("a", "(susso)") else { return found }
        while try reply.enter("r", "susso") {
            _ = try reply.readString()
            let uid = try reply.readUInt32()
            _ = try reply.readString()
            _ = try reply.readString()
            found.append((uid, try reply.readString(objectPath: true)))
            try reply.exit()
        }
        try reply.exit()
        return found
    }

    /// Whether a session's PropertiesChanged sets LockedHint to true.
    static func lockedHintTurnsTrue(_ message: BusMessage) throws -> Bool {
        _ = try message.readString()
        guard try message.enter("a", "{sv}") else { return false }
        while try message.enter("e", "sv") {
            if try message.readString() == "LockedHint", try message.enter("v", "b") {
                return try message.readBool()
            }
            try message.skip("v")
            try message.exit()
        }
        return false
    }
}

// DesktopSession connects a mount's daemon to the desktop beside its control socket: the
// mount's object on the owner's session bus (D-Bus), logind's screen lock and suspend
// (`--lock-on`), and systemd's status line (STATUS=). Each hears the gate's events; what
// arrives from a bus goes through the gate's own locks.
import ArgumentParser
import CofferBus
import CofferGate
import Foundation
import Glibc
import Logging

/// What of the desktop session locks the vault (`--lock-on`).
enum LockTrigger: String, CaseIterable, Sendable {
    case screen, suspend

    /// The triggers named in `words` (each "screen", "suspend", or both at a comma);
    /// nil if one is neither.
    static func parse(_ words: [String]) -> Set<LockTrigger>? {
        var triggers = Set<LockTrigger>()
        for word in words.flatMap({ $0.split(separator: ",") }) {
            guard let trigger = LockTrigger(rawValue: String(word)) else { return nil }
            triggers.insert(trigger)
        }
        return triggers
    }
}

final class DesktopSession {
    /// Where a test puts the bus that stands in for the system bus's logind.
    static let logindBusVariable = "COFFER_LOGIND_BUS_ADDRESS"

    private let sessionBus: Bus?
    private let systemBus: Bus?

    /// Puts the mount on the session bus (if there is one: without, the daemon says so
    /// once and goes on), follows logind for `lockOn` (throws if logind cannot be
    /// reached: a vault that asked to lock before sleep must not mount without it), and
    /// keeps systemd's status line. `id` names the mount on the bus (the control socket's
    /// name).
    init(gate: Gate, events: EventHub?, id: String, mountpoint: String, lockOn: Set<LockTrigger>, logger: Logger) throws {
        // The session bus: the mount's object.
        var object: MountObject?
        var busProblem: String?
        do {
            let bus = try Bus(.session, logger: logger)
            do {
                object = try MountObject(bus: bus, id: id, mountpoint: mountpoint, vault: gate.fs.vault.path, owner: getuid(),
                                         control: .init(isLocked: { !gate.fs.isUnlocked }, lock: { grace in
                                             if grace {
                                                 gate.lockAnnounced(reason: .command, detail: "D-Bus Lock", grace: gate.lockGrace)
                                             } else {
                                                 gate.lock(reason: .command, detail: "D-Bus Lock")
                                             }
                                         }))
                bus.start()
                sessionBus = bus
                logger.notice("D-Bus: on the \(bus.name) as \(object!.name), object \(object!.path)")
            } catch {
                bus.stop()
                sessionBus = nil
                let name = MountObject.namePrefix + MountObject.element(id)
                busProblem = (error as? BusError)?.code == EEXIST
                    ? "its name \(name) is held by another program on the session bus" : "\(error)"
                logger.warning("D-Bus: the mount is not on the session bus: \(busProblem!)")
            }
        } catch {
            sessionBus = nil
            logger.notice("D-Bus: no session bus (\(error)); the mount is not on D-Bus")
        }

        // With --lock-on, programs wait for will-lock from the mount's name: one that another
        // program holds would announce nothing of ours.
        if let busProblem, !lockOn.isEmpty {
            throw CommandFailure(status: .sessionUnavailable, message: "--lock-on: the mount cannot announce its locks on D-Bus: \(busProblem)")
        }

        // The system bus: logind.
        if lockOn.isEmpty {
            systemBus = nil
        } else {
            let address = ProcessInfo.processInfo.environment[Self.logindBusVariable].flatMap { $0.isEmpty ? nil : $0 }
            do {
                let bus = try Bus(.system(address: address), logger: logger)
                do {
                    _ = try SessionLock(bus: bus, owner: getuid(), screen: lockOn.contains(.screen), suspend: lockOn.contains(.suspend),
                                        mountpoint: mountpoint) { reason, limit in
                        switch reason {
                        case .screen: gate.lockForSession(.screen, detail: "the screen locked", graceLimit: limit)
                        case .suspend: gate.lockForSession(.suspend, detail: "before sleep", graceLimit: limit)
                        }
                    }
                } catch {
                    bus.stop()
                    throw error
                }
                bus.start()
                systemBus = bus
            } catch {
                sessionBus?.stop()
                throw CommandFailure(status: .sessionUnavailable, message: "--lock-on: logind cannot be reached on the system bus: \(error)")
            }
        }
        gate.attachDesktop(busName: object?.name, busProblem: busProblem, lockOn: LockTrigger.allCases.filter(lockOn.contains).map(\.rawValue))

        // Every listener hands the event on without waiting.
        events?.listen { [object] event in
            switch event.change {
            case .willLock(let reason, let grace):
                object?.announce(.willLock(reason: reason.rawValue, grace: grace, deadline: event.deadline ?? event.at))
            case .locked(let reason):
                object?.announce(.locked(reason: reason.rawValue))
                SystemdNotify.send("STATUS=\(Self.statusLine(mountpoint, locked: true))")
            case .unlocked:
                object?.announce(.unlocked)
                SystemdNotify.send("STATUS=\(Self.statusLine(mountpoint, locked: false))")
            case .unmounting, .conflict, .damage:
                break
            }
        }
    }

    /// systemd's status line for the unit (`systemctl status`).
    static func statusLine(_ mountpoint: String, locked: Bool) -> String {
        "\(mountpoint) \(locked ? "locked" : "unlocked")"
    }

    /// Ends both connections once the last signals are sent (the daemon is ending).
    func stop() {
        sessionBus?.stop()
        systemBus?.stop()
    }
}

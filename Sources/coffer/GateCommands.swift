// GateCommands are the control socket's clients: `coffer unlock`, `lock` and `status`.
import ArgumentParser
import CofferCrypto
import CofferGate
import CofferSystem
import CofferVault
import Foundation
import Glibc

/// The mountpoint and socket options shared by the gate commands.
struct MountTarget: ParsableArguments {
    @Option(name: .long, help: "Control socket path (default: derived from MOUNTPOINT).")
    var socket: String?

    @Argument(help: "Where the vault is mounted.")
    var mountpoint: String

    /// The socket to talk to.
    func socketPath() throws -> String {
        if let socket { return socket }
        guard let canonical = MountPoint.canonical(mountpoint) else {
            throw MountPoint.missing(mountpoint)
        }
        do {
            return try SocketPath.forMountpoint(canonical)
        } catch {
            throw CommandFailure(status: .socketUnavailable, message: "\(error)")
        }
    }

    /// Sends `request` and turns a failed answer into its exit status. A request that
    /// finds the daemon busy (a flood of connections; nothing of it was done) is sent
    /// again, with a growing pause, for up to 10 s: a lock must get through.
    func send(_ request: ControlRequest, secret: SecureBytes? = nil) throws -> ControlResponse {
        var pause: useconds_t = 5_000, waited: useconds_t = 0
        while true {
            let response = try sendOnce(request, secret: secret)
            guard response.error == ControlError.busy else { return try checked(response) }
            guard waited < 10_000_000 else {
                throw CommandFailure(status: .daemonBusy, message: "the daemon for \(mountpoint) stayed busy for 10 s "
                                     + "(a flood of connections to its control socket); nothing was done, try again")
            }
            usleep(pause)
            waited += pause
            pause = min(pause * 2, 200_000)
        }
    }

    private func sendOnce(_ request: ControlRequest, secret: SecureBytes?) throws -> ControlResponse {
        let path = try socketPath()
        do {
            return try ControlClient.send(request, secret: secret, to: path)
        } catch ControlClient.Failure.noDaemon {
            // Another user's mount: its socket is in its owner's directory, and the daemon
            // would refuse this user anyway.
            if getuid() != 0, let owner = mountOwner(), owner != getuid() {
                throw CommandFailure(status: .requestRefused,
                                     message: "\(mountpoint) is uid \(owner)'s mount: only its owner or root may \(request.op) it")
            }
            throw CommandFailure(status: .socketUnavailable,
                                 message: "no coffer daemon answers for \(mountpoint) (socket \(path)); is it mounted?")
        } catch let failure as ControlClient.Failure {
            throw CommandFailure(status: .socketUnavailable, message: "\(mountpoint) (socket \(path)): \(failure)")
        }
    }

    /// The uid that mounted the coffer mount at `mountpoint` (its user_id= option).
    private func mountOwner() -> uid_t? {
        guard let canonical = MountPoint.canonical(mountpoint), let mount = MountPoint.isMounted(canonical),
              mount.type == "fuse.coffer" else { return nil }
        return mount.superOptions.first { $0.hasPrefix("user_id=") }.flatMap { uid_t($0.dropFirst(8)) }
    }

    /// The response, or its failure as the command's exit status.
    private func checked(_ response: ControlResponse) throws -> ControlResponse {
        guard response.ok else {
            let status: ExitStatus
            switch response.error {
            case ControlError.wrongPassphrase: status = .wrongPassphrase
            case ControlError.wrongRecoveryKey: status = .wrongRecoveryKey
            case ControlError.wrongSlotKey: status = .wrongSlotKey
            case ControlError.throttled: status = .retryLater
            case ControlError.wiped: status = .vaultWiped
            case ControlError.configDamaged: status = .configDamaged
            case ControlError.permissionDenied, ControlError.malformed, ControlError.unsupportedVersion,
                 ControlError.unknownOperation, ControlError.tooLarge:
                status = .requestRefused
            default: status = .failure
            }
            var message = response.message ?? "the daemon refused"
            if let wait = response.retryAfter, wait > 0, response.error != ControlError.throttled {
                message += String(format: " (next attempt accepted in %.0f s)", wait.rounded(.up))
            }
            throw CommandFailure(status: status, message: message)
        }
        return response
    }
}

extension MountTarget {
    /// How a device offers the slot keys of a vault's keyed slots: `TPM2Slots.withSlotKey`,
    /// `KeyringSlots.withSlotKey`.
    typealias SlotKeySource = (Vault, (SlotFile, SecureBytes) throws -> ControlResponse?) throws -> ControlResponse

    /// Unlocks the mount with a keyed slot's slot key that `device` gives: the vault's slot
    /// files are read from its CIPHERDIR (the daemon's status names it), and the key goes
    /// to the daemon with the slot's id; the daemon unwraps the slot itself.
    func unlock(withSlotKeyFrom device: SlotKeySource) throws -> ControlResponse {
        guard let status = try send(ControlRequest(op: .status)).status else {
            throw CommandFailure(status: .failure, message: "the daemon sent no status")
        }
        if status.state == "unlocked" { return .success(ControlMessage.alreadyUnlocked, status: status) }
        return try device(try Vault.open(at: status.vault)) { slot, slotKey in
            do {
                return try send(ControlRequest(op: .unlock, secret: .slotKey, secretLength: slotKey.count, slot: slot.id), secret: slotKey)
            } catch let failure as CommandFailure where failure.status == .wrongSlotKey {
                return nil  // this record's key opens nothing (costs no throttle): the next is tried
            }
        }
    }
}

struct UnlockCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unlock",
        abstract: "Unlock a mounted vault with its passphrase, its recovery key, this machine's TPM or your keyring.",
        discussion: """
            The passphrase is read from --passfile or --extpass, or from the systemd \
            credential coffer.passphrase when a unit gives one; otherwise it is asked \
            without echo on a terminal, or read from standard input. Wrong secrets are \
            answered with a growing delay before the next attempt is accepted.
            """)

    @OptionGroup var source: PassphraseSource

    @Option(name: .long, help: "Unlock with the recovery key in this file instead of the passphrase.")
    var recoveryKeyFile: String?

    @Flag(name: .long, help: ArgumentHelp("Unlock with this machine's TPM: every TPM2 slot of the vault sealed by this TPM is tried "
                                          + "(coffer keyslot add --tpm2); no secret is asked."))
    var tpm2 = false

    @Flag(name: .long, help: "Unlock with a slot key kept in your desktop keyring (coffer keyslot add --keyring); no secret is asked.")
    var keyring = false

    @Option(name: .long, help: ArgumentHelp("Try the passphrase on this passphrase slot alone (a label or id; coffer keyslot list shows "
                                            + "them), even one whose costs are above the vault's.", valueName: "label-or-id"))
    var slot: String?

    @OptionGroup var target: MountTarget

    func validate() throws {
        try source.validate(recoveryKeyFile: recoveryKeyFile)
        if tpm2 && keyring { throw ValidationError("give --tpm2 or --keyring, not both") }
        if (tpm2 || keyring) && (source.isGiven || recoveryKeyFile != nil) {
            throw ValidationError("--\(tpm2 ? "tpm2" : "keyring") asks for no secret: give it without --passfile, --extpass or --recovery-key-file")
        }
        if slot != nil && (tpm2 || keyring || recoveryKeyFile != nil) {
            throw ValidationError("--slot names a passphrase slot: give it with a passphrase, not with --tpm2, --keyring or --recovery-key-file")
        }
    }

    func run() throws {
        try runReportingFailures {
            _ = try target.socketPath()
            if tpm2 || keyring {
                let response = try target.unlock(withSlotKeyFrom: tpm2 ? TPM2Slots.withSlotKey : KeyringSlots.withSlotKey)
                print(response.message == ControlMessage.alreadyUnlocked ? "\(target.mountpoint) was already unlocked"
                      : "\(target.mountpoint) unlocked with \(tpm2 ? "this machine's TPM" : "your desktop keyring")")
                return
            }
            let kind: ControlRequest.SecretKind = recoveryKeyFile == nil ? .passphrase : .recoveryKey
            let slotID = try slot.flatMap(slotFileID)
            let secret = try recoveryKeyFile.map { try PassphraseReader.fromFile($0, what: "recovery key") }
                ?? source.read()
                ?? SystemdCredential.passphrase()
                ?? PassphraseReader.interactive(prompt: "Passphrase: ", confirm: false)
            defer { secret.wipe() }
            let response = try target.send(ControlRequest(op: .unlock, secret: kind, secretLength: secret.count, slot: slotID), secret: secret)
            print(response.message == ControlMessage.alreadyUnlocked ? "\(target.mountpoint) was already unlocked" : "\(target.mountpoint) unlocked")
        }
    }

    /// The id of the passphrase slot file `selector` (a label or an id) names in the
    /// mounted vault's CIPHERDIR (the daemon's status names it); nil for coffer.conf's own
    /// passphrase slot, which every unlock tries first anyway.
    private func slotFileID(_ selector: String) throws -> String? {
        guard let status = try target.send(ControlRequest(op: .status)).status else {
            throw CommandFailure(status: .failure, message: "the daemon sent no status")
        }
        let vault = try Vault.open(at: status.vault)
        guard let record = try vault.slotFile(selector) else {
            guard selector == VaultConfig.passphraseSlot else { throw VaultError.slotNotFound(selector) }
            return nil
        }
        guard record.kind == VaultConfig.passphraseSlot else {
            throw CommandFailure(status: .slotNotFound, message: "slot \"\(selector)\" is a \(record.kind) slot, not a passphrase slot")
        }
        return record.id
    }
}

struct LockCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lock",
        abstract: "Lock a mounted vault in place: flush, wipe the keys, purge the kernel's caches.")

    @Flag(name: .long, help: ArgumentHelp("Announce the lock to programs subscribed to `coffer events` and wait the mount's --lock-grace "
                                          + "first (at once otherwise)."))
    var grace = false

    @Flag(name: .long, help: ArgumentHelp("Lock the after-first-unlock directories too (format 8), whose keys every other lock "
                                          + "keeps, as a suspend and an unmount do."))
    var all = false

    @OptionGroup var target: MountTarget

    func run() throws {
        try runReportingFailures {
            _ = try target.send(ControlRequest(op: .lock, grace: grace ? true : nil, all: all ? true : nil))
            print("\(target.mountpoint) locked")
        }
    }
}

struct EventsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "events",
        abstract: "Print what happens to a mounted vault, one line per event, until the mount ends.",
        discussion: """
            Events: will-lock (reason command, idle, wipe, screen or suspend, and the deadline), \
            locked (the same, or unmount), \
            unlocked, unmounting, conflict (a sync engine's conflict copy appeared, with its \
            path) and damage (a damaged block or name was refused, with the path). Each line \
            is the time, the event and its fields; with --json, the event's JSON object \
            (docs/CONTROL.md). Ends with status 0 when the mount ends.
            """)

    @Flag(name: .long, help: "Print each event as its JSON object.")
    var json = false

    @OptionGroup var target: MountTarget

    func run() throws {
        try runReportingFailures {
            let path = try target.socketPath()
            let subscription: FileDescriptor
            do {
                subscription = try ControlClient.subscribe(to: path)
            } catch let failure as ControlClient.Failure {
                throw CommandFailure(status: .socketUnavailable, message: "\(failure)")
            }
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            while let event = ControlClient.nextEvent(subscription) {
                if json {
                    print(String(decoding: (try? encoder.encode(event)) ?? Data(), as: UTF8.self))
                } else {
                    let fields = [("reason", event.reason), ("deadline", event.deadline), ("path", event.path), ("what", event.what)]
                        .compactMap { name, value in value.map { "\(name)=\($0)" } }
                    print(([event.at, event.event] + fields).joined(separator: " "))
                }
                fflush(nil)
            }
        }
    }
}

struct StatusCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract: "Show whether a mounted vault is locked, and its daemon's state.")

    @Flag(name: .long, help: "Print the status as JSON.")
    var json = false

    @OptionGroup var target: MountTarget

    func run() throws {
        try runReportingFailures {
            guard let status = try target.send(ControlRequest(op: .status)).status else {
                throw CommandFailure(status: .failure, message: "the daemon sent no status")
            }
            if json {
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
                print(String(decoding: try encoder.encode(status), as: UTF8.self))
                return
            }
            let idleLock = status.idleLockSeconds.map { ", locks after \($0) s idle" } ?? ", no idle lock"
            let announced = status.lockGraceSeconds.map { $0 > 0 ? String(format: ", announced %.0f s before", $0) : "" } ?? ""
            let bus = status.busName.map { "on the session bus as \($0)" } ?? status.busProblem.map { "not on D-Bus: \($0)" } ?? "not on D-Bus"
            let lockOn = (status.lockOn ?? []).isEmpty ? "" : "; locks with the session's " + (status.lockOn ?? []).joined(separator: " and ")
            let keptOpen = status.filesKeptOpen.map { $0 > 0 ? "; \($0) open file\($0 == 1 ? "" : "s") kept through the lock" : "" } ?? ""
            let kept = (status.keptClasses ?? []).isEmpty ? "" : "; kept: " + (status.keptClasses ?? []).joined(separator: ", ")
            let retry = status.retryAfter > 0 ? String(format: ", next attempt in %.0f s", status.retryAfter.rounded(.up)) : ""
            print("""
                State:           \(status.state) since \(status.since)\(status.wiped ? " (vault wiped)" : "")\(kept)
                Idle:            \(status.idleSeconds) s\(idleLock)\(announced)
                Subscribers:     \(status.subscribers.map(String.init) ?? "none (no events)") to coffer events
                Desktop:         \(bus)\(lockOn)
                Protection:      \((status.protectionClasses ?? ["complete"]).joined(separator: ", "))\(keptOpen)
                Failed unlocks:  \(status.failedAttempts)\(retry)
                Mountpoint:      \(status.mountpoint)
                Vault:           \(status.vault) (format \(status.formatVersion))
                Control socket:  \(status.socket)
                Daemon pid:      \(status.pid)\(status.transport.map { ", requests through \($0)" } ?? "")
                """)
            // Slots a passphrase unlock passes over (planted, or past the budget): read from
            // CIPHERDIR by this command, as `keyslot list` does.
            for skipped in (try? Vault.open(at: status.vault))?.passphrasePlan().skipped ?? [] {
                print("Passed over:     \(skipped.name) at a passphrase unlock: \(skipped.reason)")
            }
        }
    }
}

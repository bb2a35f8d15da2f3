// Gate is the locked/unlocked state of a mount: it unlocks through the vault's key
// slots, throttles wrong secrets, locks in place (flush, wipe keys, purge the kernel's
// caches), locks by itself after an idle period, and tells subscribed programs (its
// EventHub) before and after: an announced lock waits out a grace for them to save.
import CofferCrypto
import CofferFileSystem
import CofferSystem
import CofferVault
import Foundation
import Glibc
import Logging
import Synchronization

public final class Gate: Sendable {
    public let fs: PlainFileSystem
    public let mountpoint: String
    public let socketPath: String
    public let idleLock: Int64?
    /// Seconds an idle lock (or `coffer lock --grace`) is announced before it comes
    /// (`--lock-grace`); 0: at once, still announced.
    public let lockGrace: Double
    /// Whether a suspend keeps the after-first-unlock class's keys, as `coffer lock` does
    /// (`--suspend-keeps-after-first-unlock`); by default a suspend drops them.
    public let suspendKeepsAfterFirstUnlock: Bool
    /// The programs told of locks and unlocks (nil: none are, as in tests of the gate alone).
    public let events: EventHub?
    private let logger: Logger

    private struct State: Sendable {
        var throttle = UnlockThrottle()
        var since = Date()
        var wiped = false
        /// Set by `shutDown`: the daemon is ending, no unlock is accepted any more.
        var closed = false
        /// The mount's name on the session bus (nil: not on D-Bus) and what of the desktop
        /// session locks it (`--lock-on`), for `status`; set by `attachDesktop`.
        var busName: String?
        var lockOn: [String] = []
        /// Why the mount is not on the session bus, where one was there.
        var busProblem: String?
    }

    /// One unlock or lock at a time, held through the whole of it — the key derivation of
    /// an unlock, the drain of a lock — so that the throttle sees every attempt in turn
    /// and a lock never interleaves with an unlock. A semaphore, not a Mutex: waiting
    /// is what it is for, and nothing else takes it (`status` never waits for it).
    private let turn = DispatchSemaphore(value: 1)
    /// Owns the state; held only for a moment, never across a derivation or a drain.
    /// Lock order: see PlainFileSystem's `gate`.
    private let state = Mutex(State())

    private let derive: Vault.KeyDerivation
    /// How requests reach the daemon, for `status`.
    private let transport: @Sendable () -> String

    public init(fs: PlainFileSystem, mountpoint: String, socketPath: String = "", idleLock: Int64?,
                lockGrace: Double = 0, suspendKeepsAfterFirstUnlock: Bool = false, events: EventHub? = nil,
                transport: @escaping @Sendable () -> String = { "/dev/fuse" },
                derive: @escaping Vault.KeyDerivation = Vault.deriveInProcess,
                logger: Logger = Logger(label: "coffer", factory: { _ in SwiftLogNoOpLogHandler() })) {
        self.fs = fs
        self.derive = derive
        self.mountpoint = mountpoint
        self.socketPath = socketPath
        self.idleLock = idleLock
        self.lockGrace = lockGrace
        self.suspendKeepsAfterFirstUnlock = suspendKeepsAfterFirstUnlock
        self.events = events
        self.transport = transport
        self.logger = logger
    }

    /// Runs `body` in the gate's turn.
    private func inTurn<R>(_ body: () -> R) -> R {
        turn.wait()
        defer { turn.signal() }
        return body()
    }

    // MARK: Unlock

    /// Unwraps the master key with `secret` and opens the view. The vault's config is
    /// read anew each time (a passwd or a wipe may have changed it), and so are the slot
    /// files. A slot key opens the keyed slot whose id is `slot`.
    public func unlock(secret: SecureBytes, kind: ControlRequest.SecretKind, slot: String? = nil, peer: uid_t) -> ControlResponse {
        inTurn {
            if let refusal = state.withLock({ refusal($0) }) { return refusal }
            do {
                let vault = try fs.vault.reopened()
                let master: MasterKey
                switch kind {
                case .passphrase: master = try vault.unlock(passphrase: secret, derive: derive, slot: slot)
                case .recoveryKey: master = try vault.unlock(recoveryKey: try RecoveryKey.parse(secret))
                case .slotKey: master = try vault.unlock(slotKey: secret, slot: slot ?? "")
                }
                fs.unlock(master)
                logger.notice("unlocked (uid \(peer), \(Self.described(kind, slot: slot)))")
                events?.publish(MountEvent(.unlocked))
                return state.withLock { state in
                    state.throttle.recordSuccess()
                    state.since = Date()
                    return .success("unlocked", status: status(state))
                }
            } catch VaultError.wrongSlotKey {
                // A slot key is 32 random bytes, not guessable: one that opens no slot of that
                // id (another vault's slot copied in, a sync copy with other blobs) is no
                // attack to slow down, and the command goes on to the next slot.
                logger.warning("unlock refused: the slot key opens no slot \(slot ?? "?") (uid \(peer)); not counted as a failed attempt")
                return .failure(ControlError.wrongSlotKey, VaultError.wrongSlotKey.description)
            } catch let error as VaultError where error == .wrongPassphrase || error == .wrongRecoveryKey {
                let (failures, retryAfter) = recordFailure()
                logger.warning("unlock refused: \(error) (uid \(peer), \(Self.described(kind, slot: slot)), failed attempt \(failures))")
                let code = error == .wrongPassphrase ? ControlError.wrongPassphrase : ControlError.wrongRecoveryKey
                return .failure(code, error.description, retryAfter: retryAfter)
            } catch CryptoError.malformedRecoveryKey {
                let (failures, retryAfter) = recordFailure()
                logger.warning("unlock refused: malformed recovery key (uid \(peer), failed attempt \(failures))")
                return .failure(ControlError.wrongRecoveryKey, CryptoError.malformedRecoveryKey.description, retryAfter: retryAfter)
            } catch VaultError.notAVault, VaultError.interruptedInit {
                state.withLock { $0.wiped = true }
                return .failure(ControlError.wiped, "the vault's config is gone (wiped?); it cannot be unlocked")
            } catch let error as VaultError {
                // A damaged config is not a wrong secret: reported as such, not charged to the throttle.
                logger.error("unlock failed: \(error)")
                return .failure(ControlError.configDamaged, error.description)
            } catch {
                logger.error("unlock failed: \(error)")
                return .failure(ControlError.failed, "\(error)")
            }
        }
    }

    /// The secret's kind for the log (never the secret): "passphrase", "recovery key",
    /// "slot key of slot <id>".
    private static func described(_ kind: ControlRequest.SecretKind, slot: String?) -> String {
        switch kind {
        case .passphrase: return slot.map { "passphrase of slot \($0)" } ?? "passphrase"
        case .recoveryKey: return "recovery key"
        case .slotKey: return "slot key of slot \(slot ?? "?")"
        }
    }

    /// Why an unlock is answered without trying the secret, if it is.
    private func refusal(_ state: State) -> ControlResponse? {
        if state.closed { return .failure(ControlError.failed, "the daemon is shutting down") }
        if fs.isUnlocked { return .success(ControlMessage.alreadyUnlocked, status: status(state)) }
        if state.wiped { return .failure(ControlError.wiped, "the vault was wiped; it can never be unlocked again") }
        let wait = state.throttle.retryAfter
        guard wait > 0 else { return nil }
        return .failure(ControlError.throttled, String(format: "too many failed attempts; try again in %.0f s", wait.rounded(.up)),
                        retryAfter: wait)
    }

    /// Charges a failed attempt to the throttle: (failures so far, seconds until the next try).
    private func recordFailure() -> (Int, Double) {
        state.withLock { state in
            state.throttle.recordFailure()
            return (state.throttle.failures, state.throttle.retryAfter)
        }
    }

    // MARK: Lock

    /// Locks in place now (`PlainFileSystem.lock` is the sequence; the gate decides
    /// when), announced to subscribers with a deadline of now. With `ifIdleFor`, locks
    /// only if no operation needed the keys for that many seconds (checked in the gate's
    /// turn, so an unlock in between wins). `detail` goes into the log line.
    /// `all`: the after-first-unlock class's keys go too (`coffer lock --all`).
    public func lock(reason: Event.Reason, detail: String, ifIdleFor idle: Int64? = nil, all: Bool = false) {
        inTurn { lock(reason, logged: "\(reason.rawValue): \(detail)", ifIdleFor: idle, announce: true, kernelCaches: true, all: all) }
    }

    /// Locks after a grace of `grace` seconds, announced to subscribers (`will-lock` with
    /// the deadline): at the deadline, or earlier once every subscriber that delays a
    /// lock has said it is done. Waits outside the gate's turn. A lock or unlock in the
    /// meantime ends the announcement: no second lock follows it.
    public func lockAnnounced(reason: Event.Reason, detail: String, grace: Double) {
        // Nothing to announce (or an unlock in progress, which the lock waits for): at once.
        guard grace > 0, fs.isUnlocked else { return lock(reason: reason, detail: detail) }
        let since = state.withLock { $0.since }
        events?.publish(MountEvent(.willLock(reason, grace: grace)))
        logger.notice("lock announced (\(reason.rawValue): \(detail)); it comes within \(Int(grace.rounded(.up))) s")
        events?.waitForDone(until: Sys.monotonicNow() + grace)
        inTurn {
            guard state.withLock({ $0.since }) == since else { return }
            lock(reason, logged: "\(reason.rawValue): \(detail), announced", ifIdleFor: nil, announce: false, kernelCaches: true)
        }
    }

    /// Locks because the desktop session asks (`--lock-on`: a screen lock, a suspend):
    /// announced with the mount's grace, cut to `graceLimit` (a suspend waits only as long
    /// as logind lets it). Before a suspend the vault is locked by the time this returns,
    /// whatever happened during the grace: the machine must not sleep unlocked.
    public func lockForSession(_ reason: Event.Reason, detail: String, graceLimit: Double?) {
        lockAnnounced(reason: reason, detail: detail, grace: min(lockGrace, graceLimit ?? lockGrace))
        if reason == .suspend { lock(reason: reason, detail: "\(detail), after the grace") }
    }

    /// Locks if the view is unlocked (and, with `idle`, no operation needed the keys for
    /// that many seconds), in the gate's turn: subscribers hear `will-lock` first (with
    /// `announce`; an announced lock was told before its grace) and `locked` after, both
    /// sent without waiting. `logged` goes into the log line.
    ///
    /// What drops the after-first-unlock class's keys too (format 8): `lock --all`, a wipe,
    /// a suspend (unless the mount says it keeps them) and the end of the mount; a lock
    /// that finds only those keys left drops them for these reasons and does nothing
    /// otherwise.
    private func lock(_ reason: Event.Reason, logged: String, ifIdleFor idle: Int64?, announce: Bool, kernelCaches: Bool,
                      all: Bool = false) {
        let all = all || [.wipe, .unmount].contains(reason) || (reason == .suspend && !suspendKeepsAfterFirstUnlock)
        guard fs.isUnlocked || (all && fs.keepsAfterFirstUnlock) else { return }
        if let idle, fs.idleSeconds < idle { return }
        if announce { events?.publish(MountEvent(.willLock(reason, grace: 0))) }
        fs.lock(kernelCaches: kernelCaches, all: all)
        state.withLock { $0.since = Date() }
        logger.notice("locked (\(logged)); keys wiped\(fs.keepsAfterFirstUnlock ? " but the after-first-unlock class's" : "")")
        events?.publish(MountEvent(.locked(reason)))
    }

    /// Locks for good: the daemon is ending, its session no longer serves the kernel
    /// (whose caches are then not invalidated: a write-back would wait for nobody). An
    /// unlock that arrives afterwards (on a connection accepted before the control
    /// server stopped) is refused.
    public func shutDown() {
        events?.publish(MountEvent(.unmounting))
        inTurn {
            state.withLock { $0.closed = true }
            lock(.unmount, logged: "unmounted", ifIdleFor: nil, announce: false, kernelCaches: false)
        }
        events?.stop()
    }

    // MARK: Idle lock and status

    /// Starts a thread that locks once no operation needed the keys for `idleLock` seconds.
    public func startIdleTimer() {
        guard let idle = idleLock, idle > 0 else { return }
        BackgroundThread.start("coffer-idle") { [self] in
            while true {
                sleep(UInt32(min(max(idle / 4, 1), 5)))
                guard fs.isUnlocked && fs.idleSeconds >= idle else { continue }
                if lockGrace > 0 {
                    lockAnnounced(reason: .idle, detail: "idle for \(idle) s", grace: lockGrace)
                } else {
                    lock(reason: .idle, detail: "idle for \(idle) s", ifIdleFor: idle)
                }
            }
        }
    }

    /// Records the mount's bus name (nil: not on D-Bus) and `--lock-on`'s triggers for `status`.
    public func attachDesktop(busName: String?, busProblem: String? = nil, lockOn: [String]) {
        state.withLock { state in
            state.busName = busName
            state.busProblem = busProblem
            state.lockOn = lockOn
        }
    }

    /// The gate's state now; never waits for an unlock or lock in progress.
    public func status() -> GateStatus { state.withLock { status($0) } }

    private func status(_ state: State) -> GateStatus {
        let formatter = ISO8601DateFormatter()
        return GateStatus(state: fs.isUnlocked ? "unlocked" : "locked", since: formatter.string(from: state.since),
                          idleSeconds: fs.idleSeconds, idleLockSeconds: idleLock, failedAttempts: state.throttle.failures,
                          retryAfter: state.throttle.retryAfter, mountpoint: mountpoint, vault: fs.vault.path,
                          formatVersion: fs.vault.config.format, socket: socketPath, pid: getpid(), wiped: state.wiped,
                          transport: transport(), subscribers: events?.count, lockGraceSeconds: lockGrace,
                          protectionClasses: ProtectionClass.allCases.filter { $0.formats.contains(fs.vault.config.format) }.map(\.name),
                          filesKeptOpen: fs.filesKeptOpen, busName: state.busName, busProblem: state.busProblem,
                          lockOn: state.lockOn,
                          keptClasses: fs.isUnlocked ? nil : fs.keepsAfterFirstUnlock ? [ProtectionClass.afterFirstUnlock.name] : [])
    }
}

// Gate is the locked/unlocked state of a mount: it unlocks through the vault's key
// slots, throttles wrong secrets, locks in place (flush, wipe keys, purge the kernel's
// caches), and locks by itself after an idle period.
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
    private let logger: Logger

    private struct State: Sendable {
        var throttle = UnlockThrottle()
        var since = Date()
        var wiped = false
        /// Set by `shutDown`: the daemon is ending, no unlock is accepted any more.
        var closed = false
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
                transport: @escaping @Sendable () -> String = { "/dev/fuse" },
                derive: @escaping Vault.KeyDerivation = Vault.deriveInProcess,
                logger: Logger = Logger(label: "coffer", factory: { _ in SwiftLogNoOpLogHandler() })) {
        self.fs = fs
        self.derive = derive
        self.mountpoint = mountpoint
        self.socketPath = socketPath
        self.idleLock = idleLock
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
    /// read anew each time (a passwd or a wipe may have changed it).
    public func unlock(secret: SecureBytes, kind: ControlRequest.SecretKind, peer: uid_t) -> ControlResponse {
        inTurn {
            if let refusal = state.withLock({ refusal($0) }) { return refusal }
            do {
                let vault = try fs.vault.reopened()
                let master: MasterKey
                switch kind {
                case .passphrase: master = try vault.unlock(passphrase: secret, derive: derive)
                case .recoveryKey: master = try vault.unlock(recoveryKey: try RecoveryKey.parse(secret))
                }
                fs.unlock(master)
                logger.notice("unlocked (uid \(peer), \(kind == .passphrase ? "passphrase" : "recovery key"))")
                return state.withLock { state in
                    state.throttle.recordSuccess()
                    state.since = Date()
                    return .success("unlocked", status: status(state))
                }
            } catch let error as VaultError where error == .wrongPassphrase || error == .wrongRecoveryKey {
                let (failures, retryAfter) = recordFailure()
                logger.warning("unlock refused: \(error) (uid \(peer), failed attempt \(failures))")
                return .failure(error == .wrongPassphrase ? ControlError.wrongPassphrase : ControlError.wrongRecoveryKey,
                                error.description, retryAfter: retryAfter)
            } catch CryptoError.malformed(let what) where kind == .recoveryKey {
                let (failures, retryAfter) = recordFailure()
                logger.warning("unlock refused: malformed recovery key (uid \(peer), failed attempt \(failures))")
                return .failure(ControlError.wrongRecoveryKey, "malformed \(what)", retryAfter: retryAfter)
            } catch VaultError.notAVault {
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

    /// Locks in place (`PlainFileSystem.lock` is the sequence; the gate decides when).
    /// With `ifIdleFor`, locks only if no operation needed the keys for that many
    /// seconds (checked in the gate's turn, so an unlock in between wins).
    public func lock(reason: String, ifIdleFor idle: Int64? = nil) {
        inTurn { lock(reason: reason, ifIdleFor: idle, kernelCaches: true) }
    }

    private func lock(reason: String, ifIdleFor idle: Int64?, kernelCaches: Bool) {
        guard fs.isUnlocked else { return }
        if let idle, fs.idleSeconds < idle { return }
        fs.lock(kernelCaches: kernelCaches)
        state.withLock { $0.since = Date() }
        logger.notice("locked (\(reason)); keys wiped")
    }

    /// Locks for good: the daemon is ending, its session no longer serves the kernel
    /// (whose caches are then not invalidated: a write-back would wait for nobody). An
    /// unlock that arrives afterwards (on a connection accepted before the control
    /// server stopped) is refused.
    public func shutDown() {
        inTurn {
            state.withLock { $0.closed = true }
            lock(reason: "unmounted", ifIdleFor: nil, kernelCaches: false)
        }
    }

    // MARK: Idle lock and status

    /// Starts a thread that locks once no operation needed the keys for `idleLock` seconds.
    public func startIdleTimer() {
        guard let idle = idleLock, idle > 0 else { return }
        let thread = Thread { [self] in
            while true {
                sleep(UInt32(min(max(idle / 4, 1), 5)))
                if fs.isUnlocked && fs.idleSeconds >= idle { lock(reason: "idle for \(idle) s", ifIdleFor: idle) }
            }
        }
        thread.name = "coffer-idle-lock"
        thread.start()
    }

    /// The gate's state now; never waits for an unlock or lock in progress.
    public func status() -> GateStatus { state.withLock { status($0) } }

    private func status(_ state: State) -> GateStatus {
        let formatter = ISO8601DateFormatter()
        return GateStatus(state: fs.isUnlocked ? "unlocked" : "locked", since: formatter.string(from: state.since),
                          idleSeconds: fs.idleSeconds, idleLockSeconds: idleLock, failedAttempts: state.throttle.failures,
                          retryAfter: state.throttle.retryAfter, mountpoint: mountpoint, vault: fs.vault.path,
                          formatVersion: fs.vault.config.format, socket: socketPath, pid: getpid(), wiped: state.wiped,
                          transport: transport())
    }
}

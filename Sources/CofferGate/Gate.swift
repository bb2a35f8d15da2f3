// Gate is the locked/unlocked state of a mount: it unlocks through the vault's key
// slots, throttles wrong secrets, locks in place (flush, wipe keys, purge the kernel's
// caches), and locks by itself after an idle period.
import CofferCrypto
import CofferVault
import Foundation
import Glibc
import Logging

public final class Gate: @unchecked Sendable {
    /// What the gate needs from the mount it guards: to drop the kernel's caches.
    public struct KernelCaches: Sendable {
        /// Invalidate the cached pages and attributes of one node (writes back dirty pages).
        public var invalidateNode: @Sendable (UInt64) -> Void
        /// Invalidate one cached directory entry (the name's bytes are valid during the call).
        public var invalidateEntry: @Sendable (UInt64, UnsafeBufferPointer<UInt8>) -> Void

        public init(invalidateNode: @escaping @Sendable (UInt64) -> Void,
                    invalidateEntry: @escaping @Sendable (UInt64, UnsafeBufferPointer<UInt8>) -> Void) {
            self.invalidateNode = invalidateNode
            self.invalidateEntry = invalidateEntry
        }
    }

    public let fs: PlainFileSystem
    public let mountpoint: String
    public var socketPath = ""
    public let idleLock: Int64?
    private let logger: Logger
    private var caches: KernelCaches?

    /// Serialises unlock and lock; guards the fields below.
    private let lock = NSLock()
    private var throttle = UnlockThrottle()
    private var since = Date()
    private var wiped = false
    /// Set by `shutDown`: the daemon is ending, no unlock is accepted any more.
    private var closed = false

    private let derive: Vault.KeyDerivation

    public init(fs: PlainFileSystem, mountpoint: String, idleLock: Int64?,
                derive: @escaping Vault.KeyDerivation = Vault.deriveInProcess,
                logger: Logger = Logger(label: "coffer", factory: { _ in SwiftLogNoOpLogHandler() })) {
        self.fs = fs
        self.derive = derive
        self.mountpoint = mountpoint
        self.idleLock = idleLock
        self.logger = logger
    }

    /// Connects the gate to the mounted session's cache invalidation.
    public func attach(_ caches: KernelCaches) {
        lock.withLock { self.caches = caches }
    }

    /// Disconnects it (the session is gone: there is nothing left to invalidate).
    public func detach() {
        lock.withLock { caches = nil }
    }

    // MARK: Unlock

    /// Unwraps the master key with `secret` and opens the view. The vault's config is
    /// read anew each time (a passwd or a wipe may have changed it).
    public func unlock(secret: SecureBytes, kind: ControlRequest.SecretKind, peer: uid_t) -> ControlResponse {
        lock.lock()
        defer { lock.unlock() }
        if closed { return .failure(ControlError.failed, "the daemon is shutting down") }
        if fs.isUnlocked { return .success("already unlocked", status: statusLocked()) }
        if wiped { return .failure(ControlError.wiped, "the vault was wiped; it can never be unlocked again") }
        let wait = throttle.retryAfter
        if wait > 0 {
            return .failure(ControlError.throttled, String(format: "too many failed attempts; try again in %.0f s", wait.rounded(.up)),
                            retryAfter: wait)
        }
        do {
            let vault = try Vault.open(at: fs.vault.path)
            let master: MasterKey
            switch kind {
            case .passphrase: master = try vault.unlock(passphrase: secret, derive: derive)
            case .recoveryKey: master = try vault.unlock(recoveryKey: try RecoveryKey.parse(secret))
            }
            fs.unlock(master)
            throttle.recordSuccess()
            since = Date()
            logger.notice("unlocked (uid \(peer), \(kind == .passphrase ? "passphrase" : "recovery key"))")
            return .success("unlocked", status: statusLocked())
        } catch let error as VaultError where error == .wrongPassphrase || error == .wrongRecoveryKey {
            throttle.recordFailure()
            logger.warning("unlock refused: \(error) (uid \(peer), failed attempt \(throttle.failures))")
            return .failure(error == .wrongPassphrase ? ControlError.wrongPassphrase : ControlError.wrongRecoveryKey,
                            error.description, retryAfter: throttle.retryAfter)
        } catch CryptoError.malformed(let what) where kind == .recoveryKey {
            throttle.recordFailure()
            logger.warning("unlock refused: malformed recovery key (uid \(peer), failed attempt \(throttle.failures))")
            return .failure(ControlError.wrongRecoveryKey, "malformed \(what)", retryAfter: throttle.retryAfter)
        } catch VaultError.notAVault {
            wiped = true
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

    // MARK: Lock

    /// Locks in place. Order: (1) invalidate every cached inode while the keys are still
    /// there, so the kernel writes back dirty pages (shared mmaps) through the daemon;
    /// (2) wait for operations in flight and wipe the keys; (3) invalidate inodes and
    /// entries again, so nothing decrypted stays in the page, attribute or dentry caches.
    /// With `ifIdleFor`, locks only if no operation needed the keys for that many
    /// seconds (checked under the gate's lock, so an unlock in between wins).
    public func lock(reason: String, ifIdleFor idle: Int64? = nil) {
        lock.lock()
        defer { lock.unlock() }
        guard fs.isUnlocked else { return }
        if let idle, fs.idleSeconds < idle { return }
        if let caches { fs.knownNodes().forEach(caches.invalidateNode) }
        fs.lock()
        // Nodes the kernel learnt during step 1 are in this fresh list too. Every name it
        // may cache is dropped — also names given by rename and link, and negative
        // entries — so that afterwards every lookup asks the daemon, which answers EACCES.
        if let caches { fs.knownNodes().forEach(caches.invalidateNode) }
        fs.forgetCachedEntries { parent, name in caches?.invalidateEntry(parent, name) }
        // Freed heap pages that held plaintext go back to the kernel (which zeroes them).
        Sys.releaseFreeMemory()
        since = Date()
        logger.notice("locked (\(reason)); keys wiped")
    }

    /// Locks for good: the daemon is ending. An unlock that arrives afterwards (on a
    /// connection accepted before the control server stopped) is refused.
    public func shutDown() {
        lock.withLock { closed = true }
        lock(reason: "unmounted")
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

    public func status() -> GateStatus { lock.withLock { statusLocked() } }

    private func statusLocked() -> GateStatus {
        let formatter = ISO8601DateFormatter()
        return GateStatus(state: fs.isUnlocked ? "unlocked" : "locked", since: formatter.string(from: since),
                          idleSeconds: fs.idleSeconds, idleLockSeconds: idleLock, failedAttempts: throttle.failures,
                          retryAfter: throttle.retryAfter, mountpoint: mountpoint, vault: fs.vault.path,
                          formatVersion: fs.vault.config.format, socket: socketPath, pid: getpid(), wiped: wiped)
    }
}

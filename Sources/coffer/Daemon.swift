// Daemon is the life of one mount's daemon (`coffer mount --foreground`), in three
// phases, each in one place:
//   prepare   — open and check everything the mount needs without mounting: the vault
//               and its claim, the state directory, the file system, the session, the
//               gate, the desktop session and the control socket; the keys, if given;
//   serve     — mount, check what the kernel gave, start the background work, say
//               READY, serve requests until the mount ends;
//   shut down — stop in the one order that keeps the keys from coming back: the watch,
//               the control socket (no unlock after this), the gate's last lock, the
//               unmount, and the undo journal made durable and removed.
// Whatever prepare set up is taken down again, last first, if a later step fails: a
// refused mount leaves no socket, bus name, state directory or empty journal behind.
import CofferCrypto
import CofferFUSE
import CofferFileSystem
import CofferGate
import CofferSystem
import CofferVault
import Foundation
import Glibc
import Logging

final class Daemon {
    /// What the command line asked of the mount, checked by MountCommand.
    struct Settings {
        var cipherdir: String
        var mountpoint: String
        var socket: String?
        var stateDir: String?
        var allowOther: Bool
        var readOnly: Bool
        var fuseOptions: [String]
        var transport: FuseSession.Transport
        var threads: Int
        var watchLimit: Int?
        /// Seconds.
        var idleLock: Int64?
        /// Seconds.
        var lockGrace: Int64?
        var lockOn: [String]
        /// A suspend keeps the after-first-unlock class's keys (--suspend-keeps-after-first-unlock).
        var suspendKeepsAfterFirstUnlock: Bool
        /// The mount's readahead window in KiB (-o read_ahead_kb=N, root only), or nil
        /// for the kernel's.
        var readAheadKiB: Int?
    }

    private let settings: Settings
    private let logger: Logger
    private let vault: Vault
    private let target: String
    private let socketPath: String
    private let fs: PlainFileSystem
    private let session: FuseSession
    private let gate: Gate
    private let server: ControlServer
    /// How to take down what prepare set up, last first; emptied as it runs.
    private var teardown: [() -> Void] = []

    /// Prepare: everything but the mount. `unlockKey` reads the passphrase given with the
    /// mount (nil: none) once the vault is open; the master key it gives opens the gate.
    init(_ settings: Settings, logger: Logger, unlockKey: (Vault) throws -> MasterKey?) throws {
        self.settings = settings
        self.logger = logger
        var teardown: [() -> Void] = []
        // A failure in here leaves nothing running: `self.teardown` is not ours yet.
        var prepared = false
        defer { if !prepared { teardown.reversed().forEach { $0() } } }

        let vault = try Vault.open(at: settings.cipherdir)
        try vault.checkCipherAvailable()
        if vault.config.contentAlgorithm == .aes256gcm {
            let choice = AESEngine.chosen
            logger.notice("AES-256-GCM content blocks by \(choice.engine.detail): \(choice.reason)")
        }
        let claim = try VaultClaim(vault)
        teardown.append { withExtendedLifetime(claim) {} }
        let target = try MountPoint.checkUsable(settings.mountpoint)
        try MountCommand.checkTransport(settings.transport)
        let socketPath: String
        do {
            socketPath = try settings.socket ?? SocketPath.forMountpoint(target)
        } catch {
            throw CommandFailure(status: .socketUnavailable, message: "control socket: \(error)")
        }
        let master = try unlockKey(vault)

        // The file system's hooks reach the session, made after it.
        let link = SessionLink()
        let state = try Self.stateDirectory(for: vault, given: settings.stateDir, logger: logger)
        // A mount refused from here on leaves no state directory behind (one it made, or
        // one a clean unmount emptied): rmdir removes it only while it is empty.
        if let state { teardown.append { try? Sys.unlink(state, in: AT_FDCWD, directory: true) } }
        // What programs subscribed on the control socket hear (`coffer events`).
        let events: EventHub?
        do {
            events = try EventHub(logger: logger)
        } catch {
            events = nil
            logger.warning("events: none will be sent to programs (\(error))")
        }
        let fs = try PlainFileSystem(vault: vault,
                                     options: .init(preserveOwner: settings.allowOther && geteuid() == 0, watchOtherWriters: true,
                                                    watchLimit: settings.watchLimit ?? .max, stateDirectory: state),
                                     hooks: .init(attributesChanged: link.attributesChanged, invalidateNode: link.invalidateNode,
                                                  invalidateEntry: link.invalidateEntry, noticed: { notice in
                                                      switch notice {
                                                      case .damage(let path, let what): events?.publish(MountEvent(.damage(path: path, what: what)))
                                                      case .conflictCopy(let path): events?.publish(MountEvent(.conflict(path: path)))
                                                      }
                                                  }),
                                     logger: logger)
        // …and no empty undo journal in it either (finish removes both while they are empty).
        teardown.append { Self.finish(fs, logger: logger) }

        var options = FuseSession.Options()
        options.allowOther = settings.allowOther
        options.readOnly = settings.readOnly
        options.extra = settings.fuseOptions
        options.fsName = vault.path
        options.transport = settings.transport
        options.transportSettled = { logger.notice("requests come through \($0)") }
        let session = try FuseSession(fs: fs, options: options, link: link)
        let gate = Gate(fs: fs, mountpoint: target, socketPath: socketPath, idleLock: settings.idleLock,
                        lockGrace: Double(settings.lockGrace ?? 0), suspendKeepsAfterFirstUnlock: settings.suspendKeepsAfterFirstUnlock,
                        events: events,
                        transport: { session.transport }, derive: KDFHelper.derive, logger: logger)

        // The passphrase given at mount opens the same gate as `coffer unlock`.
        if let master { fs.unlock(master) }

        // On the session bus, and following logind where asked; named as the socket is.
        let desktop = try DesktopSession(gate: gate, events: events,
                                         id: String(URL(fileURLWithPath: socketPath).lastPathComponent.dropLast(".sock".count)),
                                         mountpoint: target, lockOn: LockTrigger.parse(settings.lockOn) ?? [], logger: logger)
        teardown.append { desktop.stop() }

        let server = ControlServer(path: socketPath, owner: getuid(), gate: gate, logger: logger)
        do {
            try server.start()
        } catch {
            throw CommandFailure(status: .socketUnavailable, message: "control socket \(socketPath): \(error)")
        }
        teardown.append { server.stop() }
        (self.vault, self.target, self.socketPath) = (vault, target, socketPath)
        (self.fs, self.session, self.gate, self.server) = (fs, session, gate, server)
        prepared = true
        self.teardown = teardown
    }

    /// Serve: mounts, reports success through `ready`, serves until the mount ends, then
    /// shuts down. Throws (after the shutdown) if the mount ended by its transport's failure.
    func serve(ready: () -> Void) throws {
        var served = false
        defer {
            // A mount refused by the kernel or by the options check: the state directory
            // and journal go, as for a failure in prepare.
            if !served { runTeardown() }
        }
        do {
            try session.mount(at: target)
        } catch {
            throw CommandFailure(status: .mountFailed, message: "the kernel refused to mount \(target) (see the message above)")
        }
        // Decided on what the mount got, not on what was typed: an escaped spelling of
        // allow_other (allow\_other, …) reaches the kernel past any check of the text.
        let got = MountPoint.isMounted(target)?.superOptions ?? []
        if got.contains("allow_other") && !got.contains("default_permissions") {
            session.unmount()
            throw CommandFailure(status: .usage, message: """
                -o allow_other (in whatever spelling) is refused: use --allow-other, which also makes the kernel enforce file modes \
                (default_permissions)
                """)
        }
        if let kib = settings.readAheadKiB { setReadAhead(kib) }
        startBackgroundWork()
        logger.notice("mounted \(vault.path) on \(target), \(fs.isUnlocked ? "unlocked" : "locked"); control socket \(socketPath)")
        ready()
        served = true
        SystemdNotify.send("READY=1\nSTATUS=\(DesktopSession.statusLine(target, locked: !fs.isUnlocked))")
        session.run(threads: settings.threads)
        shutDown()
        if session.endedByFailure {
            throw CommandFailure(status: .failure, message: """
                the mount of \(target) ended because its io_uring transport failed (the daemon's log says which call)
                """)
        }
    }

    // MARK: The phases' parts

    /// Sets the mount's readahead window (its backing device info, which the kernel makes
    /// for each FUSE mount at 128 KiB at most): a stream then reads ahead in windows of
    /// `kib`, and the kernel's READ requests grow with them up to the 1 MiB the mount
    /// takes. A failure leaves the kernel's window, and says so.
    private func setReadAhead(_ kib: Int) {
        // From mountinfo: a stat of the mount would wait for this daemon, not serving yet.
        guard let device = MountPoint.isMounted(target)?.device else {
            return logger.warning("read_ahead_kb=\(kib) not set, the kernel's readahead stays: \(target) is not in mountinfo")
        }
        let setting = "/sys/class/bdi/\(device)/read_ahead_kb"
        do {
            try KernelFiles.write(setting, "\(kib)\n")
            logger.notice("readahead of \(target): \(kib) KiB (\(setting))")
        } catch {
            logger.warning("read_ahead_kb=\(kib) not set, the kernel's readahead stays: \(error)")
        }
    }

    /// The work that runs beside the requests once mounted: the idle lock's timer and the
    /// watch of other writers of CIPHERDIR (the control socket, events and the desktop
    /// session started in prepare, so that a failure to start them refuses the mount).
    private func startBackgroundWork() {
        gate.startIdleTimer()
        fs.followOtherWriters()
    }

    /// The order matters: no unlock may bring the keys back after the gate's last lock.
    private func shutDown() {
        SystemdNotify.send("STOPPING=1")
        fs.stopFollowingOtherWriters()
        server.stop()
        logger.notice("control socket \(socketPath) closed")
        gate.shutDown()
        session.unmount()
        logger.notice("unmounted \(target); keys wiped")
        // A clean exit: everything written is made durable and the undo records go
        // (teardown's finish and rmdir), the desktop session leaves the bus.
        runTeardown()
    }

    private func runTeardown() {
        let steps = teardown
        teardown = []
        steps.reversed().forEach { $0() }
    }

    private static func finish(_ fs: PlainFileSystem, logger: Logger) {
        do { try fs.finish() } catch { logger.warning("undo journal kept: \(error)") }
    }

    /// This machine's directory for the vault's crash state; nil (with a warning) for a
    /// user without one when none was given.
    private static func stateDirectory(for vault: Vault, given: String?, logger: Logger) throws -> String? {
        do {
            return try StateDirectory.forVault(vault, at: MountPoint.canonical(vault.path) ?? vault.path, given: given)
        } catch where given == nil {
            // A user without a writable home (a system account): the journal stays in
            // CIPHERDIR, as before coffer kept it apart; durable all the same.
            logger.warning("""
                no state directory (\(error)); the undo journal is kept in CIPHERDIR, where a sync engine would carry it: give --state-dir if the \
                vault is synced
                """)
            return nil
        } catch {
            throw CommandFailure(status: .stateDirectoryUnusable, message: "\(error)")
        }
    }
}

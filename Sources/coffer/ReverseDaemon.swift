// ReverseDaemon is the life of a reverse view's daemon (`coffer mount --reverse
// --foreground`): prepare — open PLAINDIR and its config, unwrap the master key with the
// passphrase given, derive the view's keys and drop the master key; serve — mount
// read-only and serve until unmounted or signalled; shut down — unmount and wipe the
// keys. A view has no lock and no control socket: it serves ciphertext only, and its
// keys live exactly as long as the mount.
import CofferCrypto
import CofferFUSE
import CofferFileSystem
import CofferSystem
import CofferVault
import Foundation
import Glibc
import Logging

final class ReverseDaemon {
    struct Settings {
        var plaindir: String
        var mountpoint: String
        var excludes: [String]
        var allowOther: Bool
        var fuseOptions: [String]
        var threads: Int
    }

    private let settings: Settings
    private let logger: Logger
    private let target: String
    private let format: ReverseFormat
    private let session: ReverseSession

    /// Prepare: everything but the mount. `passphrase` reads the passphrase given with
    /// the mount, which a view cannot do without.
    init(_ settings: Settings, logger: Logger, passphrase: () throws -> SecureBytes?) throws {
        self.settings = settings
        self.logger = logger
        let source = try Vault.openReverse(at: settings.plaindir)
        try source.checkCipherAvailable()
        target = try MountPoint.checkUsable(settings.mountpoint)
        // A view mounted inside PLAINDIR would list itself, and each read of it read it again.
        if let plain = MountPoint.canonical(settings.plaindir), (target + "/").hasPrefix(plain == "/" ? "/" : plain + "/") {
            throw CommandFailure(status: .usage,
                                 message: "\(settings.mountpoint) is inside \(settings.plaindir): a view cannot be mounted in what it shows")
        }
        guard let secret = try passphrase() else {
            throw CommandFailure(status: .passphraseUnreadable, message: ReverseDaemon.noPassphrase)
        }
        defer { secret.wipe() }
        let master = try source.unlock(passphrase: secret, derive: KDFHelper.derive)
        // Only the view's subkeys stay (the master key is wiped as they are derived).
        format = ReverseFormat(master: master, config: source.config)
        master.wipe()
        do {
            let fs = try ReverseFileSystem(source: source, format: format, excludes: ReverseExcludes(settings.excludes), logger: logger)
            session = try ReverseSession(fs: fs, fsName: source.path, allowOther: settings.allowOther, extra: settings.fuseOptions)
        } catch {
            format.wipe()
            throw error
        }
    }

    static let noPassphrase = """
        a reverse view is unlocked at its mount: give its passphrase with --passfile or --extpass, on standard input, or at the prompt
        """

    /// Serve: mounts, reports success through `ready`, serves until the mount ends, then
    /// unmounts and wipes the keys.
    func serve(ready: () -> Void) throws {
        defer { format.wipe() }
        do {
            try session.mount(at: target)
        } catch {
            throw CommandFailure(status: .mountFailed, message: "the kernel refused to mount \(target) (see the message above)")
        }
        logger.notice("""
            reverse view of \(settings.plaindir) mounted on \(target), read-only\
            \(settings.excludes.isEmpty ? "" : ", \(settings.excludes.count) exclude patterns")
            """)
        ready()
        SystemdNotify.send("READY=1\nSTATUS=reverse view on \(target)")
        session.run(threads: settings.threads)
        SystemdNotify.send("STOPPING=1")
        session.unmount()
        logger.notice("unmounted \(target); keys wiped")
    }
}

// MountCommand serves a vault's plaintext view: `coffer mount CIPHERDIR MOUNTPOINT`.
// Without --foreground it starts the daemon as a child and returns once the mount is
// live (or with the daemon's error and exit status).
import ArgumentParser
import CofferCrypto
import CofferFUSE
import CofferVault
import Foundation
import Glibc

struct MountCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mount",
        abstract: "Mount a vault's plaintext view at MOUNTPOINT.",
        discussion: """
            The passphrase is read from --passfile, asked on the terminal, or read from \
            standard input. The command returns once the mount is live; the daemon keeps \
            serving until `coffer unmount MOUNTPOINT`, `fusermount3 -u MOUNTPOINT`, \
            SIGTERM or SIGINT. Logs go to syslog (stderr with --foreground).
            """)

    @Option(name: .long, help: "Read the passphrase from the first line of this file.")
    var passfile: String?

    @Flag(name: .long, help: "Let other users use the mount; the kernel then enforces file modes (default_permissions).")
    var allowOther = false

    @Flag(name: .long, help: "Mount read-only.")
    var readOnly = false

    @Flag(name: .long, help: "Serve in this process instead of starting a daemon.")
    var foreground = false

    @Option(name: .customShort("o"), help: ArgumentHelp("Extra FUSE mount option (repeatable).", valueName: "option"))
    var fuseOptions: [String] = []

    @Option(name: .long, help: "Append the daemon's log lines to this file instead of syslog/stderr.")
    var logFile: String?

    @Option(name: .long, help: ArgumentHelp("Internal: descriptor on which to report the mount's status.", visibility: .private))
    var statusFD: Int32?

    @Option(name: .long, help: ArgumentHelp("Internal: descriptor from which to read the passphrase.", visibility: .private))
    var passphraseFD: Int32?

    @Argument(help: "The vault's backing directory.")
    var cipherdir: String

    @Argument(help: "An empty directory on which to mount the plaintext view.")
    var mountpoint: String

    func run() throws {
        if foreground {
            let status = StatusReport(fd: statusFD)
            do {
                try serve(status: status)
            } catch {
                let (code, message) = classify(error)
                if status.isPipe {
                    status.fail(code, message)
                } else {
                    FileHandleStandardError.write("coffer: \(message)\n")
                }
                throw ExitCode(code.rawValue)
            }
        } else {
            try runReportingFailures { try startDaemon() }
        }
    }

    // MARK: The parent

    /// Checks what can be checked here, reads the passphrase, starts the daemon with
    /// the passphrase on a pipe, and waits for its one-line status.
    private func startDaemon() throws {
        let vaultPath = MountPoint.canonical(cipherdir) ?? cipherdir
        _ = try Vault.open(at: vaultPath)
        let target = try MountPoint.checkUsable(mountpoint)
        let passphrase = try passfile.map { try PassphraseReader.fromFile($0) }
            ?? PassphraseReader.interactive(prompt: "Passphrase: ", confirm: false)
        defer { passphrase.wipe() }

        var arguments = ["coffer", "mount", "--foreground", "--status-fd", "3", "--passphrase-fd", "4"]
        if allowOther { arguments.append("--allow-other") }
        if readOnly { arguments.append("--read-only") }
        for option in fuseOptions { arguments += ["-o", option] }
        if let logFile { arguments += ["--log-file", MountPoint.canonical(logFile) ?? logFile] }
        arguments += [vaultPath, target]

        let daemon = try DaemonLauncher.spawn(arguments: arguments)
        try daemon.sendSecret(passphrase)
        let (code, message) = daemon.waitForStatus()
        guard code == 0 else {
            throw CommandFailure(status: ExitStatus(rawValue: code) ?? .failure, message: message)
        }
    }

    // MARK: The daemon

    private func serve(status: StatusReport) throws {
        ProcessHardening.disableCoreDumps()
        let log = DaemonLog.make(logFile: logFile, fallback: status.isPipe ? .syslog : .standardError)
        let vault = try Vault.open(at: cipherdir)
        let target = try MountPoint.checkUsable(mountpoint)
        let passphrase = try passphraseFD.map { try PassphraseReader.readLine($0, what: "passphrase") }
            ?? passfile.map { try PassphraseReader.fromFile($0) }
            ?? PassphraseReader.interactive(prompt: "Passphrase: ", confirm: false)
        let master = try vault.unlock(passphrase: passphrase)
        passphrase.wipe()

        let fs = try PlainFileSystem(vault: vault, options: .init(preserveOwner: allowOther && geteuid() == 0))
        fs.log = { log.write($0) }
        fs.unlock(master)

        var options = FuseSession.Options()
        options.allowOther = allowOther
        options.readOnly = readOnly
        options.extra = fuseOptions
        options.fsName = vault.path
        let session = try FuseSession(fs: fs, options: options)
        do {
            try session.mount(at: target)
        } catch {
            throw CommandFailure(status: .mountFailed, message: "the kernel refused to mount \(target) (see the message above)")
        }
        log.write("mounted \(vault.path) on \(target)")
        status.succeed()
        session.run()
        fs.lock()
        log.write("unmounted \(target); keys wiped")
    }
}

/// The daemon's side of the status pipe: one line, "0" or "<status> <message>".
struct StatusReport {
    let fd: Int32?

    var isPipe: Bool { fd != nil }

    func succeed() { send("0\n") }

    func fail(_ status: ExitStatus, _ message: String) { send("\(status.rawValue) \(message)\n") }

    private func send(_ line: String) {
        guard let fd else { return }
        var line = line
        line.withUTF8 { _ = Glibc.write(fd, $0.baseAddress, $0.count) }
        close(fd)
    }
}

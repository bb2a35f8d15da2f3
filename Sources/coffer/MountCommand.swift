// MountCommand serves a vault's plaintext view: `coffer mount CIPHERDIR MOUNTPOINT`.
// Without --foreground it starts the daemon as a child and returns once the mount is
// live (or with the daemon's error and exit status).
import ArgumentParser
import CofferCrypto
import CofferFUSE
import CofferFileSystem
import CofferGate
import CofferSystem
import CofferVault
import Foundation
import Glibc
import Logging

struct MountCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mount",
        abstract: "Mount a vault's plaintext view at MOUNTPOINT, locked until `coffer unlock`.",
        discussion: """
            The mount comes up locked: only the root can be stat'ed until `coffer unlock \
            MOUNTPOINT` gives the passphrase over the mount's control socket. With \
            --passfile or --extpass, with the systemd credential coffer.passphrase (a unit's \
            LoadCredentialEncrypted=), or with the passphrase on standard input (a pipe or a \
            file, not a terminal; an empty input means none), it is unlocked at once through \
            the same gate. The command returns \
            once the mount is live; the daemon serves until `coffer unmount MOUNTPOINT`, \
            `fusermount3 -u MOUNTPOINT`, SIGTERM or SIGINT, and wipes its keys on the way \
            out. Logs go to syslog (stderr with --foreground).
            """)

    @OptionGroup var source: PassphraseSource

    @Flag(name: .long, help: "Let other users use the mount; the kernel then enforces file modes (default_permissions).")
    var allowOther = false

    @Flag(name: .long, help: "Mount read-only.")
    var readOnly = false

    @Flag(name: .long, help: "Serve in this process instead of starting a daemon.")
    var foreground = false

    @Flag(name: .long, help: ArgumentHelp(
        "Serve a read-only, encrypted view of the plaintext directory given in CIPHERDIR's place (set up by `coffer init --reverse`), "
            + "for backups: a copy of the view is a vault that `coffer mount` opens. Unlocked at the mount with the view's passphrase."))
    var reverse = false

    @Option(name: .long, help: ArgumentHelp(
        "With --reverse: leave out the entries this fnmatch(3) pattern matches (repeatable): a pattern without / matches names "
            + "at any depth, one with / a path from the plaintext directory.",
        valueName: "pattern"))
    var exclude: [String] = []

    @Flag(name: .long, help: ArgumentHelp(
        "Once mounted, unlock with this machine's TPM (as coffer unlock --tpm2); "
            + "if that fails, the mount stays up, locked, and the exit status says why (with --foreground, the log does)."))
    var unlockTpm2 = false

    @Option(name: .customShort("o"), help: ArgumentHelp("Extra FUSE mount option (repeatable).", valueName: "option"))
    var fuseOptions: [String] = []

    @Option(name: .long, help: "Append the daemon's log lines to this file instead of syslog/stderr.")
    var logFile: String?

    @Option(name: .long, help: ArgumentHelp("Lock after this long without a file-system operation (e.g. 90s, 15m, 1h).", valueName: "duration"))
    var idleLock: String?

    @Option(name: .long, help: ArgumentHelp(
        "Announce an idle, screen or suspend lock (and `coffer lock --grace`) this long before it comes, "
            + "so that programs subscribed to `coffer events` can save (at most 60s; default 0: at once).",
        valueName: "duration"))
    var lockGrace: String?

    @Option(name: .long, help: ArgumentHelp(
        "Lock when the desktop session does: screen (logind's screen lock of one of your sessions), "
            + "suspend (before the machine sleeps, which waits for it); both as screen,suspend. "
            + "Announced with --lock-grace (before a suspend, at most half of logind's InhibitDelayMaxSec).",
        valueName: "screen,suspend"))
    var lockOn: [String] = []

    @Flag(name: .long, help: ArgumentHelp(
        "With --lock-on suspend: the lock before a suspend keeps the after-first-unlock class's keys (format 8), "
            + "as `coffer lock` does; by default a suspend drops them, as `coffer lock --all`."))
    var suspendKeepsAfterFirstUnlock = false

    @Option(name: .long, help: ArgumentHelp("Worker threads serving requests (1…64; default 8, or 2 per core above 4 cores).", valueName: "n"))
    var threads: Int = FuseSession.defaultThreads

    @Option(name: .long, help: "Control socket path (default: derived from MOUNTPOINT in the user's runtime directory).")
    var socket: String?

    @Option(name: .customLong("transport"), help: ArgumentHelp(
        "How requests reach the daemon: classic (/dev/fuse), "
            + "uring (FUSE over io_uring, Linux 6.14+ with the fuse module's enable_uring set; refused elsewhere), "
            + "or auto: uring where the kernel offers it, else classic. Default: $COFFER_TRANSPORT, else auto.",
        valueName: "transport"))
    var givenTransport: FuseSession.Transport?

    /// The transport asked for: --transport, else COFFER_TRANSPORT, else auto (io_uring
    /// only where an administrator has switched it on in the kernel).
    var transport: FuseSession.Transport {
        givenTransport ?? getenv("COFFER_TRANSPORT").flatMap { FuseSession.Transport(rawValue: String(cString: $0)) } ?? .auto
    }

    @Option(name: .long, help: ArgumentHelp(
        "This machine's private directory for the vault's crash state (the undo journal); "
            + "default: one per vault in /var/lib/coffer for root, else in $XDG_STATE_HOME/coffer (~/.local/state/coffer). "
            + "Never inside CIPHERDIR.",
        valueName: "dir"))
    var stateDir: String?

    @Option(name: .long, help: ArgumentHelp(
        "Watch at most this many backing directories for changes other programs make "
            + "(default: as many as the kernel allows; 0: none, and every name is then cached for 1 s only).",
        valueName: "n"))
    var watchLimit: Int?

    @Option(name: .long, help: ArgumentHelp("Internal: descriptor on which to report the mount's status.", visibility: .private))
    var statusFD: Int32?

    @Option(name: .long, help: ArgumentHelp("Internal: descriptor from which to read the passphrase.", visibility: .private))
    var passphraseFD: Int32?

    @Argument(help: "The vault's backing directory (with --reverse: the plaintext directory).")
    var cipherdir: String

    @Argument(help: "An empty directory on which to mount the plaintext view.")
    var mountpoint: String

    /// Every -o option, split at commas.
    private var words: [String] { fuseOptions.flatMap { $0.split(separator: ",").map(String.init) } }

    /// -o read_ahead_kb=N is coffer's, not libfuse's: the mount's readahead window.
    static let readAheadOption = "read_ahead_kb="
    /// The largest window -o read_ahead_kb takes: the largest READ request the mount takes.
    static let readAheadLimitKiB = 1024

    /// What -o read_ahead_kb asks for (the last one given), or nil.
    private var readAheadKiB: Int? {
        words.last { $0.hasPrefix(Self.readAheadOption) }.flatMap { Int($0.dropFirst(Self.readAheadOption.count)) }
    }

    /// The -o words for libfuse: all but coffer's own.
    private var libfuseWords: [String] { words.filter { !$0.hasPrefix(Self.readAheadOption) } }

    /// "1st", "2nd", "3rd", "4th"… for messages.
    static func ordinal(_ n: Int) -> String {
        let suffix = (11...13).contains(n % 100) ? "th" : [1: "st", 2: "nd", 3: "rd"][n % 10] ?? "th"
        return "\(n)\(suffix)"
    }

    func validate() throws {
        guard (1...64).contains(threads) else { throw ValidationError("--threads must be 1…64") }
        if !exclude.isEmpty && !reverse { throw ValidationError("--exclude goes with --reverse") }
        if exclude.contains("") { throw ValidationError("--exclude takes a pattern, not an empty word") }
        if reverse {
            let kept: [(Bool, String)] = [
                (idleLock != nil, "--idle-lock"), (lockGrace != nil, "--lock-grace"), (!lockOn.isEmpty, "--lock-on"),
                (unlockTpm2, "--unlock-tpm2"), (socket != nil, "--socket"), (stateDir != nil, "--state-dir"),
                (watchLimit != nil, "--watch-limit"), (givenTransport.map { $0 != .classic } ?? false, "--transport"),
                (readAheadKiB != nil, "-o read_ahead_kb"),
            ]
            if let (_, option) = kept.first(where: { $0.0 }) {
                throw ValidationError("""
                    \(option) does not go with --reverse: a reverse view has no lock and no control socket, and serves through /dev/fuse
                    """)
            }
        }
        if unlockTpm2 && source.isGiven {
            throw ValidationError("--unlock-tpm2 asks for no passphrase: give it without --passfile or --extpass")
        }
        if let watchLimit, watchLimit < 0 { throw ValidationError("--watch-limit must be 0 or more") }
        if let idleLock, parseDuration(idleLock) == nil {
            throw ValidationError("--idle-lock takes a duration such as 90s, 15m or 1h")
        }
        if let lockGrace, !(1...60).contains(parseDuration(lockGrace) ?? 0) {
            throw ValidationError("--lock-grace takes a duration of 1s to 60s, such as 10s")
        }
        if LockTrigger.parse(lockOn) == nil {
            throw ValidationError("--lock-on takes screen, suspend, or both (screen,suspend)")
        }
        if suspendKeepsAfterFirstUnlock && !(LockTrigger.parse(lockOn) ?? []).contains(.suspend) {
            throw ValidationError("--suspend-keeps-after-first-unlock goes with --lock-on suspend")
        }
        // allow_other alone would let every user past the owner's file modes: only
        // --allow-other, which adds default_permissions, may let others in.
        if words.contains("allow_other") {
            throw ValidationError(
                "-o allow_other is refused: use --allow-other, which also makes the kernel enforce file modes (default_permissions)")
        }
        if let secret = words.first(where: { MountHelperCommand.isInlineSecret($0) }) {
            throw ValidationError(
                "-o \(MountHelperCommand.named(secret)) is refused: a secret never goes in mount options; use --passfile or --extpass")
        }
        if let value = getenv("COFFER_TRANSPORT").map({ String(cString: $0) }), givenTransport == nil,
           FuseSession.Transport(rawValue: value) == nil {
            throw ValidationError("COFFER_TRANSPORT=\(value): not a transport (auto, uring or classic)")
        }
        if let value = getenv(AESEngine.environmentVariable).map({ String(cString: $0) }), AESEngine(rawValue: value) == nil {
            throw ValidationError("\(AESEngine.environmentVariable)=\(value): not an AES engine (libsodium or ipsec-mb)")
        }
        // coffer's mounts are of type fuse.coffer: `coffer unmount` and umount(8) find them so.
        if words.contains(where: { $0 == "subtype" || $0.hasPrefix("subtype=") }) {
            throw ValidationError(
                "-o subtype=… is refused: coffer gives its mounts the type fuse.coffer, by which `coffer unmount` recognises them")
        }
        if let given = words.last(where: { $0.hasPrefix(Self.readAheadOption) }) {
            guard let kib = readAheadKiB, (0...Self.readAheadLimitKiB).contains(kib) else {
                throw ValidationError("-o \(given): read_ahead_kb takes a number of KiB from 0 to \(Self.readAheadLimitKiB)")
            }
            guard geteuid() == 0 else {
                throw ValidationError("""
                    -o read_ahead_kb is for a mount made by root (it sets the mount's readahead in /sys/class/bdi, which only root \
                    may write); an ordinary user's mount keeps the kernel's 128 KiB
                    """)
            }
        }
        // Word by word, so that a message names the one refused; a bare word is not
        // repeated (it may be a secret typed in the wrong place), only where it stands.
        if let index = words.firstIndex(where: { !$0.hasPrefix(Self.readAheadOption) && !FuseSession.refusedOptions([$0]).isEmpty }) {
            let word = words[index]
            let named = word.contains("=") ? "-o \(MountHelperCommand.named(word))"
                : "the \(Self.ordinal(index + 1)) -o option (not repeated here, in case it is a secret)"
            throw ValidationError("\(named): not a mount option libfuse accepts")
        }
    }

    /// True if standard input is a pipe or a file: a passphrase given non-interactively.
    static var standardInputCarriesSecret: Bool {
        var st = stat()
        guard fstat(0, &st) == 0 else { return false }
        return st.st_mode & S_IFMT == S_IFIFO || st.st_mode & S_IFMT == S_IFREG
    }

    /// With --transport uring, refuses a kernel or process that cannot have it.
    static func checkTransport(_ transport: FuseSession.Transport) throws {
        guard transport == .uring, let reason = FuseSession.uringUnavailableReason() else { return }
        throw CommandFailure(status: .transportUnavailable, message: "--transport uring: \(reason)")
    }

    /// The passphrase given with the mount, in this order: --passfile or --extpass, the
    /// systemd credential, standard input when it is a pipe or a file; nil for none.
    private func givenPassphrase() throws -> SecureBytes? {
        try source.read() ?? SystemdCredential.passphrase()
            ?? (Self.standardInputCarriesSecret ? PassphraseReader.readOptionalLine(0, what: "passphrase") : nil)
    }

    func run() throws {
        signal(SIGPIPE, SIG_IGN)
        if foreground {
            let status = StatusReport(fd: statusFD)
            do {
                try serve(status: status)
            } catch {
                let (code, message) = classify(error)
                if !status.fail(code, message) { FileHandleStandardError.write("coffer: \(message)\n") }
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
        try (reverse ? Vault.openReverse(at: vaultPath) : Vault.open(at: vaultPath)).checkCipherAvailable()
        let target = try MountPoint.checkUsable(mountpoint)
        if !reverse { try Self.checkTransport(transport) }
        // With --unlock-tpm2 the TPM unlocks, after the mount: no passphrase is read. A
        // reverse view cannot be mounted without one: asked for on a terminal.
        let passphrase = unlockTpm2 ? nil : try givenPassphrase() ?? (reverse ? Self.askForViewPassphrase() : nil)
        defer { passphrase?.wipe() }

        var arguments = ["coffer", "mount", "--foreground", "--status-fd", "3"]
        if passphrase != nil { arguments += ["--passphrase-fd", "4"] }
        if reverse { arguments.append("--reverse") }
        for pattern in exclude { arguments += ["--exclude", pattern] }
        if let idleLock { arguments += ["--idle-lock", idleLock] }
        if let lockGrace { arguments += ["--lock-grace", lockGrace] }
        for trigger in lockOn { arguments += ["--lock-on", trigger] }
        if suspendKeepsAfterFirstUnlock { arguments.append("--suspend-keeps-after-first-unlock") }
        if threads != FuseSession.defaultThreads { arguments += ["--threads", String(threads)] }
        if let socket { arguments += ["--socket", socket] }
        // Resolved here: the daemon does not read the environment for it.
        if !reverse { arguments += ["--transport", transport.rawValue] }
        if let watchLimit { arguments += ["--watch-limit", String(watchLimit)] }
        if let stateDir { arguments += ["--state-dir", MountPoint.canonical(stateDir) ?? stateDir] }
        if allowOther { arguments.append("--allow-other") }
        if readOnly { arguments.append("--read-only") }
        for option in fuseOptions { arguments += ["-o", option] }
        if let logFile {
            // Only the directory is resolved: a symlink in the file's place must reach the
            // daemon as one, to be refused (O_NOFOLLOW).
            let url = URL(fileURLWithPath: logFile)
            let dir = MountPoint.canonical(url.deletingLastPathComponent().path) ?? url.deletingLastPathComponent().path
            arguments += ["--log-file", dir + "/" + url.lastPathComponent]
        }
        arguments += [vaultPath, target]

        var daemon = try DaemonLauncher.spawn(arguments: arguments)
        try daemon.sendSecret(passphrase)
        let (code, message) = daemon.waitForStatus()
        guard code == 0 else {
            throw CommandFailure(status: ExitStatus(rawValue: code) ?? .failure, message: message)
        }
        if unlockTpm2 {
            let gate = try MountTarget.parse((socket.map { ["--socket", $0] } ?? []) + [target])
            do {
                _ = try gate.unlock(withSlotKeyFrom: TPM2Slots.withSlotKey)
            } catch {
                let (status, message) = classify(error)
                throw CommandFailure(status: status, message: "\(target) is mounted but stays locked: \(message)")
            }
        }
    }

    /// A reverse view's passphrase, asked for on a terminal.
    private static func askForViewPassphrase() throws -> SecureBytes {
        guard isatty(0) == 1 else { throw CommandFailure(status: .passphraseUnreadable, message: ReverseDaemon.noPassphrase) }
        return try PassphraseReader.interactive(prompt: "Passphrase: ", confirm: false)
    }

    // MARK: The daemon

    private func serve(status: StatusReport) throws {
        ProcessHardening.disableCoreDumps()
        ProcessHardening.raiseDescriptorLimit()
        // The kernel has applied the caller's umask to every mode it sends; the daemon's
        // own (UMask=0077 in the units) must not be applied a second time.
        umask(0)
        // The launcher's pipes must not reach the processes libfuse starts (fusermount3).
        for fd in [statusFD, passphraseFD].compactMap({ $0 }) { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        let log = try DaemonLog.make(logFile: logFile, fallback: status.isPipe ? .syslog : .standardError)
        LoggingSystem.bootstrap { _ in DaemonLogHandler(log) }
        // The passphrase the launcher gave on its pipe (closed after the one read), or in
        // the foreground one given here.
        let given = { () throws -> SecureBytes? in
            try passphraseFD.map { fd in
                let pipe = FileDescriptor(owning: fd)
                return try PassphraseReader.readLine(pipe.rawValue, what: "passphrase")
            } ?? (status.isPipe ? nil : givenPassphrase())
        }
        if reverse {
            let daemon = try ReverseDaemon(.init(plaindir: cipherdir, mountpoint: mountpoint, excludes: exclude, allowOther: allowOther,
                                                 fuseOptions: libfuseWords, threads: threads),
                                           logger: Logger(label: "coffer"), passphrase: given)
            return try daemon.serve(ready: { status.succeed() })
        }
        let settings = Daemon.Settings(cipherdir: cipherdir, mountpoint: mountpoint, socket: socket, stateDir: stateDir,
                                       allowOther: allowOther, readOnly: readOnly, fuseOptions: libfuseWords,
                                       transport: transport, threads: threads, watchLimit: watchLimit,
                                       idleLock: idleLock.flatMap(parseDuration), lockGrace: lockGrace.flatMap(parseDuration),
                                       lockOn: lockOn, suspendKeepsAfterFirstUnlock: suspendKeepsAfterFirstUnlock,
                                       readAheadKiB: readAheadKiB)
        let daemon = try Daemon(settings, logger: Logger(label: "coffer")) { vault in
            let passphrase = try given()
            defer { passphrase?.wipe() }
            return try passphrase.map { try vault.unlock(passphrase: $0, derive: KDFHelper.derive) }
        }
        try daemon.serve(ready: {
            status.succeed()
            if unlockTpm2 { Self.unlockWithTPM(mountpoint: mountpoint, socket: socket) }
        })
    }

    /// --foreground --unlock-tpm2 (a systemd unit's mount): once the mount is up, a child
    /// `coffer unlock --tpm2` unlocks it, as the command that starts a daemon does: the
    /// daemon itself never loads libtss2. Its outcome goes to the log; the mount serves
    /// meanwhile, and stays locked if the TPM does not open it.
    private static func unlockWithTPM(mountpoint: String, socket: String?) {
        let logger = Logger(label: "coffer")
        let arguments = ["coffer", "unlock", "--tpm2"] + (socket.map { ["--socket", $0] } ?? []) + [mountpoint]
        BackgroundThread.start("coffer-tpm2") {
            do {
                let (status, errors) = try ChildProcess.run("/proc/self/exe", arguments)
                if status.succeeded {
                    logger.notice("unlocked with this machine's TPM at mount (--unlock-tpm2)")
                } else {
                    let why = errors.trimmingCharacters(in: .whitespacesAndNewlines)
                    logger.error("""
                        --unlock-tpm2: the mount stays locked: coffer unlock --tpm2 exited \(status.exitStatus)\
                        \(why.isEmpty ? "" : " (\(why))")
                        """)
                }
            } catch {
                logger.error("--unlock-tpm2: the mount stays locked: coffer unlock --tpm2 could not be started (\(error))")
            }
        }
    }
}

extension FuseSession.Transport: ExpressibleByArgument {}

// InitCommand creates a new vault: `coffer init [--passfile F | --extpass CMD] [--recovery-key-out F] CIPHERDIR`.
import ArgumentParser
import CofferCrypto
import CofferSystem
import CofferVault
import Glibc

struct InitCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init",
        abstract: "Create a new vault in an empty directory.",
        discussion: """
            Asks for a passphrase twice (without echo) on a terminal; otherwise reads the first \
            line of --passfile, of --extpass's output, or of standard input. Prints a \
            recovery key once: it opens the vault if the passphrase is lost. Keep it somewhere safe, away from the vault.
            """)

    @OptionGroup var source: PassphraseSource

    @Option(name: .long, help: "Write the recovery key to this new file (mode 0600) instead of printing it.")
    var recoveryKeyOut: String?

    @Option(name: .long, help: ArgumentHelp(
        "Argon2id passes (default \(KDFParameters.standard.opsLimit), minimum \(KDFParameters.floor.opsLimit)).",
        visibility: .hidden))
    var kdfOps: UInt64 = KDFParameters.standard.opsLimit

    @Option(name: .long, help: ArgumentHelp(
        "Argon2id memory in MiB (default \(KDFParameters.standard.memLimit >> 20), minimum \(KDFParameters.floor.memLimit >> 20)).",
        visibility: .hidden))
    var kdfMemory: UInt64 = KDFParameters.standard.memLimit >> 20

    @Option(name: .long, help: ArgumentHelp(
        "Content cipher: aes256gcm (the default where the CPU has AES-NI, "
            + "as this one \(ContentAlgorithm.aes256gcm.isAvailable ? "does" : "does not")) or xchacha20-poly1305 (everywhere).",
        valueName: "cipher"))
    var cipher: ContentAlgorithm = .preferred

    @Option(name: .long, help: ArgumentHelp(
        "Format version of the new vault (default: \(VaultConfig.currentFormat), which has protection classes, "
            + "binds each file's content, each directory's IV and each file made while locked to its place "
            + "and authenticates a file's length; 6, 5, 4, 3 and 2 for a machine whose coffer knows only those, "
            + "1 refuses symlink targets over \(SymlinkCodec.maxInlineTargetLength) bytes, as coffers before version 2 need).",
        visibility: .hidden))
    var format: Int?

    @Flag(name: .long, help: ArgumentHelp(
        "Set up a reverse view of the plaintext directory given in CIPHERDIR's place: its config goes into it "
            + "(\(ReverseFormat.configName)), and `coffer mount --reverse` serves the view."))
    var reverse = false

    @Argument(help: "The empty directory that will hold the encrypted files (with --reverse: the plaintext directory).")
    var cipherdir: String

    func validate() throws {
        if reverse, let format, format != ReverseFormat.format {
            throw ValidationError("--format goes without --reverse: a reverse view is format \(ReverseFormat.format)")
        }
        let newest = VaultConfig.supportedFormats.upperBound
        if let format, !(VaultConfig.minimumFormat(for: cipher)...newest).contains(format) {
            throw ValidationError(
                "--format must be \(VaultConfig.minimumFormat(for: cipher))…\(newest) with the cipher \(cipher.rawValue)")
        }
        let kdf = KDFParameters(opsLimit: kdfOps, memLimit: kdfMemory << 20)
        guard kdf.isAcceptable else {
            throw ValidationError("--kdf-ops must be \(KDFParameters.floor.opsLimit)…\(KDFParameters.ceiling.opsLimit) "
                                  + "and --kdf-memory \(KDFParameters.floor.memLimit >> 20)…\(KDFParameters.ceiling.memLimit >> 20) MiB")
        }
    }

    func run() throws {
        try runReportingFailures {
            // Check the directory and the cipher before asking for a passphrase.
            if reverse {
                try Vault.checkReverseCreatable(at: cipherdir)
            } else {
                try Vault.checkCreatable(at: cipherdir)
            }
            guard cipher.isAvailable else { throw VaultError.cipherUnavailable(cipher.rawValue) }
            // Create the recovery-key file before the vault: failing afterwards would
            // leave a vault whose recovery key nobody saw.
            let keyFile: FileDescriptor?
            if let out = recoveryKeyOut {
                do {
                    keyFile = try FileDescriptor.open(out, flags: O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode: 0o600)
                } catch let error as Errno {
                    throw CommandFailure(status: .recoveryKeyUnwritable,
                                         message: "cannot create \(out): \(error.text)")
                }
            } else {
                keyFile = nil
            }
            var created = false
            // Only a file this run created is removed (it is closed afterwards, with keyFile).
            defer { if !created, let out = recoveryKeyOut { unlink(out) } }
            let passphrase = try source.read()
                ?? PassphraseReader.interactive(prompt: "New passphrase: ", confirm: true)
            let kdf = KDFParameters(opsLimit: kdfOps, memLimit: kdfMemory << 20)
            let recoveryKey = reverse ? try Vault.createReverse(at: cipherdir, passphrase: passphrase, kdf: kdf, cipher: cipher)
                : try Vault.create(at: cipherdir, passphrase: passphrase, kdf: kdf, cipher: cipher, format: format).recoveryKey
            passphrase.wipe()
            let made = reverse ? "Set up a reverse view of \(cipherdir) (its config: \(ReverseFormat.configName))" : "Created vault \(cipherdir)"
            let text = RecoveryKey.format(recoveryKey)
            recoveryKey.wipe()
            defer { text.wipe() }
            switch keyFile {
            case .some(let keyFD):
                try writeSecretLine(text, to: keyFD.rawValue)
                guard fsync(keyFD.rawValue) == 0 else { throw Errno.current("fsync \(recoveryKeyOut!)") }
                created = true
                print("\(made). Recovery key written to \(recoveryKeyOut!).")
            case .none:
                created = true
                print("\(made).")
                print("Recovery key (shown only once; it opens the vault if the passphrase is lost):")
                fflush(nil)  // every stream: stdout before the raw write to fd 1 (stdout itself is a C global Swift 6 refuses)
                try writeSecretLine(text, to: 1)
            }
        }
    }
}

extension ContentAlgorithm: ExpressibleByArgument {
    public init?(argument: String) { self.init(rawValue: argument) }
    public static var allValueStrings: [String] { allCases.map(\.rawValue) }
}

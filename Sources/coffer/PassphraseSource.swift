// PassphraseSource is the pair of options that give a passphrase without a terminal,
// --passfile FILE and --extpass CMD, shared by every command that asks for one.
import ArgumentParser
import CofferCrypto

struct PassphraseSource: ParsableArguments {
    @Option(name: .long, help: "Read the passphrase from the first line of this file.")
    var passfile: String?

    @Option(name: .long, parsing: .unconditionalSingleValue, help: ArgumentHelp("""
        Run this command and read the passphrase from the first line of its output \
        (no shell: split at spaces; repeat the option to give each argument whole).
        """, valueName: "command"))
    var extpass: [String] = []

    func validate() throws {
        if passfile != nil && !extpass.isEmpty {
            throw ValidationError("give --passfile or --extpass, not both")
        }
        if !extpass.isEmpty && ExternalPassphrase.argv(extpass).isEmpty {
            throw ValidationError("--extpass needs a command, such as --extpass 'secret-tool lookup coffer private'")
        }
    }

    /// Whether --passfile or --extpass was given.
    var isGiven: Bool { passfile != nil || !extpass.isEmpty }

    /// Refuses a passphrase option beside --recovery-key-file.
    func validate(recoveryKeyFile: String?) throws {
        if isGiven && recoveryKeyFile != nil {
            throw ValidationError("give --passfile, --extpass or --recovery-key-file, not two of them")
        }
    }

    /// The passphrase from --passfile or --extpass, nil if neither was given.
    func read() throws -> SecureBytes? {
        if let passfile { return try PassphraseReader.fromFile(passfile) }
        if !extpass.isEmpty { return try ExternalPassphrase.read(extpass) }
        return nil
    }
}

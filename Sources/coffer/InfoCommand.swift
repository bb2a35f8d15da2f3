// InfoCommand shows a vault's public parameters: `coffer info CIPHERDIR`. Never a secret.
import ArgumentParser
import CofferVault

struct InfoCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "info",
        abstract: "Show a vault's format, cipher and key-derivation parameters (no secrets).")

    @Argument(help: "The vault's backing directory.")
    var cipherdir: String

    func run() throws {
        try runReportingFailures {
            let config = try Vault.open(at: cipherdir).config
            print("""
                Vault:          \(cipherdir)
                Format version: \(config.format)
                Content cipher: \(config.contentCipher), \(config.blockSize)-byte blocks
                Names:          BLAKE2b-SIV + XChaCha20, per-directory IV, base64url
                Key derivation: \(config.kdf.algorithm), \(config.kdf.opsLimit) passes, \(config.kdf.memLimit >> 20) MiB
                Key slots:      \(config.slots.map(\.kind).joined(separator: ", "))
                Created:        \(config.created)
                """)
        }
    }
}

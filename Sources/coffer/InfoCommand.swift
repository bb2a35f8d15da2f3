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
            let vault = try Vault.open(at: cipherdir)
            let config = vault.config
            let copies = vault.configConflictCopies()
            let classes = config.hasProtectionClasses ? "complete (default), unless-open: per directory (coffer protect)"
                : "complete (format \(config.format) has no other protection class)"
            print("""
                Vault:          \(cipherdir)
                Format version: \(config.format)
                Content cipher: \(config.contentCipher), \(config.blockSize)-byte blocks
                Names:          BLAKE2b-SIV + XChaCha20, per-directory IV, base64url
                Key derivation: \(config.kdf.algorithm), \(config.kdf.opsLimit) passes, \(config.kdf.memLimit >> 20) MiB
                Key slots:      \(config.slots.map(\.kind).joined(separator: ", "))
                Protection:     \(classes)
                Created:        \(config.created)
                """)
            if !copies.isEmpty {
                // A passphrase changed on two machines before they synced.
                let names = copies.map(\.name).joined(separator: ", ")
                print("""
                    Config copies:  \(copies.count) conflict cop\(copies.count == 1 ? "y" : "ies") of coffer.conf (\(names)):
                                    the passphrase was changed on two machines; either passphrase unlocks
                                    until `coffer passwd` sets one and removes the copies
                    """)
            }
        }
    }
}

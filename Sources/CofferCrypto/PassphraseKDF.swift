// PassphraseKDF turns a passphrase into a key-wrapping key with Argon2id (crypto_pwhash).
import CSodium

/// Argon2id cost parameters. They are stored in the vault config and authenticated
/// with it; `floor` is enforced on load so an edited config cannot weaken them.
public struct KDFParameters: Equatable, Sendable {
    /// Passes over memory (crypto_pwhash opslimit).
    public var opsLimit: UInt64
    /// Memory in bytes (crypto_pwhash memlimit).
    public var memLimit: UInt64

    public init(opsLimit: UInt64, memLimit: UInt64) {
        self.opsLimit = opsLimit
        self.memLimit = memLimit
    }

    /// Defaults for new vaults: 3 passes over 256 MiB, libsodium's "moderate" level.
    /// Measured at about 0.6 s on this project's 2-core build machine.
    public static let standard = KDFParameters(opsLimit: 3, memLimit: 256 << 20)

    /// The lowest parameters a vault may have: libsodium's "interactive" level,
    /// 2 passes over 64 MiB. Anything lower in a config is refused.
    public static let floor = KDFParameters(opsLimit: 2, memLimit: 64 << 20)

    /// Upper bounds so that a hostile config cannot make unlock exhaust the machine.
    public static let ceiling = KDFParameters(opsLimit: 64, memLimit: 4 << 30)

    /// True if these parameters are at least the floor and at most the ceiling.
    public var isAcceptable: Bool {
        opsLimit >= Self.floor.opsLimit && memLimit >= Self.floor.memLimit
            && opsLimit <= Self.ceiling.opsLimit && memLimit <= Self.ceiling.memLimit
    }
}

public enum PassphraseKDF {
    /// Salt size in bytes (crypto_pwhash_SALTBYTES, 128 bits).
    public static let saltSize = Int(crypto_pwhash_SALTBYTES)
    /// Name of the algorithm as stored in the config.
    public static let algorithmName = "argon2id13"

    /// Derives a 32-byte key from `passphrase` with Argon2id v1.3.
    public static func deriveKey(passphrase: SecureBytes, salt: [UInt8],
                                 parameters: KDFParameters) throws -> SecureBytes {
        Sodium.ensureInitialized()
        guard salt.count == saltSize else { throw CryptoError.malformed(what: "KDF salt") }
        let key = SecureBytes(count: MasterKey.size)
        let rc = passphrase.withUnsafeBytes { pass in
            pass.withMemoryRebound(to: CChar.self) { passChars in
                crypto_pwhash(key.bytes, UInt64(key.count), passChars.baseAddress!,
                              UInt64(pass.count), salt, parameters.opsLimit,
                              Int(parameters.memLimit), crypto_pwhash_ALG_ARGON2ID13)
            }
        }
        guard rc == 0 else { throw CryptoError.kdfFailed }
        return key
    }
}

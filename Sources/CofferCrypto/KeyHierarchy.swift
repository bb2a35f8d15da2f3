// KeyHierarchy derives the per-purpose subkeys from the master key (crypto_kdf).
import CSodium

/// What a subkey is for. The raw value is the crypto_kdf subkey id; changing one
/// changes the on-disk format (docs/FORMAT.md, "Key hierarchy").
public enum SubkeyPurpose: UInt64, CaseIterable, Sendable {
    /// Key for file content blocks (XChaCha20-Poly1305, or the root of AES-256-GCM's per-file keys).
    case content = 1
    /// BLAKE2b key computing the synthetic IV of file names.
    case nameMAC = 2
    /// XChaCha20 key encrypting file names.
    case nameStream = 3
    /// XChaCha20-Poly1305 key for metadata: symlink targets and xattr values.
    case metadata = 4
    /// BLAKE2b key computing the synthetic IV of xattr names.
    case xattrNameMAC = 5
    /// XChaCha20 key encrypting xattr names.
    case xattrNameStream = 6
    /// BLAKE2b key binding a file's content to its place (format 4).
    case place = 7
    /// X25519 secret key of the files dropped while locked (format 6, DropKeys).
    case drop = 8
}

/// The master key: 32 random bytes in secure memory. It only ever exists unwrapped
/// between unlock and the derivation of the subkeys.
public final class MasterKey: Sendable {
    /// Size of the master key and of every subkey, in bytes (256 bits).
    public static let size = 32
    /// crypto_kdf context: exactly 8 bytes, names the format generation.
    static let kdfContext: [CChar] = Array("coffer01".utf8CString)

    public let secret: SecureBytes

    /// Takes ownership of `secret`, which must hold exactly 32 bytes.
    public init(secret: SecureBytes) {
        precondition(secret.count == MasterKey.size)
        self.secret = secret
    }

    /// A fresh random master key for a new vault.
    public static func generate() -> MasterKey { MasterKey(secret: .random(count: size)) }

    /// The subkey for `purpose` (crypto_kdf_derive_from_key, BLAKE2b-based).
    public func subkey(_ purpose: SubkeyPurpose) -> SecureBytes {
        let sub = SecureBytes(count: MasterKey.size)
        let rc = MasterKey.kdfContext.withUnsafeBufferPointer { context in
            crypto_kdf_derive_from_key(sub.bytes, MasterKey.size, purpose.rawValue,
                                       context.baseAddress!, secret.bytes)
        }
        // The subkey is also in blake2b_final's dead frame (coffer_scrub_stack says why).
        coffer_scrub_stack()
        precondition(rc == 0, "crypto_kdf_derive_from_key failed")
        return sub
    }

    /// Zeroes the master key now rather than when the last reference goes.
    public func wipe() { secret.wipe() }
}

/// Every key the vault needs at run time, derived once at unlock. The master key
/// itself is not kept: only these subkeys stay in memory while unlocked.
public final class KeySet: Sendable {
    public let content: ContentCipher
    public let names: NameCipher
    public let xattrNames: NameCipher
    public let metadata: SealedBox
    public let places: PlaceMAC
    /// The key pair that files dropped while locked are sealed to (format 6), else nil.
    public let drops: DropKeys?

    /// `perFileKeys`: the vault's format seals each file under a key of its own and has
    /// drops (format 6).
    public init(master: MasterKey, content algorithm: ContentAlgorithm, perFileKeys: Bool = false) {
        content = ContentCipher(key: master.subkey(.content), algorithm: algorithm, perFileKeys: perFileKeys)
        drops = perFileKeys ? DropKeys(secret: master.subkey(.drop)) : nil
        names = NameCipher(macKey: master.subkey(.nameMAC), streamKey: master.subkey(.nameStream))
        xattrNames = NameCipher(macKey: master.subkey(.xattrNameMAC),
                                streamKey: master.subkey(.xattrNameStream))
        metadata = SealedBox(key: master.subkey(.metadata))
        places = PlaceMAC(key: master.subkey(.place))
    }

    /// Zeroes every subkey, also while operations still hold this KeySet: their next
    /// use of a key throws `CryptoError.keyRetired` instead of computing with zeros.
    public func wipe() {
        content.key.retire()
        names.wipe()
        xattrNames.wipe()
        metadata.key.retire()
        places.key.retire()
        drops?.secret.retire()
    }
}

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
    /// Root of the after-first-unlock domain's subkeys (format 8, KeyDomain): derived
    /// from the master key only, never used as a key itself.
    case afterFirstUnlock = 9
    /// The key of a reverse view's derivations (docs/FORMAT.md §14, ReverseKey): its
    /// directory IVs, entry IDs and nonces. Only the view uses it.
    case reverse = 10
}

/// Which keys an inode's names, tags, file keys and records use (format 8, docs/FORMAT.md
/// §12): a directory of class after-first-unlock is in the AFU domain, every other one in
/// the vault domain; a file, symlink or other entry is in its directory's.
public enum KeyDomain: Sendable, Hashable {
    /// The master key's own subkeys (every directory of every format up to 7).
    case vault
    /// The subkeys derived from subkey 9: kept through every lock but `lock --all`.
    case afterFirstUnlock
}

/// The master key: 32 random bytes in secure memory. It only ever exists unwrapped
/// between unlock and the derivation of the subkeys.
public final class MasterKey: Sendable {
    /// Size of the master key and of every subkey, in bytes (256 bits).
    public static let size = 32
    /// crypto_kdf context of the vault domain: exactly 8 bytes, names the format generation.
    static let kdfContext = "coffer01"
    /// crypto_kdf context of the after-first-unlock domain's subkeys (format 8).
    static let afterFirstUnlockContext = "cofferAF"

    public let secret: SecureBytes
    /// The crypto_kdf context `subkey` derives with.
    let context: [CChar]

    /// Takes ownership of `secret`, which must hold exactly 32 bytes.
    public convenience init(secret: SecureBytes) {
        self.init(secret: secret, context: MasterKey.kdfContext)
    }

    private init(secret: SecureBytes, context: String) {
        precondition(secret.count == MasterKey.size && context.utf8.count == 8)
        self.secret = secret
        self.context = Array(context.utf8CString)
    }

    /// The root of `domain`'s subkeys: this key itself for the vault domain; for the AFU
    /// domain (format 8) subkey 9, whose subkeys are derived under the context "cofferAF".
    /// `subkey` of the result gives the domain's keys by the same purposes (1–7).
    public func root(of domain: KeyDomain) -> MasterKey {
        switch domain {
        case .vault: return self
        case .afterFirstUnlock: return MasterKey(secret: subkey(.afterFirstUnlock), context: MasterKey.afterFirstUnlockContext)
        }
    }

    /// A fresh random master key for a new vault.
    public static func generate() -> MasterKey { MasterKey(secret: .random(count: size)) }

    /// The subkey for `purpose` (crypto_kdf_derive_from_key, BLAKE2b-based).
    public func subkey(_ purpose: SubkeyPurpose) -> SecureBytes {
        let sub = SecureBytes(count: MasterKey.size)
        let rc = self.context.withUnsafeBufferPointer { context in
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
    /// `drops` (with `perFileKeys`): the key pair of files made while locked (false for
    /// the after-first-unlock domain, format 8).
    public init(master: MasterKey, content algorithm: ContentAlgorithm, perFileKeys: Bool = false, drops withDrops: Bool = true) {
        content = ContentCipher(key: master.subkey(.content), algorithm: algorithm, perFileKeys: perFileKeys)
        drops = perFileKeys && withDrops ? DropKeys(secret: master.subkey(.drop)) : nil
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

// SymlinkCodec stores a symlink's target as the backing symlink's target:
// base64url(nonce ‖ XChaCha20-Poly1305(target, AD = "coffer.symlink") ‖ tag); from format 2
// on, a target too long for that is kept in a sidecar file at the vault root, which the
// backing symlink names.
import CofferCrypto
import CofferSystem
import Glibc

public struct SymlinkCodec: Sendable {
    /// Associated data of every sealed symlink target.
    static let associatedData = Array("coffer.symlink".utf8)
    /// Longest backing symlink target Linux stores (PATH_MAX - 1).
    static let maxBackingLength = 4095
    /// Longest plaintext target stored in the backing symlink itself: 4095 base64 chars
    /// carry 3071 bytes, minus 40 overhead. The only limit of format 1.
    public static let maxInlineTargetLength = maxBackingLength * 3 / 4 - SealedBox.overhead
    /// Longest plaintext target Linux accepts (PATH_MAX - 1).
    public static let maxTargetLength = 4095
    /// Prefix of the sidecar of a long target; '.' never occurs in base64url.
    public static let sidecarPrefix = "coffer.target."
    /// Length of a backing target that names a sidecar: the prefix and a 32-byte hash in
    /// base64url. 57 ≡ 1 (mod 4), a length no base64url text has, so st_size tells.
    package static let referenceLength = sidecarPrefix.utf8.count + 43
    /// Longest sidecar: a 4095-byte target sealed and encoded.
    static let maxSidecarLength = (maxTargetLength + SealedBox.overhead + 2) / 3 * 4

    /// How a target is stored.
    public enum Stored: Equatable {
        /// In the backing symlink.
        case inline(String)
        /// In the sidecar file `reference` at the vault root; the backing symlink holds `reference`.
        case sidecar(reference: String, content: String)

        /// The backing symlink's target.
        public var linkTarget: String {
            switch self {
            case .inline(let stored): return stored
            case .sidecar(let reference, _): return reference
            }
        }
    }

    private let box: SealedBox
    /// Whether targets too long for the backing symlink go into a sidecar (format 2).
    public let longTargets: Bool

    public init(box: SealedBox, longTargets: Bool = false) {
        self.box = box
        self.longTargets = longTargets
    }

    /// How plaintext `target` is stored; `nonce` only for test vectors and `reseal`.
    public func encrypt(_ target: [UInt8], nonce: [UInt8]? = nil) throws -> Stored {
        guard target.count <= (longTargets ? Self.maxTargetLength : Self.maxInlineTargetLength) else {
            throw VaultError.tooLong(.symlinkTarget)
        }
        let sealed = try target.withUnsafeBytes { bytes in
            try nonce.map { try box.seal(bytes, associatedData: Self.associatedData, nonce: $0) }
                ?? box.seal(bytes, associatedData: Self.associatedData)
        }
        let stored = Base64URL.encode(sealed)
        if target.count <= Self.maxInlineTargetLength { return .inline(stored) }
        return .sidecar(reference: Self.reference(of: Array(stored.utf8)), content: stored)
    }

    /// The sidecar name for sidecar content `content`.
    static func reference(of content: [UInt8]) -> String {
        sidecarPrefix + Base64URL.encode(Hash.blake2b256(content))
    }

    /// The plaintext target of a backing symlink target stored in the symlink itself.
    public func decrypt(_ stored: String) throws -> [UInt8] {
        do {
            return try box.openPublic(Base64URL.decode(stored), associatedData: Self.associatedData,
                                      what: "symlink target")
        } catch {
            throw VaultError.metadataDamaged(what: "symlink target")
        }
    }

    /// The plaintext target of backing symlink target `linkTarget`, reading its sidecar
    /// from `root` (the vault root) if it names one.
    public func decrypt(_ linkTarget: String, sidecarsIn root: Int32) throws -> [UInt8] {
        try decrypt(try storedTarget(linkTarget, sidecarsIn: root))
    }

    /// The stored (sealed, base64url) form of backing symlink target `linkTarget`: the
    /// target itself, or its sidecar's content.
    private func storedTarget(_ linkTarget: String, sidecarsIn root: Int32) throws -> String {
        guard let reference = sidecar(of: linkTarget) else { return linkTarget }
        guard let content = try? Sys.readFile(reference, in: root, limit: Self.maxSidecarLength),
              Self.reference(of: content) == reference else {
            throw VaultError.symlinkSidecarDamaged(reference: reference)
        }
        return String(decoding: content, as: UTF8.self)
    }

    /// Backing symlink target `linkTarget`, stored by `other` (the other key domain's
    /// codec), sealed anew under this codec's key with the nonce it had (format 8's
    /// conversion, docs/FORMAT.md §12): the same bytes on every machine, and the two keys
    /// differ, so no key sees a nonce twice.
    public func reseal(_ linkTarget: String, from other: SymlinkCodec, sidecarsIn root: Int32) throws -> Stored {
        let stored = try other.storedTarget(linkTarget, sidecarsIn: root)
        let target = try other.decrypt(stored)
        guard let sealed = try? Base64URL.decode(stored), sealed.count >= SealedBox.nonceSize else {
            throw VaultError.metadataDamaged(what: "symlink target")
        }
        return try encrypt(target, nonce: Array(sealed.prefix(SealedBox.nonceSize)))
    }

    /// The sidecar that backing symlink target `linkTarget` names, if it names one.
    public func sidecar(of linkTarget: String) -> String? {
        longTargets && Self.isReference(linkTarget) ? linkTarget : nil
    }

    /// Whether `linkTarget` has the shape of a sidecar's name (never a path elsewhere).
    package static func isReference(_ linkTarget: String) -> Bool {
        linkTarget.utf8.count == referenceLength && linkTarget.hasPrefix(sidecarPrefix) && !linkTarget.contains("/")
    }

    /// Writes the sidecar of a long target into `root`, durably, before the link is made
    /// (no-op for targets in the symlink). True if this call created it.
    public static func writeSidecar(_ stored: Stored, in root: Int32) throws -> Bool {
        guard case .sidecar(let reference, let content) = stored else { return false }
        return try NameTransform.writeSidecar(Array(content.utf8), named: reference, in: root)
    }

    /// Removes sidecar `reference` once no symlink names it.
    public static func removeSidecar(_ reference: String, in root: Int32) {
        try? Sys.unlink(reference, in: root)
    }

    /// Plaintext length of a symlink whose backing target is `storedLength` bytes,
    /// without decrypting it (for st_size). For a sidecar, pass the sidecar's length.
    public static func plainLength(storedLength: Int) -> Int {
        max(0, storedLength * 3 / 4 - SealedBox.overhead)
    }
}

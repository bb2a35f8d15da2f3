// SymlinkCodec stores a symlink's target as the backing symlink's target:
// base64url(nonce ‖ XChaCha20-Poly1305(target, AD = "coffer.symlink") ‖ tag).
import CofferCrypto

public struct SymlinkCodec {
    /// Associated data of every sealed symlink target.
    static let associatedData = Array("coffer.symlink".utf8)
    /// Longest backing symlink target Linux stores (PATH_MAX - 1).
    static let maxBackingLength = 4095
    /// Longest plaintext target: 4095 base64 chars carry 3071 bytes, minus 40 overhead.
    public static let maxTargetLength = maxBackingLength * 3 / 4 - SealedBox.overhead

    private let box: SealedBox

    public init(box: SealedBox) { self.box = box }

    /// The backing symlink target for plaintext `target`.
    public func encrypt(_ target: [UInt8]) throws -> String {
        guard target.count <= Self.maxTargetLength else { throw VaultError.tooLong(.symlinkTarget) }
        return Base64URL.encode(try target.withUnsafeBytes { try box.seal($0, associatedData: Self.associatedData) })
    }

    /// The plaintext target of backing symlink target `stored`.
    public func decrypt(_ stored: String) throws -> [UInt8] {
        do {
            return try box.openPublic(Base64URL.decode(stored), associatedData: Self.associatedData,
                                      what: "symlink target")
        } catch {
            throw VaultError.metadataDamaged(what: "symlink target")
        }
    }

    /// Plaintext length of a symlink whose backing target is `storedLength` bytes,
    /// without decrypting it (for st_size).
    public static func plainLength(storedLength: Int) -> Int {
        max(0, storedLength * 3 / 4 - SealedBox.overhead)
    }
}

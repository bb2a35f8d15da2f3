// DropKeys is the X25519 key pair that files made while the vault is locked are sealed
// to (format 6, docs/FORMAT.md §12): writing one needs only the public key, which the
// daemon keeps through a lock; reading it needs the secret key, which is subkey 8 of the
// master key and so exists only while unlocked. Sealing is libsodium's crypto_box_seal
// (an ephemeral X25519 key per message, XSalsa20-Poly1305).
import CSodium

public final class DropKeys: Sendable {
    /// Bytes a sealed message is longer than its plaintext (ephemeral public key ‖ tag).
    public static let overhead = Int(crypto_box_sealbytes())
    public static let publicKeySize = Int(crypto_box_publickeybytes())

    /// The secret key (subkey 8), in sodium memory.
    let secret: SecureBytes
    public let publicKey: [UInt8]

    /// The key pair of secret key `secret` (32 bytes; used as an X25519 scalar).
    public init(secret: SecureBytes) {
        precondition(secret.count == Int(crypto_box_secretkeybytes()))
        self.secret = secret
        var pk = [UInt8](repeating: 0, count: Self.publicKeySize)
        let rc = secret.withUnsafeBytes { crypto_scalarmult_base(&pk, $0.baseAddress!.assumingMemoryBound(to: UInt8.self)) }
        precondition(rc == 0, "crypto_scalarmult_base failed")
        publicKey = pk
    }

    /// Seals `plaintext` to `publicKey` (no secret needed).
    public static func seal(_ plaintext: UnsafeRawBufferPointer, to publicKey: [UInt8]) -> [UInt8] {
        precondition(publicKey.count == publicKeySize)
        Sodium.ensureInitialized()
        var out = [UInt8](repeating: 0, count: plaintext.count + overhead)
        let rc = crypto_box_seal(&out, plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plaintext.count), publicKey)
        precondition(rc == 0, "crypto_box_seal failed")
        return out
    }

    /// Opens a message sealed to this key pair into secret memory; throws
    /// `sealedAuthenticationFailed(what:)` if it was not, or was changed.
    public func open(_ sealed: [UInt8], what: String) throws -> SecureBytes {
        guard sealed.count >= Self.overhead else { throw CryptoError.malformed(what: what) }
        let plain = SecureBytes(count: sealed.count - Self.overhead)
        let rc = try secret.lend { sk in
            crypto_box_seal_open(plain.bytes, sealed, UInt64(sealed.count), publicKey, sk)
        }
        guard rc == 0 else { throw CryptoError.sealedAuthenticationFailed(what: what) }
        return plain
    }
}

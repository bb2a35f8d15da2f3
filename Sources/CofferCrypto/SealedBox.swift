// SealedBox seals small blobs (wrapped keys, symlink targets, xattr values) with
// XChaCha20-Poly1305 under a random nonce: nonce ‖ ciphertext ‖ tag.
import CSodium

public struct SealedBox: Sendable {
    /// Nonce size in bytes (XChaCha20: 192 bits, safe to draw at random).
    public static let nonceSize = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    /// Poly1305 tag size in bytes.
    public static let tagSize = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)
    /// Bytes a sealed blob is longer than its plaintext.
    public static let overhead = nonceSize + tagSize

    public let key: SecureBytes

    public init(key: SecureBytes) {
        precondition(key.count == Int(crypto_aead_xchacha20poly1305_ietf_KEYBYTES))
        self.key = key
    }

    /// Seals `plaintext` with `associatedData` under a fresh random nonce.
    public func seal(_ plaintext: UnsafeRawBufferPointer, associatedData: [UInt8]) throws -> [UInt8] {
        var nonce = [UInt8](repeating: 0, count: Self.nonceSize)
        nonce.withUnsafeMutableBytes { Sodium.randomBytes($0) }
        return try seal(plaintext, associatedData: associatedData, nonce: nonce)
    }

    /// Seals deterministically: the nonce is BLAKE2b-24(key = this key, AD ‖ plaintext),
    /// so the same record sealed on two machines is the same bytes (a sync engine sees no
    /// conflict), and different records never share a nonce. Reveals only whether two
    /// records are equal; for small records whose equality is no secret.
    /// The plaintext is hashed in place (never copied: it may be a key).
    public func sealDeterministically(_ plaintext: UnsafeRawBufferPointer, associatedData: [UInt8]) throws -> [UInt8] {
        var nonce = [UInt8](repeating: 0, count: Self.nonceSize)
        // The hash state (libsodium's aligned, opaque type) holds key material: zeroed after.
        let size = crypto_generichash_statebytes()
        let memory = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 64)
        defer {
            sodium_memzero(memory, size)
            memory.deallocate()
        }
        let state = OpaquePointer(memory)
        let rc = try key.lend { key in
            crypto_generichash_init(state, key, self.key.count, Self.nonceSize)
                | crypto_generichash_update(state, associatedData, UInt64(associatedData.count))
                | crypto_generichash_update(state, plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plaintext.count))
                | crypto_generichash_final(state, &nonce, Self.nonceSize)
        }
        precondition(rc == 0, "crypto_generichash failed")
        return try seal(plaintext, associatedData: associatedData, nonce: nonce)
    }

    /// Seals with a caller-chosen nonce. Only known-answer tests may call this with a
    /// fixed nonce; production callers use `seal(_:associatedData:)`, or re-seal under
    /// another key with the nonce a blob had (format 8's key-domain conversion).
    public func seal(_ plaintext: UnsafeRawBufferPointer, associatedData: [UInt8], nonce: [UInt8]) throws -> [UInt8] {
        precondition(nonce.count == Self.nonceSize)
        var out = [UInt8](repeating: 0, count: plaintext.count + Self.overhead)
        try out.withUnsafeMutableBufferPointer { o in
            let base = o.baseAddress!
            base.update(from: nonce, count: Self.nonceSize)
            var written: UInt64 = 0
            _ = try key.lend { key in
                crypto_aead_xchacha20poly1305_ietf_encrypt(
                    base + Self.nonceSize, &written,
                    plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plaintext.count),
                    associatedData, UInt64(associatedData.count), nil, base, key)
            }
        }
        return out
    }

    /// Opens a sealed blob into a new secret buffer. `what` names it in the error.
    public func open(_ sealed: [UInt8], associatedData: [UInt8], what: String) throws -> SecureBytes {
        guard sealed.count >= Self.overhead else { throw CryptoError.malformed(what: what) }
        let plain = SecureBytes(count: sealed.count - Self.overhead)
        let rc = try sealed.withUnsafeBufferPointer { s -> Int32 in
            var written: UInt64 = 0
            return try key.lend { key in
                crypto_aead_xchacha20poly1305_ietf_decrypt(
                    plain.bytes, &written, nil, s.baseAddress! + Self.nonceSize,
                    UInt64(sealed.count - Self.nonceSize), associatedData, UInt64(associatedData.count),
                    s.baseAddress!, key)
            }
        }
        guard rc == 0 else { throw CryptoError.sealedAuthenticationFailed(what: what) }
        return plain
    }

    /// Opens a sealed blob whose plaintext is not secret (symlink target, xattr value).
    public func openPublic(_ sealed: [UInt8], associatedData: [UInt8], what: String) throws -> [UInt8] {
        let plain = try open(sealed, associatedData: associatedData, what: what)
        return plain.withUnsafeBytes { Array($0) }
    }
}

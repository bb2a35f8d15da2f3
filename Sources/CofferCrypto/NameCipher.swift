// NameCipher encrypts file names deterministically per directory with a synthetic-IV
// construction built from libsodium primitives (keyed BLAKE2b + XChaCha20).
//
//   padded = name ‖ PKCS#7 padding to a multiple of 16 bytes (always 1…16 bytes added)
//   siv    = BLAKE2b-128(key = K_mac, dirIV ‖ padded)
//   stream = XChaCha20(key = K_stream, nonce = siv ‖ 0^8)
//   out    = siv ‖ (padded ⊕ stream)
//
// The same name in the same directory always gives the same output (lookup needs no
// listing); another directory IV gives an unrelated output; any change to the output
// or to the IV makes the recomputed SIV differ, so a tampered name is refused.
import CSodium

public final class NameCipher: Sendable {
    /// Size of the directory IV mixed into every name, in bytes.
    public static let ivSize = 16
    /// Size of the synthetic IV (BLAKE2b output) at the start of every encrypted name.
    public static let sivSize = 16
    /// Padding granularity: only the length rounded up to 16 bytes leaks.
    public static let padding = 16

    let macKey: SecureBytes
    let streamKey: SecureBytes

    public init(macKey: SecureBytes, streamKey: SecureBytes) {
        precondition(macKey.count == 32 && streamKey.count == 32)
        self.macKey = macKey
        self.streamKey = streamKey
    }

    func wipe() {
        macKey.retire()
        streamKey.retire()
    }

    /// Length of the encrypted form of a plaintext name of `length` bytes.
    public static func encryptedLength(plainLength length: Int) -> Int {
        sivSize + (length / padding + 1) * padding
    }

    /// Encrypts `name` (raw bytes, any length ≥ 1) for the directory with IV `dirIV`.
    /// Padded and encrypted in the output's own buffer: one allocation per name (every
    /// lookup and new entry encrypts one).
    public func encrypt(_ name: [UInt8], dirIV: [UInt8]) throws -> [UInt8] {
        precondition(dirIV.count == Self.ivSize && !name.isEmpty)
        let padLength = Self.padding - name.count % Self.padding
        var out = [UInt8](repeating: UInt8(padLength), count: Self.sivSize + name.count + padLength)
        try out.withUnsafeMutableBufferPointer { o in
            let body = UnsafeMutableBufferPointer(rebasing: o[Self.sivSize...])
            UnsafeMutableRawBufferPointer(body).copyBytes(from: name)
            try syntheticIV(dirIV: dirIV, padded: UnsafeBufferPointer(body), into: o.baseAddress!)
            try xorStream(body, siv: o.baseAddress!)
        }
        return out
    }

    /// Decrypts and authenticates an encrypted name; throws `nameAuthenticationFailed`
    /// for anything that this key and `dirIV` did not produce.
    public func decrypt(_ encrypted: [UInt8], dirIV: [UInt8]) throws -> [UInt8] {
        precondition(dirIV.count == Self.ivSize)
        let bodyLength = encrypted.count - Self.sivSize
        guard bodyLength >= Self.padding, bodyLength % Self.padding == 0 else {
            throw CryptoError.nameAuthenticationFailed
        }
        var padded = Array(encrypted[Self.sivSize...])
        // The padded plaintext name: zeroed once the name is copied out of it.
        defer { padded.withUnsafeMutableBytes { sodium_memzero($0.baseAddress, $0.count) } }
        let ok = try encrypted.withUnsafeBufferPointer { e -> Bool in
            let siv = e.baseAddress!
            return try padded.withUnsafeMutableBufferPointer { p in
                try xorStream(p, siv: siv)
                var expected = (UInt64(0), UInt64(0))
                return try withUnsafeMutableBytes(of: &expected) { x in
                    let out = x.baseAddress!.assumingMemoryBound(to: UInt8.self)
                    try syntheticIV(dirIV: dirIV, padded: UnsafeBufferPointer(p), into: out)
                    return sodium_memcmp(out, siv, Self.sivSize) == 0
                }
            }
        }
        guard ok else { throw CryptoError.nameAuthenticationFailed }
        let padLength = Int(padded.last!)
        guard padLength >= 1, padLength <= Self.padding, padLength < padded.count,
              padded.suffix(padLength).allSatisfy({ Int($0) == padLength }) else {
            throw CryptoError.nameAuthenticationFailed
        }
        return Array(padded.dropLast(padLength))
    }

    /// BLAKE2b-128(key = K_mac, dirIV ‖ padded), hashed in two parts (no joined copy);
    /// the state, which holds the keyed chaining value, is zeroed after.
    private func syntheticIV(dirIV: [UInt8], padded: UnsafeBufferPointer<UInt8>, into out: UnsafeMutablePointer<UInt8>) throws {
        try withUnsafeTemporaryAllocation(byteCount: crypto_generichash_statebytes(), alignment: 64) { raw in
            defer { sodium_memzero(raw.baseAddress, raw.count) }
            let state = OpaquePointer(raw.baseAddress!)
            _ = try macKey.lend { crypto_generichash_init(state, $0, macKey.count, Self.sivSize) }
            crypto_generichash_update(state, dirIV, UInt64(dirIV.count))
            crypto_generichash_update(state, padded.baseAddress, UInt64(padded.count))
            crypto_generichash_final(state, out, Self.sivSize)
        }
    }

    /// XORs `buffer` in place with XChaCha20(key = K_stream, nonce = siv ‖ 0⁸).
    private func xorStream(_ buffer: UnsafeMutableBufferPointer<UInt8>, siv: UnsafePointer<UInt8>) throws {
        var nonce = (UInt64(0), UInt64(0), UInt64(0))
        try withUnsafeMutableBytes(of: &nonce) { n in
            n.copyMemory(from: UnsafeRawBufferPointer(start: siv, count: Self.sivSize))
            _ = try streamKey.lend {
                crypto_stream_xchacha20_xor(buffer.baseAddress!, buffer.baseAddress!, UInt64(buffer.count),
                                            n.baseAddress!.assumingMemoryBound(to: UInt8.self), $0)
            }
        }
    }
}

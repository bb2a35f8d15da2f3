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
    public func encrypt(_ name: [UInt8], dirIV: [UInt8]) throws -> [UInt8] {
        precondition(dirIV.count == Self.ivSize && !name.isEmpty)
        let padLength = Self.padding - name.count % Self.padding
        var padded = name
        padded.append(contentsOf: repeatElement(UInt8(padLength), count: padLength))
        var out = [UInt8](repeating: 0, count: Self.sivSize + padded.count)
        try out.withUnsafeMutableBufferPointer { o in
            try syntheticIV(dirIV: dirIV, padded: padded, into: o.baseAddress!)
            try xorStream(padded, siv: o.baseAddress!, into: o.baseAddress! + Self.sivSize)
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
        var padded = [UInt8](repeating: 0, count: bodyLength)
        let ok = try encrypted.withUnsafeBufferPointer { e -> Bool in
            let siv = e.baseAddress!
            try padded.withUnsafeMutableBufferPointer { p in
                try xorStream(Array(e[Self.sivSize...]), siv: siv, into: p.baseAddress!)
            }
            var expected = [UInt8](repeating: 0, count: Self.sivSize)
            try syntheticIV(dirIV: dirIV, padded: padded, into: &expected)
            return sodium_memcmp(expected, siv, Self.sivSize) == 0
        }
        guard ok else { throw CryptoError.nameAuthenticationFailed }
        let padLength = Int(padded.last!)
        guard padLength >= 1, padLength <= Self.padding, padLength < padded.count,
              padded.suffix(padLength).allSatisfy({ Int($0) == padLength }) else {
            throw CryptoError.nameAuthenticationFailed
        }
        return Array(padded.dropLast(padLength))
    }

    private func syntheticIV(dirIV: [UInt8], padded: [UInt8], into out: UnsafeMutablePointer<UInt8>) throws {
        let input = dirIV + padded
        _ = try macKey.lend { crypto_generichash(out, Self.sivSize, input, UInt64(input.count), $0, macKey.count) }
    }

    private func xorStream(_ input: [UInt8], siv: UnsafePointer<UInt8>, into out: UnsafeMutablePointer<UInt8>) throws {
        var nonce = [UInt8](repeating: 0, count: Int(crypto_stream_xchacha20_NONCEBYTES))
        for i in 0..<Self.sivSize { nonce[i] = siv[i] }
        _ = try streamKey.lend { crypto_stream_xchacha20_xor(out, input, UInt64(input.count), nonce, $0) }
    }
}

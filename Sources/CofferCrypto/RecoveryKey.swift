// RecoveryKey formats and parses the 256-bit recovery key that a user writes down.
import CSodium

public enum RecoveryKey {
    /// Bytes of entropy in a recovery key (256 bits, as the master key).
    public static let size = 32

    /// Formats the key as 16 groups of 4 lowercase hex digits joined by '-'
    /// (sodium_bin2hex: no branch or table lookup on the key's bytes).
    /// The result is a secret: callers print it once and drop it.
    public static func format(_ key: SecureBytes) -> SecureBytes {
        precondition(key.count == size)
        let hex = SecureBytes(count: size * 2 + 1)  // sodium_bin2hex writes a final NUL
        defer { hex.wipe() }
        hex.withUnsafeMutableBytes { h in
            key.withUnsafeBytes { k in
                _ = sodium_bin2hex(h.baseAddress!.assumingMemoryBound(to: CChar.self), h.count,
                                   k.baseAddress!.assumingMemoryBound(to: UInt8.self), k.count)
            }
        }
        let out = SecureBytes(count: size * 2 + size / 2 - 1)
        out.withUnsafeMutableBytes { o in
            hex.withUnsafeBytes { h in
                for group in 0..<size / 2 {
                    let at = group * 5
                    if group > 0 { o[at - 1] = UInt8(ascii: "-") }
                    for i in 0..<4 { o[at + i] = h[group * 4 + i] }
                }
            }
        }
        return out
    }

    /// Separators a typed recovery key may hold anywhere: '-', space, tab, CR, LF.
    private static func isSeparator(_ c: UInt8) -> Bool {
        c == UInt8(ascii: "-") || c == UInt8(ascii: " ") || c == UInt8(ascii: "\n") || c == UInt8(ascii: "\r")
            || c == UInt8(ascii: "\t")
    }

    /// Parses a recovery key typed by a user: hex digits in either case; '-', spaces
    /// and line breaks are ignored. Throws unless exactly 64 hex digits are found.
    /// The digits are decoded by sodium_hex2bin, in constant time; only whether a
    /// character is a separator is branched on (separators are not secret). They are
    /// dropped first because sodium_hex2bin's ignore set applies between bytes only,
    /// and a separator was always accepted anywhere.
    public static func parse(_ text: SecureBytes) throws -> SecureBytes {
        let digits = SecureBytes(count: text.count)
        defer { digits.wipe() }
        let count = digits.withUnsafeMutableBytes { d in
            text.withUnsafeBytes { t in
                var n = 0
                for c in t where !isSeparator(c) {
                    d[n] = c
                    n += 1
                }
                return n
            }
        }
        let key = SecureBytes(count: size)
        var decoded = 0
        var end: UnsafePointer<CChar>? = nil
        let rc = key.withUnsafeMutableBytes { k in
            digits.withUnsafeBytes { d in
                let hex = d.baseAddress!.assumingMemoryBound(to: CChar.self)
                let rc = sodium_hex2bin(k.baseAddress!.assumingMemoryBound(to: UInt8.self), k.count, hex, count,
                                        nil, &decoded, &end)
                // With an end pointer, hex2bin stops at the first non-digit without failing.
                return rc == 0 && end == hex + count ? 0 : -1
            }
        }
        guard rc == 0, decoded == size else {
            key.wipe()
            throw CryptoError.malformedRecoveryKey
        }
        return key
    }
}

extension RecoveryKey {
    /// crypto_kdf context for the recovery slot's wrapping key (8 bytes).
    static let kdfContext: [CChar] = Array("cofferrk".utf8CString)

    /// The key that wraps the master key in the recovery slot: subkey 1 of the recovery
    /// key under context "cofferrk". The recovery key has 256 bits of entropy, so no
    /// slow KDF is needed.
    public static func wrappingKey(_ recoveryKey: SecureBytes) -> SecureBytes {
        precondition(recoveryKey.count == size)
        let out = SecureBytes(count: MasterKey.size)
        let rc = kdfContext.withUnsafeBufferPointer {
            crypto_kdf_derive_from_key(out.bytes, out.count, 1, $0.baseAddress!, recoveryKey.bytes)
        }
        precondition(rc == 0)
        return out
    }
}

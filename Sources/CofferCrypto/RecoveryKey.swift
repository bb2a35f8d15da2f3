// RecoveryKey formats and parses the 256-bit recovery key that a user writes down.
import CSodium

public enum RecoveryKey {
    /// Bytes of entropy in a recovery key (256 bits, as the master key).
    public static let size = 32

    /// Formats the key as 16 groups of 4 lowercase hex digits joined by '-'.
    /// The result is a secret: callers print it once and drop it.
    public static func format(_ key: SecureBytes) -> SecureBytes {
        precondition(key.count == size)
        let hexDigits = Array("0123456789abcdef".utf8)
        let out = SecureBytes(count: size * 2 + size / 2 - 1)
        out.withUnsafeMutableBytes { o in
            key.withUnsafeBytes { k in
                var j = 0
                for i in 0..<size {
                    if i > 0 && i % 2 == 0 { o[j] = UInt8(ascii: "-"); j += 1 }
                    o[j] = hexDigits[Int(k[i] >> 4)]; o[j + 1] = hexDigits[Int(k[i] & 0xf)]
                    j += 2
                }
            }
        }
        return out
    }

    /// Parses a recovery key typed by a user: hex digits in either case; '-', spaces
    /// and line breaks are ignored. Throws unless exactly 64 hex digits are found.
    public static func parse(_ text: SecureBytes) throws -> SecureBytes {
        let key = SecureBytes(count: size)
        var nibbles = 0
        var ok = true
        text.withUnsafeBytes { t in
            key.withUnsafeMutableBytes { k in
                for c in t {
                    let value: UInt8
                    switch c {
                    case UInt8(ascii: "0")...UInt8(ascii: "9"): value = c - UInt8(ascii: "0")
                    case UInt8(ascii: "a")...UInt8(ascii: "f"): value = c - UInt8(ascii: "a") + 10
                    case UInt8(ascii: "A")...UInt8(ascii: "F"): value = c - UInt8(ascii: "A") + 10
                    case UInt8(ascii: "-"), UInt8(ascii: " "), UInt8(ascii: "\n"), UInt8(ascii: "\r"),
                         UInt8(ascii: "\t"): continue
                    default: ok = false; return
                    }
                    guard nibbles < size * 2 else { ok = false; return }
                    if nibbles % 2 == 0 { k[nibbles / 2] = value << 4 } else { k[nibbles / 2] |= value }
                    nibbles += 1
                }
            }
        }
        guard ok, nibbles == size * 2 else {
            throw CryptoError.malformed(what: "recovery key (expected 64 hex digits)")
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

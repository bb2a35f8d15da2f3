// Base64URL encodes bytes for file names: RFC 4648 §5 alphabet, no padding, no '/'.
import CSodium

public enum Base64URL {
    private static let variant = Int32(sodium_base64_VARIANT_URLSAFE_NO_PADDING)

    /// Encoded length of `count` bytes.
    public static func encodedLength(_ count: Int) -> Int { (count * 4 + 2) / 3 }

    /// The alphabet, by 6-bit value.
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// Encoded straight into the string's storage: every lookup and new entry encodes a
    /// name, so no intermediate buffer and no C-string scan. The strict `decode` accepts
    /// one spelling per byte string, so the round trip in KeyDerivationTests shows this is
    /// libsodium's spelling.
    public static func encode(_ bytes: [UInt8]) -> String {
        String(unsafeUninitializedCapacity: encodedLength(bytes.count)) { out in
            var o = 0, i = 0
            func put(_ value: UInt32) { out[o] = alphabet[Int(value & 63)]; o += 1 }
            while i + 3 <= bytes.count {
                let v = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
                put(v >> 18); put(v >> 12); put(v >> 6); put(v)
                i += 3
            }
            switch bytes.count - i {
            case 1:
                let v = UInt32(bytes[i]) << 16
                put(v >> 18); put(v >> 12)
            case 2:
                let v = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8
                put(v >> 18); put(v >> 12); put(v >> 6)
            default: break
            }
            return o
        }
    }

    /// Decodes strictly: the whole text must be base64url; any character outside the
    /// alphabet (anywhere, a suffix such as `.sync-conflict-…` included), or trailing
    /// bits, fail. (Given an end pointer, libsodium stops at the first foreign character
    /// and succeeds on the prefix; without one it refuses the text.)
    public static func decode(_ text: String) throws -> [UInt8] {
        Sodium.ensureInitialized()
        let chars = Array(text.utf8)
        var out = [UInt8](repeating: 0, count: chars.count * 3 / 4 + 1)
        var length = 0
        let rc = chars.withUnsafeBufferPointer { c in
            c.withMemoryRebound(to: CChar.self) { cc in
                sodium_base642bin(&out, out.count, cc.baseAddress, chars.count, nil, &length, nil, variant)
            }
        }
        guard rc == 0 else { throw CryptoError.malformed(what: "base64url text") }
        return Array(out.prefix(length))
    }
}

// Base64URL encodes bytes for file names: RFC 4648 §5 alphabet, no padding, no '/'.
import CSodium

public enum Base64URL {
    private static let variant = Int32(sodium_base64_VARIANT_URLSAFE_NO_PADDING)

    /// Encoded length of `count` bytes.
    public static func encodedLength(_ count: Int) -> Int { (count * 4 + 2) / 3 }

    public static func encode(_ bytes: [UInt8]) -> String {
        Sodium.ensureInitialized()
        let capacity = sodium_base64_encoded_len(bytes.count, variant)
        var out = [CChar](repeating: 0, count: capacity)
        _ = sodium_bin2base64(&out, capacity, bytes, bytes.count, variant)
        return out.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
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

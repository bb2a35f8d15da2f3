// Hash computes BLAKE2b digests: unkeyed of public data (long-name hashes, config
// checksums), and keyed (KeyedDigest) of names a lock keeps without keeping them readable.
import CSodium

public enum Hash {
    /// BLAKE2b with a 32-byte output (crypto_generichash).
    public static func blake2b256(_ data: [UInt8]) -> [UInt8] {
        Sodium.ensureInitialized()
        var out = [UInt8](repeating: 0, count: 32)
        crypto_generichash(&out, 32, data, UInt64(data.count), nil, 0)
        return out
    }
}

/// Keyed BLAKE2b-128 digests of byte strings (names) under a random 32-byte key in sodium
/// memory: a set of digests tells whether a string is among those it was made from, while
/// the strings cannot be read back, nor guessed and checked without the key. The key lives
/// as long as its user needs it (one lock), and `wipe` ends it.
public struct KeyedDigest: Sendable {
    private let key = SecureBytes.random(count: 32)

    public init() {}

    /// The digest of `data` under this key.
    public func callAsFunction(_ data: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 16)
        key.withUnsafeBytes { k in
            _ = crypto_generichash(&out, 16, data, UInt64(data.count), k.baseAddress!.assumingMemoryBound(to: UInt8.self), k.count)
        }
        return out
    }

    /// Zeroes the key: no digest made after it matches one made before.
    public func wipe() { key.wipe() }
}

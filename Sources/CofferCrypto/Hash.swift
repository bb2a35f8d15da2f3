// Hash computes unkeyed BLAKE2b digests of public data (long-name hashes, config checksums).
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

// Sodium makes sure libsodium is initialised exactly once before any primitive runs.
import CSodium

public enum Sodium {
    /// A global `let` is initialised once, thread-safely, on first use (swift_once).
    private static let initialized: Bool = sodium_init() >= 0

    /// Initialises libsodium if nobody has yet. Every entry point of the engine calls it.
    @inline(__always)
    public static func ensureInitialized() {
        precondition(initialized, "libsodium could not be initialised")
    }

    /// Fills `buffer` with random bytes from libsodium's CSPRNG (getrandom(2)).
    public static func randomBytes(_ buffer: UnsafeMutableRawBufferPointer) {
        ensureInitialized()
        guard let base = buffer.baseAddress, buffer.count > 0 else { return }
        randombytes_buf(base, buffer.count)
    }

    /// `count` random bytes in an ordinary array: for values that are not secret (IDs, salts, nonces).
    public static func randomArray(count: Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        out.withUnsafeMutableBytes { randomBytes($0) }
        return out
    }
}

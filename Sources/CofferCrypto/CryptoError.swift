// CryptoError lists every way the engine can refuse its input.
public enum CryptoError: Error, Equatable, CustomStringConvertible {
    /// A content block failed authentication (tampered, moved, or from another file).
    case blockAuthenticationFailed(blockIndex: UInt64)
    /// A ciphertext block is too short to hold a nonce and a tag.
    case blockTooShort(blockIndex: UInt64, length: Int)
    /// An encrypted name failed authentication or is malformed.
    case nameAuthenticationFailed
    /// A sealed blob (key slot, symlink target, xattr value) failed authentication.
    case sealedAuthenticationFailed(what: String)
    /// The passphrase KDF could not run (usually: not enough memory for its parameters).
    case kdfFailed
    /// Input that cannot be decoded (bad base64, wrong length).
    case malformed(what: String)
    /// A typed recovery key that is not 64 hex digits (with separators).
    case malformedRecoveryKey
    /// The key was retired (the vault was locked) while an operation still held it.
    case keyRetired

    public var description: String {
        switch self {
        case .blockAuthenticationFailed(let index): return "content block \(index) failed authentication"
        case .blockTooShort(let index, let length): return "content block \(index) is truncated (\(length) bytes)"
        case .nameAuthenticationFailed: return "encrypted name failed authentication"
        case .sealedAuthenticationFailed(let what): return "\(what) failed authentication"
        case .kdfFailed: return "the passphrase key derivation failed (out of memory?)"
        case .malformed(let what): return "malformed \(what)"
        case .malformedRecoveryKey: return "malformed recovery key (expected 64 hex digits)"
        case .keyRetired: return "the key was wiped (the vault was locked)"
        }
    }
}

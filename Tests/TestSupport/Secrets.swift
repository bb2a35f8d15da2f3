// Secrets turns a test's strings into SecureBytes, and SecureBytes back into bytes to compare.
import CofferCrypto

/// The UTF-8 bytes of `text` as a SecureBytes (a passphrase, say).
public func secret(_ text: String) -> SecureBytes {
    let bytes = Array(text.utf8)
    let s = SecureBytes(count: bytes.count)
    s.withUnsafeMutableBytes { $0.copyBytes(from: bytes) }
    return s
}

/// The bytes of `key`, copied out to compare.
public func bytes(_ key: SecureBytes) -> [UInt8] { key.withUnsafeBytes { Array($0) } }

// FileKeyWrap seals a format-8 file's own key into its header (docs/FORMAT.md §12,
// "Header version 4"): under its key domain's metadata key, deterministically, so that
// a file moved between domains is re-wrapped in place (never re-encrypted) and two
// machines that move the same file write the same header.
import CSodium

public enum FileKeyWrap {
    /// Bytes of a file key (XChaCha20-Poly1305's key; AES-256-GCM's).
    public static let keySize = 32
    /// Bytes of a key wrap in the header: nonce ‖ sealed key ‖ tag.
    public static let size = SealedBox.overhead + keySize

    /// The AD that binds a wrap to its file.
    static func associatedData(fileID: [UInt8]) -> [UInt8] { Array("coffer.file.key\0".utf8) + fileID }

    /// The wrap of file key `key` of file `fileID` under `metadata` (a domain's subkey 4).
    public static func wrap(_ key: SecureBytes, fileID: [UInt8], under metadata: SealedBox) throws -> [UInt8] {
        precondition(key.count == keySize)
        return try key.withUnsafeBytes { try metadata.sealDeterministically($0, associatedData: associatedData(fileID: fileID)) }
    }

    /// The key in `wrap`, in sodium memory; throws if `metadata` did not wrap it for
    /// `fileID` (another domain's key, another file's wrap, a changed byte).
    public static func unwrap(_ wrap: [UInt8], fileID: [UInt8], under metadata: SealedBox) throws -> SecureBytes {
        guard wrap.count == size else { throw CryptoError.malformed(what: "file key wrap") }
        let key = try metadata.open(wrap, associatedData: associatedData(fileID: fileID), what: "file key wrap")
        guard key.count == keySize else { throw CryptoError.malformed(what: "file key wrap") }
        return key
    }
}

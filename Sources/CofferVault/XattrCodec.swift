// XattrCodec encrypts extended attributes: the name deterministically (the name SIV
// construction under its own subkeys and a fixed IV), the value sealed with the name
// as associated data. Both are stored as a backing "user." xattr.
import CofferCrypto

public struct XattrCodec: Sendable {
    /// Namespace of every backing xattr coffer writes.
    public static let backingPrefix = "user."
    /// The fixed "directory IV" used for xattr names: 16 zero bytes. Determinism is what
    /// getxattr needs; separate subkeys keep these apart from file names.
    static let nameIV = [UInt8](repeating: 0, count: NameCipher.ivSize)
    /// Longest plaintext xattr name: 159 bytes encrypt to 176, encoded 235 + "user.".
    public static let maxNameLength = 159
    /// Largest plaintext value: the Linux limit (64 KiB) minus the seal's overhead.
    public static let maxValueLength = 65536 - SealedBox.overhead

    private let names: NameCipher
    private let box: SealedBox

    public init(names: NameCipher, box: SealedBox) {
        self.names = names
        self.box = box
    }

    /// The backing xattr name for plaintext xattr `name` (e.g. "user.comment").
    public func backingName(for name: [UInt8]) throws -> String {
        guard !name.isEmpty else { throw VaultError.invalidName }
        guard name.count <= Self.maxNameLength else { throw VaultError.tooLong(.xattrName) }
        return Self.backingPrefix + Base64URL.encode(try names.encrypt(name, dirIV: Self.nameIV))
    }

    /// The plaintext name of backing xattr `backingName`, or nil if it is not one of ours.
    public func plaintextName(ofBacking backingName: String) -> [UInt8]? {
        guard backingName.hasPrefix(Self.backingPrefix),
              let encrypted = try? Base64URL.decode(String(backingName.dropFirst(Self.backingPrefix.count))) else {
            return nil
        }
        return try? names.decrypt(encrypted, dirIV: Self.nameIV)
    }

    /// Seals `value` for the xattr stored under `backingName`.
    public func sealValue(_ value: [UInt8], backingName: String) throws -> [UInt8] {
        guard value.count <= Self.maxValueLength else { throw VaultError.tooLong(.xattrValue) }
        return try value.withUnsafeBytes { try box.seal($0, associatedData: Array(backingName.utf8)) }
    }

    /// The value `sealed`, stored under `backingName` by `other` (the other key domain's
    /// codec), sealed under this codec's key for `newBackingName` with the nonce it had
    /// (format 8's conversion, docs/FORMAT.md §12: the same bytes on every machine; the
    /// two keys differ, so no key sees a nonce twice).
    public func reseal(_ sealed: [UInt8], from other: XattrCodec, backingName: String, as newBackingName: String) throws -> [UInt8] {
        let value = try other.openValue(sealed, backingName: backingName)
        return try value.withUnsafeBytes {
            try box.seal($0, associatedData: Array(newBackingName.utf8), nonce: Array(sealed.prefix(SealedBox.nonceSize)))
        }
    }

    /// Opens the value stored under `backingName`; a value moved to another name fails.
    public func openValue(_ sealed: [UInt8], backingName: String) throws -> [UInt8] {
        do {
            return try box.openPublic(sealed, associatedData: Array(backingName.utf8), what: "xattr value")
        } catch {
            throw VaultError.metadataDamaged(what: "xattr value")
        }
    }

    /// Plaintext length of a sealed value of `sealedLength` bytes.
    public static func plainLength(sealedLength: Int) -> Int { max(0, sealedLength - SealedBox.overhead) }
}

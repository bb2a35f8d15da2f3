// PlaceMAC computes the 16-byte tags that bind a file's content to its place in the
// vault (format 4, docs/FORMAT.md §4): keyed BLAKE2b over the file ID and the directory
// IV and plaintext name of its entry, or over the file ID alone for a file with hard
// links (which has several places); and from format 5 (§5) those that bind a
// directory's IV to the directory's own place.
import CSodium

public final class PlaceMAC: Sendable {
    /// Bytes of a tag.
    public static let tagSize = 16
    static let placeDomain = Array("coffer.place".utf8) + [0]
    static let linkedDomain = Array("coffer.linked".utf8) + [0]
    static let directoryDomain = Array("coffer.dirplace".utf8) + [0]

    let key: SecureBytes

    public init(key: SecureBytes) {
        precondition(key.count == 32)
        self.key = key
    }

    /// The tag of file `fileID` as the entry `name` of the directory with IV `dirIV`.
    public func tag(fileID: [UInt8], dirIV: [UInt8], name: [UInt8]) throws -> [UInt8] {
        precondition(dirIV.count == NameCipher.ivSize && !name.isEmpty)
        return try mac(zeroingAfter: Self.placeDomain + fileID + dirIV + name)
    }

    /// The tag of file `fileID` with hard links: valid under any of its names.
    public func linkedTag(fileID: [UInt8]) throws -> [UInt8] { try mac(Self.linkedDomain + fileID) }

    /// The tag of directory IV `iv` for the directory that is entry `name` of the
    /// directory with IV `parentIV`; for the vault's root both are empty.
    public func directoryTag(iv: [UInt8], parentIV: [UInt8], name: [UInt8]) throws -> [UInt8] {
        precondition(iv.count == NameCipher.ivSize && (parentIV.isEmpty ? name.isEmpty : parentIV.count == NameCipher.ivSize && !name.isEmpty))
        return try mac(zeroingAfter: Self.directoryDomain + iv + parentIV + name)
    }

    /// Constant-time comparison of two tags.
    public static func equal(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        a.count == b.count && !a.isEmpty && sodium_memcmp(a, b, a.count) == 0
    }

    /// The tag of `input`, which holds a plaintext name: zeroed after (this function
    /// holds it alone), so that no name outlives a lock in freed memory.
    private func mac(zeroingAfter input: consuming [UInt8]) throws -> [UInt8] {
        var input = input
        defer { input.withUnsafeMutableBytes { sodium_memzero($0.baseAddress, $0.count) } }
        return try mac(input)
    }

    private func mac(_ input: [UInt8]) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: Self.tagSize)
        _ = try key.lend { crypto_generichash(&out, Self.tagSize, input, UInt64(input.count), $0, key.count) }
        return out
    }
}

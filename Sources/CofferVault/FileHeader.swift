// FileHeader is the 18 bytes at the start of every non-empty content file:
// format version (UInt16, big-endian) ‖ random 16-byte file ID.
import CofferCrypto

public struct FileHeader: Equatable {
    /// Header version written by this build.
    public static let currentVersion: UInt16 = 1
    /// Bytes on disk: 2 (version) + 16 (file ID).
    public static let size = 2 + FileID.size

    public let fileID: FileID

    public init(fileID: FileID) { self.fileID = fileID }

    public init(parsing bytes: [UInt8]) throws {
        guard bytes.count == Self.size else {
            throw VaultError.fileHeaderDamaged(reason: "\(bytes.count) bytes instead of \(Self.size)")
        }
        let version = UInt16(bytes[0]) << 8 | UInt16(bytes[1])
        guard version == Self.currentVersion else {
            throw VaultError.fileHeaderDamaged(reason: "unknown header version \(version)")
        }
        fileID = FileID(bytes: Array(bytes[2...]))
    }

    public var bytes: [UInt8] {
        [UInt8(Self.currentVersion >> 8), UInt8(Self.currentVersion & 0xff)] + fileID.bytes
    }
}

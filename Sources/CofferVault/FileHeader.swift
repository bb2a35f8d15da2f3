// FileHeader is the start of every content file: format version (UInt16, big-endian) ‖
// random 16-byte file ID, and from header version 2 (vault format 4) the 16-byte place
// tag that binds the content to its entry (docs/FORMAT.md §4).
import CofferCrypto

public struct FileHeader: Equatable {
    /// Bytes on disk of a header of `version`: 2 (version) + 16 (file ID) [+ 16 (place tag)]
    /// [+ 72 (key wrap, version 4)].
    public static func size(version: UInt16) -> Int {
        2 + FileID.size + (version >= 2 ? PlaceMAC.tagSize : 0) + (version >= wrappedVersion ? FileKeyWrap.size : 0)
    }
    /// Offset of the place tag in a version-2 header.
    public static let placeTagOffset = 2 + FileID.size
    /// The header version of a file made while locked (format 6): laid out as version 2,
    /// its key sealed to the drop key in a key record (DropRecord), its place tag zero
    /// until the unlock binds it.
    public static let sealedVersion: UInt16 = 3
    /// The header version of format 8: a file's own key wrapped after the place tag
    /// (FileKeyWrap); a wrap of zeros means a file made while locked, its key in its key
    /// record until its conversion.
    public static let wrappedVersion: UInt16 = 4
    /// Offset of the key wrap in a version-4 header.
    public static let keyWrapOffset = placeTagOffset + PlaceMAC.tagSize

    /// Whether this file's key is in a key record rather than derived or wrapped here
    /// (format 6 on: a file made while locked, not converted yet in format 8).
    public var isSealed: Bool { version == Self.sealedVersion || keyWrap?.allSatisfy({ $0 == 0 }) == true }

    public let version: UInt16
    public let fileID: FileID
    /// The place tag (version 2 on), else nil.
    public var placeTag: [UInt8]?
    /// The file's key wrapped under its domain's metadata key (version 4), else nil.
    public var keyWrap: [UInt8]?

    public init(version: UInt16, fileID: FileID, placeTag: [UInt8]? = nil, keyWrap: [UInt8]? = nil) {
        precondition((version >= 2) == (placeTag?.count == PlaceMAC.tagSize) && version <= Self.wrappedVersion
                     && (version == Self.wrappedVersion) == (keyWrap?.count == FileKeyWrap.size))
        self.version = version
        self.fileID = fileID
        self.placeTag = placeTag
        self.keyWrap = keyWrap
    }

    /// Parses the header of `layout`'s version.
    public init(parsing bytes: [UInt8], layout: BlockLayout) throws {
        let size = Int(layout.headerSize)
        guard bytes.count == size else {
            throw VaultError.fileHeaderDamaged(reason: "\(bytes.count) bytes instead of \(size)")
        }
        let version = UInt16(bytes[0]) << 8 | UInt16(bytes[1])
        guard version == layout.headerVersion || (version == Self.sealedVersion && layout.readsSealedHeaders) else {
            throw VaultError.fileHeaderDamaged(reason: "unknown header version \(version)")
        }
        self.version = version
        fileID = FileID(bytes: Array(bytes[2..<Self.placeTagOffset]))
        placeTag = version >= 2 ? Array(bytes[Self.placeTagOffset..<Self.keyWrapOffset]) : nil
        keyWrap = version == Self.wrappedVersion ? Array(bytes[Self.keyWrapOffset...]) : nil
    }

    public var bytes: [UInt8] {
        [UInt8(version >> 8), UInt8(version & 0xff)] + fileID.bytes + (placeTag ?? []) + (keyWrap ?? [])
    }
}

// PlaceBinding binds a file's content to its entry (format 4, docs/FORMAT.md §4): the
// header's place tag is a MAC of the file ID with the directory IV and plaintext name the
// file stands under, so content copied or moved to another name or directory is refused.
// A rename writes the new tag into the header, and before it the old and new tags into
// the backing xattr `user.coffer.place`: a metadata change the file system orders before
// the rename, so after a power cut that kept the rename but not the header's new bytes
// the file still opens (and its header is mended). From format 5, DirectoryBinding binds
// a directory's IV file to the directory's place the same way (FORMAT.md §5).
import CofferCrypto
import CofferSystem
import Glibc

/// Where an entry stands: its directory's IV and its plaintext name.
public struct Place: Equatable, Sendable {
    public let dirIV: [UInt8]
    public let name: [UInt8]

    public init(dirIV: [UInt8], name: [UInt8]) {
        self.dirIV = dirIV
        self.name = name
    }

    /// The place of the vault's root directory (its IV file's tag binds it there).
    public static let root = Place(dirIV: [], name: [])

    /// The places an entry shown as `name` in a directory with IVs `ivs` (its own first,
    /// then those of its IV file's conflict copies) may have been bound to: that name,
    /// and for a sync engine's conflict copy — an entry stored under a conflict copy's
    /// backing name (`storedAsCopy`) — the original's name: the engine wrote a version of
    /// the original there. An entry stored under the encrypted name of a name that only
    /// reads like a copy (`doc (1).pdf`, as a browser names a second download) was made
    /// by coffer under that very name, and is bound to it alone.
    public static func candidates(shownAs name: [UInt8], ivs: [[UInt8]], storedAsCopy: Bool) -> [Place] {
        let original = storedAsCopy ? ConflictName.parse(plaintext: name).map(\.original) : nil
        let names = [name] + (original.map { [$0] } ?? [])
        return ivs.flatMap { iv in names.map { Place(dirIV: iv, name: $0) } }
    }
}

public enum PlaceBinding {
    /// The backing xattr holding the tags of a rename in progress: old ‖ new. It holds a
    /// `.`, so it is never an encrypted xattr name.
    public static let xattrName = "user.coffer.place"

    /// How a header's content matched its place.
    public enum Match: Equatable {
        /// The header's tag (a place, or a file with hard links).
        case header
        /// A tag of the place xattr: the header is stale (`tag` belongs there).
        case xattr(tag: [UInt8])
    }

    /// The tags of a place xattr's value (nil or malformed: none).
    public static func tags(ofXattr value: [UInt8]?) -> [[UInt8]] {
        guard let value, value.count == 2 * PlaceMAC.tagSize else { return [] }
        return [Array(value[..<PlaceMAC.tagSize]), Array(value[PlaceMAC.tagSize...])]
    }

    /// Whether `tag` is one of `fileID`'s for one of `places`, or its linked tag.
    public static func tag(_ tag: [UInt8], of fileID: FileID, fitsOneOf places: [Place], macs: PlaceMAC) throws -> Bool {
        if try PlaceMAC.equal(tag, macs.linkedTag(fileID: fileID.bytes)) { return true }
        for place in places where try PlaceMAC.equal(tag, macs.tag(fileID: fileID.bytes, dirIV: place.dirIV, name: place.name)) {
            return true
        }
        return false
    }

    /// Checks that `header` belongs at one of `places`: by its own tag, else by a tag of
    /// the place xattr of backing file `fd` (read only then; nil: none). Throws
    /// `placeMismatch` if neither fits.
    public static func check(_ header: FileHeader, places: [Place], xattrOf fd: Int32?, macs: PlaceMAC) throws -> Match {
        guard let own = header.placeTag else { return .header }
        if try tag(own, of: header.fileID, fitsOneOf: places, macs: macs) { return .header }
        for tag in tags(ofXattr: fd.flatMap(xattr(of:))) where try self.tag(tag, of: header.fileID, fitsOneOf: places, macs: macs) {
            return .xattr(tag: tag)
        }
        throw VaultError.placeMismatch
    }

    /// The place xattr of the open backing file `fd`, or nil.
    public static func xattr(of fd: Int32) -> [UInt8]? {
        try? Sys.getXattr(fd, xattrName)
    }

    /// Rebinds the open backing file `fd` (format 4) to the tag `newTag`: the place xattr
    /// first (old ‖ new), then the header. Where the backing file system has no user
    /// xattrs, the header is made durable instead, before the caller's rename. `times`:
    /// the file's atime and mtime, if the caller has them (else they are read).
    /// `keyWrap` (format 8): the file's key wrapped in the key domain it moves into,
    /// written with the tag (a reader takes a wrap of either domain, so a power cut that
    /// keeps the rename and not the header leaves a file that opens).
    public static func rewrite(_ file: ContentFile, from oldTag: [UInt8], to newTag: [UInt8], keyWrap: [UInt8]? = nil,
                               keeping times: [timespec]? = nil) throws {
        do {
            try Sys.setXattr(file.fd, xattrName, oldTag + newTag, flags: 0)
            try file.setPlaceTag(newTag, keyWrap: keyWrap, keeping: times)
        } catch let error as Errno where error.code == ENOTSUP || error.code == EOPNOTSUPP {
            try file.setPlaceTag(newTag, keyWrap: keyWrap, keeping: times)
            try Sys.fdatasync(file.fd)
        }
    }
}

/// The rule (format 5) by which a directory's IV file — its own, or a sync engine's
/// conflict copy of it — is accepted: one of its tags is the tag of its IV at one of the
/// places the directory may stand for. An IV file copied into another directory, or a
/// directory's contents moved under another name, fits none and is refused.
public enum DirectoryBinding {
    /// Whether `record` belongs to a directory at one of `places` (always, without tags:
    /// formats 1–4).
    public static func fits(_ record: DirectoryIV.Record, places: [Place], macs: PlaceMAC) throws -> Bool {
        guard !record.tags.isEmpty else { return true }
        for place in places {
            let tag = try macs.directoryTag(iv: record.iv, at: place)
            if record.tags.contains(where: { PlaceMAC.equal($0, tag) }) { return true }
        }
        return false
    }

    /// What gives a new IV file (DirectoryIV.create) the tag of `place`.
    public static func tagging(at place: Place, macs: PlaceMAC) -> ([UInt8]) throws -> [UInt8] {
        { try macs.directoryTag(iv: $0, at: place) }
    }
}

extension PlaceMAC {
    /// The tag of directory IV `iv` at `place` (the parent's IV and the name; empty for
    /// the root).
    public func directoryTag(iv: [UInt8], at place: Place) throws -> [UInt8] {
        try directoryTag(iv: iv, parentIV: place.dirIV, name: place.name)
    }
}

// DirectoryNames is the one rule for how a stored name decodes in a directory, and how a
// plaintext name finds its stored entry: under the directory's own IV, as a sync
// engine's conflict copy, or under the IV of a conflict copy of its IV file (a directory
// made on two machines, not yet settled). Lookup, listing, the watch of other writers,
// settling and fsck all go through it.
import Glibc

public struct DirectoryNames: Sendable {
    /// The directory's own IV: new names are encrypted under it.
    public let own: [UInt8]
    /// The conflict copies of its IV file that were made for it, by file name (for
    /// format 5, DirectoryBinding has checked each).
    public let alternates: [Alternate]
    let names: NameTransform

    public struct Alternate: Sendable {
        public let fileName: String
        public let iv: [UInt8]

        public init(fileName: String, iv: [UInt8]) {
            self.fileName = fileName
            self.iv = iv
        }
    }

    public init(_ names: NameTransform, own: [UInt8], alternates: [Alternate]) {
        self.names = names
        self.own = own
        self.alternates = alternates
    }

    /// A stored name, decoded.
    public struct Decoded: Equatable, Sendable {
        /// The name the entry is shown under.
        public let name: [UInt8]
        /// The IV file of the alternate IV it is encrypted under; nil: the directory's own.
        public let alternate: String?
    }

    /// Every IV of the directory, its own first.
    public var ivs: [[UInt8]] { [own] + alternates.map(\.iv) }

    /// How backing entry `backing` of `dir` decodes: its plaintext name and the IV it is
    /// under; nil for coffer's own files (IV file, sidecars, temporary entries). Throws
    /// the damage of a name that decodes under none of the directory's IVs (the error
    /// under its own IV).
    public func decode(_ backing: String, in dir: Int32) throws -> Decoded? {
        do {
            return try names.plaintextName(ofBacking: backing, dirIV: own, in: dir).map { Decoded(name: $0, alternate: nil) }
        } catch {
            for alternate in alternates {
                if let name = try? names.plaintextName(ofBacking: backing, dirIV: alternate.iv, in: dir) {
                    return Decoded(name: name, alternate: alternate.fileName)
                }
            }
            throw error
        }
    }

    /// The stored entry plaintext `name` stands for, if `exists` finds one: its encrypted
    /// name under the directory's own IV, else the sync engine's conflict copy that the
    /// name shows, else its name under an alternate IV; nil if there is none.
    public func find(_ name: [UInt8], exists: (String) -> Bool) throws -> BackingName? {
        let backing = try names.backingName(for: name, dirIV: own)
        if exists(backing.name) { return backing }
        if let copy = try names.conflictCopyName(for: name, dirIV: own, exists: exists) { return copy }
        for alternate in alternates {
            let other = try names.backingName(for: name, dirIV: alternate.iv)
            if exists(other.name) { return other }
        }
        return nil
    }
}

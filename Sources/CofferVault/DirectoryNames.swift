// DirectoryNames is the one rule for how a stored name decodes in a directory, and how a
// plaintext name finds its stored entry: under the directory's own IV, as a sync
// engine's conflict copy, or under the IV of a conflict copy of its IV file (a directory
// made on two machines, not yet settled). Lookup, listing, the watch of other writers,
// settling and fsck all go through it.
import CofferSystem
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

    /// In a directory with alternate IVs, listed (`planningSettlement`): the entries
    /// under an alternate IV by backing name, with the name each is shown under and will
    /// settle to (SettlementPlan). Empty otherwise.
    public private(set) var settling: [String: SettlementPlan.Entry] = [:]

    public init(_ names: NameTransform, own: [UInt8], alternates: [Alternate]) {
        self.names = names
        self.own = own
        self.alternates = alternates
    }

    /// These names with the settlement plan of `dir` (one listing, every name decoded),
    /// so that an entry made on both machines is shown — and found — under the one name
    /// it will settle to from the first listing on. Without alternate IVs, as they are.
    public func planningSettlement(in dir: Int32) throws -> DirectoryNames {
        guard !alternates.isEmpty else { return self }
        var own = Set<[UInt8]>()
        var others: [SettlementPlan.Entry] = []
        for backing in try Sys.listDirectory(dir) {
            guard let decoded = try? decode(backing, in: dir) else { continue }
            if let alternate = decoded.alternate, let index = alternates.firstIndex(where: { $0.fileName == alternate }) {
                others.append(.init(backing: backing, name: decoded.name, alternate: index, settlesAs: decoded.name))
            } else {
                own.insert(decoded.name)
            }
        }
        var planned = self
        planned.settling = Dictionary(uniqueKeysWithValues: SettlementPlan.settle(others, besides: own).map { ($0.backing, $0) })
        return planned
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
    /// With a settlement plan, an entry under an alternate IV decodes to the name it will
    /// settle to.
    public func decode(_ backing: String, in dir: Int32) throws -> Decoded? {
        do {
            return try names.plaintextName(ofBacking: backing, dirIV: own, in: dir).map { Decoded(name: $0, alternate: nil) }
        } catch {
            for alternate in alternates {
                if let name = try? names.plaintextName(ofBacking: backing, dirIV: alternate.iv, in: dir) {
                    return Decoded(name: settling[backing]?.settlesAs ?? name, alternate: alternate.fileName)
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
        if let planned = settling.values.first(where: { $0.settlesAs == name && $0.settlesAs != $0.name }) {
            let other = try names.backingName(for: planned.name, dirIV: alternates[planned.alternate].iv)
            if exists(other.name) { return other }
        }
        if let copy = try names.conflictCopyName(for: name, dirIV: own, exists: exists) { return copy }
        for alternate in alternates {
            let other = try names.backingName(for: name, dirIV: alternate.iv)
            if exists(other.name) { return other }
        }
        return nil
    }
}

/// How the entries of a directory made on two machines are named once it settles on one
/// IV — and so how they are shown until then. Pure: decided from names alone, the same on
/// every machine whatever order its directory lists them in.
public enum SettlementPlan {
    /// An entry under an alternate IV.
    public struct Entry: Equatable, Sendable {
        public let backing: String
        /// Its name under its IV.
        public let name: [UInt8]
        /// Which alternate IV (in the directory's order of its IV file's copies).
        public let alternate: Int
        /// The name it is shown under and settles to.
        public var settlesAs: [UInt8]

        public init(backing: String, name: [UInt8], alternate: Int, settlesAs: [UInt8]) {
            self.backing = backing
            self.name = name
            self.alternate = alternate
            self.settlesAs = settlesAs
        }
    }

    /// The names `entries` settle to beside the names `own` under the directory's own IV:
    /// each keeps its name where no entry under the own IV, nor an earlier alternate's
    /// entry, has it; the others take the first free `NAME (N).EXT` (N = 1, 2, …), in the
    /// order of their alternate IV and then of their names' bytes. A name with no room
    /// for the marker (255 bytes) keeps its own.
    public static func settle(_ entries: [Entry], besides own: Set<[UInt8]>) -> [Entry] {
        let ordered = entries.sorted {
            $0.alternate != $1.alternate ? $0.alternate < $1.alternate : $0.name.lexicographicallyPrecedes($1.name)
        }
        var taken = own
        var settled: [Entry] = []
        var clashing: [Entry] = []
        for entry in ordered {
            if taken.insert(entry.name).inserted { settled.append(entry) } else { clashing.append(entry) }
        }
        for var entry in clashing {
            for n in 1... {
                guard let candidate = ConflictName.display(original: entry.name, markers: Array(" (\(n))".utf8)) else { break }
                if taken.insert(candidate).inserted {
                    entry.settlesAs = candidate
                    break
                }
            }
            settled.append(entry)
        }
        return settled
    }
}

// ConflictName recognises the copies that sync engines make of a file they could not
// merge (Syncthing, Nextcloud/ownCloud, Dropbox, the plain "(1)" of others) and maps
// such a copy's backing name to a readable plaintext name and back.
//
// An engine inserts a marker into the name of the losing copy, before the name's last
// extension or at its end: `NAME.sync-conflict-20261123-101500-ABCDEFG`,
// `coffer.long.sync-conflict-20261123-101500-ABCDEFG.HASH`, `NAME (conflicted copy
// 2026-11-23 101500)`. coffer shows the copy as the original's plaintext name with the
// same marker inserted the same way (`report.sync-conflict-20261123-101500-ABCDEFG.odt`),
// so the name says what the file is and keeps its extension. Pure: bytes in, bytes out.

/// The marker run of a conflict copy's name, and where it was inserted.
public struct ConflictName: Equatable, Sendable {
    /// The name the copy was made of, without the markers.
    public let original: [UInt8]
    /// One or more markers, as the engine inserted them (a copy of a copy has two).
    public let markers: [UInt8]
    /// Where in `original` the markers go.
    public let position: Int

    /// The whole name: `original` with `markers` inserted at `position`.
    public var name: [UInt8] { Array(original[..<position]) + markers + Array(original[position...]) }

    /// A conflict copy's backing name, split into the backing name it was made of and
    /// its markers; nil if `backingName` holds no marker run. Engines insert before the
    /// last `.` (Syncthing: Go's `filepath.Ext`, so a leading dot counts too) or at the
    /// end; both are accepted here.
    public static func parse(backingName: String) -> ConflictName? {
        // Every marker starts with '.' or ' ', which no encrypted name holds: the common
        // case costs one pass over the name and no allocation.
        guard backingName.utf8.contains(where: startsMarker), let split = split(Array(backingName.utf8)) else { return nil }
        let dot = split.original.lastIndex(of: dot)
        guard split.position == split.original.count || split.position == dot else { return nil }
        return split
    }

    /// Whether backing name `backingName` is a conflict copy of coffer's own file
    /// `original` (`coffer.diriv`, `coffer.conf`): `coffer<marker>.diriv` and the like.
    public static func isCopy(_ backingName: String, of original: String) -> Bool {
        backingName != original && backingName.hasPrefix("coffer")
            && parse(backingName: backingName)?.original == Array(original.utf8)
    }

    /// A plaintext name that coffer shows for a conflict copy, split into the original
    /// plaintext name and its markers; nil unless the markers stand exactly where
    /// `display(original:markers:)` puts them (so the mapping is one to one).
    public static func parse(plaintext: [UInt8]) -> ConflictName? {
        guard plaintext.contains(where: startsMarker), let split = split(plaintext),
              split.position == insertionPoint(in: split.original) else { return nil }
        return split
    }

    /// The plaintext name shown for a copy of `original` carrying `markers`: inserted
    /// before the extension (the last `.` that is not the first byte), else appended.
    /// Nil if that would be longer than a name may be.
    public static func display(original: [UInt8], markers: [UInt8]) -> [UInt8]? {
        let shown = ConflictName(original: original, markers: markers, position: insertionPoint(in: original)).name
        return shown.count <= NameTransform.maxNameLength ? shown : nil
    }

    /// The backing names a copy of backing name `original` carrying `markers` may have:
    /// before its last `.`, and at its end (the two coincide for names without a dot,
    /// such as every short encrypted name).
    public static func backingCandidates(original: String, markers: [UInt8]) -> [String] {
        let bytes = Array(original.utf8)
        var positions = [bytes.count]
        if let dot = bytes.lastIndex(of: dot) { positions.insert(dot, at: 0) }
        return positions.map { String(decoding: ConflictName(original: bytes, markers: markers, position: $0).name, as: UTF8.self) }
    }

    private static let dot = UInt8(ascii: ".")

    /// The bytes a marker starts with.
    private static func startsMarker(_ c: UInt8) -> Bool { c == UInt8(ascii: ".") || c == UInt8(ascii: " ") }

    private static func insertionPoint(in name: [UInt8]) -> Int {
        if let dot = name.lastIndex(of: dot), dot > 0 { return dot }
        return name.count
    }

    /// The one contiguous run of markers in `name`, if there is exactly one.
    private static func split(_ name: [UInt8]) -> ConflictName? {
        var start: Int?
        var end = 0
        var i = 0
        while i < name.count {
            guard startsMarker(name[i]), let length = markerLength(name, at: i) else { i += 1; continue }
            if let _ = start, i != end { return nil }  // a second, separate run: ambiguous
            if start == nil { start = i }
            end = i + length
            i = end
        }
        guard let start, start < end else { return nil }
        let original = Array(name[..<start]) + Array(name[end...])
        guard !original.isEmpty else { return nil }
        return ConflictName(original: original, markers: Array(name[start..<end]), position: start)
    }

    /// Length of the marker starting at `i`, if one does.
    static func markerLength(_ name: [UInt8], at i: Int) -> Int? {
        syncthingMarker(name, at: i) ?? parenthesisedMarker(name, at: i)
    }

    private static let syncthingPrefix = Array(".sync-conflict-".utf8)

    /// `.sync-conflict-YYYYMMDD-HHMMSS-XXXXXXX` (the last part: the first 7 characters
    /// of the device ID that made the change).
    private static func syncthingMarker(_ name: [UInt8], at i: Int) -> Int? {
        let length = syncthingPrefix.count + 8 + 1 + 6 + 1 + 7
        guard i + length <= name.count, name[i..<i + syncthingPrefix.count].elementsEqual(syncthingPrefix) else { return nil }
        let rest = Array(name[(i + syncthingPrefix.count)..<(i + length)])
        let isDigit = { (c: UInt8) in c >= 0x30 && c <= 0x39 }
        let isID = { (c: UInt8) in isDigit(c) || (c >= 0x41 && c <= 0x5a) }
        guard rest[0..<8].allSatisfy(isDigit), rest[8] == UInt8(ascii: "-"), rest[9..<15].allSatisfy(isDigit),
              rest[15] == UInt8(ascii: "-"), rest[16..<23].allSatisfy(isID) else { return nil }
        return length
    }

    /// ` (… conflicted copy …)` (Nextcloud, ownCloud, Dropbox) or ` (N)` (a name taken).
    private static func parenthesisedMarker(_ name: [UInt8], at i: Int) -> Int? {
        guard i + 3 < name.count, name[i] == UInt8(ascii: " "), name[i + 1] == UInt8(ascii: "("),
              let close = name[(i + 2)...].firstIndex(where: { $0 == UInt8(ascii: ")") || $0 == UInt8(ascii: "(") }),
              name[close] == UInt8(ascii: ")"), close > i + 2 else { return nil }
        let inside = Array(name[(i + 2)..<close])
        let isNumber = inside.count <= 4 && inside.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
        guard isNumber || contains(inside, Array("conflicted copy".utf8)) else { return nil }
        return close + 1 - i
    }

    private static func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard haystack.count >= needle.count else { return false }
        return (0...(haystack.count - needle.count)).contains { Array(haystack[$0..<$0 + needle.count]) == needle }
    }
}

// ProtectionClass is what a lock does to the files of a directory (format 6): `complete`
// drops every key, `unlessOpen` keeps the key of each file open at the lock until it is
// closed. A directory's class is its backing `coffer.class` file, sealed with the
// metadata key and bound to the directory's IV (docs/FORMAT.md §12); no file means
// `complete`, so a vault that never uses a class has none.
import CofferCrypto
import CofferSystem
import Glibc

public enum ProtectionClass: UInt8, CaseIterable, Sendable, Comparable {
    /// Every key is dropped at a lock (the only class up to format 5; the default).
    case complete = 0
    /// A file open at a lock stays usable through its descriptors until it is closed.
    case unlessOpen = 1
    /// Keys kept through every lock but `lock --all` (format 8): the directory is in the
    /// after-first-unlock key domain, its record sealed under that domain's metadata key.
    case afterFirstUnlock = 2

    /// Name of the class file in a backing directory.
    public static let fileName = "coffer.class"
    /// Version byte of the record's plaintext.
    static let recordVersion: UInt8 = 1
    /// First byte of a converting record (format 8): `0x02 ‖ from ‖ to`.
    static let convertingVersion: UInt8 = 2
    /// Bytes of a class file: nonce (24) ‖ sealed version and class (2) ‖ tag (16).
    public static let fileSize = SealedBox.overhead + 2
    /// Bytes of a converting record's file: one more (the class converted from).
    static let convertingFileSize = SealedBox.overhead + 3

    /// As the user writes it: `complete`, `unless-open`.
    public var name: String {
        switch self {
        case .complete: return "complete"
        case .unlessOpen: return "unless-open"
        case .afterFirstUnlock: return "after-first-unlock"
        }
    }

    public init?(name: String) {
        guard let found = Self.allCases.first(where: { $0.name == name }) else { return nil }
        self = found
    }

    public static func < (a: ProtectionClass, b: ProtectionClass) -> Bool { a.rawValue < b.rawValue }

    /// The vault formats that have this class.
    public var formats: ClosedRange<Int> {
        switch self {
        case .complete: return 1...Int.max
        case .unlessOpen: return 6...Int.max
        case .afterFirstUnlock: return 8...Int.max
        }
    }

    /// The key domain of a directory of this class (format 8).
    public var domain: KeyDomain { self == .afterFirstUnlock ? .afterFirstUnlock : .vault }

    /// AD = "coffer.class" ‖ 0x00 ‖ the directory's IV: a class file moved into another
    /// directory fails to open.
    static func associatedData(dirIV: [UInt8]) -> [UInt8] { Array("coffer.class".utf8) + [0] + dirIV }

    /// The sealed record of this class for the directory with IV `dirIV`, sealed
    /// deterministically: two machines setting the same class (or converting the same
    /// directory made while locked) write the same bytes, which a sync engine does not
    /// take for a conflict.
    public func sealed(dirIV: [UInt8], box: SealedBox) throws -> [UInt8] {
        try [Self.recordVersion, rawValue].withUnsafeBytes { try box.sealDeterministically($0, associatedData: Self.associatedData(dirIV: dirIV)) }
    }

    /// Opens a sealed record of the directory with IV `dirIV` under `box` (the metadata key
    /// of the vault domain), else (format 8) under `afterFirstUnlock` (that domain's): the
    /// key that opens it must be its class's domain's, or it is damage.
    /// Without `box` (a lock took the vault domain's keys), a record that does not open
    /// under `afterFirstUnlock` is EACCES: it may be the vault domain's.
    public static func open(_ sealed: [UInt8], dirIV: [UInt8], box: SealedBox?, afterFirstUnlock: SealedBox?) throws -> ProtectionClass {
        do {
            guard let box else { throw VaultError.metadataDamaged(what: "protection class") }
            let found = try open(sealed, dirIV: dirIV, box: box)
            guard found.domain == .vault else { throw VaultError.metadataDamaged(what: "protection class") }
            return found
        } catch VaultError.metadataDamaged(let what) where afterFirstUnlock != nil {
            guard let found = try? open(sealed, dirIV: dirIV, box: afterFirstUnlock!), found.domain == .afterFirstUnlock else {
                if box == nil { throw Errno(EACCES, "locked") }
                throw VaultError.metadataDamaged(what: what)
            }
            return found
        }
    }

    /// Opens a sealed record of the directory with IV `dirIV`: its class, or for a
    /// converting record the class it converts to.
    public static func open(_ sealed: [UInt8], dirIV: [UInt8], box: SealedBox) throws -> ProtectionClass {
        try openRecord(sealed, dirIV: dirIV, box: box).target
    }

    /// What a class file says (format 8 adds the converting record, docs/FORMAT.md §12).
    public enum Record: Equatable, Sendable {
        case settled(ProtectionClass)
        /// The directory's entries are being moved from `from`'s key domain to `to`'s;
        /// the record is sealed under `to`'s domain's metadata key.
        case converting(from: ProtectionClass, to: ProtectionClass)

        /// The class the directory has, or will have once converted.
        public var target: ProtectionClass {
            switch self {
            case .settled(let found), .converting(_, let found): return found
            }
        }
    }

    static func openRecord(_ sealed: [UInt8], dirIV: [UInt8], box: SealedBox) throws -> Record {
        let what = "protection class"
        guard sealed.count == fileSize || sealed.count == convertingFileSize else { throw VaultError.metadataDamaged(what: what) }
        let plain: [UInt8]
        do {
            plain = try box.openPublic(sealed, associatedData: associatedData(dirIV: dirIV), what: what)
        } catch CryptoError.sealedAuthenticationFailed {
            throw VaultError.metadataDamaged(what: what)
        }
        if plain.count == 2, plain[0] == recordVersion, let found = ProtectionClass(rawValue: plain[1]) { return .settled(found) }
        if plain.count == 3, plain[0] == convertingVersion, let from = ProtectionClass(rawValue: plain[1]),
           let to = ProtectionClass(rawValue: plain[2]), from.domain != to.domain {
            return .converting(from: from, to: to)
        }
        throw VaultError.metadataDamaged(what: what)
    }

    /// The record of backing directory `dir` (its class file alone; nil if it has none),
    /// opened as `read` opens it.
    public static func readRecord(in dir: Int32, dirIV: [UInt8], box: SealedBox?, afterFirstUnlock: SealedBox?) throws -> Record? {
        let sealed: [UInt8]
        do {
            sealed = try Sys.readFile(fileName, in: dir, limit: 256)
        } catch let error as Errno where error.code == ENOENT {
            return nil
        }
        let target = try open(sealed, dirIV: dirIV, box: box, afterFirstUnlock: afterFirstUnlock)
        let opener = target.domain == .afterFirstUnlock ? afterFirstUnlock : box
        return try opener.map { try openRecord(sealed, dirIV: dirIV, box: $0) } ?? .settled(target)
    }

    /// The converting record (`0x02 ‖ from ‖ this class`) of the directory with IV `dirIV`,
    /// sealed deterministically under `box`, as `sealed` seals a class record.
    public func sealedConverting(from: ProtectionClass, dirIV: [UInt8], box: SealedBox) throws -> [UInt8] {
        try [Self.convertingVersion, from.rawValue, rawValue].withUnsafeBytes {
            try box.sealDeterministically($0, associatedData: Self.associatedData(dirIV: dirIV))
        }
    }

    /// Marks backing directory `dir` as converting from class `from` to this class (format
    /// 8): the record, sealed deterministically under `box` (the metadata key of this
    /// class's domain), replaces the class file atomically.
    public func writeConverting(from: ProtectionClass, in dir: Int32, dirIV: [UInt8], box: SealedBox) throws {
        try AtomicFile.write(try sealedConverting(from: from, dirIV: dirIV, box: box), to: Self.fileName, in: dir, mode: 0o400)
        try AtomicFile.syncDirectory(dir)
    }

    /// Whether backing entry `name` is a sync engine's conflict copy of a class file (the
    /// class was set on two machines at once).
    public static func isConflictCopy(_ name: String) -> Bool { ConflictName.isCopy(name, of: fileName) }

    /// The class of backing directory `dir` (IV `dirIV`): no class file is `complete`;
    /// else the strictest of the class file and its conflict copies (two machines set
    /// the class at once: the stricter holds until the owner sets it again). A damaged
    /// record throws `metadataDamaged`; the caller then takes the directory as
    /// `complete`, which is never less safe. `entries`: a listing of `dir` already made,
    /// to look for copies in (nil: listed here, and only if the class file is there).
    /// `afterFirstUnlock`: the AFU domain's metadata key (format 8), else nil.
    public static func read(in dir: Int32, dirIV: [UInt8], box: SealedBox?, afterFirstUnlock: SealedBox? = nil,
                            entries: [String]? = nil) throws -> ProtectionClass {
        guard let own = try readRecord(fileName, in: dir, dirIV: dirIV, box: box, afterFirstUnlock: afterFirstUnlock) else { return .complete }
        let copies = try (entries ?? Sys.listDirectory(dir)).filter(isConflictCopy).sorted()
        return try copies.compactMap { try readRecord($0, in: dir, dirIV: dirIV, box: box, afterFirstUnlock: afterFirstUnlock) }.reduce(own, min)
    }

    /// The record in file `name` of `dir`, nil if there is none.
    private static func readRecord(_ name: String, in dir: Int32, dirIV: [UInt8], box: SealedBox?,
                                   afterFirstUnlock: SealedBox?) throws -> ProtectionClass? {
        do {
            return try open(try Sys.readFile(name, in: dir, limit: 256), dirIV: dirIV, box: box, afterFirstUnlock: afterFirstUnlock)
        } catch let error as Errno where error.code == ENOENT {
            return nil
        } catch let error as Errno where error.code == EINVAL || error.code == ELOOP {
            throw VaultError.metadataDamaged(what: "protection class (\(name) is not a regular file)")
        } catch let error as Errno where error.code == EFBIG {
            throw VaultError.metadataDamaged(what: "protection class (\(name) is too large)")
        }
    }

    /// Sets the class of backing directory `dir`: `complete` removes the class file,
    /// another class replaces it atomically (temp file, fsync, rename, fsync of the
    /// directory). Conflict copies of the file go: the owner's new choice settles them.
    public func write(in dir: Int32, dirIV: [UInt8], box: SealedBox) throws {
        if self == .complete {
            do {
                try Sys.unlink(Self.fileName, in: dir)
            } catch let error as Errno where error.code == ENOENT {}
        } else {
            try AtomicFile.write(try sealed(dirIV: dirIV, box: box), to: Self.fileName, in: dir, mode: 0o400)
        }
        for copy in try Sys.listDirectory(dir).filter(Self.isConflictCopy) { try? Sys.unlink(copy, in: dir) }
        try AtomicFile.syncDirectory(dir)
    }
}

// NameTransform maps plaintext names to backing names and back: encrypted with the
// directory's IV, base64url-encoded, and hashed into a long name (with a sidecar file
// holding the full encrypted name) when the encoding would exceed 255 bytes.
import CofferCrypto
import CofferSystem
import Glibc

/// The name a plaintext name is stored under in its backing directory.
public enum BackingName: Equatable {
    /// The base64url encrypted name itself (at most 255 bytes).
    case short(String)
    /// `coffer.long.<hash>` plus a sidecar `coffer.long.<hash>.name` holding `encoded`.
    case long(hashed: String, encoded: String)
    /// A sync engine's conflict copy of another entry (ConflictName): named by the
    /// engine, with no sidecar of its own (a long name's copy shares the original's).
    case conflictCopy(String)

    /// The directory entry's name in the backing directory.
    public var name: String {
        switch self {
        case .short(let name), .conflictCopy(let name): return name
        case .long(let hashed, _): return hashed
        }
    }

    /// The sidecar file's name, for long names.
    public var sidecar: String? {
        if case .long(let hashed, _) = self { return hashed + NameTransform.sidecarSuffix }
        return nil
    }
}

public struct NameTransform: Sendable {
    /// Longest plaintext name Linux accepts (NAME_MAX).
    public static let maxNameLength = 255
    /// Longest backing name the backing file system accepts.
    public static let maxBackingNameLength = 255
    /// Prefix of hashed long names; '.' never occurs in base64url, so it cannot collide.
    public static let longNamePrefix = "coffer.long."
    /// Suffix of the sidecar file that holds a long name's full encrypted name.
    public static let sidecarSuffix = ".name"
    /// Longest plaintext name stored directly: 159 bytes encrypt to 176, encoded 235.
    public static let maxShortPlainLength = 159

    private let cipher: NameCipher

    public init(cipher: NameCipher) { self.cipher = cipher }

    /// Checks that `name` is a name Linux would accept in a directory.
    public static func validate(_ name: [UInt8]) throws {
        guard name.count <= maxNameLength else { throw VaultError.nameTooLong }
        guard !name.isEmpty, name != [0x2e], name != [0x2e, 0x2e],
              !name.contains(0x2f), !name.contains(0) else { throw VaultError.invalidName }
    }

    /// The backing name of plaintext `name` in the directory with IV `dirIV`.
    public func backingName(for name: [UInt8], dirIV: [UInt8]) throws -> BackingName {
        try Self.validate(name)
        let encoded = Base64URL.encode(try cipher.encrypt(name, dirIV: dirIV))
        if encoded.utf8.count <= Self.maxBackingNameLength { return .short(encoded) }
        return .long(hashed: Self.longNamePrefix + Base64URL.encode(Hash.blake2b256(Array(encoded.utf8))),
                     encoded: encoded)
    }

    /// True for backing entries that are not user files (IV, config, sidecars, temp files).
    public static func isReserved(_ backingName: String) -> Bool {
        backingName.hasPrefix("coffer.") && !isLongName(backingName) || backingName.hasPrefix(".")
    }

    /// The long-name sidecars among `entries` whose entry is missing (a crash between
    /// writing the sidecar and making the entry, or removing them).
    public static func orphanSidecars(_ entries: [String]) -> [String] {
        let present = Set(entries)
        return entries.filter {
            $0.hasPrefix(longNamePrefix) && $0.hasSuffix(sidecarSuffix) && !present.contains(String($0.dropLast(sidecarSuffix.count)))
        }
    }

    static func isLongName(_ backingName: String) -> Bool {
        backingName.hasPrefix(longNamePrefix) && !backingName.hasSuffix(sidecarSuffix)
    }

    /// The plaintext name of backing entry `backingName` in directory `dir`, or nil if
    /// the entry is reserved (or a sync engine's copy of a reserved file). A conflict
    /// copy of an entry gets the name `ConflictName.display` gives it. Throws
    /// `nameDamaged`/`longNameDamaged` for foreign or tampered names: the whole backing
    /// name must be an encrypted name, a long name or such a copy of one.
    public func plaintextName(ofBacking backingName: String, dirIV: [UInt8], in dir: Int32) throws -> [UInt8]? {
        if Self.isReserved(backingName) { return nil }
        guard let copy = ConflictName.parse(backingName: backingName) else {
            return try plaintextName(ofEntry: backingName, dirIV: dirIV, in: dir)
        }
        let original = String(decoding: copy.original, as: UTF8.self)
        if Self.isReserved(original) { return nil }
        do {
            guard let shown = ConflictName.display(original: try plaintextName(ofEntry: original, dirIV: dirIV, in: dir),
                                                   markers: copy.markers) else { throw VaultError.nameTooLong }
            return shown
        } catch {
            throw VaultError.nameDamaged(backingName: backingName)
        }
    }

    /// The backing name of the conflict copy shown as plaintext `name` (see
    /// `ConflictName`), if `exists` finds one of its possible spellings; nil for names
    /// that are no copy's.
    public func conflictCopyName(for name: [UInt8], dirIV: [UInt8], exists: (String) -> Bool) throws -> BackingName? {
        guard let copy = ConflictName.parse(plaintext: name) else { return nil }
        let original = try backingName(for: copy.original, dirIV: dirIV)
        return ConflictName.backingCandidates(original: original.name, markers: copy.markers)
            .first(where: exists).map(BackingName.conflictCopy)
    }

    /// The plaintext name of an encrypted name or a long name (no conflict markers).
    private func plaintextName(ofEntry backingName: String, dirIV: [UInt8], in dir: Int32) throws -> [UInt8] {
        var encoded = backingName
        if Self.isLongName(backingName) {
            guard let sidecar = try? Sys.readFile(backingName + Self.sidecarSuffix, in: dir, limit: 4096),
                  case let text = String(decoding: sidecar, as: UTF8.self),
                  Self.longNamePrefix + Base64URL.encode(Hash.blake2b256(sidecar)) == backingName else {
                throw VaultError.longNameDamaged(backingName: backingName)
            }
            encoded = text
        }
        do {
            return try cipher.decrypt(Base64URL.decode(encoded), dirIV: dirIV)
        } catch {
            throw VaultError.nameDamaged(backingName: backingName)
        }
    }

    /// Writes the sidecar of a long name, durably (no-op for short names). Call before
    /// creating the entry itself, so a crash leaves at worst an orphan sidecar, never a
    /// nameless file. Returns true if this call created the sidecar (the caller removes
    /// it again if creating the entry fails). An existing sidecar with the right content
    /// is kept; a damaged one (a torn earlier write) is rewritten.
    @discardableResult
    public static func writeSidecar(_ name: BackingName, in dir: Int32) throws -> Bool {
        guard case .long(_, let encoded) = name, let sidecar = name.sidecar else { return false }
        return try writeSidecar(Array(encoded.utf8), named: sidecar, in: dir)
    }

    /// Writes `content` as the sidecar file `sidecar` of `dir`, durably and mode 0400, as
    /// `writeSidecar(_:in:)` does (also used for long symlink targets).
    static func writeSidecar(_ content: [UInt8], named sidecar: String, in dir: Int32) throws -> Bool {
        for _ in 0..<2 {
            guard let fd = try createExclusive(sidecar, in: dir) else {
                if (try? Sys.readFile(sidecar, in: dir, limit: 4096)) == content { return false }
                try Sys.unlink(sidecar, in: dir)
                continue
            }
            do {
                try content.withUnsafeBytes { try Sys.writeFully(fd.rawValue, $0, at: 0) }
                try Sys.fsync(fd.rawValue)
            } catch {
                try? Sys.unlink(sidecar, in: dir)
                throw error
            }
            return true
        }
        throw Errno(EEXIST, "sidecar \(sidecar)")
    }

    /// Creates `name` in `dir` for writing, mode 0400; nil if it exists already.
    private static func createExclusive(_ name: String, in dir: Int32) throws -> FileDescriptor? {
        do {
            return try FileDescriptor.open(name, in: dir, flags: O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode: 0o400)
        } catch let error as Errno where error.code == EEXIST {
            return nil
        }
    }

    /// Removes the sidecar of a long name once its entry is gone (no-op for short names).
    public static func removeSidecar(_ name: BackingName, in dir: Int32) {
        if let sidecar = name.sidecar { try? Sys.unlink(sidecar, in: dir) }
    }

    /// Removes the sidecar of backing entry `backingName` once it is gone, if it is a long
    /// name (no-op for any other name).
    public static func removeSidecar(ofEntry backingName: String, in dir: Int32) {
        if isLongName(backingName) { try? Sys.unlink(backingName + sidecarSuffix, in: dir) }
    }
}

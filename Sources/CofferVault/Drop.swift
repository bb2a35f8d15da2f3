// Files and directories made while the vault is locked (format 6, docs/FORMAT.md §12):
// a *drop*. Its name is sealed to the drop key (DropName) and its content is sealed
// under a random key of its own, which a key record at the vault root holds sealed to
// the drop key too (DropRecord). Writing either needs only the public key; reading needs
// the secret key, so a daemon that is locked can take new files without holding
// anything that reads older ones. From format 7 the sealed name also holds a binding to
// the drop's directory and to the drop itself, and a conversion marks its key record
// placed, so that a drop converts once, where it was made.
import CofferCrypto
import CofferSystem
import Glibc

public enum DropName {
    /// How the backing name of a drop begins (a name with a `.` is never an encrypted name).
    public static let prefix = "coffer.drop."
    /// The longest plaintext name a drop can have: its sealed form (the name padded to
    /// 16 bytes, plus 48, plus the 16-byte binding from format 7) must fit a backing name
    /// of 255 bytes. A longer name made while locked is ENAMETOOLONG.
    public static func maxNameLength(bound: Bool) -> Int { bound ? 111 : 127 }

    /// Bytes of a drop's binding (format 7).
    public static let bindingSize = 16

    public static func isDrop(_ backingName: String) -> Bool { backingName.hasPrefix(prefix) }

    /// The binding of a drop (format 7): the first 16 bytes of BLAKE2b-256("coffer.drop"
    /// ‖ 0x00 ‖ the IV of its directory ‖ its own ID), the ID a file's file ID, a
    /// directory's own IV. Sealed with the name: only the holder of the drop key's public
    /// half, the mount, makes one, and a conversion accepts a drop only where it fits.
    public static func binding(dirIV: [UInt8], id: [UInt8]) -> [UInt8] {
        Array(Hash.blake2b256(Array("coffer.drop\0".utf8) + dirIV + id).prefix(bindingSize))
    }

    /// The backing name of a drop shown as `name`: prefix ‖ base64url(sealed([binding ‖]
    /// name ‖ PKCS#7 padding to 16)), the binding from format 7. Random: the same name
    /// sealed twice differs.
    public static func encode(_ name: [UInt8], binding: [UInt8]? = nil, to publicKey: [UInt8]) throws -> String {
        try NameTransform.validate(name)
        guard name.count <= maxNameLength(bound: binding != nil) else { throw VaultError.nameTooLong }
        precondition(binding == nil || binding!.count == bindingSize)
        let pad = NameCipher.padding - name.count % NameCipher.padding
        let padded = (binding ?? []) + name + [UInt8](repeating: UInt8(pad), count: pad)
        return prefix + Base64URL.encode(padded.withUnsafeBytes { DropKeys.seal($0, to: publicKey) })
    }

    /// The name a drop `name` takes when its own is taken at its conversion: "NAME
    /// (dropped MARK)", the name cut to fit 255 bytes.
    public static func alternative(_ name: [UInt8], mark: String) -> [UInt8] {
        let suffix = Array(" (dropped \(mark))".utf8)
        return Array(name.prefix(NameTransform.maxNameLength - suffix.count)) + suffix
    }

    /// The plaintext name of drop `backingName` and, if `bound` (format 7), its binding;
    /// `nameDamaged` if it does not open.
    public static func decode(_ backingName: String, keys: DropKeys, bound: Bool) throws -> (name: [UInt8], binding: [UInt8]?) {
        let damaged = VaultError.nameDamaged(backingName: backingName)
        guard isDrop(backingName), let sealed = try? Base64URL.decode(String(backingName.dropFirst(prefix.count))),
              let opened = try? keys.open(sealed, what: "dropped name") else { throw damaged }
        var padded = opened.withUnsafeBytes { Array($0) }
        var binding: [UInt8]?
        if bound {
            guard padded.count > bindingSize else { throw damaged }
            binding = Array(padded.prefix(bindingSize))
            padded.removeFirst(bindingSize)
        }
        guard let pad = padded.last, pad >= 1, Int(pad) <= NameCipher.padding, Int(pad) <= padded.count,
              padded.suffix(Int(pad)).allSatisfy({ $0 == pad }) else { throw damaged }
        let name = Array(padded.dropLast(Int(pad)))
        guard (try? NameTransform.validate(name)) != nil else { throw damaged }
        return (name, binding)
    }
}

/// A symlink made while locked (format 8, docs/FORMAT.md §12, "Symlinks made while
/// locked"): a backing symlink under a drop's name whose target is the plaintext target
/// sealed to the drop key, base64url-encoded.
public enum SymlinkDrop {
    /// The longest target made while locked: sealed and encoded, it must fit a backing
    /// symlink (4095 bytes). A longer one is ENAMETOOLONG while locked.
    public static let maxTargetLength = 3008
    /// What a conversion names its new symlink before renaming it into place.
    public static let temporaryPrefix = ".coffer.link."

    /// The backing symlink target of plaintext `target`, sealed to `publicKey`.
    public static func seal(_ target: [UInt8], to publicKey: [UInt8]) -> String {
        Base64URL.encode(target.withUnsafeBytes { DropKeys.seal($0, to: publicKey) })
    }

    /// The sealed bytes of backing target `linkTarget`, or nil if it is not base64url.
    public static func sealed(_ linkTarget: String) -> [UInt8]? { try? Base64URL.decode(linkTarget) }

    /// The ID the drop's binding takes: the first 16 bytes of BLAKE2b-256 of its sealed
    /// target.
    public static func id(sealed: [UInt8]) -> [UInt8] { Array(Hash.blake2b256(sealed).prefix(16)) }

    /// The nonce its conversion seals the target under (§7's codec): the first 24 bytes
    /// of BLAKE2b-256("coffer.link" ‖ 0x00 ‖ sealed target). Every machine converting the
    /// drop writes the same symlink; no two drops share it.
    public static func conversionNonce(sealed: [UInt8]) -> [UInt8] {
        Array(Hash.blake2b256(Array("coffer.link\0".utf8) + sealed).prefix(24))
    }

    /// The temporary name of its conversion: the prefix and the hex of the ID's first 8 bytes.
    public static func temporaryName(id: [UInt8]) -> String {
        temporaryPrefix + id.prefix(8).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    }
}

public enum DropRecord {
    /// The directory at the vault root that holds the key records.
    public static let directory = "coffer.drops"
    static let version: UInt8 = 1
    /// The version of a record whose file a conversion placed (format 7): it still gives
    /// the key, and it tells a copy of the file planted again from the file itself. Sealed
    /// deterministically under K_metadata, so every machine that converts the file writes
    /// the same bytes (no conflict for a sync engine), and the record sealed to the drop
    /// key is gone.
    static let placedVersion: UInt8 = 2
    /// Bytes of a placed record: nonce (24) ‖ AEAD_seal(K_metadata, version ‖ file ID ‖ key).
    public static let placedFileSize = SealedBox.nonceSize + plainSize + SealedBox.tagSize

    /// The AD of the placed record of file `id`.
    static func placedAssociatedData(_ id: FileID) -> [UInt8] { Array("coffer.drop.placed\0".utf8) + id.bytes }
    /// Plaintext of a record: version ‖ file ID ‖ key.
    static let plainSize = 1 + FileID.size + 32
    /// Bytes of a record file.
    public static let fileSize = plainSize + DropKeys.overhead

    /// The record's file name: base64url of the file ID.
    public static func fileName(_ id: FileID) -> String { Base64URL.encode(id.bytes) }

    /// Writes the record of file `id`, key `key`, sealed to `publicKey`, durably (file and
    /// directory fsynced) before the file is made: a file whose fsync returned must never
    /// lack its key after a power cut.
    public static func write(key: SecureBytes, fileID id: FileID, to publicKey: [UInt8], root: Int32) throws {
        do {
            try Sys.mkdir(directory, in: root, mode: 0o700)
            try AtomicFile.syncDirectory(root)
        } catch let error as Errno where error.code == EEXIST {}
        let dir = try FileDescriptor.open(directory, in: root, flags: O_PATH | O_DIRECTORY | O_NOFOLLOW)
        let sealed = seal(key: key, fileID: id, version: version, to: publicKey)
        let fd = try FileDescriptor.open(fileName(id), in: dir.rawValue, flags: O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode: 0o400)
        do {
            try sealed.withUnsafeBytes { try Sys.writeFully(fd.rawValue, $0, at: 0) }
            try Sys.fsync(fd.rawValue)
        } catch {
            try? Sys.unlink(fileName(id), in: dir.rawValue)
            throw error
        }
        try AtomicFile.syncDirectory(dir.rawValue)
    }

    /// Marks the record of file `id` placed (format 7, at its conversion): the same key,
    /// version 2, sealed under K_metadata (`metadata`), written atomically over the record
    /// (temp file, fsync, rename, fsync).
    public static func markPlaced(key: SecureBytes, fileID id: FileID, metadata: SealedBox, root: Int32) throws {
        let dir = try FileDescriptor.open(directory, in: root, flags: O_PATH | O_DIRECTORY | O_NOFOLLOW)
        let plain = plaintext(key: key, fileID: id, version: placedVersion)
        defer { plain.wipe() }
        let sealed = try plain.withUnsafeBytes { try metadata.sealDeterministically($0, associatedData: placedAssociatedData(id)) }
        try AtomicFile.write(sealed, to: fileName(id), in: dir.rawValue, mode: 0o400)
    }

    /// seal(version ‖ file ID ‖ key) to `publicKey`.
    static func seal(key: SecureBytes, fileID id: FileID, version: UInt8, to publicKey: [UInt8]) -> [UInt8] {
        let plain = plaintext(key: key, fileID: id, version: version)
        defer { plain.wipe() }
        return plain.withUnsafeBytes { DropKeys.seal($0, to: publicKey) }
    }

    /// version ‖ file ID ‖ key, in sodium memory.
    static func plaintext(key: SecureBytes, fileID id: FileID, version: UInt8) -> SecureBytes {
        let plain = SecureBytes(count: plainSize)
        plain.withUnsafeMutableBytes { out in
            out[0] = version
            out.baseAddress!.advanced(by: 1).copyMemory(from: id.bytes, byteCount: FileID.size)
            key.withUnsafeBytes { out.baseAddress!.advanced(by: 1 + FileID.size).copyMemory(from: $0.baseAddress!, byteCount: 32) }
        }
        return plain
    }

    /// The key of sealed file `id`: `metadataDamaged` if its record is missing, does not
    /// open, or names another file.
    public static func read(fileID id: FileID, root: Int32, keys: KeySet) throws -> SecureBytes {
        try readRecord(fileID: id, root: root, keys: keys).key
    }

    /// The key of sealed file `id` and whether a conversion placed its file (format 7:
    /// the record sealed under K_metadata); `metadataDamaged` if its record is missing,
    /// does not open, or names another file.
    public static func readRecord(fileID id: FileID, root: Int32, keys: KeySet) throws -> (key: SecureBytes, placed: Bool) {
        let what = "key record \(directory)/\(fileName(id)) of a file made while locked"
        let bytes: [UInt8]
        do {
            bytes = try Sys.readFile(directory + "/" + fileName(id), in: root, limit: 4096)
        } catch let error as Errno where [ENOENT, EINVAL, ELOOP, ENOTDIR].contains(error.code) {
            throw VaultError.metadataDamaged(what: what + " (missing)")
        } catch let error as Errno where error.code == EFBIG {
            throw VaultError.metadataDamaged(what: what + " (too large)")
        }
        let placed = bytes.count == placedFileSize
        let opened = placed ? try? keys.metadata.open(bytes, associatedData: placedAssociatedData(id), what: what)
            : bytes.count == fileSize ? try? keys.drops?.open(bytes, what: what) : nil
        guard let plain = opened else { throw VaultError.metadataDamaged(what: what) }
        let fits = plain.withUnsafeBytes { $0[0] == (placed ? placedVersion : version) && Array($0[1...FileID.size]) == id.bytes }
        guard fits else {
            plain.wipe()
            throw VaultError.metadataDamaged(what: what)
        }
        let key = SecureBytes(count: 32)
        plain.withUnsafeBytes { p in key.withUnsafeMutableBytes { $0.copyMemory(from: UnsafeRawBufferPointer(rebasing: p[(1 + FileID.size)...])) } }
        plain.wipe()
        return (key, placed)
    }

    /// Removes the record of file `id` (its file is gone); nothing if there is none.
    public static func remove(fileID id: FileID, root: Int32) {
        _ = try? Sys.unlink(directory + "/" + fileName(id), in: root)
    }

    /// The file IDs that have records (for fsck: a record whose file is gone is a leftover).
    public static func recorded(root: Int32) -> [String] {
        guard let dir = try? FileDescriptor.open(directory, in: root, flags: O_RDONLY | O_DIRECTORY | O_NOFOLLOW) else { return [] }
        return ((try? Sys.listDirectory(dir.rawValue)) ?? []).filter { !$0.hasPrefix(".") }
    }
}

/// The rule (docs/FORMAT.md §12, "Conversion") by which an entry found under a drop's
/// backing name — not one this mount made in its own lock — may become an ordinary entry.
/// Anyone who can write CIPHERDIR and once saw a drop's backing name can copy anything
/// under it: another file's content, a converted drop, a directory from elsewhere. Only
/// what the drop mechanism itself made, and never placed, is taken; the rest is damage.
/// The mount's conversion and fsck both ask this type.
public enum FoundDrop {
    /// The IV a directory made while locked gets at its conversion: the first 16 bytes of
    /// BLAKE2b-256("coffer.dropdir" ‖ 0x00 ‖ its backing name).
    public static func directoryIV(backingName: String) -> [UInt8] {
        Array(Hash.blake2b256(Array("coffer.dropdir\0".utf8) + Array(backingName.utf8)).prefix(NameCipher.ivSize))
    }

    /// The mark of "NAME (dropped MARK)" for drop `backingName`: the hex of the first 4
    /// bytes of BLAKE2b-256 of it, the same on every machine.
    public static func mark(backingName: String) -> String {
        Hash.blake2b256(Array(backingName.utf8)).prefix(4).map { String(format: "%02x", $0) }.joined()
    }

    /// Why a file found under a drop's name is refused, or nil if it may take the place
    /// whose tag is `expectedTag`: a file made while locked (header version 3) that was
    /// never placed (a zero tag) and whose key record opens (`recordOpens`), or one a
    /// conversion interrupted by a crash placed at that very place already.
    public static func fileRefusal(_ header: FileHeader, expectedTag: [UInt8], recordOpens: () -> Bool) -> String? {
        guard header.isSealed else {
            return "not a file made while locked (its key is derived from its ID): another file's content copied under a drop's name"
        }
        let tag = header.placeTag ?? []
        if tag.allSatisfy({ $0 == 0 }) {
            return recordOpens() ? nil : "its key record is missing or does not open"
        }
        return PlaceMAC.equal(tag, expectedTag) ? nil : "it was placed under another name already: a copy of a converted file"
    }

    /// Why a directory found under a drop's name is refused, or nil: one made while locked
    /// has no IV file until its conversion, which writes the derived IV (`derivedIV`) with
    /// the tag of its place (`fitsPlace`, for an IV file a crash left behind).
    public static func directoryRefusal(_ record: DirectoryIV.Record?, derivedIV: [UInt8], fitsPlace: Bool) -> String? {
        guard let record else { return nil }
        return record.iv == derivedIV && fitsPlace ? nil : "a directory from elsewhere under a drop's name (it has an IV file of its own)"
    }
}

extension FoundDrop {
    /// Format 7: why a file found under a drop's name, whose sealed name holds `binding`,
    /// is refused in the directory of IV `dirIV`, or nil. Its binding must be this
    /// directory's and the file's own ID's (a drop moved to another directory, or another
    /// file under its name, fits none). Then a file made while locked (header 3) is taken
    /// if it was never placed and its key record (`record`: nil if missing, else whether
    /// it is marked placed) is not marked placed — a copy planted again after its
    /// conversion is — or if a conversion a crash interrupted placed it at this very
    /// place (`expectedTag`); a file from before the lock that the mount renamed while
    /// locked (header 2) is taken as the binding the mount sealed says.
    public static func boundFileRefusal(_ header: FileHeader, binding: [UInt8]?, dirIV: [UInt8], expectedTag: [UInt8],
                                        record: () -> Bool?) -> String? {
        guard binding == DropName.binding(dirIV: dirIV, id: header.fileID.bytes) else {
            return "it was made for another directory or another file"
        }
        guard header.isSealed else { return nil }
        let tag = header.placeTag ?? []
        if tag.allSatisfy({ $0 == 0 }) {
            switch record() {
            case nil: return "its key record is missing or does not open"
            case true?: return "it was converted already: a copy of it planted again"
            case false?: return nil
            }
        }
        return PlaceMAC.equal(tag, expectedTag) ? nil : "it was placed under another name already: a copy of a converted file"
    }

    /// Format 7: why a directory found under a drop's name is refused, or nil. A directory
    /// made while locked has its IV file from the start, its tags zero until its
    /// conversion; the binding must be this directory's (`dirIV`) and that IV's. One a
    /// conversion a crash interrupted tagged already must fit its place (`fitsPlace`).
    public static func boundDirectoryRefusal(_ record: DirectoryIV.Record?, binding: [UInt8]?, dirIV: [UInt8], fitsPlace: Bool) -> String? {
        guard let record else { return "it has no IV file (a directory made while locked has one from the start)" }
        guard binding == DropName.binding(dirIV: dirIV, id: record.iv) else {
            return "it was made for another directory, or holds another directory's IV"
        }
        if record.tags.allSatisfy({ $0.allSatisfy { $0 == 0 } }) { return nil }
        return fitsPlace ? nil : "it was placed elsewhere already"
    }
}

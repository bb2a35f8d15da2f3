// VaultError lists every way the backing directory can be unusable or damaged.
import CofferCrypto
import CofferSystem

/// What was too long in a `tooLong` error.
public enum TooLongItem: String, Sendable {
    case symlinkTarget = "symlink target"
    case xattrName = "xattr name"
    case xattrValue = "xattr value"
}

public enum VaultError: Error, Equatable, CustomStringConvertible {
    /// The directory has no coffer.conf.
    case notAVault(path: String)
    /// No config, and only what an interrupted `init` leaves (`init` may be run again).
    case interruptedInit(path: String)
    /// A reverse view's directory without its config (docs/FORMAT.md §14).
    case notAReverseSource(path: String)
    /// `init --reverse` of a directory that has a view's config already.
    case reverseConfigExists(path: String)
    /// coffer.conf is not valid JSON of the expected shape.
    case configMalformed(reason: String)
    /// coffer.conf's parameters do not match their checksum (edited or damaged).
    case configDamaged
    /// coffer.conf names a format version this build does not know.
    case unsupportedFormat(version: Int)
    /// coffer.conf asks for a cipher, block size or KDF this build does not offer.
    case unsupportedParameter(String)
    /// The vault's content cipher needs CPU instructions this machine lacks.
    case cipherUnavailable(String)
    /// coffer.conf's KDF parameters are below the floor (or absurdly above the ceiling).
    case kdfParametersRefused(opsLimit: UInt64, memLimit: UInt64)
    /// The passphrase does not open the passphrase key slot.
    case wrongPassphrase
    /// The recovery key does not open the recovery key slot.
    case wrongRecoveryKey
    /// The slot key does not open the tpm2 or keyring slot of that id (or there is none).
    case wrongSlotKey
    /// The config has no key slot of this kind.
    case missingKeySlot(kind: String)
    /// Another daemon serves this vault already (VaultClaim).
    case alreadyMounted(path: String)
    /// `init` needs an empty directory.
    case directoryNotEmpty(path: String)
    /// A path that must be a directory is something else or missing.
    case notADirectory(path: String)
    /// A file header is shorter than 18 bytes or has an unknown version.
    case fileHeaderDamaged(reason: String)
    /// A ciphertext file's length is impossible (cut inside a block's nonce or tag).
    case fileTruncated(cipherSize: Int64)
    /// The content's place tag fits neither the entry's name nor its directory (format 4):
    /// content copied or moved there from another name or directory.
    case placeMismatch
    /// A content block failed authentication.
    case blockDamaged(blockIndex: UInt64)
    /// A backing name failed to decrypt or authenticate.
    case nameDamaged(backingName: String)
    /// A long-name sidecar is missing, or does not match the hashed name.
    case longNameDamaged(backingName: String)
    /// A long symlink target's sidecar is missing, or does not match the name the link gives.
    case symlinkSidecarDamaged(reference: String)
    /// A directory's IV file is missing or of the wrong length.
    case directoryIVDamaged(reason: String)
    /// The IV file (or the conflict copy of it) with this name was not made for this
    /// directory (format 5): copied in from another one, or the directory's contents
    /// were moved here from under another name.
    case directoryIVMisplaced(String)
    /// A write, truncate or fsync through a descriptor whose backing file another program
    /// replaced or removed after it was opened (ESTALE): refused, not damage.
    case replacedByOtherWriter
    /// A plaintext name is longer than 255 bytes (ENAMETOOLONG).
    case nameTooLong
    /// A plaintext name is empty, ".", "..", or contains '/' or NUL.
    case invalidName
    /// A symlink target, xattr name or value too long for the backing file system.
    case tooLong(TooLongItem)
    /// A sealed metadata item (symlink target, xattr value) failed authentication.
    case metadataDamaged(what: String)
    /// An entry under a drop's backing name that the drop mechanism did not make (FoundDrop).
    case dropRefused(reason: String)
    /// The undo journal (coffer.journal) is not a file coffer can use.
    case journalDamaged(reason: String)
    /// A directory argument's path is longer than Linux allows (ENAMETOOLONG).
    case pathTooLong(path: String)
    /// No key slot has this label or id (keyslot remove, passwd --slot).
    case slotNotFound(String)
    /// A label a slot cannot have (empty, too long, control characters, a built-in one).
    case invalidSlotLabel(String)
    /// A slot with this label exists already (keyslot add).
    case slotLabelTaken(String)
    /// This label names several slots (added on two machines at once): give an id.
    case slotAmbiguous(label: String, ids: [String])
    /// Removing these slots would leave the vault with no way in.
    case lastWayIn(String)

    public var description: String {
        switch self {
        case .notAVault(let path): return "\(path) is not a coffer vault (no \(VaultConfig.fileName))"
        case .interruptedInit(let path):
            return "\(path) is not a coffer vault (no \(VaultConfig.fileName)): it holds what an init cut short leaves (or a wipe "
                + "of an empty vault); coffer init makes a vault there"
        case .notAReverseSource(let path):
            return "\(path) has no reverse view's config (\(ReverseFormat.configName)): make one with coffer init --reverse \(path)"
        case .reverseConfigExists(let path):
            return """
                \(path) has a reverse view's config already (\(ReverseFormat.configName)); it keeps its key, and a new one would change \
                every byte of the view
                """
        case .alreadyMounted(let path): return "\(path) is already mounted by another coffer daemon (one vault, one mount)"
        case .configMalformed(let reason): return "the vault config is malformed: \(reason)"
        case .configDamaged: return "the vault config was modified or damaged: its parameters do not match their checksum"
        case .unsupportedFormat(let v):
            return "the vault has format version \(v), which this coffer does not support "
                + "(it knows versions \(VaultConfig.supportedFormats.lowerBound) to \(VaultConfig.supportedFormats.upperBound))"
        case .unsupportedParameter(let p): return "the vault config asks for an unsupported \(p)"
        case .cipherUnavailable(let name):
            return "the vault's content cipher \(name) needs AES-NI and PCLMUL, which this CPU lacks; "
                + "open it on a machine that has them (its data is intact)"
        case .kdfParametersRefused(let ops, let mem):
            return "the vault config's key-derivation parameters (ops \(ops), memory \(mem >> 20) MiB) "
                + "are outside the accepted range; refusing to use them"
        case .wrongPassphrase: return "wrong passphrase"
        case .wrongRecoveryKey: return "wrong recovery key"
        case .wrongSlotKey: return "the slot key does not open that key slot (removed, or its file was modified)"
        case .missingKeySlot(let kind): return "the vault config has no \(kind) key slot (removed? coffer keyslot list shows the vault's slots)"
        case .directoryNotEmpty(let path): return "\(path) is not empty"
        case .notADirectory(let path): return "\(path) is not a directory"
        case .pathTooLong(let path): return PathText.tooLong(path)
        case .fileHeaderDamaged(let reason): return "file header damaged: \(reason)"
        case .placeMismatch: return "its content belongs to another name or directory (copied or moved there from outside the mount)"
        case .fileTruncated(let size):
            return "file truncated: a ciphertext length of \(size) bytes cuts a block (or, from format 4, ends without a final block)"
        case .blockDamaged(let index): return "block \(index) failed authentication"
        case .nameDamaged(let name): return "encrypted name \(name) failed authentication"
        case .longNameDamaged(let name): return "long-name sidecar of \(name) is missing or damaged"
        case .symlinkSidecarDamaged(let reference): return "symlink-target sidecar \(reference) is missing or damaged"
        case .directoryIVDamaged(let reason): return "directory IV damaged: \(reason)"
        case .replacedByOtherWriter: return "another program replaced or removed the backing file after it was opened; write refused"
        case .directoryIVMisplaced(let name):
            return "directory IV damaged: \(name) belongs to another directory "
                + "(copied here, or this directory's contents moved here, from outside the mount)"
        case .nameTooLong: return "file name too long (more than 255 bytes)"
        case .invalidName: return "invalid file name"
        case .tooLong(let item): return "\(item.rawValue) too long"
        case .metadataDamaged(let what): return "\(what) failed authentication"
        case .dropRefused(let reason): return "an entry under the backing name of a file made while locked is refused: \(reason)"
        case .journalDamaged(let reason): return "undo journal damaged: \(reason)"
        case .slotNotFound(let what): return "no key slot has the label or id \"\(what)\" (coffer keyslot list shows them)"
        case .invalidSlotLabel(let why): return "invalid slot label: \(why)"
        case .slotLabelTaken(let label): return "a key slot labelled \"\(label)\" exists already; choose another label"
        case .slotAmbiguous(let label, let ids):
            return "the label \"\(label)\" names \(ids.count) slots (added on two machines at once?); "
                + "give one of their ids: \(ids.joined(separator: ", "))"
        case .lastWayIn(let what): return "refusing to remove \(what): it is the vault's last way in (add another slot first)"
        }
    }
}

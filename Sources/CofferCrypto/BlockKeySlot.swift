// BlockKeySlot keeps one file's block key ready while the file is open: its per-file key,
// for AES-256-GCM expanded (libsodium's state or ipsec-mb's key data), in sodium memory,
// made at the first block the file seals or opens and wiped at its last close or the lock.
import Synchronization

public final class BlockKeySlot: Sendable {
    /// A prepared key, the key it was made from (its owner: a cipher's key object), and
    /// the file and form it was made for.
    struct Entry {
        let owner: SecureBytes
        let fileID: FileID
        let kind: ContentCipher.BlockKey.Kind
        let prepared: SecureBytes
    }

    /// Open files of the inode and the key prepared for them; a leaf lock.
    private let state = Mutex<(openFiles: Int, entry: Entry?)>((0, nil))

    public init() {}

    /// An open file of the inode was made: from now on, keys prepared for it are kept.
    public func fileOpened() { state.withLock { $0.openFiles += 1 } }

    /// An open file of the inode ended; with the last one, the prepared key is wiped.
    public func fileClosed() {
        let ending = state.withLock { state -> Entry? in
            state.openFiles -= 1
            guard state.openFiles == 0 else { return nil }
            defer { state.entry = nil }
            return state.entry
        }
        ending?.prepared.retire()
    }

    /// Wipes the prepared key (the lock): an operation using it finishes first, later
    /// ones prepare it again if their cipher's key is still there.
    public func wipe() {
        let ending = state.withLock { state -> Entry? in
            defer { state.entry = nil }
            return state.entry
        }
        ending?.prepared.retire()
    }

    /// True while a prepared key is held (for tests).
    public var holdsKey: Bool { state.withLock { $0.entry != nil } }

    /// The key prepared from `owner` for `fileID` in form `kind`: the one kept, or one
    /// `make` fills now (of `size` bytes), kept while a file is open and `owner` is not
    /// retired. Nil while no file is open: the caller prepares a key for its call alone.
    func prepared(owner: SecureBytes, fileID: FileID, kind: ContentCipher.BlockKey.Kind, size: Int,
                  make: (SecureBytes) throws -> Void) throws -> SecureBytes? {
        let (kept, open) = state.withLock { ($0.entry, $0.openFiles > 0) }
        if let kept, kept.owner === owner, kept.fileID == fileID, kept.kind == kind { return kept.prepared }
        guard open else { return nil }
        let prepared = SecureBytes(count: size)
        try make(prepared)
        // Checked under the lock that `wipe` takes after the lock retires the owner: a key
        // made from the owner just before that is either wiped by `wipe` or not kept.
        let replaced = state.withLock { state -> Entry? in
            guard state.openFiles > 0, !owner.isRetired else { return nil }
            defer { state.entry = Entry(owner: owner, fileID: fileID, kind: kind, prepared: prepared) }
            return state.entry
        }
        replaced?.prepared.retire()
        return prepared
    }
}

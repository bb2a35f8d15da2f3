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

    /// Prepared keys kept at most, process-wide: each is a page of locked sodium memory
    /// (SecureArena; 1,024 of them fill 4 MiB of the 8 MiB an unprivileged process may
    /// lock), so a daemon with thousands of files open at once must not keep
    /// one per file. Files opened beyond it prepare their key per request, as every file
    /// did before keys were kept.
    public static let limit = 1024
    private static let kept = Atomic<Int>(0)

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
        Self.release(ending)
    }

    /// Wipes the prepared key (the lock): an operation using it finishes first, later
    /// ones prepare it again if their cipher's key is still there.
    public func wipe() {
        let ending = state.withLock { state -> Entry? in
            defer { state.entry = nil }
            return state.entry
        }
        Self.release(ending)
    }

    /// Zeroes an entry that was kept, and counts it out.
    private static func release(_ entry: Entry?) {
        guard let entry else { return }
        entry.prepared.retire()
        kept.subtract(1, ordering: .relaxed)
    }

    /// True while a prepared key is held (for tests).
    public var holdsKey: Bool { state.withLock { $0.entry != nil } }

    /// The key prepared from `owner` for `fileID` in form `kind`: the one kept, or one
    /// `make` fills now (of `size` bytes), kept while a file is open and `owner` is not
    /// retired. Nil while no file is open or `limit` keys are kept: the caller prepares
    /// a key for its call alone.
    func prepared(owner: SecureBytes, fileID: FileID, kind: ContentCipher.BlockKey.Kind, size: Int,
                  make: (SecureBytes) throws -> Void) throws -> SecureBytes? {
        let (current, open) = state.withLock { ($0.entry, $0.openFiles > 0) }
        if let current, current.owner === owner, current.fileID == fileID, current.kind == kind { return current.prepared }
        guard open else { return nil }
        // One more key kept, within the limit (one this replaces is counted out below).
        guard Self.kept.add(1, ordering: .relaxed).newValue <= Self.limit else {
            Self.kept.subtract(1, ordering: .relaxed)
            return nil
        }
        let prepared = SecureBytes.pooled(count: size)
        do {
            try make(prepared)
        } catch {
            Self.kept.subtract(1, ordering: .relaxed)
            throw error
        }
        // Checked under the lock that `wipe` takes after the lock retires the owner: a key
        // made from the owner just before that is either wiped by `wipe` or not kept.
        let (stored, replaced) = state.withLock { state -> (Bool, Entry?) in
            guard state.openFiles > 0, !owner.isRetired else { return (false, nil) }
            defer { state.entry = Entry(owner: owner, fileID: fileID, kind: kind, prepared: prepared) }
            return (true, state.entry)
        }
        Self.release(replaced)
        if !stored { Self.kept.subtract(1, ordering: .relaxed) }
        return prepared
    }
}

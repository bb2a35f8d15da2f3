// Listing directories of the plaintext view: a listing decrypts every name once, at the
// first readdir (or after a rewind); readdirplus then enters entries by their backing
// names.
import CofferCrypto
import CofferSystem
import CofferVault
import Glibc
import Logging
import Synchronization

/// One entry of a plaintext directory listing.
public struct ListedEntry: Sendable {
    public internal(set) var name: [UInt8]
    public let ino: UInt64
    /// d_type (DT_REG, DT_DIR, …).
    public let type: UInt8
    /// Its name in the backing directory ("." and ".." for themselves).
    let backingName: String

    /// "." or "..": listed, but never entered by readdirplus.
    public var isDotOrDotDot: Bool { backingName == "." || backingName == ".." }
}

/// An open directory: the node and the listing taken at its first READDIR (or at a
/// rewind's). The kernel sends one READDIR at a time per open directory; the lock, which
/// runs when no operation holds the keys, forgets a listing of plaintext names.
final class OpenDirectory: Sendable {
    let node: Node
    private let listing = Mutex<(entries: [ListedEntry], takenWhileLocked: Bool)>(([], false))

    var entries: [ListedEntry] {
        get { listing.withLock { $0.entries } }
        set { listing.withLock { $0.entries = newValue } }
    }
    /// The listing was taken while locked: only what was made since the lock.
    var takenWhileLocked: Bool {
        get { listing.withLock { $0.takenWhileLocked } }
        set { listing.withLock { $0.takenWhileLocked = newValue } }
    }

    init(node: Node) { self.node = node }

    /// The lock: a listing taken with the keys (the names of the directory, decrypted)
    /// goes; the next READDIR while locked answers EACCES, one after the unlock lists anew.
    func forgetListing() {
        listing.withLock { if !$0.takenWhileLocked { Self.wipe(&$0.entries) } }
    }

    /// The directory is closed: its listing goes, zeroed.
    func close() {
        listing.withLock { Self.wipe(&$0.entries) }
    }

    /// Zeroes the names of `entries` (those no one else holds: copy-on-write leaves what
    /// a READDIR in flight shares) and empties it.
    private static func wipe(_ entries: inout [ListedEntry]) {
        for i in entries.indices { entries[i].name.zeroInPlace() }
        entries = []
    }

    /// Retains this directory and returns its handle for the kernel; each call needs its own
    /// `release`, so call it once, where the handle is handed out.
    func issueHandle() -> UInt64 { Handles.make(self) }

    static func borrow(_ handle: UInt64) -> OpenDirectory { Handles.borrow(handle, as: OpenDirectory.self) }

    static func release(_ handle: UInt64) { Handles.release(handle, as: OpenDirectory.self) }
}

extension PlainFileSystem {
    public func opendir(_ id: UInt64) throws -> UInt64 {
        try inView(nodes.node(id), locked: { view in
            let directory = OpenDirectory(node: nodes.node(id))
            directory.entries = try lockedListing(view, nodes.node(id))
            directory.takenWhileLocked = true
            return openDirectories.add(directory)
        }) { _ in openDirectories.add(OpenDirectory(node: nodes.node(id))) }
    }

    /// Reads and decrypts the backing directory. A name that fails to decrypt is left
    /// out, with one log line: it is never shown as garbage.
    private func load(_ directory: OpenDirectory, keys: Keys) throws {
        let node = directory.node
        // ".." gets a placeholder inode number: 0 would make readdir(3) skip it.
        var entries = [ListedEntry(name: [0x2e], ino: node.ino, type: UInt8(DT_DIR), backingName: "."),
                       ListedEntry(name: [0x2e, 0x2e], ino: 1, type: UInt8(DT_DIR), backingName: "..")]
        let listing = try Sys.readDirectory(node.fd)
        let names: DirectoryNames
        do {
            names = try self.names(of: node, keys: keys, listed: listing.map(\.name))
        } catch let error as Errno where error.code == ENOENT && DirectoryIV.isArriving(node.fd) {
            // Arriving from a sync engine: nothing in it can be read until its IV file comes.
            directory.entries = entries
            return
        }
        var listed: Set<String>?
        for backing in listing {
            if DropName.isDrop(backing.name), keys.vault?.set.drops != nil {
                // Made while locked, and not converted yet (on another machine, or by a
                // daemon that ended while locked): an ordinary entry from now on.
                do {
                    let converted = try convert(backing.name, in: node, keys: keys)
                    // A symlink converted before a crash took the drop away: listed as itself.
                    if listed == nil { listed = Set(listing.map(\.name)) }
                    if listed?.contains(converted.backing) == true { continue }
                    entries.append(ListedEntry(name: converted.name, ino: backing.ino, type: backing.type, backingName: converted.backing))
                } catch {
                    logger.error("damage: in \(node.plaintextPath): an entry made while locked (\(backing.name)): \(error); entry hidden")
                }
                continue
            }
            do {
                guard let decoded = try names.decode(backing.name, in: node.fd) else { continue }
                entries.append(ListedEntry(name: decoded.name, ino: backing.ino, type: backing.type, backingName: backing.name))
            } catch {
                logger.error("damage: in \(node.plaintextPath): \(error); entry hidden")
            }
        }
        directory.entries = entries
    }

    /// The listing from `offset` on. Offset 0 reads the directory (anew after a rewind,
    /// as rewinddir(3) expects).
    public func readdir(_ handle: UInt64, from offset: Int) throws -> ArraySlice<ListedEntry> {
        let directory = OpenDirectory.borrow(handle)
        // A listing taken with the keys is served only with them; one taken while locked is
        // taken again once unlocked.
        return try inView(directory.node, locked: { view in
            guard directory.takenWhileLocked else { throw Errno(EACCES, "locked") }
            if offset == 0 { directory.entries = try lockedListing(view, directory.node) }
            return directory.entries.dropFirst(offset)
        }) { keys in
            // Offset 0: the first READDIR, or one after a rewind, which must see what was
            // made since the opendir (rewinddir(3)).
            if offset == 0 || directory.takenWhileLocked {
                try load(directory, keys: keys)
                directory.takenWhileLocked = false
            }
            return directory.entries.dropFirst(offset)
        }
    }

    /// Enters a listed entry for readdirplus: no name is encrypted again.
    public func lookupListed(_ handle: UInt64, _ entry: ListedEntry) throws -> Entry {
        try inView(OpenDirectory.borrow(handle).node,
                   locked: { try lockedLookup($0, parent: nodes.id(of: OpenDirectory.borrow(handle).node), name: entry.name) }) { keys in
            let directory = OpenDirectory.borrow(handle)
            return try repairingAfterCrash(try enter(entry.backingName, in: directory.node, plainName: entry.name, keys: keys), keys: keys)
        }
    }

    public func releasedir(_ handle: UInt64) {
        OpenDirectory.borrow(handle).close()
        openDirectories.remove(OpenDirectory.borrow(handle))
        OpenDirectory.release(handle)
    }

    public func fsyncdir(_ handle: UInt64) throws {
        try inView(OpenDirectory.borrow(handle).node, locked: { try lockedSyncDirectory($0, OpenDirectory.borrow(handle).node) }) { _ in
            let node = OpenDirectory.borrow(handle).node
            try AtomicFile.syncDirectory(node.fd)
            try makeAncestorsDurable(node)
        }
    }
}

/// The directories open now, for the lock to forget their listings.
final class OpenDirectories: Sendable {
    private let open = Mutex<[ObjectIdentifier: OpenDirectory]>([:])

    /// Adds `directory` and returns its handle for the kernel.
    func add(_ directory: OpenDirectory) -> UInt64 {
        open.withLock { $0[ObjectIdentifier(directory)] = directory }
        return directory.issueHandle()
    }

    func remove(_ directory: OpenDirectory) {
        _ = open.withLock { $0.removeValue(forKey: ObjectIdentifier(directory)) }
    }

    /// Every open directory forgets a listing taken with the keys.
    func forgetListings() {
        for directory in open.withLock({ Array($0.values) }) { directory.forgetListing() }
    }
}

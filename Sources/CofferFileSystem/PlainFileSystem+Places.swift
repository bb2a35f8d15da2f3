// Binding file content to its place (format 4, docs/FORMAT.md §4): new files get the
// tag of their entry, opens check it, and renames, hard links and settling move it
// (CofferVault's PlaceBinding has the rules). Vaults of formats 1–3 have no tags: every
// function here does nothing there.
import CofferCrypto
import CofferSystem
import CofferVault
import Glibc

extension PlainFileSystem {
    /// A content file of backing descriptor `fd` of `node`, with the vault's layout.
    func content(_ fd: Int32, of node: Node, keys: Keys, safety: RewriteSafety? = nil) -> ContentFile {
        ContentFile(fd: fd, cipher: keys.set.content, layout: layout, ids: node.fileIDs, safety: safety)
    }

    /// The places the content of `node` may be bound to, from the name it was last
    /// entered under (nil if the daemon knows no name for it: after a lock, until the
    /// kernel looks it up again).
    func candidatePlaces(_ node: Node) throws -> [Place]? {
        guard let (dir, name) = node.entry else { return nil }
        return try candidatePlaces(shownAs: name, in: dir)
    }

    func candidatePlaces(shownAs name: [UInt8], in dir: Node) throws -> [Place] {
        let iv = try reportingDamage(dir) { try dir.directoryIV() }
        return Place.candidates(shownAs: name, ivs: [iv] + ((try? dir.alternateIVs()) ?? []).map(\.iv))
    }

    /// Makes the header and empty final block of the new, empty backing file `fd` for
    /// entry `name` of `dir`.
    func initializeContent(_ fd: Int32, name: [UInt8], in dir: Node, keys: Keys) throws {
        guard layout.endsInFinalBlock else { return }
        let iv = try dir.directoryIV()
        try ContentFile(fd: fd, cipher: keys.set.content, layout: layout).initialize {
            try keys.set.places.tag(fileID: $0.bytes, dirIV: iv, name: name)
        }
    }

    /// After an open with O_TRUNC emptied `node`: content that did not belong where it was
    /// opened (copied there from outside) is now the caller's, and is bound there.
    func rebindEmptied(_ node: Node, fd: Int32, keys: Keys) throws {
        guard layout.endsInFinalBlock, let places = try candidatePlaces(node), let place = places.first else { return }
        let file = content(fd, of: node, keys: keys)
        let header = try file.header()
        if (try? PlaceBinding.check(header, places: places, xattrOf: nil, macs: keys.set.places)) != nil { return }
        try file.setPlaceTag(keys.set.places.tag(fileID: header.fileID.bytes, dirIV: place.dirIV, name: place.name))
    }

    /// At open: the content of `node` (backing descriptor `fd`) must belong to the entry
    /// it was found under, and its final block must open (its length is authenticated).
    /// After a crash, a header left stale by a power cut in the middle of a rename (the
    /// place xattr fits) is mended; otherwise such a header is only accepted (the name
    /// the node was last entered under may be older than the file's).
    func checkPlaceAndLength(_ node: Node, fd: Int32, keys: Keys) throws {
        guard layout.endsInFinalBlock else { return }
        try reportingDamage(node) {
            // Not while a write of this inode is between its slots.
            let header = try node.contentLock.reading { try content(fd, of: node, keys: keys).checkedHeader() }
            guard let places = try candidatePlaces(node) else { return }
            if case .xattr(let tag) = try PlaceBinding.check(header, places: places, xattrOf: fd,
                                                             macs: keys.set.places), journal?.foundAtOpen == true {
                if let writable = try? openForReadModifyWrite(node, flags: O_RDWR, userWantsRead: false) {
                    try? content(writable.rawValue, of: node, keys: keys).setPlaceTag(tag)
                }
            }
        }
    }

    /// A backing file to rebind: an entry of a directory, or a node's inode.
    enum BackingFile {
        case entry(String, in: Node)
        case node(Node)

        func open(flags: Int32) throws -> FileDescriptor {
            switch self {
            case .entry(let name, let dir): return try FileDescriptor.open(name, in: dir.fd, flags: flags | O_NOFOLLOW)
            case .node(let node): return try FileDescriptor.open(node.procPath, flags: flags)
            }
        }

        /// Its stat, without following a symlink and without opening it.
        func stat() throws -> stat {
            switch self {
            case .entry(let name, let dir): return try Sys.stat(name, in: dir.fd)
            case .node(let node): return try Sys.stat(node.fd)
            }
        }
    }

    /// Before backing file `file` (shown as `name` in `dir`) moves to `place`, or (with
    /// `place` nil) gets a hard link: writes the new tag (the linked tag for a link).
    /// Returns what puts the old tag back if the move fails, or nil if nothing was
    /// written: not a regular file, no tags (format 1–3), already linked, or content that
    /// does not belong where it is now (it keeps its tag, so the move does not make it
    /// valid). `known`: the file's stat if the caller has just made it.
    func rebind(_ file: BackingFile, stat known: stat? = nil, shownAs name: [UInt8], in dir: Node, to place: Place?,
                keys: Keys) throws -> (() -> Void)? {
        guard layout.endsInFinalBlock, let st = known ?? (try? file.stat()), st.st_mode & S_IFMT == S_IFREG else { return nil }
        let places = try candidatePlaces(shownAs: name, in: dir)
        let macs = keys.set.places
        return try withContentDescriptor(file, stat: st) { fd in
            let content = ContentFile(fd: fd, cipher: keys.set.content, layout: layout)
            guard let header = try? content.header(), let old = header.placeTag,
                  (try? PlaceBinding.check(header, places: places, xattrOf: fd, macs: macs)) != nil else {
                return nil
            }
            let linked = try macs.linkedTag(fileID: header.fileID.bytes)
            if PlaceMAC.equal(old, linked) { return nil }
            let new = try place.map { try macs.tag(fileID: header.fileID.bytes, dirIV: $0.dirIV, name: $0.name) } ?? linked
            try PlaceBinding.rewrite(content, from: old, to: new, keeping: [st.st_atim, st.st_mtim])
            return { [layout] in
                try? self.withContentDescriptor(file, stat: st) {
                    try ContentFile(fd: $0, cipher: keys.set.content, layout: layout).setPlaceTag(old)
                }
            }
        }
    }

    /// Runs `body` with a read-write descriptor of `file` (whose stat is `st`); a file its
    /// owner made read-only is made writable for the duration (the daemon owns it: a
    /// rename of a read-only file is allowed, and so must be its rebinding).
    func withContentDescriptor<R>(_ file: BackingFile, stat st: stat, _ body: (Int32) throws -> R) throws -> R {
        let fd: FileDescriptor
        do {
            fd = try file.open(flags: O_RDWR)
        } catch let error as Errno where error.code == EACCES {
            guard st.st_uid == geteuid() else { throw error }
            let path = try file.open(flags: O_PATH)
            try Sys.chmod(Sys.procPath(path.rawValue), (st.st_mode & 0o7777) | 0o600)
            defer { try? Sys.chmod(Sys.procPath(path.rawValue), st.st_mode & 0o7777) }
            let writable = try FileDescriptor.open(Sys.procPath(path.rawValue), flags: O_RDWR)
            return try body(writable.rawValue)
        }
        return try body(fd.rawValue)
    }
}

// Binding file content to its place (format 4, docs/FORMAT.md §4) and directory IVs to
// theirs (format 5, §5): new files and directories get the tag of their entry, opens and
// the first read of an IV file check it, and renames, hard links and settling move it
// (CofferVault's PlaceBinding and DirectoryBinding have the rules). Vaults of formats
// 1–3 have no tags, format 4 none on IV files: the functions here do nothing there.
import CofferCrypto
import CofferSystem
import CofferVault
import Glibc

extension PlainFileSystem {
    /// A content file of backing descriptor `fd` of `node`, with the vault's layout.
    func content(_ fd: Int32, of node: Node, keys: Keys, safety: RewriteSafety? = nil) throws -> ContentFile {
        content(fd, of: node, cipher: try contentCipher(fd, of: node, keys: keys), safety: safety)
    }

    /// The cipher of `node`'s content: the vault's, or for a file made while locked
    /// (format 6) one holding the key from its key record. A record that cannot be read
    /// leaves the vault's cipher, under which the blocks then fail as damage. The keys
    /// are those of the node's domain (format 8); EACCES where a lock took them.
    func contentCipher(_ fd: Int32, of node: Node, keys: Keys) throws -> ContentCipher {
        let set = try keys.in(node).set
        let file = ContentFile(fd: fd, cipher: set.content, layout: layout, ids: node.fileIDs)
        guard set.drops != nil || layout == .wrapped, node.isRegular, let (known, read) = try? file.fileIDAndHeader(),
              let id = known else {
            return set.content
        }
        let sealed = node.sealedCipher(for: id) { () -> ContentCipher? in
            // The header just read for the ID, if it was (a new file's first write).
            let header = try? read ?? file.header()
            if let header, let wrap = header.keyWrap, !header.isSealed {
                return unwrappedCipher(wrap, of: id, node: node, keys: keys, algorithm: set.content.algorithm)
            }
            guard header?.isSealed == true else { return nil }
            do {
                let key = try DropRecord.read(fileID: id, root: nodes.root.fd, keys: set)
                return ContentCipher.sealedFile(key: key, algorithm: set.content.algorithm, fileID: id)
            } catch {
                logger.error("damage: \(node.plaintextPath) (backing inode \(node.ino)): \(error)")
                return nil
            }
        }
        return sealed ?? set.content
    }

    /// The cipher of a format-8 file of ID `id` from its key wrap: opened with the key of
    /// the node's domain, else (a power cut between a move's header and its rename) the
    /// other domain's; nil if neither opens it (damage: the blocks then fail).
    private func unwrappedCipher(_ wrap: [UInt8], of id: FileID, node: Node, keys: Keys, algorithm: ContentAlgorithm) -> ContentCipher? {
        let own = node.keyDomain, other: KeyDomain = own == .vault ? .afterFirstUnlock : .vault
        for domain in [own, other] {
            guard let metadata = try? keys.of(domain).set.metadata,
                  let key = try? FileKeyWrap.unwrap(wrap, fileID: id.bytes, under: metadata) else { continue }
            return ContentCipher.sealedFile(key: key, algorithm: algorithm, fileID: id)
        }
        logger.error("damage: \(node.plaintextPath) (backing inode \(node.ino)): its key wrap opens under no key of this vault")
        return nil
    }

    /// The key wrap of the file of `header` (format 8) in key domain `domain`, if its wrap
    /// is in the other domain (a move between the domains was cut, or is being made); nil
    /// if it is in `domain` already, or the file has no wrap. Throws if neither opens it.
    func keyWrap(of header: FileHeader, in domain: KeyDomain, keys: Keys) throws -> [UInt8]? {
        guard let wrap = header.keyWrap, !header.isSealed else { return nil }
        let own = try keys.of(domain).set.metadata, id = header.fileID.bytes
        if let key = try? FileKeyWrap.unwrap(wrap, fileID: id, under: own) {
            key.wipe()
            return nil
        }
        let key = try FileKeyWrap.unwrap(wrap, fileID: id, under: try keys.of(domain == .vault ? .afterFirstUnlock : .vault).set.metadata)
        defer { key.wipe() }
        return try FileKeyWrap.wrap(key, fileID: id, under: own)
    }

    /// The same under `cipher`: the vault's content cipher, or a file's own (its key kept
    /// through a lock); the file's prepared key is kept in the node while it is open.
    func content(_ fd: Int32, of node: Node, cipher: ContentCipher, safety: RewriteSafety? = nil) -> ContentFile {
        ContentFile(fd: fd, cipher: cipher.using(node.blockKeys), layout: layout, ids: node.fileIDs, safety: safety)
    }

    /// The places the content of `node` may be bound to, from the name it was last
    /// entered under (nil if the daemon knows no name for it: after a lock, until the
    /// kernel looks it up again).
    func candidatePlaces(_ node: Node, keys: Keys) throws -> [Place]? {
        guard let (dir, name) = node.entry else { return nil }
        return try candidatePlaces(shownAs: name, in: dir, storedAsCopy: isStoredAsCopy(node, shownAs: name, in: dir, keys: keys),
                                   keys: keys)
    }

    /// `storedAsCopy`: the entry's backing name is a sync engine's conflict copy of
    /// another entry's (Place.candidates).
    func candidatePlaces(shownAs name: [UInt8], in dir: Node, storedAsCopy: Bool, keys: Keys) throws -> [Place] {
        let iv = try directoryIV(dir, keys: keys)
        return Place.candidates(shownAs: name, ivs: [iv] + ((try? alternateIVs(dir, keys: keys)) ?? []).map(\.iv),
                                storedAsCopy: storedAsCopy)
    }

    /// Whether `node`, entered as `name` of `dir`, is stored under a conflict copy's
    /// backing name rather than under the encrypted name of `name` (one stat, and only
    /// for a name that reads as a copy).
    func isStoredAsCopy(_ node: Node, shownAs name: [UInt8], in dir: Node, keys: Keys) throws -> Bool {
        guard ConflictName.parse(plaintext: name) != nil else { return false }
        guard let own = try? Sys.stat(try backingName(name, in: dir, keys: keys).name, in: dir.fd) else { return true }
        return UInt64(own.st_ino) != node.ino
    }

    /// Whether backing entry `backing` of `dir`, shown as `name`, is stored under a
    /// conflict copy's backing name.
    func isStoredAsCopy(_ backing: String, shownAs name: [UInt8], in dir: Node, keys: Keys) throws -> Bool {
        guard ConflictName.parse(plaintext: name) != nil else { return false }
        return try backing != backingName(name, in: dir, keys: keys).name
    }

    /// The IV of directory `dir`, read once and from format 5 checked against the
    /// directory's place. A damaged IV file, or one that belongs to another directory, is
    /// EIO and a log line naming the directory, whichever operation meets it. A directory
    /// that is arriving from a sync engine without its IV file yet (DirectoryIV.isArriving)
    /// holds no name that can be read yet: ENOENT, and no damage line.
    func directoryIV(_ dir: Node, keys: Keys) throws -> [UInt8] {
        try reportingDamage(dir) {
            try dir.directoryIV { last in
                let record: DirectoryIV.Record
                do {
                    record = try DirectoryIV.read(in: dir.fd, bound: bindsDirectories)
                } catch let error as VaultError {
                    guard dir !== nodes.root else { throw error }
                    if DirectoryIV.isArriving(dir.fd) {
                        throw Errno(ENOENT, "a directory arriving from another program has no IV file yet")
                    }
                    // It may have arrived between the read and the look: read it again (a
                    // file still missing or damaged is damage, as the first read found).
                    record = try DirectoryIV.read(in: dir.fd, bound: bindsDirectories)
                }
                // An IV this node was already checked with is its own.
                guard bindsDirectories, record.iv != last else { return record.iv }
                guard let fits = try fitsPlace(record, of: dir, keys: keys) else {
                    throw Errno(ESTALE, "the IV file of a directory entered before a lock changed; enter it again by its path")
                }
                guard fits else { throw VaultError.directoryIVMisplaced(DirectoryIV.fileName) }
                return record.iv
            }
        }
    }

    /// Gives directory `dir` an IV file of its own if it is arriving (DirectoryIV.isArriving)
    /// and an entry is about to be made in it: bound to its place, so that when the sync
    /// engine brings the IV file the other machine made, the two are a directory made on
    /// two machines (the engine keeps one as a conflict copy; PlainFileSystem+
    /// SplitDirectories serves both and settles them).
    func giveIVIfArriving(_ dir: Node, keys: Keys) throws {
        guard !dir.hasDirectoryIV, dir !== nodes.root, DirectoryIV.isArriving(dir.fd), let (parent, name) = dir.entry else { return }
        let place = Place(dirIV: try directoryIV(parent, keys: keys), name: name)
        do {
            try DirectoryIV.create(in: dir.fd, tag: bindsDirectories ? DirectoryBinding.tagging(at: place, macs: keys.in(dir).set.places) : nil)
            // Kept beside it: if the arriving IV file replaces this one, what is made here
            // is still read under the copy (DirectoryIV.keptCopyName).
            try DirectoryIV.keepCopy(in: dir.fd)
            logger.notice("""
                gave a directory that another program is still filling (backing inode \(dir.ino)) an IV of its own, to make an entry in it; the IV \
                it arrives with will be settled beside it
                """)
            dir.forgetDirectoryIV()  // read (and checked) anew, with any conflict copy beside it
        } catch let error as Errno where error.code == EEXIST {
            return  // it has just arrived
        }
    }

    /// The IVs of the conflict copies of `dir`'s IV file (a directory made on two
    /// machines), read once; from format 5, only those made for this directory: one that
    /// was not (copied in from another directory) is logged as damage and ignored, and
    /// the names encrypted under it are not served.
    func alternateIVs(_ dir: Node, keys: Keys) throws -> [DirectoryNames.Alternate] {
        try dir.alternateIVs {
            try DirectoryIV.alternates(in: dir.fd, bound: bindsDirectories).filter { copy in
                guard bindsDirectories, try fitsPlace(copy.record, of: dir, keys: keys) != true else { return true }
                logger.error("""
                    damage: \(dir.plaintextPath) (backing inode \(dir.ino)): \(VaultError.directoryIVMisplaced(copy.name)); ignored, and the names \
                    encrypted under it are not shown
                    """)
                return false
            }.map { DirectoryNames.Alternate(fileName: $0.name, iv: $0.record.iv) }
        }
    }

    /// Whether IV file `record` of directory `dir` fits where the directory stands
    /// (format 5): at the root, or under the name it was last entered by, in its parent
    /// under the parent's own IV — or, only if that fails, under an IV of a conflict copy
    /// of the parent's IV file (which costs a listing of the parent). Nil if the daemon
    /// knows no name for `dir` (after a lock, until the kernel looks it up again).
    /// From format 8 the tags are its own domain's, or (a crash in the middle of a class
    /// change between domains) the other domain's.
    private func fitsPlace(_ record: DirectoryIV.Record, of dir: Node, keys: Keys) throws -> Bool? {
        let own = dir.keyDomain
        var found: Bool? = false
        for domain in [own, own == .vault ? .afterFirstUnlock : .vault] {
            guard let macs = try? keys.of(domain).set.places else { continue }
            found = try fitsPlace(record, of: dir, keys: keys, macs: macs)
            if found != false { return found }
        }
        return found
    }

    private func fitsPlace(_ record: DirectoryIV.Record, of dir: Node, keys: Keys, macs: PlaceMAC) throws -> Bool? {
        if dir === nodes.root { return try DirectoryBinding.fits(record, places: [Place.root], macs: macs) }
        guard let (parent, name) = dir.entry else { return nil }
        let copy = try isStoredAsCopy(dir, shownAs: name, in: parent, keys: keys)
        let own = Place.candidates(shownAs: name, ivs: [try directoryIV(parent, keys: keys)], storedAsCopy: copy)
        if try DirectoryBinding.fits(record, places: own, macs: macs) { return true }
        let others = ((try? alternateIVs(parent, keys: keys)) ?? []).map(\.iv)
        return try DirectoryBinding.fits(record, places: Place.candidates(shownAs: name, ivs: others, storedAsCopy: copy), macs: macs)
    }

    /// Makes the header and empty final block of the new, empty backing file `fd` for
    /// entry `name` of `dir`.
    func initializeContent(_ fd: Int32, name: [UInt8], in dir: Node, keys: Keys) throws {
        guard layout.endsInFinalBlock else { return }
        let iv = try directoryIV(dir, keys: keys)
        let set = try keys.in(dir).set
        guard layout == .wrapped else {
            try ContentFile(fd: fd, cipher: set.content, layout: layout).initialize {
                try set.places.tag(fileID: $0.bytes, dirIV: iv, name: name)
            }
            return
        }
        // Format 8: a key of the file's own, wrapped in its header in its directory's domain.
        let id = FileID.random(), key = SecureBytes.random(count: FileKeyWrap.keySize)
        let wrap = try FileKeyWrap.wrap(key, fileID: id.bytes, under: set.metadata)
        let cipher = ContentCipher.sealedFile(key: key, algorithm: set.content.algorithm, fileID: id)
        defer { cipher.retire() }
        try ContentFile(fd: fd, cipher: cipher, layout: layout).initialize(wrapped: (id, wrap)) {
            try set.places.tag(fileID: $0.bytes, dirIV: iv, name: name)
        }
    }

    /// After an open with O_TRUNC emptied `node`: content that did not belong where it was
    /// opened (copied there from outside) is now the caller's, and is bound there.
    func rebindEmptied(_ node: Node, fd: Int32, keys: Keys) throws {
        guard layout.endsInFinalBlock, let places = try candidatePlaces(node, keys: keys), let place = places.first else { return }
        let file = try content(fd, of: node, keys: keys)
        let header = try file.header()
        let macs = try keys.in(node).set.places
        if (try? PlaceBinding.check(header, places: places, xattrOf: nil, macs: macs)) != nil { return }
        try file.setPlaceTag(macs.tag(fileID: header.fileID.bytes, dirIV: place.dirIV, name: place.name))
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
            let macs = try keys.in(node).set.places
            guard let places = try candidatePlaces(node, keys: keys) else { return }
            if case .xattr(let tag) = try PlaceBinding.check(header, places: places, xattrOf: fd,
                                                             macs: macs), journal?.foundAtOpen == true {
                if let writable = try? openForReadModifyWrite(node, flags: O_RDWR, userWantsRead: false) {
                    // A move between key domains: the wrap of the header is stale too.
                    let wrap = try? keyWrap(of: header, in: node.keyDomain, keys: keys)
                    try? content(writable.rawValue, of: node, keys: keys).setPlaceTag(tag, keyWrap: wrap)
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
    /// `place` nil) gets a hard link: writes the new tag (the linked tag for a link); for
    /// a directory, into its IV files (`rebindDirectory`). Returns what puts the old tag
    /// back if the move fails, or nil if nothing was written: not a regular file or
    /// directory, no tags (format 1–3; format 4 for directories), already linked, or
    /// content that does not belong where it is now (it keeps its tag, so the move does
    /// not make it valid). `known`: the file's stat if the caller has just made it.
    ///
    /// `toDomain` (format 8): the key domain of the destination, if not `dir`'s: the tag is
    /// that domain's, and a file's key is wrapped anew in it (also a linked file's); a file
    /// whose key is still in a key record (made while locked) is not moved (EXDEV); one
    /// bound in that domain already (a resumed class change) is left as it is.
    func rebind(_ file: BackingFile, stat known: stat? = nil, shownAs name: [UInt8], in dir: Node, to place: Place?,
                toDomain: KeyDomain? = nil, keys: Keys) throws -> (() -> Void)? {
        guard let st = known ?? (try? file.stat()) else { return nil }
        if st.st_mode & S_IFMT == S_IFDIR {
            return try rebindDirectory(file, shownAs: name, in: dir, to: place, keys: keys)
        }
        guard layout.endsInFinalBlock, st.st_mode & S_IFMT == S_IFREG else { return nil }
        let places = try candidatePlaces(shownAs: name, in: dir, storedAsCopy: isStoredAsCopy(file, shownAs: name, in: dir, keys: keys),
                                         keys: keys)
        let set = try keys.in(dir).set
        let target = try toDomain.map { try keys.of($0).set } ?? set
        let crossing = target !== set
        let macs = set.places
        return try withContentDescriptor(file, stat: st) { fd in
            let content = ContentFile(fd: fd, cipher: set.content, layout: layout)
            guard let header = try? content.header(), let old = header.placeTag else { return nil }
            // Crossing, a header with the destination domain's tag has its wrap too (one
            // write): a class change a crash cut between this write and the rename, resumed.
            // The place xattr would pass it as stale here, and its wrap opens only there.
            if crossing, try PlaceBinding.tag(old, of: header.fileID, fitsOneOf: place.map { [$0] } ?? [], macs: target.places) {
                return nil
            }
            guard (try? PlaceBinding.check(header, places: places, xattrOf: fd, macs: macs)) != nil else { return nil }
            let isLinked = PlaceMAC.equal(old, try macs.linkedTag(fileID: header.fileID.bytes))
            if isLinked && !crossing { return nil }
            // A linked file keeps the linked tag (in the destination's domain).
            let bound = isLinked ? nil : place
            let new = try bound.map { try target.places.tag(fileID: header.fileID.bytes, dirIV: $0.dirIV, name: $0.name) }
                ?? target.places.linkedTag(fileID: header.fileID.bytes)
            var wrap: [UInt8]?
            if crossing, let toDomain, header.keyWrap != nil {
                guard !header.isSealed else { throw Errno(EXDEV, "a file made while locked moves across key domains once converted") }
                wrap = try keyWrap(of: header, in: toDomain, keys: keys)
            }
            try PlaceBinding.rewrite(content, from: old, to: new, keyWrap: wrap, keeping: [st.st_atim, st.st_mtim])
            return { [layout] in
                try? self.withContentDescriptor(file, stat: st) {
                    try ContentFile(fd: $0, cipher: set.content, layout: layout).setPlaceTag(old, keyWrap: wrap == nil ? nil : header.keyWrap)
                }
            }
        }
    }

    /// Before directory `file` (shown as `name` in `dir`) moves to `place` (format 5):
    /// writes the tag of the new place into its IV file and into each conflict copy of it
    /// made for this directory (DirectoryIV.rebind: in place, on the disk before the
    /// rename). An IV file that does not fit where the directory is now keeps its tags.
    /// Returns what puts the old tags back, or nil if nothing was written.
    private func rebindDirectory(_ file: BackingFile, shownAs name: [UInt8], in dir: Node, to place: Place?,
                                 keys: Keys) throws -> (() -> Void)? {
        guard bindsDirectories, let place else { return nil }
        let places = try candidatePlaces(shownAs: name, in: dir, storedAsCopy: isStoredAsCopy(file, shownAs: name, in: dir, keys: keys),
                                         keys: keys)
        let fd = try file.open(flags: O_PATH | O_DIRECTORY)
        // The moving directory's own domain (its class), which a move does not change.
        let macs = try keys.of(domainOfDirectory(fd.rawValue, file: file, keys: keys)).set.places
        let copies = ((try? DirectoryIV.alternates(in: fd.rawValue, bound: true)) ?? []).map(\.name)
        var undo: [() -> Void] = []
        for ivFile in [DirectoryIV.fileName] + copies {
            guard let record = try? DirectoryIV.read(ivFile, in: fd.rawValue, bound: true),
                  try DirectoryBinding.fits(record, places: places, macs: macs) else { continue }
            let new = try macs.directoryTag(iv: record.iv, at: place)
            try DirectoryIV.rebind(ivFile, in: fd.rawValue, record: record, to: new)
            undo.append {
                guard let moved = try? file.open(flags: O_PATH | O_DIRECTORY),
                      let now = try? DirectoryIV.read(ivFile, in: moved.rawValue, bound: true) else { return }
                try? DirectoryIV.rebind(ivFile, in: moved.rawValue, record: now, to: record.tags[0])
            }
        }
        return undo.isEmpty ? nil : { undo.forEach { $0() } }
    }

    /// The key domain of backing directory `fd` (`file`): its node's, if the kernel knows
    /// it, else its class record's (format 8; the vault domain before).
    func domainOfDirectory(_ fd: Int32, file: BackingFile, keys: Keys) throws -> KeyDomain {
        guard vault.config.hasKeyDomains else { return .vault }
        if case .node(let node) = file { return node.keyDomain }
        if let node = nodes.known(try Sys.stat(fd)) { return node.keyDomain }
        guard let iv = try? DirectoryIV.read(in: fd, bound: bindsDirectories).iv else { return .vault }
        let record = try? ProtectionClass.readRecord(in: fd, dirIV: iv, box: keys.vault?.set.metadata,
                                                     afterFirstUnlock: keys.afterFirstUnlockRecords)
        return record?.target.domain ?? .vault
    }

    /// Whether backing file `file`, shown as `name` in `dir`, is stored under a conflict
    /// copy's backing name.
    private func isStoredAsCopy(_ file: BackingFile, shownAs name: [UInt8], in dir: Node, keys: Keys) throws -> Bool {
        switch file {
        case .entry(let backing, _): return try isStoredAsCopy(backing, shownAs: name, in: dir, keys: keys)
        case .node(let node): return try isStoredAsCopy(node, shownAs: name, in: dir, keys: keys)
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
            return try file.open(flags: O_PATH).withReopened(flags: O_RDWR, owner: st, body)
        }
        return try body(fd.rawValue)
    }
}

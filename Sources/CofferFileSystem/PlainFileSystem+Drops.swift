// New files while locked (format 6; bound to their place from format 7: docs/FORMAT.md
// §12): in a directory of class `unless-open` a program may create files and directories
// while the vault is locked, write, fsync and read them through its descriptors, rename
// and remove them among themselves — a maildir delivery, a sqlite database with its
// journal, an rsync of a tree. Each is a *drop* (CofferVault's Drop): its name and its
// key sealed to the drop key's public half, so the daemon holds nothing that reads the
// files from before the lock. At the unlock each drop becomes an ordinary entry under its
// name (its content keeps its own key, read from its key record); one found later —
// carried from another machine, or left by a daemon that ended while locked — is
// converted when its directory is listed, in the same way, so that every machine
// converting it writes the same bytes, and only if FoundDrop's rule accepts it.
//
// What a lock keeps for this: the directories that take drops (unless-open, known to the
// kernel at the lock), their IVs (format 7) and the names on the way to them from the
// root, so that a program can still reach them by path (those names stay in the daemon's
// memory while locked); and the names they hold, as keyed digests.
import CofferCrypto
import CofferSystem
import CofferVault
import Glibc
import Synchronization

extension PlainFileSystem {
    // MARK: At the lock and the unlock

    /// At a lock (no operation running, the keys still there): the locked view — the
    /// directories that take drops, and the names that lead to them — or nil if there is
    /// none (no drop key, or no `unless-open` directory known to the kernel).
    /// `reachable`: directories kept usable through the lock (after-first-unlock): the
    /// names leading to them are kept, and they take no drops.
    func lockedView(keys: Keys, unlessOpen: Set<LockedView.Key>, reachable: Set<LockedView.Key> = []) -> LockedView? {
        guard let publicKey = keys.vault?.set.drops?.publicKey else { return nil }
        struct Found {
            let node: Node
            var takesDrops = false
            var passages: [[UInt8]: Node] = [:]
        }
        var found: [LockedView.Key: Found] = [:]
        let all = nodes.allNodes()
        for node in all where node.isDirectory && (unlessOpen.contains(.init(node)) || reachable.contains(.init(node))) {
            if unlessOpen.contains(.init(node)) { found[.init(node), default: .init(node: node)].takesDrops = true }
            var child = node
            while let (parent, name) = child.entry, child !== nodes.root {
                found[.init(parent), default: .init(node: parent)].passages[name] = child
                child = parent
            }
        }
        guard !found.isEmpty else { return nil }
        // The files the kernel knows in them, under short encrypted names still theirs.
        var known: [LockedView.Key: [[UInt8]: LockedView.Drop]] = [:]
        for node in all where node.isRegular {
            guard let (parent, name) = node.entry, found[.init(parent)]?.takesDrops == true,
                  case .short(let backing)? = try? backingName(name, in: parent, keys: keys),
                  (try? Sys.stat(backing, in: parent.fd)).map({ UInt64($0.st_ino) }) == node.ino else { continue }
            known[.init(parent), default: [:]][name] = .init(backing: backing, node: node, cipher: nil, isDirectory: false)
        }
        // Every name they hold, as keyed digests: a program that opens a file from before
        // the lock with O_CREAT (one the kernel has not looked up) gets EACCES, never a
        // second, empty file under the same name.
        let digest = KeyedDigest()
        var directories: [LockedView.Key: LockedView.Directory] = [:]
        for (key, dir) in found {
            var names = LockedView.Names()
            var iv: [UInt8]?
            if dir.takesDrops {
                names.existing = existingNames(in: dir.node, keys: keys, digest: digest)
                if bindsDrops { iv = try? directoryIV(dir.node, keys: keys) }
            }
            names.drops = known[key] ?? [:]
            directories[key] = .init(node: dir.node, takesDrops: dir.takesDrops, iv: iv, passages: dir.passages, names: names)
        }
        return LockedView(publicKey: publicKey, digest: digest, directories: directories)
    }

    /// The digests of the plaintext names in directory `dir` (a name that does not decode
    /// stands for nothing a program could open by name, and is left out).
    private func existingNames(in dir: Node, keys: Keys, digest: KeyedDigest) -> Set<[UInt8]> {
        guard let listed = try? Sys.listDirectory(dir.fd), let names = try? names(of: dir, keys: keys, listed: listed) else {
            logger.error("lock: the names of \(dir.plaintextPath) could not be read; a program there may not open a file from before the lock")
            return []
        }
        var existing = Set<[UInt8]>()
        for backing in listed {
            let name = DropName.isDrop(backing) ? keys.vault?.set.drops.flatMap { try? DropName.decode(backing, keys: $0, bound: bindsDrops).name }
                : (try? names.decode(backing, in: dir.fd))??.name
            if let name { existing.insert(digest(name)) }
        }
        return existing
    }

    /// At an unlock, before the view opens and once no operation runs on the locked
    /// view: every drop of the lock that ends becomes an ordinary entry (`convert`),
    /// directories before what they hold.
    func convertDrops(_ view: LockedView, keys: Keys) {
        let directories = view.directories.withLock { $0 }
        let made = directories.mapValues { dir in dir.names.withLock { $0.drops } }
        // Directories made while locked are converted before what they hold.
        let dropped = Set(made.values.flatMap { $0.values.filter(\.isDirectory).map { LockedView.Key($0.node) } })
        var pending = directories.values.filter { $0.takesDrops && !dropped.contains(.init($0.node)) }.map(\.node)
        // The lock forgot the directories' names: the view's passages (never renamed while
        // locked) name the way to each, for the log lines.
        var paths: [LockedView.Key: String] = [.init(nodes.root): ""]
        var ways = [nodes.root]
        while let node = ways.popLast(), let path = paths[.init(node)] {
            for (name, child) in directories[.init(node)]?.passages ?? [:] {
                paths[.init(child)] = path + "/" + String(decoding: name, as: UTF8.self)
                ways.append(child)
            }
        }
        while let dir = pending.popLast() {
            let path = paths[.init(dir)] ?? (dir.plaintextPath == "/" ? "" : dir.plaintextPath)
            for (name, drop) in made[.init(dir)] ?? [:] where drop.isSealed {
                do {
                    let converted = try convert(drop.backing, in: dir, keys: keys, madeHere: drop.node, shownIn: path)
                    drop.node.setName(converted.name, parent: dir)
                    // A symlink's size was its sealed target's while locked.
                    if drop.node.isSymlink { attributesChanged(nodes.id(of: drop.node)) }
                    if drop.isDirectory {
                        paths[.init(drop.node)] = path + "/" + String(decoding: converted.name, as: UTF8.self)
                        pending.append(drop.node)
                    }
                } catch {
                    logger.error("""
                        unlock: a file made while locked in \(path.isEmpty ? "/" : path) (\(String(decoding: name, as: UTF8.self))) is not converted \
                        yet: \(error)
                        """)
                }
            }
        }
    }

    /// Makes drop `backing` of `dir` an ordinary entry and returns its name and backing
    /// name: its place tag written (a file) or its IV file made (a directory, the IV
    /// derived from the dropped name) and its class inherited, then renamed to the
    /// encrypted name of its plaintext name — or, if that is taken, of "NAME (dropped
    /// XXXXXXXX)" (from the dropped name: every machine picks the same). Idempotent: a
    /// crash in between leaves a drop that the next conversion finishes.
    /// `madeHere` is the node of a drop this mount made (or renamed) in the lock that ends:
    /// it is taken as it is, if its backing entry is still that inode. Any other entry
    /// under a drop's name was found in CIPHERDIR and must pass `FoundDrop`'s rule.
    /// `shownIn`: the plaintext path of `dir` for the log ("" for the root), where the node
    /// knows none (at the unlock: the lock forgot the names).
    func convert(_ backing: String, in dir: Node, keys: Keys, madeHere: Node? = nil,
                 shownIn path: String? = nil) throws -> (name: [UInt8], backing: String) {
        guard let dropKeys = keys.vault?.set.drops else { throw Errno(EACCES, "no drop key") }
        let (name, binding) = try DropName.decode(backing, keys: dropKeys, bound: bindsDrops)
        let st = try Sys.stat(backing, in: dir.fd)
        if let madeHere, UInt64(st.st_ino) != madeHere.ino || UInt64(st.st_dev) != madeHere.dev {
            throw VaultError.dropRefused(reason: "its backing entry was replaced since this mount made it")
        }
        // A conversion is no change a program made: the times of the entry and of its
        // directory stay as they were (rsync -a set them, make and backups read them).
        let dirStat = try Sys.stat(dir.fd)
        defer { try? Sys.setTimes(dir.fd, [dirStat.st_atim, dirStat.st_mtim]) }
        if st.st_mode & S_IFMT == S_IFLNK && vault.config.hasKeyDomains {
            return try convertSymlink(backing, stat: st, shownAs: name, binding: binding, in: dir, found: madeHere == nil, keys: keys,
                                      dropKeys: dropKeys, shownIn: path)
        }
        var shown = name
        var new = try backingName(shown, in: dir, keys: keys)
        if exists(new.name, in: dir) {
            shown = DropName.alternative(name, mark: FoundDrop.mark(backingName: backing))
            new = try backingName(shown, in: dir, keys: keys)
        }
        let place = Place(dirIV: try directoryIV(dir, keys: keys), name: shown)
        let found = madeHere == nil
        switch st.st_mode & S_IFMT {
        case S_IFREG:
            let path = try FileDescriptor.open(backing, in: dir.fd, flags: O_PATH | O_NOFOLLOW)
            try path.withReopened(flags: O_RDWR, owner: st) { fd in
                try placeDroppedFile(fd, at: place, binding: binding, found: found, keys: keys, dropKeys: dropKeys)
            }
        case S_IFDIR:
            let sub = try FileDescriptor.open(backing, in: dir.fd, flags: O_PATH | O_DIRECTORY | O_NOFOLLOW)
            try placeDroppedDirectory(sub.rawValue, named: backing, in: dir, at: place, binding: binding, found: found, keys: keys)
            try Sys.setTimes(sub.rawValue, [st.st_atim, st.st_mtim])
        default:
            throw VaultError.dropRefused(reason: "neither a file nor a directory")
        }
        _ = try NameTransform.writeSidecar(new, in: dir.fd)
        do {
            try Sys.rename(backing, in: dir.fd, to: new.name, in: dir.fd, flags: RENAME_NOREPLACE)
        } catch let error as Errno where error.code == ENOENT && exists(new.name, in: dir) {
            // Converted meanwhile (by a listing): done.
        }
        try AtomicFile.syncDirectory(dir.fd)
        let parent = path ?? (dir.plaintextPath == "/" ? "" : dir.plaintextPath)
        logger.notice("made while locked: \(parent)/\(String(decoding: shown, as: UTF8.self)) (backing inode \(st.st_ino)) is an ordinary entry now")
        return (shown, new.name)
    }

    /// The conversion of symlink drop `backing` (format 8): §7's symlink of its target made
    /// under a temporary name with its owner and times, renamed to the encrypted name of
    /// its own name (or of "NAME (dropped …)" if another entry has that), then the drop
    /// removed. A crash between the rename and the removal leaves both; the next
    /// conversion finds the symlink in place and only removes the drop.
    private func convertSymlink(_ backing: String, stat st: stat, shownAs name: [UInt8], binding: [UInt8]?, in dir: Node, found: Bool,
                                keys: Keys, dropKeys: DropKeys, shownIn path: String?) throws -> (name: [UInt8], backing: String) {
        guard let sealed = SymlinkDrop.sealed(try Sys.readlink(backing, in: dir.fd)) else {
            throw VaultError.dropRefused(reason: "its target is no sealed target")
        }
        let opened = try dropKeys.open(sealed, what: "target made while locked")
        defer { opened.wipe() }
        let target = try opened.lend { Array(UnsafeBufferPointer(start: $0, count: opened.count)) }
        let iv = try directoryIV(dir, keys: keys)
        let id = SymlinkDrop.id(sealed: sealed)
        if found && bindsDrops && binding != DropName.binding(dirIV: iv, id: id) {
            throw VaultError.dropRefused(reason: "it was made in another directory, or its target replaced")
        }
        let codec = try keys.in(dir).codecs.symlinks
        var shown = name
        var new = try backingName(shown, in: dir, keys: keys)
        if let there = try? Sys.readlink(new.name, in: dir.fd) {
            if (try? codec.decrypt(there, sidecarsIn: nodes.root.fd)) == target {
                try Sys.unlink(backing, in: dir.fd)  // converted before a crash
                return (shown, new.name)
            }
            shown = DropName.alternative(name, mark: FoundDrop.mark(backingName: backing))
            new = try backingName(shown, in: dir, keys: keys)
        } else if exists(new.name, in: dir) {
            shown = DropName.alternative(name, mark: FoundDrop.mark(backingName: backing))
            new = try backingName(shown, in: dir, keys: keys)
        }
        let stored = try codec.encrypt(target, nonce: SymlinkDrop.conversionNonce(sealed: sealed))
        try SymlinkCodec.writeSidecar(stored, in: nodes.root.fd)
        let temporary = SymlinkDrop.temporaryName(id: id)
        try? Sys.unlink(temporary, in: dir.fd)  // a crash's
        try Sys.symlink(target: stored.linkTarget, name: temporary, in: dir.fd)
        let made = try FileDescriptor.open(temporary, in: dir.fd, flags: O_PATH | O_NOFOLLOW)
        if st.st_uid != geteuid() || st.st_gid != getegid() { try Sys.chown(temporary, in: dir.fd, uid: st.st_uid, gid: st.st_gid) }
        try Sys.setTimes(made.rawValue, [st.st_atim, st.st_mtim])
        _ = try NameTransform.writeSidecar(new, in: dir.fd)
        try Sys.rename(temporary, in: dir.fd, to: new.name, in: dir.fd, flags: RENAME_NOREPLACE)
        try Sys.unlink(backing, in: dir.fd)
        try AtomicFile.syncDirectory(dir.fd)
        let parent = path ?? (dir.plaintextPath == "/" ? "" : dir.plaintextPath)
        logger.notice("made while locked: \(parent)/\(String(decoding: shown, as: UTF8.self)) (a symlink) is an ordinary entry now")
        return (shown, new.name)
    }

    /// Step 2 of a conversion for the file open as `fd`: its place tag for `place` written
    /// (and, format 7, its key record marked placed), after `FoundDrop`'s rule if `found`.
    private func placeDroppedFile(_ fd: Int32, at place: Place, binding: [UInt8]?, found: Bool, keys: Keys, dropKeys: DropKeys) throws {
        let file = ContentFile(fd: fd, cipher: try keys.of(.vault).set.content, layout: layout)
        let header = try file.header()
        let tag = try keys.of(.vault).set.places.tag(fileID: header.fileID.bytes, dirIV: place.dirIV, name: place.name)
        let root = nodes.root.fd
        if found {
            let refusal = bindsDrops
                ? FoundDrop.boundFileRefusal(header, binding: binding, dirIV: place.dirIV, expectedTag: tag, record: {
                    (try? DropRecord.readRecord(fileID: header.fileID, root: root, keys: try keys.of(.vault).set)).map { record in
                        record.key.wipe()
                        return record.placed
                    }
                })
                : FoundDrop.fileRefusal(header, expectedTag: tag, recordOpens: {
                    (try? DropRecord.read(fileID: header.fileID, root: root, keys: try keys.of(.vault).set))?.wipe() != nil
                })
            if let refusal { throw VaultError.dropRefused(reason: refusal) }
        }
        try file.setPlaceTag(tag)
        try Sys.fsync(fd)
        // Format 7: the record marked placed once the tag is on the disk (a crash between
        // leaves a tag this conversion accepts again), so a copy planted again is refused.
        if bindsDrops && header.isSealed {
            let record = try DropRecord.readRecord(fileID: header.fileID, root: root, keys: try keys.of(.vault).set)
            defer { record.key.wipe() }
            if !record.placed {
                try DropRecord.markPlaced(key: record.key, fileID: header.fileID, metadata: try keys.of(.vault).set.metadata, root: root)
            }
        }
    }

    /// Step 2 of a conversion for the directory `sub` (backing name `backing` in `dir`):
    /// its IV file tagged for `place` — format 7: the one it was made with; format 6: one
    /// derived from its backing name, made now — and `dir`'s class inherited, after
    /// `FoundDrop`'s rule if `found`.
    private func placeDroppedDirectory(_ sub: Int32, named backing: String, in dir: Node, at place: Place, binding: [UInt8]?,
                                       found: Bool, keys: Keys) throws {
        let record = try? DirectoryIV.read(in: sub, bound: bindsDirectories)
        let fits = try record.map { try DirectoryBinding.fits($0, places: [place], macs: try keys.of(.vault).set.places) } ?? false
        if bindsDrops {
            if found, let refusal = FoundDrop.boundDirectoryRefusal(record, binding: binding, dirIV: place.dirIV, fitsPlace: fits) {
                throw VaultError.dropRefused(reason: refusal)
            }
            guard let record else { throw VaultError.dropRefused(reason: "it has no IV file") }
            guard !fits else { return }  // tagged before a crash
            try DirectoryIV.rebind(in: sub, record: record, to: try keys.of(.vault).set.places.directoryTag(iv: record.iv, at: place))
            try inheritClass(from: dir, into: sub, iv: record.iv, keys: keys)
            return
        }
        let iv = FoundDrop.directoryIV(backingName: backing)
        guard record == nil && (try? Sys.stat(DirectoryIV.fileName, in: sub)) == nil else {
            if let refusal = FoundDrop.directoryRefusal(record, derivedIV: iv, fitsPlace: fits) ?? (record == nil ? "its IV file is damaged" : nil) {
                throw VaultError.dropRefused(reason: refusal)
            }
            return  // made before a crash
        }
        let macs = try keys.of(.vault).set.places
        _ = try DirectoryIV.create(in: sub, iv: iv, tag: bindsDirectories ? DirectoryBinding.tagging(at: place, macs: macs) : nil)
        try inheritClass(from: dir, into: sub, iv: iv, keys: keys)
    }

    /// Converts the entries of `dir` made while locked that no mount converted yet (once
    /// per directory until another program changes it: one listing). True if it did any.
    func convertFoundDrops(in dir: Node, keys: Keys) -> Bool {
        guard keys.vault?.set.drops != nil, !dir.dropsChecked.exchange(true, ordering: .acquiringAndReleasing) else { return false }
        var converted = false
        for name in (try? Sys.listDirectory(dir.fd)) ?? [] where DropName.isDrop(name) {
            do {
                _ = try convert(name, in: dir, keys: keys)
                converted = true
            } catch {
                logger.error("damage: in \(dir.plaintextPath): an entry made while locked (\(name)): \(error)")
            }
        }
        return converted
    }


    // MARK: While locked

    /// The directory `id` while locked, or EACCES.
    private func reachable(_ id: UInt64, in view: LockedView, takingDrops: Bool = false) throws -> LockedView.Directory {
        guard let dir = view.directory(nodes.node(id)), dir.takesDrops || !takingDrops else { throw Errno(EACCES, "locked") }
        return dir
    }

    /// A kept or dropped node `node`, shown as `name` in `dir`, entered again for the
    /// kernel: the same node if the kernel still holds it, else a new one of its inode,
    /// which learns its name (so that after the unlock its IV file's place is checked).
    private func reenter(_ node: Node, as name: [UInt8], in dir: Node) throws -> Entry {
        let st = try Sys.stat(node.fd)
        var entered = node
        if !nodes.rememberAgain(node) {
            entered = nodes.remember(fd: try FileDescriptor.open(node.procPath, flags: O_PATH), stat: st).node
            entered.setName(name, parent: dir)
            entered.setKeyDomain(node.keyDomain)
        }
        return Entry(node: nodes.id(of: entered), attributes: plain(st, of: entered.fd), validFor: OtherWriters.shortCache)
    }

    func lockedLookup(_ view: LockedView, parent: UInt64, name: [UInt8]) throws -> Entry {
        let dir = try reachable(parent, in: view)
        if let node = dir.passages[name] { return try reenter(node, as: name, in: dir.node) }
        let (drop, existed) = dir.names.withLock { ($0.drops[name], view.existed(name, in: $0)) }
        if let drop { return try reenter(drop.node, as: name, in: dir.node) }
        throw Errno(dir.takesDrops && !existed ? ENOENT : EACCES, "locked")
    }

    /// Whether `node` may be stat'ed while locked: a directory on the way, or a drop.
    func isReachable(_ node: Node, in view: LockedView) -> Bool {
        view.directory(node) != nil || view.drop(of: node) != nil
    }

    /// The sealed name of drop `name` in `dir`, whose own ID (a file's file ID, a
    /// directory's IV) is `id`: from format 7 bound to both (ENAMETOOLONG past
    /// DropName.maxNameLength).
    private func dropName(_ name: [UInt8], _ view: LockedView, in dir: LockedView.Directory, id: [UInt8]) throws -> String {
        var binding: [UInt8]?
        if bindsDrops {
            guard let iv = dir.iv else { throw Errno(EACCES, "locked: the IV of this directory could not be read at the lock") }
            binding = DropName.binding(dirIV: iv, id: id)
        }
        do {
            return try DropName.encode(name, binding: binding, to: view.publicKey)
        } catch VaultError.nameTooLong {
            throw Errno(ENAMETOOLONG, "a name made while locked has at most \(DropName.maxNameLength(bound: bindsDrops)) bytes")
        }
    }

    /// The ID drop `drop` is bound by (format 7): a directory's IV, a file's file ID (of a
    /// file from before the lock, read from its header).
    private func dropID(_ drop: LockedView.Drop, in view: LockedView) throws -> [UInt8] {
        if drop.isDirectory {
            guard let iv = view.directory(drop.node)?.iv else { throw Errno(EACCES, "locked") }
            return iv
        }
        if let id = drop.cipher?.onlyFile { return id.bytes }
        if drop.node.isSymlink {
            guard let sealed = SymlinkDrop.sealed(try Sys.readlink("", in: drop.node.fd)) else { throw Errno(EIO, "a symlink made while locked") }
            return SymlinkDrop.id(sealed: sealed)
        }
        let fd = try FileDescriptor.open(drop.node.procPath, flags: O_RDONLY)
        var header = [UInt8](repeating: 0, count: 2 + FileID.size)
        guard try header.withUnsafeMutableBytes({ try Sys.readFully(fd.rawValue, into: $0, at: 0) }) == header.count else {
            throw Errno(EIO, "the header of a file from before the lock")
        }
        return Array(header[2...])
    }

    /// The drop already named `name` in `dir` (nil: none), after the checks that no
    /// entry from before the lock has that name. Throws EEXIST if one has and `exclusive`.
    private func dropToMake(_ name: [UInt8], in dir: LockedView.Directory, view: LockedView, exclusive: Bool) throws -> LockedView.Drop? {
        let (existing, existed) = dir.names.withLock { ($0.drops[name], view.existed(name, in: $0)) }
        if let existing {
            guard !exclusive else { throw Errno(EEXIST, "create") }
            return existing
        }
        guard dir.passages[name] == nil else { throw Errno(EEXIST, "create") }
        // A file from before the lock, not known to the kernel: its key is gone, and a new
        // file under its name would split the program's data in two.
        guard !existed else { throw Errno(exclusive ? EEXIST : EACCES, "locked") }
        return nil
    }

    /// Enters `drop` under `name` in `dir`, made under its sealed name with no lock held:
    /// the drop that another operation entered under that name meanwhile, if one did
    /// (then `drop` is for the caller to undo).
    private func enterDrop(_ drop: LockedView.Drop, as name: [UInt8], in dir: LockedView.Directory) -> LockedView.Drop? {
        dir.names.withLock { names in
            if let other = names.drops[name] { return other }
            names.drops[name] = drop
            return nil
        }
    }

    func lockedCreate(_ view: LockedView, parent: UInt64, name: [UInt8], mode: mode_t, flags: Int32, caller: Caller) throws -> (Entry, UInt64) {
        let dir = try reachable(parent, in: view, takingDrops: true)
        if let existing = try dropToMake(name, in: dir, view: view, exclusive: flags & O_EXCL != 0) {
            return (try reenter(existing.node, as: name, in: dir.node), try openDrop(existing, flags: flags))
        }
        // Made under its sealed name, which no one else knows yet, with no lock held;
        // entered under its plaintext name after.
        let id = FileID.random()
        let backing = try dropName(name, view, in: dir, id: id.bytes)
        let key = SecureBytes.random(count: 32)
        let cipher = ContentCipher.sealedFile(key: key, algorithm: vault.config.contentAlgorithm, fileID: id)
        try DropRecord.write(key: key, fileID: id, to: view.publicKey, root: nodes.root.fd)
        let fd: FileDescriptor
        do {
            fd = try FileDescriptor.open(backing, in: dir.node.fd, flags: O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, mode: mode & 0o7777)
        } catch {
            DropRecord.remove(fileID: id, root: nodes.root.fd)
            throw error
        }
        func undo() {
            try? Sys.unlink(backing, in: dir.node.fd)
            DropRecord.remove(fileID: id, root: nodes.root.fd)
        }
        do {
            try ContentFile(fd: fd.rawValue, cipher: cipher, layout: layout).initialize(sealed: id) { _ in
                [UInt8](repeating: 0, count: PlaceMAC.tagSize)
            }
            try own(backing, in: dir.node, fd: fd.rawValue, caller: caller, mode: mode)
        } catch {
            undo()
            throw error
        }
        let entry = try enter(backing, in: dir.node, plainName: name)
        let drop = LockedView.Drop(backing: backing, node: nodes.node(entry.node), cipher: cipher, isDirectory: false)
        if let other = enterDrop(drop, as: name, in: dir) {
            // Another create of the same name came first: this one is undone, and
            // the file opened is the other's.
            undo()
            forget(entry.node, count: 1)
            guard flags & O_EXCL == 0 else { throw Errno(EEXIST, "create") }
            return (try reenter(other.node, as: name, in: dir.node), try openDrop(other, flags: flags))
        }
        let file = OpenFile(node: drop.node, fd: fd, writable: flags & O_ACCMODE != O_RDONLY, synchronous: flags & O_DSYNC != 0)
        drop.node.keep(cipher.copy())
        return (entry, file.issueHandle())
    }

    /// A new open file of dropped file `drop` (O_TRUNC empties it).
    private func openDrop(_ drop: LockedView.Drop, flags: Int32) throws -> UInt64 {
        guard !drop.isDirectory else { throw Errno(EISDIR, "open") }
        guard let cipher = drop.cipher else { throw Errno(EACCES, "locked") }
        let (backingFlags, writable) = Self.backingFlags(flags)
        let fd = try FileDescriptor.open(drop.node.procPath, flags: backingFlags)
        if flags & O_TRUNC != 0 && writable {
            try drop.node.contentLock.writing { try content(fd.rawValue, of: drop.node, cipher: cipher).truncate(to: 0) }
        }
        let file = OpenFile(node: drop.node, fd: fd, writable: writable, synchronous: backingFlags & O_DSYNC != 0)
        drop.node.keep(cipher.copy())
        return file.issueHandle()
    }

    func lockedOpen(_ view: LockedView, _ id: UInt64, flags: Int32) throws -> UInt64 {
        guard let found = view.drop(of: nodes.node(id)) else { throw Errno(EACCES, "locked") }
        return try openDrop(found, flags: flags)
    }

    func lockedMkdir(_ view: LockedView, parent: UInt64, name: [UInt8], mode: mode_t, caller: Caller) throws -> Entry {
        let dir = try reachable(parent, in: view, takingDrops: true)
        guard try dropToMake(name, in: dir, view: view, exclusive: true) == nil else { throw Errno(EEXIST, "mkdir") }
        // Format 7: its IV from the start (its tags zero until the conversion), so that
        // what is made in it is bound to it, whatever it is renamed to while locked.
        let iv: [UInt8]? = bindsDrops ? Sodium.randomArray(count: NameCipher.ivSize) : nil
        let backing = try dropName(name, view, in: dir, id: iv ?? [])
        if let iv {
            let temporary = DirectoryIV.temporaryName()
            try Sys.mkdir(temporary, in: dir.node.fd, mode: mode & 0o7777)
            do {
                let sub = try FileDescriptor.open(temporary, in: dir.node.fd, flags: O_PATH | O_DIRECTORY | O_NOFOLLOW)
                _ = try DirectoryIV.create(in: sub.rawValue, iv: iv) { _ in [UInt8](repeating: 0, count: PlaceMAC.tagSize) }
                try Sys.rename(temporary, in: dir.node.fd, to: backing, in: dir.node.fd, flags: RENAME_NOREPLACE)
            } catch {
                try? DirectoryIV.removeEmptyDirectory(temporary, in: dir.node.fd)
                throw error
            }
        } else {
            try Sys.mkdir(backing, in: dir.node.fd, mode: mode & 0o7777)
        }
        func undo() {
            if bindsDrops {
                try? DirectoryIV.removeEmptyDirectory(backing, in: dir.node.fd)
            } else {
                _ = try? Sys.unlink(backing, in: dir.node.fd, directory: true)
            }
        }
        do {
            try own(backing, in: dir.node, fd: nil, caller: caller, mode: S_IFDIR)
        } catch {
            undo()
            throw error
        }
        let entry = try enter(backing, in: dir.node, plainName: name)
        let node = nodes.node(entry.node)
        view.directories.withLock { $0[.init(node)] = .init(node: node, takesDrops: true, iv: iv) }
        if enterDrop(.init(backing: backing, node: node, cipher: nil, isDirectory: true), as: name, in: dir) != nil {
            view.directories.withLock { $0[.init(node)] = nil }
            undo()
            forget(entry.node, count: 1)
            throw Errno(EEXIST, "mkdir")
        }
        return entry
    }

    /// symlink while locked (format 8): a drop whose target is sealed to the drop key as
    /// its name is, bound to its directory and its sealed target (docs/FORMAT.md §12,
    /// "Symlinks made while locked"). Before format 8, EACCES.
    func lockedSymlink(_ view: LockedView, target: [UInt8], parent: UInt64, name: [UInt8], caller: Caller) throws -> Entry {
        guard vault.config.hasKeyDomains else { throw Errno(EACCES, "locked: symlinks are made while locked from format 8") }
        let dir = try reachable(parent, in: view, takingDrops: true)
        guard try dropToMake(name, in: dir, view: view, exclusive: true) == nil else { throw Errno(EEXIST, "symlink") }
        guard target.count <= SymlinkDrop.maxTargetLength else {
            throw Errno(ENAMETOOLONG, "a symlink made while locked has a target of at most \(SymlinkDrop.maxTargetLength) bytes")
        }
        let linkTarget = SymlinkDrop.seal(target, to: view.publicKey)
        let backing = try dropName(name, view, in: dir, id: SymlinkDrop.id(sealed: SymlinkDrop.sealed(linkTarget) ?? []))
        try Sys.symlink(target: linkTarget, name: backing, in: dir.node.fd)
        do {
            try own(backing, in: dir.node, fd: nil, caller: caller, mode: S_IFLNK)
        } catch {
            try? Sys.unlink(backing, in: dir.node.fd)
            throw error
        }
        let entry = try enter(backing, in: dir.node, plainName: name)
        let drop = LockedView.Drop(backing: backing, node: nodes.node(entry.node), cipher: nil, isDirectory: false, target: target)
        if enterDrop(drop, as: name, in: dir) != nil {
            try? Sys.unlink(backing, in: dir.node.fd)
            forget(entry.node, count: 1)
            throw Errno(EEXIST, "symlink")
        }
        return entry
    }

    /// unlink and rmdir while locked: only of drops.
    func lockedRemove(_ view: LockedView, parent: UInt64, name: [UInt8], directory: Bool) throws {
        let dir = try reachable(parent, in: view, takingDrops: true)
        let drop = try dir.names.withLock { names in
            guard let drop = names.drops[name] else {
                throw Errno(dir.passages[name] != nil || view.existed(name, in: names) ? EACCES : ENOENT, "locked")
            }
            guard drop.isDirectory == directory else { throw Errno(directory ? ENOTDIR : EISDIR, "remove") }
            if !directory { drop.node.removedThroughMount.store(true, ordering: .releasing) }
            if directory && bindsDrops {
                try DirectoryIV.removeEmptyDirectory(drop.backing, in: dir.node.fd)  // with its IV file (format 7)
            } else {
                try Sys.unlink(drop.backing, in: dir.node.fd, directory: directory)
            }
            names.drops[name] = nil
            names.existing.remove(view.digest(name))  // gone: the name is free
            return drop
        }
        if directory { view.directories.withLock { $0[.init(drop.node)] = nil } }
        if drop.isSealed, let id = drop.cipher?.onlyFile, (try? Sys.stat(drop.node.fd).st_nlink) == 0 {
            DropRecord.remove(fileID: id, root: nodes.root.fd)
        }
    }

    /// rename while locked: a drop to a name of a directory that takes drops, over
    /// another drop or none (RENAME_EXCHANGE: EACCES).
    func lockedRename(_ view: LockedView, parent: UInt64, name: [UInt8], newParent: UInt64, newName: [UInt8], flags: UInt32) throws {
        guard flags & RENAME_EXCHANGE == 0 else { throw Errno(EACCES, "locked") }
        let from = try reachable(parent, in: view, takingDrops: true)
        let to = try reachable(newParent, in: view, takingDrops: true)
        guard to.passages[newName] == nil else { throw Errno(EACCES, "locked") }
        let seen = try from.names.withLock { names in
            guard let drop = names.drops[name] else {
                throw Errno(from.passages[name] != nil || view.existed(name, in: names) ? EACCES : ENOENT, "locked")
            }
            return drop
        }
        if from === to && name == newName { return }
        // Format 7: a name of its own, bound to the new directory and to the moving
        // entry (its ID read with no lock held).
        let bound = bindsDrops ? try dropName(newName, view, in: to, id: dropID(seen, in: view)) : nil
        let replaced = try LockedView.withNames(from, to) { pair -> LockedView.Drop? in
            guard let moving = pair.from.drops[name], moving.node === seen.node else {
                throw Errno(ENOENT, "rename: the entry was renamed or removed meanwhile")
            }
            let replaced = pair.to.drops[newName]
            // Over a name from before the lock that the kernel does not know: refused, as
            // its file's key is gone (with RENAME_NOREPLACE, it exists).
            if replaced == nil && view.existed(newName, in: pair.to) {
                throw Errno(flags & RENAME_NOREPLACE != 0 ? EEXIST : EACCES, "locked")
            }
            if replaced != nil && flags & RENAME_NOREPLACE != 0 { throw Errno(EEXIST, "rename") }
            // A file from before the lock is replaced only with the keys (its encrypted
            // name would then hold content bound to another place).
            if let replaced, !replaced.isSealed { throw Errno(EACCES, "locked") }
            if let replaced, !replaced.isDirectory { replaced.node.removedThroughMount.store(true, ordering: .releasing) }
            let target: String
            if let bound {
                // The entry it replaces goes after it (a crash between leaves both, the
                // replaced one shown as "NAME (dropped …)" after the unlock, nothing lost).
                target = bound
                if let replaced, replaced.isDirectory { try DirectoryIV.removeEmptyDirectory(replaced.backing, in: to.node.fd) }
                try Sys.rename(moving.backing, in: from.node.fd, to: target, in: to.node.fd, flags: RENAME_NOREPLACE)
                if let replaced, !replaced.isDirectory { try Sys.unlink(replaced.backing, in: to.node.fd) }
            } else {
                target = try replaced?.backing ?? dropName(newName, view, in: to, id: [])
                try Sys.rename(moving.backing, in: from.node.fd, to: target, in: to.node.fd, flags: replaced == nil ? RENAME_NOREPLACE : 0)
            }
            var moved = moving
            moved.backing = target
            pair.from.drops[name] = nil
            pair.from.existing.remove(view.digest(name))  // moved away: the name is free
            pair.to.drops[newName] = moved
            moving.node.setName(newName, parent: to.node)
            return replaced
        }
        if let replaced, replaced.isDirectory { view.directories.withLock { $0[.init(replaced.node)] = nil } }
        if let replaced, !replaced.isDirectory, let id = replaced.cipher?.onlyFile, (try? Sys.stat(replaced.node.fd).st_nlink) == 0 {
            DropRecord.remove(fileID: id, root: nodes.root.fd)
        }
    }

    /// The listing of directory `node` while locked: what was made in it since the lock.
    func lockedListing(_ view: LockedView, _ node: Node) throws -> [ListedEntry] {
        guard let dir = view.directory(node), dir.takesDrops else { throw Errno(EACCES, "locked") }
        var entries = [ListedEntry(name: [0x2e], ino: node.ino, type: UInt8(DT_DIR), backingName: "."),
                       ListedEntry(name: [0x2e, 0x2e], ino: 1, type: UInt8(DT_DIR), backingName: "..")]
        let drops = dir.names.withLock { $0.drops }
        for (name, drop) in drops.sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) where drop.isSealed {
            entries.append(ListedEntry(name: name, ino: drop.node.ino,
                                       type: UInt8(drop.isDirectory ? DT_DIR : drop.node.isSymlink ? DT_LNK : DT_REG),
                                       backingName: drop.backing))
        }
        return entries
    }

    /// fsync of a directory while locked: one that takes drops.
    func lockedSyncDirectory(_ view: LockedView, _ node: Node) throws {
        guard view.directory(node)?.takesDrops == true else { throw Errno(EACCES, "locked") }
        try AtomicFile.syncDirectory(node.fd)
    }
}

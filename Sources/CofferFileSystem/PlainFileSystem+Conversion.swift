// A directory's class change between key domains (format 8, docs/FORMAT.md §12, "Format
// 8"): its entries move into the other domain in place — names encrypted anew, files
// re-wrapped and re-tagged (their blocks untouched), symlink targets and xattrs sealed
// anew — under a converting record that tells a mount finding it after a crash to finish
// the job. Every step is deterministic, so two machines converting the same directory
// write the same bytes.
import CofferCrypto
import CofferSystem
import CofferVault
import Glibc

extension PlainFileSystem {
    /// What a class change of a directory with entries, between key domains, refuses to
    /// move (before it writes anything): a file with more than one link (its other links
    /// stay in the old domain) and a file made while locked (its key stays in its record).
    func checkConvertible(_ dir: Node, keys: Keys) throws {
        for backing in try Sys.listDirectory(dir.fd) where !NameTransform.isReserved(backing) {
            guard let st = try? Sys.stat(backing, in: dir.fd), st.st_mode & S_IFMT == S_IFREG else { continue }
            if st.st_nlink > 1 { throw Errno(EMLINK, "a file with more than one link cannot change key domain") }
            let fd = try FileDescriptor.open(backing, in: dir.fd, flags: O_RDONLY | O_NOFOLLOW | O_NONBLOCK)
            if (try? ContentFile(fd: fd.rawValue, cipher: keys.in(dir).set.content, layout: layout).header())?.isSealed == true {
                throw Errno(EXDEV, "a file made while locked keeps its key in its record")
            }
        }
    }

    /// Converts directory `dir` from class `from` (its record's, or `complete`) to `to`,
    /// in the other key domain, with both domains' keys in `keys` and no operation
    /// running in `dir`. Resumes a conversion a crash interrupted: what is converted
    /// already is left as it is. Returns how many entries it moved.
    @discardableResult
    func convertDirectory(_ dir: Node, from: ProtectionClass, to: ProtectionClass, keys: Keys) throws -> Int {
        precondition(from.domain != to.domain)
        let old = try keys.of(from.domain), new = try keys.of(to.domain)
        dir.setKeyDomain(from.domain)
        let iv = try directoryIV(dir, keys: keys)
        // The same entries under the same names: the directory's times stay as they were.
        let times = try Sys.stat(dir.fd)
        try to.writeConverting(from: from, in: dir.fd, dirIV: iv, box: new.set.metadata)
        var moved = 0
        for backing in try Sys.listDirectory(dir.fd).sorted() where !NameTransform.isReserved(backing) {
            if try convertEntry(backing, in: dir, dirIV: iv, from: old, to: new, keys: keys) { moved += 1 }
        }
        try resealXattrs(of: dir.procPath, from: old, to: new)
        // The directory's own IV file takes its tag in the new domain (a reader takes either).
        if bindsDirectories {
            let place = try dir === nodes.root
                ? Place.root : dir.entry.map { Place(dirIV: try directoryIV($0.parent, keys: keys), name: $0.name) }
            guard let place else { throw Errno(ESTALE, "enter the directory again by its path") }
            let record = try DirectoryIV.read(in: dir.fd, bound: true)
            try DirectoryIV.rebind(in: dir.fd, record: record, to: new.set.places.directoryTag(iv: iv, at: place))
        }
        try to.write(in: dir.fd, dirIV: iv, box: new.set.metadata)
        try Sys.setTimes(dir.fd, [times.st_atim, times.st_mtim])
        dir.setKeyDomain(to.domain)
        for node in nodes.allNodes() where !node.isDirectory && node.directory === dir { node.setKeyDomain(to.domain) }
        logger.info("protection class of \(dir.plaintextPath) (backing inode \(dir.ino)) set to \(to.name): \(moved) entries moved")
        return moved
    }

    /// Moves backing entry `backing` of `dir` into the other key domain; false if it is
    /// there already (a resumed conversion) or its name opens under neither (damage,
    /// logged and left).
    private func convertEntry(_ backing: String, in dir: Node, dirIV iv: [UInt8], from old: DomainKeys, to new: DomainKeys,
                              keys: Keys) throws -> Bool {
        if (try? new.codecs.names.plaintextName(ofBacking: backing, dirIV: iv, in: dir.fd)) != nil { return false }
        guard ConflictName.parse(backingName: backing) == nil,
              let name = try? old.codecs.names.plaintextName(ofBacking: backing, dirIV: iv, in: dir.fd) else {
            logger.error("damage: in \(dir.plaintextPath): \(backing) is no name of either key domain; left as it is")
            return false
        }
        guard let st = try? Sys.stat(backing, in: dir.fd) else { return false }
        var shown = name
        var target = try new.codecs.names.backingName(for: name, dirIV: iv)
        // Its name is taken in the new domain: a twin from another machine's class change.
        // A copy of it goes; anything else keeps a name of its own, as a drop would.
        if let twin = try? Sys.stat(target.name, in: dir.fd) {
            if try isCopy(backing, stat: st, of: target.name, stat: twin, in: dir, from: old, to: new) {
                if st.st_mode & S_IFMT == S_IFDIR {
                    try removeTree(backing, in: dir.fd)
                } else {
                    try Sys.unlink(backing, in: dir.fd)
                }
                NameTransform.removeSidecar(ofEntry: backing, in: dir.fd)
                return true
            }
            let suffix = Array(" (converted \(FoundDrop.mark(backingName: backing)))".utf8)
            shown = Array(name.prefix(NameTransform.maxNameLength - suffix.count)) + suffix
            target = try new.codecs.names.backingName(for: shown, dirIV: iv)
            logger.notice("\(dir.plaintextPath): two machines gave it different classes; of two entries named alike, one is shown renamed")
        }
        try NameTransform.writeSidecar(target, in: dir.fd)
        switch st.st_mode & S_IFMT {
        case S_IFLNK:
            try convertSymlink(backing, stat: st, in: dir, to: target.name, from: old, to: new)
        case S_IFREG:
            let path = try FileDescriptor.open(backing, in: dir.fd, flags: O_PATH | O_NOFOLLOW)
            try resealXattrs(of: Sys.procPath(path.rawValue), from: old, to: new)
            _ = try rebind(.entry(backing, in: dir), stat: st, shownAs: name, in: dir, to: Place(dirIV: iv, name: shown),
                           toDomain: new.domain, keys: keys)
            try Sys.rename(backing, in: dir.fd, to: target.name, in: dir.fd, flags: RENAME_NOREPLACE)
        default:
            // A directory keeps its own domain (its class): only its name is its parent's
            // (and, renamed beside its twin, its IV file's tag: its place changes).
            if shown != name {
                _ = try rebind(.entry(backing, in: dir), stat: st, shownAs: name, in: dir, to: Place(dirIV: iv, name: shown), keys: keys)
            }
            try Sys.rename(backing, in: dir.fd, to: target.name, in: dir.fd, flags: RENAME_NOREPLACE)
        }
        NameTransform.removeSidecar(ofEntry: backing, in: dir.fd)
        return true
    }

    /// Whether backing entry `backing` (stat `st`) is a copy of `twin` (stat `twinStat`),
    /// the entry of the same name in the new domain: a file whose blocks are the same
    /// bytes (the same file, re-wrapped by each machine: its header alone differs), a
    /// symlink to the same target, an empty directory. Anything else is not.
    private func isCopy(_ backing: String, stat st: stat, of twin: String, stat twinStat: stat, in dir: Node, from old: DomainKeys,
                        to new: DomainKeys) throws -> Bool {
        guard st.st_mode & S_IFMT == twinStat.st_mode & S_IFMT else { return false }
        switch st.st_mode & S_IFMT {
        case S_IFREG:
            guard st.st_size == twinStat.st_size else { return false }
            return try sameBytes(backing, in: dir.fd, as: twin, in: dir.fd, from: layout.headerSize, to: Int64(st.st_size))
        case S_IFLNK:
            let mine = try old.codecs.symlinks.decrypt(try Sys.readlink(backing, in: dir.fd), sidecarsIn: nodes.root.fd)
            return (try? new.codecs.symlinks.decrypt(try Sys.readlink(twin, in: dir.fd), sidecarsIn: nodes.root.fd)) == mine
        case S_IFDIR:
            // The same directory on both machines: the same backing tree, byte for byte
            // (its entries' names are in its own domain, which did not change).
            let mine = try FileDescriptor.open(backing, in: dir.fd, flags: O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
            let theirs = try FileDescriptor.open(twin, in: dir.fd, flags: O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
            return try sameTree(mine.rawValue, theirs.rawValue)
        default:
            return true
        }
    }

    /// Whether backing directories `a` and `b` hold the same entries, byte for byte.
    private func sameTree(_ a: Int32, _ b: Int32) throws -> Bool {
        let left = try Sys.listDirectory(a).sorted(), right = try Sys.listDirectory(b).sorted()
        guard left == right else { return false }
        for name in left {
            let x = try Sys.stat(name, in: a), y = try Sys.stat(name, in: b)
            guard x.st_mode & S_IFMT == y.st_mode & S_IFMT else { return false }
            switch x.st_mode & S_IFMT {
            case S_IFDIR:
                let p = try FileDescriptor.open(name, in: a, flags: O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
                let q = try FileDescriptor.open(name, in: b, flags: O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
                guard try sameTree(p.rawValue, q.rawValue) else { return false }
            case S_IFREG:
                guard x.st_size == y.st_size, try sameBytes(name, in: a, as: name, in: b, from: 0, to: Int64(x.st_size)) else { return false }
            case S_IFLNK:
                guard try Sys.readlink(name, in: a) == Sys.readlink(name, in: b) else { return false }
            default:
                continue
            }
        }
        return true
    }

    /// Whether files `a` (in `aDir`) and `b` (in `bDir`) hold the same bytes from `start`
    /// to `end`.
    private func sameBytes(_ a: String, in aDir: Int32, as b: String, in bDir: Int32, from start: Int64, to end: Int64) throws -> Bool {
        let x = try FileDescriptor.open(a, in: aDir, flags: O_RDONLY | O_NOFOLLOW)
        let y = try FileDescriptor.open(b, in: bDir, flags: O_RDONLY | O_NOFOLLOW)
        var left = [UInt8](repeating: 0, count: 65536), right = [UInt8](repeating: 0, count: 65536)
        var offset = start
        while offset < end {
            let n = try left.withUnsafeMutableBytes { try Sys.readFully(x.rawValue, into: $0, at: offset) }
            let m = try right.withUnsafeMutableBytes { try Sys.readFully(y.rawValue, into: $0, at: offset) }
            guard n == m, n > 0, left[..<n] == right[..<m] else { return false }
            offset += Int64(n)
        }
        return true
    }

    /// Removes backing directory `name` of `dir` with everything in it (a copy of its twin).
    private func removeTree(_ name: String, in dir: Int32) throws {
        let fd = try FileDescriptor.open(name, in: dir, flags: O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
        for entry in try Sys.readDirectory(fd.rawValue) {
            if entry.type == UInt8(DT_DIR) { try removeTree(entry.name, in: fd.rawValue) } else { try Sys.unlink(entry.name, in: fd.rawValue) }
        }
        try Sys.unlink(name, in: dir, directory: true)
    }

    /// A symlink moves domain as a new symlink under its new name (its target sealed anew,
    /// its owner and times kept), then the old one goes; one made already (a crash between
    /// the two) is kept.
    private func convertSymlink(_ backing: String, stat st: stat, in dir: Node, to newName: String, from old: DomainKeys,
                                to new: DomainKeys) throws {
        let linkTarget = try Sys.readlink(backing, in: dir.fd)
        let stored = try new.codecs.symlinks.reseal(linkTarget, from: old.codecs.symlinks, sidecarsIn: nodes.root.fd)
        try SymlinkCodec.writeSidecar(stored, in: nodes.root.fd)
        do {
            try Sys.symlink(target: stored.linkTarget, name: newName, in: dir.fd)
            let made = try FileDescriptor.open(newName, in: dir.fd, flags: O_PATH | O_NOFOLLOW)
            if st.st_uid != geteuid() || st.st_gid != getegid() { try Sys.chown(newName, in: dir.fd, uid: st.st_uid, gid: st.st_gid) }
            try Sys.setTimes(made.rawValue, [st.st_atim, st.st_mtim])
        } catch let error as Errno where error.code == EEXIST {}
        try Sys.unlink(backing, in: dir.fd)
        if let sidecar = old.codecs.symlinks.sidecar(of: linkTarget) { SymlinkCodec.removeSidecar(sidecar, in: nodes.root.fd) }
    }

    /// Seals each coffer xattr of the inode at `path` anew in the other domain: the new
    /// one is set before the old one goes, and one already moved is left.
    private func resealXattrs(of path: String, from old: DomainKeys, to new: DomainKeys) throws {
        for backing in try Sys.listXattrs(path) {
            guard let name = old.codecs.xattrs.plaintextName(ofBacking: backing) else { continue }
            let moved = try new.codecs.xattrs.backingName(for: name)
            let sealed = try new.codecs.xattrs.reseal(try Sys.getXattr(path, backing), from: old.codecs.xattrs, backingName: backing,
                                                      as: moved)
            try Sys.setXattr(path, moved, sealed, flags: 0)
            try Sys.removeXattr(path, backing)
        }
    }

    /// A conversion found when a directory is entered (a crash, or another machine's
    /// conversion carried by a sync engine, interrupted it): finished at once with both
    /// domains' keys, by the caller's word that no operation can be running in it (the
    /// kernel has just been given the directory). Without the keys it is left for an unlock.
    func finishConversion(_ dir: Node, from: ProtectionClass, to: ProtectionClass, keys: Keys) {
        guard keys.vault != nil, keys.afterFirstUnlock != nil else { return }
        do {
            logger.notice("\(dir.plaintextPath) (backing inode \(dir.ino)): finishing its class change to \(to.name)")
            try convertDirectory(dir, from: from, to: to, keys: keys)
        } catch {
            logger.error("\(dir.plaintextPath) (backing inode \(dir.ino)): its class change to \(to.name) could not be finished: \(error)")
        }
    }
}

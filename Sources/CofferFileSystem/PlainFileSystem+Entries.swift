// Creating, linking, renaming and removing entries of the plaintext view.
import CofferCrypto
import CofferSystem
import CofferVault
import Glibc

extension PlainFileSystem {
    /// A new name in a directory: its backing name, and whether preparing it created
    /// the long-name sidecar (which must go again if the entry is not made).
    struct NewName {
        let backing: BackingName
        let createdSidecar: Bool
        var name: String { backing.name }

        func abandon(in dir: Node) {
            if createdSidecar { NameTransform.removeSidecar(backing, in: dir.fd) }
        }
    }

    /// Prepares a new name in `dir`: its backing name, with the long-name sidecar written.
    /// A directory made on two machines is settled on one IV first.
    func newName(_ name: [UInt8], in dir: Node, keys: Keys) throws -> NewName {
        try giveIVIfArriving(dir, keys: keys)
        try settleSplitDirectory(dir, keys: keys)
        let backing = try backingName(name, in: dir, keys: keys)
        return NewName(backing: backing, createdSidecar: try NameTransform.writeSidecar(backing, in: dir.fd))
    }

    /// Runs `create` for a new entry; removes the sidecar it wrote if that fails.
    private func creating(_ new: NewName, in dir: Node, _ create: () throws -> Void) throws {
        do {
            try create()
        } catch {
            new.abandon(in: dir)
            throw error
        }
    }

    /// Runs `create` for a new entry, then gives the entry to the caller; if either
    /// fails, the entry and its sidecar go again, so a failed create leaves nothing.
    private func creating(_ new: NewName, in dir: Node, caller: Caller, mode: mode_t, _ create: () throws -> Void) throws {
        try creating(new, in: dir, create)
        do {
            try own(new.name, in: dir, fd: nil, caller: caller, mode: mode)
        } catch {
            try? Sys.unlink(new.name, in: dir.fd)
            new.abandon(in: dir)
            throw error
        }
    }

    /// Gives a new entry (`fd`, or `backingName` in `dir`) to the caller when a root
    /// daemon serves other users. In a setgid directory it keeps the directory's group,
    /// which the backing file system gave it. chown clears the set-ID bits of anything
    /// but a directory, so those of `mode` (the mode it was made with) are put back.
    func own(_ backingName: String, in dir: Node, fd: Int32?, caller: Caller, mode: mode_t) throws {
        guard options.preserveOwner else { return }
        let gid = try Sys.stat(dir.fd).st_mode & S_ISGID != 0 ? gid_t.max : caller.gid
        if let fd {
            try Sys.chown(fd, uid: caller.uid, gid: gid)
        } else {
            try Sys.chown(backingName, in: dir.fd, uid: caller.uid, gid: gid)
        }
        let setID = mode & (S_ISUID | S_ISGID)
        guard setID != 0, mode & S_IFMT != S_IFDIR, mode & S_IFMT != S_IFLNK else { return }
        if let fd {
            try Sys.chmod(fd, mode & 0o7777)
        } else {
            let path = try FileDescriptor.open(backingName, in: dir.fd, flags: O_PATH | O_NOFOLLOW)
            try Sys.chmod(Sys.procPath(path.rawValue), mode & 0o7777)
        }
    }

    /// A name for a backing directory on its way in or out (mkdir, rmdir).
    static func temporaryDirectoryName() -> String { DirectoryIV.temporaryName() }

    /// The directory is made and given its IV under a temporary name, then renamed into
    /// place: a crash never leaves a directory without its IV.
    public func mkdir(parent: UInt64, name: [UInt8], mode: mode_t, caller: Caller) throws -> Entry {
        try inView(nodes.node(parent), locked: { try lockedMkdir($0, parent: parent, name: name, mode: mode, caller: caller) }) { keys in
            let dir = nodes.node(parent)
            let backing = try newName(name, in: dir, keys: keys)
            let temp = Self.temporaryDirectoryName()
            // Owner-writable until the IV file is in, whatever mode was asked for.
            try creating(backing, in: dir) { try Sys.mkdir(temp, in: dir.fd, mode: 0o700) }
            let iv: [UInt8]
            do {
                let fd = try FileDescriptor.open(temp, in: dir.fd, flags: O_PATH | O_DIRECTORY | O_NOFOLLOW)
                let place = Place(dirIV: try directoryIV(dir, keys: keys), name: name)
                iv = try DirectoryIV.create(in: fd.rawValue, durable: false,
                                            tag: bindsDirectories ? DirectoryBinding.tagging(at: place, macs: keys.in(dir).set.places) : nil)
                try inheritClass(from: dir, into: fd.rawValue, iv: iv, keys: keys)
                // A directory made in a setgid directory is setgid (mkdirat gave it the bit).
                let inherited = try Sys.stat(fd.rawValue).st_mode & S_ISGID
                try Sys.chmod(Sys.procPath(fd.rawValue), mode & 0o7777 | inherited)
                try own(temp, in: dir, fd: nil, caller: caller, mode: S_IFDIR)
                try Sys.rename(temp, in: dir.fd, to: backing.name, in: dir.fd, flags: RENAME_NOREPLACE)
            } catch {
                try? DirectoryIV.removeEmptyDirectory(temp, in: dir.fd)
                backing.abandon(in: dir)
                throw error
            }
            let entry = try enter(backing.name, in: dir, plainName: name, keys: keys)
            nodes.node(entry.node).setDirectoryIV(iv)
            return entry
        }
    }

    public func mknod(parent: UInt64, name: [UInt8], mode: mode_t, device: dev_t, caller: Caller) throws -> Entry {
        try withKeys { keys in
            let dir = nodes.node(parent)
            let backing = try newName(name, in: dir, keys: keys)
            try creating(backing, in: dir, caller: caller, mode: mode) {
                if mode & S_IFMT == S_IFREG {
                    let fd = try FileDescriptor.open(backing.name, in: dir.fd, flags: O_CREAT | O_EXCL | O_RDWR, mode: mode & 0o7777)
                    do {
                        try initializeContent(fd.rawValue, name: name, in: dir, keys: keys)
                    } catch {
                        try? Sys.unlink(backing.name, in: dir.fd)
                        throw error
                    }
                } else {
                    try Sys.mknod(backing.name, in: dir.fd, mode: mode, device: device)
                }
            }
            return try enter(backing.name, in: dir, plainName: name, keys: keys)
        }
    }

    public func symlink(target: [UInt8], parent: UInt64, name: [UInt8], caller: Caller) throws -> Entry {
        try inView(nodes.node(parent), locked: {
            try lockedSymlink($0, target: target, parent: parent, name: name, caller: caller)
        }) { keys in
            let dir = nodes.node(parent)
            let stored = try keys.in(dir).codecs.symlinks.encrypt(target)
            let backing = try newName(name, in: dir, keys: keys)
            // A long target's sidecar is written before the link, and goes if the link is not made.
            let wroteSidecar: Bool
            do {
                wroteSidecar = try SymlinkCodec.writeSidecar(stored, in: nodes.root.fd)
            } catch {
                backing.abandon(in: dir)
                throw error
            }
            do {
                try creating(backing, in: dir, caller: caller, mode: S_IFLNK) {
                    try Sys.symlink(target: stored.linkTarget, name: backing.name, in: dir.fd)
                }
            } catch {
                if wroteSidecar { SymlinkCodec.removeSidecar(stored.linkTarget, in: nodes.root.fd) }
                throw error
            }
            return try enter(backing.name, in: dir, plainName: name, keys: keys)
        }
    }

    public func readlink(_ id: UInt64) throws -> [UInt8] {
        let node = nodes.node(id)
        return try inView(node, locked: { view in
            // A symlink made while locked: its target is the program's, kept until the unlock.
            guard let target = view.drop(of: node)?.target else { throw Errno(EACCES, "locked") }
            return target
        }) { keys in
            try reportingDamage(node) {
                try keys.in(node).codecs.symlinks.decrypt(try Sys.readlink("", in: node.fd), sidecarsIn: nodes.root.fd)
            }
        }
    }

    public func link(_ id: UInt64, newParent: UInt64, newName name: [UInt8]) throws -> Entry {
        try withKeys { keys in
            let node = nodes.node(id), dir = nodes.node(newParent)
            // A file's links are all in one key domain (format 8: its key is wrapped in one).
            guard node.keyDomain == dir.keyDomain else { throw Errno(EXDEV, "a hard link across key domains") }
            let backing = try newName(name, in: dir, keys: keys)
            // A file with hard links has several places: its content is bound to none.
            let unbind = try node.entry.flatMap { try rebind(.node(node), shownAs: $0.name, in: $0.parent, to: nil, keys: keys) }
            do {
                try creating(backing, in: dir) {
                    try Sys.link(node.procPath, to: backing.name, in: dir.fd)
                }
            } catch {
                unbind?()
                throw error
            }
            // The new name is the node's own inode: entered by its descriptor, no name opened.
            let st = try Sys.stat(node.fd)
            guard nodes.rememberAgain(node) else { return try enter(backing.name, in: dir, plainName: name, keys: keys) }
            node.setName(name, parent: dir)
            dir.rememberEntry(name)
            return Entry(node: nodes.id(of: node), attributes: plain(st, of: node.fd), validFor: cacheSeconds(in: dir))
        }
    }

    public func unlink(parent: UInt64, name: [UInt8]) throws {
        try inView(nodes.node(parent), locked: { try lockedRemove($0, parent: parent, name: name, directory: false) }) { keys in
            let dir = nodes.node(parent)
            let (backing, st) = try existingEntry(name, in: dir, keys: keys)
            let targetSidecar = st.flatMap { lastLinkTargetSidecar(backing.name, stat: $0, in: dir, keys: keys) }
            let keyRecord = st.flatMap { lastLinkKeyRecord(backing.name, shownAs: name, stat: $0, in: dir, keys: keys) }
            if let st { markRemovedThroughMount(st) }
            try Sys.unlink(backing.name, in: dir.fd)
            NameTransform.removeSidecar(backing, in: dir.fd)
            if let targetSidecar { SymlinkCodec.removeSidecar(targetSidecar, in: nodes.root.fd) }
            if let keyRecord { DropRecord.remove(fileID: keyRecord, root: nodes.root.fd) }
        }
    }

    /// Marks the node of the backing entry with stat `st` (if the kernel holds it) as
    /// losing its last name through this mount, which its open files survive (see
    /// `refuseIfRemovedByOthers`). Marked before the removal: a removal that then fails
    /// only spares a later write the check.
    private func markRemovedThroughMount(_ st: stat) {
        guard st.st_nlink <= 1, let node = nodes.known(st) else { return }
        node.removedThroughMount.store(true, ordering: .releasing)
    }

    /// The target sidecar of backing entry `backingName` if it is the last link to a
    /// symlink with a long target (whose sidecar must go with it), else nil. `st` is its
    /// stat; the link is read only in vaults that have such sidecars.
    private func lastLinkTargetSidecar(_ backingName: String, stat st: stat, in dir: Node, keys: Keys) -> String? {
        guard let symlinks = try? keys.in(dir).codecs.symlinks, symlinks.longTargets, st.st_mode & S_IFMT == S_IFLNK, st.st_nlink == 1,
              st.st_size == SymlinkCodec.referenceLength, let linkTarget = try? Sys.readlink(backingName, in: dir.fd) else { return nil }
        return symlinks.sidecar(of: linkTarget)
    }

    /// The file ID of the key record that backing entry `backingName` (stat `st`) takes with
    /// it when it goes: the last link of a file made while locked (its header sealed,
    /// FORMAT.md §12), in a vault that has key records; else nil. The header is read only
    /// where coffer.drops exists (one stat of it for every other removal). Only a file that
    /// proves it is that file, here — its place tag is the one of `name` in `dir` — takes
    /// the record: a copy of it (planted, or a sync engine's conflict copy, whose tag is its
    /// original's) must not take the original's key with it.
    private func lastLinkKeyRecord(_ backingName: String, shownAs name: [UInt8], stat st: stat, in dir: Node,
                                   keys: Keys) -> FileID? {
        // Files made while locked are in unless-open directories: the vault domain's.
        guard let set = keys.vault?.set, set.drops != nil, st.st_mode & S_IFMT == S_IFREG, st.st_nlink == 1,
              (try? Sys.stat(DropRecord.directory, in: nodes.root.fd)) != nil,
              let fd = try? FileDescriptor.openRegular(backingName, in: dir.fd),
              let header = try? ContentFile(fd: fd.rawValue, cipher: set.content, layout: layout).header(),
              header.isSealed, let tag = header.placeTag,
              let expected = try? set.places.tag(fileID: header.fileID.bytes, dirIV: directoryIV(dir, keys: keys), name: name),
              PlaceMAC.equal(tag, expected) else { return nil }
        return header.fileID
    }

    /// Removes an empty directory: first renamed out of the way, then emptied of its IV
    /// file (and orphan sidecars) and removed, so that a crash leaves at worst a hidden
    /// temporary directory, never a directory without its IV.
    public func rmdir(parent: UInt64, name: [UInt8]) throws {
        try inView(nodes.node(parent), locked: { try lockedRemove($0, parent: parent, name: name, directory: true) }) { keys in
            let dir = nodes.node(parent)
            let backing = try existingBackingName(name, in: dir, keys: keys)
            try replacingEmptyDirectory(backing.name, in: dir) {}
            NameTransform.removeSidecar(backing, in: dir.fd)
        }
    }

    /// Moves the empty backing directory `name` of `dir` aside under a temporary name,
    /// runs `body` (which may put another entry in its place), then removes it; if `body`
    /// fails, it goes back. Throws ENOTEMPTY if it holds anything but its IV file and
    /// orphan long-name sidecars.
    func replacingEmptyDirectory(_ name: String, in dir: Node, _ body: () throws -> Void) throws {
        let fd = try FileDescriptor.open(name, in: dir.fd, flags: O_PATH | O_DIRECTORY | O_NOFOLLOW)
        guard try DirectoryIV.leftovers(in: fd.rawValue) != nil else { throw Errno(ENOTEMPTY, "rmdir") }
        forgetSyncedDirectory(try Sys.stat(fd.rawValue))
        let temp = Self.temporaryDirectoryName()
        try Sys.rename(name, in: dir.fd, to: temp, in: dir.fd, flags: RENAME_NOREPLACE)
        do {
            try body()
        } catch {
            try? Sys.rename(temp, in: dir.fd, to: name, in: dir.fd, flags: RENAME_NOREPLACE)
            throw error
        }
        try? DirectoryIV.removeEmptyDirectory(temp, in: dir.fd)
    }

    /// rename(2)/renameat2(2): `flags` may hold RENAME_NOREPLACE or RENAME_EXCHANGE.
    /// Other flags (RENAME_WHITEOUT, for overlayfs) are refused with EINVAL: a whiteout
    /// left under a long name would have no sidecar to name it.
    public func rename(parent: UInt64, name: [UInt8], newParent: UInt64, newName: [UInt8], flags: UInt32) throws {
        guard flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) == 0 else { throw Errno(EINVAL, "rename flags") }
        // Served with the after-first-unlock keys while locked only if both are of that domain.
        let target = nodes.node(parent).keyDomain == nodes.node(newParent).keyDomain ? nodes.node(parent) : nil
        try inView(target, locked: {
            try lockedRename($0, parent: parent, name: name, newParent: newParent, newName: newName, flags: flags)
        }) { keys in
            let from = nodes.node(parent), to = nodes.node(newParent)
            // Between key domains (format 8) a file is re-wrapped and a directory keeps its
            // own domain (its class); a symlink (whose target would be sealed anew) and a
            // file with other links (which stay where they are) are EXDEV: mv copies them.
            let crossing = from.keyDomain != to.keyDomain
            // Settled before the source's backing name is taken: settling renames.
            try settleSplitDirectory(from, keys: keys)
            try settleSplitDirectory(to, keys: keys)
            // One stat of each backing entry serves every decision below.
            let (old, moving) = try existingEntry(name, in: from, keys: keys)
            if crossing {
                guard let moving, moving.st_mode & S_IFMT != S_IFLNK, moving.st_mode & S_IFMT == S_IFDIR || moving.st_nlink == 1,
                      flags & RENAME_EXCHANGE == 0 else { throw Errno(EXDEV, "a rename across key domains") }
            }
            let new = try self.newName(newName, in: to, keys: keys)
            let target = try? Sys.stat(new.name, in: to.fd)
            // A symlink replaced by the rename takes its long target's sidecar with it.
            let replacedSidecar = flags & RENAME_EXCHANGE == 0 && !(from === to && old == new.backing)
                ? target.flatMap { lastLinkTargetSidecar(new.name, stat: $0, in: to, keys: keys) } : nil
            let replacedRecord = flags & RENAME_EXCHANGE == 0 && !(from === to && old == new.backing)
                ? target.flatMap { lastLinkKeyRecord(new.name, shownAs: newName, stat: $0, in: to, keys: keys) } : nil
            if flags & RENAME_EXCHANGE == 0 && !(from === to && old == new.backing), let target {
                markRemovedThroughMount(target)
            }
            let exchanged = flags & RENAME_EXCHANGE != 0 ? target : nil
            // Content moves to its new place (both ways for an exchange) before the rename.
            var rebound: [() -> Void] = []
            if !(from === to && old == new.backing) {
                let place = Place(dirIV: try directoryIV(to, keys: keys), name: newName)
                if let moving, let undo = try rebind(.entry(old.name, in: from), stat: moving, shownAs: name, in: from,
                                                     to: place, toDomain: crossing ? to.keyDomain : nil, keys: keys) {
                    rebound.append(undo)
                }
                if let exchanged,
                   let undo = try rebind(.entry(new.name, in: to), stat: exchanged, shownAs: newName, in: to,
                                         to: Place(dirIV: try directoryIV(from, keys: keys), name: name), keys: keys) {
                    rebound.append(undo)
                }
            }
            do {
                try renameReplacingEmptyDirectory(old.name, stat: moving, in: from, to: new.name, stat: target, in: to, flags: flags)
                to.rememberEntry(newName)
                // The nodes know their new names (an open checks the place by it).
                if let moving, let node = nodes.known(moving) {
                    node.setName(newName, parent: to)
                    if !node.isDirectory { node.setKeyDomain(to.keyDomain) }
                }
                if let exchanged, let node = nodes.known(exchanged) { node.setName(name, parent: from) }
            } catch {
                rebound.forEach { $0() }
                new.abandon(in: to)
                throw error
            }
            // With RENAME_EXCHANGE both names still exist; otherwise the old one is gone
            // (unless it was renamed onto itself).
            if flags & RENAME_EXCHANGE == 0 && !(from === to && old == new.backing) {
                NameTransform.removeSidecar(old, in: from.fd)
            }
            if let replacedSidecar { SymlinkCodec.removeSidecar(replacedSidecar, in: nodes.root.fd) }
            if let replacedRecord { DropRecord.remove(fileID: replacedRecord, root: nodes.root.fd) }
        }
    }

    /// renameat2 of backing entries (whose stats the caller has made). A directory may
    /// replace an empty directory, as on ext4: the target is moved aside first (and comes
    /// back if the rename fails).
    private func renameReplacingEmptyDirectory(_ old: String, stat source: stat?, in from: Node, to new: String, stat target: stat?,
                                               in to: Node, flags: UInt32) throws {
        guard flags == 0,
              let source, source.st_mode & S_IFMT == S_IFDIR,
              let target, target.st_mode & S_IFMT == S_IFDIR,
              source.st_ino != target.st_ino else {
            return try Sys.rename(old, in: from.fd, to: new, in: to.fd, flags: flags)
        }
        try replacingEmptyDirectory(new, in: to) { try Sys.rename(old, in: from.fd, to: new, in: to.fd, flags: RENAME_NOREPLACE) }
    }

    /// Changes attributes; `handle` is the open file of ftruncate/futimens, if any.
    /// A file a lock left its key (open at the lock, in an `unless-open` directory), and
    /// an entry made while locked, are still changed while locked. So are the mode, owner
    /// and times — which need no key — of an `unless-open` directory and of the files
    /// from before the lock that the kernel knew in one.
    public func setattr(_ id: UInt64, changes: AttributeChanges, handle: UInt64?) throws -> stat {
        let node = nodes.node(id)
        return try inView(node, locked: { view in
            let drop = view.drop(of: node)
            if let drop, drop.isDirectory || drop.cipher != nil {
                return try changeAttributes(node, changes, handle: handle) { _ in drop.cipher }
            }
            if changes.size == nil, drop != nil || view.directory(node)?.takesDrops == true {
                return try changeAttributes(node, changes, handle: handle) { _ in nil }
            }
            // The key a lock left the file, or EACCES.
            return try withContentKey(node) { cipher in try changeAttributes(node, changes, handle: handle, cipher) }
        }) { keys in try changeAttributes(node, changes, handle: handle) { try contentCipher($0, of: node, keys: keys) } }
    }

    /// setattr of `node`, with `cipher` for the content (nil for a directory).
    private func changeAttributes(_ node: Node, _ changes: AttributeChanges, handle: UInt64?,
                                  _ cipher: (Int32) throws -> ContentCipher?) throws -> stat {
        if let mode = changes.mode, !node.isSymlink {
            try Sys.chmod(node.procPath, mode & 0o7777)
        }
        if changes.uid != nil || changes.gid != nil {
            try Sys.chown("", in: node.fd, uid: changes.uid ?? uid_t.max, gid: changes.gid ?? gid_t.max)
        }
        if let size = changes.size {
            guard node.isRegular else { throw Errno(node.isDirectory ? EISDIR : EINVAL, "truncate") }
            try refuseIfRemovedByOthers(node)  // and after: see write
            try withWritableDescriptor(node, handle: handle) { fd in
                try reportingDamage(node) {
                    try node.contentLock.writing {
                        guard let cipher = try cipher(fd) else { throw Errno(EACCES, "locked") }
                        try content(fd, of: node, cipher: cipher, safety: rewriteSafety(node)).truncate(to: size)
                    }
                }
            }
            try refuseIfRemovedByOthers(node)
        }
        if let caller = changes.dropSetIDFor { _ = try dropSetID(node, fd: nil, caller: caller) }
        if changes.accessTime != nil || changes.modificationTime != nil {
            let omit = timespec(tv_sec: 0, tv_nsec: UTIME_OMIT)
            let times = [changes.accessTime ?? omit, changes.modificationTime ?? omit]
            try Sys.setTimes(node.fd, times)
        }
        return plain(try Sys.stat(node.fd), of: node.fd)
    }
}

/// The attributes a setattr request changes; nil leaves one as it is.
public struct AttributeChanges {
    public var mode: mode_t?
    public var uid: uid_t?
    public var gid: gid_t?
    public var size: Int64?
    /// tv_nsec may be UTIME_NOW.
    public var accessTime: timespec?
    public var modificationTime: timespec?
    /// Clear setuid/setgid as a chown or truncate by this caller does (the kernel's
    /// FATTR_KILL_SUIDGID).
    public var dropSetIDFor: PlainFileSystem.Caller?
    public init() {}
}

// Protection classes in the plaintext view (format 6, docs/FORMAT.md §12): a directory's
// class is read and set through the xattr `user.coffer.class` (what `coffer protect`
// calls), a new directory takes its parent's, and a lock leaves each open file of an
// `unless-open` directory its own key until its last close.
import CofferCrypto
import CofferSystem
import CofferVault
import Glibc

extension PlainFileSystem {
    /// The xattr that shows and sets a directory's class; never stored as an xattr.
    static let classAttribute = Array("user.coffer.class".utf8)

    /// The class of directory `dir`. A damaged class record is reported once per read and
    /// taken as `complete`.
    func protectionClass(of dir: Node, keys: Keys) -> ProtectionClass {
        guard vault.config.hasProtectionClasses, dir.isDirectory else { return .complete }
        do {
            return try ProtectionClass.read(in: dir.fd, dirIV: try directoryIV(dir, keys: keys), box: keys.vault?.set.metadata,
                                            afterFirstUnlock: keys.afterFirstUnlockRecords)
        } catch {
            logger.error("damage: \(dir.plaintextPath) (backing inode \(dir.ino)): \(error); the directory is taken as complete")
            hooks.noticed(.damage(path: dir.plaintextPath, what: "\(error)"))
            return .complete
        }
    }

    /// getxattr of `user.coffer.class`: a directory's class name (every directory has
    /// one; `complete` unless set); ENOTDIR for other nodes, ENODATA in vaults before format 6.
    func showClass(_ id: UInt64) throws -> [UInt8] {
        try withKeys { keys in
            let node = nodes.node(id)
            guard vault.config.hasProtectionClasses else { throw Errno(ENODATA, "getxattr") }
            guard node.isDirectory else { throw Errno(ENOTDIR, "a protection class is a directory's") }
            return Array(protectionClass(of: node, keys: keys).name.utf8)
        }
    }

    /// setxattr of `user.coffer.class` (removexattr: `value` nil, back to `complete`):
    /// only the directory's owner (or root) sets it; EOPNOTSUPP before format 6, ENOTDIR
    /// on anything but a directory, EINVAL for a value that names no class.
    func setClass(_ id: UInt64, value: [UInt8]?, caller: Caller) throws {
        let change: (from: ProtectionClass, to: ProtectionClass)? = try withKeys { keys in
            let node = nodes.node(id)
            guard vault.config.hasProtectionClasses else { throw Errno(EOPNOTSUPP, "protection classes need format 6") }
            guard node.isDirectory else { throw Errno(ENOTDIR, "a protection class is a directory's") }
            let owner = try Sys.stat(node.fd).st_uid
            guard caller.uid == 0 || caller.uid == owner else { throw Errno(EPERM, "not the owner") }
            let wanted = value.map { String(decoding: $0, as: UTF8.self) }.map { $0.hasSuffix("\n") ? String($0.dropLast()) : $0 }
            guard let chosen = wanted.map(ProtectionClass.init(name:)) ?? .complete else { throw Errno(EINVAL, "no such class") }
            guard chosen.formats.contains(vault.config.format) else { throw Errno(EINVAL, "\(chosen.name) needs a vault of format 8") }
            let current = protectionClass(of: node, keys: keys)
            // Between key domains the directory's entries move (PlainFileSystem+Conversion),
            // with every other operation waiting: done below, outside this operation. So do
            // entries left in the other domain by another machine's class change.
            let stragglers = chosen.domain == node.keyDomain && hasEntriesInTheOtherDomain(node, keys: keys)
            if chosen.domain != node.keyDomain || stragglers {
                try settleSplitDirectory(node, keys: keys)
                try checkConvertible(node, keys: keys)
                return (stragglers ? (chosen.domain == .vault ? .afterFirstUnlock : .complete) : current, chosen)
            }
            try chosen.write(in: node.fd, dirIV: try directoryIV(node, keys: keys), box: keys.of(chosen.domain).set.metadata)
            logger.info("protection class of \(node.plaintextPath) (backing inode \(node.ino)) set to \(chosen.name)")
            return nil
        }
        guard let change else { return }
        try withEveryOperationWaiting { keys in
            try convertDirectory(nodes.node(id), from: change.from, to: change.to, keys: keys)
        }
    }

    /// Whether directory `dir` holds an entry whose name opens under the other key domain
    /// and not under its own (format 8): left by another machine that gave it a class of
    /// the other domain at the same time. One listing, each name decoded.
    func hasEntriesInTheOtherDomain(_ dir: Node, keys: Keys) -> Bool {
        guard vault.config.hasKeyDomains, let iv = try? directoryIV(dir, keys: keys), let own = try? keys.in(dir),
              let other = try? keys.of(own.domain == .vault ? .afterFirstUnlock : .vault) else { return false }
        for backing in (try? Sys.listDirectory(dir.fd)) ?? [] where !NameTransform.isReserved(backing) {
            guard ConflictName.parse(backingName: backing) == nil,
                  (try? own.codecs.names.plaintextName(ofBacking: backing, dirIV: iv, in: dir.fd)) == nil else { continue }
            if (try? other.codecs.names.plaintextName(ofBacking: backing, dirIV: iv, in: dir.fd)) != nil { return true }
        }
        return false
    }

    /// The class a new directory in `parent` starts with (its parent's), written into the
    /// new backing directory `fd` (IV `iv`) before it is renamed into place.
    func inheritClass(from parent: Node, into fd: Int32, iv: [UInt8], keys: Keys) throws {
        let inherited = protectionClass(of: parent, keys: keys)
        guard inherited != .complete else { return }
        try inherited.write(in: fd, dirIV: iv, box: keys.of(inherited.domain).set.metadata)
    }

    /// At a lock, with the keys being retired and no operation running: every regular
    /// file open now whose directory is `unless-open` keeps its own key (and nothing
    /// else) until its last close. Returns how many files kept one.
    @discardableResult
    func keepOpenFiles(keys: Keys, unlessOpen: Set<LockedView.Key>) -> Int {
        var kept = 0
        for node in nodes.allNodes() where node.isRegular && node.isOpen && node.keptKey == nil {
            guard let dir = node.directory, unlessOpen.contains(.init(dir)) else { continue }
            do {
                let fd = try FileDescriptor.open(node.procPath, flags: O_RDONLY | O_NONBLOCK)
                let cipher = try contentCipher(fd.rawValue, of: node, keys: keys)
                guard let id = try content(fd.rawValue, of: node, cipher: cipher).fileID() else { continue }
                // A file made while locked holds its own key already: the node gets a copy.
                if node.keep(cipher.onlyFile != nil ? cipher.copy() : try cipher.fileCipher(for: id)) { kept += 1 }
            } catch {
                logger.error("""
                    lock: \(node.plaintextPath) (backing inode \(node.ino)) could not keep its key: \(error); its open files are locked too
                    """)
            }
        }
        if kept > 0 { logger.info("lock: \(kept) open file(s) of unless-open directories keep their keys until closed") }
        return kept
    }

    /// The directories the kernel knows whose class is `unless-open`: read once at a lock,
    /// for the open files it leaves their keys and the directories that take new files.
    func unlessOpenDirectories(keys: Keys) -> Set<LockedView.Key> {
        guard vault.config.hasProtectionClasses else { return [] }
        return Set(nodes.allNodes().filter { $0.isDirectory && protectionClass(of: $0, keys: keys) == .unlessOpen }.map(LockedView.Key.init))
    }

    /// How many files a lock left their keys, still open.
    public var filesKeptOpen: Int { nodes.allNodes().filter { $0.keptKey != nil }.count }
}

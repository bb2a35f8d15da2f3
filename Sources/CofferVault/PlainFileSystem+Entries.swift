// Creating, linking, renaming and removing entries of the plaintext view.
import CofferCrypto
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
    func newName(_ name: [UInt8], in dir: Node, keys: Keys) throws -> NewName {
        let backing = try keys.names.backingName(for: name, dirIV: try dir.directoryIV())
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

    /// Gives a new entry to the caller (a root daemon serving other users).
    private func own(_ backingName: String, in dir: Node, caller: Caller) throws {
        guard options.preserveOwner else { return }
        try retryOnInterrupt("fchownat") {
            fchownat(dir.fd, backingName, caller.uid, caller.gid, AT_SYMLINK_NOFOLLOW)
        }
    }

    /// A name for a backing directory on its way in or out (mkdir, rmdir): it starts
    /// with '.', so listings pass over it, and `coffer fsck --repair` removes one that a
    /// crash left behind.
    static func temporaryDirectoryName() -> String {
        DirectoryIV.temporaryPrefix + Sodium.randomArray(count: 8).map { String(format: "%02x", $0) }.joined()
    }

    /// The directory is made and given its IV under a temporary name, then renamed into
    /// place: a crash never leaves a directory without its IV.
    public func mkdir(parent: UInt64, name: [UInt8], mode: mode_t, caller: Caller) throws -> Entry {
        try withKeys { keys in
            let dir = nodes.node(parent)
            let backing = try newName(name, in: dir, keys: keys)
            let temp = Self.temporaryDirectoryName()
            // Owner-writable until the IV file is in, whatever mode was asked for.
            try creating(backing, in: dir) { try Sys.mkdir(temp, in: dir.fd, mode: 0o700) }
            let iv: [UInt8]
            do {
                let fd = try Sys.open(temp, in: dir.fd, flags: O_PATH | O_DIRECTORY | O_NOFOLLOW)
                defer { Sys.close(fd) }
                iv = try DirectoryIV.create(in: fd, durable: false)
                try retryOnInterrupt("chmod") { chmod("/proc/self/fd/\(fd)", mode & 0o7777) }
                try own(temp, in: dir, caller: caller)
                try Sys.rename(temp, in: dir.fd, to: backing.name, in: dir.fd, flags: RENAME_NOREPLACE)
            } catch {
                try? DirectoryIV.removeEmptyDirectory(temp, in: dir.fd)
                backing.abandon(in: dir)
                throw error
            }
            let entry = try enter(backing.name, in: dir, plainName: name)
            nodes.node(entry.node).setDirectoryIV(iv)
            return entry
        }
    }

    public func mknod(parent: UInt64, name: [UInt8], mode: mode_t, device: dev_t, caller: Caller) throws -> Entry {
        try withKeys { keys in
            let dir = nodes.node(parent)
            let backing = try newName(name, in: dir, keys: keys)
            try creating(backing, in: dir) {
                if mode & S_IFMT == S_IFREG {
                    Sys.close(try Sys.open(backing.name, in: dir.fd, flags: O_CREAT | O_EXCL | O_WRONLY, mode: mode & 0o7777))
                } else {
                    try retryOnInterrupt("mknodat") { mknodat(dir.fd, backing.name, mode, device) }
                }
            }
            try own(backing.name, in: dir, caller: caller)
            return try enter(backing.name, in: dir, plainName: name)
        }
    }

    public func symlink(target: [UInt8], parent: UInt64, name: [UInt8], caller: Caller) throws -> Entry {
        try withKeys { keys in
            let dir = nodes.node(parent)
            let stored = try keys.symlinks.encrypt(target)
            let backing = try newName(name, in: dir, keys: keys)
            try creating(backing, in: dir) { try Sys.symlink(target: stored, name: backing.name, in: dir.fd) }
            try own(backing.name, in: dir, caller: caller)
            return try enter(backing.name, in: dir, plainName: name)
        }
    }

    public func readlink(_ id: UInt64) throws -> [UInt8] {
        try withKeys { keys in
            let node = nodes.node(id)
            return try reportingDamage(node) { try keys.symlinks.decrypt(try Sys.readlink("", in: node.fd)) }
        }
    }

    public func link(_ id: UInt64, newParent: UInt64, newName name: [UInt8]) throws -> Entry {
        try withKeys { keys in
            let node = nodes.node(id), dir = nodes.node(newParent)
            let backing = try newName(name, in: dir, keys: keys)
            try creating(backing, in: dir) {
                try retryOnInterrupt("linkat") { linkat(AT_FDCWD, node.procPath, dir.fd, backing.name, AT_SYMLINK_FOLLOW) }
            }
            return try enter(backing.name, in: dir, plainName: name)
        }
    }

    public func unlink(parent: UInt64, name: [UInt8]) throws {
        try withKeys { keys in
            let dir = nodes.node(parent)
            let backing = try keys.names.backingName(for: name, dirIV: try dir.directoryIV())
            try Sys.unlink(backing.name, in: dir.fd)
            NameTransform.removeSidecar(backing, in: dir.fd)
        }
    }

    /// Removes an empty directory: first renamed out of the way, then emptied of its IV
    /// file (and orphan sidecars) and removed, so that a crash leaves at worst a hidden
    /// temporary directory, never a directory without its IV.
    public func rmdir(parent: UInt64, name: [UInt8]) throws {
        try withKeys { keys in
            let dir = nodes.node(parent)
            let backing = try keys.names.backingName(for: name, dirIV: try dir.directoryIV())
            try replacingEmptyDirectory(backing.name, in: dir) {}
            NameTransform.removeSidecar(backing, in: dir.fd)
        }
    }

    /// Moves the empty backing directory `name` of `dir` aside under a temporary name,
    /// runs `body` (which may put another entry in its place), then removes it; if `body`
    /// fails, it goes back. Throws ENOTEMPTY if it holds anything but its IV file and
    /// orphan long-name sidecars.
    func replacingEmptyDirectory(_ name: String, in dir: Node, _ body: () throws -> Void) throws {
        let fd = try Sys.open(name, in: dir.fd, flags: O_PATH | O_DIRECTORY | O_NOFOLLOW)
        defer { Sys.close(fd) }
        guard try DirectoryIV.leftovers(in: fd) != nil else { throw Errno(ENOTEMPTY, "rmdir") }
        forgetSyncedDirectory(try Sys.stat(fd))
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
    public func rename(parent: UInt64, name: [UInt8], newParent: UInt64, newName: [UInt8], flags: UInt32) throws {
        try withKeys { keys in
            let from = nodes.node(parent), to = nodes.node(newParent)
            let old = try keys.names.backingName(for: name, dirIV: try from.directoryIV())
            let new = try self.newName(newName, in: to, keys: keys)
            do {
                try renameReplacingEmptyDirectory(old.name, in: from, to: new.name, in: to, flags: flags)
                to.rememberEntry(newName)
            } catch {
                new.abandon(in: to)
                throw error
            }
            // With RENAME_EXCHANGE both names still exist; otherwise the old one is gone
            // (unless it was renamed onto itself).
            if flags & RENAME_EXCHANGE == 0 && !(from === to && old == new.backing) {
                NameTransform.removeSidecar(old, in: from.fd)
            }
        }
    }

    /// renameat2 of backing entries. A directory may replace an empty directory, as on
    /// ext4: the target is moved aside first (and comes back if the rename fails).
    private func renameReplacingEmptyDirectory(_ old: String, in from: Node, to new: String, in to: Node, flags: UInt32) throws {
        guard flags == 0,
              let source = try? Sys.stat(old, in: from.fd), source.st_mode & S_IFMT == S_IFDIR,
              let target = try? Sys.stat(new, in: to.fd), target.st_mode & S_IFMT == S_IFDIR,
              source.st_ino != target.st_ino else {
            return try Sys.rename(old, in: from.fd, to: new, in: to.fd, flags: flags)
        }
        try replacingEmptyDirectory(new, in: to) { try Sys.rename(old, in: from.fd, to: new, in: to.fd, flags: RENAME_NOREPLACE) }
    }

    /// Changes attributes; `handle` is the open file of ftruncate/futimens, if any.
    public func setattr(_ id: UInt64, changes: AttributeChanges, handle: UInt64?) throws -> stat {
        try withKeys { keys in
            let node = nodes.node(id)
            if let mode = changes.mode, !node.isSymlink {
                try retryOnInterrupt("chmod") { chmod(node.procPath, mode & 0o7777) }
            }
            if changes.uid != nil || changes.gid != nil {
                try retryOnInterrupt("fchownat") {
                    fchownat(node.fd, "", changes.uid ?? uid_t.max, changes.gid ?? gid_t.max,
                             AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)
                }
            }
            if let size = changes.size {
                guard node.isRegular else { throw Errno(node.isDirectory ? EISDIR : EINVAL, "truncate") }
                try withWritableDescriptor(node, handle: handle) { fd in
                    try reportingDamage(node) {
                        try node.content.writing {
                            try ContentFile(fd: fd, cipher: keys.set.content, ids: node.fileIDs,
                                            safety: rewriteSafety(node)).truncate(to: size)
                        }
                    }
                }
            }
            if let caller = changes.dropSetIDFor { _ = try dropSetID(node, fd: nil, caller: caller) }
            if changes.accessTime != nil || changes.modificationTime != nil {
                let omit = timespec(tv_sec: 0, tv_nsec: UTIME_OMIT)
                let times = [changes.accessTime ?? omit, changes.modificationTime ?? omit]
                try retryOnInterrupt("utimensat") { utimensat(node.fd, "", times, AT_EMPTY_PATH) }
            }
            return plain(try Sys.stat(node.fd))
        }
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

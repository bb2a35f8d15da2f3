// Opening, reading, writing and syncing files of the plaintext view.
import CofferCrypto
import CofferSystem
import CofferVault
import Glibc

/// An open file: a read-write (or read-only) descriptor of the backing file. Its
/// address is the handle the kernel passes back with every request.
final class OpenFile {
    let node: Node
    private let descriptor: FileDescriptor
    /// The backing file's descriptor, borrowed for calls (valid while the file is open).
    var fd: Int32 { descriptor.rawValue }
    let writable: Bool
    /// O_SYNC or O_DSYNC: each write is on the disk when it returns.
    let synchronous: Bool
    /// The writes' sequential runs (changed under the node's content lock).
    var writeBehind = WriteBehind()

    init(node: Node, fd: consuming FileDescriptor, writable: Bool, synchronous: Bool = false) {
        self.node = node
        descriptor = fd
        self.writable = writable
        self.synchronous = synchronous
        node.fileOpened()
    }

    deinit { node.fileClosed() }

    /// Retains this file and returns its handle for the kernel; each call needs its own
    /// `release`, so call it once, where the handle is handed out.
    func issueHandle() -> UInt64 { Handles.make(self) }

    static func borrow(_ handle: UInt64) -> OpenFile { Handles.borrow(handle, as: OpenFile.self) }

    static func release(_ handle: UInt64) { Handles.release(handle, as: OpenFile.self) }
}

extension PlainFileSystem {
    /// Flags for the backing descriptor. Writing needs reading too (read-modify-write of
    /// blocks); O_APPEND is dropped (the kernel sends the offset), O_TRUNC is applied to
    /// the plaintext afterwards, O_DIRECT does not fit block-sized ciphertext.
    static func backingFlags(_ flags: Int32) -> (flags: Int32, writable: Bool) {
        let writable = flags & O_ACCMODE != O_RDONLY
        let kept = flags & (O_SYNC | O_DSYNC)
        return ((writable ? O_RDWR : O_RDONLY) | kept, writable)
    }

    /// The handle of a new open file; with `truncate` the content is emptied first (the
    /// descriptor is closed again if that fails).
    private func openHandle(_ node: Node, fd: consuming FileDescriptor, flags: Int32, writable: Bool, truncate: Bool,
                            keys: Keys) throws -> UInt64 {
        // O_SYNC includes the O_DSYNC bit.
        let file = OpenFile(node: node, fd: fd, writable: writable, synchronous: flags & O_DSYNC != 0)
        if truncate && writable {
            try node.contentLock.writing {
                try content(file.fd, of: node, keys: keys).truncate(to: 0)
                // Emptied content is the caller's new content: it belongs where it is opened.
                try rebindEmptied(node, fd: file.fd, keys: keys)
            }
        }
        return file.issueHandle()
    }

    public func open(_ id: UInt64, flags: Int32, caller: Caller) throws -> UInt64 {
        try inView(nodes.node(id), locked: { try lockedOpen($0, id, flags: flags) }) { keys in
            let node = nodes.node(id)
            let (backingFlags, writable) = Self.backingFlags(flags)
            let fd = try openForReadModifyWrite(node, flags: backingFlags, userWantsRead: flags & O_ACCMODE != O_WRONLY)
            let truncate = flags & O_TRUNC != 0 && writable
            // Set-ID bits go before the content, as one change on a local file system;
            // if they cannot, nothing is truncated and no handle is made.
            // A length that no write leaves (a last block cut inside its nonce or tag,
            // bytes after the last whole block, a short header) is damage, reported
            // here: the kernel asks for no byte past the whole blocks it is shown.
            // From format 4 the final block is checked too, and the content's place.
            if !truncate && layout.endsInFinalBlock {
                try checkPlaceAndLength(node, fd: fd.rawValue, keys: keys)
            } else if !truncate {
                try reportingDamage(node) { _ = try layout.plainSize(cipherSize: Int64(Sys.stat(fd.rawValue).st_size)) }
            }
            let dropped = truncate && !caller.keepsSetID ? try dropSetID(node, fd: fd.rawValue, caller: caller) : false
            let handle = try openHandle(node, fd: fd, flags: backingFlags, writable: writable, truncate: truncate, keys: keys)
            if dropped { attributesChanged(id) }
            return handle
        }
    }

    public func create(parent: UInt64, name: [UInt8], mode: mode_t, flags: Int32, caller: Caller) throws -> (Entry, UInt64) {
        try inView(nodes.node(parent), locked: {
            try lockedCreate($0, parent: parent, name: name, mode: mode, flags: flags, caller: caller)
        }) { keys in
            let dir = nodes.node(parent)
            let new = try newName(name, in: dir, keys: keys)
            let (backingFlags, writable) = Self.backingFlags(flags)
            var created = true
            let fd: FileDescriptor
            do {
                fd = try openCreating(new.name, in: dir, flags: backingFlags, exclusive: flags & O_EXCL != 0, mode: mode,
                                      created: &created)
            } catch {
                new.abandon(in: dir)
                throw error
            }
            do {
                if created {
                    if writable {
                        try initializeContent(fd.rawValue, name: name, in: dir, keys: keys)
                    } else {
                        let file = BackingFile.entry(new.name, in: dir)
                        try withContentDescriptor(file, stat: try Sys.stat(fd.rawValue)) {
                            try initializeContent($0, name: name, in: dir, keys: keys)
                        }
                    }
                    try own(new.name, in: dir, fd: fd.rawValue, caller: caller, mode: mode)
                }
            } catch {
                try? Sys.unlink(new.name, in: dir.fd)
                new.abandon(in: dir)
                throw error
            }
            let entry = try enter(new.name, in: dir, plainName: name, keys: keys)
            do {
                // A file this call made is empty: O_TRUNC matters only for one that was there.
                let handle = try openHandle(nodes.node(entry.node), fd: fd, flags: backingFlags, writable: writable,
                                            truncate: flags & O_TRUNC != 0 && !created, keys: keys)
                return (entry, handle)
            } catch {
                // The kernel never sees this entry: drop the lookup it would have held.
                nodes.forget(entry.node, count: 1)
                throw error
            }
        }
    }

    /// Reads up to `buffer.count` bytes at `offset`; a damaged block in the range is EIO.
    public func read(_ handle: UInt64, into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        let file = OpenFile.borrow(handle)
        return try withContentKey(file.node) { cipher in
            try reportingDamage(file.node) {
                try file.node.contentLock.reading {
                    try content(file.fd, of: file.node, cipher: cipher(file.fd)).read(into: buffer, at: offset)
                }
            }
        }
    }

    public func write(_ handle: UInt64, _ data: UnsafeRawBufferPointer, at offset: Int64, caller: Caller) throws -> Int {
        let file = OpenFile.borrow(handle)
        return try withContentKey(file.node) { cipher in
            guard file.writable else { throw Errno(EBADF, "write") }
            // Before the write, so that a refused write lands nowhere (the orphaned inode
            // would give its bytes to a read on the same descriptor): on the status the
            // write reads for its size. After it too, for a replacement in the middle of
            // the write (then its bytes are in the orphan, unacknowledged): on one status
            // that also serves the set-ID clearing.
            let runSoFar = try reportingDamage(file.node) {
                try file.node.contentLock.writing {
                    try content(file.fd, of: file.node, cipher: cipher(file.fd),
                                safety: rewriteSafety(file.node, synchronous: file.synchronous))
                        .write(data, at: offset) { try refuseIfRemovedByOthers(file.node, status: $0) }
                    return file.synchronous ? nil : file.writeBehind.wrote(data.count, at: offset)
                }
            }
            if let runSoFar { startWriteBehind(file.node, runSoFar) }
            let after = try Sys.stat(file.fd)
            try refuseIfRemovedByOthers(file.node, status: after)
            if !caller.keepsSetID, try dropSetID(file.node, fd: file.fd, status: after, caller: caller) {
                attributesChanged(nodes.id(of: file.node))
            }
            return data.count
        }
    }

    /// Has the disk start on the backing bytes of plaintext `range` of `node`, the part of
    /// a long sequential run that WriteBehind handed out; a failure changes nothing the
    /// write promised.
    private func startWriteBehind(_ node: Node, _ range: Range<Int64>) {
        guard let (offset, length) = WriteBehind.backingRange(of: range, layout: layout) else { return }
        writeBehindStarts.start(node, offset: offset, length: length)
    }

    /// Clears setuid, and setgid where it grants something, as the kernel does after a
    /// write, truncate or chown by a caller without CAP_FSETID: setgid goes if the group
    /// may execute, or if the caller is not in the file's group (the daemon sees only
    /// the caller's primary group). Once the FUSE bridge (SessionIO) has asked for
    /// FUSE_HANDLE_KILLPRIV_V2 the kernel leaves this to the file system; without it,
    /// doing it here as well changes nothing. `fd`: an open descriptor of the backing
    /// file, if there is one; `status`: its status, if just read. True if the mode changed.
    func dropSetID(_ node: Node, fd: Int32?, status: stat? = nil, caller: Caller) throws -> Bool {
        guard node.isRegular else { return false }
        let st = try status ?? Sys.stat(fd ?? node.fd)
        let mode = st.st_mode & 0o7777
        var kept = mode & ~S_ISUID
        if mode & S_IXGRP != 0 || (!caller.keepsSetID && caller.gid != st.st_gid) { kept &= ~S_ISGID }
        guard kept != mode else { return false }
        if let fd {
            try Sys.chmod(fd, kept)
        } else {
            try Sys.chmod(node.procPath, kept)
        }
        return true
    }

    /// fsync(2)/fdatasync(2) of the backing file; works on a file already unlinked.
    public func fsync(_ handle: UInt64, dataOnly: Bool) throws {
        let file = OpenFile.borrow(handle)
        try withContentKey(file.node) { _ in
            // Blocks written before the sync are durable from here on: rewriting them
            // later needs a durable undo record. (Cleared before the sync, so that a
            // write racing with it counts as durable: safe, if dearer.)
            file.node.volatileBlocks.removeAll()
            try dataOnly ? Sys.fdatasync(file.fd) : Sys.fsync(file.fd)
            if file.writable { try refuseIfRemovedByOthers(file) }
            try makeAncestorsDurable(file.node)
        }
    }

    /// A file that was fsynced must stay readable after a power loss, so the IV files
    /// of the directories above it are made durable too.
    func makeAncestorsDurable(_ node: Node) throws {
        try durableDirectories.makeDurable(from: node.fd, isDirectory: node.isDirectory, root: nodes.root.fd)
    }

    /// A directory is being removed: forget that its IV was made durable.
    func forgetSyncedDirectory(_ st: stat) { durableDirectories.forget(st) }

    /// Throws ESTALE if `file`'s backing inode has no name left and did not lose it
    /// through this mount: another program (a sync engine replacing the file by rename,
    /// a delete on another machine) removed it, and what was just written there would be
    /// lost with the inode. Checked after the write, so that a removal before it is
    /// always seen: the write is then not acknowledged. One fstat per request.
    func refuseIfRemovedByOthers(_ file: OpenFile) throws { try refuseIfRemovedByOthers(file.node) }

    /// `status`: the backing file's, if just read.
    func refuseIfRemovedByOthers(_ node: Node, status: stat? = nil) throws {
        guard try (status ?? Sys.stat(node.fd)).st_nlink == 0, !node.removedThroughMount.load(ordering: .acquiring) else { return }
        logger.notice("""
            write refused (ESTALE): \(node.plaintextPath) (backing inode \(node.ino)) was replaced or removed by another program after it was \
            opened; it is to be opened again
            """)
        throw VaultError.replacedByOtherWriter
    }

    /// The kernel closed its last reference to the handle. Needs no key.
    public func release(_ handle: UInt64) { OpenFile.release(handle) }

    /// fallocate(2), modes 0 and FALLOC_FL_KEEP_SIZE: the backing blocks are reserved
    /// (zeros, which read as holes); mode 0 then extends the plaintext size.
    public func fallocate(_ handle: UInt64, mode: Int32, offset: Int64, length: Int64) throws {
        let file = OpenFile.borrow(handle)
        try withContentKey(file.node) { cipher in
            guard mode & ~FALLOC_FL_KEEP_SIZE == 0 else { throw Errno(EOPNOTSUPP, "fallocate") }
            guard offset >= 0, length > 0 else { throw Errno(EINVAL, "fallocate") }
            guard file.writable else { throw Errno(EBADF, "fallocate") }
            try refuseIfRemovedByOthers(file)  // and after: see write
            try file.node.contentLock.writing {
                let content = content(file.fd, of: file.node, cipher: try cipher(file.fd),
                                      safety: rewriteSafety(file.node, synchronous: file.synchronous))
                let start = layout.cipherOffset(block: BlockLayout.blockIndex(plainOffset: offset))
                let end = layout.cipherSize(plainSize: offset + length)
                try Sys.fallocate(file.fd, mode: FALLOC_FL_KEEP_SIZE, offset: start, length: end - start)
                if mode == 0, try content.plainSize() < offset + length {
                    try reportingDamage(file.node) { try content.truncate(to: offset + length) }
                }
            }
            try refuseIfRemovedByOthers(file)
        }
    }

    /// Opens the backing file. A write-only request still needs read access below (blocks
    /// are read-modify-written); for a file its owner made write-only (mode 0200), read
    /// permission is added for the moment of the open, as on ext4 the owner may write it.
    func openForReadModifyWrite(_ node: Node, flags: Int32, userWantsRead: Bool) throws -> FileDescriptor {
        do {
            return try FileDescriptor.open(node.procPath, flags: flags)
        } catch let error as Errno where error.code == EACCES && !userWantsRead && flags & O_ACCMODE == O_RDWR {
            let st = try Sys.stat(node.fd)
            guard st.st_uid == geteuid(), st.st_mode & 0o400 == 0 else { throw error }
            try Sys.chmod(node.procPath, (st.st_mode & 0o7777) | 0o400)
            defer { try? Sys.chmod(node.procPath, st.st_mode & 0o7777) }
            return try FileDescriptor.open(node.procPath, flags: flags)
        }
    }

    /// Creates backing file `name` in `dir` (O_EXCL), or, unless `exclusive`, opens the
    /// one made since the kernel's lookup as it is (`created` false: not ours to give away).
    private func openCreating(_ name: String, in dir: Node, flags: Int32, exclusive: Bool, mode: mode_t,
                              created: inout Bool) throws -> FileDescriptor {
        do {
            return try FileDescriptor.open(name, in: dir.fd, flags: flags | O_CREAT | O_EXCL | O_NOFOLLOW, mode: mode & 0o7777)
        } catch let error as Errno where error.code == EEXIST && !exclusive {
            created = false
            return try FileDescriptor.open(name, in: dir.fd, flags: flags | O_NOFOLLOW)
        }
    }

    /// Runs `body` with a descriptor that can write the node's content: the open file's
    /// if it has one, else a new one for the duration.
    func withWritableDescriptor<R>(_ node: Node, handle: UInt64?, _ body: (Int32) throws -> R) throws -> R {
        if let handle, OpenFile.borrow(handle).writable { return try body(OpenFile.borrow(handle).fd) }
        let fd = try openForReadModifyWrite(node, flags: O_RDWR, userWantsRead: false)
        return try body(fd.rawValue)
    }

    /// access(2) on the backing inode, as the daemon's user.
    public func access(_ id: UInt64, mask: Int32) throws {
        // While locked, what stays reachable for files made while locked answers.
        let node = nodes.node(id)
        try inView(node, locked: { view in
            guard isReachable(node, in: view) else { throw Errno(EACCES, "locked") }
            try Sys.access(node.procPath, mask)
        }) { _ in try Sys.access(node.procPath, mask) }
    }
}

// FuseOperations is the bridge: each libfuse low-level callback is a named function
// that decodes its request, makes one PlainFileSystem call, and sends exactly one
// reply; every error reply goes through `replyError`. No crypto here.
import CFuse
import CofferFileSystem
import CofferSystem
import Glibc
import Logging

enum FuseOperations {
    // MARK: The table

    /// The operations libfuse calls: each is a static function below, so that a backtrace
    /// names the operation. Swift forms a C function pointer only from a global function
    /// or a literal closure, so each entry is a closure that forwards its arguments.
    static func table() -> fuse_lowlevel_ops {
        var ops = fuse_lowlevel_ops()
        ops.`init` = { FuseOperations.initialize($0, $1) }
        ops.lookup = { FuseOperations.lookup($0, $1, $2) }
        ops.forget = { FuseOperations.forget($0, $1, $2) }
        ops.forget_multi = { FuseOperations.forgetMulti($0, $1, $2) }
        ops.getattr = { FuseOperations.getattr($0, $1, $2) }
        ops.setattr = { FuseOperations.setattr($0, $1, $2, $3, $4) }
        ops.readlink = { FuseOperations.readlink($0, $1) }
        ops.mknod = { FuseOperations.mknod($0, $1, $2, $3, $4) }
        ops.mkdir = { FuseOperations.mkdir($0, $1, $2, $3) }
        ops.unlink = { FuseOperations.unlink($0, $1, $2) }
        ops.rmdir = { FuseOperations.rmdir($0, $1, $2) }
        ops.symlink = { FuseOperations.symlink($0, $1, $2, $3) }
        ops.rename = { FuseOperations.rename($0, $1, $2, $3, $4, $5) }
        ops.link = { FuseOperations.link($0, $1, $2, $3) }
        ops.open = { FuseOperations.open($0, $1, $2) }
        ops.create = { FuseOperations.create($0, $1, $2, $3, $4) }
        ops.read = { FuseOperations.read($0, $1, $2, $3, $4) }
        ops.write = { FuseOperations.write($0, $1, $2, $3, $4, $5) }
        ops.flush = { FuseOperations.flush($0, $1, $2) }
        ops.release = { FuseOperations.release($0, $1, $2) }
        ops.fsync = { FuseOperations.fsync($0, $1, $2, $3) }
        ops.opendir = { FuseOperations.opendir($0, $1, $2) }
        ops.readdir = { FuseOperations.readdir($0, $1, $2, $3, $4) }
        ops.readdirplus = { FuseOperations.readdirplus($0, $1, $2, $3, $4) }
        ops.releasedir = { FuseOperations.releasedir($0, $1, $2) }
        ops.fsyncdir = { FuseOperations.fsyncdir($0, $1, $2, $3) }
        ops.statfs = { FuseOperations.statfs($0, $1) }
        ops.access = { FuseOperations.access($0, $1, $2) }
        ops.setxattr = { FuseOperations.setxattr($0, $1, $2, $3, $4, $5) }
        ops.getxattr = { FuseOperations.getxattr($0, $1, $2, $3) }
        ops.listxattr = { FuseOperations.listxattr($0, $1, $2) }
        ops.removexattr = { FuseOperations.removexattr($0, $1, $2) }
        ops.fallocate = { FuseOperations.fallocate($0, $1, $2, $3, $4, $5) }
        return ops
    }

    // MARK: Session

    /// INIT: what the daemon asks of the kernel for this mount.
    static func initialize(_ userdata: UnsafeMutableRawPointer?, _ conn: UnsafeMutablePointer<fuse_conn_info>?) {
        guard let conn else { return }
        // Large requests: up to 1 MiB per write (libfuse sets max_pages to match) and
        // 1 MiB of readahead, so streaming I/O crosses into the daemon rarely.
        conn.pointee.max_write = 1 << 20
        conn.pointee.max_readahead = 1 << 20
        conn.pointee.want |= UInt32(FUSE_CAP_ATOMIC_O_TRUNC)
        // No page drop on a changed mtime (libfuse asks for it by default). With it the
        // kernel drops all of a file's pages whenever it refetches attributes after one
        // of this mount's own writes — pages whose write is still on its way to the
        // daemon included. A read sent after the drop can then reach the daemon before
        // that write (FUSE over io_uring serves each CPU's requests on its own ring;
        // /dev/fuse, on several threads) and put the old bytes back in the cache for
        // good: sqlite then wrote them back and lost committed transactions. What
        // another program changes is dropped by the daemon itself (OtherWriters), and
        // a lock drops everything.
        conn.pointee.want &= ~UInt32(FUSE_CAP_AUTO_INVAL_DATA)
        // No asynchronous direct I/O (libfuse asks for it by default): with it the kernel
        // splits one O_DIRECT write of an AIO into requests it sends at once, and a
        // buffered read racing them could read back stale bytes (xfstests generic/451,
        // docs/CONFORMANCE.md). coffer serves direct I/O through the same blocks as any.
        conn.pointee.want &= ~UInt32(FUSE_CAP_ASYNC_DIO)
        if conn.pointee.capable & UInt32(FUSE_CAP_READDIRPLUS) != 0 {
            conn.pointee.want |= UInt32(FUSE_CAP_READDIRPLUS)
            conn.pointee.want &= ~UInt32(FUSE_CAP_READDIRPLUS_AUTO)
        }
    }

    static func statfs(_ req: fuse_req_t?, _ ino: fuse_ino_t) {
        replying(req) {
            var st = try fs(req).statfs()
            fuse_reply_statfs(req, &st)
        }
    }

    // MARK: Nodes and names

    static func lookup(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        replying(req) {
            do {
                replyEntry(req, try named(name) { try fs(req).lookup(parent: parent, name: $0) })
            } catch let error as Errno where error.code == ENOENT {
                // A negative entry: the kernel may remember that the name is absent
                // (a create through this mount replaces it; one by another program is
                // invalidated, see OtherWriters).
                var param = fuse_entry_param()
                param.entry_timeout = fs(req).entryCacheSeconds(in: parent)
                fuse_reply_entry(req, &param)
            }
        }
    }

    static func forget(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ count: UInt64) {
        fs(req).forget(ino, count: count)
        fuse_reply_none(req)
    }

    static func forgetMulti(_ req: fuse_req_t?, _ count: Int, _ forgets: UnsafeMutablePointer<fuse_forget_data>?) {
        let fs = fs(req)
        for i in 0..<count { fs.forget(forgets![i].ino, count: forgets![i].nlookup) }
        fuse_reply_none(req)
    }

    static func getattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) { replyAttr(req, ino, try fs(req).getattr(ino)) }
    }

    static func setattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ attr: UnsafeMutablePointer<stat>?, _ toSet: Int32,
                        _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) {
            let st = attr!.pointee
            var changes = AttributeChanges()
            if toSet & FUSE_SET_ATTR_MODE != 0 { changes.mode = st.st_mode }
            if toSet & FUSE_SET_ATTR_UID != 0 { changes.uid = st.st_uid }
            if toSet & FUSE_SET_ATTR_GID != 0 { changes.gid = st.st_gid }
            if toSet & FUSE_SET_ATTR_SIZE != 0 { changes.size = Int64(st.st_size) }
            // FATTR_KILL_SUIDGID, which shares this bit; sent once HANDLE_KILLPRIV_V2 is on.
            if toSet & FUSE_SET_ATTR_KILL_SUID != 0 { changes.dropSetIDFor = caller(req) }
            if toSet & FUSE_SET_ATTR_ATIME_NOW != 0 {
                changes.accessTime = timespec(tv_sec: 0, tv_nsec: UTIME_NOW)
            } else if toSet & FUSE_SET_ATTR_ATIME != 0 {
                changes.accessTime = st.st_atim
            }
            if toSet & FUSE_SET_ATTR_MTIME_NOW != 0 {
                changes.modificationTime = timespec(tv_sec: 0, tv_nsec: UTIME_NOW)
            } else if toSet & FUSE_SET_ATTR_MTIME != 0 {
                changes.modificationTime = st.st_mtim
            }
            replyAttr(req, ino, try fs(req).setattr(ino, changes: changes, handle: fi?.pointee.fh))
        }
    }

    static func readlink(_ req: fuse_req_t?, _ ino: fuse_ino_t) {
        replying(req) {
            // A plaintext target, as a C string made in one buffer; both zeroed after.
            var target = try fs(req).readlink(ino)
            var cString = [CChar](repeating: 0, count: target.count + 1)
            defer {
                target.zeroInPlace()
                cString.zeroInPlace()
            }
            cString.withUnsafeMutableBytes { $0.copyBytes(from: target) }
            _ = cString.withUnsafeBufferPointer { fuse_reply_readlink(req, $0.baseAddress) }
        }
    }

    static func mknod(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ mode: mode_t, _ rdev: dev_t) {
        replying(req) {
            replyEntry(req, try named(name) { try fs(req).mknod(parent: parent, name: $0, mode: mode, device: rdev, caller: caller(req)) })
        }
    }

    static func mkdir(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ mode: mode_t) {
        replying(req) { replyEntry(req, try named(name) { try fs(req).mkdir(parent: parent, name: $0, mode: mode, caller: caller(req)) }) }
    }

    static func unlink(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        replying(req) {
            try named(name) { try fs(req).unlink(parent: parent, name: $0) }
            replyDone(req)
        }
    }

    static func rmdir(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        replying(req) {
            try named(name) { try fs(req).rmdir(parent: parent, name: $0) }
            replyDone(req)
        }
    }

    static func symlink(_ req: fuse_req_t?, _ target: UnsafePointer<CChar>?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        replying(req) {
            replyEntry(req, try named(target) { target in
                try named(name) { try fs(req).symlink(target: target, parent: parent, name: $0, caller: caller(req)) }
            })
        }
    }

    static func rename(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ newParent: fuse_ino_t,
                       _ newName: UnsafePointer<CChar>?, _ flags: UInt32) {
        replying(req) {
            try named(name) { old in
                try named(newName) { try fs(req).rename(parent: parent, name: old, newParent: newParent, newName: $0, flags: flags) }
            }
            replyDone(req)
        }
    }

    static func link(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ newParent: fuse_ino_t, _ newName: UnsafePointer<CChar>?) {
        replying(req) { replyEntry(req, try named(newName) { try fs(req).link(ino, newParent: newParent, newName: $0) }) }
    }

    static func access(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ mask: Int32) {
        replying(req) {
            try fs(req).access(ino, mask: mask)
            replyDone(req)
        }
    }

    // MARK: Files

    static func open(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) {
            fi!.pointee.fh = try fs(req).open(ino, flags: fi!.pointee.flags, caller: caller(req))
            // Writes go straight to the backing file: close needs no FLUSH round trip.
            fi!.pointee.noflush = 1
            // A change through this mount keeps the kernel's pages current, one by another
            // program drops them (OtherWriters), so pages cached by an earlier open are
            // still right where such changes are watched (a lock drops them all).
            fi!.pointee.keep_cache = fs(req).keepsPages(of: ino) ? 1 : 0
            if fuse_reply_open(req, fi) != 0 { fs(req).release(fi!.pointee.fh) }
        }
    }

    static func create(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ mode: mode_t,
                       _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) {
            let (entry, handle) = try named(name) {
                try fs(req).create(parent: parent, name: $0, mode: mode, flags: fi!.pointee.flags, caller: caller(req))
            }
            fi!.pointee.fh = handle
            fi!.pointee.noflush = 1
            var param = entryParam(entry)
            if fuse_reply_create(req, &param, fi) != 0 {
                fs(req).release(handle)
                fs(req).forget(entry.node, count: 1)
            }
        }
    }

    static func read(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int, _ offset: off_t,
                     _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) {
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: size, alignment: 16)
            // Plaintext must not linger in freed memory after a lock; a read that failed
            // on a damaged block may have left the blocks it opened.
            defer { explicit_bzero(buffer.baseAddress!, size); buffer.deallocate() }
            let n = try fs(req).read(fi!.pointee.fh, into: buffer, at: Int64(offset))
            fuse_reply_buf(req, buffer.baseAddress?.assumingMemoryBound(to: CChar.self), n)
        }
    }

    /// A read over io_uring (UringTransport.Reader): deciphered straight into the ring
    /// entry its reply goes out of, which is wiped once the kernel has taken what the
    /// reply carries. What else the read left there (past a short read's end, or all of
    /// a failed one's) is wiped here. The count, or -errno.
    static func read(_ fs: PlainFileSystem, handle: UInt64, at offset: Int64, into area: UnsafeMutableRawBufferPointer) -> Int {
        do {
            let n = try fs.read(handle, into: area, at: offset)
            if n < area.count { explicit_bzero(area.baseAddress! + n, area.count - n) }
            return n
        } catch {
            explicit_bzero(area.baseAddress!, area.count)
            return -Int(errorCode(fs, error, operation: "read"))
        }
    }

    static func write(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ data: UnsafePointer<CChar>?, _ size: Int, _ offset: off_t,
                      _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) {
            let n: Int
            do {
                // The plaintext stays in the request buffer until the next request
                // overwrites it: zeroed once sealed, and before the reply, which over
                // io_uring goes into that same buffer (UringTransport).
                defer { if let data { explicit_bzero(UnsafeMutableRawPointer(mutating: data), size) } }
                n = try fs(req).write(fi!.pointee.fh, UnsafeRawBufferPointer(start: data, count: size), at: Int64(offset),
                                      caller: caller(req))
            }
            fuse_reply_write(req, n)
        }
    }

    static func flush(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        // Writes go straight to the backing file; nothing is buffered here.
        replyDone(req)
    }

    static func release(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        fs(req).release(fi!.pointee.fh)
        replyDone(req)
    }

    static func fsync(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ datasync: Int32, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) {
            try fs(req).fsync(fi!.pointee.fh, dataOnly: datasync != 0)
            replyDone(req)
        }
    }

    static func fallocate(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ mode: Int32, _ offset: off_t, _ length: off_t,
                          _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) {
            try fs(req).fallocate(fi!.pointee.fh, mode: mode, offset: Int64(offset), length: Int64(length))
            replyDone(req)
        }
    }

    // MARK: Directories

    static func opendir(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) {
            fi!.pointee.fh = try fs(req).opendir(ino)
            if fuse_reply_open(req, fi) != 0 { fs(req).releasedir(fi!.pointee.fh) }
        }
    }

    static func readdir(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int, _ offset: off_t,
                        _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) { try replyListing(req, size: size, offset: offset, handle: fi!.pointee.fh, plus: false) }
    }

    static func readdirplus(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int, _ offset: off_t,
                            _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) { try replyListing(req, size: size, offset: offset, handle: fi!.pointee.fh, plus: true) }
    }

    static func releasedir(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        fs(req).releasedir(fi!.pointee.fh)
        replyDone(req)
    }

    static func fsyncdir(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ datasync: Int32, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) {
            try fs(req).fsyncdir(fi!.pointee.fh)
            replyDone(req)
        }
    }

    // MARK: Extended attributes

    static func setxattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ value: UnsafePointer<CChar>?,
                         _ size: Int, _ flags: Int32) {
        replying(req) {
            let data = value.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) } ?? []
            try fs(req).setxattr(ino, name: bytes(name), value: data, flags: flags, caller: caller(req))
            replyDone(req)
        }
    }

    static func getxattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ size: Int) {
        replying(req) { try replyXattr(req, size: size, try fs(req).getxattr(ino, name: bytes(name))) }
    }

    static func listxattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int) {
        replying(req) {
            let names = try fs(req).listxattr(ino)
            try replyXattr(req, size: size, names.flatMap { $0 + [0] })
        }
    }

    static func removexattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        replying(req) {
            try fs(req).removexattr(ino, name: bytes(name), caller: caller(req))
            replyDone(req)
        }
    }
}

private func fs(_ req: fuse_req_t?) -> PlainFileSystem {
    SessionIO.of(fuse_req_userdata(req)).fs
}

private func caller(_ req: fuse_req_t?) -> PlainFileSystem.Caller {
    let ctx = fuse_req_ctx(req)!.pointee
    return .init(uid: ctx.uid, gid: ctx.gid)
}

/// The bytes of a request's C string, copied once (no intermediate copy is left in freed
/// memory: a name is plaintext).
private func bytes(_ name: UnsafePointer<CChar>?) -> [UInt8] {
    guard let name else { return [] }
    return [UInt8](UnsafeRawBufferPointer(start: name, count: strlen(name)))
}

/// Runs `body` with a plaintext name (or symlink target) of the request, then zeroes it
/// where it lay in the request's buffer, and the bytes `body` was given unless something
/// kept them (which then holds them alone: Array's copy-on-write leaves what others share
/// untouched). A name the file system keeps it keeps as a copy of its own, zeroed when it
/// goes (Node.setName, EntryNames), so a lock leaves no name in freed memory.
private func named<R>(_ name: UnsafePointer<CChar>?, _ body: ([UInt8]) throws -> R) rethrows -> R {
    var plain = bytes(name)
    defer {
        plain.zeroInPlace()
        // The request's buffer is the daemon's (libfuse's, or a ring's entry) until the
        // handler returns; nothing reads the name from it after.
        if let name { explicit_bzero(UnsafeMutableRawPointer(mutating: name), strlen(name)) }
    }
    return try body(plain)
}

// MARK: Replies

/// Runs `body`, which sends the reply; a thrown error becomes the one reply instead.
/// `operation` is the handler's name (its `#function`), for the log.
private func replying(_ req: fuse_req_t?, operation: String = #function, _ body: () throws -> Void) {
    do { try body() } catch { replyError(req, error, operation: operation) }
}

/// The one path of an error reply: the errno from ErrnoMapping, and a log line when
/// the error is not an answer a request can expect (ErrnoMapping.isExpected). The line
/// names the operation and the error, never a plaintext name: errors below the bridge
/// carry backing (encrypted) names only.
private func replyError(_ req: fuse_req_t?, _ error: Error, operation: String) {
    fuse_reply_err(req, errorCode(fs(req), error, operation: operation))
}

/// The errno that answers `error`, logged as `replyError` says.
private func errorCode(_ fs: PlainFileSystem, _ error: Error, operation: String) -> Int32 {
    let code = ErrnoMapping.code(for: error)
    if !ErrnoMapping.isExpected(error) {
        let name = operation.prefix { $0 != "(" }
        fs.logger.error("\(name): unexpected error, answered errno \(code): \(error)")
    }
    return code
}

/// Success for a request whose reply carries no data (libfuse's fuse_reply_err with 0).
private func replyDone(_ req: fuse_req_t?) {
    fuse_reply_err(req, 0)
}

private func entryParam(_ entry: PlainFileSystem.Entry) -> fuse_entry_param {
    var param = fuse_entry_param()
    param.ino = entry.node
    param.attr = entry.attributes
    // How long the kernel may cache them: the file system's policy (OtherWriters), which
    // keeps them long only where another program's change would be seen.
    param.attr_timeout = entry.validFor
    param.entry_timeout = entry.validFor
    return param
}

private func replyEntry(_ req: fuse_req_t?, _ entry: PlainFileSystem.Entry) {
    var param = entryParam(entry)
    if fuse_reply_entry(req, &param) != 0 {
        // The request was interrupted: the kernel will not count this lookup.
        fs(req).forget(entry.node, count: 1)
    }
}

private func replyAttr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ st: stat) {
    var st = st
    fuse_reply_attr(req, &st, fs(req).attributeCacheSeconds(of: ino))
}

/// getxattr/listxattr: size 0 asks for the length; a smaller buffer is ERANGE (thrown,
/// so that it goes out as every error does).
private func replyXattr(_ req: fuse_req_t?, size: Int, _ value: [UInt8]) throws {
    if size == 0 {
        fuse_reply_xattr(req, value.count)
    } else if size < value.count {
        throw Errno(ERANGE)
    } else {
        _ = value.withUnsafeBytes { fuse_reply_buf(req, $0.baseAddress?.assumingMemoryBound(to: CChar.self), $0.count) }
    }
}

/// readdir and readdirplus: pack listed entries from `offset` until the buffer is full.
private func replyListing(_ req: fuse_req_t?, size: Int, offset: off_t, handle: UInt64, plus: Bool) throws {
    let fs = fs(req)
    let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: size)
    var used = 0
    defer { explicit_bzero(buffer, used); buffer.deallocate() }
    var entered: [UInt64] = []
    // The listing is let go before the reply: the program may close the directory as soon
    // as it has it, and RELEASEDIR zeroes the names, which it can do in place only if no
    // one else holds them.
    try packListing(fs, req, size: size, offset: offset, handle: handle, plus: plus, into: buffer, used: &used, entered: &entered)
    if fuse_reply_buf(req, buffer, used) != 0 {
        // The request was interrupted: the kernel holds none of these lookups.
        entered.forEach { fs.forget($0, count: 1) }
    }
}

/// Packs listed entries from `offset` into `buffer` until it is full (`used` bytes of it);
/// `entered`: the nodes readdirplus gave the kernel.
private func packListing(_ fs: PlainFileSystem, _ req: fuse_req_t?, size: Int, offset: off_t, handle: UInt64, plus: Bool,
                         into buffer: UnsafeMutablePointer<CChar>, used: inout Int, entered: inout [UInt64]) throws {
    let entries = try fs.readdir(handle, from: Int(offset))
    var next = Int(offset)
    for listed in entries {
        next += 1
        // The name as a C string, made in one buffer (no intermediate copy) and zeroed after.
        var name = [CChar](repeating: 0, count: listed.name.count + 1)
        name.withUnsafeMutableBytes { $0.copyBytes(from: listed.name) }
        defer { name.zeroInPlace() }
        var st = stat()
        st.st_ino = __ino_t(listed.ino)
        st.st_mode = mode_t(listed.type) << 12
        let added: Int
        if plus {
            var param = fuse_entry_param()
            param.attr = st
            var node: UInt64?
            if !listed.isDotOrDotDot {
                do {
                    let entry = try fs.lookupListed(handle, listed)
                    param = entryParam(entry)
                    node = entry.node
                } catch let error as Errno where error.code == ENOENT {
                    continue  // removed since the listing was taken
                } catch {
                    // Listed but not entered (e.g. out of descriptors): a node ID of 0
                    // lists the name and lets the kernel look it up later.
                }
            }
            added = fuse_add_direntry_plus(req, buffer + used, size - used, name, &param, off_t(next))
            if added > size - used {
                if let node { fs.forget(node, count: 1) }
                break
            }
            if let node { entered.append(node) }
        } else {
            added = fuse_add_direntry(req, buffer + used, size - used, name, &st, off_t(next))
            if added > size - used { break }
        }
        used += added
    }
}

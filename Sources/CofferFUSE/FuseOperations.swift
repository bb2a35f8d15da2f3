// FuseOperations is the bridge: each libfuse low-level callback decodes its request,
// makes one PlainFileSystem call, and sends exactly one reply. No crypto here.
import CFuse
import CofferVault
import Glibc

enum FuseOperations {
    // MARK: The table

    static func table() -> fuse_lowlevel_ops {
        var ops = fuse_lowlevel_ops()
        ops.`init` = { userdata, conn in
            guard let conn else { return }
            // Large requests: up to 1 MiB per write (libfuse sets max_pages to match) and
            // 1 MiB of readahead, so streaming I/O crosses into the daemon rarely.
            conn.pointee.max_write = 1 << 20
            conn.pointee.max_readahead = 1 << 20
            conn.pointee.want |= UInt32(FUSE_CAP_ATOMIC_O_TRUNC)
            if conn.pointee.capable & UInt32(FUSE_CAP_READDIRPLUS) != 0 {
                conn.pointee.want |= UInt32(FUSE_CAP_READDIRPLUS)
                conn.pointee.want &= ~UInt32(FUSE_CAP_READDIRPLUS_AUTO)
            }
        }
        ops.lookup = { req, parent, name in
            replying(req) {
                do {
                    replyEntry(req, try fs(req).lookup(parent: parent, name: bytes(name)))
                } catch let error as Errno where error.code == ENOENT {
                    // A negative entry: the kernel may remember that the name is absent
                    // (every create comes through this mount, which replaces it).
                    var param = fuse_entry_param()
                    param.entry_timeout = entryTimeout
                    fuse_reply_entry(req, &param)
                }
            }
        }
        ops.forget = { req, ino, count in
            fs(req).forget(ino, count: count)
            fuse_reply_none(req)
        }
        ops.forget_multi = { req, count, forgets in
            let fs = fs(req)
            for i in 0..<count { fs.forget(forgets![i].ino, count: forgets![i].nlookup) }
            fuse_reply_none(req)
        }
        ops.getattr = { req, ino, _ in
            replying(req) { replyAttr(req, try fs(req).getattr(ino)) }
        }
        ops.setattr = { req, ino, attr, toSet, fi in
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
                replyAttr(req, try fs(req).setattr(ino, changes: changes, handle: fi?.pointee.fh))
            }
        }
        ops.readlink = { req, ino in
            replying(req) {
                let target = try fs(req).readlink(ino) + [0]
                target.withUnsafeBufferPointer { p in
                    p.withMemoryRebound(to: CChar.self) { _ = fuse_reply_readlink(req, $0.baseAddress) }
                }
            }
        }
        ops.mknod = { req, parent, name, mode, rdev in
            replying(req) {
                replyEntry(req, try fs(req).mknod(parent: parent, name: bytes(name), mode: mode, device: rdev, caller: caller(req)))
            }
        }
        ops.mkdir = { req, parent, name, mode in
            replying(req) { replyEntry(req, try fs(req).mkdir(parent: parent, name: bytes(name), mode: mode, caller: caller(req))) }
        }
        ops.unlink = { req, parent, name in
            replying(req) {
                try fs(req).unlink(parent: parent, name: bytes(name))
                fuse_reply_err(req, 0)
            }
        }
        ops.rmdir = { req, parent, name in
            replying(req) {
                try fs(req).rmdir(parent: parent, name: bytes(name))
                fuse_reply_err(req, 0)
            }
        }
        ops.symlink = { req, target, parent, name in
            replying(req) {
                replyEntry(req, try fs(req).symlink(target: bytes(target), parent: parent, name: bytes(name), caller: caller(req)))
            }
        }
        ops.rename = { req, parent, name, newParent, newName, flags in
            replying(req) {
                try fs(req).rename(parent: parent, name: bytes(name), newParent: newParent, newName: bytes(newName), flags: flags)
                fuse_reply_err(req, 0)
            }
        }
        ops.link = { req, ino, newParent, newName in
            replying(req) { replyEntry(req, try fs(req).link(ino, newParent: newParent, newName: bytes(newName))) }
        }
        ops.open = { req, ino, fi in
            replying(req) {
                fi!.pointee.fh = try fs(req).open(ino, flags: fi!.pointee.flags, caller: caller(req))
                // Writes go straight to the backing file: close needs no FLUSH round trip.
                fi!.pointee.noflush = 1
                // Every change comes through this mount and keeps the kernel's pages
                // current, so pages cached by an earlier open are still right (a lock
                // drops them all).
                fi!.pointee.keep_cache = 1
                if fuse_reply_open(req, fi) != 0 { fs(req).release(fi!.pointee.fh) }
            }
        }
        ops.create = { req, parent, name, mode, fi in
            replying(req) {
                let (entry, handle) = try fs(req).create(parent: parent, name: bytes(name), mode: mode,
                                                         flags: fi!.pointee.flags, caller: caller(req))
                fi!.pointee.fh = handle
                fi!.pointee.noflush = 1
                var param = entryParam(entry)
                if fuse_reply_create(req, &param, fi) != 0 {
                    fs(req).release(handle)
                    fs(req).forget(entry.node, count: 1)
                }
            }
        }
        ops.read = { req, _, size, offset, fi in
            replying(req) {
                let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: size, alignment: 16)
                var n = 0
                // Plaintext must not linger in freed memory after a lock.
                defer { explicit_bzero(buffer.baseAddress!, n); buffer.deallocate() }
                n = try fs(req).read(fi!.pointee.fh, into: buffer, at: Int64(offset))
                fuse_reply_buf(req, buffer.baseAddress?.assumingMemoryBound(to: CChar.self), n)
            }
        }
        ops.write = { req, _, data, size, offset, fi in
            // The plaintext stays in libfuse's request buffer until the next request
            // overwrites it: zero it once it is sealed.
            defer { if let data { explicit_bzero(UnsafeMutableRawPointer(mutating: data), size) } }
            replying(req) {
                let n = try fs(req).write(fi!.pointee.fh, UnsafeRawBufferPointer(start: data, count: size), at: Int64(offset),
                                          caller: caller(req))
                fuse_reply_write(req, n)
            }
        }
        ops.flush = { req, _, _ in
            // Writes go straight to the backing file; nothing is buffered here.
            fuse_reply_err(req, 0)
        }
        ops.release = { req, _, fi in
            fs(req).release(fi!.pointee.fh)
            fuse_reply_err(req, 0)
        }
        ops.fsync = { req, _, datasync, fi in
            replying(req) {
                try fs(req).fsync(fi!.pointee.fh, dataOnly: datasync != 0)
                fuse_reply_err(req, 0)
            }
        }
        ops.opendir = { req, ino, fi in
            replying(req) {
                fi!.pointee.fh = try fs(req).opendir(ino)
                if fuse_reply_open(req, fi) != 0 { fs(req).releasedir(fi!.pointee.fh) }
            }
        }
        ops.readdir = { req, _, size, offset, fi in
            readdir(req, size: size, offset: offset, handle: fi!.pointee.fh, plus: false)
        }
        ops.readdirplus = { req, _, size, offset, fi in
            readdir(req, size: size, offset: offset, handle: fi!.pointee.fh, plus: true)
        }
        ops.releasedir = { req, _, fi in
            fs(req).releasedir(fi!.pointee.fh)
            fuse_reply_err(req, 0)
        }
        ops.fsyncdir = { req, _, _, fi in
            replying(req) {
                try fs(req).fsyncdir(fi!.pointee.fh)
                fuse_reply_err(req, 0)
            }
        }
        ops.statfs = { req, _ in
            replying(req) {
                var st = try fs(req).statfs()
                fuse_reply_statfs(req, &st)
            }
        }
        ops.access = { req, ino, mask in
            replying(req) {
                try fs(req).access(ino, mask: mask)
                fuse_reply_err(req, 0)
            }
        }
        ops.setxattr = { req, ino, name, value, size, flags in
            replying(req) {
                let data = value.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) } ?? []
                try fs(req).setxattr(ino, name: bytes(name), value: data, flags: flags)
                fuse_reply_err(req, 0)
            }
        }
        ops.getxattr = { req, ino, name, size in
            replying(req) { replyXattr(req, size: size, try fs(req).getxattr(ino, name: bytes(name))) }
        }
        ops.listxattr = { req, ino, size in
            replying(req) {
                let names = try fs(req).listxattr(ino)
                replyXattr(req, size: size, names.flatMap { $0 + [0] })
            }
        }
        ops.removexattr = { req, ino, name in
            replying(req) {
                try fs(req).removexattr(ino, name: bytes(name))
                fuse_reply_err(req, 0)
            }
        }
        ops.fallocate = { req, _, mode, offset, length, fi in
            replying(req) {
                try fs(req).fallocate(fi!.pointee.fh, mode: mode, offset: Int64(offset), length: Int64(length))
                fuse_reply_err(req, 0)
            }
        }
        return ops
    }
}

/// How long the kernel may cache entries and attributes, in seconds. Every change
/// comes through this mount, and the kernel drops or updates what a change makes
/// stale; a lock and node-table pressure invalidate explicitly. So only an edit of
/// CIPHERDIR behind the mount's back (unsupported) could show late, by up to this.
let entryTimeout = 60.0
private let attributeTimeout = 60.0

private func fs(_ req: fuse_req_t?) -> PlainFileSystem {
    Unmanaged<PlainFileSystem>.fromOpaque(fuse_req_userdata(req)!).takeUnretainedValue()
}

private func caller(_ req: fuse_req_t?) -> PlainFileSystem.Caller {
    let ctx = fuse_req_ctx(req)!.pointee
    return .init(uid: ctx.uid, gid: ctx.gid)
}

private func bytes(_ name: UnsafePointer<CChar>?) -> [UInt8] {
    guard let name else { return [] }
    return Array(UnsafeBufferPointer(start: name, count: strlen(name))).map { UInt8(bitPattern: $0) }
}

/// Runs `body`; a thrown error becomes the one reply.
private func replying(_ req: fuse_req_t?, _ body: () throws -> Void) {
    do { try body() } catch { fuse_reply_err(req, ErrnoMapping.code(for: error)) }
}

private func entryParam(_ entry: PlainFileSystem.Entry) -> fuse_entry_param {
    var param = fuse_entry_param()
    param.ino = entry.node
    param.attr = entry.attributes
    param.attr_timeout = attributeTimeout
    param.entry_timeout = entryTimeout
    return param
}

private func replyEntry(_ req: fuse_req_t?, _ entry: PlainFileSystem.Entry) {
    var param = entryParam(entry)
    if fuse_reply_entry(req, &param) != 0 {
        // The request was interrupted: the kernel will not count this lookup.
        fs(req).forget(entry.node, count: 1)
    }
}

private func replyAttr(_ req: fuse_req_t?, _ st: stat) {
    var st = st
    fuse_reply_attr(req, &st, attributeTimeout)
}


/// getxattr/listxattr: size 0 asks for the length; a smaller buffer is ERANGE.
private func replyXattr(_ req: fuse_req_t?, size: Int, _ value: [UInt8]) {
    if size == 0 {
        fuse_reply_xattr(req, value.count)
    } else if size < value.count {
        fuse_reply_err(req, ERANGE)
    } else {
        _ = value.withUnsafeBytes { fuse_reply_buf(req, $0.baseAddress?.assumingMemoryBound(to: CChar.self), $0.count) }
    }
}

/// readdir and readdirplus: pack listed entries from `offset` until the buffer is full.
private func readdir(_ req: fuse_req_t?, size: Int, offset: off_t, handle: UInt64, plus: Bool) {
    replying(req) {
        let fs = fs(req)
        let entries = try fs.readdir(handle, from: Int(offset))
        let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: size)
        var used = 0
        defer { explicit_bzero(buffer, used); buffer.deallocate() }
        var next = Int(offset)
        var entered: [UInt64] = []
        for listed in entries {
            next += 1
            let name = listed.name.map { CChar(bitPattern: $0) } + [0]
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
        if fuse_reply_buf(req, buffer, used) != 0 {
            // The request was interrupted: the kernel holds none of these lookups.
            entered.forEach { fs.forget($0, count: 1) }
        }
    }
}

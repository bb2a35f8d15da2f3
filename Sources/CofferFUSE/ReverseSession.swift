// ReverseSession mounts a reverse view (ReverseFileSystem) read-only and serves it over
// /dev/fuse; ReverseOperations is its bridge: each libfuse callback decodes its request,
// makes one ReverseFileSystem call, and sends exactly one reply. A view has no lock, no
// writes and no io_uring: a backup reads it once, in order.
import CFuse
import CofferFileSystem
import CofferSystem
import Glibc
import Synchronization

public final class ReverseSession: Sendable {
    /// Unchecked for Sendable (a C pointer): set once in init, only read afterwards, and
    /// libfuse's session is made to be served from many threads.
    nonisolated(unsafe) private let session: OpaquePointer?
    private let mounted = Atomic<Bool>(false)
    private let fs: ReverseFileSystem

    /// A session serving `fs`, read-only; `allowOther` lets other users in with the
    /// kernel checking modes (default_permissions); `extra` are further -o options.
    public init(fs: ReverseFileSystem, fsName: String, allowOther: Bool, extra: [String]) throws {
        self.fs = fs
        var ops = ReverseOperations.table()
        let escaped = fsName.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: ",", with: "\\,")
        var mountOptions = ["fsname=\(escaped)", "subtype=coffer", "ro"]
        if allowOther { mountOptions += ["allow_other", "default_permissions"] }
        mountOptions += extra
        let arguments = ["coffer", "-o", mountOptions.joined(separator: ",")]
        var cStrings = arguments.map { strdup($0) }
        defer { cStrings.forEach { free($0) } }
        session = cStrings.withUnsafeMutableBufferPointer { argv -> OpaquePointer? in
            var args = fuse_args(argc: Int32(argv.count), argv: argv.baseAddress, allocated: 0)
            return fuse_session_new(&args, &ops, MemoryLayout<fuse_lowlevel_ops>.size, Unmanaged.passUnretained(fs).toOpaque())
        }
        guard session != nil else { throw Errno(EINVAL, "fuse_session_new (bad -o option?)") }
    }

    deinit {
        if let session {
            if mounted.load(ordering: .acquiring) { fuse_session_unmount(session) }
            fuse_session_destroy(session)
        }
    }

    /// Mounts at `mountpoint` and installs handlers that end the loop on SIGINT, SIGTERM
    /// and SIGHUP.
    public func mount(at mountpoint: String) throws {
        guard fuse_set_signal_handlers(session) == 0 else { throw Errno(EIO, "fuse_set_signal_handlers") }
        guard fuse_session_mount(session, mountpoint) == 0 else {
            fuse_remove_signal_handlers(session)
            throw Errno(EIO, "mount")
        }
        mounted.store(true, ordering: .releasing)
    }

    /// Serves requests on up to `threads` workers until the mount goes away or a signal
    /// comes; the mount stays until `unmount()`.
    public func run(threads: Int) {
        let config = fuse_loop_cfg_create()
        defer { fuse_loop_cfg_destroy(config) }
        fuse_loop_cfg_set_clone_fd(config, 1)
        fuse_loop_cfg_set_max_threads(config, UInt32(threads))
        _ = fuse_session_loop_mt(session, config)
        fuse_remove_signal_handlers(session)
    }

    /// Detaches the mount if it is still there.
    public func unmount() {
        if mounted.exchange(false, ordering: .acquiringAndReleasing) { fuse_session_unmount(session) }
    }
}

enum ReverseOperations {
    /// The operations libfuse calls; writes never come (the mount is read-only).
    static func table() -> fuse_lowlevel_ops {
        var ops = fuse_lowlevel_ops()
        ops.`init` = { ReverseOperations.initialize($0, $1) }
        ops.lookup = { ReverseOperations.lookup($0, $1, $2) }
        ops.forget = { ReverseOperations.forget($0, $1, $2) }
        ops.forget_multi = { ReverseOperations.forgetMulti($0, $1, $2) }
        ops.getattr = { ReverseOperations.getattr($0, $1, $2) }
        ops.readlink = { ReverseOperations.readlink($0, $1) }
        ops.open = { ReverseOperations.open($0, $1, $2) }
        ops.read = { ReverseOperations.read($0, $1, $2, $3, $4) }
        ops.release = { ReverseOperations.release($0, $1, $2) }
        ops.opendir = { ReverseOperations.opendir($0, $1, $2) }
        ops.readdir = { ReverseOperations.readdir($0, $1, $2, $3, $4, plus: false) }
        ops.readdirplus = { ReverseOperations.readdir($0, $1, $2, $3, $4, plus: true) }
        ops.releasedir = { ReverseOperations.release($0, $1, $2) }
        ops.statfs = { ReverseOperations.statfs($0, $1) }
        return ops
    }

    static func initialize(_ userdata: UnsafeMutableRawPointer?, _ conn: UnsafeMutablePointer<fuse_conn_info>?) {
        guard let conn else { return }
        // Large reads: a backup streams whole files.
        conn.pointee.max_readahead = 1 << 20
        if conn.pointee.capable & UInt32(FUSE_CAP_READDIRPLUS) != 0 {
            conn.pointee.want |= UInt32(FUSE_CAP_READDIRPLUS)
            conn.pointee.want &= ~UInt32(FUSE_CAP_READDIRPLUS_AUTO)
        }
    }

    static func lookup(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        replying(req) {
            do {
                replyEntry(req, try fs(req).lookup(parent: parent, name: String(cString: name!)))
            } catch let error as Errno where error.code == ENOENT {
                var param = fuse_entry_param()
                param.entry_timeout = ReverseFileSystem.cacheSeconds
                fuse_reply_entry(req, &param)
            }
        }
    }

    static func forget(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ count: UInt64) {
        fs(req).forget(ino, count: count)
        fuse_reply_none(req)
    }

    static func forgetMulti(_ req: fuse_req_t?, _ count: Int, _ forgets: UnsafeMutablePointer<fuse_forget_data>?) {
        for i in 0..<count { fs(req).forget(forgets![i].ino, count: forgets![i].nlookup) }
        fuse_reply_none(req)
    }

    static func getattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) {
            var st = try fs(req).getattr(ino)
            fuse_reply_attr(req, &st, ReverseFileSystem.cacheSeconds)
        }
    }

    static func readlink(_ req: fuse_req_t?, _ ino: fuse_ino_t) {
        replying(req) { _ = try fs(req).readlink(ino).withCString { fuse_reply_readlink(req, $0) } }
    }

    static func open(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) {
            fi!.pointee.fh = try fs(req).open(ino)
            fi!.pointee.noflush = 1
            if fuse_reply_open(req, fi) != 0 { fs(req).release(fi!.pointee.fh) }
        }
    }

    static func read(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int, _ offset: off_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) {
            // Ciphertext only: nothing here needs zeroing.
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: size, alignment: 16)
            defer { buffer.deallocate() }
            let n = try fs(req).read(fi!.pointee.fh, into: buffer, at: Int64(offset))
            fuse_reply_buf(req, buffer.baseAddress?.assumingMemoryBound(to: CChar.self), n)
        }
    }

    static func release(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        fs(req).release(fi!.pointee.fh)
        fuse_reply_err(req, 0)
    }

    static func opendir(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        replying(req) {
            fi!.pointee.fh = try fs(req).opendir(ino)
            if fuse_reply_open(req, fi) != 0 { fs(req).release(fi!.pointee.fh) }
        }
    }

    /// READDIR and READDIRPLUS: the listing's entries from `offset` until the buffer is full.
    static func readdir(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int, _ offset: off_t,
                        _ fi: UnsafeMutablePointer<fuse_file_info>?, plus: Bool) {
        replying(req) {
            let fs = fs(req)
            let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: size)
            defer { buffer.deallocate() }
            var used = 0, next = Int(offset)
            var entered: [UInt64] = []
            for listed in try fs.readdir(fi!.pointee.fh, from: Int(offset)) {
                next += 1
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
                            let entry = try fs.lookup(parent: ino, name: listed.name)
                            param = entryParam(entry)
                            node = entry.node
                        } catch let error as Errno where error.code == ENOENT {
                            continue  // removed since the listing was taken
                        } catch {
                            // Listed but not entered: a node ID of 0 lets the kernel look it up later.
                        }
                    }
                    added = listed.name.withCString { fuse_add_direntry_plus(req, buffer + used, size - used, $0, &param, off_t(next)) }
                    if added > size - used {
                        if let node { fs.forget(node, count: 1) }
                        break
                    }
                    if let node { entered.append(node) }
                } else {
                    added = listed.name.withCString { fuse_add_direntry(req, buffer + used, size - used, $0, &st, off_t(next)) }
                    if added > size - used { break }
                }
                used += added
            }
            if fuse_reply_buf(req, buffer, used) != 0 { entered.forEach { fs.forget($0, count: 1) } }
        }
    }

    static func statfs(_ req: fuse_req_t?, _ ino: fuse_ino_t) {
        replying(req) {
            var st = try fs(req).statfs()
            fuse_reply_statfs(req, &st)
        }
    }
}

private func fs(_ req: fuse_req_t?) -> ReverseFileSystem {
    Unmanaged<ReverseFileSystem>.fromOpaque(fuse_req_userdata(req)!).takeUnretainedValue()
}

/// Runs `body`, which sends the reply; a thrown error becomes the one error reply
/// instead, logged when it is not one a request can expect.
private func replying(_ req: fuse_req_t?, operation: String = #function, _ body: () throws -> Void) {
    do {
        try body()
    } catch {
        let code = ErrnoMapping.code(for: error)
        if !ErrnoMapping.isExpected(error) {
            fs(req).logger.error("\(operation.prefix { $0 != "(" }): unexpected error, answered errno \(code): \(error)")
        }
        fuse_reply_err(req, code)
    }
}

private func entryParam(_ entry: ReverseFileSystem.Entry) -> fuse_entry_param {
    var param = fuse_entry_param()
    param.ino = entry.node
    param.attr = entry.attributes
    param.attr_timeout = ReverseFileSystem.cacheSeconds
    param.entry_timeout = ReverseFileSystem.cacheSeconds
    return param
}

private func replyEntry(_ req: fuse_req_t?, _ entry: ReverseFileSystem.Entry) {
    var param = entryParam(entry)
    if fuse_reply_entry(req, &param) != 0 { fs(req).forget(entry.node, count: 1) }
}

// SessionIO is libfuse's custom I/O hook on a mounted session: every request libfuse
// reads and every reply it writes passes through it. It does three things libfuse 3.14
// (Debian 12's) cannot:
//
// - It asks the kernel for FUSE_HANDLE_KILLPRIV_V2, which 3.14 never puts in its INIT
//   reply. Without it the kernel, to keep setuid/setgid and file capabilities honest,
//   asks the daemon for `security.capability` before every write (a second round trip
//   per write) and fetches attributes before every chown. With it, the kernel marks
//   inodes it has checked once as needing no check (SB_NOSEC/S_NOSEC) and leaves
//   clearing setuid/setgid to the file system, which PlainFileSystem does (write,
//   truncate, open with O_TRUNC, chown).
// - It asks for FUSE over io_uring (FUSE_OVER_IO_URING, a flags2 bit of the INIT reply)
//   when the session wants it and the kernel offers it, having first made the rings
//   (UringTransport), which start once the reply is written.
// - It sends each reply the way its request came: into its ring entry, or to /dev/fuse.
//
// Reads pass through untouched except that the INIT request's unique ID and offered
// flags are noted; the one reply with that ID gets the flags added. Once INIT is done,
// a reply costs one atomic load here on /dev/fuse, and a look through the rings' entries
// with io_uring.
import CFuse
import Glibc
import Synchronization

enum SessionIO {
    /// Installs the hooks on a mounted session (`fd` is its /dev/fuse descriptor);
    /// with `uring`, INIT asks for io_uring if the kernel offers it.
    /// `settled` is told which transport the kernel's INIT settled on.
    static func install(on session: OpaquePointer, fd: Int32, uring: Bool,
                        settled: @escaping @Sendable (String) -> Void) -> Bool {
        shared.session = session
        shared.settled = settled
        shared.fuseFD = fd
        shared.wantsUring = uring
        var io = fuse_custom_io()
        io.read = { fd, buffer, count, _ in
            let n = Glibc.read(fd, buffer, count)
            if shared.initPending.load(ordering: .acquiring),
               n >= MemoryLayout<fuse_in_header>.size + MemoryLayout<fuse_init_in>.size, let buffer {
                let header = buffer.load(as: fuse_in_header.self)
                if header.opcode == FUSE_INIT.rawValue {
                    let offered = buffer.load(fromByteOffset: MemoryLayout<fuse_in_header>.size, as: fuse_init_in.self)
                    shared.initRequest.withLock { $0 = InitRequest(unique: header.unique, offered: offered.flags, offered2: offered.flags2) }
                }
            }
            return n
        }
        io.writev = { fd, iov, count, _ in
            guard let iov, count >= 1, let header = iov[0].iov_base?.load(as: fuse_out_header.self) else {
                return Glibc.writev(fd, iov, count)
            }
            if let uring = shared.uring.load(ordering: .acquiring),
               let size = Unmanaged<UringTransport>.fromOpaque(uring).takeUnretainedValue()
                .reply(unique: header.unique, error: header.error, iov, count: Int(count)) {
                return size
            }
            if shared.initPending.load(ordering: .acquiring), count == 2, header.error == 0,
               iov[1].iov_len >= MemoryLayout<fuse_init_out>.size, let reply = iov[1].iov_base,
               let request = shared.initRequest.withLock({ $0.unique == header.unique ? $0 : nil }) {
                shared.initPending.store(false, ordering: .releasing)
                var out = reply.load(as: fuse_init_out.self)
                if request.offered & UInt32(FUSE_HANDLE_KILLPRIV_V2) != 0 { out.flags |= UInt32(FUSE_HANDLE_KILLPRIV_V2) }
                let transport = shared.wantsUring ? SessionIO.makeRings(offered: request, reply: out) : nil
                if transport != nil {
                    out.flags |= UInt32(FUSE_INIT_EXT)
                    out.flags2 |= SessionIO.overIOUring
                }
                reply.storeBytes(of: out, as: fuse_init_out.self)
                let written = Glibc.writev(fd, iov, count)
                if let transport, written >= 0 {
                    shared.uring.store(Unmanaged.passRetained(transport).toOpaque(), ordering: .releasing)
                    transport.start()
                }
                shared.settled(transport != nil && written >= 0 ? "io_uring"
                               : shared.wantsUring ? "/dev/fuse (io_uring was asked for: the kernel did not offer it, or the rings could not be made)"
                               : "/dev/fuse")
                return written
            }
            return Glibc.writev(fd, iov, count)
        }
        return fuse_session_custom_io(session, &io, fd) == 0
    }

    /// True once requests go through io_uring.
    static var usesUring: Bool { shared.uring.load(ordering: .acquiring) != nil }

    /// Ends the rings' threads (after the unmount) and frees them.
    static func stopRings() {
        guard let uring = shared.uring.exchange(nil, ordering: .acquiringAndReleasing) else { return }
        let transport = Unmanaged<UringTransport>.fromOpaque(uring).takeRetainedValue()
        transport.stop()
    }

    /// FUSE_OVER_IO_URING (bit 41 of the 64 flags): bit 9 of flags2.
    private static let overIOUring: UInt32 = 1 << 9

    /// The rings for a session whose INIT `request` offered io_uring, sized for the
    /// `reply` libfuse is about to give; nil (and /dev/fuse only) if not offered or
    /// not made.
    private static func makeRings(offered request: InitRequest, reply: fuse_init_out) -> UringTransport? {
        guard request.offered & UInt32(FUSE_INIT_EXT) != 0, request.offered2 & overIOUring != 0,
              let session = shared.session else { return nil }
        // What the kernel requires of a payload buffer (it refuses a smaller one).
        let pages = reply.flags & UInt32(FUSE_MAX_PAGES) != 0 ? Int(reply.max_pages) : 32
        let capacity = max(8192, Int(reply.max_write), pages * 4096)
        return try? UringTransport(session: session, fuseFD: shared.fuseFD, payloadCapacity: capacity)
    }
}

/// The INIT request the kernel sent: its unique ID and the flags it offered.
private struct InitRequest: Sendable {
    var unique: UInt64
    var offered: UInt32
    var offered2: UInt32
}

/// What the hooks share (C function pointers capture nothing). One session per process:
/// the daemon serves one mount. Unchecked: the plain fields are set in `install`, before
/// the session reads its first request.
private final class SharedState: @unchecked Sendable {
    var session: OpaquePointer?
    var fuseFD: Int32 = -1
    var wantsUring = false
    var settled: @Sendable (String) -> Void = { _ in }
    /// Until the INIT reply is written.
    let initPending = Atomic<Bool>(true)
    let initRequest = Mutex(InitRequest(unique: 0, offered: 0, offered2: 0))
    /// The running UringTransport (retained), or nil.
    let uring = Atomic<UnsafeMutableRawPointer?>(nil)
}

private let shared = SharedState()

// SessionIO is a mounted session's context and libfuse's custom I/O hook on it: libfuse
// hands it, as the session's user data, to every handler (which finds the file system in
// it) and to the hook through which every request it reads and every reply it writes
// passes. The hook does three things libfuse 3.14 (Debian 12's) cannot:
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
// - It sends each reply the way its request came: a reply whose unique ID is a
//   `RingTicket` into the ring entry the ticket names, any other to /dev/fuse.
//
// Reads pass through untouched except that the INIT request's unique ID and offered
// flags are noted; the one reply with that ID gets the flags `InitReply` decides. Once
// INIT is done, a reply costs a bit test and one atomic load here.
import CFuse
import CofferFileSystem
import CofferUring
import Glibc
import Logging
import Synchronization

/// Sendable: what `install` sets is in a Mutex (read at INIT, once), the rest atomic.
final class SessionIO: Sendable {
    let fs: PlainFileSystem
    private let logger: Logger
    private let ringCalls: UringTransport.RingCalls
    private let loop: ServingLoop
    /// libfuse logs each request it dispatches (`-o debug`); the reads the rings serve
    /// without it are logged here in the same shape.
    private let debug: Bool
    /// What `install` was given, before the session reads its first request.
    private struct Installed {
        /// The session (libfuse's fuse_session), by address: libfuse serves it from
        /// every thread.
        var session: UInt
        var fuseFD: Int32
        var wantsUring: Bool
        var settled: @Sendable (String) -> Void
    }
    private let installed = Mutex<Installed?>(nil)
    /// Until the INIT reply is written.
    private let initPending = Atomic<Bool>(true)
    private let initRequest = Mutex<InitRequest?>(nil)
    /// The running UringTransport (retained), by address, or 0: one atomic load per
    /// reply, where a Mutex would be a lock.
    private let uring = Atomic<UInt>(0)

    /// The context of a session of `fs`; a ring that fails ends `loop`.
    init(fs: PlainFileSystem, ringCalls: UringTransport.RingCalls, loop: ServingLoop, debug: Bool = false) {
        self.fs = fs
        self.logger = fs.logger
        self.ringCalls = ringCalls
        self.loop = loop
        self.debug = debug
    }

    /// The context libfuse hands back: the session's user data.
    static func of(_ userdata: UnsafeMutableRawPointer?) -> SessionIO {
        Unmanaged<SessionIO>.fromOpaque(userdata!).takeUnretainedValue()
    }

    /// Installs the hooks on a mounted session (`fd` is its /dev/fuse descriptor); with
    /// `uring`, INIT asks for io_uring if the kernel offers it. `settled` is told which
    /// transport the kernel's INIT settled on.
    func install(on session: OpaquePointer, fd: Int32, uring: Bool, settled: @escaping @Sendable (String) -> Void) -> Bool {
        installed.withLock { $0 = Installed(session: UInt(bitPattern: session), fuseFD: fd, wantsUring: uring, settled: settled) }
        var io = Self.hooks
        return fuse_session_custom_io(session, &io, fd) == 0
    }

    /// The hooks: C function pointers, which capture nothing; each finds its session in
    /// the user data libfuse passes.
    static var hooks: fuse_custom_io {
        var io = fuse_custom_io()
        io.read = { fd, buffer, count, userdata in SessionIO.of(userdata).read(fd, buffer, count) }
        io.writev = { fd, iov, count, userdata in SessionIO.of(userdata).send(fd, iov, count) }
        return io
    }

    /// Reads a request, noting INIT's.
    func read(_ fd: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int {
        let n = Glibc.read(fd, buffer, count)
        if initPending.load(ordering: .acquiring), n > 0, let buffer,
           let request = InitRequest(UnsafeRawBufferPointer(start: buffer, count: n)) {
            initRequest.withLock { $0 = request }
        }
        return n
    }

    /// Sends a reply the way its request came; rewrites INIT's.
    func send(_ fd: Int32, _ iov: UnsafeMutablePointer<iovec>?, _ count: Int32) -> Int {
        guard let iov, count >= 1, let header = iov[0].iov_base?.load(as: fuse_out_header.self) else {
            return Glibc.writev(fd, iov, count)
        }
        if let ticket = RingTicket(unique: header.unique) {
            // Tickets exist only while the rings serve (`stopRings` waits for the last).
            guard let transport = UnsafeMutableRawPointer(bitPattern: uring.load(ordering: .acquiring)) else {
                logger.error("a reply to io_uring queue \(ticket.queue) entry \(ticket.entry) after the rings stopped: dropped")
                return Int(UringTransport.outHeaderSize)
            }
            return Unmanaged<UringTransport>.fromOpaque(transport).takeUnretainedValue()
                .reply(ticket, error: header.error, iov, count: Int(count))
        }
        if initPending.load(ordering: .acquiring), count == 2, header.error == 0,
           iov[1].iov_len >= MemoryLayout<fuse_init_out>.size, let reply = iov[1].iov_base,
           let request = initRequest.withLock({ $0?.unique == header.unique ? $0 : nil }) {
            return answerInit(request, fd, iov, count, reply: reply)
        }
        return Glibc.writev(fd, iov, count)
    }

    /// Writes libfuse's INIT reply with what `InitReply` adds, after making the rings if
    /// it asks for io_uring, and starts them once the kernel has the reply.
    private func answerInit(_ request: InitRequest, _ fd: Int32, _ iov: UnsafeMutablePointer<iovec>, _ count: Int32,
                            reply: UnsafeMutableRawPointer) -> Int {
        initPending.store(false, ordering: .releasing)
        guard let setup = installed.withLock({ $0 }) else { return Glibc.writev(fd, iov, count) }
        let wantsUring = setup.wantsUring
        var out = reply.load(as: fuse_init_out.self)
        let offered = InitReply.offersUring(request)
        let transport = wantsUring && offered ? makeRings(for: out, setup) : nil
        InitReply.rewrite(&out, offered: request, uring: transport != nil)
        reply.storeBytes(of: out, as: fuse_init_out.self)
        let written = Glibc.writev(fd, iov, count)
        if let transport, written >= 0 {
            uring.store(UInt(bitPattern: Unmanaged.passRetained(transport).toOpaque()), ordering: .releasing)
            transport.start()
        }
        setup.settled(transport != nil && written >= 0 ? "io_uring"
                : !wantsUring ? "/dev/fuse"
                : !offered ? "/dev/fuse (io_uring was asked for: the kernel did not offer it)"
                : "/dev/fuse (io_uring was asked for: the rings could not be made)")
        return written
    }

    /// The rings for the INIT `reply` libfuse is about to give; nil (and /dev/fuse only)
    /// if they cannot be made.
    private func makeRings(for reply: fuse_init_out, _ setup: Installed) -> UringTransport? {
        let address = setup.session
        do {
            return try UringTransport(
                fuseFD: setup.fuseFD, payloadCapacity: InitReply.payloadCapacity(for: reply), calls: ringCalls, logger: logger,
                dispatcher: { buffer, length in
                    var request = fuse_buf(size: length, flags: fuse_buf_flags(rawValue: 0), mem: buffer, fd: -1, pos: 0)
                    fuse_session_process_buf(OpaquePointer(bitPattern: address), &request)
                },
                reader: { [fs, debug] request, area in
                    if debug { Self.logDebug(request) }
                    return FuseOperations.read(fs, handle: request.handle, at: request.offset, into: area)
                },
                failed: { [loop] in loop.end(OpaquePointer(bitPattern: address)!) })
        } catch {
            logger.error("io_uring: the rings could not be made (\(error)); requests come through /dev/fuse")
            return nil
        }
    }

    /// A read served on a ring, in libfuse's debug log (standard error) as libfuse logs
    /// the requests it dispatches.
    private static func logDebug(_ request: UringTransport.ReadRequest) {
        let line = """
            unique: \(request.unique), opcode: READ (\(FUSE_READ.rawValue)), nodeid: \(request.node), pid: \(request.pid) \
            (io_uring), read \(request.size) bytes from \(request.offset)

            """
        _ = line.withCString { Glibc.write(STDERR_FILENO, $0, strlen($0)) }
    }

    /// True once requests go through io_uring.
    var usesUring: Bool { uring.load(ordering: .acquiring) != 0 }

    /// Ends the rings' threads (after the unmount) and frees them.
    func stopRings() {
        guard let transport = UnsafeMutableRawPointer(bitPattern: uring.exchange(0, ordering: .acquiringAndReleasing)) else { return }
        Unmanaged<UringTransport>.fromOpaque(transport).takeRetainedValue().stop()
    }
}

/// The INIT request the kernel sent: its unique ID and the flags it offered.
struct InitRequest: Sendable, Equatable {
    var unique: UInt64
    var offered: UInt32
    var offered2: UInt32

    init(unique: UInt64, offered: UInt32, offered2: UInt32) {
        self.unique = unique
        self.offered = offered
        self.offered2 = offered2
    }

    /// The INIT request in the bytes read from /dev/fuse, or nil for any other request.
    init?(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count >= MemoryLayout<fuse_in_header>.size + MemoryLayout<fuse_init_in>.size else { return nil }
        let header = bytes.load(as: fuse_in_header.self)
        guard header.opcode == FUSE_INIT.rawValue else { return nil }
        let offered = bytes.load(fromByteOffset: MemoryLayout<fuse_in_header>.size, as: fuse_init_in.self)
        self.init(unique: header.unique, offered: offered.flags, offered2: offered.flags2)
    }
}

/// What coffer adds to libfuse's INIT reply, from what the kernel offered.
enum InitReply {
    /// FUSE_OVER_IO_URING (bit 41 of the 64 flags): bit 9 of flags2.
    static let overIOUring: UInt32 = 1 << 9

    /// True if the kernel offered FUSE over io_uring.
    static func offersUring(_ request: InitRequest) -> Bool {
        request.offered & UInt32(FUSE_INIT_EXT) != 0 && request.offered2 & overIOUring != 0
    }

    /// Adds FUSE_HANDLE_KILLPRIV_V2 where the kernel offered it and, with `uring` (the
    /// rings are made), FUSE over io_uring.
    static func rewrite(_ reply: inout fuse_init_out, offered request: InitRequest, uring: Bool) {
        if request.offered & UInt32(FUSE_HANDLE_KILLPRIV_V2) != 0 { reply.flags |= UInt32(FUSE_HANDLE_KILLPRIV_V2) }
        if uring {
            reply.flags |= UInt32(FUSE_INIT_EXT)
            reply.flags2 |= overIOUring
        }
    }

    /// The bytes a ring entry's payload needs for a session with INIT `reply`: what the
    /// kernel requires of it (it refuses a smaller one).
    static func payloadCapacity(for reply: fuse_init_out) -> Int {
        let pages = reply.flags & UInt32(FUSE_MAX_PAGES) != 0 ? Int(reply.max_pages) : 32
        return max(8192, Int(reply.max_write), pages * 4096)
    }
}

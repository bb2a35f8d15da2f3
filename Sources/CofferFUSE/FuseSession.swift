// FuseSession owns one libfuse low-level session: it mounts a PlainFileSystem at a
// mountpoint, serves it on a pool of threads until unmounted or signalled, and
// unmounts. Telling the kernel to drop what it caches of the mount is SessionLink's.
import CFuse
import CofferFileSystem
import CofferSystem
import CofferUring
import Glibc
import Synchronization

public final class FuseSession: Sendable {
    public struct Options: Sendable {
        /// Let users other than the mount owner in; the kernel then checks modes
        /// (default_permissions).
        public var allowOther = false
        public var readOnly = false
        /// Extra `-o` options passed to libfuse as given.
        public var extra: [String] = []
        /// Shown as the source in /proc/mounts.
        public var fsName = "coffer"
        /// How requests reach the daemon.
        public var transport = Transport.auto
        /// Told how requests come ("io_uring" or "/dev/fuse") once the kernel's first
        /// request has settled it.
        public var transportSettled: @Sendable (String) -> Void = { _ in }
        /// The io_uring calls the rings' threads make (a test's may fail).
        var ringCalls = UringTransport.RingCalls.kernel
        public init() {}
    }

    /// How requests reach the daemon: through /dev/fuse (`classic`), through FUSE over
    /// io_uring (`uring`: the mount is refused where the kernel does not offer it), or
    /// io_uring where offered, else /dev/fuse (`auto`).
    public enum Transport: String, CaseIterable, Sendable {
        case auto, uring, classic
    }

    /// Why `uring` cannot be had here, or nil.
    public static func uringUnavailableReason() -> String? { UringTransport.unavailableReason() }

    private let options: Options
    /// Unchecked for Sendable (a C pointer): set once in init, only read afterwards, and
    /// libfuse's session is made to be served from many threads.
    nonisolated(unsafe) private let session: OpaquePointer?
    private let mounted = Atomic<Bool>(false)
    private let link: SessionLink
    /// The session's context, libfuse's user data: the file system, the I/O hooks, the rings.
    private let io: SessionIO
    private let loop: ServingLoop

    /// Makes the session for `fs`; `link` is the one whose calls `fs` was given as its
    /// hooks (attributes changed, invalidate a node or an entry), and this session
    /// attaches to it.
    public init(fs: PlainFileSystem, options: Options, link: SessionLink = SessionLink()) throws {
        self.options = options
        self.link = link
        let loop = ServingLoop()
        self.loop = loop
        let debug = options.extra.flatMap { $0.split(separator: ",") }.contains("debug")
        let io = SessionIO(fs: fs, ringCalls: options.ringCalls, loop: loop, debug: debug)
        self.io = io
        // fuse_session_new copies the operations table.
        var ops = FuseOperations.table()
        // libfuse splits options at commas and takes a backslash as an escape: a path
        // with either in it must not add an option of its own (",allow_other").
        let fsName = options.fsName.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: ",", with: "\\,")
        var mountOptions = ["fsname=\(fsName)", "subtype=coffer"]
        if options.allowOther { mountOptions += ["allow_other", "default_permissions"] }
        if options.readOnly { mountOptions.append("ro") }
        mountOptions += options.extra
        let arguments = ["coffer", "-o", mountOptions.joined(separator: ",")]
        // fuse_session_new copies what it keeps; the argv strings only live for the call.
        var cStrings = arguments.map { strdup($0) }
        defer { cStrings.forEach { free($0) } }
        session = cStrings.withUnsafeMutableBufferPointer { argv -> OpaquePointer? in
            var args = fuse_args(argc: Int32(argv.count), argv: argv.baseAddress, allocated: 0)
            return fuse_session_new(&args, &ops, MemoryLayout<fuse_lowlevel_ops>.size,
                                    Unmanaged.passUnretained(io).toOpaque())
        }
        guard let session else { throw Errno(EINVAL, "fuse_session_new (bad -o option?)") }
        link.attach(session)
    }

    /// The `-o` options libfuse refuses (unknown or malformed), checked by creating and
    /// destroying a session with no operations, with libfuse's own complaint silenced.
    public static func refusedOptions(_ extra: [String]) -> [String] {
        fuse_set_log_func { _, _, _ in }
        defer { fuse_set_log_func(nil) }
        return extra.filter { option in
            var ops = fuse_lowlevel_ops()
            let arguments: [String] = ["coffer", "-o", option]
            var cStrings = arguments.map { strdup($0) }
            defer { cStrings.forEach { free($0) } }
            let session = cStrings.withUnsafeMutableBufferPointer { argv -> OpaquePointer? in
                var args = fuse_args(argc: Int32(argv.count), argv: argv.baseAddress, allocated: 0)
                return fuse_session_new(&args, &ops, MemoryLayout<fuse_lowlevel_ops>.size, nil)
            }
            guard let session else { return true }
            fuse_session_destroy(session)
            return false
        }
    }

    deinit {
        link.detach()
        if let session {
            if mounted.load(ordering: .acquiring) { fuse_session_unmount(session) }
            io.stopRings()
            fuse_session_destroy(session)
        }
    }

    /// Mounts at `mountpoint` (through fusermount3 when not root) and installs handlers
    /// that end the loop on SIGINT, SIGTERM and SIGHUP. With the `auto` transport,
    /// io_uring is asked for if this kernel serves it.
    public func mount(at mountpoint: String) throws {
        // Where `auto` falls back, the log line says why.
        let (uring, why): (Bool, String?) = switch options.transport {
        case .classic: (false, nil)
        case .uring: (true, nil)
        case .auto: UringTransport.unavailableReason().map { (false, $0) } ?? (true, nil)
        }
        guard fuse_set_signal_handlers(session) == 0 else { throw Errno(EIO, "fuse_set_signal_handlers") }
        guard fuse_session_mount(session, mountpoint) == 0 else {
            fuse_remove_signal_handlers(session)
            throw Errno(EIO, "mount")
        }
        mounted.store(true, ordering: .releasing)
        // Not fatal if refused: the kernel then keeps asking before writes and chowns,
        // and requests come through /dev/fuse.
        let settled = options.transportSettled
        _ = io.install(on: session!, fd: fuse_session_fd(session), uring: uring,
                       settled: { transport in settled(why.map { "\(transport) (not io_uring: \($0))" } ?? transport) })
    }

    /// How requests reach the daemon now: "io_uring" or "/dev/fuse" (also before the
    /// kernel's first request, which settles it).
    public var transport: String { io.usesUring ? "io_uring" : "/dev/fuse" }

    /// Worker threads by default: 8, or two per core on machines with more than four.
    /// Most of a worker's time is spent waiting (for the backing disk, for the kernel),
    /// so more workers than cores keep the cores busy; 2 served worst here and 4…10 the
    /// same within noise (docs/PERFORMANCE.md, "Worker threads").
    public static let defaultThreads = min(64, max(8, 2 * Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))))

    /// Serves requests on up to `threads` worker threads (libfuse starts them as
    /// requests queue up and keeps them) until the mount goes away, a signal arrives,
    /// or a ring fails (UringTransport). The mount stays until `unmount()` (or deinit), so that the caller can
    /// wipe its keys while a signalled mount is still there: whoever sees the mount
    /// gone also sees the keys gone. Returns libfuse's status (0: clean exit).
    @discardableResult
    public func run(threads: Int = FuseSession.defaultThreads) -> Int32 {
        let config = fuse_loop_cfg_create()
        defer { fuse_loop_cfg_destroy(config) }
        fuse_loop_cfg_set_clone_fd(config, 1)
        fuse_loop_cfg_set_max_threads(config, UInt32(threads))
        // libfuse's default (-1): idle workers stay, so a burst does not pay for
        // thread creation again.
        let status = loop.run { fuse_session_loop_mt(session, config) }
        fuse_remove_signal_handlers(session)
        // Nothing serves the kernel any more: an invalidation now (a lock on the idle
        // timer, a change by another writer) could wait for a write-back for ever.
        link.detach()
        return status
    }

    /// Whether the last `run` ended because the transport failed (an io_uring queue that
    /// cannot go on): the daemon then exits with a failure, after the same clean shutdown.
    public var endedByFailure: Bool { loop.endedByFailure.load(ordering: .acquiring) }

    /// Detaches the mount if it is still there (after a signal; after `fusermount3 -u`
    /// the kernel has already detached it).
    public func unmount() {
        if mounted.exchange(false, ordering: .acquiringAndReleasing) {
            fuse_session_unmount(session)
        }
        io.stopRings()
    }
}

/// The thread that runs a session's loop (`FuseSession.run`), so that a ring that fails
/// can end the loop from its own thread, as SIGTERM would.
final class ServingLoop: Sendable {
    private let thread = Mutex<pthread_t?>(nil)
    /// Set by `end`: the loop ended because the transport failed, not by a signal or an
    /// unmount.
    let endedByFailure = Atomic<Bool>(false)

    /// Runs `loop` on the calling thread, the one `end` interrupts.
    func run(_ loop: () -> Int32) -> Int32 {
        thread.withLock { $0 = pthread_self() }
        defer { thread.withLock { $0 = nil } }
        return loop()
    }

    /// Marks `session` ended and interrupts its loop's wait with SIGHUP, whose handler
    /// (libfuse's, installed with the loop and removed after `run`) only marks it ended
    /// too, until the loop has returned; the caller then goes on as after a signal. A
    /// signal that comes just before the loop waits is missed, hence again every 20 ms.
    /// Nothing once the loop has returned: the session may be gone by then.
    func end(_ session: OpaquePointer) {
        endedByFailure.store(true, ordering: .releasing)
        while thread.withLock({ thread in
            thread.map {
                fuse_session_exit(session)
                return pthread_kill($0, SIGHUP)
            }
        }) != nil {
            usleep(20_000)
        }
    }
}

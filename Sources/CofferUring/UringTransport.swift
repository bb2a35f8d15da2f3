// UringTransport serves a mounted session's requests through FUSE over io_uring
// (Linux 6.14 and later): one ring per possible CPU, as the kernel queues requests by the
// CPU of the caller, each served by one thread. The thread registers its entries' buffers
// with the kernel, lays each request it receives out as /dev/fuse would have given it,
// has libfuse dispatch it — a read it serves itself, through the `Reader` it is given,
// straight into the entry's buffer (a large read on another thread) — and commits the
// reply together with the fetch of the next request, in one system call. /dev/fuse still
// carries INIT, FORGET, INTERRUPT and the notifications; SessionIO sends each reply the
// way its request came.
//
// A request carries its entry to its reply: the unique ID libfuse sees is a `RingTicket`
// naming the queue and the entry, which libfuse copies into the reply's header, and the
// entry keeps the kernel's own ID for the reply it commits. (libfuse then cannot match
// an INTERRUPT, which names the kernel's ID, to a ring request; coffer's handlers never
// ask whether they were interrupted.)
//
// A reply goes into the buffer its request came in: a handler must not touch the
// request's bytes once it has replied (FuseOperations.write zeroes the plaintext first).
// A read never passes through libfuse: the transport hands its `Reader` the entry's
// payload with the request's handle and offset, and writes the reply's header itself,
// so the plaintext is deciphered once, into the buffer the kernel takes it from.
//
// A queue whose ring fails (a system call refused, every entry ended by the kernel, its
// thread not started) would leave its CPU's requests waiting for ever: the kernel has no
// way back to /dev/fuse once the rings serve. Its thread logs the failure once and has
// the mount end (`failed`), as a signal would: the daemon unmounts and exits, and the
// kernel ends every request still queued once the daemon's descriptors close.
//
// Layer 4, beside the bridge: this target knows the kernel's FUSE structures and
// io_uring, not libfuse's handlers nor the file system; CofferFUSE's SessionIO makes
// the rings and gives them libfuse's dispatch and the file system's read.
import CFuse
import CLinux
import CofferSystem
import Dispatch
import Glibc
import Logging
import Synchronization

/// Sendable: the queues and their entries are made in init and only read afterwards;
/// what threads share in an entry is atomic, in the order its hand-over (`HandOver`)
/// gives.
public final class UringTransport: Sendable {
    /// Requests each CPU's queue holds at once.
    static let depth = 8
    private static let register = CLINUX_FUSE_IO_URING_CMD_REGISTER.rawValue
    private static let commitAndFetch = CLINUX_FUSE_IO_URING_CMD_COMMIT_AND_FETCH.rawValue
    static let inHeaderSize = MemoryLayout<fuse_in_header>.size
    public static let outHeaderSize = MemoryLayout<fuse_out_header>.size
    /// Where a request's and a reply's header keep the unique ID (the same in both).
    static let uniqueOffset = MemoryLayout<fuse_in_header>.offset(of: \.unique)!
    /// Reads of at least this many bytes are served by other threads (the queue's thread
    /// would otherwise wait for their disk and cipher alone); smaller ones in place,
    /// where a hand-off's wake-ups would cost more than they save. Writes stay in place:
    /// a writer waits for each, so there is nothing to overlap them with.
    static let handOffSize = 64 << 10
    /// The operations whose replies carry file contents, names or xattr values: their
    /// bytes are wiped once the kernel has taken them (the others carry attributes,
    /// counts and handles).
    private static let repliesWithContents = Set([FUSE_READ, FUSE_READDIR, FUSE_READDIRPLUS, FUSE_READLINK,
                                                  FUSE_GETXATTR, FUSE_LISTXATTR].map(\.rawValue))
    /// A completion of the queue's wake-up descriptor, not of an entry.
    private static let wakeTag = UInt64.max

    /// True if this kernel serves FUSE over io_uring (the module's switch is on) and
    /// this process may make a ring; why not, otherwise.
    public static func unavailableReason() -> String? {
        guard (try? KernelFiles.read("/sys/module/fuse/parameters/enable_uring"))?.first == UInt8(ascii: "Y") else {
            return """
                this kernel does not serve FUSE over io_uring (it needs Linux 6.14 or later with /sys/module/fuse/parameters/enable_uring \
                set to 1)
                """
        }
        let ring = clinux_uring_create(2)
        defer { clinux_uring_destroy(ring) }
        let code = ring == nil ? Errno.current("io_uring_setup").code : -clinux_uring_enable(ring)
        return code == 0 ? nil : "io_uring is refused to this process (\(Errno(code).text))"
    }

    /// Has libfuse dispatch the request laid out in `buffer` (its header first), `length`
    /// bytes: `fuse_session_process_buf`, or a test's stand-in.
    public typealias Dispatcher = @Sendable (_ buffer: UnsafeMutableRawPointer, _ length: Int) -> Void

    /// Serves a read: puts the plaintext the request asks for into `area` (the entry's
    /// payload, as many bytes as the request asks for) and returns how many it put there,
    /// or -errno. Whatever else it leaves in `area` it wipes first: the transport wipes
    /// only what the reply carries, once the kernel has it.
    public typealias Reader = @Sendable (_ request: ReadRequest, _ area: UnsafeMutableRawBufferPointer) -> Int

    /// A read the kernel sent: what libfuse would have given a read handler.
    public struct ReadRequest: Sendable {
        /// The kernel's ID of the request, the node read and the caller's process.
        public let unique: UInt64, node: UInt64, pid: UInt32
        /// The file handle the open returned, where to read and how many bytes.
        public let handle: UInt64, offset: Int64, size: Int
    }

    private let dispatcher: Dispatcher
    private let reader: Reader
    /// Large reads handed to other threads and not yet answered (`stop` waits for them).
    private let handedOff = DispatchGroup()
    private let fuseFD: Int32
    let queues: [Queue]
    /// Bytes an entry's payload holds: what the kernel requires of it.
    private let payloadCapacity: Int
    private let calls: RingCalls
    private let logger: Logger
    /// Ends the mount: a queue cannot go on. Called once, by the first queue that fails.
    private let failed: @Sendable () -> Void
    private let hasFailed = Atomic<Bool>(false)

    /// Makes one ring per possible CPU (or `queueCount`) with `depth` entries of
    /// `payloadCapacity` bytes; nothing reaches the kernel before `start`. `calls` are the
    /// ring calls the threads make (a test's may fail); `dispatcher` has every request
    /// but a read served, `reader` every read; `failed` ends the mount.
    public init(fuseFD: Int32, payloadCapacity: Int, queueCount: Int = UringTransport.possibleCPUs(),
                calls: RingCalls = .kernel, logger: Logger, dispatcher: @escaping Dispatcher, reader: @escaping Reader,
                failed: @escaping @Sendable () -> Void) throws {
        self.fuseFD = fuseFD
        self.payloadCapacity = payloadCapacity
        self.calls = calls
        self.logger = logger
        self.dispatcher = dispatcher
        self.reader = reader
        self.failed = failed
        var queues: [Queue] = []
        for index in 0..<queueCount {
            queues.append(try Queue(index: index, depth: Self.depth, payloadCapacity: payloadCapacity))
        }
        self.queues = queues
    }

    /// The kernel makes one queue per possible CPU (not per online one).
    public static func possibleCPUs() -> Int {
        guard let text = try? KernelFiles.read("/sys/devices/system/cpu/possible") else {
            return Int(sysconf(Int32(_SC_NPROCESSORS_CONF)))
        }
        // "0-3" or "0": the highest number plus one.
        let last = String(decoding: text, as: UTF8.self)
            .split(whereSeparator: { $0 == "," || $0 == "-" || $0 == "\n" }).last.flatMap { Int($0) }
        return (last ?? 0) + 1
    }

    /// Starts the queues' threads, which register their entries: call once the INIT
    /// reply asking for io_uring has been written.
    public func start() {
        for queue in queues {
            let started = calls.startThread(queue) { self.serve(queue) }
            if started != 0 { fail(queue, RingFailure(call: "pthread_create", code: started)) }
        }
    }

    /// Ends the threads: after the unmount, whose abort of the connection ends every
    /// entry (a thread that ended its ring while the mount lived would stall it; one that
    /// failed has ended already, and had the mount end).
    public func stop() {
        handedOff.wait()
        for queue in queues { queue.stop() }
    }

    /// Takes the reply to the request `ticket` names: writes it into that entry's buffers
    /// and has its thread commit it. Returns the bytes the reply counts.
    public func reply(_ ticket: RingTicket, error: Int32, _ iov: UnsafePointer<iovec>, count: Int) -> Int {
        guard ticket.queue < queues.count, ticket.entry < queues[ticket.queue].entries.count else {
            logger.error("io_uring: a reply names queue \(ticket.queue) entry \(ticket.entry), which do not exist: dropped")
            return Self.outHeaderSize
        }
        let queue = queues[ticket.queue], entry = queue.entries[ticket.entry]
        return Self.outHeaderSize + handOn(queue, entry, entry.takeReply(error: error, iov, count: count))
    }

    /// After a reply was written into `entry` (`written`: its payload's size and whether
    /// the ring's thread commits it; nil if the request had its reply already): a reply
    /// that came while its thread dispatches is committed by that thread; a later one
    /// (from another thread) wakes it to commit. Returns the payload's size.
    private func handOn(_ queue: Queue, _ entry: Entry, _ written: (size: Int, dispatcherCommits: Bool)?) -> Int {
        guard let (size, dispatcherCommits) = written else {
            logger.error("io_uring queue \(queue.index) entry \(entry.index): a second reply to one request: dropped")
            return 0
        }
        if !dispatcherCommits { queue.commitLater(entry.index) }
        return size
    }

    /// The thread of `queue`: the only one that submits to its ring (the kernel copies
    /// each request in the context of the thread that submitted its entry).
    private func serve(_ queue: Queue) {
        // Bound to the CPU whose requests the queue gets: the caller of a request and the
        // thread that answers it then share a CPU, and while the thread looks for the
        // next request (`spinForCompletion`) the caller it woke runs there at once, with
        // no other CPU to wake. fio 4 KiB on a 2-vCPU guest: randwrite 21 k → 35 k IOPS,
        // randread 31 k → 45 k (docs/PERFORMANCE.md). Where the CPU is offline or outside
        // this process's set, the thread runs wherever the scheduler puts it.
        _ = clinux_bind_thread_to_cpu(Int32(queue.index))
        var toWipe: [Entry] = []
        do {
            try run(queue, &toWipe)
        } catch {
            fail(queue, error)
        }
    }

    /// A ring call that failed, so that its queue cannot go on: the call and its errno.
    public struct RingFailure: Error {
        let call: String
        let code: Int32
    }

    /// Logs why `queue` cannot go on, once, and has the mount end (once for all queues),
    /// from a thread of its own: the caller may be one of libfuse's workers (`start` runs
    /// inside the INIT reply), which the loop's end cancels.
    private func fail(_ queue: Queue, _ failure: RingFailure) {
        logger.error("""
            io_uring queue \(queue.index): \(failure.call) failed (\(Errno(failure.code).text)); this CPU's requests cannot be served any more, so \
            the mount ends
            """)
        if !hasFailed.exchange(true, ordering: .acquiringAndReleasing) { DispatchQueue.global().async(execute: failed) }
    }

    /// Serves `queue` until the mount goes away or `stop`; throws what stopped it otherwise.
    /// `toWipe` lists the entries whose commit is queued and whose reply is to be wiped
    /// once the kernel has taken it.
    private func run(_ queue: Queue, _ toWipe: inout [Entry]) throws(RingFailure) {
        let enabled = calls.enable(queue.ring)
        guard enabled == 0 else { throw RingFailure(call: "io_uring_register(ENABLE_RINGS)", code: -enabled) }
        for entry in queue.entries { try submit(queue, Self.register, entry, &toWipe) }
        try submitWake(queue)
        var live = queue.entries.count
        var stopping = false
        while live > 0 && !stopping {
            // The commits queued go in with the first look for a completion (or, where
            // the thread does not look, just before it sleeps), and the kernel takes each
            // reply as its commit is submitted. The replies that carry file contents or
            // names are wiped then, before the thread sleeps or dispatches again: none
            // stays in an idle entry (a lock must leave none in memory), at no system
            // call of its own. While other threads serve reads of this queue, their
            // replies wake the thread (`commitLater`): it sleeps at once rather than
            // look for requests on the CPU those threads need.
            let found = queue.readsElsewhere.load(ordering: .relaxed) == 0 ? try spinForCompletion(queue) : false
            if !found {
                if clinux_uring_unsubmitted(queue.ring) > 0 { try enter(queue, wait: 0) }
                wipeTakenReplies(queue, &toWipe)
                try enter(queue, wait: 1)
            }
            wipeTakenReplies(queue, &toWipe)
            var tag: UInt64 = 0
            var result: Int32 = 0
            while calls.nextCompletion(queue.ring, &tag, &result) {
                if tag == Self.wakeTag {
                    guard result >= 0 else { throw RingFailure(call: "the poll of the wake-up descriptor", code: -result) }
                    var count: UInt64 = 0
                    _ = Glibc.read(queue.wake, &count, 8)
                    stopping = queue.stopping.load(ordering: .acquiring)
                    for index in queue.takeCommits() { try submit(queue, Self.commitAndFetch, queue.entries[index], &toWipe) }
                    if !stopping { try submitWake(queue) }
                    continue
                }
                let entry = queue.entries[Int(tag)]
                switch result {
                case 0:
                    try dispatch(queue, entry, &toWipe)
                case -EAGAIN, -EINTR:
                    // A register before the kernel finished INIT: again.
                    try submit(queue, entry.commitID == 0 ? Self.register : Self.commitAndFetch, entry, &toWipe)
                case -ENOTCONN, -ECONNABORTED, -ENODEV:
                    // The mount went away: the entry ends, and with the last the thread.
                    live -= 1
                default:
                    // The kernel refused the entry's command: the queue goes on with the
                    // entries left (the kernel serves with those), and fails with none.
                    live -= 1
                    guard live > 0 else { throw RingFailure(call: "every entry's command (the last)", code: -result) }
                    logger.warning("""
                        io_uring queue \(queue.index): the kernel ended entry \(entry.index)'s command (\(Errno(-result).text)); the queue goes on \
                        with \(live) entries
                        """)
                }
            }
        }
    }

    /// Submits what is queued and, with `wait`, waits for a completion.
    private func enter(_ queue: Queue, wait: UInt32) throws(RingFailure) {
        let entered = calls.enter(queue.ring, wait)
        guard entered >= 0 else { throw RingFailure(call: "io_uring_enter", code: -entered) }
    }

    /// How long a ring thread looks for the next request before it sleeps. A thread
    /// that sleeps at once leaves its CPU idle, and the scheduler then wakes the caller
    /// of the request just answered on that idle CPU: an inter-processor interrupt per
    /// request, which doubled a 4 KiB write's round trip on a 2-vCPU guest
    /// (docs/PERFORMANCE.md). The price: up to this much CPU after the last request of
    /// a burst.
    static let spinSeconds = 50e-6

    /// Looks for a completion without sleeping for a while; true if one came.
    private func spinForCompletion(_ queue: Queue) throws(RingFailure) -> Bool {
        let deadline = Sys.monotonicNow() + Self.spinSeconds
        repeat {
            let found = calls.collect(queue.ring)
            guard found >= 0 else { throw RingFailure(call: "io_uring_enter", code: -found) }
            if found > 0 { return true }
        } while Sys.monotonicNow() < deadline
        return false
    }

    /// Wipes the replies listed in `toWipe` once every commit queued has been submitted
    /// (until then the kernel may not have taken them all).
    private func wipeTakenReplies(_ queue: Queue, _ toWipe: inout [Entry]) {
        guard !toWipe.isEmpty, clinux_uring_unsubmitted(queue.ring) == 0 else { return }
        toWipe.forEach { $0.scrub() }
        toWipe.removeAll(keepingCapacity: true)
    }

    /// Lays the request in `entry` out as /dev/fuse would have given it — its header and
    /// the operation's header just before the payload, in the slack the entry keeps
    /// there, with the entry's ticket for its unique ID — and has libfuse dispatch it, or
    /// serves it (a read); commits the reply if it came meanwhile.
    private func dispatch(_ queue: Queue, _ entry: Entry, _ toWipe: inout [Entry]) throws(RingFailure) {
        // Its last reply, if still listed to be wiped (another commit was not submitted
        // yet), is wiped now: the kernel has taken it (it put this request in), and from
        // here a worker writes the next reply into the entry, which a later wipe of the
        // list would race with (ThreadSanitizer saw it) and could zero.
        if let listed = toWipe.firstIndex(where: { $0 === entry }) {
            entry.scrub()
            toWipe.remove(at: listed)
        }
        let ring = entry.ringHeader
        let header = entry.inOut.load(as: fuse_in_header.self)
        let payloadSize = Int(ring.pointee.ring_ent_in_out.payload_sz)
        let opSize = Int(header.len) - Self.inHeaderSize - payloadSize
        entry.commitID = ring.pointee.ring_ent_in_out.commit_id
        entry.opcode = header.opcode
        guard (0...Int(CLINUX_FUSE_URING_OP_IN_OUT_SZ)).contains(opSize), payloadSize <= payloadCapacity else {
            // Not a request this code understands: refused, and the entry goes on.
            entry.setReply(unique: header.unique, error: -EIO, size: 0)
            return try submit(queue, Self.commitAndFetch, entry, &toWipe)
        }
        entry.handOver.begin(header.unique)
        if header.opcode == FUSE_READ.rawValue {
            let request = entry.opIn.load(as: fuse_read_in.self)
            if request.size >= Self.handOffSize {
                // The thread goes on fetching while another reads and deciphers:
                // readahead has the next request of a stream waiting, whose ciphertext
                // is read from the disk meanwhile.
                handedOff.enter()
                queue.readsElsewhere.add(1, ordering: .relaxed)
                DispatchQueue.global().async { [self] in
                    serveRead(queue, entry, header, request)
                    queue.readsElsewhere.subtract(1, ordering: .relaxed)
                    handedOff.leave()
                }
            } else {
                serveRead(queue, entry, header, request)
            }
        } else {
            let slack = Self.inHeaderSize + opSize, start = entry.payload - slack
            (start + Self.inHeaderSize).copyMemory(from: entry.opIn, byteCount: opSize)
            start.copyMemory(from: entry.inOut, byteCount: Self.inHeaderSize)
            start.storeBytes(of: RingTicket(queue: queue.index, entry: entry.index).unique, toByteOffset: Self.uniqueOffset,
                             as: UInt64.self)
            dispatcher(start, Int(header.len))
        }
        if entry.handOver.finish() { try submit(queue, Self.commitAndFetch, entry, &toWipe) }
    }

    /// Serves the read `request` that came in `entry`: the reader puts the plaintext in
    /// the entry's payload, where the reply goes out from; the reply's header is written
    /// here.
    private func serveRead(_ queue: Queue, _ entry: Entry, _ header: fuse_in_header, _ read: fuse_read_in) {
        let request = ReadRequest(unique: header.unique, node: header.nodeid, pid: header.pid, handle: read.fh,
                                  offset: Int64(bitPattern: read.offset), size: Int(read.size))
        let result = request.size <= payloadCapacity
            ? reader(request, UnsafeMutableRawBufferPointer(start: entry.payload, count: request.size))
            : -Int(EIO)
        _ = handOn(queue, entry, entry.replyInPlace(error: result < 0 ? Int32(result) : 0, size: max(result, 0)))
    }

    private func submit(_ queue: Queue, _ command: UInt32, _ entry: Entry, _ toWipe: inout [Entry]) throws(RingFailure) {
        if command == Self.commitAndFetch {
            if entry.reply.size > 0 && Self.repliesWithContents.contains(entry.opcode) {
                toWipe.append(entry)
            } else {
                entry.reply = (0, 0)
            }
        }
        let commitID = command == Self.commitAndFetch ? entry.commitID : 0
        let buffers = command == Self.register ? UnsafePointer(entry.iov) : nil
        // The ring has a slot per entry and one for the wake-up: full means a bug.
        let queued = calls.command(queue.ring, fuseFD, command, UInt16(queue.index), commitID, buffers, UInt64(entry.index))
        guard queued == 0 else { throw RingFailure(call: "a ring command's submission", code: -queued) }
    }

    private func submitWake(_ queue: Queue) throws(RingFailure) {
        let queued = calls.pollInput(queue.ring, queue.wake, Self.wakeTag)
        guard queued == 0 else { throw RingFailure(call: "the wake-up poll's submission", code: -queued) }
    }
}

/// The unique ID a ring request carries through libfuse to its reply, in place of the
/// kernel's: the queue and the entry it came in. Its top bit tells it from the kernel's
/// IDs (a counter, far below it) and it is even (odd IDs are interrupts' replies).
public struct RingTicket: Equatable, Sendable {
    public let queue: Int
    public let entry: Int
    private static let mark: UInt64 = 1 << 63

    public init(queue: Int, entry: Int) {
        precondition(queue < 1 << 31 && entry < 1 << 31, "RingTicket: queue or entry out of range")
        self.queue = queue
        self.entry = entry
    }

    /// The ticket a reply's unique ID is, or nil for a request that came through /dev/fuse.
    public init?(unique: UInt64) {
        guard unique & Self.mark != 0, unique & 1 == 0 else { return nil }
        queue = Int((unique & ~Self.mark) >> 32)
        entry = Int((unique & 0xFFFF_FFFF) >> 1)
    }

    public var unique: UInt64 { Self.mark | UInt64(queue) << 32 | UInt64(entry) << 1 }
}

extension UringTransport {
    /// The ring calls a queue's thread makes (uring.c's, returning what those return: 0
    /// or a count, else -errno) and how the thread is started (pthread_create's result):
    /// given at init, so that a test can make one fail.
    public struct RingCalls: Sendable {
        var enable: @Sendable (OpaquePointer) -> Int32 = { clinux_uring_enable($0) }
        var command: @Sendable (_ ring: OpaquePointer, _ fuseFD: Int32, _ command: UInt32, _ queue: UInt16, _ commitID: UInt64,
                                _ buffers: UnsafePointer<iovec>?, _ tag: UInt64) -> Int32 = {
            clinux_uring_fuse_command($0, $1, $2, $3, $4, $5, $6)
        }
        var pollInput: @Sendable (_ ring: OpaquePointer, _ fd: Int32, _ tag: UInt64) -> Int32 = { clinux_uring_poll_input($0, $1, $2) }
        var enter: @Sendable (_ ring: OpaquePointer, _ wait: UInt32) -> Int32 = { clinux_uring_enter($0, $1) }
        /// 1 if a completion is there, 0 if not, or -errno.
        var collect: @Sendable (OpaquePointer) -> Int32 = { clinux_uring_collect($0) }
        var nextCompletion: @Sendable (_ ring: OpaquePointer, _ tag: inout UInt64, _ result: inout Int32) -> Bool = {
            clinux_uring_next_completion($0, &$1, &$2) == 1
        }
        /// Starts `body` on the queue's own thread: 0, or pthread_create's error.
        var startThread: @Sendable (Queue, @escaping @Sendable () -> Void) -> Int32 = { queue, body in queue.start(body) }

        public static let kernel = RingCalls()

        public init() {}
    }

    /// Who commits an entry's reply, handed over between the ring's thread, which
    /// dispatches the entry's request, and the thread that replies to it (the same one,
    /// or one that serves a large read): whichever of the two comes second.
    ///
    ///     ring's thread: begin(unique) … dispatch …                 finish(): true → commit now
    ///     replier:                  claim() … write reply … replied(): true → the ring's thread commits
    ///                                                                 false → hand the commit to it
    ///
    /// `claim` lets one reply in per request. A reply that comes before `finish` leaves
    /// the commit to `finish`; one after `finish` (state `awaiting`) hands it to the
    /// ring's thread through `Queue.commitLater`. Tested alone in RingHandOverTests.
    final class HandOver: Sendable {
        static let idle = 0, dispatching = 1, replied = 2, awaiting = 3
        private let state = Atomic<Int>(HandOver.idle)
        /// The kernel's ID of the request being served, until a reply claims it; else 0.
        private let unique = Atomic<UInt64>(0)

        /// The ring's thread, before it dispatches request `unique`.
        func begin(_ unique: UInt64) {
            state.store(Self.dispatching, ordering: .releasing)
            self.unique.store(unique, ordering: .releasing)
        }

        /// A replier, before it writes the reply: the request's ID, or nil if a reply has
        /// claimed it already (or none is being served).
        func claim() -> UInt64? {
            let held = unique.exchange(0, ordering: .acquiringAndReleasing)
            return held == 0 ? nil : held
        }

        /// A replier, once its reply is written: true if the ring's thread is still
        /// dispatching and will commit it, false if the replier must hand it the commit.
        func replied() -> Bool {
            if state.compareExchange(expected: Self.dispatching, desired: Self.replied, ordering: .acquiringAndReleasing).exchanged {
                return true
            }
            state.store(Self.idle, ordering: .releasing)
            return false
        }

        /// The ring's thread, once the dispatch returns: true if the reply came meanwhile
        /// (commit it now), false if it comes later, from another thread.
        func finish() -> Bool {
            if state.compareExchange(expected: Self.dispatching, desired: Self.awaiting, ordering: .acquiringAndReleasing).exchanged {
                return false
            }
            state.store(Self.idle, ordering: .releasing)
            return true
        }

        /// Where the hand-over stands (for tests).
        var current: Int { state.load(ordering: .acquiring) }
    }

    /// One registered request slot: a header buffer (struct fuse_uring_req_header) and a
    /// payload buffer, with a page of slack before the payload where a request is laid
    /// out whole.
    ///
    /// Sendable: its buffers are one mapping, made in init and never moved; who writes
    /// into them when is the hand-over's order (a request's bytes by the kernel, then its
    /// reply by one replier, then the wipe by the ring's thread). The rest is atomic: the
    /// ring's thread reads what a replier on another thread wrote, after the hand-over.
    final class Entry: Sendable {
        /// The header buffer's page, then the slack's.
        private static let payloadOffset = 2 * 4096
        let index: Int
        /// The mapping's start; immutable, and the bytes it holds are shared in the
        /// hand-over's order, which no type can state.
        nonisolated(unsafe) private let base: UnsafeMutableRawPointer
        private let mappingSize: Int
        /// The kernel's iovecs of the header and payload buffers, for the register
        /// command; written in init only.
        nonisolated(unsafe) let iov: UnsafeMutablePointer<iovec>
        let payloadCapacity: Int
        let handOver = HandOver()
        private let commitIDValue = Atomic<UInt64>(0)
        private let opcodeValue = Atomic<UInt32>(0)
        private let replyUnique = Atomic<UInt64>(0)
        private let replySize = Atomic<Int>(0)

        init(index: Int, payloadCapacity: Int) throws {
            self.index = index
            self.payloadCapacity = payloadCapacity
            mappingSize = Self.payloadOffset + payloadCapacity
            guard let base = mmap(nil, mappingSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), base != MAP_FAILED
            else { throw Errno.current("mmap") }
            self.base = base
            iov = .allocate(capacity: 2)
            iov[0] = iovec(iov_base: base, iov_len: MemoryLayout<clinux_fuse_uring_req_header>.size)
            iov[1] = iovec(iov_base: base + Self.payloadOffset, iov_len: payloadCapacity)
        }

        deinit {
            // Pages given back are zeroed by the kernel before anyone else gets them.
            munmap(base, mappingSize)
            iov.deallocate()
        }

        var ringHeader: UnsafeMutablePointer<clinux_fuse_uring_req_header> {
            base.assumingMemoryBound(to: clinux_fuse_uring_req_header.self)
        }
        /// The request's header (struct fuse_in_header), then the reply's (fuse_out_header).
        var inOut: UnsafeMutableRawPointer { base + MemoryLayout<clinux_fuse_uring_req_header>.offset(of: \.in_out)! }
        /// The operation's own header (struct fuse_read_in…).
        var opIn: UnsafeMutableRawPointer { base + MemoryLayout<clinux_fuse_uring_req_header>.offset(of: \.op_in)! }
        var payload: UnsafeMutableRawPointer { base + Self.payloadOffset }

        /// What the kernel asked to be given back with the reply (its thread only).
        var commitID: UInt64 {
            get { commitIDValue.load(ordering: .relaxed) }
            set { commitIDValue.store(newValue, ordering: .relaxed) }
        }
        /// The operation of the request it holds (its thread only).
        var opcode: UInt32 {
            get { opcodeValue.load(ordering: .relaxed) }
            set { opcodeValue.store(newValue, ordering: .relaxed) }
        }
        /// The unique and payload size of the reply last written here, until wiped:
        /// written by the replying thread before it hands the entry on (`handOver`).
        var reply: (unique: UInt64, size: Int) {
            get { (replyUnique.load(ordering: .relaxed), replySize.load(ordering: .relaxed)) }
            set {
                replyUnique.store(newValue.unique, ordering: .relaxed)
                replySize.store(newValue.size, ordering: .relaxed)
            }
        }

        /// Writes the reply header (the payload, `size` bytes, is already in place) and
        /// notes the reply for `scrub`.
        func setReply(unique: UInt64, error: Int32, size: Int) {
            var out = fuse_out_header(len: UInt32(UringTransport.outHeaderSize + size), error: error, unique: unique)
            inOut.copyMemory(from: &out, byteCount: UringTransport.outHeaderSize)
            ringHeader.pointee.ring_ent_in_out.payload_sz = UInt32(size)
            reply = (unique, size)
        }

        /// Takes libfuse's reply (`iov[0]` its header, the rest the payload) to the
        /// request the entry is serving: copies the payload in, writes the header with the
        /// kernel's ID, and hands the entry over. The payload's size and whether the ring's
        /// thread commits it; nil if the request has had its reply.
        func takeReply(error: Int32, _ iov: UnsafePointer<iovec>, count: Int) -> (size: Int, dispatcherCommits: Bool)? {
            guard let unique = handOver.claim() else { return nil }
            var size = 0
            var error = error
            for i in 1..<max(count, 1) where error == 0 {
                guard size + iov[i].iov_len <= payloadCapacity else { error = -EIO; break }
                if let base = iov[i].iov_base, base != UnsafeRawPointer(payload + size) {
                    (payload + size).copyMemory(from: base, byteCount: iov[i].iov_len)
                }
                size += iov[i].iov_len
            }
            return handOn(unique: unique, error: error, size: error == 0 ? size : 0)
        }

        /// The reply to a request served in place: its payload, `size` bytes, is in the
        /// entry already (a read's). As `takeReply`.
        func replyInPlace(error: Int32, size: Int) -> (size: Int, dispatcherCommits: Bool)? {
            guard let unique = handOver.claim() else { return nil }
            return handOn(unique: unique, error: error, size: error == 0 ? size : 0)
        }

        private func handOn(unique: UInt64, error: Int32, size: Int) -> (size: Int, dispatcherCommits: Bool) {
            setReply(unique: unique, error: error, size: size)
            return (size, handOver.replied())
        }

        /// Wipes what is left of the last reply once the kernel has taken it: all of it,
        /// or, if the kernel has already put the next request in (its header then holds
        /// another unique), the part beyond that request. The kernel writes into an entry
        /// only inside its thread's waiting enter (DEFER_TASKRUN), so nothing races this.
        func scrub() {
            let (unique, size) = reply
            reply = (0, 0)
            guard size > 0 else { return }
            let next = inOut.load(fromByteOffset: UringTransport.uniqueOffset, as: UInt64.self) == unique ? 0
                : min(size, Int(ringHeader.pointee.ring_ent_in_out.payload_sz))
            if next < size { explicit_bzero(payload + next, size - next) }
        }
    }

    /// One CPU's ring, its entries, its thread and what wakes it.
    final class Queue: Sendable {
        let index: Int
        /// The ring, made in init and destroyed in deinit; only the queue's thread
        /// submits to it and reaps it (uring.c), which no type can state.
        nonisolated(unsafe) let ring: OpaquePointer
        let entries: [Entry]
        /// An eventfd the thread always has a poll on: written to hand it commits or stop it.
        let wake: Int32
        let stopping = Atomic<Bool>(false)
        /// Reads of this queue being served by other threads (a count the thread only
        /// consults: whether to look for the next request before it sleeps).
        let readsElsewhere = Atomic<Int>(0)
        private let commits = Mutex<[Int]>([])
        private let thread = Mutex<pthread_t?>(nil)

        init(index: Int, depth: Int, payloadCapacity: Int) throws {
            self.index = index
            entries = try (0..<depth).map { try Entry(index: $0, payloadCapacity: payloadCapacity) }
            wake = clinux_eventfd()
            guard wake >= 0 else { throw Errno.current("eventfd") }
            guard let ring = clinux_uring_create(UInt32(depth + 1)) else {
                let error = Errno.current("io_uring_setup")
                close(wake)
                throw error
            }
            self.ring = ring
        }

        /// After the thread has ended (`stop`), which is what holds a queue until then.
        deinit {
            clinux_uring_destroy(ring)
            close(wake)
        }

        /// Starts the thread: 0, or pthread_create's error (and no thread).
        func start(_ body: @escaping @Sendable () -> Void) -> Int32 {
            let box = Unmanaged.passRetained(ThreadBody(body))
            var started = pthread_t()
            let created = pthread_create(&started, nil, { box in
                let body = Unmanaged<ThreadBody>.fromOpaque(box!).takeRetainedValue()
                body.run()
                return nil
            }, box.toOpaque())
            guard created == 0 else {
                box.release()
                return created
            }
            thread.withLock { $0 = started }
            return 0
        }

        func stop() {
            guard let running = thread.withLock({ thread in defer { thread = nil }; return thread }) else { return }
            stopping.store(true, ordering: .releasing)
            wakeThread()
            pthread_join(running, nil)
        }

        /// Hands the thread the commit of `entry` (its reply came from another thread).
        func commitLater(_ entry: Int) {
            commits.withLock { $0.append(entry) }
            wakeThread()
        }

        private func wakeThread() {
            var one: UInt64 = 1
            _ = Glibc.write(wake, &one, 8)
        }

        func takeCommits() -> [Int] { commits.withLock { commits in defer { commits = [] }; return commits } }
    }

    private final class ThreadBody: Sendable {
        let run: @Sendable () -> Void
        init(_ run: @escaping @Sendable () -> Void) { self.run = run }
    }
}

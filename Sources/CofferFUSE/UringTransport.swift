// UringTransport serves a mounted session's requests through FUSE over io_uring
// (Linux 6.14 and later): one ring per possible CPU, as the kernel queues requests by the
// CPU of the caller, each served by one thread. The thread registers its entries' buffers
// with the kernel, lays each request it receives out as /dev/fuse would have given it,
// has libfuse dispatch it (a large read on another thread), and commits the reply
// together with the fetch of the next request, in one system call. /dev/fuse still
// carries INIT, FORGET, INTERRUPT and the notifications; SessionIO sends each reply the
// way its request came.
//
// A reply goes into the buffer its request came in: a handler must not touch the
// request's bytes once it has replied (FuseOperations.write zeroes the plaintext first);
// a read may decipher straight into it (`replyArea`).
import CFuse
import CLinux
import CofferSystem
import Dispatch
import Glibc
import Synchronization

/// Sendable, unchecked: the queues and their entries are made in init and only read
/// afterwards; what threads share in an entry is atomic, and the rest of an entry is
/// touched by one thread at a time, in the order its `state` gives.
final class UringTransport: @unchecked Sendable {
    /// Requests each CPU's queue holds at once.
    static let depth = 8
    /// The kernel's command numbers (enum fuse_uring_cmd).
    private static let register: UInt32 = 1, commitAndFetch: UInt32 = 2
    /// Offsets in an entry's header buffer (struct fuse_uring_req_header): the request's
    /// and the reply's header, the operation's own header, the kernel's commit ID and
    /// the payload's size.
    private static let uniqueOffset = 8, opHeaderOffset = 128, commitIDOffset = 264, payloadSizeOffset = 272
    private static let inHeaderSize = MemoryLayout<fuse_in_header>.size
    private static let outHeaderSize = MemoryLayout<fuse_out_header>.size
    /// Where a read's size is in its operation header (struct fuse_read_in).
    private static let readSizeOffset = 16
    /// Reads of at least this many bytes are served by other threads (the queue's thread
    /// would otherwise wait for their disk and cipher alone); smaller ones in place,
    /// where a hand-off's wake-ups would cost more than they save. Writes stay in place:
    /// a writer waits for each, so there is nothing to overlap them with.
    static let handOffSize = UInt32(64 << 10)
    /// The operations whose replies carry file contents, names or xattr values: their
    /// bytes are wiped once the kernel has taken them (the others carry attributes,
    /// counts and handles).
    private static let repliesWithContents = Set([FUSE_READ, FUSE_READDIR, FUSE_READDIRPLUS, FUSE_READLINK,
                                                  FUSE_GETXATTR, FUSE_LISTXATTR].map(\.rawValue))
    /// A completion of the queue's wake-up descriptor, not of an entry.
    private static let wakeTag = UInt64.max

    /// True if this kernel serves FUSE over io_uring (the module's switch is on) and
    /// this process may make a ring; why not, otherwise.
    static func unavailableReason() -> String? {
        guard (try? Sys.readToEnd("/sys/module/fuse/parameters/enable_uring"))?.first == UInt8(ascii: "Y") else {
            return "this kernel does not serve FUSE over io_uring (it needs Linux 6.14 or later with /sys/module/fuse/parameters/enable_uring set to 1)"
        }
        let ring = clinux_uring_create(2)
        defer { clinux_uring_destroy(ring) }
        let code = ring == nil ? Errno.current("io_uring_setup").code : -clinux_uring_enable(ring)
        return code == 0 ? nil : "io_uring is refused to this process (\(Errno(code).text))"
    }

    private let session: OpaquePointer
    /// Large reads handed to other threads and not yet answered (`stop` waits for them).
    private let handedOff = DispatchGroup()
    private let fuseFD: Int32
    private let queues: [Queue]
    /// Bytes an entry's payload holds: what the kernel requires of it.
    private let payloadCapacity: Int

    /// Makes one ring per possible CPU with `depth` entries of `payloadCapacity` bytes;
    /// nothing reaches the kernel before `start`.
    init(session: OpaquePointer, fuseFD: Int32, payloadCapacity: Int) throws {
        self.session = session
        self.fuseFD = fuseFD
        self.payloadCapacity = payloadCapacity
        var queues: [Queue] = []
        for index in 0..<Self.possibleCPUs() {
            queues.append(try Queue(index: index, depth: Self.depth, payloadCapacity: payloadCapacity))
        }
        self.queues = queues
    }

    /// The kernel makes one queue per possible CPU (not per online one).
    private static func possibleCPUs() -> Int {
        guard let text = try? Sys.readToEnd("/sys/devices/system/cpu/possible") else {
            return Int(sysconf(Int32(_SC_NPROCESSORS_CONF)))
        }
        // "0-3" or "0": the highest number plus one.
        let last = String(decoding: text, as: UTF8.self)
            .split(whereSeparator: { $0 == "," || $0 == "-" || $0 == "\n" }).last.flatMap { Int($0) }
        return (last ?? 0) + 1
    }

    /// Starts the queues' threads, which register their entries: call once the INIT
    /// reply asking for io_uring has been written.
    func start() {
        for queue in queues { queue.start { self.serve(queue) } }
    }

    /// Ends the threads: after the unmount, whose abort of the connection ends every
    /// entry (a thread that ended its ring while the mount lived would stall it).
    func stop() {
        handedOff.wait()
        for queue in queues { queue.stop() }
    }

    /// Takes the reply to a request that came through a ring: writes it into the
    /// entry's buffers and has its thread commit it. Nil if no ring holds `unique`.
    func reply(unique: UInt64, error: Int32, _ iov: UnsafePointer<iovec>, count: Int) -> Int? {
        // A notification (unique 0) or an interrupt's reply (odd) never came through a ring.
        guard unique != 0, unique & 1 == 0 else { return nil }
        for queue in queues {
            for entry in queue.entries where entry.unique.load(ordering: .acquiring) == unique {
                guard entry.unique.compareExchange(expected: unique, desired: 0, ordering: .acquiringAndReleasing).exchanged
                else { continue }
                var size = 0
                var error = error
                for i in 1..<max(count, 1) where error == 0 {
                    guard size + iov[i].iov_len <= payloadCapacity else { error = -EIO; break }
                    // A read's data is already in place (`replyArea`).
                    if let base = iov[i].iov_base, base != UnsafeRawPointer(entry.payload + size) {
                        (entry.payload + size).copyMemory(from: base, byteCount: iov[i].iov_len)
                    }
                    size += iov[i].iov_len
                }
                if error != 0 { size = 0 }
                entry.setReply(unique: unique, error: error, size: size)
                // Replied while its thread dispatches it: the thread commits it. Later (a
                // reply from another thread), the thread is woken to commit it.
                if !entry.state.compareExchange(expected: Entry.dispatching, desired: Entry.replied,
                                                ordering: .acquiringAndReleasing).exchanged {
                    entry.state.store(Entry.idle, ordering: .releasing)
                    queue.commitLater(entry.index)
                }
                return Self.outHeaderSize + size
            }
        }
        return nil
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
        guard clinux_uring_enable(queue.ring) == 0 else { return }
        for entry in queue.entries { submit(queue, Self.register, entry) }
        submitWake(queue)
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
            let spin = queue.readsElsewhere.load(ordering: .relaxed) == 0
            if !(spin && spinForCompletion(queue)) {
                if clinux_uring_unsubmitted(queue.ring) > 0, clinux_uring_enter(queue.ring, 0) < 0 { break }
                wipeTakenReplies(queue)
                if clinux_uring_enter(queue.ring, 1) < 0 { break }
            }
            wipeTakenReplies(queue)
            var tag: UInt64 = 0
            var result: Int32 = 0
            while clinux_uring_next_completion(queue.ring, &tag, &result) == 1 {
                if tag == Self.wakeTag {
                    var count: UInt64 = 0
                    _ = Glibc.read(queue.wake, &count, 8)
                    stopping = queue.stopping.load(ordering: .acquiring)
                    for index in queue.takeCommits() { submit(queue, Self.commitAndFetch, queue.entries[index]) }
                    if !stopping { submitWake(queue) }
                    continue
                }
                let entry = queue.entries[Int(tag)]
                switch result {
                case 0:
                    dispatch(queue, entry)
                case -EAGAIN, -EINTR:
                    // A register before the kernel finished INIT: again.
                    submit(queue, entry.commitID == 0 ? Self.register : Self.commitAndFetch, entry)
                default:
                    // -ENOTCONN, -ECONNABORTED: the mount went away. Anything else ends
                    // the entry too; the kernel then serves with the ones left.
                    live -= 1
                }
            }
        }
    }

    /// How long a ring thread looks for the next request before it sleeps. A thread
    /// that sleeps at once leaves its CPU idle, and the scheduler then wakes the caller
    /// of the request just answered on that idle CPU: an inter-processor interrupt per
    /// request, which doubled a 4 KiB write's round trip on a 2-vCPU guest
    /// (docs/PERFORMANCE.md). The price: up to this much CPU after the last request of
    /// a burst.
    static let spinSeconds = 50e-6

    /// Looks for a completion without sleeping for a while; true if one came.
    private func spinForCompletion(_ queue: Queue) -> Bool {
        let deadline = Sys.monotonicNow() + Self.spinSeconds
        repeat {
            let found = clinux_uring_collect(queue.ring)
            if found != 0 { return found > 0 }
        } while Sys.monotonicNow() < deadline
        return false
    }

    /// Wipes the replies listed in `toWipe` once every commit queued has been submitted
    /// (until then the kernel may not have taken them all).
    private func wipeTakenReplies(_ queue: Queue) {
        guard !queue.toWipe.isEmpty, clinux_uring_unsubmitted(queue.ring) == 0 else { return }
        queue.toWipe.forEach(scrub)
        queue.toWipe.removeAll(keepingCapacity: true)
    }

    /// Wipes what is left of `entry`'s last reply once the kernel has taken it: all of
    /// it, or, if the kernel has already put the next request in (its header then holds
    /// another unique), the part beyond that request. The kernel writes into an entry
    /// only inside this thread's waiting enter (DEFER_TASKRUN), so nothing races this.
    private func scrub(_ entry: Entry) {
        let (unique, size) = entry.reply
        entry.reply = (0, 0)
        guard size > 0 else { return }
        let next = entry.header.load(fromByteOffset: Self.uniqueOffset, as: UInt64.self) == unique ? 0
            : min(size, Int(entry.header.load(fromByteOffset: Self.payloadSizeOffset, as: UInt32.self)))
        if next < size { explicit_bzero(entry.payload + next, size - next) }
    }

    /// Lays the request in `entry` out as /dev/fuse would have given it — its header and
    /// the operation's header just before the payload, in the slack the entry keeps
    /// there — and has libfuse dispatch it; commits the reply if it came meanwhile.
    private func dispatch(_ queue: Queue, _ entry: Entry) {
        let header = entry.header.load(as: fuse_in_header.self)
        let payloadSize = Int(entry.header.load(fromByteOffset: Self.payloadSizeOffset, as: UInt32.self))
        let opSize = Int(header.len) - Self.inHeaderSize - payloadSize
        entry.commitID = entry.header.load(fromByteOffset: Self.commitIDOffset, as: UInt64.self)
        entry.opcode = header.opcode
        guard (0...128).contains(opSize), payloadSize <= payloadCapacity else {
            // Not a request this code understands: refused, and the entry goes on.
            entry.setReply(unique: header.unique, error: -EIO, size: 0)
            return submit(queue, Self.commitAndFetch, entry)
        }
        let slack = Self.inHeaderSize + opSize, start = entry.payload - slack
        (start + Self.inHeaderSize).copyMemory(from: entry.header + Self.opHeaderOffset, byteCount: opSize)
        start.copyMemory(from: entry.header, byteCount: Self.inHeaderSize)
        entry.state.store(Entry.dispatching, ordering: .releasing)
        entry.unique.store(header.unique, ordering: .releasing)
        let isRead = header.opcode == FUSE_READ.rawValue, length = Int(header.len)
        if isRead && entry.header.load(fromByteOffset: Self.opHeaderOffset + Self.readSizeOffset, as: UInt32.self) >= Self.handOffSize {
            // The thread goes on fetching while another reads and deciphers: readahead
            // has the next request of a stream waiting, whose ciphertext is read from
            // the disk meanwhile.
            handedOff.enter()
            queue.readsElsewhere.add(1, ordering: .relaxed)
            DispatchQueue.global().async { [self] in
                process(entry, length: length, slack: slack, isRead: isRead)
                queue.readsElsewhere.subtract(1, ordering: .relaxed)
                handedOff.leave()
            }
        } else {
            process(entry, length: length, slack: slack, isRead: isRead)
        }
        if !entry.state.compareExchange(expected: Entry.dispatching, desired: Entry.awaiting,
                                        ordering: .acquiringAndReleasing).exchanged {
            entry.state.store(Entry.idle, ordering: .releasing)
            submit(queue, Self.commitAndFetch, entry)
        }
    }

    /// Where the calling thread's reply to the read it is serving goes out, if it serves
    /// one from a ring: the entry's payload. A read handler that puts its data there
    /// saves a copy, and a buffer to wipe (the entry is wiped once the kernel has taken
    /// the reply). Whatever it leaves there without replying with it, it must wipe.
    static func replyArea() -> UnsafeMutableRawBufferPointer? {
        var size = 0
        guard let area = clinux_reply_area(&size) else { return nil }
        return UnsafeMutableRawBufferPointer(start: area, count: size)
    }

    /// Has libfuse dispatch the request laid out in the `slack` bytes before `entry`'s
    /// payload and the payload, `length` bytes in all; a read gets the payload as its
    /// reply area (it has no payload of its own).
    private func process(_ entry: Entry, length: Int, slack: Int, isRead: Bool) {
        var buffer = fuse_buf(size: length, flags: fuse_buf_flags(rawValue: 0), mem: entry.payload - slack, fd: -1, pos: 0)
        clinux_set_reply_area(isRead ? entry.payload : nil, isRead ? payloadCapacity : 0)
        fuse_session_process_buf(session, &buffer)
        clinux_set_reply_area(nil, 0)
    }

    private func submit(_ queue: Queue, _ command: UInt32, _ entry: Entry) {
        if command == Self.commitAndFetch {
            if entry.reply.size > 0 && Self.repliesWithContents.contains(entry.opcode) {
                queue.toWipe.append(entry)
            } else {
                entry.reply = (0, 0)
            }
        }
        let commitID = command == Self.commitAndFetch ? entry.commitID : 0
        let buffers = command == Self.register ? UnsafePointer(entry.iov) : nil
        // The ring has a slot per entry and one for the wake-up: it cannot be full.
        _ = clinux_uring_fuse_command(queue.ring, fuseFD, command, UInt16(queue.index), commitID, buffers, UInt64(entry.index))
    }

    private func submitWake(_ queue: Queue) {
        _ = clinux_uring_poll_input(queue.ring, queue.wake, Self.wakeTag)
    }
}

extension UringTransport {
    /// One registered request slot: a header buffer and a payload buffer, with a page of
    /// slack before the payload where a request is laid out whole.
    final class Entry: @unchecked Sendable {
        static let idle = 0, dispatching = 1, replied = 2, awaiting = 3
        let index: Int
        let mapping: UnsafeMutableRawBufferPointer
        var header: UnsafeMutableRawPointer { mapping.baseAddress! }
        var payload: UnsafeMutableRawPointer { mapping.baseAddress! + 2 * 4096 }
        let iov: UnsafeMutablePointer<iovec>
        /// The request the entry holds until its reply is taken, else 0.
        let unique = Atomic<UInt64>(0)
        let state = Atomic<Int>(Entry.idle)
        /// What the kernel asked to be given back with the reply (its thread only).
        var commitID: UInt64 = 0
        /// The operation of the request it holds (its thread only).
        var opcode: UInt32 = 0
        /// The unique and payload size of the reply last written here, until wiped:
        /// written by the replying thread before it hands the entry on (`state`).
        var reply: (unique: UInt64, size: Int) = (0, 0)

        /// Writes the reply header (the payload, `size` bytes, is already in place) and
        /// notes the reply for `scrub`.
        func setReply(unique: UInt64, error: Int32, size: Int) {
            var out = fuse_out_header(len: UInt32(UringTransport.outHeaderSize + size), error: error, unique: unique)
            header.copyMemory(from: &out, byteCount: UringTransport.outHeaderSize)
            header.storeBytes(of: UInt32(size), toByteOffset: UringTransport.payloadSizeOffset, as: UInt32.self)
            reply = (unique, size)
        }

        init(index: Int, payloadCapacity: Int) throws {
            self.index = index
            let size = 2 * 4096 + payloadCapacity
            guard let base = mmap(nil, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), base != MAP_FAILED
            else { throw Errno.current("mmap") }
            mapping = UnsafeMutableRawBufferPointer(start: base, count: size)
            iov = .allocate(capacity: 2)
            iov[0] = iovec(iov_base: base, iov_len: 288)
            iov[1] = iovec(iov_base: base + 2 * 4096, iov_len: payloadCapacity)
        }

        deinit {
            // Pages given back are zeroed by the kernel before anyone else gets them.
            munmap(mapping.baseAddress!, mapping.count)
            iov.deallocate()
        }
    }

    /// One CPU's ring, its entries, its thread and what wakes it.
    final class Queue: @unchecked Sendable {
        let index: Int
        let ring: OpaquePointer
        let entries: [Entry]
        /// An eventfd the thread always has a poll on: written to hand it commits or stop it.
        let wake: Int32
        let stopping = Atomic<Bool>(false)
        /// Reads of this queue being served by other threads (a count the thread only
        /// consults: whether to look for the next request before it sleeps).
        let readsElsewhere = Atomic<Int>(0)
        /// Entries whose commit is queued and whose reply is to be wiped once the kernel
        /// has taken it (the thread's only).
        var toWipe: [Entry] = []
        private let commits = Mutex<[Int]>([])
        private var thread: pthread_t?

        init(index: Int, depth: Int, payloadCapacity: Int) throws {
            self.index = index
            entries = try (0..<depth).map { try Entry(index: $0, payloadCapacity: payloadCapacity) }
            wake = clinux_eventfd()
            guard wake >= 0 else { throw Errno.current("eventfd") }
            guard let ring = clinux_uring_create(UInt32(depth + 1)) else {
                close(wake)
                throw Errno.current("io_uring_setup")
            }
            self.ring = ring
        }

        /// After the thread has ended (`stop`), which is what holds a queue until then.
        deinit {
            clinux_uring_destroy(ring)
            close(wake)
        }

        func start(_ body: @escaping @Sendable () -> Void) {
            let box = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
            var thread = pthread_t()
            pthread_create(&thread, nil, { box in
                let body = Unmanaged<ThreadBody>.fromOpaque(box!).takeRetainedValue()
                body.run()
                return nil
            }, box)
            self.thread = thread
        }

        func stop() {
            guard let thread else { return }
            stopping.store(true, ordering: .releasing)
            wakeThread()
            pthread_join(thread, nil)
            self.thread = nil
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


// The io_uring transport's lock-free hand-overs, without a kernel: the ticket a request
// carries to its reply, the entry's dispatching → replied hand-over (alone and under many
// threads), the reply written into the entry, and the entry's layout against the kernel's.
import CFuse
import CLinux
@testable import CofferFUSE
@testable import CofferUring
import Dispatch
import Foundation
import Glibc
import Synchronization
import XCTest

final class RingHandOverTests: XCTestCase {
    typealias HandOver = UringTransport.HandOver

    // MARK: The ticket

    func testATicketNamesItsEntryAndIsNeverAnIDOfTheKernels() {
        for (queue, entry) in [(0, 0), (1, 7), (255, 3), (8191, 7), (Int(Int32.max), Int(Int32.max))] {
            let ticket = RingTicket(queue: queue, entry: entry)
            XCTAssertEqual(RingTicket(unique: ticket.unique), ticket, "queue \(queue) entry \(entry)")
            XCTAssertEqual(ticket.unique & 1, 0, "a ticket is even: odd IDs are interrupts' replies")
        }
        // The kernel's IDs (a counter from 2 in steps of 2), interrupts' (odd) and
        // notifications' (0) go to /dev/fuse.
        for unique: UInt64 in [0, 1, 2, 3, 4, 1 << 40, (1 << 62) + 2, (1 << 63) | 1] {
            XCTAssertNil(RingTicket(unique: unique), "\(unique)")
        }
    }

    // MARK: The hand-over, one step at a time

    func testAReplyDuringTheDispatchIsCommittedByTheRingsThread() {
        let handOver = HandOver()
        handOver.begin(42)
        XCTAssertEqual(handOver.claim(), 42)
        XCTAssertTrue(handOver.replied(), "the ring's thread, still dispatching, commits")
        XCTAssertTrue(handOver.finish(), "and learns so when its dispatch returns")
        XCTAssertEqual(handOver.current, HandOver.idle)
    }

    func testAReplyAfterTheDispatchIsHandedToTheRingsThread() {
        let handOver = HandOver()
        handOver.begin(42)
        XCTAssertFalse(handOver.finish(), "no reply yet: the ring's thread goes on fetching")
        XCTAssertEqual(handOver.current, HandOver.awaiting)
        XCTAssertEqual(handOver.claim(), 42)
        XCTAssertFalse(handOver.replied(), "the replier hands the commit over (commitLater)")
        XCTAssertEqual(handOver.current, HandOver.idle)
    }

    func testARequestTakesOneReply() {
        let handOver = HandOver()
        XCTAssertNil(handOver.claim(), "no request: no reply")
        handOver.begin(6)
        XCTAssertEqual(handOver.claim(), 6)
        XCTAssertNil(handOver.claim(), "a second reply to the same request is refused")
        handOver.begin(8)
        XCTAssertEqual(handOver.claim(), 8, "the next request takes its own")
    }

    // MARK: The hand-over under many threads

    /// Entries each served by a "ring" thread of their own, the replies made by other
    /// threads at random moments (before, during or after the dispatch returns), two
    /// repliers racing for each request: every request is committed exactly once, by
    /// exactly one side, and only the first reply is let in. A broken hand-over commits
    /// twice, never, or lets two replies in, and the test fails (or its wait times out)
    /// instead of a mount hanging.
    func testManyThreadsCommitEveryReplyExactlyOnce() {
        let entries = 8, rounds = 10_000
        let commits = (0..<entries).map { _ in Count() }
        let replies = (0..<entries).map { _ in Count() }
        let group = DispatchGroup()
        let repliers = DispatchQueue(label: "repliers", attributes: .concurrent)
        for e in 0..<entries {
            group.enter()
            Thread.detachNewThread {
                defer { group.leave() }
                let handOver = HandOver()
                // What the replier hands back: the commit, when it is the replier's.
                let handedBack = DispatchSemaphore(value: 0)
                for round in 1...rounds {
                    let unique = UInt64(round * 2)
                    let replied = DispatchSemaphore(value: 0)
                    handOver.begin(unique)
                    for _ in 0..<2 {
                        repliers.async {
                            defer { replied.signal() }
                            if Int.random(in: 0..<4) == 0 { sched_yield() }
                            guard let claimed = handOver.claim() else { return }
                            XCTAssertEqual(claimed, unique)
                            replies[e].add()
                            if !handOver.replied() {
                                commits[e].add()
                                handedBack.signal()
                            }
                        }
                    }
                    if Int.random(in: 0..<2) == 0 { sched_yield() }
                    if handOver.finish() {
                        commits[e].add()
                    } else if handedBack.wait(timeout: .now() + 10) == .timedOut {
                        return XCTFail("entry \(e) round \(round): the reply's commit was never handed back")
                    }
                    // Both repliers are done before the entry serves its next request.
                    for _ in 0..<2 where replied.wait(timeout: .now() + 10) == .timedOut {
                        return XCTFail("entry \(e) round \(round): a replier never finished")
                    }
                    XCTAssertEqual(handOver.current, HandOver.idle)
                }
            }
        }
        XCTAssertEqual(group.wait(timeout: .now() + 120), .success, "the entries' threads did not finish")
        for e in 0..<entries {
            XCTAssertEqual(commits[e].value, rounds, "entry \(e): commits")
            XCTAssertEqual(replies[e].value, rounds, "entry \(e): replies let in")
        }
    }

    /// A ring's thread and a replier on two CPUs, meeting at every request: the reply
    /// lands a few instructions before, at, or after `finish`, where a hand-over that is
    /// not one atomic step per side loses the commit (both sides leave it to the other)
    /// or makes it twice.
    func testARingThreadAndAReplierRacingCommitEachReplyOnce() {
        // Every wait yields: with every CPU busy (`scripts/test --under-load`) a yield costs
        // a time slice, and 100,000 rounds take hours; there, fewer rounds.
        let rounds = ProcessInfo.processInfo.environment["COFFER_UNDER_LOAD"] == nil ? 100_000 : 5_000
        let handOver = HandOver()
        let dispatched = Shared(), handedBack = Shared(), replied = Shared(), commits = Count()
        /// Spins (yielding) until `shared` reaches `round`; false after 10 s.
        @Sendable func reached(_ shared: Shared, _ round: Int) -> Bool {
            let deadline = DispatchTime.now() + 10
            while shared.current < round {
                if DispatchTime.now() > deadline { return false }
                sched_yield()
            }
            return true
        }
        let replier = Thread {
            for round in 1...rounds {
                guard reached(dispatched, round) else { return }
                for _ in 0..<Int.random(in: 0..<64) { sched_yield() }
                if handOver.claim() != nil, !handOver.replied() {
                    commits.add()
                    handedBack.set(round)
                }
                replied.set(round)
            }
        }
        replier.start()
        for round in 1...rounds {
            handOver.begin(UInt64(round * 2))
            dispatched.set(round)
            for _ in 0..<Int.random(in: 0..<64) { sched_yield() }
            if handOver.finish() {
                commits.add()
            } else if !reached(handedBack, round) {
                return XCTFail("round \(round): each side left the commit to the other")
            }
            guard reached(replied, round) else { return XCTFail("round \(round): the replier never finished") }
            guard commits.value == round else { return XCTFail("round \(round): \(commits.value) commits") }
        }
    }

    // MARK: The reply in the entry

    func testAReplyIsWrittenIntoItsEntryWithTheKernelsID() throws {
        let entry = try UringTransport.Entry(index: 3, payloadCapacity: 8192)
        entry.handOver.begin(0x1234)
        var header = fuse_out_header(len: 0, error: 0, unique: RingTicket(queue: 1, entry: 3).unique)
        var body: [UInt8] = Array("hello, ring".utf8)
        let taken = withIOVs(&header, &body) { entry.takeReply(error: 0, $0, count: 2) }
        XCTAssertEqual(taken?.size, body.count)
        XCTAssertEqual(taken?.dispatcherCommits, true)
        let out = entry.inOut.load(as: fuse_out_header.self)
        XCTAssertEqual(out.unique, 0x1234, "the kernel's ID, not the ticket")
        XCTAssertEqual(out.error, 0)
        XCTAssertEqual(Int(out.len), MemoryLayout<fuse_out_header>.size + body.count)
        XCTAssertEqual(Int(entry.ringHeader.pointee.ring_ent_in_out.payload_sz), body.count)
        XCTAssertEqual(Array(UnsafeRawBufferPointer(start: entry.payload, count: body.count)), body)
        XCTAssertNil(withIOVs(&header, &body) { entry.takeReply(error: 0, $0, count: 2) }, "one reply per request")
    }

    func testAReplyTooLargeForItsEntryIsAnEIO() throws {
        let entry = try UringTransport.Entry(index: 0, payloadCapacity: 16)
        entry.handOver.begin(10)
        var header = fuse_out_header(len: 0, error: 0, unique: 0)
        var body = [UInt8](repeating: 7, count: 17)
        let taken = withIOVs(&header, &body) { entry.takeReply(error: 0, $0, count: 2) }
        XCTAssertEqual(taken?.size, 0)
        XCTAssertEqual(entry.inOut.load(as: fuse_out_header.self).error, -EIO)
    }

    /// The header buffer as include/uapi/linux/fuse.h lays it out (Linux 6.14): where the
    /// kernel reads and writes, the transport does.
    func testTheEntryHeaderIsLaidOutAsTheKernelsHeader() {
        typealias Header = clinux_fuse_uring_req_header
        XCTAssertEqual(MemoryLayout<Header>.size, 288)
        XCTAssertEqual(MemoryLayout<Header>.offset(of: \.in_out), 0)
        XCTAssertEqual(MemoryLayout<Header>.offset(of: \.op_in), 128)
        XCTAssertEqual(MemoryLayout<Header>.offset(of: \.ring_ent_in_out.commit_id), 264)
        XCTAssertEqual(MemoryLayout<Header>.offset(of: \.ring_ent_in_out.payload_sz), 272)
        XCTAssertEqual(MemoryLayout<clinux_fuse_uring_cmd_req>.offset(of: \.qid), 16)
        XCTAssertEqual(UringTransport.uniqueOffset, 8)
        XCTAssertEqual(CLINUX_FUSE_IO_URING_CMD_REGISTER.rawValue, 1)
        XCTAssertEqual(CLINUX_FUSE_IO_URING_CMD_COMMIT_AND_FETCH.rawValue, 2)
    }
}

/// A count threads add to.
final class Count: Sendable {
    private let count = Atomic<Int>(0)
    func add() { count.add(1, ordering: .relaxed) }
    var value: Int { count.load(ordering: .relaxed) }
}

/// Calls `body` with a two-element iovec array over `header` and `body`, as libfuse
/// hands a reply to its writev hook.
func withIOVs<T>(_ header: inout fuse_out_header, _ body: inout [UInt8], _ call: (UnsafePointer<iovec>) -> T) -> T {
    withUnsafeMutableBytes(of: &header) { head in
        body.withUnsafeMutableBytes { payload in
            let iov = [iovec(iov_base: head.baseAddress, iov_len: head.count),
                       iovec(iov_base: payload.baseAddress, iov_len: payload.count)]
            return iov.withUnsafeBufferPointer { call($0.baseAddress!) }
        }
    }
}

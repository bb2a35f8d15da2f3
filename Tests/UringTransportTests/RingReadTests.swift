// A read that comes on a ring is served by the transport itself, with no libfuse in
// between: the request's handle, offset and size go to the reader with the entry's
// payload as the place to put the plaintext, and the reply's header is written with
// the kernel's ID. Driven through a scripted ring (no kernel): one READ completes on
// entry 0, and the commit that answers it is watched.
import CFuse
import CLinux
@testable import CofferUring
import Dispatch
import Foundation
import Glibc
import Synchronization
import XCTest

final class RingReadTests: XCTestCase {
    /// What the reader was asked, and the commit that followed.
    final class Seen: Sendable {
        let request = Mutex<UringTransport.ReadRequest?>(nil)
        let commitID = Atomic<UInt64>(0)
        let committed = DispatchSemaphore(value: 0)
        /// 1 once the READ is laid out in entry 0, 2 once its completion was reaped.
        let delivery = Atomic<Int>(0)
        /// The queue's wake-up descriptor: its poll completes when it is readable, as a
        /// real ring's would (that is how `stop` ends the thread).
        let wake = Atomic<Int32>(-1)
    }

    /// Serves one READ of `size` bytes through a transport whose reader answers with
    /// `answer` (a count of bytes it fills with 0x5a, or -errno); returns the entry
    /// once its reply is committed, with what the reader saw.
    func serve(size: Int, answer: Int, payloadCapacity: Int = 128 << 10)
        throws -> (UringTransport, UringTransport.Entry, Seen) {
        let seen = Seen()
        var calls = RingFailureTests.quietRing
        calls.command = { _, _, command, _, commitID, _, tag in
            if command == CLINUX_FUSE_IO_URING_CMD_COMMIT_AND_FETCH.rawValue && tag == 0 {
                seen.commitID.store(commitID, ordering: .releasing)
                seen.committed.signal()
            }
            return 0
        }
        calls.nextCompletion = { _, tag, result in
            var wake = pollfd(fd: seen.wake.load(ordering: .acquiring), events: Int16(POLLIN), revents: 0)
            if wake.fd >= 0 && poll(&wake, 1, 0) == 1 {
                tag = UInt64.max  // the wake-up poll's completion
                result = 0
                return true
            }
            guard seen.delivery.compareExchange(expected: 1, desired: 2, ordering: .acquiringAndReleasing).exchanged else {
                return false
            }
            tag = 0
            result = 0
            return true
        }
        let log = LogCapture()
        let transport = try UringTransport(
            fuseFD: -1, payloadCapacity: payloadCapacity, queueCount: 1, calls: calls, logger: log.logger,
            dispatcher: { _, _ in XCTFail("a read must not go to libfuse") },
            reader: { request, area in
                seen.request.withLock { $0 = request }
                XCTAssertEqual(area.count, request.size, "the area is the size asked for")
                if answer > 0 { memset(area.baseAddress!, 0x5a, answer) }
                return answer
            },
            failed: { XCTFail("the ring failed") })
        seen.wake.store(transport.queues[0].wake, ordering: .releasing)
        let entry = transport.queues[0].entries[0]
        let opSize = MemoryLayout<fuse_read_in>.size
        var header = fuse_in_header()
        header.len = UInt32(UringTransport.inHeaderSize + opSize)
        header.opcode = FUSE_READ.rawValue
        header.unique = 77
        header.nodeid = 5
        header.pid = 42
        entry.inOut.storeBytes(of: header, as: fuse_in_header.self)
        var read = fuse_read_in()
        read.fh = 9
        read.offset = 4096
        read.size = UInt32(size)
        entry.opIn.storeBytes(of: read, as: fuse_read_in.self)
        entry.ringHeader.pointee.ring_ent_in_out.payload_sz = 0
        entry.ringHeader.pointee.ring_ent_in_out.commit_id = 3
        transport.start()
        seen.delivery.store(1, ordering: .releasing)
        XCTAssertEqual(seen.committed.wait(timeout: .now() + 10), .success, "no commit answered the read")
        return (transport, entry, seen)
    }

    func testAReadIsServedIntoItsEntryAndAnsweredWithTheKernelsID() throws {
        for size in [100, 64 << 10] {  // in place, and handed to another thread
            let (transport, entry, seen) = try serve(size: size, answer: 10)
            defer { transport.stop() }
            let request = try XCTUnwrap(seen.request.withLock { $0 }, "size \(size): the reader was not called")
            XCTAssertEqual([request.unique, request.node, request.handle], [77, 5, 9], "size \(size)")
            XCTAssertEqual(request.offset, 4096)
            XCTAssertEqual(request.size, size)
            XCTAssertEqual(request.pid, 42)
            XCTAssertEqual(seen.commitID.load(ordering: .acquiring), 3, "the commit gives back the kernel's commit ID")
            let out = entry.inOut.load(as: fuse_out_header.self)
            XCTAssertEqual(out.unique, 77, "size \(size)")
            XCTAssertEqual(out.error, 0)
            XCTAssertEqual(Int(out.len), UringTransport.outHeaderSize + 10)
            XCTAssertEqual(entry.ringHeader.pointee.ring_ent_in_out.payload_sz, 10)
            // The reply's plaintext is wiped once the commit is submitted (the scripted
            // ring takes it at once).
            let deadline = Date().addingTimeInterval(10)
            while UnsafeRawBufferPointer(start: entry.payload, count: 10).contains(0x5a) && Date() < deadline { usleep(1000) }
            XCTAssertFalse(UnsafeRawBufferPointer(start: entry.payload, count: 10).contains(0x5a), "the reply stayed in the entry")
        }
    }

    func testAFailedReadIsAnsweredWithItsErrno() throws {
        let (transport, entry, _) = try serve(size: 100, answer: -Int(EACCES))
        defer { transport.stop() }
        let out = entry.inOut.load(as: fuse_out_header.self)
        XCTAssertEqual(out.unique, 77)
        XCTAssertEqual(out.error, -EACCES)
        XCTAssertEqual(Int(out.len), UringTransport.outHeaderSize)
    }

    func testAReadLargerThanTheEntryIsAnEIOWithoutTheReader() throws {
        let (transport, entry, seen) = try serve(size: 16 << 10, answer: 10, payloadCapacity: 8192)
        defer { transport.stop() }
        XCTAssertNil(seen.request.withLock { $0 }, "the reader was asked for more than the entry holds")
        XCTAssertEqual(entry.inOut.load(as: fuse_out_header.self).error, -EIO)
    }
}

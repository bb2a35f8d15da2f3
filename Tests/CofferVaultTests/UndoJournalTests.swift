// Tests of crash-safe rewrites without a crash: the state a power cut leaves (new slot,
// old size) is made by hand, then a journal opened afresh, as after a restart, puts the
// block back — and refuses records that do not describe the tear.
import CofferCrypto
import CofferSystem
@testable import CofferVault
import Dispatch
import Foundation
import Glibc
import TestSupport
import XCTest

final class UndoJournalTests: XCTestCase {
    let cipher = ContentCipher(key: .random(count: 32))
    var dir: TempDirectory!

    override func setUp() { dir = TempDirectory() }
    override func tearDown() { dir = nil }

    var journalSize: Int { Int((try? Sys.stat("coffer.journal", in: dir.fd).st_size) ?? 0) }

    /// An fsynced 3880-byte file gets 1000 more bytes; the new slot reaches the disk but
    /// the new size does not (issue #9, item 1).
    func tornAppend() throws -> (fd: Int32, synced: [UInt8]) {
        let journal = try UndoJournal(directory: dir.fd)
        let volatile = VolatileBlocks()
        let fd = dir.openFile("log")
        let f = ContentFile(fd: fd, cipher: cipher, layout: .unbound, safety: RewriteSafety(journal: journal, volatile: volatile))
        let synced = Sodium.randomArray(count: 3880)
        try write(f, synced, at: 0)
        volatile.removeAll()  // fsync
        try write(f, Sodium.randomArray(count: 1000), at: 3880)
        XCTAssertGreaterThan(journalSize, UndoJournal.ringSlots * UndoJournal.recordSize, "a durable record")
        try Sys.truncate(fd, to: BlockLayout.unbound.cipherSize(plainSize: 3880))
        XCTAssertThrowsError(try readAll(ContentFile(fd: fd, cipher: cipher, layout: .unbound)))
        return (fd, synced)
    }

    func testATornAppendIsPutBackFromItsRecord() throws {
        let (fd, synced) = try tornAppend()
        defer { close(fd) }
        let restarted = try UndoJournal(directory: dir.fd)
        let f = ContentFile(fd: fd, cipher: cipher, layout: .unbound)
        let records = restarted.pendingRecords(try XCTUnwrap(try f.fileID()))
        XCTAssertEqual(try f.tornBlocks(records, repair: false), [0])
        XCTAssertThrowsError(try readAll(f), "checking repairs nothing")
        XCTAssertEqual(try f.tornBlocks(records, repair: true), [0])
        XCTAssertEqual(try readAll(f), synced)
        XCTAssertEqual(try f.tornBlocks(records, repair: true), [], "an intact block needs nothing")
    }

    /// A sqlite WAL's block after a commit: 3880 bytes written and fsynced.
    func syncedWAL() throws -> (UndoJournal, ContentFile, Int32, [UInt8]) {
        let journal = try UndoJournal(directory: dir.fd)
        let volatile = VolatileBlocks()
        let fd = dir.openFile("wal")
        let f = ContentFile(fd: fd, cipher: cipher, layout: .unbound, safety: RewriteSafety(journal: journal, volatile: volatile))
        let synced = Sodium.randomArray(count: 3880)
        try write(f, synced, at: 0)
        volatile.removeAll()  // fsync
        return (journal, f, fd, synced)
    }

    /// Issue 19, item 1 (a sqlite WAL under writeback): a 24-byte write to a synced block
    /// takes a durable record, and so does the page write after it, since the block still
    /// holds the synced bytes. The cut loses every ring record and leaves the newest slot
    /// cut short: the page write's own record puts the block back.
    func testEveryRewriteOfABlockKeepingFsyncedBytesIsDurable() throws {
        let (journal, f, fd, synced) = try syncedWAL()
        defer { close(fd) }
        let header = Sodium.randomArray(count: 24)
        try write(f, header, at: 3880)                            // the frame header
        try write(f, Sodium.randomArray(count: 100), at: 3904)    // the page
        let ring = UndoJournal.ringSlots * UndoJournal.recordSize
        XCTAssertEqual(journalSize, ring + 2 * UndoJournal.recordSize, "two durable records")
        try [UInt8](repeating: 0, count: ring).withUnsafeBytes { try Sys.writeFully(journal.fileDescriptorForTests, $0, at: 0) }
        try Sys.truncate(fd, to: BlockLayout.unbound.cipherSize(plainSize: 3904))  // the newest slot cut short
        XCTAssertThrowsError(try readAll(ContentFile(fd: fd, cipher: cipher, layout: .unbound)))
        let restarted = try UndoJournal(directory: dir.fd)
        let records = restarted.pendingRecords(try XCTUnwrap(try f.fileID()))
        XCTAssertEqual(try ContentFile(fd: fd, cipher: cipher, layout: .unbound).tornBlocks(records, repair: true), [0])
        XCTAssertTrue(try readAll(ContentFile(fd: fd, cipher: cipher, layout: .unbound)) == synced + header, "every fsynced byte is back")
    }

    /// A block holding synced bytes is overwritten whole (a durable record, as the block
    /// has one), then in part (a ring record: the block now holds only new bytes). The
    /// cut leaves the newest slot cut short and its ring record half written: the durable
    /// record before it puts the block back.
    func testWhenTheNewestRecordIsTornTheDurableOneBeforeItPutsTheBlockBack() throws {
        let (journal, f, fd, synced) = try syncedWAL()
        defer { close(fd) }
        let header = Sodium.randomArray(count: 24)
        try write(f, header, at: 3880)                                   // durable record
        try write(f, Sodium.randomArray(count: 4096), at: 0)             // durable record
        XCTAssertEqual(journalSize, UndoJournal.ringSlots * UndoJournal.recordSize + 2 * UndoJournal.recordSize)
        try write(f, Sodium.randomArray(count: 1000), at: 100)           // ring record (slot 0)
        try Sys.truncate(fd, to: BlockLayout.unbound.cipherSize(plainSize: 3904)) // the newest slot cut short
        let torn = Sodium.randomArray(count: 64)                          // the ring record's old slot half written
        try torn.withUnsafeBytes { try Sys.writeFully(journal.fileDescriptorForTests, $0, at: Int64(UndoJournal.headerSize + 64)) }
        XCTAssertThrowsError(try readAll(ContentFile(fd: fd, cipher: cipher, layout: .unbound)))
        let restarted = try UndoJournal(directory: dir.fd)
        let records = restarted.pendingRecords(try XCTUnwrap(try f.fileID()))
        XCTAssertEqual(records[0]?.count, 3, "every record of the block is kept")
        XCTAssertEqual(try ContentFile(fd: fd, cipher: cipher, layout: .unbound).tornBlocks(records, repair: true), [0])
        XCTAssertTrue(try readAll(ContentFile(fd: fd, cipher: cipher, layout: .unbound)) == synced + header, "every fsynced byte is back")
    }

    func testTheRecoveryPlanTriesRecordsNewestFirstAlongTheirChain() {
        let nonce = { (n: UInt8) in [UInt8](repeating: n, count: ContentCipher.nonceSize) }
        let record = { (old: UInt8, new: UInt8) in
            UndoJournal.Record(fileID: FileID(bytes: [UInt8](repeating: 1, count: 16)), block: 0, oldLength: 1,
                               newNonce: nonce(new), sealed: nonce(old) + [UInt8](repeating: 0, count: 17))
        }
        let (r1, r2) = (record(1, 2), record(2, 3))  // r1: slot 1 → 2 (durable); r2: slot 2 → 3 (newest)
        let plan = { (disk: UInt8, opening: [UInt8]) in
            RecoveryPlan.record(for: nonce(disk), among: [r2, r1]) { opening.contains($0.oldNonce.first!) }?.oldNonce.first
        }
        XCTAssertEqual(plan(3, [1, 2]), 2, "the newest record first")
        XCTAssertEqual(plan(3, [1]), 1, "the newest is torn: the one before it")
        XCTAssertEqual(plan(2, [1]), 1, "torn between the two rewrites")
        XCTAssertNil(plan(9, [1, 2]), "a tear of some other write: nothing")
        XCTAssertNil(plan(3, []), "no record opens: nothing")
    }

    /// Issue 19, item 1 (sqlite's WAL after a cut): the last slots of an append reached the
    /// disk in part; the file is cut back to its last block that opens, and only when
    /// the tail is short enough to be a tear.
    func testATailTornMidAppendIsCutBackToTheLastBlockThatOpens() throws {
        let fd = dir.openFile("wal")
        defer { close(fd) }
        let f = ContentFile(fd: fd, cipher: cipher, layout: .unbound)
        let data = Sodium.randomArray(count: 5 * 4096 + 1000)
        try write(f, data, at: 0)
        XCTAssertNil(try f.tornTail(repair: true), "an intact file keeps its tail")
        // Block 4's slot half written, block 5's cut short.
        try Sys.truncate(fd, to: BlockLayout.unbound.cipherOffset(block: 5) + 100)
        try Sodium.randomArray(count: 2000).withUnsafeBytes { try Sys.writeFully(fd, $0, at: BlockLayout.unbound.cipherOffset(block: 4) + 2000) }
        XCTAssertEqual(try f.tornTail(repair: false), 4 * 4096)
        XCTAssertEqual(try f.tornTail(repair: true), 4 * 4096)
        XCTAssertEqual(try readAll(f), Array(data.prefix(4 * 4096)))
        // A damaged block with good blocks after it is no tear: it stays damage.
        try Sodium.randomArray(count: 100).withUnsafeBytes { try Sys.writeFully(fd, $0, at: BlockLayout.unbound.cipherOffset(block: 1) + 50) }
        XCTAssertNil(try f.tornTail(repair: true))
        XCTAssertThrowsError(try readAll(f))
    }

    func testARecordIsNotAppliedToATearOfAnotherWrite() throws {
        let (fd, _) = try tornAppend()
        defer { close(fd) }
        // The slot now starts with a nonce that neither the record's old nor its new slot had.
        try Sodium.randomArray(count: 24).withUnsafeBytes { try Sys.writeFully(fd, $0, at: BlockLayout.unbound.cipherOffset(block: 0)) }
        let f = ContentFile(fd: fd, cipher: cipher, layout: .unbound)
        let records = try UndoJournal(directory: dir.fd).pendingRecords(try XCTUnwrap(try f.fileID()))
        XCTAssertEqual(try f.tornBlocks(records, repair: true), [])
    }

    func testRewritesOfBlocksWrittenSinceTheLastSyncGoToTheRing() throws {
        let journal = try UndoJournal(directory: dir.fd)
        let f = ContentFile(fd: dir.openFile("f"), cipher: cipher, layout: .unbound,
                            safety: RewriteSafety(journal: journal, volatile: VolatileBlocks()))
        try write(f, Sodium.randomArray(count: 100), at: 0)
        XCTAssertEqual(journalSize, 0, "a new block needs no record")
        try write(f, Sodium.randomArray(count: 100), at: 100)
        XCTAssertEqual(journalSize, UndoJournal.recordSize, "the first ring record")
        try write(f, Sodium.randomArray(count: 4096), at: 0)
        XCTAssertEqual(journalSize, 2 * UndoJournal.recordSize, "a recorded block is always recorded")
        try journal.trim()
        XCTAssertEqual(journalSize, 0)
    }

    /// Past the trim threshold, the rewrite that finds the journal grown does not trim
    /// (a syncfs of the whole disk) on its own thread: it returns while another rewrite
    /// is still under way, which a trim has to wait for; the trim follows.
    func testATrimPastTheThresholdRunsOffTheRequestThread() throws {
        let journal = try UndoJournal(directory: dir.fd)
        let id = FileID.random()
        let needed = Int(UndoJournal.trimThreshold) / UndoJournal.recordSize + 1
        let records = (0..<needed).map { block in
            UndoJournal.Record(fileID: id, block: Int64(block), oldLength: 0, newNonce: Sodium.randomArray(count: ContentCipher.nonceSize),
                               sealed: [UInt8](repeating: 0, count: ContentCipher.overhead))
        }
        try journal.append(records, durable: true)
        XCTAssertGreaterThan(Int64(journalSize), UndoJournal.trimThreshold)

        let underWay = DispatchSemaphore(value: 0), finish = DispatchSemaphore(value: 0), returned = DispatchSemaphore(value: 0)
        Thread.detachNewThread { journal.rewriting { underWay.signal(); finish.wait() } }
        underWay.wait()
        Thread.detachNewThread { journal.rewriting {}; returned.signal() }
        XCTAssertEqual(returned.wait(timeout: .now() + 30), .success, "the rewrite waited for a trim")
        XCTAssertGreaterThan(Int64(journalSize), UndoJournal.trimThreshold, "no trim while a rewrite is under way")
        finish.signal()
        for _ in 0..<300 where journalSize > 0 { usleep(100_000) }
        XCTAssertEqual(journalSize, 0, "the trim came once the rewrite ended")
    }

    func testVolatileBlocksMergeAndSplit() {
        let blocks = VolatileBlocks()
        blocks.insert(0...3)
        blocks.insert(5...6)
        blocks.insert(4...4)
        XCTAssertTrue((0...6).allSatisfy(blocks.contains))
        blocks.remove(2...2)
        XCTAssertFalse(blocks.contains(2))
        XCTAssertTrue(blocks.contains(1) && blocks.contains(3))
        blocks.removeAll()
        XCTAssertFalse(blocks.contains(0))
    }
}

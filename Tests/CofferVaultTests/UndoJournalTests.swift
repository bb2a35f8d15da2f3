// Tests of crash-safe rewrites without a crash: the state a power cut leaves (new slot,
// old size) is made by hand, then a journal opened afresh, as after a restart, puts the
// block back — and refuses records that do not describe the tear.
import CofferCrypto
import CofferSystem
@testable import CofferVault
import Glibc
import TestSupport
import XCTest

final class UndoJournalTests: XCTestCase {
    let cipher = ContentCipher(key: .random(count: 32))
    var dir: TempDirectory!

    override func setUp() { dir = TempDirectory() }
    override func tearDown() { dir = nil }

    func write(_ f: ContentFile, _ bytes: [UInt8], at offset: Int64) throws {
        try bytes.withUnsafeBytes { try f.write($0, at: offset) }
    }

    func readAll(_ f: ContentFile) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(try f.plainSize()))
        _ = try out.withUnsafeMutableBytes { try f.read(into: $0, at: 0) }
        return out
    }

    var journalSize: Int { Int((try? Sys.stat("coffer.journal", in: dir.fd).st_size) ?? 0) }

    /// An fsynced 3880-byte file gets 1000 more bytes; the new slot reaches the disk but
    /// the new size does not (issue #9, item 1).
    func tornAppend() throws -> (fd: Int32, synced: [UInt8]) {
        let journal = try UndoJournal(directory: dir.fd)
        let volatile = VolatileBlocks()
        let fd = dir.openFile("log")
        let f = ContentFile(fd: fd, cipher: cipher, safety: RewriteSafety(journal: journal, volatile: volatile))
        let synced = Sodium.randomArray(count: 3880)
        try write(f, synced, at: 0)
        volatile.removeAll()  // fsync
        try write(f, Sodium.randomArray(count: 1000), at: 3880)
        XCTAssertGreaterThan(journalSize, UndoJournal.ringSlots * UndoJournal.recordSize, "a durable record")
        try Sys.truncate(fd, to: BlockLayout.cipherSize(plainSize: 3880))
        XCTAssertThrowsError(try readAll(ContentFile(fd: fd, cipher: cipher)))
        return (fd, synced)
    }

    func testATornAppendIsPutBackFromItsRecord() throws {
        let (fd, synced) = try tornAppend()
        defer { close(fd) }
        let restarted = try UndoJournal(directory: dir.fd)
        let f = ContentFile(fd: fd, cipher: cipher)
        let records = restarted.pendingRecords(try XCTUnwrap(try f.fileID()))
        XCTAssertEqual(try f.tornBlocks(records, repair: false), [0])
        XCTAssertThrowsError(try readAll(f), "checking repairs nothing")
        XCTAssertEqual(try f.tornBlocks(records, repair: true), [0])
        XCTAssertEqual(try readAll(f), synced)
        XCTAssertEqual(try f.tornBlocks(records, repair: true), [], "an intact block needs nothing")
    }

    func testARecordIsNotAppliedToATearOfAnotherWrite() throws {
        let (fd, _) = try tornAppend()
        defer { close(fd) }
        // The slot now starts with a nonce that neither the record's old nor its new slot had.
        try Sodium.randomArray(count: 24).withUnsafeBytes { try Sys.writeFully(fd, $0, at: BlockLayout.cipherOffset(block: 0)) }
        let f = ContentFile(fd: fd, cipher: cipher)
        let records = try UndoJournal(directory: dir.fd).pendingRecords(try XCTUnwrap(try f.fileID()))
        XCTAssertEqual(try f.tornBlocks(records, repair: true), [])
    }

    func testRewritesOfBlocksWrittenSinceTheLastSyncGoToTheRing() throws {
        let journal = try UndoJournal(directory: dir.fd)
        let f = ContentFile(fd: dir.openFile("f"), cipher: cipher,
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

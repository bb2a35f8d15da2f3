// Tests of WritePlan, ContentFile's decisions before a write touches the disk: the
// region, the old blocks kept (read-modify-write), the header and final block that go
// with it, the block grown first — and which undo records a rewrite needs, and how.
@testable import CofferVault
import XCTest

final class WritePlanTests: XCTestCase {
    func plan(_ offset: Int64, _ count: Int, size: Int64, layout: BlockLayout = .unbound) -> WritePlan {
        WritePlan(offset: offset, count: count, plainSize: size, cipherSize: layout.cipherSize(plainSize: size), layout: layout)
    }

    func testTheFirstWriteOfAnEmptyFileCarriesItsHeader() {
        let atStart = plan(0, 100, size: 0)
        XCTAssertEqual(atStart.header, .withBlocks)
        XCTAssertTrue(atStart.direct, "a new tail: sealed from the caller's bytes")
        XCTAssertFalse(atStart.keepsFirst || atStart.keepsLast)
        let later = plan(5000, 10, size: 0)
        XCTAssertEqual(later.header, .apart, "block 0 is not written: the header goes alone")
        XCTAssertFalse(later.direct, "the block starts with a hole")
        XCTAssertFalse(later.keepsFirst, "nothing old to keep")
        XCTAssertEqual(plan(0, 100, size: 0, layout: .bound).header, .present, "format 4 files are made with theirs")
    }

    func testAWriteInsideOneBlockKeepsItOnce() {
        let p = plan(100, 10, size: 10000)
        XCTAssertEqual(p.header, .present)
        XCTAssertEqual(p.first, 0)
        XCTAssertEqual(p.last, 0)
        XCTAssertEqual(p.regionEnd, 4096)
        XCTAssertTrue(p.keepsFirst)
        XCTAssertFalse(p.keepsLast, "the same block, read once")
        XCTAssertFalse(p.direct)
    }

    func testAWriteAcrossABoundaryKeepsBothEnds() {
        let p = plan(100, 5000, size: 10000)
        XCTAssertEqual(p.last, 1)
        XCTAssertEqual(p.regionEnd, 8192)
        XCTAssertTrue(p.keepsFirst && p.keepsLast)
        let whole = plan(4096, 4096, size: 10000)
        XCTAssertTrue(whole.direct, "a whole block replaces the old one")
        XCTAssertFalse(whole.keepsFirst || whole.keepsLast)
    }

    func testAWriteBeyondTheEndGrowsThePartialLastBlockFirst() {
        let p = plan(8192 + 10, 10, size: 100)
        XCTAssertEqual(p.grown, 0)
        XCTAssertEqual(p.plainSize, 4096)
        XCTAssertFalse(p.keepsFirst, "block 2 held nothing")
        XCTAssertNil(plan(8192, 10, size: 4096).grown, "a full last block stays (formats 1–3)")
        XCTAssertEqual(plan(8192, 10, size: 4096, layout: .bound).grown, 1, "format 4: the empty final block becomes full")
    }

    func testFormat4EndsAFileGrownToABoundaryInAnEmptyFinalBlock() {
        let p = plan(4096, 4096, size: 4096, layout: .bound)
        XCTAssertNil(p.grown)
        XCTAssertTrue(p.finalAfter)
        XCTAssertTrue(p.direct)
        XCTAssertFalse(plan(4096, 4096, size: 4096).finalAfter, "formats 1–3 have no final block")
        XCTAssertFalse(plan(0, 4096, size: 10000, layout: .bound).finalAfter, "the file does not end there")
    }

    func testRecordsCoverKeptAndRecordedBlocksWithData() {
        let volatile: Set<Int64> = [0, 2]
        let r = WritePlan.Records(blocks: 0...3, plainSize: 10000, kept: [0], recorded: [7, 3, 2, 0],
                                  volatile: volatile.contains)
        XCTAssertEqual(r.extra, [2], "3 holds no data, 7 is not rewritten, 0 is kept already")
        XCTAssertFalse(r.durable, "every recorded block was written since the last fsync")
        XCTAssertEqual(r.stayDurable, [])
        let synced = WritePlan.Records(blocks: 0...3, plainSize: 10000, kept: [0], recorded: [], volatile: { _ in false })
        XCTAssertTrue(synced.durable, "a kept block may hold fsynced bytes")
        XCTAssertEqual(synced.stayDurable, [0])
    }
}

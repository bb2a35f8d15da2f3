// When WriteBehind starts the disk, and on which backing bytes.
import CofferVault
@testable import CofferFileSystem
import XCTest

final class WriteBehindTests: XCTestCase {
    private let mib: Int64 = 1 << 20

    func testARunStartsAtItsThresholdAndThenEachStep() {
        var behind = WriteBehind()
        var ranges: [Range<Int64>] = []
        for i in 0..<20 {
            if let range = behind.wrote(1 << 20, at: Int64(i) * mib) { ranges.append(range) }
        }
        XCTAssertEqual(ranges, [0..<8 * mib, 8 * mib..<12 * mib, 12 * mib..<16 * mib, 16 * mib..<20 * mib])
    }

    func testAWriteElsewhereStartsANewRun() {
        var behind = WriteBehind()
        for i in 0..<7 { XCTAssertNil(behind.wrote(1 << 20, at: Int64(i) * mib)) }
        // A write elsewhere: the run so far is forgotten, and the new one counts from there.
        for i in 0..<7 { XCTAssertNil(behind.wrote(1 << 20, at: 100 * mib + Int64(i) * mib)) }
        XCTAssertEqual(behind.wrote(1 << 20, at: 107 * mib), 100 * mib..<108 * mib)
        XCTAssertNil(behind.wrote(4096, at: 0))
        XCTAssertNil(behind.wrote(1 << 20, at: 108 * mib))
        // Small writes add up like large ones.
        var small = WriteBehind()
        var starts: [Int64] = []
        for i in 0..<Int64(16 * 1024) {
            if let range = small.wrote(1024, at: i * 1024) { starts.append(range.upperBound / mib) }
        }
        XCTAssertEqual(starts, [8, 12, 16])
    }

    func testTheBackingRangeHoldsWholeBlocksInWholePagesAndNotTheLastBlock() throws {
        for layout in [BlockLayout.unbound, .bound, .boundWithDrops] {
            let range = try XCTUnwrap(WriteBehind.backingRange(of: 8 * mib..<12 * mib + 100, layout: layout))
            XCTAssertEqual(range.offset % 4096, 0)
            XCTAssertEqual(range.length % 4096, 0)
            XCTAssertLessThanOrEqual(range.offset, layout.cipherOffset(block: BlockLayout.blockIndex(plainOffset: 8 * mib)))
            let lastBlock = layout.cipherOffset(block: BlockLayout.blockIndex(plainOffset: 12 * mib + 100))
            XCTAssertLessThanOrEqual(range.offset + range.length, lastBlock)
            XCTAssertGreaterThan(range.offset + range.length, lastBlock - 4096)
        }
        // Less than a page of whole blocks: nothing.
        XCTAssertNil(WriteBehind.backingRange(of: 0..<100, layout: .bound))
    }
}

// Tests of plaintext ↔ ciphertext size arithmetic, on its own.
@testable import CofferVault
import XCTest

final class BlockLayoutTests: XCTestCase {
    func testKnownSizes() throws {
        XCTAssertEqual(BlockLayout.unbound.cipherSize(plainSize: 0), 0)
        XCTAssertEqual(BlockLayout.unbound.cipherSize(plainSize: 1), 18 + 41)
        XCTAssertEqual(BlockLayout.unbound.cipherSize(plainSize: 4096), 18 + 4136)
        XCTAssertEqual(BlockLayout.unbound.cipherSize(plainSize: 4097), 18 + 4136 + 41)
        XCTAssertEqual(try BlockLayout.unbound.plainSize(cipherSize: 18), 0)
        XCTAssertEqual(BlockLayout.unbound.cipherOffset(block: 2), 18 + 2 * 4136)
        XCTAssertEqual(BlockLayout.blockIndex(plainOffset: 4095), 0)
        XCTAssertEqual(BlockLayout.blockIndex(plainOffset: 4096), 1)
    }

    func testRoundTripForManySizes() throws {
        for size in Array(0...9000) + [1 << 20, (1 << 30) + 3, 10 << 30] {
            let s = Int64(size)
            XCTAssertEqual(try BlockLayout.unbound.plainSize(cipherSize: BlockLayout.unbound.cipherSize(plainSize: s)), s)
        }
    }

    func testImpossibleSizesAreTruncation() {
        for bad: Int64 in [1, 17, 18 + 1, 18 + 40, 18 + 4136 + 40] {
            XCTAssertThrowsError(try BlockLayout.unbound.plainSize(cipherSize: bad), "\(bad)") {
                XCTAssertEqual($0 as? VaultError, .fileTruncated(cipherSize: bad))
            }
        }
    }

    /// Format 4: a header of 34 bytes and a final block of n mod 4096 bytes (nonce ‖ tag
    /// alone for 0): every size a writer leaves ends in one, so no cut at a block
    /// boundary, or to nothing, is a size of any file.
    func testFormat4Sizes() throws {
        let layout = BlockLayout.bound
        XCTAssertEqual(layout.cipherSize(plainSize: 0), 34 + 40)
        XCTAssertEqual(layout.cipherSize(plainSize: 1), 34 + 41)
        XCTAssertEqual(layout.cipherSize(plainSize: 4096), 34 + 4136 + 40)
        XCTAssertEqual(layout.cipherOffset(block: 2), 34 + 2 * 4136)
        for size in Array(0...9000) + [1 << 20, (1 << 30) + 3] {
            XCTAssertEqual(try layout.plainSize(cipherSize: layout.cipherSize(plainSize: Int64(size))), Int64(size))
        }
        for bad: Int64 in [0, 1, 34, 34 + 39, 34 + 4136, 34 + 4136 + 39, 34 + 2 * 4136] {
            XCTAssertThrowsError(try layout.plainSize(cipherSize: bad), "\(bad)") {
                XCTAssertEqual($0 as? VaultError, .fileTruncated(cipherSize: bad))
            }
        }
    }

    func testBlockLength() {
        XCTAssertEqual(BlockLayout.blockLength(0, plainSize: 100), 100)
        XCTAssertEqual(BlockLayout.blockLength(1, plainSize: 100), 0)
        XCTAssertEqual(BlockLayout.blockLength(1, plainSize: 5000), 904)
    }

    /// What a read of ciphertext from a block's start holds: whole blocks, then a partial
    /// one; 40 bytes are an empty final block from format 4, a cut before.
    func testPlainBytesOfWhatWasRead() {
        for layout in [BlockLayout.unbound, .bound] {
            XCTAssertTrue(layout.plainBytes(inCipherBytes: 0) == (0, false))
            XCTAssertTrue(layout.plainBytes(inCipherBytes: 4136) == (4096, false))
            XCTAssertTrue(layout.plainBytes(inCipherBytes: 4136 + 41) == (4097, false))
            XCTAssertTrue(layout.plainBytes(inCipherBytes: 4136 + 10) == (4096, true), "cut inside a nonce")
        }
        XCTAssertTrue(BlockLayout.unbound.plainBytes(inCipherBytes: 4136 + 40) == (4096, true))
        XCTAssertTrue(BlockLayout.bound.plainBytes(inCipherBytes: 4136 + 40) == (4096, false))
        XCTAssertEqual([0, 1, 4096, 4097].map { BlockLayout.wholeBlocks(plainLength: $0) }, [0, 4096, 4096, 8192])
        let unbound = BlockLayout.unbound, header = unbound.headerSize
        XCTAssertEqual(unbound.slots(cipherSize: header + 4136 + 100, countingPartial: false), 1)
        XCTAssertEqual(unbound.slots(cipherSize: header + 4136 + 100, countingPartial: true), 2)
        XCTAssertEqual(unbound.slots(cipherSize: header + 2 * 4136, countingPartial: true), 2)
        XCTAssertEqual(unbound.slots(cipherSize: 0, countingPartial: true), 0, "an empty file has no slot")
    }
}

// Tests of plaintext ↔ ciphertext size arithmetic, on its own.
@testable import CofferVault
import XCTest

final class BlockLayoutTests: XCTestCase {
    func testKnownSizes() throws {
        XCTAssertEqual(BlockLayout.cipherSize(plainSize: 0), 0)
        XCTAssertEqual(BlockLayout.cipherSize(plainSize: 1), 18 + 41)
        XCTAssertEqual(BlockLayout.cipherSize(plainSize: 4096), 18 + 4136)
        XCTAssertEqual(BlockLayout.cipherSize(plainSize: 4097), 18 + 4136 + 41)
        XCTAssertEqual(try BlockLayout.plainSize(cipherSize: 18), 0)
        XCTAssertEqual(BlockLayout.cipherOffset(block: 2), 18 + 2 * 4136)
        XCTAssertEqual(BlockLayout.blockIndex(plainOffset: 4095), 0)
        XCTAssertEqual(BlockLayout.blockIndex(plainOffset: 4096), 1)
    }

    func testRoundTripForManySizes() throws {
        for size in Array(0...9000) + [1 << 20, (1 << 30) + 3, 10 << 30] {
            let s = Int64(size)
            XCTAssertEqual(try BlockLayout.plainSize(cipherSize: BlockLayout.cipherSize(plainSize: s)), s)
        }
    }

    func testImpossibleSizesAreTruncation() {
        for bad: Int64 in [1, 17, 18 + 1, 18 + 40, 18 + 4136 + 40] {
            XCTAssertThrowsError(try BlockLayout.plainSize(cipherSize: bad), "\(bad)") {
                XCTAssertEqual($0 as? VaultError, .fileTruncated(cipherSize: bad))
            }
        }
    }

    func testBlockLength() {
        XCTAssertEqual(BlockLayout.blockLength(0, plainSize: 100), 100)
        XCTAssertEqual(BlockLayout.blockLength(1, plainSize: 100), 0)
        XCTAssertEqual(BlockLayout.blockLength(1, plainSize: 5000), 904)
    }
}

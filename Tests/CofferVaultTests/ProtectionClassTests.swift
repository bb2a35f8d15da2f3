// Tests of a directory's protection-class record (format 6) without a mount: sealed and
// bound to the directory's IV, absent means complete, the strictest of a record and its
// sync conflict copies holds, and setting a class settles the copies.
import CofferCrypto
import CofferSystem
@testable import CofferVault
import Foundation
import Glibc
import TestSupport
import XCTest

final class ProtectionClassTests: XCTestCase {
    var dir: TempDirectory!
    let box = SealedBox(key: .random(count: 32))
    let iv = Sodium.randomArray(count: 16)

    override func setUp() { dir = TempDirectory() }
    override func tearDown() { dir = nil }

    var fd: Int32 { dir.fd }

    func testARecordOpensOnlyInItsDirectory() throws {
        let sealed = try ProtectionClass.unlessOpen.sealed(dirIV: iv, box: box)
        XCTAssertEqual(sealed.count, ProtectionClass.fileSize)
        XCTAssertEqual(try ProtectionClass.open(sealed, dirIV: iv, box: box), .unlessOpen)
        XCTAssertThrowsError(try ProtectionClass.open(sealed, dirIV: Sodium.randomArray(count: 16), box: box))
        var flipped = sealed
        flipped[30] ^= 1
        XCTAssertThrowsError(try ProtectionClass.open(flipped, dirIV: iv, box: box))
        XCTAssertThrowsError(try ProtectionClass.open(Array(sealed.dropLast()), dirIV: iv, box: box))
    }

    func testNoRecordIsCompleteAndSettingCompleteRemovesIt() throws {
        XCTAssertEqual(try ProtectionClass.read(in: fd, dirIV: iv, box: box), .complete)
        try ProtectionClass.unlessOpen.write(in: fd, dirIV: iv, box: box)
        XCTAssertEqual(try ProtectionClass.read(in: fd, dirIV: iv, box: box), .unlessOpen)
        try ProtectionClass.complete.write(in: fd, dirIV: iv, box: box)
        XCTAssertEqual(try Sys.listDirectory(fd), [])
        XCTAssertEqual(try ProtectionClass.read(in: fd, dirIV: iv, box: box), .complete)
    }

    /// Two machines set the class at once: the stricter holds until the owner sets one.
    func testTheStrictestOfTheRecordAndItsConflictCopiesHolds() throws {
        try ProtectionClass.unlessOpen.write(in: fd, dirIV: iv, box: box)
        let copy = "coffer.sync-conflict-20261126-120000-ABCDEFG.class"
        XCTAssertTrue(ProtectionClass.isConflictCopy(copy))
        try AtomicFile.write(try ProtectionClass.complete.sealed(dirIV: iv, box: box), to: copy, in: fd)
        XCTAssertEqual(try ProtectionClass.read(in: fd, dirIV: iv, box: box), .complete)
        try ProtectionClass.unlessOpen.write(in: fd, dirIV: iv, box: box)
        XCTAssertEqual(try Sys.listDirectory(fd), [ProtectionClass.fileName])
        XCTAssertEqual(try ProtectionClass.read(in: fd, dirIV: iv, box: box), .unlessOpen)
    }

    func testAClassFileThatIsNoRegularFileIsDamage() throws {
        XCTAssertEqual(symlink("/etc/passwd", dir.path + "/" + ProtectionClass.fileName), 0)
        XCTAssertThrowsError(try ProtectionClass.read(in: fd, dirIV: iv, box: box)) {
            guard case VaultError.metadataDamaged = $0 else { return XCTFail("\($0)") }
        }
    }
}

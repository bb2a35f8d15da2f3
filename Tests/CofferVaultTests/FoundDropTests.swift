// Tests of FoundDrop, the rule by which an entry found under a drop's backing name may
// become an entry: only a file made while locked and never placed (or placed at this very
// place by an interrupted conversion), only a directory with no IV file of its own.
import CofferCrypto
@testable import CofferVault
import XCTest

final class FoundDropTests: XCTestCase {
    let id = FileID(bytes: Array(0..<16))
    let tag = [UInt8](repeating: 7, count: PlaceMAC.tagSize)
    let zero = [UInt8](repeating: 0, count: PlaceMAC.tagSize)

    func testOnlyANeverPlacedFileMadeWhileLockedWithItsRecordIsTaken() {
        let sealed = FileHeader(version: FileHeader.sealedVersion, fileID: id, placeTag: zero)
        XCTAssertNil(FoundDrop.fileRefusal(sealed, expectedTag: tag, recordOpens: { true }))
        XCTAssertNotNil(FoundDrop.fileRefusal(sealed, expectedTag: tag, recordOpens: { false }), "no key record")
        let derived = FileHeader(version: 2, fileID: id, placeTag: tag)
        XCTAssertNotNil(FoundDrop.fileRefusal(derived, expectedTag: tag, recordOpens: { true }), "any file's content under a drop's name")
        let placedHere = FileHeader(version: FileHeader.sealedVersion, fileID: id, placeTag: tag)
        XCTAssertNil(FoundDrop.fileRefusal(placedHere, expectedTag: tag, recordOpens: { false }), "a conversion a crash interrupted")
        var elsewhere = tag
        elsewhere[0] ^= 1
        XCTAssertNotNil(FoundDrop.fileRefusal(placedHere, expectedTag: elsewhere, recordOpens: { true }), "a converted drop copied")
    }

    func testOnlyADirectoryWithoutAnIVOfItsOwnIsTaken() {
        let derived = FoundDrop.directoryIV(backingName: "coffer.drop.abc")
        XCTAssertEqual(derived.count, NameCipher.ivSize)
        XCTAssertNotEqual(derived, FoundDrop.directoryIV(backingName: "coffer.drop.abd"))
        XCTAssertNil(FoundDrop.directoryRefusal(nil, derivedIV: derived, fitsPlace: false))
        let interrupted = DirectoryIV.Record(derived + tag + tag)
        XCTAssertNil(FoundDrop.directoryRefusal(interrupted, derivedIV: derived, fitsPlace: true))
        XCTAssertNotNil(FoundDrop.directoryRefusal(interrupted, derivedIV: derived, fitsPlace: false))
        let foreign = DirectoryIV.Record([UInt8](repeating: 1, count: NameCipher.ivSize) + tag + tag)
        XCTAssertNotNil(FoundDrop.directoryRefusal(foreign, derivedIV: derived, fitsPlace: true), "a directory from elsewhere")
        XCTAssertEqual(FoundDrop.mark(backingName: "coffer.drop.abc").count, 8)
    }
}

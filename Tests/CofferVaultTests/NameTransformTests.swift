// Tests of backing names: every length up to 255, the long-name threshold and sidecar,
// reserved entries, damage.
import CofferCrypto
@testable import CofferVault
import Glibc
import TestSupport
import XCTest

/// A name transform with random keys and a fresh backing directory with its IV.
class NameDirectoryCase: XCTestCase {
    let names = NameTransform(cipher: NameCipher(macKey: .random(count: 32), streamKey: .random(count: 32)))
    var dir: TempDirectory!
    var iv: [UInt8] = []

    override func setUp() {
        dir = TempDirectory()
        iv = try! DirectoryIV.create(in: dir.fd)
    }
}

final class NameTransformTests: NameDirectoryCase {

    /// Creates the backing entry for `name` the way the mount does, and returns it.
    func create(_ name: [UInt8]) throws -> BackingName {
        let backing = try names.backingName(for: name, dirIV: iv)
        try NameTransform.writeSidecar(backing, in: dir.fd)
        let fd = dir.openFile(backing.name)
        XCTAssertGreaterThanOrEqual(fd, 0, "backing name \(backing.name) accepted by the file system")
        close(fd)
        return backing
    }

    func testEveryLengthUpTo255RoundTrips() throws {
        for length in 1...255 {
            let name = Array(repeating: UInt8(ascii: "a") + UInt8(length % 26), count: length)
            let backing = try create(name)
            XCTAssertLessThanOrEqual(backing.name.utf8.count, 255)
            if length <= NameTransform.maxShortPlainLength {
                guard case .short = backing else { return XCTFail("\(length) should be short") }
            } else {
                guard case .long = backing else { return XCTFail("\(length) should be long") }
            }
            XCTAssertEqual(try names.plaintextName(ofBacking: backing.name, dirIV: iv, in: dir.fd), name)
        }
    }

    func testThresholdAndExpansionTable() throws {
        // The table in docs/FORMAT.md: plaintext bytes → stored name bytes.
        let table: [(Int, Int)] = [(1, 43), (15, 43), (16, 64), (31, 64), (32, 86), (143, 214), (144, 235), (159, 235), (160, 55), (255, 55)]
        for (plain, stored) in table {
            XCTAssertEqual(try names.backingName(for: Array(repeating: 0x61, count: plain), dirIV: iv).name.utf8.count, stored, "\(plain)")
        }
    }

    func testInvalidNames() {
        XCTAssertThrowsError(try names.backingName(for: Array(repeating: 0x61, count: 256), dirIV: iv)) {
            XCTAssertEqual($0 as? VaultError, .nameTooLong)
        }
        for bad in [[], [0x2e], [0x2e, 0x2e], Array("a/b".utf8), [0x61, 0]] as [[UInt8]] {
            XCTAssertThrowsError(try names.backingName(for: bad, dirIV: iv)) { XCTAssertEqual($0 as? VaultError, .invalidName) }
        }
    }

    func testReservedEntriesAreHidden() throws {
        let long = try create(Array(repeating: 0x62, count: 200))
        for reserved in [DirectoryIV.fileName, VaultConfig.fileName, long.sidecar!, ".coffer.conf.tmp.1"] {
            XCTAssertNil(try names.plaintextName(ofBacking: reserved, dirIV: iv, in: dir.fd), reserved)
        }
    }

    func testForeignAndTamperedNamesAreReported() throws {
        let backing = try create(Array("plans.txt".utf8))
        var chars = Array(backing.name)
        chars[5] = chars[5] == "A" ? "B" : "A"
        let tampered = String(chars)
        XCTAssertThrowsError(try names.plaintextName(ofBacking: tampered, dirIV: iv, in: dir.fd)) {
            XCTAssertEqual($0 as? VaultError, .nameDamaged(backingName: tampered))
        }
        XCTAssertThrowsError(try names.plaintextName(ofBacking: "not-base64!", dirIV: iv, in: dir.fd))
        XCTAssertThrowsError(try names.plaintextName(ofBacking: backing.name, dirIV: Sodium.randomArray(count: 16), in: dir.fd))
    }

    func testDamagedLongNameSidecarIsReported() throws {
        let backing = try create(Array(repeating: 0x63, count: 220))
        var sidecar = dir.read(backing.sidecar!)
        sidecar[10] = sidecar[10] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        chmod(dir.path + "/" + backing.sidecar!, 0o600)
        dir.write(backing.sidecar!, sidecar)
        XCTAssertThrowsError(try names.plaintextName(ofBacking: backing.name, dirIV: iv, in: dir.fd)) {
            XCTAssertEqual($0 as? VaultError, .longNameDamaged(backingName: backing.name))
        }
        unlink(dir.path + "/" + backing.sidecar!)
        XCTAssertThrowsError(try names.plaintextName(ofBacking: backing.name, dirIV: iv, in: dir.fd)) {
            XCTAssertEqual($0 as? VaultError, .longNameDamaged(backingName: backing.name))
        }
    }

    func testMissingOrDamagedDirectoryIV() throws {
        let empty = TempDirectory()
        XCTAssertThrowsError(try DirectoryIV.read(in: empty.fd, bound: false)) {
            guard case .directoryIVDamaged = $0 as? VaultError else { return XCTFail("\($0)") }
        }
        empty.write(DirectoryIV.fileName, [1, 2, 3])
        XCTAssertThrowsError(try DirectoryIV.read(in: empty.fd, bound: false))
        XCTAssertEqual(try DirectoryIV.read(in: dir.fd, bound: false).iv, iv)
        // A format-5 reader wants the tags too: an IV alone is damage there.
        XCTAssertThrowsError(try DirectoryIV.read(in: dir.fd, bound: true)) {
            guard case .directoryIVDamaged = $0 as? VaultError else { return XCTFail("\($0)") }
        }
    }
}

final class MetadataCodecTests: XCTestCase {
    let box = SealedBox(key: .random(count: 32))
    let names = NameCipher(macKey: .random(count: 32), streamKey: .random(count: 32))

    func testSymlinkTargets() throws {
        let codec = SymlinkCodec(box: box)
        let target = Array("../some/where/else".utf8)
        guard case .inline(let stored) = try codec.encrypt(target) else { return XCTFail("a short target is inline") }
        XCTAssertFalse(stored.contains("/"))
        XCTAssertEqual(try codec.decrypt(stored), target)
        XCTAssertEqual(SymlinkCodec.plainLength(storedLength: stored.utf8.count), target.count)
        let longest = [UInt8](repeating: 0x61, count: SymlinkCodec.maxInlineTargetLength)
        XCTAssertLessThanOrEqual(try codec.encrypt(longest).linkTarget.utf8.count, 4095)
        XCTAssertThrowsError(try codec.encrypt(longest + [0x61]))
        // Format 2: longer targets go into a sidecar that the link names.
        let format2 = SymlinkCodec(box: box, longTargets: true)
        guard case .sidecar(let reference, let content) = try format2.encrypt(longest + [0x61]) else { return XCTFail("sidecar") }
        XCTAssertEqual(reference.utf8.count, SymlinkCodec.referenceLength)
        XCTAssertEqual(try format2.decrypt(content), longest + [0x61])
        XCTAssertEqual(format2.sidecar(of: reference), reference)
        XCTAssertNil(codec.sidecar(of: reference), "format 1 never reads a sidecar")
        XCTAssertThrowsError(try format2.encrypt([UInt8](repeating: 0x61, count: 4096)))
        var chars = Array(stored)
        chars[30] = chars[30] == "A" ? "B" : "A"
        XCTAssertThrowsError(try codec.decrypt(String(chars))) {
            XCTAssertEqual($0 as? VaultError, .metadataDamaged(what: "symlink target"))
        }
    }

    func testXattrs() throws {
        let codec = XattrCodec(names: names, box: box)
        let name = Array("user.comment".utf8)
        let backing = try codec.backingName(for: name)
        XCTAssertTrue(backing.hasPrefix("user."))
        XCTAssertEqual(try codec.backingName(for: name), backing, "deterministic")
        XCTAssertEqual(codec.plaintextName(ofBacking: backing), name)
        XCTAssertNil(codec.plaintextName(ofBacking: "user.foreign"))
        let sealed = try codec.sealValue(Array("hello".utf8), backingName: backing)
        XCTAssertEqual(try codec.openValue(sealed, backingName: backing), Array("hello".utf8))
        XCTAssertEqual(XattrCodec.plainLength(sealedLength: sealed.count), 5)
        let other = try codec.backingName(for: Array("user.other".utf8))
        XCTAssertThrowsError(try codec.openValue(sealed, backingName: other), "a value moved to another name fails")
        XCTAssertLessThanOrEqual(try codec.backingName(for: Array(repeating: 0x61, count: XattrCodec.maxNameLength)).utf8.count, 255)
        XCTAssertThrowsError(try codec.backingName(for: Array(repeating: 0x61, count: XattrCodec.maxNameLength + 1)))
    }
}

/// Names a sync engine gives the copies it makes: strict decoding, and the readable names
/// coffer shows such copies under (ConflictName).
final class ConflictNameTests: NameDirectoryCase {

    let syncthing = ".sync-conflict-20261123-101500-ABCDEFG"
    let nextcloud = " (conflicted copy 2026-11-23 101500)"
    let dropbox = " (Ann's conflicted copy 2026-11-23)"
    let taken = " (1)"

    func testAValidNameWithASuffixIsNotThatName() throws {
        let backing = try names.backingName(for: Array("plans.txt".utf8), dirIV: iv)
        for suffix in ["~", ".bak", "x", " ", ".sync-conflict-x"] {
            XCTAssertThrowsError(try names.plaintextName(ofBacking: backing.name + suffix, dirIV: iv, in: dir.fd), suffix) {
                XCTAssertEqual($0 as? VaultError, .nameDamaged(backingName: backing.name + suffix))
            }
        }
    }

    func testEveryEnginesCopyOfAShortNameIsShownWithItsMarkerBeforeTheExtension() throws {
        let backing = try names.backingName(for: Array("report.odt".utf8), dirIV: iv)
        for marker in [syncthing, nextcloud, dropbox, taken] {
            let shown = try names.plaintextName(ofBacking: backing.name + marker, dirIV: iv, in: dir.fd)
            XCTAssertEqual(shown.map { String(decoding: $0, as: UTF8.self) }, "report" + marker + ".odt")
            // …and the shown name leads back to the copy, not to the original.
            let found = try names.conflictCopyName(for: Array(("report" + marker + ".odt").utf8), dirIV: iv) {
                $0 == backing.name + marker
            }
            XCTAssertEqual(found, .conflictCopy(backing.name + marker))
        }
        // Without an extension the marker is appended; a copy of a copy keeps both markers.
        let plain = try names.backingName(for: Array("Makefile".utf8), dirIV: iv)
        XCTAssertEqual(try names.plaintextName(ofBacking: plain.name + syncthing + taken, dirIV: iv, in: dir.fd),
                       Array(("Makefile" + syncthing + taken).utf8))
    }

    func testACopyOfALongNameIsShownThroughTheOriginalsSidecar() throws {
        let name = Array(repeating: UInt8(ascii: "L"), count: 200) + Array(".txt".utf8)
        let backing = try names.backingName(for: name, dirIV: iv)
        try NameTransform.writeSidecar(backing, in: dir.fd)
        // Syncthing inserts before the last '.': coffer.long<marker>.<hash>.
        let hash = backing.name.dropFirst(NameTransform.longNamePrefix.count)
        let copy = "coffer.long" + syncthing + "." + hash
        XCTAssertEqual(try names.plaintextName(ofBacking: copy, dirIV: iv, in: dir.fd),
                       Array(repeating: UInt8(ascii: "L"), count: 200) + Array((syncthing + ".txt").utf8))
        XCTAssertEqual(ConflictName.backingCandidates(original: backing.name, markers: Array(syncthing.utf8)).first, copy)
    }

    func testCopiesOfCoffersOwnFilesAreNotEntries() throws {
        for reserved in ["coffer" + syncthing + ".diriv", "coffer" + nextcloud + ".conf", "coffer.long.abc" + syncthing + ".name"] {
            XCTAssertNil(try names.plaintextName(ofBacking: reserved, dirIV: iv, in: dir.fd), reserved)
        }
    }

    func testMarkersAreRecognisedExactly() {
        let parse = { (s: String) in ConflictName.parse(plaintext: Array(s.utf8)) }
        XCTAssertEqual(parse("a" + syncthing + ".txt")?.original, Array("a.txt".utf8))
        XCTAssertEqual(parse("a" + nextcloud)?.original, Array("a".utf8))
        // The marker must stand where coffer puts it, and be well formed.
        XCTAssertNil(parse("a.txt" + syncthing))
        XCTAssertNil(parse("a.sync-conflict-2026112-101500-ABCDEFG.txt"))
        XCTAssertNil(parse("a.sync-conflict-20261123-101500-abcdefg.txt"))
        XCTAssertNil(parse("a (12345)"))
        XCTAssertNil(parse("a (x)"))
        XCTAssertNil(parse("a (1) b (2).txt"))  // two separate runs: ambiguous
        XCTAssertNil(parse(syncthing))          // nothing but a marker
        XCTAssertNil(parse("plain.txt"))
        // A display name that would pass 255 bytes is not offered.
        XCTAssertNil(ConflictName.display(original: Array(repeating: 0x61, count: 250), markers: Array(syncthing.utf8)))
    }
}

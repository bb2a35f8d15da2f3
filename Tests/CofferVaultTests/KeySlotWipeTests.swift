// Tests of the key-slot wipe without a mount: what it decides for each kind of entry, and
// what it does to a directory holding every kind under the names of the config's copies.
import CofferSystem
@testable import CofferVault
import Foundation
import Glibc
import TestSupport
import XCTest

final class KeySlotWipeTests: XCTestCase {
    var dir: TempDirectory!
    var outside: TempDirectory!

    override func setUp() { dir = TempDirectory(); outside = TempDirectory() }
    override func tearDown() { dir = nil; outside = nil }

    func testTheDecisionFollowsTheKindAndTheLinkCount() {
        XCTAssertEqual(KeySlotAction.decide(mode: S_IFREG | 0o400, links: 1), .overwrite)
        guard case .removeNameOnly = KeySlotAction.decide(mode: S_IFREG | 0o400, links: 2) else { return XCTFail("a hard link") }
        for (kind, word) in [(S_IFDIR, "directory"), (S_IFIFO, "FIFO"), (S_IFLNK, "symlink"), (S_IFSOCK, "socket"), (S_IFCHR, "device")] {
            guard case .leaveAlone(let what) = KeySlotAction.decide(mode: kind | 0o644, links: 1) else { return XCTFail(word) }
            XCTAssertTrue(what.contains(word), what)
        }
    }

    func testEveryRegularCopyGoesAndNothingElseIsTouched() throws {
        let victim = outside.path + "/victim"
        outside.write("victim", Array("the victim's bytes".utf8))
        let copies = [VaultConfig.fileName, ".coffer.conf.tmp.1", "coffer.sync-conflict-20260101-000000-ABCDEFG.conf"]
        for name in copies { dir.write(name, Array(repeating: 0x41, count: 700)) }
        chmod(dir.path + "/" + VaultConfig.fileName, 0o400)
        XCTAssertEqual(mkdir(dir.path + "/.coffer.conf.tmp.2", 0o700), 0)
        XCTAssertEqual(mkfifo(dir.path + "/.coffer.conf.tmp.3", 0o600), 0)
        XCTAssertEqual(symlink(victim, dir.path + "/.coffer.conf.tmp.4"), 0)
        XCTAssertEqual(link(victim, dir.path + "/.coffer.conf.tmp.5"), 0)
        dir.write("unrelated", [1, 2, 3])

        let report = try Vault.destroyKeySlots(in: dir.fd, includingConfig: true)
        XCTAssertEqual(Set(report.destroyed), Set(copies))
        XCTAssertEqual(report.leftAlone.map(\.name), [".coffer.conf.tmp.2", ".coffer.conf.tmp.3", ".coffer.conf.tmp.4"])
        XCTAssertEqual(report.notDestroyed.map(\.name), [".coffer.conf.tmp.5"])
        XCTAssertTrue(report.notDestroyed[0].what.contains("hard link"), report.notDestroyed[0].what)
        let left = try Sys.listDirectory(dir.fd).sorted()
        XCTAssertEqual(left, [".coffer.conf.tmp.2", ".coffer.conf.tmp.3", ".coffer.conf.tmp.4", "unrelated"])
        XCTAssertEqual(outside.read("victim"), Array("the victim's bytes".utf8))
        XCTAssertEqual(dir.read("unrelated"), [1, 2, 3])
    }

    func testStaleCopiesGoButTheConfigStays() throws {
        dir.write(VaultConfig.fileName, [1])
        dir.write(".coffer.conf.tmp.9", [2])
        let report = try Vault.destroyKeySlots(in: dir.fd, includingConfig: false)
        XCTAssertEqual(report.destroyed, [".coffer.conf.tmp.9"])
        XCTAssertEqual(try Sys.listDirectory(dir.fd), [VaultConfig.fileName])
    }

    /// The temp name of an atomic write has a random part: entries planted under the
    /// predictable `.NAME.tmp.PID` do not block it.
    func testAnAtomicWriteIsNotBlockedByAPlantedTempName() throws {
        XCTAssertEqual(mkdir(dir.path + "/.coffer.conf.tmp.\(getpid())", 0o700), 0)
        try AtomicFile.write([7], to: VaultConfig.fileName, in: dir.fd)
        XCTAssertEqual(dir.read(VaultConfig.fileName), [7])
        XCTAssertEqual(try Sys.listDirectory(dir.fd).sorted(), [".coffer.conf.tmp.\(getpid())", VaultConfig.fileName])
    }
}

// Tests that an opened vault stays the directory it was opened on: after CIPHERDIR is
// renamed away and another vault (or an empty directory) is put at its path, the
// config reread for an unlock, the claim, the file system and fsck all still act on
// the original directory.
import CofferCrypto
import CofferSystem
import CofferVault
@testable import CofferFileSystem
import Foundation
import Glibc
import TestSupport
import XCTest

final class VaultRootTests: XCTestCase {
    var dir: TempDirectory!
    /// Where the vault is created and opened, and where the impostor appears.
    var original: String { dir.path + "/vault" }
    /// Where the opened vault's directory is moved to.
    var moved: String { dir.path + "/moved" }

    override func setUp() { dir = TempDirectory() }
    override func tearDown() { dir = nil }

    /// Creates a vault at `original`, opens it there, moves its directory to `moved`, and
    /// puts an impostor at `original`: another vault, or an empty directory.
    func openThenSwap(impostorIsVault: Bool) throws -> (vault: Vault, recovery: SecureBytes) {
        XCTAssertEqual(mkdir(original, 0o700), 0)
        let recovery = try Vault.create(at: original, passphrase: secret("original"), kdf: .floor).recoveryKey
        let vault = try Vault.open(at: original)
        XCTAssertEqual(rename(original, moved), 0)
        XCTAssertEqual(mkdir(original, 0o700), 0)
        if impostorIsVault { _ = try Vault.create(at: original, passphrase: secret("impostor"), kdf: .floor) }
        return (vault, recovery)
    }

    /// Names in `path` other than the vault's own files.
    func entries(of path: String) -> Set<String> {
        Set((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? [])
            .subtracting([VaultConfig.fileName, DirectoryIV.fileName, UndoJournal.fileName])
    }

    func testTheConfigIsRereadFromTheOpenedDirectory() throws {
        for impostorIsVault in [true, false] {
            let (vault, recovery) = try openThenSwap(impostorIsVault: impostorIsVault)
            // What the gate does on each unlock.
            let reread = try vault.reopened()
            XCTAssertEqual(reread.config.kdf.salt, vault.config.kdf.salt, "impostor is a vault: \(impostorIsVault)")
            XCTAssertNoThrow(try reread.unlock(passphrase: secret("original")).wipe())
            XCTAssertNoThrow(try reread.unlock(recoveryKey: recovery).wipe())
            XCTAssertThrowsError(try reread.unlock(passphrase: secret("impostor")))
            dir = TempDirectory()
        }
    }

    func testTheClaimLocksTheOpenedDirectory() throws {
        let (vault, _) = try openThenSwap(impostorIsVault: true)
        let claim = try VaultClaim(vault, patience: 0)
        XCTAssertThrowsError(try VaultClaim(try Vault.open(at: moved), patience: 0), "the opened directory is claimed") {
            XCTAssertEqual($0 as? VaultError, .alreadyMounted(path: self.moved))
        }
        XCTAssertNoThrow(try VaultClaim(try Vault.open(at: original), patience: 0), "the impostor is not")
        withExtendedLifetime(claim) {}
    }

    func testTheFileSystemAndFsckWorkInTheOpenedDirectory() throws {
        let (vault, recovery) = try openThenSwap(impostorIsVault: true)
        let before = entries(of: original)
        let fs = try PlainFileSystem(vault: vault)
        fs.unlock(try vault.unlock(recoveryKey: recovery))
        let caller = PlainFileSystem.Caller(uid: geteuid(), gid: getegid())
        let (_, handle) = try fs.create(parent: NodeTable.rootID, name: Array("note".utf8), mode: 0o600, flags: O_RDWR, caller: caller)
        XCTAssertEqual(try Array("hello".utf8).withUnsafeBytes { try fs.write(handle, $0, at: 0, caller: caller) }, 5)
        fs.release(handle)

        XCTAssertEqual(entries(of: moved).count, 1, "the new file's backing entry is in the opened directory")
        XCTAssertEqual(entries(of: original), before, "the impostor is untouched")
        XCTAssertTrue(FileManager.default.fileExists(atPath: moved + "/" + UndoJournal.fileName), "the journal is the opened vault's")
        XCTAssertFalse(FileManager.default.fileExists(atPath: original + "/" + UndoJournal.fileName))

        var problems: [VaultProblem] = []
        let summary = VaultChecker(vault: vault, master: try vault.unlock(recoveryKey: recovery), report: { problems.append($0) }).run()
        XCTAssertEqual(summary.files, 1)
        XCTAssertEqual(summary.bytes, Int64(BlockLayout.plainBlockSize))
        XCTAssertTrue(problems.isEmpty, "\(problems)")
    }
}

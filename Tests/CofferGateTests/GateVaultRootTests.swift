// Tests that the gate rereads the config of the directory its vault was opened on, not
// of whatever CIPHERDIR's path names at unlock time.
import CofferCrypto
import CofferGate
import CofferVault
import Foundation
import Glibc
import XCTest

final class GateVaultRootTests: XCTestCase {
    func testUnlockReadsTheConfigOfTheOpenedDirectoryAfterItWasReplaced() throws {
        let fixture = try GateFixture()
        let moved = fixture.path + ".moved"
        defer { try? FileManager.default.removeItem(atPath: moved) }
        XCTAssertEqual(rename(fixture.path, moved), 0)
        XCTAssertEqual(mkdir(fixture.path, 0o700), 0)
        _ = try Vault.create(at: fixture.path, passphrase: GateFixture.secret("impostor"), kdf: .floor)

        let response = fixture.unlock()
        XCTAssertTrue(response.ok, "\(response)")
        XCTAssertTrue(fixture.fs.isUnlocked)
        fixture.gate.lock(reason: .command, detail: "test")
        XCTAssertEqual(fixture.unlock("impostor").error, ControlError.wrongPassphrase, "the impostor's passphrase opens nothing")
    }
}

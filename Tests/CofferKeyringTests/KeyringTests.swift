// Tests of the keyring layer (CofferKeyring over the CKeyring shim) against
// gnome-keyring-daemon on a private session bus: an item stored, looked up and cleared,
// another slot's item absent, and a keyring that is locked or gone.
import CofferCrypto
@testable import CofferKeyring
import Foundation
import Glibc
import TestSupport
import XCTest

final class KeyringTests: XCTestCase {
    var dir: TempDirectory!
    var desktop: DesktopKeyring!
    var bus: String?

    override func setUpWithError() throws {
        dir = TempDirectory()
        desktop = try DesktopKeyring(directory: dir.path + "/desktop")
        addTeardownBlock { [desktop] in desktop?.stop() }
        // libsecret finds the session bus in the environment, read when it first connects.
        bus = getenv("DBUS_SESSION_BUS_ADDRESS").map { String(cString: $0) }
        setenv("DBUS_SESSION_BUS_ADDRESS", desktop.bus, 1)
    }

    override func tearDown() {
        if let bus { setenv("DBUS_SESSION_BUS_ADDRESS", bus, 1) } else { unsetenv("DBUS_SESSION_BUS_ADDRESS") }
        desktop = nil
        dir = nil
    }

    func testAnItemIsStoredFoundAndClearedAndAKeyringThatIsLockedOrGoneIsSaidSo() throws {
        let key = SecureBytes.random(count: 32)
        try Keyring.store(key, vault: "vault-A", slot: "slot-1", label: "a test item")
        XCTAssertEqual(bytes(try Keyring.lookup(vault: "vault-A", slot: "slot-1", size: 32)), bytes(key))
        for (vault, slot) in [("vault-A", "slot-2"), ("vault-B", "slot-1")] {
            XCTAssertThrowsError(try Keyring.lookup(vault: vault, slot: slot, size: 32), "\(vault) \(slot)") {
                XCTAssertEqual($0 as? KeyringError, .notFound)
            }
        }
        XCTAssertThrowsError(try Keyring.lookup(vault: "vault-A", slot: "slot-1", size: 16), "a size that is not the item's") {
            guard case KeyringError.failed = $0 else { return XCTFail("\($0)") }
        }
        try Keyring.clear(vault: "vault-A", slot: "slot-1")
        XCTAssertThrowsError(try Keyring.lookup(vault: "vault-A", slot: "slot-1", size: 32)) { XCTAssertEqual($0 as? KeyringError, .notFound) }
        XCTAssertThrowsError(try Keyring.clear(vault: "vault-A", slot: "slot-1")) { XCTAssertEqual($0 as? KeyringError, .notFound) }

        try Keyring.store(key, vault: "vault-A", slot: "slot-3", label: "another")
        XCTAssertEqual(desktop.lockCollection(), 0)
        XCTAssertThrowsError(try Keyring.lookup(vault: "vault-A", slot: "slot-3", size: 32)) { XCTAssertEqual($0 as? KeyringError, .locked) }
        XCTAssertThrowsError(try Keyring.store(key, vault: "vault-A", slot: "slot-4", label: "refused")) {
            XCTAssertEqual($0 as? KeyringError, .locked)
        }
        desktop.stopKeyring()
        XCTAssertThrowsError(try Keyring.lookup(vault: "vault-A", slot: "slot-3", size: 32)) {
            guard case KeyringError.unavailable = $0 else { return XCTFail("\($0)") }
        }
    }
}

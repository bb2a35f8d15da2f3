// End-to-end: keyring key slots with gnome-keyring-daemon on a private session bus
// (DesktopKeyring): add a slot (the keyring holds a 32-byte slot key, never the
// passphrase), unlock with it, its removal clearing the item, and a keyring that is
// locked or gone, each with its status. The daemon never loads libsecret.
import CofferSystem
import Foundation
import Glibc
import TestSupport
import XCTest

final class KeyringSlotTests: EndToEndCase {
    func testAKeyringSlotUnlocksAndItsRemovalClearsTheItem() throws {
        let desktop = try DesktopKeyring(directory: scratch.path + "/desktop")
        addTeardownBlock { desktop.stop() }
        let vault = MountedVault(scratch: scratch)
        vault.mount()
        assertOK(vault.sh("echo 'kept by the keyring' > f"), "write")
        vault.unmount()
        let config = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: vault.cipherdir + "/coffer.conf"))) as? [String: Any])
        let vaultID = try XCTUnwrap(config["checksum"] as? String)

        assertOK(coffer(["keyslot", "add", "--keyring", "--label", "session", "--passfile", vault.passfile, vault.cipherdir], environment: desktop.environment), "add --keyring")
        let list = coffer(["keyslot", "list", vault.cipherdir], environment: desktop.environment)
        XCTAssertTrue(list.stdout.contains("keyring     session"), list.stdout)
        let slotID = try XCTUnwrap(list.stdout.split(separator: "\n").first { $0.hasPrefix("keyring") }?.split(separator: " ").dropFirst(2).first.map(String.init))
        // The item holds a 32-byte slot key under the vault's and the slot's ids, not the passphrase.
        let item = Harness.run(["sh", "-c", "secret-tool lookup -- vault '\(vaultID)' slot '\(slotID)' | wc -c"], environment: desktop.environment)
        XCTAssertEqual(item.stdout.trimmingCharacters(in: .whitespacesAndNewlines), "32", item.stderr)
        let passphrase = try String(contentsOfFile: vault.passfile, encoding: .utf8).trimmingCharacters(in: .newlines)
        let found = Harness.run(["secret-tool", "search", "--all", "--", "vault", vaultID], environment: desktop.environment).stdout
        XCTAssertFalse(found.contains(passphrase))
        // The item's label names the vault by its id, never by the path CIPHERDIR was given as.
        XCTAssertTrue(found.contains("label = coffer: key slot \"session\" of vault \(vaultID.prefix(12))"), found)
        XCTAssertFalse(found.contains(vault.cipherdir), found)

        assertOK(coffer(["mount", "--log-file", vault.logFile, "--state-dir", vault.stateDir, vault.cipherdir, vault.mountpoint], environment: desktop.environment), "mount locked")
        let unlocked = coffer(["unlock", "--keyring", vault.mountpoint], environment: desktop.environment)
        assertOK(unlocked, "unlock --keyring")
        XCTAssertEqual(unlocked.stderr, "")
        XCTAssertEqual(vault.sh("cat f").stdout, "kept by the keyring\n")
        if let pid = vault.daemonPID {
            let maps = KernelFiles.text("/proc/\(pid)/maps") ?? ""
            XCTAssertFalse(maps.isEmpty || maps.contains("libsecret") || maps.contains("libglib"), "the daemon mapped libsecret or GLib")
        } else {
            XCTFail("no daemon pid")
        }
        assertOK(coffer(["lock", vault.mountpoint], environment: desktop.environment), "lock")
        assertOK(coffer(["fsck", "--with-keyring", vault.cipherdir], environment: desktop.environment), "fsck opened with the keyring")

        // Removed: the item is gone and unlock --keyring has nothing to open.
        assertOK(coffer(["keyslot", "remove", "--slot", "session", "--passfile", vault.passfile, vault.cipherdir], environment: desktop.environment), "remove")
        XCTAssertEqual(Harness.run(["secret-tool", "lookup", "--", "vault", vaultID, "slot", slotID], environment: desktop.environment).status, 1,
                       "the keyring item outlived its slot")
        let removed = coffer(["unlock", "--keyring", vault.mountpoint], environment: desktop.environment)
        XCTAssertEqual(removed.status, 59, removed.stderr)

        // A slot whose item was deleted behind coffer's back: the same status, its own words.
        assertOK(coffer(["keyslot", "add", "--keyring", "--label", "again", "--passfile", vault.passfile, vault.cipherdir], environment: desktop.environment), "add again")
        assertOK(Harness.run(["secret-tool", "clear", "--", "vault", vaultID], environment: desktop.environment), "delete the item")
        let deleted = coffer(["unlock", "--keyring", vault.mountpoint], environment: desktop.environment)
        XCTAssertEqual(deleted.status, 59, deleted.stderr)
        XCTAssertTrue(deleted.stderr.contains("holds the key of none"), deleted.stderr)

        // A locked keyring, then none at all: status 58, one line that says which.
        assertOK(coffer(["keyslot", "add", "--keyring", "--label", "third", "--passfile", vault.passfile, vault.cipherdir], environment: desktop.environment), "add a third")
        XCTAssertEqual(desktop.lockCollection(), 0, "lock the keyring")
        let locked = coffer(["unlock", "--keyring", vault.mountpoint], environment: desktop.environment)
        XCTAssertEqual(locked.status, 58, locked.stderr)
        XCTAssertTrue(locked.stderr.contains("keyring is locked"), locked.stderr)
        desktop.stopKeyring()
        let gone = coffer(["unlock", "--keyring", vault.mountpoint], environment: desktop.environment)
        XCTAssertEqual(gone.status, 58, gone.stderr)
        XCTAssertTrue(gone.stderr.contains("no desktop keyring"), gone.stderr)
        XCTAssertEqual(gone.stderr.split(separator: "\n").count, 1, gone.stderr)
        // Removing a keyring slot without the keyring: the slot goes, and the item left behind is named.
        let orphan = coffer(["keyslot", "remove", "--slot", "third", "--passfile", vault.passfile, vault.cipherdir], environment: desktop.environment)
        assertOK(orphan, "remove without the keyring")
        XCTAssertTrue(orphan.stderr.contains("was not cleared") && orphan.stderr.contains("secret-tool clear -- vault \(vaultID)"), orphan.stderr)
        assertOK(coffer(["unlock", "--passfile", vault.passfile, vault.mountpoint], environment: desktop.environment), "the passphrase still opens")
        vault.unmount()
    }
}

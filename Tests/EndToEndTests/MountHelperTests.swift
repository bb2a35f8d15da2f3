// End-to-end: mount(8), umount(8) and fstab lines of type coffer, through the mount.coffer
// helper. mount(8) finds helpers only in /sbin (here /usr/sbin), so each test links
// /usr/sbin/mount.coffer to the built binary and removes the link when it ends.
import Foundation
import XCTest

/// Links /usr/sbin/mount.coffer to `target` for the rest of `test`; skips the test if
/// another mount.coffer is installed there (it is never replaced).
func linkMountHelper(to target: String, for test: XCTestCase) throws {
    let helper = "/usr/sbin/mount.coffer"
    let fm = FileManager.default
    if let existing = try? fm.destinationOfSymbolicLink(atPath: helper) {
        // A link of ours that an interrupted run left behind is taken over.
        guard existing.hasPrefix(Harness.binDirectory) || existing.hasPrefix("/tmp/coffer-e2e-") else {
            throw XCTSkip("\(helper) is installed (→ \(existing)); not replaced by a test")
        }
        try fm.removeItem(atPath: helper)
    } else if fm.fileExists(atPath: helper) {
        throw XCTSkip("\(helper) is installed; not replaced by a test")
    }
    try fm.createSymbolicLink(atPath: helper, withDestinationPath: target)
    test.addTeardownBlock { try? fm.removeItem(atPath: helper) }
}

final class MountHelperTests: EndToEndCase {
    func status(_ vault: MountedVault) -> [String: Any] {
        let r = Harness.run([Harness.coffer, "status", "--json", vault.mountpoint])
        return (try? JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any]) ?? [:]
    }

    /// Waits until the daemon serving `vault` has gone (its socket answers no more).
    func assertDaemonGone(_ vault: MountedVault, file: StaticString = #filePath, line: UInt = #line) {
        var r = Outcome(status: 0, stdout: "", stderr: "")
        for _ in 0..<100 {
            r = Harness.run([Harness.coffer, "status", vault.mountpoint])
            if r.status != 0 { break }
            usleep(50_000)
        }
        XCTAssertEqual(r.status, 39, "the daemon still answers after umount", file: file, line: line)
    }

    func testMountDashTAndUmount() throws {
        try linkMountHelper(to: Harness.coffer, for: self)
        let vault = MountedVault(scratch: scratch)
        let c = vault.cipherdir, m = vault.mountpoint
        assertOK(Harness.run(["mount", "-t", "coffer", c, m, "-o", "passfile=\(vault.passfile),allow_other,idle_lock=15m,ro"]),
                 "mount -t coffer")
        XCTAssertTrue(vault.isMounted)
        let state = status(vault)
        XCTAssertEqual(state["state"] as? String, "unlocked", "\(state)")
        XCTAssertEqual(state["idleLockSeconds"] as? Int, 900, "\(state)")
        let options = Harness.sh("findmnt -n -o FSTYPE,OPTIONS \(m)").stdout
        XCTAssertTrue(options.hasPrefix("fuse.coffer "), options)
        for option in ["ro", "allow_other", "default_permissions"] {
            XCTAssertTrue(options.split(whereSeparator: { $0 == "," || $0 == " " || $0 == "\n" }).contains { $0 == option },
                          "\(option) missing: \(options)")
        }
        XCTAssertTrue(vault.sh("touch new").stderr.contains("Read-only file system"))
        assertOK(vault.sh("ls"), "ls in the unlocked mount")
        assertOK(Harness.run(["umount", m]), "umount")
        XCTAssertFalse(vault.isMounted)
        assertDaemonGone(vault)
    }

    func testFstabLine() throws {
        try linkMountHelper(to: Harness.coffer, for: self)
        let vault = MountedVault(scratch: scratch)
        let c = vault.cipherdir, m = vault.mountpoint
        let fstab = scratch.file("fstab", """
            # a coffer vault, mounted on first access by systemd, boot goes on without it
            \(c) \(m) coffer noauto,nofail,x-systemd.automount,x-systemd.idle-timeout=5min,_netdev,passfile=\(vault.passfile),idle_lock=90s,comment=test 0 0

            """)
        assertOK(Harness.run(["mount", "-a", "-T", fstab]), "mount -a")
        XCTAssertFalse(vault.isMounted, "mount -a mounted a noauto line")
        assertOK(Harness.run(["mount", "-T", fstab, m]), "mount MOUNTPOINT from fstab")
        XCTAssertTrue(vault.isMounted)
        XCTAssertEqual(status(vault)["state"] as? String, "unlocked")
        XCTAssertEqual(status(vault)["idleLockSeconds"] as? Int, 90)
        assertOK(Harness.run(["umount", m]), "umount")
        assertDaemonGone(vault)

        // Without passfile= the mount comes up locked, as `coffer mount` does.
        _ = scratch.file("fstab", "\(c) \(m) coffer noauto 0 0\n")
        assertOK(Harness.run(["mount", "-T", fstab, m]), "mount, locked")
        XCTAssertEqual(status(vault)["state"] as? String, "locked")
        assertOK(Harness.run([Harness.coffer, "unlock", "--passfile", vault.passfile, m]), "unlock")
        assertOK(Harness.run(["umount", m]), "umount")
        assertDaemonGone(vault)
    }

    func testSecretsNeverInlineAndBadOptions() throws {
        try linkMountHelper(to: Harness.coffer, for: self)
        let vault = MountedVault(scratch: scratch)
        let c = vault.cipherdir, m = vault.mountpoint
        for option in ["passphrase=hunter2", "password=hunter2", "key=hunter2"] {
            let r = Harness.run(["/usr/sbin/mount.coffer", c, m, "-o", option])
            XCTAssertEqual(r.status, 64, "\(option): \(r.stderr)")
            XCTAssertTrue(r.stderr.hasPrefix("coffer: mount.coffer: -o ") && r.stderr.contains("is refused"), r.stderr)
            XCTAssertFalse(r.stderr.contains("hunter2"), "the secret is echoed: \(r.stderr)")
            XCTAssertFalse(vault.isMounted)
        }
        let viaMount = Harness.run(["mount", "-t", "coffer", c, m, "-o", "passphrase=hunter2"])
        XCTAssertNotEqual(viaMount.status, 0)
        XCTAssertFalse(vault.isMounted)
        XCTAssertEqual(Harness.run(["/usr/sbin/mount.coffer", c, m, "-o", "idle_lock=soon"]).status, 64)
        XCTAssertEqual(Harness.run(["/usr/sbin/mount.coffer", c, m, "-o", "bogus_option"]).status, 64)
        XCTAssertEqual(Harness.run(["/usr/sbin/mount.coffer", c]).status, 64)
        // -f (fake) does everything but the mount.
        assertOK(Harness.run(["/usr/sbin/mount.coffer", c, m, "-f", "-o", "passfile=\(vault.passfile)"]), "mount.coffer -f")
        XCTAssertFalse(vault.isMounted)
        // coffer's own errors keep their statuses: a missing passfile is 24, a failing extpass 43.
        XCTAssertEqual(Harness.run(["/usr/sbin/mount.coffer", c, m, "-o", "passfile=\(scratch.path)/none"]).status, 24)
        XCTAssertEqual(Harness.run(["/usr/sbin/mount.coffer", c, m, "-o", "extpass=false"]).status, 43)
        // extpass= names a command (no shell), not a secret.
        assertOK(Harness.run(["/usr/sbin/mount.coffer", c, m, "-o", "extpass=cat \(vault.passfile),idle_lock=1h"]), "extpass=")
        XCTAssertEqual(status(vault)["state"] as? String, "unlocked")
        assertOK(Harness.run(["umount", m]), "umount")
        assertDaemonGone(vault)
    }
}

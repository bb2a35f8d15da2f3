// End-to-end: passphrases that come from the host rather than a terminal — an external
// program (--extpass) and systemd's credentials ($CREDENTIALS_DIRECTORY/coffer.passphrase).
import Foundation
import XCTest

final class PassphraseSourceTests: EndToEndCase {
    func state(_ mountpoint: String) -> String {
        coffer(["status", mountpoint]).stdout.contains("State:           unlocked") ? "unlocked" : "locked"
    }

    // MARK: --extpass

    func testExtpassForInitMountUnlockAndPasswd() {
        let cipher = scratch.mkdir("vault"), plain = scratch.mkdir("plain")
        // The command prints more than one line (as `pass show` does): only the first counts.
        let passfile = scratch.file("pass", "first secret\nuser: someone\nurl: example.org\n")
        assertOK(coffer(["init", "--kdf-ops", "2", "--kdf-memory", "64", "--extpass", "cat \(passfile)", cipher]), "init --extpass")
        let only = scratch.file("only", "first secret\n")
        assertOK(coffer(["mount", "--extpass", "cat \(passfile)", cipher, plain]), "mount --extpass")
        XCTAssertEqual(state(plain), "unlocked", "the passphrase was the first line")
        assertOK(Harness.sh("echo hello > \(plain)/f"), "write")
        assertOK(coffer(["lock", plain]), "lock")
        // Repeated --extpass: each is one whole argument, spaces and all (no shell).
        assertOK(coffer(["unlock", "--extpass", "sh", "--extpass", "-c", "--extpass", "echo first secret", plain]), "unlock --extpass")
        XCTAssertEqual(Harness.sh("cat \(plain)/f").stdout, "hello\n")
        assertOK(coffer(["unmount", plain]), "unmount")

        let newfile = scratch.file("new", "second secret\n")
        assertOK(coffer(["passwd", "--extpass", "cat \(only)", "--new-extpass", "cat \(newfile)", cipher]), "passwd --extpass --new-extpass")
        XCTAssertEqual(coffer(["fsck", "--extpass", "cat \(only)", cipher]).status, 22, "the old passphrase is gone")
        assertOK(coffer(["fsck", "--passfile", newfile, cipher]), "fsck with the new passphrase")
        XCTAssertEqual(coffer(["mount", "--passfile", newfile, "--extpass", "cat \(newfile)", cipher, plain]).status, 64,
                       "--passfile and --extpass together are a usage error")
    }

    func testFailingExtpassHasItsOwnStatusAndOneLine() {
        let vault = MountedVault(scratch: scratch)
        let cases: [([String], Int32, String)] = [
            (["--extpass", "false"], 43, "coffer: --extpass: false failed with exit status 1\n"),
            (["--extpass", "sh", "--extpass", "-c", "--extpass", "echo partial; exit 3"], 43,
             "coffer: --extpass: sh failed with exit status 3\n"),
            (["--extpass", "sh", "--extpass", "-c", "--extpass", "kill -KILL $$"], 43,
             "coffer: --extpass: sh was killed by signal 9\n"),
            (["--extpass", "/nonexistent/askpass --flag"], 43,
             "coffer: --extpass: cannot run /nonexistent/askpass: No such file or directory\n"),
            (["--extpass", "true"], 20, "coffer: empty passphrase: --extpass true printed nothing\n"),
        ]
        for (options, status, message) in cases {
            let r = coffer(["mount"] + options + [vault.cipherdir, vault.mountpoint])
            XCTAssertEqual(r.status, status, "\(options): \(r.stderr)")
            XCTAssertEqual(r.stderr, message, "\(options)")
            XCTAssertFalse(vault.isMounted, "\(options) mounted")
            XCTAssertFalse(r.stderr.contains("partial"), "a failing command's output is never shown")
        }
        // The same for unlock, against a locked mount.
        assertOK(coffer(["mount", vault.cipherdir, vault.mountpoint]), "mount, locked")
        XCTAssertEqual(coffer(["unlock", "--extpass", "false", vault.mountpoint]).status, 43)
        XCTAssertEqual(state(vault.mountpoint), "locked")
        vault.unmount()
    }

    // MARK: systemd credentials

    /// A credentials directory as systemd makes it for a unit (LoadCredentialEncrypted=).
    func credentials(_ passphrase: String?) -> String {
        let dir = scratch.mkdir("credentials-\(UUID().uuidString.prefix(8))")
        if let passphrase {
            _ = FileManager.default.createFile(atPath: dir + "/coffer.passphrase", contents: Data(passphrase.utf8),
                                           attributes: [.posixPermissions: 0o400])
        }
        chmod(dir, 0o500)
        return dir
    }

    func testCredentialUnlocksMountAndUnlock() {
        let vault = MountedVault(scratch: scratch)
        let good = ["CREDENTIALS_DIRECTORY": credentials("passphrase of vault")]   // no newline, as systemd-creds may keep it
        assertOK(coffer(["mount", vault.cipherdir, vault.mountpoint], environment: good), "mount with a credential")
        XCTAssertEqual(state(vault.mountpoint), "unlocked")
        assertOK(coffer(["lock", vault.mountpoint]), "lock")
        assertOK(coffer(["unlock", vault.mountpoint], environment: good), "unlock with a credential")
        XCTAssertEqual(state(vault.mountpoint), "unlocked")
        vault.unmount()

        // A unit without the credential (or another one) mounts locked, as before.
        let none = ["CREDENTIALS_DIRECTORY": credentials(nil)]
        assertOK(coffer(["mount", vault.cipherdir, vault.mountpoint], environment: none), "mount without the credential")
        XCTAssertEqual(state(vault.mountpoint), "locked")
        vault.unmount()

        let wrong = ["CREDENTIALS_DIRECTORY": credentials("not it\n")]
        XCTAssertEqual(coffer(["mount", vault.cipherdir, vault.mountpoint], environment: wrong).status, 22)
        XCTAssertFalse(vault.isMounted)
        // An explicit --passfile wins over the credential.
        assertOK(coffer(["mount", "--passfile", vault.passfile, vault.cipherdir, vault.mountpoint], environment: wrong), "--passfile over a credential")
        XCTAssertEqual(state(vault.mountpoint), "unlocked")
        vault.unmount()
    }

    /// As coffer@.service runs it: `coffer mount --foreground`, standard input /dev/null.
    func testCredentialInAForegroundDaemon() {
        let vault = MountedVault(scratch: scratch)
        let script = """
            import os, subprocess, sys, time
            coffer, cipher, plain, creds = sys.argv[1:5]
            env = dict(os.environ, CREDENTIALS_DIRECTORY=creds)
            daemon = subprocess.Popen([coffer, "mount", "--foreground", cipher, plain], env=env,
                                      stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(600):
                if os.path.ismount(plain): break
                time.sleep(0.05)
            open(os.path.join(plain, "f"), "w").write("unlocked at start")
            subprocess.run(["fusermount3", "-u", plain], check=True)
            assert daemon.wait(timeout=30) == 0
            print("foreground ok")
            """
        let r = Harness.run(["python3", "-c", script, Harness.coffer, vault.cipherdir, vault.mountpoint,
                             credentials("passphrase of vault\n")])
        XCTAssertTrue(r.stdout.contains("foreground ok"), r.stdout + r.stderr)
    }
}

// End-to-end: `coffer mount`/`unmount` — their errors and exit statuses, usage errors
// in one line, options refused without echoing them, signals, and a mount by an
// unprivileged user.
import Foundation
import XCTest

final class MountCommandTests: EndToEndCase {
    func testMountErrorsHaveTheirStatus() {
        let vault = MountedVault(scratch: scratch)
        let file = scratch.file("file", "x")
        let full = scratch.mkdir("full")
        _ = scratch.file("full/x", "x")
        let wrong = scratch.file("wrong", "not the passphrase\n")
        let notVault = scratch.mkdir("notvault")
        let cases: [([String], Int32, String)] = [
            (["--passfile", vault.passfile, vault.cipherdir, scratch.path + "/missing"], 30, "does not exist"),
            (["--passfile", vault.passfile, vault.cipherdir, file], 31, "is not a directory"),
            (["--passfile", vault.passfile, vault.cipherdir, full], 32, "is not empty"),
            (["--passfile", vault.passfile, notVault, vault.mountpoint], 12, "not a coffer vault"),
            (["--passfile", wrong, vault.cipherdir, vault.mountpoint], 22, "wrong passphrase"),
        ]
        for (arguments, status, message) in cases {
            let r = Harness.run([Harness.coffer, "mount"] + arguments)
            XCTAssertEqual(r.status, status, "\(arguments): \(r.stderr)")
            XCTAssertTrue(r.stderr.contains(message), "\(arguments): \(r.stderr)")
            XCTAssertFalse(vault.isMounted)
        }
        vault.mount()
        let again = Harness.run([Harness.coffer, "mount", "--passfile", vault.passfile, vault.cipherdir, vault.mountpoint])
        XCTAssertEqual(again.status, 33, again.stderr)
        let elsewhere = Harness.run([Harness.coffer, "mount", "--passfile", vault.passfile, vault.cipherdir, scratch.mkdir("second")])
        XCTAssertEqual(elsewhere.status, 29, "one vault, one daemon: \(elsewhere.stderr)")
        XCTAssertTrue(elsewhere.stderr.contains("already mounted by another coffer daemon"), elsewhere.stderr)
        XCTAssertEqual(vault.sh("echo still > f && cat f").stdout, "still\n", "the first mount keeps serving")
        let notMounted = Harness.run([Harness.coffer, "unmount", full])
        XCTAssertEqual(notMounted.status, 36, notMounted.stderr)
        vault.unmount()
    }

    /// Issue 39: a usage error is one line, `coffer: …`, with exit status 64 — not
    /// swift-argument-parser's "Error:" and usage lines.
    func testAUsageErrorIsOneLine() {
        let vault = MountedVault(scratch: scratch)
        for arguments in [["mount", "--bogus", vault.cipherdir, vault.mountpoint], ["mount", vault.cipherdir],
                          ["wipe"], ["frobnicate"], ["mount", "--threads", "0", vault.cipherdir, vault.mountpoint]] {
            let r = Harness.run([Harness.coffer] + arguments)
            XCTAssertEqual(r.status, 64, "\(arguments): \(r.stderr)")
            XCTAssertEqual(r.stderr.split(separator: "\n").count, 1, "\(arguments): \(r.stderr)")
            XCTAssertTrue(r.stderr.hasPrefix("coffer: "), "\(arguments): \(r.stderr)")
        }
    }

    /// Issue 39: a bare -o word that libfuse refuses is not repeated (it may be a secret
    /// typed in the wrong place); `-o subtype=` is refused (`coffer unmount` knows coffer's
    /// mounts by their type, fuse.coffer).
    func testRefusedOptionsAreNotEchoedAndSubtypeIsRefused() {
        let vault = MountedVault(scratch: scratch)
        for option in ["hunter2", "noatime,hunter2", "subtype=hunter2", "noatime,subtype=hunter2"] {
            let r = Harness.run([Harness.coffer, "mount", "--passfile", vault.passfile, "-o", option, vault.cipherdir, vault.mountpoint])
            XCTAssertEqual(r.status, 64, "\(option): \(r.stderr)")
            XCTAssertFalse(r.stderr.contains("hunter2"), "\(option) echoed: \(r.stderr)")
            XCTAssertEqual(r.stderr.split(separator: "\n").count, 1, "\(option): \(r.stderr)")
            XCTAssertFalse(vault.isMounted, option)
        }
        let subtype = Harness.run([Harness.coffer, "mount", "--passfile", vault.passfile, "-o", "subtype=x", vault.cipherdir, vault.mountpoint])
        XCTAssertTrue(subtype.stderr.contains("subtype"), subtype.stderr)
    }

    /// -o read_ahead_kb=N, for root's mounts: the mount's readahead window in
    /// /sys/class/bdi is N KiB (the kernel's 128 without it); more than 1024, or an
    /// ordinary user's mount, is refused in one line (64).
    func testReadAheadKBSetsTheMountsWindowForRootOnly() {
        let vault = MountedVault(scratch: scratch)
        let window = "cat /sys/class/bdi/$(findmnt -n -o MAJ:MIN '\(vault.mountpoint)' | tr -d ' ')/read_ahead_kb"
        assertOK(vault.mount(["-o", "read_ahead_kb=1024"]), "mount with read_ahead_kb")
        XCTAssertEqual(Harness.sh(window).stdout, "1024\n", vault.log)
        XCTAssertTrue(vault.log.contains("readahead of \(vault.mountpoint): 1024 KiB"), vault.log)
        vault.unmount()
        assertOK(vault.mount(), "mount")
        XCTAssertEqual(Harness.sh(window).stdout, "128\n")
        vault.unmount()
        let big = Harness.run([Harness.coffer, "mount", "-o", "read_ahead_kb=2048", vault.cipherdir, vault.mountpoint])
        XCTAssertEqual(big.status, 64, big.stderr)
        XCTAssertTrue(big.stderr.contains("read_ahead_kb takes a number of KiB from 0 to 1024"), big.stderr)
        let user = Harness.run(["runuser", "-u", "nobody", "--", Harness.coffer, "mount", "-o", "noatime,read_ahead_kb=512",
                                vault.cipherdir, vault.mountpoint])
        XCTAssertEqual(user.status, 64, user.stderr)
        XCTAssertTrue(user.stderr.contains("is for a mount made by root"), user.stderr)
        XCTAssertEqual(user.stderr.split(separator: "\n").count, 1, user.stderr)
        XCTAssertFalse(vault.isMounted)
    }

    /// Issue 39: a mount refused after the daemon made the vault's state directory (here:
    /// an escaped allow_other, taken down at once) leaves no directory behind in
    /// /var/lib/coffer; nor (issue 36, the daemon's lifecycle) its control socket, which
    /// was listening by then.
    func testARefusedMountLeavesNoStateDirectory() {
        let name = "refused-\(getpid())-\(Int.random(in: 0..<1_000_000))"
        let vault = MountedVault(scratch: scratch, name: name)
        let mine = { ((try? FileManager.default.contentsOfDirectory(atPath: "/var/lib/coffer")) ?? []).filter { $0.hasPrefix(name) } }
        addTeardownBlock { for dir in mine() { try? FileManager.default.removeItem(atPath: "/var/lib/coffer/" + dir) } }
        let socket = scratch.path + "/\(name).sock"
        let r = Harness.run([Harness.coffer, "mount", "--passfile", vault.passfile, "--socket", socket, "-o", "allow\\_other",
                             vault.cipherdir, vault.mountpoint])
        XCTAssertEqual(r.status, 64, r.stderr)
        XCTAssertFalse(vault.isMounted)
        XCTAssertEqual(mine(), [], "a refused mount left its state directory")
        XCTAssertFalse(FileManager.default.fileExists(atPath: socket), "a refused mount left its control socket")
    }

    /// Issue 36: the daemon's own threads carry their names into the kernel (BackgroundThread),
    /// so `top -H` and /proc say which is which; and they end with the daemon.
    func testTheDaemonsThreadsAreNamed() throws {
        let vault = MountedVault(scratch: scratch)
        vault.mount(["--idle-lock", "1h"])
        defer { vault.unmount() }
        let pid = try XCTUnwrap(vault.daemonPID)
        let names = Set(Harness.sh("cat /proc/\(pid)/task/*/comm").stdout.split(separator: "\n").map(String.init))
        for expected in ["coffer-control", "coffer-ctl-0", "coffer-ctl-3", "coffer-events", "coffer-watch", "coffer-idle"] {
            XCTAssertTrue(names.contains(expected), "no thread \(expected) in \(names.sorted())")
        }
    }

    func testBusyUnmountIsRefusedAndKeepsServing() {
        let vault = mountedVault()
        let holder = Process()
        holder.executableURL = URL(fileURLWithPath: "/bin/sleep")
        holder.arguments = ["30"]
        holder.currentDirectoryURL = URL(fileURLWithPath: vault.mountpoint)
        XCTAssertNoThrow(try holder.run())
        defer { holder.terminate(); holder.waitUntilExit() }
        let r = Harness.run([Harness.coffer, "unmount", vault.mountpoint])
        XCTAssertEqual(r.status, 37, r.stderr)
        XCTAssertTrue(vault.isMounted)
    }

    func testSignalsEndTheDaemonCleanly() {
        for signal in ["TERM", "INT"] {
            let vault = mountedVault("v\(signal)")
            assertOK(vault.sh("echo data > f"), "write")
            Harness.sh("pkill -\(signal) -f -- '--log-file \(vault.logFile)'")
            let deadline = Date().addingTimeInterval(30)
            while vault.isMounted && Date() < deadline { usleep(50_000) }
            XCTAssertFalse(vault.isMounted, "SIG\(signal) did not unmount")
            XCTAssertTrue(vault.log.contains("keys wiped"), vault.log)
            vault.mount()
            XCTAssertEqual(vault.sh("cat f").stdout, "data\n")
            vault.unmount()
        }
    }

    func testFusermountEndsTheDaemon() {
        let vault = mountedVault()
        assertOK(Harness.sh("fusermount3 -u \(vault.mountpoint)"), "fusermount3 -u")
        let deadline = Date().addingTimeInterval(30)
        while !vault.log.contains("keys wiped") && Date() < deadline { usleep(50_000) }
        XCTAssertTrue(vault.log.contains("keys wiped"), vault.log)
    }

    /// `coffer unmount` returns once the daemon has wiped its keys and released the vault:
    /// a mount right after it succeeds (issue 19, item 3), again and again.
    func testAMountRightAfterAnUnmountSucceeds() {
        let vault = MountedVault(scratch: scratch)
        for round in 0..<10 {
            let r = Harness.run([Harness.coffer, "mount", "--passfile", vault.passfile, "--log-file", vault.logFile,
                                 vault.cipherdir, vault.mountpoint])
            XCTAssertEqual(r.status, 0, "round \(round): \(r.stderr)")
            assertOK(vault.sh("echo \(round) > f"), "write")
            assertOK(Harness.run([Harness.coffer, "unmount", vault.mountpoint]), "unmount")
            // The daemon's last line is written when unmount returns, not after.
            XCTAssertEqual(vault.log.components(separatedBy: "unmounted \(vault.mountpoint); keys wiped").count - 1, round + 1, vault.log)
            guard r.status == 0 else { return }
        }
    }

    func testAnUnprivilegedUserMountsUsesAndUnmounts() throws {
        // nobody needs a directory it owns, and to reach the built binary.
        let home = scratch.mkdir("nobody")
        assertOK(Harness.sh("chown nobody: \(home) && chmod 755 \(scratch.path)"), "prepare")
        let coffer = Harness.coffer
        let r = Harness.sh("""
            cd \(home)
            runuser -u nobody -- bash -euo pipefail -c '
              mkdir v m && echo pass > p
              \(coffer) init --kdf-ops 2 --kdf-memory 64 --passfile p v > /dev/null
              \(coffer) mount --passfile p --log-file log v m
              echo hello > m/f && cat m/f && ls -la m | grep " nobody " > /dev/null
              mkdir -m 555 m/ro && rmdir m/ro
              echo x > m/wo && chmod 200 m/wo && echo y > m/wo && chmod 600 m/wo && test "$(cat m/wo)" = y
              \(coffer) unmount m
              test -z "$(ls -A m)"
            '
            """)
        assertOK(r, "unprivileged mount")
        XCTAssertTrue(r.stdout.contains("hello"))
    }
}

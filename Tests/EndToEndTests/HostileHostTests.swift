// End-to-end: the gate on a busy host and against a hostile backing directory — a
// mount table longer than a page, FIFOs planted in CIPHERDIR, `-o allow_other`, wipe
// after an interrupted passwd, connection floods, and what outlives a lock.
import Foundation
import XCTest

final class HostileHostTests: EndToEndCase {
    func coffer(_ arguments: [String], input: String? = nil, timeout: TimeInterval = 120) -> Outcome {
        Harness.run([Harness.coffer] + arguments, input: input, timeout: timeout)
    }

    /// Mounts tmpfs file systems on long paths until /proc/self/mountinfo is longer than
    /// `bytes`; they are unmounted when the test ends, whatever happened.
    func padMountTable(beyond bytes: Int) {
        var level = scratch.path + "/padding"
        var pads: [String] = []
        addTeardownBlock { for pad in pads.reversed() { Harness.run(["umount", "-l", pad]) } }
        let size = { Int(Harness.sh("wc -c < /proc/self/mountinfo").stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0 }
        while size() <= bytes && pads.count < 40 {
            level += "/" + String(repeating: "p", count: 200)
            let pad = scratch.mkdir(String(level.dropFirst(scratch.path.count + 1)))
            let r = Harness.run(["mount", "-t", "tmpfs", "-o", "size=1m", "coffer-padding-" + String(repeating: "x", count: 200), pad])
            XCTAssertEqual(r.status, 0, r.stderr)
            guard r.status == 0 else { return }
            pads.append(pad)
        }
    }

    // MARK: 1. A mount table longer than 4 KiB

    func testUnmountWipeAndBusyMountpointWithALongMountTable() {
        padMountTable(beyond: 8192)
        let vault = mountedVault()
        assertOK(vault.sh("echo precious > f"), "write")
        XCTAssertGreaterThan(Int(Harness.sh("wc -c < /proc/self/mountinfo").stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0, 8192)
        let again = coffer(["mount", "--passfile", vault.passfile, vault.cipherdir, vault.mountpoint])
        XCTAssertEqual(again.status, 33, "a mounted mountpoint: \(again.stderr)")
        let wipe = coffer(["wipe", "--yes", vault.cipherdir])
        XCTAssertEqual(wipe.status, 0, wipe.stderr)
        XCTAssertTrue(coffer(["status", vault.mountpoint]).stdout.contains("State:           locked"), "wipe locks the running mount")
        XCTAssertTrue(vault.sh("cat f").stderr.contains("Permission denied"))
        let unmount = coffer(["unmount", vault.mountpoint])
        XCTAssertEqual(unmount.status, 0, unmount.stderr)
        XCTAssertFalse(vault.isMounted)
    }

    // MARK: 2. FIFOs planted in CIPHERDIR

    /// Replaces the backing `name` (relative to the cipherdir) by a FIFO; when the test
    /// ends, the FIFO is opened for writing once so that a reader stuck on it returns.
    func plantFIFO(_ vault: MountedVault, at name: String) {
        let path = vault.cipherdir + "/" + name
        assertOK(Harness.sh("rm -f '\(path)' && mkfifo '\(path)'"), "mkfifo")
        addTeardownBlock {
            Harness.run(["python3", "-c", "import os, sys\ntry: os.close(os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK))\nexcept OSError: pass", path])
        }
    }

    func testAFIFODirectoryIVNeitherHangsAListingNorDeniesTheLock() {
        let vault = mountedVault()
        assertOK(vault.sh("mkdir d && touch d/f"), "mkdir")
        vault.unmount()
        let dir = Harness.sh("cd \(vault.cipherdir) && for d in */; do echo ${d%/}; done").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        plantFIFO(vault, at: dir + "/coffer.diriv")
        vault.mount()
        // The listing runs in the background: on a build that blocks on the FIFO it would
        // sit in the kernel until the FIFO is written to.
        let script = """
            (rc=0; ls "$M/d" > /dev/null 2> "$R.ls" || rc=$?; echo $rc > "$R.rc") < /dev/null > /dev/null 2>&1 &
            sleep 2
            start=$(date +%s)
            timeout 20 \(Harness.coffer) lock "$M" > /dev/null 2> "$R.lock" && echo locked
            echo elapsed $(( $(date +%s) - start ))
            timeout 10 \(Harness.coffer) status "$M" | head -1
            """
        let r = Harness.sh("export M='\(vault.mountpoint)' R='\(scratch.path)/fifo'; " + script, timeout: 60)
        XCTAssertTrue(r.stdout.contains("locked\n"), "lock: \(r.stdout) \(r.stderr)")
        let elapsed = Int(r.stdout.components(separatedBy: "elapsed ").last?.prefix(while: { $0.isNumber }) ?? "") ?? 99
        XCTAssertLessThanOrEqual(elapsed, 10, "the lock must complete within seconds")
        XCTAssertTrue(r.stdout.contains("State:           locked"), r.stdout)
        let listing = (try? String(contentsOfFile: scratch.path + "/fifo.rc", encoding: .utf8)) ?? "still running"
        XCTAssertNotEqual(listing.trimmingCharacters(in: .whitespacesAndNewlines), "0", "listing a directory whose IV is a FIFO")
        XCTAssertNotEqual(listing, "still running", "the listing must fail at once, not wait for a writer")
    }

    func testAFIFOConfigOrDirectoryIVNeitherHangsInfoNorFsck() {
        let vault = MountedVault(scratch: scratch)
        let copy = scratch.mkdir("copy")
        assertOK(Harness.sh("cp -a \(vault.cipherdir)/. \(copy)/"), "copy")
        vault.mount()
        assertOK(vault.sh("mkdir d && echo hi > d/f"), "mkdir")
        vault.unmount()
        let dir = Harness.sh("cd \(vault.cipherdir) && for d in */; do echo ${d%/}; done").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        plantFIFO(vault, at: dir + "/coffer.diriv")
        let fsck = coffer(["fsck", "--passfile", vault.passfile, vault.cipherdir], timeout: 20)
        XCTAssertEqual(fsck.status, 40, "fsck reports the FIFO: \(fsck.stdout) \(fsck.stderr)")
        XCTAssertTrue(fsck.stdout.contains("not a regular file"), fsck.stdout)

        let path = copy + "/coffer.conf"
        assertOK(Harness.sh("rm -f \(path) && mkfifo \(path)"), "mkfifo")
        addTeardownBlock {
            Harness.run(["python3", "-c", "import os, sys\ntry: os.close(os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK))\nexcept OSError: pass", path])
        }
        let info = coffer(["info", copy], timeout: 20)
        XCTAssertEqual(info.status, 13, "info on a FIFO config: \(info.stderr)")
        XCTAssertTrue(info.stderr.contains("not a regular file"), info.stderr)
    }
}

// End-to-end: `coffer keyslot` — labelled passphrase slots added on two machines' copies
// of one vault and merged as a sync engine would, a mount that unlocks with each (a slot
// added while it is mounted too), removal refused for the last way in, each user error's
// exit status, passwd --slot, and wipe destroying every slot file.
import Foundation
import Glibc
import XCTest

final class KeySlotTests: EndToEndCase {
    func slotFiles(_ cipherdir: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: cipherdir + "/coffer.slots")) ?? []).sorted()
    }

    /// Mounts `cipherdir` locked (no passphrase given) at `mountpoint`.
    func mountLocked(_ vault: MountedVault) {
        let r = Harness.run([Harness.coffer, "mount", "--log-file", vault.logFile, "--state-dir", vault.stateDir,
                             vault.cipherdir, vault.mountpoint])
        XCTAssertEqual(r.status, 0, r.stderr)
    }

    /// Unlocks with `passfile`, reads f, locks again.
    func assertUnlocks(_ vault: MountedVault, with passfile: String, _ what: String, file: StaticString = #filePath, line: UInt = #line) {
        let unlock = coffer(["unlock", "--passfile", passfile, vault.mountpoint])
        XCTAssertEqual(unlock.status, 0, "\(what): \(unlock.stderr)", file: file, line: line)
        XCTAssertEqual(vault.sh("cat f").stdout, "the same file on both machines\n", what, file: file, line: line)
        assertOK(coffer(["lock", vault.mountpoint]), "lock after \(what)")
    }

    func testSlotsAddedOnTwoMachinesMergeAndEachUnlocks() {
        let vault = MountedVault(scratch: scratch)
        vault.mount()
        assertOK(vault.sh("echo 'the same file on both machines' > f"), "write")
        vault.unmount()
        // Machine B has a copy of CIPHERDIR, as a sync engine keeps one.
        let machineB = scratch.mkdir("machineB.cipher")
        assertOK(Harness.sh("cp -a '\(vault.cipherdir)/.' '\(machineB)/'"), "copy to machine B")
        let laptop = scratch.file("laptop.pass", "the laptop's words\n")
        let desktop = scratch.file("desktop.pass", "the desktop's words\n")
        let late = scratch.file("late.pass", "added while mounted\n")
        let wrong = scratch.file("wrong.pass", "nobody's words\n")

        // Both machines add a slot at the same time, each to its own copy.
        assertOK(coffer(["keyslot", "add", "--label", "laptop", "--passfile", vault.passfile, "--new-passfile", laptop, vault.cipherdir]), "add on A")
        assertOK(coffer(["keyslot", "add", "--label", "desktop", "--passfile", vault.passfile, "--new-passfile", desktop, machineB]), "add on B")
        // The same label on both machines: two slots once merged.
        let twinA = scratch.file("twinA.pass", "twin words of A\n"), twinB = scratch.file("twinB.pass", "twin words of B\n")
        assertOK(coffer(["keyslot", "add", "--label", "twin", "--passfile", vault.passfile, "--new-passfile", twinA, vault.cipherdir]), "twin on A")
        assertOK(coffer(["keyslot", "add", "--label", "twin", "--passfile", vault.passfile, "--new-passfile", twinB, machineB]), "twin on B")
        // The sync: every file of B arrives in A, and no name is on both sides (no conflict).
        let onA = slotFiles(vault.cipherdir), onB = slotFiles(machineB)
        XCTAssertEqual(onA.count, 2)
        XCTAssertEqual(onB.count, 2)
        XCTAssertTrue(Set(onA).isDisjoint(with: onB), "the two machines wrote the same slot file: \(onA) \(onB)")
        assertOK(Harness.sh("cp -an '\(machineB)/coffer.slots/.' '\(vault.cipherdir)/coffer.slots/' && cmp '\(machineB)/coffer.conf' '\(vault.cipherdir)/coffer.conf'"),
                 "merge B into A (coffer.conf is the same on both)")
        let list = coffer(["keyslot", "list", vault.cipherdir])
        assertOK(list, "list")
        for label in ["passphrase", "recovery", "laptop", "desktop"] { XCTAssertTrue(list.stdout.contains(" \(label) "), list.stdout) }
        let twins = coffer(["keyslot", "remove", "--slot", "twin", "--passfile", vault.passfile, vault.cipherdir])
        XCTAssertEqual(twins.status, 53, "a label of two slots: \(twins.stderr)")
        XCTAssertEqual(slotFiles(vault.cipherdir).count, 4, "nothing was removed")

        // The merged vault, mounted locked, opens with every passphrase.
        mountLocked(vault)
        assertUnlocks(vault, with: vault.passfile, "the passphrase of coffer.conf")
        assertUnlocks(vault, with: laptop, "machine A's slot")
        assertUnlocks(vault, with: desktop, "machine B's slot")
        assertUnlocks(vault, with: twinA, "machine A's twin")
        assertUnlocks(vault, with: twinB, "machine B's twin")
        // A slot added while mounted is tried at the next unlock: the mount reads the slots anew.
        assertOK(coffer(["keyslot", "add", "--label", "late", "--passfile", desktop, "--new-passfile", late, vault.cipherdir]), "add while mounted")
        assertUnlocks(vault, with: late, "a slot added while mounted")
        let refused = coffer(["unlock", "--passfile", wrong, vault.mountpoint])
        XCTAssertEqual(refused.status, 22, refused.stderr)
        XCTAssertFalse(vault.log.contains("nobody's words"), "the log never holds a secret")
        usleep(1_100_000)  // the throttle's delay after one failure

        // Removed while mounted: that passphrase opens nothing any more, the others still do.
        assertOK(coffer(["keyslot", "remove", "--slot", "laptop", "--passfile", desktop, vault.cipherdir]), "remove laptop")
        let gone = coffer(["unlock", "--passfile", laptop, vault.mountpoint])
        XCTAssertEqual(gone.status, 22, "a removed slot still unlocks: \(gone.stderr)")
        usleep(2_100_000)  // the second failure's delay
        assertUnlocks(vault, with: desktop, "the desktop's slot after the laptop's removal")
        vault.unmount()
    }

    func testRemovalKeepsAWayInAndEachErrorHasItsStatus() {
        let vault = MountedVault(scratch: scratch)
        let other = scratch.file("other.pass", "other words\n")
        let newer = scratch.file("newer.pass", "newer words\n")
        let cipher = vault.cipherdir
        assertOK(coffer(["keyslot", "add", "--label", "other", "--passfile", vault.passfile, "--new-passfile", other, cipher]), "add")
        let taken = coffer(["keyslot", "add", "--label", "other", "--passfile", vault.passfile, "--new-passfile", other, cipher])
        XCTAssertEqual(taken.status, 52, taken.stderr)
        let badLabel = coffer(["keyslot", "add", "--label", "recovery", "--passfile", vault.passfile, "--new-passfile", other, cipher])
        XCTAssertEqual(badLabel.status, 64, badLabel.stderr)
        let wrongWay = coffer(["keyslot", "add", "--label", "third", "--passfile", newer, "--new-passfile", other, cipher])
        XCTAssertEqual(wrongWay.status, 22, "adding needs an existing way in: \(wrongWay.stderr)")
        let missing = coffer(["keyslot", "remove", "--slot", "nothing", "--passfile", vault.passfile, cipher])
        XCTAssertEqual(missing.status, 51, missing.stderr)

        // passwd of the labelled slot: its new passphrase opens, its old one does not.
        assertOK(coffer(["passwd", "--slot", "other", "--passfile", vault.passfile, "--new-passfile", newer, cipher]), "passwd --slot")
        assertOK(coffer(["fsck", "--passfile", newer, cipher]), "fsck with the slot's new passphrase")
        XCTAssertEqual(coffer(["fsck", "--passfile", other, cipher]).status, 22)
        XCTAssertEqual(coffer(["passwd", "--slot", "nothing", "--passfile", newer, "--new-passfile", other, cipher]).status, 51)

        // coffer.conf's two slots can go; the last slot file cannot.
        assertOK(coffer(["keyslot", "remove", "--slot", "passphrase", "--passfile", newer, cipher]), "remove the config's passphrase")
        assertOK(coffer(["keyslot", "remove", "--slot", "recovery", "--passfile", newer, cipher]), "remove the recovery slot")
        XCTAssertEqual(coffer(["fsck", "--passfile", vault.passfile, cipher]).status, 22)
        XCTAssertEqual(coffer(["passwd", "--passfile", newer, "--new-passfile", other, cipher]).status, 51,
                       "passwd without --slot needs coffer.conf's passphrase slot")
        let last = coffer(["keyslot", "remove", "--slot", "other", "--passfile", newer, cipher])
        XCTAssertEqual(last.status, 50, last.stderr)
        XCTAssertTrue(last.stderr.contains("last way in"), last.stderr)
        XCTAssertEqual(slotFiles(cipher).count, 1)
        assertOK(coffer(["fsck", "--passfile", newer, cipher]), "the last way in still opens")

        // Wipe destroys the slot files with the config.
        assertOK(Harness.run([Harness.coffer, "mount", "--passfile", newer, "--log-file", vault.logFile, "--state-dir", vault.stateDir,
                              cipher, vault.mountpoint]), "mount with the slot's passphrase")
        assertOK(coffer(["wipe", "--yes", cipher]), "wipe")
        XCTAssertFalse(FileManager.default.fileExists(atPath: cipher + "/coffer.slots"), "coffer.slots survived the wipe")
        XCTAssertEqual(coffer(["fsck", "--passfile", newer, cipher]).status, 12)
        if vault.isMounted { vault.unmount() }
    }

    /// fsck reports what is in coffer.slots: a temp file of an interrupted add is a
    /// leftover that --repair destroys; an entry that is no slot record is damage.
    func testFsckReportsTheSlotDirectory() {
        let vault = MountedVault(scratch: scratch)
        let other = scratch.file("other.pass", "other words\n")
        assertOK(coffer(["keyslot", "add", "--label", "other", "--passfile", vault.passfile, "--new-passfile", other, vault.cipherdir]), "add")
        assertOK(vault.fsck(), "fsck of a vault with a slot file")
        let slots = vault.cipherdir + "/coffer.slots"
        assertOK(Harness.sh("cp \(slots)/*.slot \(slots)/.interrupted.slot.tmp.1.abc && echo junk > \(slots)/junk.slot"), "plant")
        let found = vault.fsck()
        XCTAssertEqual(found.status, 40, found.stdout + found.stderr)
        XCTAssertTrue(found.stdout.contains("coffer.slots/junk.slot") && found.stdout.contains("not a key slot"), found.stdout)
        XCTAssertTrue(found.stdout.contains("leftover:") && found.stdout.contains(".interrupted.slot.tmp.1.abc"), found.stdout)
        XCTAssertEqual(vault.fsck(["--repair"]).status, 40)
        XCTAssertFalse(FileManager.default.fileExists(atPath: slots + "/.interrupted.slot.tmp.1.abc"), "--repair left the temp file")
        assertOK(Harness.sh("rm \(slots)/junk.slot"), "remove the junk")
        assertOK(vault.fsck(), "fsck after")
        assertOK(Harness.run([Harness.coffer, "fsck", "--passfile", other, vault.cipherdir]), "fsck with the slot's passphrase")
    }

    /// `keyslot remove` killed at each step (strace kills it as it makes its Nth call of a
    /// kind: the first and second overwrite's write and fsync, the unlink, the rename): the
    /// slot is there and opens the vault, or its passphrase opens nothing; fsck finds no
    /// damage (a removal cut after its slot left the slots' names is a leftover that may
    /// hold the wrapped key, named as such), `keyslot list` lists without complaint, and
    /// the next removal destroys the leftover.
    func testASlotRemovalKilledAtAnyStepLeavesNoDamagedSlot() {
        let vault = MountedVault(scratch: scratch)
        let other = scratch.file("other.pass", "other words\n"), third = scratch.file("third.pass", "third words\n")
        assertOK(coffer(["keyslot", "add", "--label", "other", "--passfile", vault.passfile, "--new-passfile", other, vault.cipherdir]), "add")
        let original = scratch.path + "/original.cipher"
        assertOK(Harness.sh("cp -a '\(vault.cipherdir)' '\(original)'"), "copy")
        for (call, n) in [("renameat2", 1), ("pwrite64", 1), ("fsync", 1), ("pwrite64", 2), ("fsync", 2), ("unlinkat", 1)] {
            assertOK(Harness.sh("rm -rf '\(vault.cipherdir)' && cp -a '\(original)' '\(vault.cipherdir)'"), "restore")
            let cut = Harness.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=\(call)", "-e", "inject=\(call):error=EIO:signal=KILL:when=\(n)",
                                   Harness.coffer, "keyslot", "remove", "--passfile", vault.passfile, "--slot", "other", vault.cipherdir])
            XCTAssertTrue([SIGKILL, 128 + SIGKILL].contains(cut.status), "\(call) \(n): not killed: \(cut.status) \(cut.stderr)")
            let fsck = vault.fsck()
            XCTAssertEqual(fsck.status, 0, "\(call) \(n): " + fsck.stdout + fsck.stderr)
            let slotLeft = slotFiles(vault.cipherdir).contains { !$0.hasPrefix(".") }
            let opens = Harness.run([Harness.coffer, "fsck", "--passfile", other, vault.cipherdir]).status == 0
            XCTAssertEqual(slotLeft, opens, "\(call) \(n): a slot file is there: \(slotLeft), its passphrase opens: \(opens)")
            if slotFiles(vault.cipherdir).contains(where: { $0.hasPrefix(".") }) {
                XCTAssertTrue(fsck.stdout.contains("a slot whose removal was interrupted"), "\(call) \(n): \(fsck.stdout)")
            }
            let list = coffer(["keyslot", "list", vault.cipherdir])
            XCTAssertEqual(list.status, 0, "\(call) \(n): " + list.stderr)
            XCTAssertFalse(list.stderr.contains("not a slot"), "\(call) \(n): " + list.stderr)
            assertOK(coffer(["keyslot", "add", "--label", "third", "--passfile", vault.passfile, "--new-passfile", third, vault.cipherdir]), "add")
            assertOK(coffer(["keyslot", "remove", "--passfile", vault.passfile, "--slot", "third", vault.cipherdir]), "remove")
            XCTAssertEqual(slotFiles(vault.cipherdir).filter { $0.hasPrefix(".") }, [], "\(call) \(n): the next removal left a leftover")
        }
    }

    /// A copy of `record` (a slot file's JSON) with Argon2id costs `ops` passes and `mib`
    /// MiB, and the id `id`, planted in coffer.slots as `name` (it can open nothing: its
    /// costs and id are bound by its AD).
    func plantCostly(_ cipherdir: String, from record: String, as name: String, id: String, ops: Int, mib: Int) throws {
        let slots = cipherdir + "/coffer.slots/"
        var json = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: slots + record))) as? [String: Any])
        var kdf = try XCTUnwrap(json["kdf"] as? [String: Any])
        kdf["opsLimit"] = ops
        kdf["memLimit"] = mib << 20
        json["kdf"] = kdf
        json["id"] = id
        try JSONSerialization.data(withJSONObject: json).write(to: URL(fileURLWithPath: slots + name))
        chmod(slots + name, 0o400)
    }

    /// A slot file planted with costs far above the vault's, named to sort first, costs
    /// an unlock nothing: the labelled passphrase opens at once, a typo is refused as one,
    /// `keyslot list` and `status` name the file as passed over, and `unlock --slot` still
    /// tries it — in a KDF helper that ends when its daemon is killed.
    func testAPlantedCostlySlotFileNeverHoldsUpAnUnlock() throws {
        let vault = MountedVault(scratch: scratch)
        vault.mount()
        assertOK(vault.sh("echo 'the same file on both machines' > f"), "write")
        vault.unmount()
        let laptop = scratch.file("laptop.pass", "the laptop's words\n")
        assertOK(coffer(["keyslot", "add", "--label", "laptop", "--passfile", vault.passfile, "--new-passfile", laptop, vault.cipherdir]), "add")
        let record = try XCTUnwrap(slotFiles(vault.cipherdir).first)
        let planted = String(repeating: "f", count: 32)
        try plantCostly(vault.cipherdir, from: record, as: "0-planted.slot", id: planted, ops: 64, mib: 1024)

        mountLocked(vault)
        let unlock = Harness.run([Harness.coffer, "unlock", "--passfile", laptop, vault.mountpoint], timeout: 60)
        XCTAssertEqual(unlock.status, 0, "the labelled passphrase waited for the planted slot: \(unlock.stderr)")
        XCTAssertEqual(vault.sh("cat f").stdout, "the same file on both machines\n")
        assertOK(coffer(["lock", vault.mountpoint]), "lock")
        let typo = Harness.run([Harness.coffer, "unlock", "--passfile", scratch.file("typo.pass", "a typo\n"), vault.mountpoint], timeout: 60)
        XCTAssertEqual(typo.status, 22, typo.stderr)
        let list = coffer(["keyslot", "list", vault.cipherdir])
        XCTAssertTrue(list.stdout.contains("coffer.slots/0-planted.slot: passed over at a passphrase unlock"), list.stdout)
        let status = coffer(["status", vault.mountpoint])
        XCTAssertTrue(status.stdout.contains("Passed over:     coffer.slots/0-planted.slot"), status.stdout)

        // Named with --slot, the planted slot is tried (once the typo's delay has passed):
        // its Argon2id runs in the daemon's KDF helper, which ends with the daemon.
        assertOK(Harness.sh("for i in $(seq 100); do \(Harness.coffer) status --json '\(vault.mountpoint)' | grep '\"retryAfter\" : 0,' > /dev/null && exit 0; sleep 0.1; done; exit 1"),
                 "the typo's delay passes")
        guard let daemon = vault.daemonPID else { return XCTFail("no daemon pid") }
        let tried = Harness.start([Harness.coffer, "unlock", "--slot", planted, "--passfile", laptop, vault.mountpoint])
        addTeardownBlock { tried.terminate(); tried.waitUntilExit() }
        let helper = Harness.sh("for i in $(seq 200); do p=$(pgrep -f '[k]df-helper --parent \(daemon)') && { echo $p; exit 0; }; sleep 0.05; done; exit 1")
        assertOK(helper, "the KDF helper of the --slot unlock")
        kill(daemon, SIGKILL)
        let ended = Harness.sh("for i in $(seq 100); do pgrep -f '[k]df-helper --parent \(daemon)' >/dev/null || exit 0; sleep 0.1; done; exit 1")
        XCTAssertEqual(ended.status, 0, "the KDF helper outlived its daemon")
        Harness.run(["pkill", "-KILL", "-f", "[k]df-helper --parent \(daemon)"])
        Harness.run(["fusermount3", "-u", "-z", vault.mountpoint])
    }
}

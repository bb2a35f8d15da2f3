// End-to-end: TPM2 key slots with swtpm as this machine's TPM (SoftwareTPM, on loopback):
// add a slot, unlock with it (coffer unlock --tpm2, mount --unlock-tpm2), a PCR policy
// that stops matching (its own status; the passphrase still opens), a slot of another
// machine (another swtpm state) listed as such and passed over quietly, no TPM at all,
// the last way in kept, and wipe destroying the slot files. The daemon never loads libtss2.
import CofferSystem
import Foundation
import Glibc
import TestSupport
import XCTest

final class TPM2SlotTests: EndToEndCase {
    /// A software TPM (another machine's for each `name`), ended by this test's teardown.
    func softwareTPM(_ name: String) throws -> SoftwareTPM {
        let tpm = try SoftwareTPM(stateDirectory: scratch.path + "/" + name)
        addTeardownBlock { tpm.stop() }
        return tpm
    }

    /// Mounts the vault locked: no passphrase given.
    func mountLocked(_ vault: MountedVault, _ extra: [String] = [], tpm: SoftwareTPM) -> Outcome {
        coffer(["mount", "--log-file", vault.logFile, "--state-dir", vault.stateDir] + extra + [vault.cipherdir, vault.mountpoint], environment: tpm.environment)
    }

    func state(_ vault: MountedVault) -> String {
        let status = Harness.run([Harness.coffer, "status", "--json", vault.mountpoint]).stdout
        return status.contains("\"state\" : \"unlocked\"") ? "unlocked" : status.contains("\"state\" : \"locked\"") ? "locked" : status
    }

    func testATPM2SlotUnlocksAndAChangedPCRHasItsOwnStatus() throws {
        let tpm = try softwareTPM("tpm")
        let vault = MountedVault(scratch: scratch)
        vault.mount()
        assertOK(vault.sh("echo 'sealed to this machine' > f"), "write")
        vault.unmount()

        let added = coffer(["keyslot", "add", "--tpm2", "--tpm2-pcrs", "7,0", "--label", "laptop TPM", "--passfile", vault.passfile,
                            vault.cipherdir], environment: tpm.environment)
        assertOK(added, "keyslot add --tpm2")
        XCTAssertTrue(added.stdout.contains("PCRs 0,7"), added.stdout)
        let list = coffer(["keyslot", "list", vault.cipherdir], environment: tpm.environment)
        XCTAssertTrue(list.stdout.contains("tpm2 (PCRs 0,7) laptop TPM"), list.stdout)

        // coffer unlock --tpm2 of a locked mount: no secret asked, nothing on stderr.
        assertOK(mountLocked(vault, tpm: tpm), "mount locked")
        XCTAssertEqual(state(vault), "locked")
        let unlocked = coffer(["unlock", "--tpm2", vault.mountpoint], environment: tpm.environment)
        assertOK(unlocked, "unlock --tpm2")
        XCTAssertEqual(unlocked.stderr, "")
        XCTAssertEqual(vault.sh("cat f").stdout, "sealed to this machine\n")
        XCTAssertTrue(vault.log.contains("unlocked (uid \(getuid()), slot key of slot"), vault.log)
        // The daemon unwrapped the slot file itself and never loaded libtss2.
        if let pid = vault.daemonPID {
            let maps = KernelFiles.text("/proc/\(pid)/maps") ?? ""
            XCTAssertFalse(maps.isEmpty, "no maps of the daemon")
            XCTAssertFalse(maps.contains("libtss2"), "the daemon mapped libtss2")
        } else {
            XCTFail("no daemon pid")
        }
        vault.unmount()

        // mount --unlock-tpm2: mounted and unlocked in one go.
        assertOK(mountLocked(vault, ["--unlock-tpm2"], tpm: tpm), "mount --unlock-tpm2")
        XCTAssertEqual(state(vault), "unlocked")
        assertOK(Harness.run([Harness.coffer, "lock", vault.mountpoint]), "lock")

        // A PCR the slot is sealed to changes (as a boot-loader update would): its own status,
        // one line that says what to do, and the passphrase still opens.
        try tpm.extendPCR(7)
        let changed = coffer(["unlock", "--tpm2", vault.mountpoint], environment: tpm.environment)
        XCTAssertEqual(changed.status, 55, changed.stderr)
        XCTAssertEqual(changed.stderr.split(separator: "\n").count, 1, changed.stderr)
        XCTAssertTrue(changed.stderr.contains("\"laptop TPM\" (PCRs 0,7)") && changed.stderr.contains("changed"), changed.stderr)
        XCTAssertEqual(state(vault), "locked")
        assertOK(Harness.run([Harness.coffer, "unlock", "--passfile", vault.passfile, vault.mountpoint]), "the passphrase after the PCR changed")
        XCTAssertEqual(vault.sh("cat f").stdout, "sealed to this machine\n")
        vault.unmount()
        // Mounted with --unlock-tpm2 now: the mount stays up, locked, with the same status.
        let stays = mountLocked(vault, ["--unlock-tpm2"], tpm: tpm)
        XCTAssertEqual(stays.status, 55, stays.stderr)
        XCTAssertTrue(stays.stderr.contains("is mounted but stays locked"), stays.stderr)
        XCTAssertEqual(state(vault), "locked")
        vault.unmount()
    }

    /// At boot: coffer@.service runs `coffer mount --foreground $COFFER_OPTIONS`, an fstab
    /// line runs mount.coffer. With --unlock-tpm2 (unlock_tpm2 in fstab) each comes up and
    /// is unlocked by the TPM; on a machine whose TPM does not open the vault, the unit's
    /// mount stays up, locked, and its log says why. The daemon never maps libtss2.
    func testAtBootTheUnitAndAnFstabLineUnlockWithTheTPM() throws {
        let tpm = try softwareTPM("tpm"), other = try softwareTPM("other")
        let vault = MountedVault(scratch: scratch)
        vault.mount()
        assertOK(vault.sh("echo 'opened at boot' > f"), "write")
        vault.unmount()
        assertOK(coffer(["keyslot", "add", "--tpm2", "--label", "server TPM", "--passfile", vault.passfile, vault.cipherdir],
                        environment: tpm.environment),
                 "keyslot add --tpm2")

        // The unit's command line, in the foreground as systemd runs it (Type=notify).
        func unitMount(_ tpm: SoftwareTPM, until condition: String) -> Outcome {
            Harness.sh("""
                export COFFER_TPM2_TCTI='\(tpm.tcti)' COFFER='\(Harness.coffer)' M='\(vault.mountpoint)'
                trap '"$COFFER" unmount "$M" > /dev/null 2>&1; wait' EXIT
                "$COFFER" mount --foreground --unlock-tpm2 --log-file '\(vault.logFile)' --state-dir '\(vault.stateDir)' \
                  '\(vault.cipherdir)' "$M" & pid=$!
                state() { "$COFFER" status --json "$M" 2>/dev/null | jq -r .state; }
                for i in $(seq 300); do \(condition) && break; sleep 0.1; done
                state
                cat "$M/f" 2>&1 || true
                grep -c libtss2 /proc/$pid/maps || true
                """)
        }
        let unit = unitMount(tpm, until: "[ \"$(state)\" = unlocked ]")
        XCTAssertEqual(unit.stdout, "unlocked\nopened at boot\n0\n", unit.stderr + vault.log)
        XCTAssertTrue(vault.log.contains("unlocked with this machine's TPM at mount (--unlock-tpm2)"), vault.log)

        let elsewhere = unitMount(other, until: "grep -q 'the mount stays locked' '\(vault.logFile)'")
        XCTAssertEqual(elsewhere.stdout, "locked\ncat: \(vault.mountpoint)/f: Permission denied\n0\n", elsewhere.stderr)
        XCTAssertTrue(vault.log.contains("--unlock-tpm2: the mount stays locked: coffer unlock --tpm2 exited"), vault.log)

        // An fstab line: mount(8) runs mount.coffer, which runs `coffer mount --unlock-tpm2`.
        try linkMountHelper(to: Harness.coffer, for: self)
        let fstab = scratch.file("fstab", "\(vault.cipherdir) \(vault.mountpoint) coffer noauto,nofail,unlock_tpm2,log_file=\(vault.logFile) 0 0\n")
        assertOK(Harness.run(["env", "COFFER_TPM2_TCTI=\(tpm.tcti)", "mount", "-T", fstab, vault.mountpoint]), "mount from fstab")
        XCTAssertEqual(state(vault), "unlocked")
        XCTAssertEqual(vault.sh("cat f").stdout, "opened at boot\n")
        assertOK(Harness.run(["umount", vault.mountpoint]), "umount")
    }

    func testASlotOfAnotherMachineIsListedAsSuchAndPassedOverQuietly() throws {
        let laptop = try softwareTPM("laptop.tpm"), desktop = try softwareTPM("desktop.tpm")
        let vault = MountedVault(scratch: scratch)
        let added = coffer(["keyslot", "add", "--tpm2", "--label", "laptop", "--passfile", vault.passfile, vault.cipherdir], environment: laptop.environment)
        assertOK(added, "add on the laptop")
        XCTAssertTrue(added.stdout.contains("PCRs 7: it stops opening when one changes"), "PCR 7 is bound by default: \(added.stdout)")

        // On the desktop: the laptop's slot is another machine's; unlock says there is none of this one.
        let list = coffer(["keyslot", "list", vault.cipherdir], environment: desktop.environment)
        XCTAssertTrue(list.stdout.contains("tpm2 (other machine) laptop"), list.stdout)
        assertOK(mountLocked(vault, tpm: desktop), "mount on the desktop")
        let none = coffer(["unlock", "--tpm2", vault.mountpoint], environment: desktop.environment)
        XCTAssertEqual(none.status, 56, none.stderr)
        XCTAssertTrue(none.stderr.contains("another machine's"), none.stderr)
        XCTAssertEqual(none.stderr.split(separator: "\n").count, 1, "one line, no TSS log: \(none.stderr)")

        // The desktop adds its own; a copy of the laptop's slot claiming the desktop's TPM
        // (blobs this TPM will not load) is passed over quietly too.
        assertOK(coffer(["keyslot", "add", "--tpm2", "--label", "desktop", "--passfile", vault.passfile, vault.cipherdir], environment: desktop.environment), "add on the desktop")
        let slots = vault.cipherdir + "/coffer.slots/"
        var records: [String: [String: Any]] = [:]
        for name in try FileManager.default.contentsOfDirectory(atPath: slots) {
            let record = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: slots + name))) as? [String: Any])
            records[try XCTUnwrap(record["label"] as? String)] = record
        }
        var forged = try XCTUnwrap(records["laptop"])
        var binding = try XCTUnwrap(forged["tpm2"] as? [String: Any])
        binding["machine"] = try XCTUnwrap((records["desktop"]?["tpm2"] as? [String: Any])?["machine"])
        forged["tpm2"] = binding
        forged["id"] = "00000000000000000000000000000000"   // first in name order: tried first
        forged["label"] = "forged"
        try JSONSerialization.data(withJSONObject: forged).write(to: URL(fileURLWithPath: slots + "00000000000000000000000000000000.slot"))

        let unlocked = coffer(["unlock", "--tpm2", vault.mountpoint], environment: desktop.environment)
        assertOK(unlocked, "unlock --tpm2 on the desktop")
        XCTAssertEqual(unlocked.stderr, "", "the other machine's slots are passed over quietly")
        assertOK(Harness.run([Harness.coffer, "lock", vault.mountpoint]), "lock")
        // And the laptop, with the same files (synced), opens with its own.
        assertOK(coffer(["unlock", "--tpm2", vault.mountpoint], environment: laptop.environment), "unlock --tpm2 on the laptop")
        let laptopList = coffer(["keyslot", "list", vault.cipherdir], environment: laptop.environment)
        XCTAssertTrue(laptopList.stdout.contains("tpm2 (other machine) desktop") && laptopList.stdout.contains("tpm2 (PCRs 7) laptop"),
                      laptopList.stdout)
        vault.unmount()
    }

    /// Another vault's TPM2 slot of this very machine, copied in under a name that sorts
    /// first, and a sync engine's copy of the real slot holding other blobs: neither stops
    /// `unlock --tpm2` (every slot is tried until one opens), and neither is charged as a
    /// failed attempt.
    func testAPlantedOrConflictingTPM2SlotNeverBlocksTheRealOne() throws {
        let tpm = try softwareTPM("tpm")
        let vault = MountedVault(scratch: scratch)
        let other = MountedVault(scratch: scratch, name: "other")
        assertOK(coffer(["keyslot", "add", "--tpm2", "--label", "mine", "--passfile", vault.passfile, vault.cipherdir], environment: tpm.environment), "add mine")
        let unbound = coffer(["keyslot", "add", "--tpm2", "--tpm2-pcrs", "none", "--label", "other", "--passfile", other.passfile, other.cipherdir], environment: tpm.environment)
        assertOK(unbound, "add the other vault's")
        XCTAssertTrue(unbound.stdout.contains("no PCR: it opens whatever boots this machine"), unbound.stdout)
        let slots = vault.cipherdir + "/coffer.slots/"
        let mine = try XCTUnwrap(FileManager.default.contentsOfDirectory(atPath: slots).first)
        let theirs = try XCTUnwrap(FileManager.default.contentsOfDirectory(atPath: other.cipherdir + "/coffer.slots/").first)
        assertOK(Harness.sh("cp '\(other.cipherdir)/coffer.slots/\(theirs)' '\(slots)/0000-planted.slot'"), "plant the other vault's slot")
        // A conflict copy of mine whose blobs are the other vault's (they load here, and
        // unseal a key that opens nothing), named to sort before mine.
        var copy = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: slots + mine))) as? [String: Any])
        let foreign = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: slots + "0000-planted.slot"))) as? [String: Any])
        copy["tpm2"] = foreign["tpm2"]
        let id = (mine as NSString).deletingPathExtension
        try JSONSerialization.data(withJSONObject: copy).write(to: URL(fileURLWithPath: slots + "\(id) (conflicted copy).slot"))

        assertOK(mountLocked(vault, tpm: tpm), "mount locked")
        for round in 1...3 {
            let unlocked = coffer(["unlock", "--tpm2", vault.mountpoint], environment: tpm.environment)
            assertOK(unlocked, "unlock --tpm2, round \(round)")
            XCTAssertEqual(state(vault), "unlocked")
            assertOK(Harness.run([Harness.coffer, "lock", vault.mountpoint]), "lock")
        }
        let status = Harness.run([Harness.coffer, "status", "--json", vault.mountpoint]).stdout
        XCTAssertTrue(status.contains("\"failedAttempts\" : 0"), "a slot that opened nothing was charged: \(status)")
        vault.unmount()
    }

    func testNoTPMTheLastWayInAndWipe() throws {
        let tpm = try softwareTPM("tpm")
        let vault = MountedVault(scratch: scratch)
        let cipher = vault.cipherdir
        // No TPM answers: refused before any secret is asked (a passfile that is not there).
        let gone = try softwareTPM("gone.tpm")
        gone.stop()
        let noTPM = coffer(["keyslot", "add", "--tpm2", "--label", "x", "--passfile", scratch.path + "/missing", cipher], environment: gone.environment)
        XCTAssertEqual(noTPM.status, 54, noTPM.stderr)
        XCTAssertTrue(noTPM.stderr.contains("no TPM 2.0 answers"), noTPM.stderr)
        XCTAssertEqual(coffer(["keyslot", "add", "--tpm2", "--tpm2-pcrs", "24", "--label", "x", cipher], environment: tpm.environment).status, 64)

        assertOK(coffer(["keyslot", "add", "--tpm2", "--label", "tpm", "--passfile", vault.passfile, cipher], environment: tpm.environment), "add")
        assertOK(coffer(["keyslot", "remove", "--slot", "recovery", "--passfile", vault.passfile, cipher], environment: tpm.environment), "remove recovery")
        assertOK(coffer(["keyslot", "remove", "--slot", "passphrase", "--passfile", vault.passfile, cipher], environment: tpm.environment),
                 "remove the passphrase: the TPM2 slot is a way in")
        let last = coffer(["keyslot", "remove", "--slot", "tpm", "--passfile", vault.passfile, cipher], environment: tpm.environment)
        XCTAssertEqual(last.status, 50, last.stderr)
        // With no passphrase left, the TPM proves the way in: a passphrase slot is added, used, removed.
        XCTAssertEqual(coffer(["fsck", "--passfile", vault.passfile, cipher], environment: tpm.environment).status, 22)
        let words = scratch.file("words.pass", "words added with the TPM\n")
        assertOK(coffer(["keyslot", "add", "--with-tpm2", "--label", "words", "--new-passfile", words, cipher], environment: tpm.environment), "add --with-tpm2")
        assertOK(coffer(["fsck", "--passfile", words, cipher], environment: tpm.environment), "fsck with the new passphrase")
        assertOK(coffer(["keyslot", "remove", "--with-tpm2", "--slot", "words", cipher], environment: tpm.environment), "remove --with-tpm2")
        XCTAssertEqual(coffer(["fsck", "--with-tpm2", "--passfile", words, cipher], environment: tpm.environment).status, 64, "one way in at a time")
        assertOK(mountLocked(vault, ["--unlock-tpm2"], tpm: tpm), "the TPM2 slot alone opens")
        XCTAssertEqual(state(vault), "unlocked")

        assertOK(Harness.run([Harness.coffer, "wipe", "--yes", cipher]), "wipe")
        XCTAssertFalse(FileManager.default.fileExists(atPath: cipher + "/coffer.slots"), "the TPM2 slot file survived the wipe")
        if vault.isMounted { vault.unmount() }
    }
}

// End-to-end: `coffer wipe` and `coffer passwd` against what issue 39 found — a daemon
// whose binary was upgraded, another user's daemon, a stopped daemon, entries planted
// under the names of the config's copies, and a symlink or hard link raced in under them.
import CofferSystem
import Foundation
import Glibc
import XCTest

final class WipeTests: EndToEndCase {
    /// Whether the mount serves plaintext: `cat f` succeeds.
    /// (A stopped daemon would hold `cat` up: it gets 10 s.)
    func serves(_ vault: MountedVault) -> Bool { Harness.sh("timeout 10 cat '\(vault.mountpoint)/f'").status == 0 }

    /// Mode, size and content hash of `path`, to see that nothing touched it.
    func fingerprint(_ path: String) -> String {
        Harness.sh("stat -c '%a %s %h' '\(path)'; sha256sum < '\(path)'").stdout
    }

    /// A victim file outside CIPHERDIR, mode 0644, that nothing may change.
    func victim() -> String {
        let path = scratch.file("victim", "the victim's own bytes\n")
        chmod(path, 0o644)
        return path
    }

    // MARK: 1. A daemon whose binary was upgraded

    /// The daemon runs a binary that `install` replaced since: its /proc/PID/exe reads
    /// "… (deleted)". The wipe still finds it, and the mount ends up locked or ended.
    func testAWipeReachesADaemonWhoseBinaryWasReplaced() {
        let vault = MountedVault(scratch: scratch)
        let bin = scratch.mkdir("bin")
        assertOK(Harness.sh("cp '\(Harness.coffer)' '\(bin)/coffer'"), "copy the binary")
        let mount = Harness.run([bin + "/coffer", "mount", "--passfile", vault.passfile, "--log-file", vault.logFile,
                                 "--state-dir", vault.stateDir, vault.cipherdir, vault.mountpoint])
        assertOK(mount, "mount with the copy")
        assertOK(vault.sh("echo secret > f"), "write")
        // An upgrade: the new binary is written beside the old one and renamed over it.
        assertOK(Harness.sh("cp '\(bin)/coffer' '\(bin)/coffer.new' && mv '\(bin)/coffer.new' '\(bin)/coffer'"), "upgrade")
        let pid = vault.daemonPID ?? 0
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/exe")) ?? ""
        XCTAssertTrue(exe.hasSuffix(" (deleted)"), "the daemon's binary should read as deleted: \(exe)")
        let wipe = coffer(["wipe", "--yes", vault.cipherdir])
        XCTAssertEqual(wipe.status, 0, wipe.stderr)
        XCTAssertFalse(serves(vault), "the upgraded daemon still serves plaintext after the wipe")
        // The daemon ends before the scratch directory goes (it removes its state on the way out).
        if vault.isMounted { vault.unmount() }
    }

    /// On a desktop /proc/net/unix holds hundreds of sockets, far more than the one page
    /// the kernel hands out per read: the daemon's socket is still found, and the wipe
    /// locks the mount in place instead of ending the daemon.
    func testAWipeLocksTheDaemonWhenProcNetUnixIsLong() {
        let sockets = scratch.mkdir("desktop-sockets")
        let listener = Harness.start(["python3", "-c", """
            import socket, sys, time
            held = []
            for i in range(400):
                s = socket.socket(socket.AF_UNIX)
                s.bind(sys.argv[1] + "/a-desktop-program-socket-%04d" % i)
                s.listen(1)
                held.append(s)
            time.sleep(120)
            """, sockets])
        addTeardownBlock { listener.terminate(); listener.waitUntilExit() }
        XCTAssertTrue(Harness.sh("for i in $(seq 100); do [ -S '\(sockets)/a-desktop-program-socket-0399' ] && exit 0; sleep 0.1; done; exit 1").status == 0,
                      "the sockets were not made")
        XCTAssertGreaterThan(Harness.sh("cat /proc/net/unix").stdout.utf8.count, 32 << 10, "/proc/net/unix is not long")
        let vault = mountedVault()
        assertOK(vault.sh("echo secret > f"), "write")
        let pid = vault.daemonPID
        let wipe = coffer(["wipe", "--yes", vault.cipherdir], timeout: 60)
        XCTAssertEqual(wipe.status, 0, wipe.stderr)
        XCTAssertTrue(vault.isMounted, "the wipe ended the daemon instead of locking it")
        XCTAssertNotNil(pid)
        XCTAssertEqual(vault.daemonPID, pid, "the daemon is not the one that was there")
        XCTAssertFalse(serves(vault), "plaintext served after the wipe")
    }

    // MARK: 2. Another user's daemon of a group-writable vault

    /// Runs `script` with bash as uid `uid`, group `gid`, in `dir`, HOME there too.
    func runAs(_ uid: Int, _ gid: Int, in dir: String, _ script: String) -> Outcome {
        Harness.run(["setpriv", "--reuid", String(uid), "--regid", String(gid), "--clear-groups", "--",
                     "env", "-u", "XDG_RUNTIME_DIR", "HOME=" + dir, "/bin/bash", "-euo", "pipefail", "-c",
                     "cd '\(dir)'; " + script])
    }

    /// User A made the vault and shares it with group G; user B (nobody: fusermount3
    /// wants a user name), also in G, mounts it. A's wipe destroys the key slots but can
    /// neither lock nor signal B's daemon: it names it (pid and owner) and exits 39, never 0.
    func testAWipeNamesAnotherUsersDaemonItCannotReach() {
        let (a, b, group) = (64101, 65534, 64100)
        assertOK(Harness.sh("chmod 755 '\(scratch.path)'"), "prepare")
        let shared = scratch.mkdir("shared"), homeA = scratch.mkdir("a"), homeB = scratch.mkdir("b")
        assertOK(Harness.sh("""
            chown \(a):\(group) '\(shared)' && chmod 2770 '\(shared)'
            chown \(a):\(group) '\(homeA)' && chown \(b):\(group) '\(homeB)' && chmod 700 '\(homeA)' '\(homeB)'
            """), "prepare")
        assertOK(runAs(a, group, in: homeA, """
            umask 007; echo pass > '\(homeA)/p' && mkdir '\(shared)/v'
            \(Harness.coffer) init --kdf-ops 2 --kdf-memory 64 --passfile p '\(shared)/v' > /dev/null
            chmod 440 '\(shared)/v/coffer.conf' '\(shared)/v/coffer.diriv'
            """), "A's vault")
        assertOK(runAs(b, group, in: homeB, """
            umask 007; echo pass > p && mkdir m
            \(Harness.coffer) mount --passfile p --socket '\(homeB)/s' '\(shared)/v' m && echo secret > m/f
            """), "B's mount")
        // B's daemon: the process of B's that holds the vault's claim.
        let pid = Harness.sh("grep -l -- '\(shared)/v' /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3 | while read p; do [ \"$(stat -c %u /proc/$p)\" = \(b) ] && echo $p; done | head -1")
            .stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        addTeardownBlock {
            if let daemon = Int32(pid) { kill(daemon, SIGKILL) }
            Harness.run(["fusermount3", "-u", "-z", homeB + "/m"])
        }
        XCTAssertFalse(pid.isEmpty, "B's daemon not found")
        let wipe = runAs(a, group, in: homeA, "\(Harness.coffer) wipe --yes '\(shared)/v'")
        XCTAssertEqual(wipe.status, 39, "A's wipe of a vault B serves: \(wipe.stdout) \(wipe.stderr)")
        XCTAssertTrue(wipe.stderr.contains("pid \(pid)"), "the daemon is named: \(wipe.stderr)")
        XCTAssertTrue(wipe.stderr.contains("uid \(b)"), "its owner is named: \(wipe.stderr)")
        XCTAssertFalse(FileManager.default.fileExists(atPath: shared + "/v/coffer.conf"), "the key slots are destroyed")
    }

    /// An ordinary user's wipe of their own mounted vault: the daemon is not dumpable, so
    /// its descriptors cannot be read even by its owner; its claim finds it, and it is
    /// ended (the mount serves nothing afterwards).
    func testAUsersWipeReachesTheirOwnDaemon() {
        assertOK(Harness.sh("chmod 755 '\(scratch.path)'"), "prepare")
        let home = scratch.mkdir("own")
        assertOK(Harness.sh("chown nobody: '\(home)'"), "prepare")
        assertOK(runAs(65534, 65534, in: home, """
            echo pass > p && mkdir v m && \(Harness.coffer) init --kdf-ops 2 --kdf-memory 64 --passfile p v > /dev/null
            \(Harness.coffer) mount --passfile p --socket '\(home)/s' v m && echo secret > m/f
            """), "nobody's mount")
        addTeardownBlock { Harness.run(["fusermount3", "-u", "-z", home + "/m"]) }
        let wipe = runAs(65534, 65534, in: home, "\(Harness.coffer) wipe --yes v")
        XCTAssertEqual(wipe.status, 0, wipe.stderr)
        let after = runAs(65534, 65534, in: home, "timeout 10 cat m/f")
        XCTAssertNotEqual(after.status, 0, "the owner's daemon still serves plaintext after the owner's wipe")
    }

    // MARK: A stopped daemon

    /// A daemon stopped with SIGSTOP cannot answer its socket: the wipe does not wait
    /// for it but ends it within seconds, and the mount serves nothing afterwards.
    func testAWipeEndsAStoppedDaemonWithinSeconds() {
        let vault = mountedVault()
        assertOK(vault.sh("echo secret > f"), "write")
        guard let pid = vault.daemonPID else { return XCTFail("no daemon pid") }
        addTeardownBlock { kill(pid, SIGKILL) }
        kill(pid, SIGSTOP)
        let start = Date()
        let wipe = coffer(["wipe", "--yes", vault.cipherdir], timeout: 60)
        let elapsed = Date().timeIntervalSince(start)
        XCTAssertEqual(wipe.status, 0, wipe.stderr)
        XCTAssertLessThan(elapsed, 30, "a stopped daemon held the wipe up")
        XCTAssertNil(LiveProcess.startTime(pid), "the stopped daemon is still there")
        XCTAssertFalse(serves(vault), "plaintext served after the wipe")
    }

    // MARK: 3. Planted names

    /// Names a sync peer may create beside coffer.conf, and the kinds it may make them.
    static let plantedNames = [".coffer.conf.tmp.4242", "coffer.sync-conflict-20260101-000000-ABCDEFG.conf"]
    static let plantedKinds = ["directory", "FIFO", "symlink"]

    /// Creates `name` in `dir` as `kind`; a symlink points at `target`.
    func plant(_ kind: String, _ name: String, in dir: String, target: String) {
        let path = dir + "/" + name
        switch kind {
        case "directory": assertOK(Harness.sh("mkdir '\(path)' && echo inside > '\(path)/x'"), "plant")
        case "FIFO": assertOK(Harness.sh("mkfifo '\(path)'"), "plant")
        default: assertOK(Harness.sh("ln -s '\(target)' '\(path)'"), "plant")
        }
    }

    /// What `kind` reads as with `stat -c %F`.
    func statKind(_ kind: String) -> String {
        ["directory": "directory", "FIFO": "fifo", "symlink": "symbolic link"][kind]!
    }

    /// A directory, FIFO or symlink under a temp or conflict-copy name of coffer.conf
    /// stops neither the wipe nor the lock: the key slots (and a regular stale copy) are
    /// destroyed, the mount is locked, the entry is reported and left as it was, and a
    /// symlink is never followed.
    func testWipeGoesOnPastPlantedEntries() {
        let target = victim()
        let before = fingerprint(target)
        for name in Self.plantedNames {
            for kind in Self.plantedKinds {
                let vault = MountedVault(scratch: scratch, name: "w\(kind)\(name.count)")
                vault.mount()
                assertOK(vault.sh("echo secret > f"), "write")
                assertOK(Harness.sh("cp '\(vault.cipherdir)/coffer.conf' '\(vault.cipherdir)/.coffer.conf.tmp.777'"), "stale copy")
                plant(kind, name, in: vault.cipherdir, target: target)
                let wipe = coffer(["wipe", "--yes", vault.cipherdir], timeout: 30)
                XCTAssertEqual(wipe.status, 0, "\(kind) \(name): \(wipe.stderr)")
                XCTAssertTrue(wipe.stderr.contains(name), "\(kind) \(name) reported: \(wipe.stderr)")
                XCTAssertEqual(wipe.stderr.split(separator: "\n").count, 1, "one line for the one odd entry: \(wipe.stderr)")
                for gone in ["coffer.conf", ".coffer.conf.tmp.777"] {
                    XCTAssertFalse(FileManager.default.fileExists(atPath: vault.cipherdir + "/" + gone), "\(kind) \(name): \(gone) survived")
                }
                XCTAssertEqual(Harness.sh("stat -c %F '\(vault.cipherdir)/\(name)'").stdout, statKind(kind) + "\n", "\(kind) \(name) left alone")
                XCTAssertFalse(serves(vault), "\(kind) \(name): plaintext served after the wipe")
                vault.unmount()
            }
        }
        XCTAssertEqual(fingerprint(target), before, "the symlink's target was touched")
    }

    /// coffer.conf itself replaced by a directory (a sync peer's doing) stops no wipe: a
    /// line says the config could not be read, a conflict copy holding key slots is
    /// destroyed, the replacement is named and left, and the mount is locked.
    func testAWipeGoesOnWhenTheConfigItselfIsReplaced() {
        let vault = mountedVault()
        assertOK(vault.sh("echo secret > f"), "write")
        let copy = "coffer.sync-conflict-20260101-000000-ABCDEFG.conf"
        assertOK(Harness.sh("cd '\(vault.cipherdir)' && cp coffer.conf \(copy) && rm -f coffer.conf && mkdir coffer.conf"), "replace")
        let wipe = coffer(["wipe", "--yes", vault.cipherdir], timeout: 30)
        XCTAssertEqual(wipe.status, 0, wipe.stderr)
        XCTAssertTrue(wipe.stderr.contains("not a regular file"), wipe.stderr)
        XCTAssertFalse(FileManager.default.fileExists(atPath: vault.cipherdir + "/" + copy), "the conflict copy survived")
        XCTAssertFalse(serves(vault), "plaintext served after the wipe")
        // The daemon ends before the scratch directory goes (it removes its state on the way out).
        if vault.isMounted { vault.unmount() }
    }

    /// A wipe killed at each step (strace kills it as it makes its Nth call of a kind: an
    /// overwrite's write, a fsync, an unlink): `wipe` run again finishes it (exit 0), and
    /// then no copy of a key slot is left and neither passphrase opens anything. The
    /// config goes last; where an older coffer's cut wipe left slot files without it,
    /// a wipe destroys them too (it refused: "not a coffer vault").
    func testAWipeCutShortIsFinishedByTheNextOne() {
        let vault = MountedVault(scratch: scratch)
        let other = scratch.file("other.pass", "other words\n")
        assertOK(coffer(["keyslot", "add", "--label", "other", "--passfile", vault.passfile, "--new-passfile", other, vault.cipherdir]), "add")
        let original = scratch.path + "/original.cipher"
        assertOK(Harness.sh("cp -a '\(vault.cipherdir)' '\(original)'"), "copy")
        for (call, n) in [("pwrite64", 1), ("pwrite64", 3), ("fsync", 2), ("fsync", 5), ("unlinkat", 1), ("unlinkat", 3), ("legacy", 0)] {
            assertOK(Harness.sh("rm -rf '\(vault.cipherdir)' && cp -a '\(original)' '\(vault.cipherdir)'"), "restore")
            if call == "legacy" {
                assertOK(Harness.sh("rm '\(vault.cipherdir)/coffer.conf'"), "the config gone, its slot file left")
            } else {
                let cut = Harness.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=\(call)", "-e",
                                       "inject=\(call):error=EIO:signal=KILL:when=\(n)", Harness.coffer, "wipe", "--yes", vault.cipherdir])
                XCTAssertTrue([SIGKILL, 128 + SIGKILL].contains(cut.status), "\(call) \(n): not killed: \(cut.status) \(cut.stderr)")
            }
            let again = coffer(["wipe", "--yes", vault.cipherdir], timeout: 30)
            XCTAssertEqual(again.status, 0, "\(call) \(n): \(again.stderr)")
            let left = Harness.sh("cd '\(vault.cipherdir)' && ls -A . && ls -A coffer.slots 2>/dev/null || true").stdout
            XCTAssertEqual(left, "coffer.diriv\n", "\(call) \(n): left after the second wipe")
            for passfile in [vault.passfile, other] {
                XCTAssertEqual(coffer(["fsck", "--passfile", passfile, vault.cipherdir]).status, 12, "\(call) \(n): a passphrase still opens")
            }
        }
    }

    /// passwd meets the same planted entries, and directories planted under every temp
    /// name its next process IDs would give: it succeeds, reports the odd entries, leaves
    /// them alone, and the new passphrase opens the vault.
    func testPasswdGoesOnPastPlantedEntries() {
        let target = victim()
        let before = fingerprint(target)
        let newPass = scratch.file("new.pass", "the new passphrase\n")
        for name in Self.plantedNames {
            for kind in Self.plantedKinds {
                let vault = MountedVault(scratch: scratch, name: "p\(kind)\(name.count)")
                plant(kind, name, in: vault.cipherdir, target: target)
                let passwd = coffer(["passwd", "--passfile", vault.passfile, "--new-passfile", newPass, vault.cipherdir], timeout: 30)
                XCTAssertEqual(passwd.status, 0, "\(kind) \(name): \(passwd.stderr)")
                XCTAssertTrue(passwd.stderr.contains(name), "\(kind) \(name) reported: \(passwd.stderr)")
                XCTAssertEqual(Harness.sh("stat -c %F '\(vault.cipherdir)/\(name)'").stdout, statKind(kind) + "\n", "\(kind) \(name) left alone")
                assertOK(coffer(["fsck", "--passfile", newPass, "--state-dir", vault.stateDir, vault.cipherdir]), "\(kind) \(name): the new passphrase")
            }
        }
        XCTAssertEqual(fingerprint(target), before, "the symlink's target was touched")
        // Directories under the temp names of the next few hundred process IDs.
        let vault = MountedVault(scratch: scratch, name: "pids")
        let planted = Harness.sh("""
            cd '\(vault.cipherdir)'; last=$(cat /proc/sys/kernel/ns_last_pid)
            for i in $(seq $((last + 1)) $((last + 400))); do mkdir .coffer.conf.tmp.$i; done
            """)
        assertOK(planted, "plant")
        let passwd = coffer(["passwd", "--passfile", vault.passfile, "--new-passfile", newPass, vault.cipherdir], timeout: 30)
        XCTAssertEqual(passwd.status, 0, passwd.stderr)
        assertOK(coffer(["fsck", "--passfile", newPass, "--state-dir", vault.stateDir, vault.cipherdir]), "the new passphrase")
    }

    // MARK: 4. A symlink or a hard link raced in under a temp name

    /// Runs a background loop in `dir` that swaps `.coffer.conf.tmp.1` with a symlink to
    /// `target` (renameat2 RENAME_EXCHANGE), putting back whichever a command removed;
    /// it stops when the test ends.
    func startSwapper(in dir: String, target: String) {
        let stop = scratch.path + "/stop-swapper"
        let script = """
            import ctypes, os, stat, sys
            libc = ctypes.CDLL(None, use_errno=True)
            d, target, stop = sys.argv[1], sys.argv[2], sys.argv[3]
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            a, b = b".coffer.conf.tmp.1", b"swap-link"
            def kind(n):
                try: return stat.S_IFMT(os.lstat(n, dir_fd=fd).st_mode)
                except FileNotFoundError: return None
            def make(n, regular):
                try:
                    if regular:
                        f = os.open(n, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400, dir_fd=fd); os.write(f, b"x" * 600); os.close(f)
                    else:
                        os.symlink(target, n, dir_fd=fd)
                except FileExistsError: pass
            while not os.path.exists(stop):
                ka, kb = kind(a), kind(b)
                if ka is None and kb is None: make(a, True); make(b, False)
                elif ka is None: make(a, kb == stat.S_IFLNK)
                elif kb is None: make(b, ka == stat.S_IFLNK)
                libc.renameat2(fd, a, fd, b, 2)
            """
        let swapper = Harness.start(["python3", "-c", script, dir, target, stop])
        addTeardownBlock {
            _ = FileManager.default.createFile(atPath: stop, contents: nil)
            swapper.waitUntilExit()
        }
    }

    /// Root's wipe and passwd, many times, while a writer of CIPHERDIR swaps a temp
    /// copy's name with a symlink to a file outside: the file's mode and content stay.
    func testRootsWipeAndPasswdNeverFollowASwappedInSymlink() {
        let target = victim()
        let before = fingerprint(target)
        let vault = MountedVault(scratch: scratch)
        let pristine = scratch.path + "/pristine.conf"
        assertOK(Harness.sh("cp '\(vault.cipherdir)/coffer.conf' '\(pristine)'"), "keep the config")
        startSwapper(in: vault.cipherdir, target: target)
        let trials = Harness.sh("""
            c='\(vault.cipherdir)'
            for i in $(seq 100); do
              rm -f "$c/coffer.conf"; cp '\(pristine)' "$c/coffer.conf"
              '\(Harness.coffer)' wipe --yes "$c" > /dev/null 2>> '\(scratch.path)/wipe.err' || true
            done
            cp '\(pristine)' "$c/coffer.conf"
            for i in $(seq 100); do
              '\(Harness.coffer)' passwd --passfile '\(vault.passfile)' --new-passfile '\(vault.passfile)' "$c" > /dev/null 2>> '\(scratch.path)/passwd.err' || true
            done
            """, timeout: 600)
        assertOK(trials, "trials")
        XCTAssertEqual(fingerprint(target), before, "the victim was changed through the swapped-in symlink")
    }

    /// A hard link to a file outside CIPHERDIR, planted under a temp name: root's wipe
    /// does not overwrite it; it removes the name and reports it (status 47: a copy it
    /// could not destroy).
    func testRootsWipeDoesNotOverwriteAHardLinkedCopy() {
        let target = victim()
        let before = fingerprint(target)
        let vault = mountedVault()
        assertOK(vault.sh("echo secret > f"), "write")
        assertOK(Harness.sh("ln '\(target)' '\(vault.cipherdir)/.coffer.conf.tmp.5'"), "plant the link")
        let wipe = coffer(["wipe", "--yes", vault.cipherdir])
        XCTAssertEqual(wipe.status, 47, wipe.stderr)
        XCTAssertTrue(wipe.stderr.contains(".coffer.conf.tmp.5"), wipe.stderr)
        XCTAssertFalse(FileManager.default.fileExists(atPath: vault.cipherdir + "/.coffer.conf.tmp.5"), "the name stays")
        XCTAssertFalse(FileManager.default.fileExists(atPath: vault.cipherdir + "/coffer.conf"), "the key slots stay")
        XCTAssertEqual(fingerprint(target), before, "the linked file was changed")
        XCTAssertFalse(serves(vault), "plaintext served after the wipe")
        // The daemon ends before the scratch directory goes (it removes its state on the way out).
        if vault.isMounted { vault.unmount() }
    }
}

/// Process facts the tests read from /proc.
enum LiveProcess {
    /// Field 22 of /proc/PID/stat for a live process; nil once it is gone or a zombie.
    static func startTime(_ pid: Int32) -> String? {
        guard let stat = KernelFiles.text("/proc/\(pid)/stat"),
              let end = stat.range(of: ") ", options: .backwards) else { return nil }
        let fields = stat[end.upperBound...].split(separator: " ")
        guard fields.count > 19, fields[0] != "Z" else { return nil }
        return String(fields[19])
    }
}

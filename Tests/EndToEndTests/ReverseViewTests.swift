// ReverseViewTests: `coffer mount --reverse` serves a plaintext directory's encrypted view
// (docs/FORMAT.md §14); a copy of it — by rsync, by restic — is a vault that `coffer mount`
// opens as the plaintext, the view is the same bytes on every mount, and it is read-only.
import Foundation
import XCTest

final class ReverseViewTests: EndToEndCase {
    /// A plaintext directory with one of everything a backup meets: sizes around the block
    /// size, a long name, a name that is not UTF-8, hidden files, symlinks, hard links, a
    /// FIFO, a socket, a device, odd modes and old times.
    private func makePlaintext() -> String {
        let plain = scratch.mkdir("plain")
        assertOK(Harness.sh("""
            cd '\(plain)'
            mkdir -p docs/deep/er .hidden empty-dir
            : > empty; printf hello > hello.txt
            head -c 4096 /dev/urandom > docs/block; head -c 8192 /dev/urandom > docs/two-blocks
            head -c 1048577 /dev/urandom > docs/deep/mebibyte-and-one; seq 1 20000 > docs/deep/er/numbers
            echo secret > .hidden/.dotfile
            printf long > "docs/$(printf 'n%.0s' $(seq 200))"
            python3 -c 'import os; open(b"docs/caf\\xe9", "w").write("latin-1")'
            ln -s hello.txt link; ln -s /etc/hostname absolute-link; ln -s "$(printf 't%.0s' $(seq 3500))" long-target
            ln hello.txt docs/hard-link
            mkfifo fifo
            python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("socket")'
            mknod null-device c 1 3
            chmod 600 docs/block; chmod 751 docs/deep
            # Times in another second than the copy's: rsync leaves a time it takes for
            # equal (the same second) as the new file has it.
            find . -depth -mindepth 1 -exec touch -h -d '2020-01-02 03:04:05.123456789' {} +
            touch -h -d '2001-02-03 04:05:06' link hello.txt docs/deep/er
            """), "the plaintext")
        return plain
    }

    /// `coffer init --reverse` of `plain`, with its passphrase file.
    private func initView(_ plain: String, _ extra: [String] = []) -> String {
        let passfile = scratch.file("view.pass", "view passphrase\n")
        assertOK(coffer(["init", "--reverse", "--kdf-ops", "2", "--kdf-memory", "64", "--passfile", passfile,
                         "--recovery-key-out", scratch.path + "/view.recovery"] + extra + [plain]), "init --reverse")
        return passfile
    }

    /// Mounts the view of `plain` at a new mountpoint `name`; it is unmounted at the end.
    private func mountView(_ plain: String, passfile: String, at name: String = "view", _ extra: [String] = []) -> String {
        let view = scratch.mkdir(name)
        assertOK(coffer(["mount", "--reverse", "--passfile", passfile, "--log-file", scratch.path + "/\(name).log"]
                        + extra + [plain, view]), "mount --reverse")
        addTeardownBlock { Harness.run([Harness.coffer, "unmount", view]) }
        return view
    }

    /// Every entry of `dir` as `path type mode size mtime target`, sorted: what a
    /// restore must give back (`.coffer.reverse.conf` left out).
    private func listing(_ dir: String) -> String {
        Harness.sh("cd '\(dir)' && find . -mindepth 1 ! -name .coffer.reverse.conf -printf '%P %y %m %s %T@ %l\\n' | LC_ALL=C sort").stdout
    }

    /// A script that fails with `diff -r`'s lines for `a` and `b` but those matching
    /// `allowed` and the notes on special files (which diff does not compare).
    private func differences(_ a: String, _ b: String, _ allowed: [String] = []) -> String {
        let patterns = (allowed + ["is a fifo while", "is a socket while", "is a character special file while"]).map { "-e '\($0)'" }
        return """
            out=$( { diff -r --no-dereference '\(a)' '\(b)' || true; } | { grep -v \(patterns.joined(separator: " ")) || true; } )
            [ -z "$out" ] || { echo "$out"; exit 1; }
            """
    }

    /// The plaintext of a copy of the view, through `coffer mount` of it.
    private func openCopy(_ copy: String, passfile: String) -> MountedVault {
        let vault = MountedVault(scratch: scratch, name: "restored", cipherdir: scratch.mkdir("unused"))
        let mountpoint = vault.mountpoint
        assertOK(coffer(["mount", "--passfile", passfile, "--state-dir", scratch.path + "/restored.state", copy, mountpoint]),
                 "mount of the copy")
        addTeardownBlock { Harness.run([Harness.coffer, "unmount", mountpoint]) }
        return vault
    }

    func testACopyOfTheViewIsAVaultThatOpensAsThePlaintext() {
        let plain = makePlaintext()
        let passfile = initView(plain)
        let view = mountView(plain, passfile: passfile)
        let copy = scratch.path + "/copy"
        let rsync = Harness.sh("rsync -aH '\(view)/' '\(copy)/'")
        assertOK(rsync, "rsync of the view")
        XCTAssertEqual(coffer(["fsck", "--passfile", passfile, copy]).status, 0, "fsck of the copy")
        let restored = openCopy(copy, passfile: passfile).mountpoint
        // The symlink whose target does not fit a backing symlink is left out (logged).
        let expected = listing(plain).split(separator: "\n").filter { !$0.hasPrefix("long-target ") }.joined(separator: "\n") + "\n"
        XCTAssertEqual(listing(restored), expected)
        assertOK(Harness.sh(differences(plain, restored, ["^Only in \(plain): long-target$", "^Only in \(plain): .coffer.reverse.conf$"])),
                 "diff of the restored tree")
        let links = Harness.sh("stat -c %i '\(restored)/hello.txt' '\(restored)/docs/hard-link' | uniq | wc -l").stdout
        XCTAssertEqual(links.trimmingCharacters(in: .whitespacesAndNewlines), "1", "the hard links stay one inode")
        XCTAssertEqual(Harness.sh("stat -c %t:%T '\(restored)/null-device'").stdout, "1:3\n")
        XCTAssertTrue((try? String(contentsOfFile: scratch.path + "/view.log", encoding: .utf8))?.contains("left out") ?? false)
        // The config is the view's coffer.conf, byte for byte, and no entry of its own.
        assertOK(Harness.sh("cmp '\(plain)/.coffer.reverse.conf' '\(view)/coffer.conf'"), "the view's config")
    }

    func testTheViewIsTheSameOnEveryMountAndAChangeChangesOneFile() {
        let plain = makePlaintext()
        let passfile = initView(plain)
        var view = mountView(plain, passfile: passfile)
        let copy = scratch.path + "/copy"
        assertOK(Harness.sh("cp -a '\(view)' '\(copy)'"), "cp of the view")
        assertOK(coffer(["unmount", view]), "unmount of the view")
        view = mountView(plain, passfile: passfile, at: "view-again")
        assertOK(Harness.sh(differences(view, copy)), "the second mount's view is the first's")
        assertOK(Harness.sh("""
            echo more >> '\(plain)/docs/deep/er/numbers'
            rsync -a --stats '\(view)/' '\(copy)/' > '\(scratch.path)/stats'
            grep '^Number of regular files transferred: 1$' '\(scratch.path)/stats' > /dev/null
            rsync -ac --stats '\(view)/' '\(copy)/' | grep '^Number of regular files transferred: 0$' > /dev/null
            """), "one change, one file")
        let restored = openCopy(copy, passfile: passfile).mountpoint
        assertOK(Harness.sh("cmp '\(plain)/docs/deep/er/numbers' '\(restored)/docs/deep/er/numbers'"), "the changed file restored")
    }

    func testResticBacksUpTheViewAndItsRestoreOpens() throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/restic") else { throw XCTSkip("restic is not installed") }
        let plain = makePlaintext()
        let passfile = initView(plain)
        let view = mountView(plain, passfile: passfile)
        let restore = scratch.path + "/restore"
        assertOK(Harness.sh("""
            export RESTIC_REPOSITORY='\(scratch.path)/repo' RESTIC_PASSWORD='repository passphrase of the test' RESTIC_CACHE_DIR='\(scratch.path)/cache'
            restic init -q
            cd '\(view)' && restic backup -q .
            restic restore -q latest --target '\(restore)'
            """, timeout: 600), "restic backup and restore")
        let restored = openCopy(restore, passfile: passfile).mountpoint
        assertOK(Harness.sh("cmp '\(plain)/docs/deep/mebibyte-and-one' '\(restored)/docs/deep/mebibyte-and-one' && "
                            + "diff -r '\(plain)/docs' '\(restored)/docs'"), "the restored tree")
        XCTAssertEqual(coffer(["fsck", "--passfile", passfile, restore]).status, 0, "fsck of restic's restore")
    }

    func testTheViewIsReadOnlyAndLeavesOutWhatIsExcluded() {
        let plain = makePlaintext()
        assertOK(Harness.sh("cd '\(plain)' && touch a.tmp docs/b.tmp && mkdir -p cache/x docs/private && echo p > docs/private/p"), "more")
        let passfile = initView(plain)
        let view = mountView(plain, passfile: passfile, ["--exclude", "*.tmp", "--exclude", "cache", "--exclude", "/docs/private"])
        // What pjdfstest asks of a read-only file system: every change refused with EROFS.
        let file = "'\(view)/coffer.conf'"
        for write in ["touch '\(view)/new'", "mkdir '\(view)/new'", "mkfifo '\(view)/new'", "mknod '\(view)/new' c 1 3",
                      "ln -s x '\(view)/new'", "ln \(file) '\(view)/new'", "rm \(file)", "for d in '\(view)'/*/; do rmdir \"$d\"; exit $?; done",
                      "mv \(file) '\(view)/x'", "chmod 700 \(file)", "chown 1:1 \(file)", "touch -d 2001-01-01 \(file)",
                      "truncate -s 0 \(file)", "echo x >> \(file)", "python3 -c 'open(\"\(view)/coffer.conf\", \"r+b\")'",
                      "setfattr -n user.x -v 1 \(file)"] {
            let r = Harness.sh(write)
            XCTAssertNotEqual(r.status, 0, write)
            XCTAssertTrue(r.stderr.contains("Read-only file system"), "\(write): \(r.stderr)")
        }
        let copy = scratch.path + "/copy"
        assertOK(Harness.sh("rsync -a '\(view)/' '\(copy)/'"), "rsync")
        let restored = openCopy(copy, passfile: passfile).mountpoint
        let names = Harness.sh("cd '\(restored)' && find . | LC_ALL=C sort").stdout
        XCTAssertFalse(names.contains(".tmp"), names)
        XCTAssertFalse(names.contains("cache"), names)
        XCTAssertFalse(names.contains("private"), names)
        XCTAssertFalse(names.contains("coffer.reverse"), names)
        XCTAssertTrue(names.contains("./docs/deep/er/numbers"), names)
    }

    func testAViewsContentStaysBoundToItsPlaceInTheCopy() {
        let plain = scratch.mkdir("plain")
        assertOK(Harness.sh("cd '\(plain)' && echo first > a && echo second > b"), "plaintext")
        let passfile = initView(plain)
        let view = mountView(plain, passfile: passfile)
        let copy = scratch.path + "/copy"
        assertOK(Harness.sh("rsync -a '\(view)/' '\(copy)/'"), "rsync")
        // Swap the two files' contents in the copy, as an attacker with the backup could.
        let restored = openCopy(copy, passfile: passfile)
        let backing = { (name: String) in
            Harness.sh("find '\(copy)' -inum $(stat -c %i '\(restored.mountpoint)/\(name)')").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let a = backing("a"), b = backing("b")
        assertOK(coffer(["unmount", restored.mountpoint]), "unmount")
        assertOK(Harness.sh("cp '\(a)' /tmp/coffer-swap-$$ && cp '\(b)' '\(a)' && cp /tmp/coffer-swap-$$ '\(b)' && rm /tmp/coffer-swap-$$"),
                 "swap")
        assertOK(coffer(["mount", "--passfile", passfile, "--state-dir", scratch.path + "/restored.state", copy, restored.mountpoint]),
                 "mount again")
        let r = Harness.sh("cat '\(restored.mountpoint)/a'")
        XCTAssertNotEqual(r.status, 0, "swapped content read as the file: \(r.stdout)")
        XCTAssertTrue(r.stderr.contains("Input/output error"), r.stderr)
        XCTAssertEqual(coffer(["fsck", "--passfile", passfile, copy]).status, 40)
    }

    /// The daemon (root here) never follows a symlink of PLAINDIR: a directory swapped
    /// with a symlink to a root-only directory, again and again (RENAME_EXCHANGE) while
    /// rsync reads the view, puts nothing of that directory into the copy.
    func testASymlinkSwappedInWhileTheViewIsReadLeadsNowhere() {
        let plain = scratch.mkdir("plain")
        let secret = scratch.mkdir("secret")
        assertOK(Harness.sh("""
            chmod 700 '\(secret)'; echo TOPSECRET-$RANDOM$RANDOM > '\(secret)/f'; chmod 600 '\(secret)/f'
            mkdir '\(plain)/d'; for i in $(seq 1 50); do echo mine > '\(plain)/d/f'$i; done; echo mine > '\(plain)/d/f'
            ln -s '\(secret)' '\(plain)/s'
            """), "the plaintext")
        let passfile = initView(plain)
        let view = mountView(plain, passfile: passfile)
        let swapper = Harness.start(["python3", "-c", """
            import ctypes, os, time
            libc = ctypes.CDLL(None, use_errno=True)
            end = time.time() + 8
            while time.time() < end:
                libc.renameat2(-100, b'\(plain)/d', -100, b'\(plain)/s', 2)
            """])
        defer { swapper.terminate(); swapper.waitUntilExit() }
        for round in 0..<10 {
            let copy = scratch.path + "/copy\(round)"
            // A file vanishing or changing under rsync (status 23, 24) is what a swap does.
            let r = Harness.sh("rsync -a '\(view)/' '\(copy)/' 2>/dev/null || [ $? = 23 ] || [ $? = 24 ]")
            assertOK(r, "rsync round \(round)")
        }
        swapper.waitUntilExit()
        for round in 0..<10 {
            let copy = scratch.path + "/copy\(round)"
            guard FileManager.default.fileExists(atPath: copy + "/coffer.conf") else { continue }
            let restored = scratch.mkdir("restored\(round)")
            assertOK(coffer(["mount", "--passfile", passfile, "--state-dir", scratch.path + "/state\(round)", copy, restored]), "mount")
            let found = Harness.sh("grep -r TOPSECRET '\(restored)' || true; find '\(restored)' -type l -printf '%l\\n'")
            XCTAssertFalse(found.stdout.contains("TOPSECRET"), "round \(round): the secret reached the copy")
            XCTAssertFalse(found.stdout.split(separator: "\n").contains { !$0.isEmpty && $0 != Substring(secret) },
                           "round \(round): a symlink other than the one planted: \(found.stdout)")
            assertOK(coffer(["unmount", restored]), "unmount")
        }
    }

    /// A view holds no descriptor per entry: a tree of more entries than the daemon may
    /// have descriptors (a home directory's, past any limit) is read whole. The daemon here
    /// may have 256; the tree has 3,000 files in 30 directories.
    func testATreeLargerThanTheDescriptorLimitIsReadWhole() {
        let plain = scratch.mkdir("plain")
        assertOK(Harness.sh("cd '\(plain)' && for d in $(seq 1 30); do mkdir d$d; (cd d$d && seq 1 100 | xargs touch); done"), "tree")
        let passfile = initView(plain)
        let view = scratch.mkdir("view")
        assertOK(Harness.sh("prlimit --nofile=256:256 '\(Harness.coffer)' mount --reverse --passfile '\(passfile)' '\(plain)' '\(view)'"),
                 "mount with 256 descriptors")
        addTeardownBlock { Harness.run([Harness.coffer, "unmount", view]) }
        let pid = Harness.sh("pgrep -f -- '--reverse.*\(view)'").stdout.split(separator: "\n").first.map(String.init) ?? "?"
        XCTAssertTrue(Harness.sh("grep 'Max open files' /proc/\(pid)/limits").stdout.contains("256"), "the daemon's limit")
        assertOK(Harness.sh("tar -cf - -C '\(view)' . | tar -tf - | grep -c . | grep -x 3063 > /dev/null"),
                 "tar of the whole view (3,000 files, 30 directories with their IV files, the root's IV file and config)")
    }

    /// A view's daemon keeps its keys as a vault's does: while it serves, the view's
    /// subkeys are in its memory and the master key is not, nor the passphrase, nor the
    /// plaintext of a file the backup read through it.
    func testAViewsDaemonHoldsNeitherTheMasterKeyNorWhatItRead() throws {
        if let sanitizer = Harness.sanitizer { throw XCTSkip("a memory scan reads no \(sanitizer) sanitizer's address space") }
        let plain = scratch.mkdir("plain")
        let marker = "PLAINTEXT-MARKER-\(getpid())-"
        assertOK(Harness.sh("cd '\(plain)' && for i in $(seq 1 300); do printf '\(marker)%06d\\n' $i; done > doc"), "plaintext")
        let passfile = initView(plain)
        let view = mountView(plain, passfile: passfile)
        let vectors = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("vectors").path
        let script = Harness.memoryScan + """
            import json, os, subprocess, sys
            plain, view, recovery, passfile, marker, vectors = sys.argv[1:7]
            sys.path.insert(0, vectors)
            import check_format as f
            conf = json.load(open(os.path.join(plain, ".coffer.reverse.conf")))
            k = conf["kdf"]
            canonical = f.canonical_parameters(conf["format"], conf["created"], conf["contentCipher"], conf["blockSize"],
                                               k["algorithm"], k["opsLimit"], k["memLimit"], f.b64url_decode(k["salt"]))
            slot = next(s for s in conf["slots"] if s["kind"] == "recovery")
            master = f.unwrap_key_slot(f.kek_rec(f.parse_recovery_key(open(recovery).read())), slot["wrappedKey"], canonical, "recovery")
            needles = {"master": master, "subkey 10": f.subkey(master, 10), "subkey 1": f.subkey(master, 1),
                       "passphrase": open(passfile, "rb").read().rstrip(b"\\n"), "plaintext": marker.encode()}
            subprocess.run(f"tar -cf - -C '{view}' . | cat > /dev/null", shell=True, check=True)
            pid = int(subprocess.run(["pgrep", "-f", "--", f"--reverse.*{view}"], capture_output=True, text=True).stdout.split()[0])
            print("scan", json.dumps(scan(pid, needles), sort_keys=True))
            """
        let r = Harness.run(["python3", "-c", script, plain, view, scratch.path + "/view.recovery", passfile, marker, vectors], timeout: 120)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr)
        let found = Harness.scanCounts(r.stdout, "scan ")
        XCTAssertGreaterThan(found["subkey 10"] ?? 0, 0, "the scan finds the view's own key: \(r.stdout)")
        XCTAssertGreaterThan(found["subkey 1"] ?? 0, 0, "the scan finds the content key: \(r.stdout)")
        for name in ["master", "passphrase", "plaintext"] {
            XCTAssertEqual(found[name], 0, "\(name) in the view's daemon: \(r.stdout)")
        }
    }

    func testAViewsMistakesHaveTheirMessagesAndStatuses() {
        let plain = scratch.mkdir("plain")
        let view = scratch.mkdir("view")
        let passfile = scratch.file("pass", "view passphrase\n")
        let none = coffer(["mount", "--reverse", "--passfile", passfile, plain, view])
        XCTAssertEqual(none.status, 12, none.stderr)
        XCTAssertTrue(none.stderr.contains("no reverse view's config"), none.stderr)
        _ = initView(plain)
        let again = coffer(["init", "--reverse", "--kdf-ops", "2", "--kdf-memory", "64", "--passfile", passfile, plain])
        XCTAssertEqual(again.status, 11, again.stderr)
        XCTAssertTrue(again.stderr.contains("has a reverse view's config already"), again.stderr)
        let wrong = coffer(["mount", "--reverse", "--passfile", scratch.file("wrong", "not it\n"), plain, view])
        XCTAssertEqual(wrong.status, 22, wrong.stderr)
        let stray = coffer(["mount", "--exclude", "x", "--passfile", passfile, plain, view])
        XCTAssertEqual(stray.status, 64, stray.stderr)
        let locking = coffer(["mount", "--reverse", "--idle-lock", "5m", "--passfile", passfile, plain, view])
        XCTAssertEqual(locking.status, 64, locking.stderr)
        XCTAssertTrue(locking.stderr.contains("does not go with --reverse"), locking.stderr)
        let inside = coffer(["mount", "--reverse", "--passfile", passfile, plain, scratch.mkdir("plain/view")])
        XCTAssertEqual(inside.status, 64, inside.stderr)
        XCTAssertTrue(inside.stderr.contains("cannot be mounted in what it shows"), inside.stderr)
        let noPassphrase = coffer(["mount", "--reverse", plain, view], input: "")
        XCTAssertEqual(noPassphrase.status, 24, noPassphrase.stderr)
        // Mounted, then unmounted: the daemon is gone when unmount returns.
        assertOK(coffer(["mount", "--reverse", "--passfile", passfile, plain, view]), "mount")
        let device = Harness.sh("mountpoint -d '\(view)'").stdout.split(separator: ":").last.map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }
        assertOK(coffer(["unmount", view]), "unmount")
        XCTAssertFalse(FileManager.default.fileExists(atPath: "/sys/fs/fuse/connections/\(device ?? "?")"), "the daemon outlived unmount")
    }
}

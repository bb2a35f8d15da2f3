// End-to-end: the after-first-unlock class (format 8, docs/FORMAT.md §12). Its
// directories keep working through `coffer lock` — read, write, reopen, create, rename,
// list, make directories, a database reopened — while the rest of the vault locks;
// `coffer lock --all` locks them too; a file moves between key domains by its key alone.
import Foundation
import XCTest

final class AfterFirstUnlockTests: EndToEndCase {
    /// A format-8 vault with mail/ (after-first-unlock) and docs/ (complete), mounted.
    func vaultWithMail() -> MountedVault {
        let vault = MountedVault(scratch: scratch, name: "afu", initOptions: ["--format", "8"])
        vault.mount()
        assertOK(vault.sh("""
            mkdir mail docs && '\(Harness.coffer)' protect --class after-first-unlock mail > /dev/null &&
            echo 'first message' > mail/1 && echo 'a document' > docs/d && mkdir mail/sub && echo deep > mail/sub/x
            """), "vault")
        return vault
    }

    func testItsDirectoriesWorkThroughALockAndTheRestLocks() {
        let vault = vaultWithMail()
        assertOK(vault.sh("'\(Harness.coffer)' lock \"$M\" > /dev/null"), "lock")
        let locked = vault.sh("""
            cat mail/1 mail/sub/x && echo 'second message' > mail/2 && echo appended >> mail/1 &&
            mv mail/2 mail/sub/2 && mkdir mail/new && echo n > mail/new/n && ls -R mail | tr '\\n' ' '
            """)
        XCTAssertEqual(locked.status, 0, locked.stderr)
        XCTAssertEqual(locked.stdout, "first message\ndeep\nmail: 1 new sub  mail/new: n  mail/sub: 2 x ")
        for script in ["cat docs/d", "ls docs", "echo x > docs/e"] {
            XCTAssertTrue(vault.sh(script).stderr.contains("Permission denied"), "\(script) while locked")
        }
        XCTAssertTrue(vault.sh("'\(Harness.coffer)' status \"$M\"").stdout.contains("kept: after-first-unlock"))
        assertOK(vault.sh("'\(Harness.coffer)' lock --all \"$M\" > /dev/null"), "lock --all")
        XCTAssertFalse(vault.sh("'\(Harness.coffer)' status \"$M\"").stdout.contains("kept:"), "kept after lock --all")
        XCTAssertTrue(vault.sh("cat mail/1").stderr.contains("Permission denied"), "mail/ after lock --all")
        assertOK(vault.sh("'\(Harness.coffer)' unlock --passfile '\(vault.passfile)' \"$M\" > /dev/null"), "unlock")
        let after = vault.sh("cat mail/1 mail/sub/2 mail/new/n docs/d")
        XCTAssertEqual(after.stdout, "first message\nappended\nsecond message\nn\na document\n", after.stderr)
        vault.unmount()
    }

    func testASqliteDatabaseIsReopenedWhileLocked() {
        let vault = vaultWithMail()
        let script = """
            import sqlite3, subprocess, sys
            coffer, m = sys.argv[1:3]
            db = m + "/mail/index.sqlite"
            c = sqlite3.connect(db); c.execute("create table t (n)"); c.commit(); c.close()
            subprocess.run([coffer, "lock", m], check=True, stdout=subprocess.DEVNULL)
            for n in range(20):
                c = sqlite3.connect(db); c.execute("insert into t values (?)", (n,)); c.commit(); c.close()
            c = sqlite3.connect(db); print(c.execute("select count(*) from t").fetchone()[0]); c.close()
            """
        let r = Harness.run(["python3", "-c", script, Harness.coffer, vault.mountpoint])
        XCTAssertEqual(r.status, 0, r.stderr)
        XCTAssertEqual(r.stdout, "20\n")
        vault.unmount()
    }

    /// A file renamed between key domains is re-wrapped, not re-encrypted (its blocks
    /// stay as they were), and locks with its new directory; a directory keeps its own
    /// class wherever it moves (mail/sub in docs/ still works through a lock), and one of
    /// the class moved within a complete directory still opens after a remount; a hard
    /// link and a symlink's rename across domains are refused (EXDEV: mv copies the link).
    func testAFileMovesBetweenKeyDomainsByItsKeyAlone() {
        let vault = vaultWithMail()
        let blocks = "tail -c +107 \"$(find \"$C\" -inum $(stat -c %i \"$1\"))\" | md5sum"
        let before = vault.sh("f() { \(blocks); }; f docs/d")
        assertOK(vault.sh("mv docs/d mail/d && mv mail/1 docs/1 && mv mail/sub docs/sub"), "renames")
        XCTAssertEqual(vault.sh("f() { \(blocks); }; f mail/d").stdout, before.stdout, "the blocks were sealed again")
        XCTAssertTrue(vault.sh("ln mail/d docs/link").stderr.contains("Invalid cross-device link"))
        let rename = vault.sh("ln -s d mail/l && python3 -c 'import os; os.rename(\"mail/l\", \"docs/l\")'")
        XCTAssertTrue(rename.stderr.contains("Invalid cross-device link"), rename.stderr)
        assertOK(vault.sh("'\(Harness.coffer)' lock \"$M\" > /dev/null"), "lock")
        XCTAssertEqual(vault.sh("cat mail/d docs/sub/x").stdout, "a document\ndeep\n", "moved into mail/, or with its class, it stays readable")
        XCTAssertTrue(vault.sh("cat docs/1").stderr.contains("Permission denied"), "moved out of mail/, it locks")
        assertOK(vault.sh("'\(Harness.coffer)' unlock --passfile '\(vault.passfile)' \"$M\" > /dev/null"), "unlock")
        XCTAssertEqual(vault.sh("cat docs/1 mail/d").stdout, "first message\na document\n")
        assertOK(vault.sh("mv mail post && mv docs/sub post/sub"), "the class's directory renamed in the complete root")
        vault.unmount()
        vault.mount()
        let moved = vault.sh("cat post/d post/sub/x && '\(Harness.coffer)' protect post/sub")
        XCTAssertEqual(moved.stdout, "a document\ndeep\npost/sub: after-first-unlock\n", moved.stderr + vault.log)
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
    }

    /// A power cut in moves between the key domains kept the renames and place xattrs but
    /// not the new headers (old tag, old domain's key wrap). The mount after it mends a
    /// header when its file is opened, wrap included: the moved file then reads through a
    /// lock in its new class. One not opened before a clean unmount keeps its stale header;
    /// it still moves back across the domains. fsck is clean.
    func testMovesBetweenDomainsCutByAPowerCutAreMended() {
        let vault = vaultWithMail()
        // The header of version 4 is the first 106 bytes (FORMAT.md §12, "Format 8").
        let header = "head -c 106 \"$(find \"$C\" -inum $(stat -c %i \"$1\"))\""
        assertOK(vault.sh("""
            h() { \(header); }; h docs/d > ../d.header && h mail/1 > ../1.header
            mv docs/d mail/d && mv mail/1 docs/1
            """), "moves")
        let moved = [vault.backingPath(of: "mail/d"), vault.backingPath(of: "docs/1")]
        vault.killDaemon()
        assertOK(Harness.sh("""
            dd if='\(scratch.path)/d.header' of='\(moved[0])' conv=notrunc status=none
            dd if='\(scratch.path)/1.header' of='\(moved[1])' conv=notrunc status=none
            """), "the headers as they were before the moves")
        vault.mount()
        XCTAssertEqual(vault.sh("cat mail/d").stdout, "a document\n", vault.log)
        vault.unmount()
        vault.mount()
        // Looked up before the lock (a fresh mount's class is reached along known paths).
        assertOK(vault.sh("stat mail/d > /dev/null && '\(Harness.coffer)' lock \"$M\" > /dev/null"), "lock")
        let locked = vault.sh("cat mail/d")
        XCTAssertEqual(locked.stdout, "a document\n", "a mended file moved into mail/ reads through a lock: \(locked.stderr)")
        assertOK(vault.sh("'\(Harness.coffer)' unlock --passfile '\(vault.passfile)' \"$M\" > /dev/null"), "unlock")
        let back = vault.sh("mv docs/1 mail/one && mv mail/d docs/d && cat mail/one docs/d")
        XCTAssertEqual(back.stdout, "first message\na document\n", back.stderr + vault.log)
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
    }

    /// A tree made in a complete directory — big and small files, a long name, symlinks
    /// (one with a long target), xattrs, a FIFO, a subdirectory — takes the class with
    /// `coffer protect`: every entry reads as before, with its mode and times, and a big
    /// file's blocks are the bytes they were (re-wrapped, not re-encrypted); through a
    /// lock the directory works, its complete subdirectory does not. Back to `complete`,
    /// a lock refuses it again. fsck is clean throughout.
    func testAClassChangeMovesADirectorysEntriesIntoTheOtherDomain() {
        let vault = vaultWithMail()
        let C = Harness.coffer
        assertOK(vault.sh("""
            mkdir -p docs/t/sub && cd docs/t && head -c 300000 /dev/urandom > big && echo small > small && echo s > sub/s
            echo long > "$(printf 'n%.0s' $(seq 200))" && ln -s small link && ln -s "$(printf 'x%.0s' $(seq 4000))" far
            setfattr -n user.note -v hello small && setfattr -n user.here -v dir . && mkfifo fifo && chmod 640 small
            touch -h -d 2020-01-02 link && touch -d 2021-02-03 big
            """), "tree")
        // The subdirectory (complete, refused while locked) is left out, and the
        // directory's own times (the kernel may have cached them).
        let snapshot = """
            cd docs/t && find . -mindepth 1 -path ./sub -prune -o -printf '%P %y %m %s %T@ %l\\n' | sort | md5sum
            find . -path ./sub -prune -o -type f -print0 | sort -z | xargs -0 cat | md5sum; getfattr -d small . 2>/dev/null | md5sum
            """
        let blocks = "tail -c +107 \"$(find \"$C\" -inum $(stat -c %i docs/t/big))\" | md5sum"
        let before = vault.sh(snapshot), beforeBlocks = vault.sh(blocks)
        let changed = vault.sh("'\(C)' protect --class after-first-unlock docs/t && '\(C)' protect docs/t && '\(C)' protect docs/t/sub")
        XCTAssertEqual(changed.stdout, "docs/t: after-first-unlock\ndocs/t: after-first-unlock\ndocs/t/sub: complete\n", changed.stderr)
        XCTAssertEqual(vault.sh(snapshot).stdout, before.stdout, "the tree after the class change")
        XCTAssertEqual(vault.sh(blocks).stdout, beforeBlocks.stdout, "the blocks were sealed again")
        XCTAssertTrue(vault.log.contains("set to after-first-unlock: 7 entries moved"), vault.log)
        assertOK(vault.sh("'\(C)' lock \"$M\" > /dev/null"), "lock")
        XCTAssertEqual(vault.sh(snapshot).stdout, before.stdout, "the tree through a lock")
        XCTAssertTrue(vault.sh("cat docs/t/sub/s").stderr.contains("Permission denied"), "its complete subdirectory through a lock")
        assertOK(vault.sh("'\(C)' unlock --passfile '\(vault.passfile)' \"$M\" && '\(C)' protect --class complete docs/t > /dev/null"),
                 "back to complete")
        XCTAssertEqual(vault.sh(snapshot).stdout, before.stdout, "the tree back in the vault domain")
        assertOK(vault.sh("'\(C)' lock \"$M\" > /dev/null"), "lock")
        XCTAssertTrue(vault.sh("cat docs/t/small").stderr.contains("Permission denied"), "complete again")
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
    }

    /// A class change that would leave something behind is refused before it begins, with
    /// status 60: a file with a second hard link. The vault without the class says so
    /// (status 14).
    func testAClassChangeThatWouldLeaveAFileBehindIsRefused() {
        let vault = vaultWithMail()
        let r = vault.sh("echo a > docs/a && ln docs/a docs/b && '\(Harness.coffer)' protect --class after-first-unlock docs || echo \"status $?\"")
        XCTAssertEqual(r.stdout, "status 60\n", r.stderr)
        XCTAssertTrue(r.stderr.contains("docs: a file in it has more than one hard link"), r.stderr)
        XCTAssertEqual(vault.sh("'\(Harness.coffer)' protect docs; cat docs/b").stdout, "docs: complete\na\n")
        vault.unmount()
        let old = MountedVault(scratch: scratch, name: "seven", initOptions: ["--format", "7"])
        old.mount()
        let seven = old.sh("mkdir m && '\(Harness.coffer)' protect --class after-first-unlock m || echo \"status $?\"")
        XCTAssertEqual(seven.stdout, "status 14\n", seven.stderr)
        XCTAssertTrue(seven.stderr.contains("m: this vault's format has no after-first-unlock class"), seven.stderr)
        old.unmount()
    }

    /// A class change killed at each kind of step it takes: strace kills the daemon as the
    /// thread running the change makes its Nth call of one kind (a header or record write,
    /// an xattr set, a rename, an unlink, a symlink, a time set), both ways between the
    /// classes, and in some rounds again while the next mount finishes the change (each
    /// point one the change reaches whatever order its entries' backing names take: the
    /// names are random, so a symlink may be converted before the first cut). Among
    /// the points: the 3rd rename, after that file's header and key wrap went to the new
    /// domain and before its name did (the resumed change must take it as moved, though
    /// its place xattr still passes it in the old domain). Each time fsck says the change
    /// was cut and finds no damage (the directory's own xattrs are in either domain until
    /// then); the mount after finishes it when the directory is entered; every entry is as
    /// it was — names (a long one), types, sizes, symlink targets (a long one), contents,
    /// xattrs, a FIFO, a subdirectory — and fsck is clean.
    func testAClassChangeKilledAtAnyStepIsFinishedByTheNextMount() {
        let vault = vaultWithMail()
        assertOK(vault.sh("""
            mkdir t && cd t && for i in 1 2 3 4 5 6; do echo "f$i" > f$i; done && echo long > "$(printf 'L%.0s' $(seq 200))" &&
            ln -s f1 s1 && ln -s "$(printf 'x%.0s' $(seq 3500))" slong && mkdir sub && echo deep > sub/x && echo xa > xf &&
            setfattr -n user.k -v val xf && setfattr -n user.dir -v dv . && mkfifo fifo && head -c 3000000 /dev/urandom > big
            """), "tree")
        let look = "cd t && find . -printf '%p %y %s %l\\n' | sort && cat f? L* sub/x xf big | md5sum && getfattr -d xf . && cd .. && '\(Harness.coffer)' protect t"
        let expected = vault.sh(look).stdout
        // The vault with t complete, and with t after-first-unlock.
        let complete = scratch.path + "/t-complete", afterFirstUnlock = scratch.path + "/t-afu"
        vault.unmount()
        assertOK(Harness.sh("cp -a '\(vault.cipherdir)' '\(complete)'"), "copy")
        vault.mount()
        assertOK(vault.sh("'\(Harness.coffer)' protect --class after-first-unlock t > /dev/null"), "protect")
        vault.unmount()
        assertOK(Harness.sh("cp -a '\(vault.cipherdir)' '\(afterFirstUnlock)'"), "copy")
        typealias Point = (call: String, n: Int)
        let rounds: [(to: String, cut: Point, then: Point?)] = [
            ("after-first-unlock", ("pwrite64", 2), nil), ("after-first-unlock", ("pwrite64", 8), nil),
            ("after-first-unlock", ("fsetxattr", 1), nil), ("after-first-unlock", ("fsetxattr", 5), nil),
            ("after-first-unlock", ("setxattr", 1), nil), ("after-first-unlock", ("renameat2", 1), nil),
            ("after-first-unlock", ("renameat2", 3), nil), ("after-first-unlock", ("renameat2", 8), nil),
            ("after-first-unlock", ("unlinkat", 2), nil), ("after-first-unlock", ("symlinkat", 2), nil),
            ("after-first-unlock", ("utimensat", 8), nil),
            ("complete", ("renameat2", 3), nil), ("complete", ("fsetxattr", 2), nil), ("complete", ("symlinkat", 1), nil),
            ("after-first-unlock", ("renameat2", 2), ("fsetxattr", 2)), ("after-first-unlock", ("fsetxattr", 6), ("renameat2", 3)),
            ("complete", ("renameat2", 2), ("fsetxattr", 1)),
        ]
        for (to, cut, then) in rounds {
            let round = "to \(to), killed at \(cut.call) \(cut.n)" + (then.map { ", then at \($0.call) \($0.n)" } ?? "")
            assertOK(Harness.sh("""
                rm -rf '\(vault.cipherdir)' '\(vault.stateDir)' && cp -a '\(to == "complete" ? afterFirstUnlock : complete)' '\(vault.cipherdir)'
                """), "restore")
            vault.mount()
            XCTAssertTrue(vault.killed(at: cut, during: "'\(Harness.coffer)' protect --class \(to) t"), "\(round): not killed")
            if let then {
                vault.mount()
                XCTAssertTrue(vault.killed(at: then, during: "ls t"), "\(round): not killed while finishing")
            }
            let cutFsck = vault.fsck()
            XCTAssertEqual(cutFsck.status, 0, "\(round): " + cutFsck.stdout + cutFsck.stderr)
            XCTAssertTrue(cutFsck.stdout.contains("class: /t: protection class changing from "), "\(round): \(cutFsck.stdout)")
            vault.mount()
            XCTAssertEqual(vault.sh(look).stdout, expected.replacingOccurrences(of: "t: complete", with: "t: \(to)"), "\(round): \(vault.log)")
            XCTAssertTrue(vault.log.contains("finishing its class change to \(to)"), "\(round): \(vault.log)")
            XCTAssertFalse(vault.log.contains("could not be finished"), "\(round): \(vault.log)")
            vault.unmount()
            let fsck = vault.fsck()
            XCTAssertEqual(fsck.status, 0, "\(round): " + fsck.stdout + fsck.stderr)
        }
    }

    /// Two machines (the vault and a copy of it) change the same directory's class on
    /// their own: each writes the same bytes, file for file and link for link, so a sync
    /// engine that carries either finds nothing to merge (SyncthingTests has the engine).
    /// Then they disagree: this mount changes it back while another writer brings in the
    /// other machine's entries and class record, as a sync engine would, leaving entries
    /// of both key domains. `coffer protect` again gathers them into one: every file
    /// served once, nothing else, and fsck clean.
    func testTwoMachinesConvertingTheSameDirectoryWriteTheSameBytes() {
        let vault = vaultWithMail()
        assertOK(vault.sh("mkdir -p docs/t/sub && for i in $(seq 30); do echo $i > docs/t/f$i; done && ln -s f1 docs/t/l && echo s > docs/t/sub/s"),
                 "tree")
        vault.unmount()
        let other = scratch.path + "/other.cipher", otherMount = scratch.mkdir("other.plain")
        assertOK(Harness.sh("cp -a '\(vault.cipherdir)' '\(other)'"), "the other machine's copy")
        let C = Harness.coffer
        assertOK(Harness.sh("""
            '\(C)' mount --passfile '\(vault.passfile)' '\(other)' '\(otherMount)'
            '\(C)' protect --class after-first-unlock '\(otherMount)/docs/t' > /dev/null
            '\(C)' unmount '\(otherMount)'
            """), "the other machine converts")
        vault.mount()
        assertOK(vault.sh("'\(C)' protect --class after-first-unlock docs/t > /dev/null"), "this machine converts")
        let same = Harness.sh("""
            sums() { cd "$1" && find . -path ./coffer.conf -prune -o -path ./coffer.journal -prune -o -type f -print0 | sort -z | xargs -0 md5sum; \
                     find . -type l -printf '%p %l\\n' | sort; }
            diff <(sums '\(vault.cipherdir)') <(sums '\(other)') && echo same bytes
            """)
        XCTAssertEqual(same.stdout, "same bytes\n", same.stdout + same.stderr)
        let r = vault.sh("""
            t=$(find "$C" -mindepth 2 -maxdepth 2 -type d -inum "$(stat -c %i docs/t)")
            o='\(other)'/${t#"$C"/}
            '\(C)' protect --class complete docs/t > /dev/null
            for f in "$o"/*; do cp -a "$f" "$t/.incoming" && mv -T "$t/.incoming" "$t/$(basename "$f")"; done
            ls docs/t | wc -l
            '\(C)' protect --class complete docs/t
            cat docs/t/f7 docs/t/f30 docs/t/sub/s && readlink docs/t/l && ls docs/t | wc -l
            """)
        XCTAssertEqual(r.stdout, "32\ndocs/t: complete\n7\n30\ns\nf1\n32\n", r.stderr + vault.log)
        XCTAssertTrue(vault.log.contains("damage: in /docs/t"), "entries of the other domain were not seen: \(vault.log)")
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
    }

    /// fsck reads both key domains: a clean format-8 vault has no problems, its classes
    /// listed; a changed byte of an after-first-unlock file is damage; and that file's
    /// backing copied over a complete directory's file is refused there.
    func testFsckChecksBothDomains() {
        let vault = vaultWithMail()
        let mail = vault.backingPath(of: "mail/1"), docs = vault.backingPath(of: "docs/d")
        vault.unmount()
        let clean = vault.fsck()
        XCTAssertEqual(clean.status, 0, clean.stdout + clean.stderr)
        XCTAssertTrue(clean.stdout.contains("class: /mail: protection class after-first-unlock"), clean.stdout)
        assertOK(Harness.sh("cp '\(mail)' '\(docs)'"), "copy")
        assertOK(Harness.sh("python3 -c 'f = open(\"\(mail)\", \"r+b\"); f.seek(120); b = f.read(1); f.seek(120); f.write(bytes([b[0] ^ 1]))'"),
                 "flip")
        let damaged = vault.fsck()
        XCTAssertEqual(damaged.status, 40, damaged.stdout + damaged.stderr)
        XCTAssertTrue(damaged.stdout.contains("damaged: /mail/1: block 0 failed authentication"), damaged.stdout)
        XCTAssertTrue(damaged.stdout.contains("damaged: /docs/d: its content belongs to another name or directory"), damaged.stdout)
    }

    /// The daemon's memory after a lock that keeps the class (read as root, knowing every
    /// key from the recovery key): the after-first-unlock domain's seven subkeys are
    /// there; the master key, subkey 9 (their root), every vault-domain subkey and the
    /// names of a complete directory listed before the lock are not. After lock --all,
    /// no key is.
    func testALockKeepsTheClassKeysAndNoOther() throws {
        if let sanitizer = Harness.sanitizer { throw XCTSkip("a memory scan reads no \(sanitizer) sanitizer's address space") }
        let recovery = scratch.path + "/recovery"
        let vault = MountedVault(scratch: scratch, name: "scan", initOptions: ["--format", "8", "--recovery-key-out", recovery])
        vault.mount()
        let vectors = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("vectors").path
        let script = Harness.memoryScan + """
            import json, os, subprocess, sys
            coffer, m, c, recovery, vectors = sys.argv[1:6]
            sys.path.insert(0, vectors)
            import check_format as f
            conf = json.load(open(os.path.join(c, "coffer.conf")))
            k = conf["kdf"]
            canonical = f.canonical_parameters(conf["format"], conf["created"], conf["contentCipher"], conf["blockSize"],
                                               k["algorithm"], k["opsLimit"], k["memLimit"], f.b64url_decode(k["salt"]))
            slot = next(s for s in conf["slots"] if s["kind"] == "recovery")
            master = f.unwrap_key_slot(f.kek_rec(f.parse_recovery_key(open(recovery).read())), slot["wrappedKey"], canonical, "recovery")
            keys = {"master": master, **{"subkey %d" % i: f.subkey(master, i) for i in range(1, 10)},
                    **{"afu subkey %d" % i: f.afu_subkey(master, i) for i in range(1, 8)}}
            os.makedirs(os.path.join(m, "mail"))
            subprocess.run([coffer, "protect", "--class", "after-first-unlock", os.path.join(m, "mail")], check=True, stdout=subprocess.DEVNULL)
            with open(os.path.join(m, "mail", "1"), "w") as g: g.write("message")
            with open(os.path.join(m, "doc"), "w") as g: g.write("document")
            # Names of a complete directory, listed and opened before the lock.
            marker = "DOCNAME%d" % os.getpid()
            os.makedirs(os.path.join(m, "docs"))
            for i in range(20):
                with open(os.path.join(m, "docs", "%s-%d" % (marker, i)), "w") as g: g.write("x")
            assert len(os.listdir(os.path.join(m, "docs"))) == 20
            keys["complete directory's name"] = marker.encode()
            pid = json.loads(subprocess.run([coffer, "status", "--json", m], capture_output=True, check=True).stdout)["pid"]
            subprocess.run([coffer, "lock", m], check=True, stdout=subprocess.DEVNULL)
            assert open(os.path.join(m, "mail", "1")).read() == "message"
            print("locked", json.dumps(scan(pid, keys), sort_keys=True))
            subprocess.run([coffer, "lock", "--all", m], check=True, stdout=subprocess.DEVNULL)
            print("all", json.dumps(scan(pid, keys), sort_keys=True))
            """
        let r = Harness.run(["python3", "-c", script, Harness.coffer, vault.mountpoint, vault.cipherdir, recovery, vectors], timeout: 120)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr)
        func counts(_ prefix: String) -> [String: Int] { Harness.scanCounts(r.stdout, prefix) }
        let locked = counts("locked "), all = counts("all ")
        XCTAssertFalse(locked.isEmpty || all.isEmpty, r.stdout)
        for name in ["master"] + (1...9).map({ "subkey \($0)" }) {
            XCTAssertEqual(locked[name], 0, "\(name) after a lock: \(r.stdout)")
            XCTAssertEqual(all[name], 0, "\(name) after lock --all: \(r.stdout)")
        }
        XCTAssertEqual(locked["complete directory's name"], 0, "a complete directory's names after a lock: \(r.stdout)")
        for name in (1...7).map({ "afu subkey \($0)" }) {
            XCTAssertGreaterThan(locked[name] ?? 0, 0, "\(name) not kept by the lock: \(r.stdout)")
            XCTAssertEqual(all[name], 0, "\(name) after lock --all: \(r.stdout)")
        }
        vault.unmount()
    }

    /// A real mail synchroniser (mbsync) pulls from a real IMAP server (dovecot on
    /// 127.0.0.1) into an after-first-unlock maildir once per delivery, across two locks:
    /// every run succeeds — each reopens its state files (.uidvalidity, .mbsyncstate) made
    /// before the lock — and every message is there once. The server is stopped even if
    /// the test fails.
    func testAMailSynchroniserPullsThroughLocks() throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/sbin/dovecot"),
              FileManager.default.isExecutableFile(atPath: "/usr/bin/mbsync") else {
            throw XCTSkip("dovecot-imapd and isync are not installed (scripts/setup --test installs them)")
        }
        let vault = vaultWithMail()
        let server = scratch.mkdir("imap")
        addTeardownBlock { Harness.sh("[ -f '\(server)/run/master.pid' ] && kill $(cat '\(server)/run/master.pid') || true") }
        let script = """
            import os, re, socket, subprocess, sys, time
            coffer, m, passfile, d = sys.argv[1:5]
            with socket.socket() as s: s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
            for way in (os.path.dirname(d), d): os.chmod(way, 0o711)  # the server's user passes through
            home = os.path.join(d, "home", "u", "Maildir")
            for sub in ("new", "cur", "tmp"): os.makedirs(os.path.join(home, sub))
            for sub in ("run", "state"): os.makedirs(os.path.join(d, sub))
            subprocess.run(["chown", "-R", "nobody:nogroup", os.path.join(d, "home")], check=True)
            open(os.path.join(d, "dovecot.conf"), "w").write(f\"\"\"
            base_dir = {d}/run
            state_dir = {d}/state
            log_path = {d}/dovecot.log
            protocols = imap
            listen = 127.0.0.1
            ssl = no
            disable_plaintext_auth = no
            auth_mechanisms = plain
            first_valid_uid = 1
            passdb {{
              driver = static
              args = password=secret
            }}
            userdb {{
              driver = static
              args = uid=nobody gid=nogroup home={d}/home/%u mail=maildir:~/Maildir
            }}
            service imap-login {{
              inet_listener imap {{
                address = 127.0.0.1
                port = {port}
              }}
              inet_listener imaps {{
                port = 0
              }}
              chroot =
            }}
            service anvil {{
              chroot =
            }}
            \"\"\")
            open(os.path.join(d, "mbsyncrc"), "w").write(f\"\"\"
            IMAPAccount test
            Host 127.0.0.1
            Port {port}
            User u
            Pass secret
            SSLType None
            AuthMechs PLAIN

            IMAPStore remote
            Account test

            MaildirStore local
            Path {m}/mail/
            Inbox {m}/mail/INBOX
            SubFolders Verbatim

            Channel c
            Far :remote:
            Near :local:
            Patterns INBOX
            Create Near
            SyncState *
            \"\"\")
            # Its daemon holds no pipe of ours (the harness reads ours to their end).
            subprocess.run(["dovecot", "-c", os.path.join(d, "dovecot.conf")], check=True,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            failed, rounds = [], 30
            for n in range(rounds):
                if n in (8, 20): subprocess.run([coffer, "lock", m], check=True, stdout=subprocess.DEVNULL)
                if n == 14: subprocess.run([coffer, "unlock", "--passfile", passfile, m], check=True, stdout=subprocess.DEVNULL)
                path = os.path.join(home, "new", "%d.test" % n)
                open(path, "w").write(f"From: a@b\\nTo: u@b\\nSubject: {n}\\nMessage-ID: <{n}@test>\\n\\nmessage {n}\\n")
                subprocess.run(["chown", "nobody:nogroup", path], check=True)
                r = subprocess.run(["mbsync", "-q", "-c", os.path.join(d, "mbsyncrc"), "-a"], capture_output=True, text=True)
                if r.returncode != 0: failed.append((n, r.stderr.strip()[-200:]))
            ids = []
            for sub in ("new", "cur"):
                for name in os.listdir(os.path.join(m, "mail", "INBOX", sub)):
                    ids += re.findall(r"Message-ID: <(\\d+)@test>", open(os.path.join(m, "mail", "INBOX", sub, name)).read())
            print("failed runs", failed)
            print("messages", sorted(map(int, ids)) == list(range(rounds)), len(ids))
            """
        let r = Harness.run(["python3", "-c", script, Harness.coffer, vault.mountpoint, vault.passfile, server], timeout: 300)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr)
        XCTAssertTrue(r.stdout.contains("failed runs []\n"), r.stdout + r.stderr)
        XCTAssertTrue(r.stdout.contains("messages True 30\n"), r.stdout + r.stderr)
        assertOK(vault.sh("'\(Harness.coffer)' unlock --passfile '\(vault.passfile)' \"$M\" > /dev/null"), "unlock")
        vault.unmount()
    }
}

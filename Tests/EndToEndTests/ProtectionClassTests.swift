// End-to-end: protection classes (format 6). A directory's class is set and shown with
// `coffer protect` (or the xattr user.coffer.class) and taken by the directories made in
// it; background programs with files open in an `unless-open` directory go on through a
// lock, while a `complete` directory beside them refuses everything; and after the lock
// the daemon's memory holds no key but those of the unless-open files still open.
import Foundation
import XCTest

final class ProtectionClassTests: EndToEndCase {
    func testProtectSetsShowsInheritsAndRefusesWithItsStatuses() {
        let vault = mountedVault()
        let old = MountedVault(scratch: scratch, name: "old", initOptions: ["--format", "5"])
        old.mount()
        let r = vault.sh("""
            C='\(Harness.coffer)'
            mkdir -p bg plain && echo data > bg/file
            "$C" protect --class unless-open bg
            "$C" protect bg; "$C" protect --show plain
            mkdir bg/sub bg/sub/deeper; "$C" protect bg/sub/deeper
            python3 -c 'import os; print("xattr", os.getxattr("plain", "user.coffer.class").decode())'
            setfattr -n user.coffer.class -v unless-open plain && getfattr --only-values -n user.coffer.class plain && echo
            setfattr -x user.coffer.class plain && "$C" protect plain
            st() { local s=0; "$@" > /dev/null 2>&1 || s=$?; echo "status $s"; }
            st "$C" protect --class unless-open bg/file
            st "$C" protect --class sometimes bg
            st "$C" protect --class unless-open /tmp
            st "$C" protect --class unless-open '\(old.mountpoint)'
            "$C" status --json "$M" | jq -c .protectionClasses
            "$C" info '\(vault.cipherdir)' | grep Protection
            "$C" lock "$M" > /dev/null
            st "$C" protect --show "$M"
            """)
        XCTAssertEqual(r.stdout.split(separator: "\n").map(String.init), [
            "bg: unless-open", "bg: unless-open", "plain: complete", "bg/sub/deeper: unless-open", "xattr complete",
            "unless-open", "plain: complete",
            "status 10", "status 64", "status 36", "status 14",
            #"["complete","unless-open"]"#,
            "Protection:     complete (default), unless-open: per directory (coffer protect)",
            "status 48",
        ], r.stderr)
        vault.unmount()
        old.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
        for path in ["/bg", "/bg/sub", "/bg/sub/deeper"] {
            XCTAssertTrue(fsck.stdout.contains("class: \(path): protection class unless-open\n"), fsck.stdout)
        }
        XCTAssertFalse(fsck.stdout.contains("/plain"), fsck.stdout)
        XCTAssertTrue(fsck.stdout.contains("3 directories of a protection class other than complete"), fsck.stdout)
    }

    /// A class file copied in from another directory does not open there (its AD is the
    /// directory's IV): the mount takes the directory as complete and logs damage, fsck
    /// reports it. A sync engine's conflict copy of a class file is read too (the
    /// stricter class holds), and setting the class again removes the copy.
    func testAClassFileFromElsewhereIsDamageAndConflictCopiesAreSettled() {
        let vault = mountedVault()
        assertOK(vault.sh("mkdir a b && '\(Harness.coffer)' protect --class unless-open a > /dev/null"), "setup")
        let dirs = Harness.sh("cd '\(vault.cipherdir)' && ls -d */ | tr -d /").stdout.split(separator: "\n").map(String.init)
        XCTAssertEqual(dirs.count, 2)
        let withClass = dirs.first { FileManager.default.fileExists(atPath: "\(vault.cipherdir)/\($0)/coffer.class") }!
        let other = dirs.first { $0 != withClass }!
        assertOK(Harness.sh("cp '\(vault.cipherdir)/\(withClass)/coffer.class' '\(vault.cipherdir)/\(other)/coffer.class'"), "plant")
        let r = vault.sh("'\(Harness.coffer)' protect a; '\(Harness.coffer)' protect b")
        XCTAssertEqual(r.stdout, "a: unless-open\nb: complete\n", r.stderr)
        XCTAssertTrue(vault.log.contains("damage: /b"), vault.log)
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 40, fsck.stdout)
        XCTAssertTrue(fsck.stdout.contains("damaged: /b: metadata damaged") || fsck.stdout.contains("damaged: /b:"), fsck.stdout)
        // A conflict copy beside the class file: the mount still reads the class; the
        // owner's next setting removes the copy.
        assertOK(Harness.sh("""
            cd '\(vault.cipherdir)' && rm '\(other)/coffer.class'
            cp '\(withClass)/coffer.class' '\(withClass)/coffer.sync-conflict-20261126-120000-ABCDEFG.class'
            """), "copy")
        vault.mount()
        let s = vault.sh("""
            '\(Harness.coffer)' protect a
            '\(Harness.coffer)' protect --class unless-open a > /dev/null
            ls '\(vault.cipherdir)/\(withClass)' | grep -c sync-conflict || true
            """)
        XCTAssertEqual(s.stdout, "a: unless-open\n0\n", s.stderr)
    }

    /// The background programs of the issue, on both transports (the suite runs twice):
    /// a sqlite writer (WAL, one connection) committing a row every 50 ms and an
    /// appender with fsync, each with its files open in an unless-open directory, go on
    /// through a lock of 3 s; a writer beside them in a complete directory is refused
    /// from the lock on. After the unlock every acknowledged row and byte is there and
    /// the database passes its integrity check.
    func testBackgroundProgramsGoOnThroughALockInAnUnlessOpenDirectory() {
        let vault = mountedVault()
        let script = """
            import json, os, sqlite3, subprocess, sys, threading, time
            coffer, m, passfile = sys.argv[1:4]
            os.makedirs(os.path.join(m, "bg")); os.makedirs(os.path.join(m, "docs"))
            subprocess.run([coffer, "protect", "--class", "unless-open", os.path.join(m, "bg")], check=True, stdout=subprocess.DEVNULL)
            db = sqlite3.connect(os.path.join(m, "bg", "mail.db"), isolation_level=None, check_same_thread=False)
            assert db.execute("pragma journal_mode=wal").fetchone()[0] == "wal"
            db.execute("create table t (n integer primary key, body blob)")
            app = os.open(os.path.join(m, "bg", "download"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            doc = os.open(os.path.join(m, "docs", "notes"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            rows, appended, errors, doc_results = [0], [0], [], []
            locked, stop = threading.Event(), threading.Event()
            def sql():
                while not stop.is_set():
                    try:
                        db.execute("insert into t (body) values (?)", (os.urandom(2000),)); rows[0] += 1
                    except Exception as e:
                        errors.append("sqlite: %r" % e)
                    time.sleep(0.05)
            def append():
                while not stop.is_set():
                    try:
                        os.write(app, b"d" * 65536); os.fsync(app); appended[0] += 65536
                    except OSError as e:
                        errors.append("append: %r" % e)
                    time.sleep(0.05)
            def document():
                while not stop.is_set():
                    try:
                        os.write(doc, b"n" * 100); doc_results.append((locked.is_set(), "ok"))
                    except OSError as e:
                        doc_results.append((locked.is_set(), e.errno))
                    time.sleep(0.05)
            threads = [threading.Thread(target=f) for f in (sql, append, document)]
            for t in threads: t.start()
            time.sleep(1)
            subprocess.run([coffer, "lock", m], check=True, stdout=subprocess.DEVNULL)
            locked.set(); rows_at_lock, bytes_at_lock = rows[0], appended[0]
            time.sleep(3)
            during = (rows[0] - rows_at_lock, appended[0] - bytes_at_lock)
            status = subprocess.run([coffer, "status", "--json", m], capture_output=True, text=True).stdout
            locked.clear()
            subprocess.run([coffer, "unlock", "--passfile", passfile, m], check=True, stdout=subprocess.DEVNULL)
            time.sleep(0.5); stop.set()
            for t in threads: t.join()
            print("during the lock: %d rows, %d bytes" % during)
            print("errors", errors)
            print("kept open", json.loads(status)["filesKeptOpen"] >= 2)
            refused = [r for l, r in doc_results if l]
            print("complete writer while locked:", set(refused))
            assert db.execute("pragma integrity_check").fetchone()[0] == "ok"
            print("rows", db.execute("select count(*) from t").fetchone()[0] == rows[0])
            db.close(); os.close(app); os.close(doc)
            print("bytes", os.path.getsize(os.path.join(m, "bg", "download")) == appended[0])
            """
        let r = Harness.run(["python3", "-c", script, Harness.coffer, vault.mountpoint, vault.passfile], timeout: 120)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr)
        XCTAssertTrue(r.stdout.contains("errors []\n"), r.stdout)
        XCTAssertTrue(r.stdout.contains("kept open True\n"), r.stdout)
        XCTAssertTrue(r.stdout.contains("complete writer while locked: {13}\n"), r.stdout)
        XCTAssertTrue(r.stdout.contains("rows True\n"), r.stdout)
        XCTAssertTrue(r.stdout.contains("bytes True\n"), r.stdout)
        let during = r.stdout.split(separator: "\n").first { $0.hasPrefix("during the lock: ") }
        XCTAssertNotNil(during, r.stdout)
        XCTAssertFalse(during?.contains(": 0 rows") ?? true, "no row was committed while locked: \(r.stdout)")
        XCTAssertFalse(during?.contains(" 0 bytes") ?? true, "nothing was appended while locked: \(r.stdout)")
    }

    /// Reads the daemon's memory (as root, /proc/PID/mem) after a lock, knowing every key
    /// (the test has the recovery key and derives them as docs/FORMAT.md says): no master
    /// key, no subkey; the key of the one unless-open file still open is there (that is
    /// what keeps it usable), and is gone once the file is closed.
    func testAfterALockOnlyTheKeysOfOpenUnlessOpenFilesAreInMemory() {
        let recovery = scratch.path + "/recovery"
        let vault = MountedVault(scratch: scratch, initOptions: ["--recovery-key-out", recovery])
        vault.mount()
        let vectors = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("vectors").path
        let script = """
            import hashlib, json, os, subprocess, sys, time
            coffer, m, c, recovery, vectors = sys.argv[1:6]
            sys.path.insert(0, vectors)
            import check_format as f
            conf = json.load(open(os.path.join(c, "coffer.conf")))
            k = conf["kdf"]
            canonical = f.canonical_parameters(conf["format"], conf["created"], conf["contentCipher"], conf["blockSize"],
                                               k["algorithm"], k["opsLimit"], k["memLimit"], f.b64url_decode(k["salt"]))
            slot = next(s for s in conf["slots"] if s["kind"] == "recovery")
            master = f.unwrap_key_slot(f.kek_rec(f.parse_recovery_key(open(recovery).read())), slot["wrappedKey"], canonical, "recovery")
            assert master is not None
            subkeys = [f.subkey(master, i) for i in range(1, 8)]
            os.makedirs(os.path.join(m, "bg"))
            subprocess.run([coffer, "protect", "--class", "unless-open", os.path.join(m, "bg")], check=True, stdout=subprocess.DEVNULL)
            kept = open(os.path.join(m, "bg", "kept"), "w+b"); kept.write(b"k" * 10000); kept.flush()
            with open(os.path.join(m, "bg", "closed"), "wb") as g: g.write(b"c" * 10000)
            def file_key(name):
                ino = os.stat(os.path.join(m, "bg", name)).st_ino
                for root, _, files in os.walk(c):
                    for n in files:
                        p = os.path.join(root, n)
                        if os.stat(p).st_ino == ino:
                            file_id = open(p, "rb").read(18)[2:18]
                            personal = b"coffer-aes-file1" if conf["contentCipher"] == "aes256gcm" else b"coffer-xch-file1"
                            return hashlib.blake2b(b"", digest_size=32, key=subkeys[0], salt=file_id, person=personal).digest()
            keys = {"master": master, **{"subkey %d" % (i + 1): s for i, s in enumerate(subkeys)},
                    "kept file": file_key("kept"), "closed file": file_key("closed")}
            subprocess.run([coffer, "lock", m], check=True, stdout=subprocess.DEVNULL)
            pid = json.loads(subprocess.run([coffer, "status", "--json", m], capture_output=True, check=True).stdout)["pid"]
            def scan():
                found = {name: 0 for name in keys}
                with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
                    for line in maps:
                        fields = line.split()
                        if "r" not in fields[1] or line.rstrip().endswith(("[vvar]", "[vsyscall]")): continue
                        lo, hi = (int(x, 16) for x in fields[0].split("-"))
                        try:
                            mem.seek(lo); region = mem.read(hi - lo)
                        except OSError:
                            continue
                        for name, key in keys.items(): found[name] += region.count(key)
                return found
            kept.seek(0); assert kept.read(5) == b"kkkkk"
            print("while open", json.dumps(scan(), sort_keys=True))
            kept.close(); time.sleep(0.5)
            print("after close", json.dumps(scan(), sort_keys=True))
            """
        let r = Harness.run(["python3", "-c", script, Harness.coffer, vault.mountpoint, vault.cipherdir, recovery, vectors], timeout: 120)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr)
        func counts(_ prefix: String) -> [String: Int] {
            guard let line = r.stdout.split(separator: "\n").first(where: { $0.hasPrefix(prefix) }),
                  let data = line.dropFirst(prefix.count).data(using: .utf8),
                  let object = try? JSONSerialization.jsonObject(with: data) as? [String: Int] else { return [:] }
            return object
        }
        let open = counts("while open "), closed = counts("after close ")
        XCTAssertGreaterThan(open["kept file"] ?? 0, 0, "the open unless-open file's key is not kept: \(r.stdout)")
        XCTAssertEqual(closed["kept file"], 0, "the file's key outlived its close: \(r.stdout)")
        for name in ["master"] + (1...7).map({ "subkey \($0)" }) + ["closed file"] {
            XCTAssertEqual(open[name], 0, "\(name) in the daemon's memory after the lock: \(r.stdout)")
            XCTAssertEqual(closed[name], 0, "\(name) in the daemon's memory after the lock: \(r.stdout)")
        }
    }
}

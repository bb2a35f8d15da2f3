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
        let dirs = Harness.sh("cd '\(vault.cipherdir)' && find . -mindepth 1 -maxdepth 1 -type d ! -name '.*' -printf '%f\\n'").stdout.split(separator: "\n").map(String.init)
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
        XCTAssertTrue(fsck.stdout.contains("damaged: /b: protection class"), fsck.stdout)
        // A conflict copy beside the class file: the mount still reads the class; the
        // owner's next setting removes the copy.
        assertOK(Harness.sh("""
            cd '\(vault.cipherdir)' && rm './\(other)/coffer.class'
            cp './\(withClass)/coffer.class' './\(withClass)/coffer.sync-conflict-20261126-120000-ABCDEFG.class'
            """), "copy")
        vault.mount()
        let s = vault.sh("""
            '\(Harness.coffer)' protect a
            '\(Harness.coffer)' protect --class unless-open a > /dev/null
            ls '\(vault.cipherdir)/\(withClass)' | grep -c sync-conflict || true
            """)
        XCTAssertEqual(s.stdout, "a: unless-open\n0\n", s.stderr)
        vault.unmount()
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
    /// what keeps it usable), and is gone once the file is closed. In an AES-256-GCM
    /// vault the same holds for each file key's AES key schedule (its first 64 bytes),
    /// under both engines: the expanded key an open file keeps goes with its close and
    /// the lock.
    func testAfterALockOnlyTheKeysOfOpenUnlessOpenFilesAreInMemory() throws {
        if let sanitizer = Harness.sanitizer { throw XCTSkip("a memory scan reads no \(sanitizer) sanitizer's address space") }
        let engines = ContentAlgorithmProbe.aesAvailable ? ["ipsec-mb", "libsodium"] : ["libsodium"]
        for engine in engines { scanAfterALock(engine: engine) }
    }

    func scanAfterALock(engine: String) {
        let recovery = scratch.path + "/recovery-" + engine
        let vault = MountedVault(scratch: scratch, name: "vault-" + engine, initOptions: ["--recovery-key-out", recovery])
        vault.environment["COFFER_AES_ENGINE"] = engine
        vault.mount()
        if engine == "ipsec-mb", vault.log.contains("libsodium instead") {
            // Where ipsec-mb is not installed, libsodium's run covers the scan.
            return vault.unmount()
        }
        let vectors = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("vectors").path
        let script = Harness.memoryScan + """
            import hashlib, json, os, subprocess, sys, time
            coffer, m, c, recovery, vectors = sys.argv[1:6]
            # The AES-256 key expansion (FIPS-197 §5.2): 240 bytes, the key itself first.
            def aes256_round_keys(key):
                rotl = lambda x, s: ((x << s) | (x >> (8 - s))) & 0xff
                sbox, p, q = [0x63] * 256, 1, 1
                while True:
                    p = p ^ ((p << 1) & 0xff) ^ (0x1b if p & 0x80 else 0)
                    q ^= q << 1; q ^= q << 2; q ^= q << 4; q &= 0xff
                    if q & 0x80: q ^= 0x09
                    sbox[p] = q ^ rotl(q, 1) ^ rotl(q, 2) ^ rotl(q, 3) ^ rotl(q, 4) ^ 0x63
                    if p == 1: break
                words, rcon = [list(key[i:i + 4]) for i in range(0, 32, 4)], 1
                for i in range(8, 60):
                    t = list(words[-1])
                    if i % 8 == 0:
                        t = [sbox[b] for b in t[1:] + t[:1]]; t[0] ^= rcon
                        rcon = ((rcon << 1) ^ (0x1b if rcon & 0x80 else 0)) & 0xff
                    elif i % 8 == 4:
                        t = [sbox[b] for b in t]
                    words.append([a ^ b for a, b in zip(words[i - 8], t)])
                return bytes(b for w in words for b in w)
            # FIPS-197 appendix A.3: the expansion is right.
            assert aes256_round_keys(bytes.fromhex("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4"))[-16:] == bytes.fromhex("fe4890d1e6188d0b046df344706c631e")
            sys.path.insert(0, vectors)
            import check_format as f
            conf = json.load(open(os.path.join(c, "coffer.conf")))
            k = conf["kdf"]
            canonical = f.canonical_parameters(conf["format"], conf["created"], conf["contentCipher"], conf["blockSize"],
                                               k["algorithm"], k["opsLimit"], k["memLimit"], f.b64url_decode(k["salt"]))
            slot = next(s for s in conf["slots"] if s["kind"] == "recovery")
            master = f.unwrap_key_slot(f.kek_rec(f.parse_recovery_key(open(recovery).read())), slot["wrappedKey"], canonical, "recovery")
            assert master is not None
            subkeys = [f.subkey(master, i) for i in range(1, 9)]
            os.makedirs(os.path.join(m, "bg"))
            subprocess.run([coffer, "protect", "--class", "unless-open", os.path.join(m, "bg")], check=True, stdout=subprocess.DEVNULL)
            kept = open(os.path.join(m, "bg", "kept"), "w+b"); kept.write(b"k" * 10000); kept.flush()
            with open(os.path.join(m, "bg", "closed"), "wb") as g: g.write(b"c" * 10000)
            # A file of a complete directory, open through the lock: its key goes at the lock.
            held = open(os.path.join(m, "held"), "w+b"); held.write(b"h" * 10000); held.flush(); os.fsync(held.fileno())
            # A file made while locked (its key of its own, in its key record), converted at
            # the unlock, moved into a complete directory and read: open through the next
            # lock, its key goes at the lock too.
            subprocess.run([coffer, "lock", m], check=True, stdout=subprocess.DEVNULL)
            with open(os.path.join(m, "bg", "dropped"), "wb") as g: g.write(b"d" * 10000)
            subprocess.run([coffer, "unlock", "--recovery-key-file", recovery, m], check=True, stdout=subprocess.DEVNULL)
            os.rename(os.path.join(m, "bg", "dropped"), os.path.join(m, "held-drop"))
            held_drop = open(os.path.join(m, "held-drop"), "rb"); assert held_drop.read(5) == b"ddddd"
            def file_key(name):
                ino = os.stat(os.path.join(m, name if name == "held" else os.path.join("bg", name))).st_ino
                for root, _, files in os.walk(c):
                    for n in files:
                        p = os.path.join(root, n)
                        if os.stat(p).st_ino == ino:
                            file_id = open(p, "rb").read(18)[2:18]
                            personal = b"coffer-aes-file1" if conf["contentCipher"] == "aes256gcm" else b"coffer-xch-file1"
                            return hashlib.blake2b(b"", digest_size=32, key=subkeys[0], salt=file_id, person=personal).digest()
            def drop_key(name):
                # Its placed key record (docs/FORMAT.md §12, format 7): nonce ‖ AEAD(K_metadata, 02 ‖ file ID ‖ K_file).
                ino = os.stat(os.path.join(m, name)).st_ino
                p = next(os.path.join(c, n) for n in os.listdir(c) if os.stat(os.path.join(c, n)).st_ino == ino)
                file_id = open(p, "rb").read(18)[2:18]
                record = open(os.path.join(c, "coffer.drops", f.b64url(file_id)), "rb").read()
                plain = f.aead_open(subkeys[3], record[:24], record[24:], b"coffer.drop.placed\\0" + file_id)
                assert plain is not None and plain[:17] == b"\\x02" + file_id, "the held drop's record opens"
                return plain[17:49]
            keys = {"master": master, **{"subkey %d" % (i + 1): s for i, s in enumerate(subkeys)},
                    "kept file": file_key("kept"), "closed file": file_key("closed"), "held file": file_key("held"),
                    "held drop": drop_key("held-drop")}
            if conf["contentCipher"] == "aes256gcm":
                for name in ("kept file", "closed file", "held file", "held drop"):
                    keys[name + " schedule"] = aes256_round_keys(keys[name])[:64]
            subprocess.run([coffer, "lock", m], check=True, stdout=subprocess.DEVNULL)
            pid = json.loads(subprocess.run([coffer, "status", "--json", m], capture_output=True, check=True).stdout)["pid"]
            kept.seek(0); assert kept.read(5) == b"kkkkk"
            # A write through to the daemon: the kept key is used (and, for AES, expanded) after the lock.
            kept.seek(0, 2); kept.write(b"k"); kept.flush(); os.fsync(kept.fileno())
            print("while open", json.dumps(scan(pid, keys), sort_keys=True))
            kept.close()
            deadline = time.time() + 10                  # until the kernel's RELEASE reached the daemon
            kept_open = lambda: json.loads(subprocess.run([coffer, "status", "--json", m], capture_output=True, check=True).stdout)["filesKeptOpen"]
            while kept_open() and time.time() < deadline: time.sleep(0.1)
            print("after close", json.dumps(scan(pid, keys), sort_keys=True))
            """
        let r = Harness.run(["python3", "-c", script, Harness.coffer, vault.mountpoint, vault.cipherdir, recovery, vectors], timeout: 120)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr)
        func counts(_ prefix: String) -> [String: Int] { Harness.scanCounts(r.stdout, prefix) }
        let open = counts("while open "), closed = counts("after close ")
        XCTAssertGreaterThan(open["kept file"] ?? 0, 0, "\(engine): the open unless-open file's key is not kept: \(r.stdout)")
        XCTAssertEqual(closed["kept file"], 0, "\(engine): the file's key outlived its close: \(r.stdout)")
        var gone = ["master"] + (1...8).map({ "subkey \($0)" }) + ["closed file", "held file", "held drop"]
        if ContentAlgorithmProbe.aesAvailable {
            // The search finds a schedule where one must be: the kept file's, while open.
            XCTAssertGreaterThan(open["kept file schedule"] ?? 0, 0, "\(engine): no expanded key of the open file found: \(r.stdout)")
            XCTAssertEqual(closed["kept file schedule"], 0, "\(engine): the file's expanded key outlived its close: \(r.stdout)")
            gone += ["closed file schedule", "held file schedule", "held drop schedule"]
        }
        for name in gone {
            XCTAssertEqual(open[name], 0, "\(engine): \(name) in the daemon's memory after the lock: \(r.stdout)")
            XCTAssertEqual(closed[name], 0, "\(engine): \(name) in the daemon's memory after the lock: \(r.stdout)")
        }
        vault.unmount()
    }

    // MARK: New files while locked (drops)

    /// A maildir fetcher delivers one message every 100 ms (write in tmp/, fsync, rename
    /// into new/) across a lock of 3 s and the unlock: every message it was told was
    /// delivered is in new/ afterwards with its content, none is left in tmp/; a writer
    /// beside it in a complete directory is refused while locked (a delivery made just
    /// before the lock is renamed into new/ after it). While locked, a listing of new/
    /// shows only what came since the lock.
    func testAMaildirDeliveryGoesOnThroughALock() {
        let vault = mountedVault()
        let script = """
            import json, os, subprocess, sys, threading, time
            coffer, m, passfile = sys.argv[1:4]
            md = os.path.join(m, "Mail")
            for d in ("tmp", "new", "cur"): os.makedirs(os.path.join(md, d))
            os.makedirs(os.path.join(m, "docs"))
            subprocess.run([coffer, "protect", "-R", "--class", "unless-open", md], check=True, stdout=subprocess.DEVNULL)
            with open(os.path.join(md, "new", "before"), "w") as f: f.write("an older message")
            delivered, errors, docs = {}, [], []
            stop, locked, hold, held = threading.Event(), threading.Event(), threading.Event(), threading.Event()
            def deliver():
                n = 0
                while not stop.is_set():
                    if hold.is_set():                    # while the listing is compared
                        held.set(); time.sleep(0.05); continue
                    n += 1
                    name = "%d.M%dP%d.host" % (int(time.time()), n, os.getpid())
                    body = ("message %d " % n) * 50
                    try:
                        fd = os.open(os.path.join(md, "tmp", name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                        os.write(fd, body.encode()); os.fsync(fd); os.close(fd)
                        os.rename(os.path.join(md, "tmp", name), os.path.join(md, "new", name))
                        delivered[name] = (body, locked.is_set())
                    except OSError as e:
                        errors.append("%s: %r" % (name, e))
                    time.sleep(0.1)
            def document():
                while not stop.is_set():
                    try:
                        with open(os.path.join(m, "docs", "note%d" % len(docs)), "w") as f: f.write("x")
                        docs.append((locked.is_set(), "ok"))
                    except OSError as e:
                        docs.append((locked.is_set(), e.errno))
                    time.sleep(0.1)
            threads = [threading.Thread(target=deliver), threading.Thread(target=document)]
            for t in threads: t.start()
            time.sleep(1)
            subprocess.run([coffer, "lock", m], check=True, stdout=subprocess.DEVNULL)
            locked.set()
            time.sleep(3)
            deadline = time.time() + 57                  # on a slow machine, until 20 were delivered while locked
            while sum(l for _, l in list(delivered.values())) < 20 and time.time() < deadline: time.sleep(0.1)
            # The delivery holds still (its last one recorded) while the listing is compared.
            hold.set(); held.wait(30)
            listed = sorted(os.listdir(os.path.join(md, "new")))
            while_locked = sorted(n for n, (_, l) in delivered.items() if l)
            # A delivery that straddled the lock (made before, renamed after) is new there too.
            print("listing while locked shows only the new", set(while_locked) <= set(listed) and "before" not in listed
                  and set(listed) <= set(delivered) and len(listed) > 0)
            hold.clear()
            locked.clear()
            subprocess.run([coffer, "unlock", "--passfile", passfile, m], check=True, stdout=subprocess.DEVNULL)
            time.sleep(1); stop.set()
            for t in threads: t.join()
            print("errors", errors)
            print("delivered while locked", len(while_locked) >= 20)
            found = sorted(os.listdir(os.path.join(md, "new")))
            print("all there", found == sorted(list(delivered) + ["before"]))
            print("contents", all(open(os.path.join(md, "new", n)).read() == b for n, (b, _) in delivered.items()))
            print("tmp empty", os.listdir(os.path.join(md, "tmp")) == [])
            print("complete refused while locked", {r for l, r in docs if l} == {13})
            """
        let r = Harness.run(["python3", "-c", script, Harness.coffer, vault.mountpoint, vault.passfile], timeout: 120)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr)
        for line in ["listing while locked shows only the new True", "errors []", "delivered while locked True", "all there True",
                     "contents True", "tmp empty True", "complete refused while locked True"] {
            XCTAssertTrue(r.stdout.contains(line + "\n"), "\(line): \(r.stdout)")
        }
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout)
        XCTAssertFalse(fsck.stdout.contains("dropped:"), fsck.stdout)
    }

    /// While locked: sqlite makes a database (its rollback journal made and removed with
    /// each transaction) and reads it back, and one in WAL mode (its -wal and mmapped
    /// -shm files made while locked), rsync -a copies a tree, cp a file, and files from
    /// before the lock are renamed and removed — into an
    /// unless-open directory. After the unlock all of it reads as it was written, and
    /// fsck finds no damage.
    func testSqliteRsyncAndCpMakeNewFilesWhileLocked() {
        let vault = mountedVault()
        let source = scratch.mkdir("tree")
        assertOK(Harness.sh("""
            cd '\(source)' && mkdir -p a/b/c d && head -c 300000 /dev/urandom > a/big && echo one > a/b/one
            echo two > a/b/c/two && : > d/empty && chmod 640 a/b/one && touch -d 2020-01-02 a/b/c/two
            """), "source tree")
        let r = vault.sh("""
            C='\(Harness.coffer)'
            mkdir bg && "$C" protect --class unless-open bg > /dev/null
            echo early > bg/early && echo gone > bg/gone && ls -l bg > /dev/null
            "$C" lock "$M" > /dev/null
            mv bg/early bg/renamed && rm bg/gone                  # files from before the lock
            sqlite3 bg/new.db <<'SQL'
            create table t (n integer primary key, v text);
            insert into t (v) values ('a'), ('b');
            insert into t (v) select v || 'x' from t;
            SQL
            sqlite3 bg/new.db 'select count(*) from t;'
            python3 -c 'import sqlite3; db = sqlite3.connect("bg/wal.db", isolation_level=None); print(db.execute("pragma journal_mode=wal").fetchone()[0]); db.execute("create table w (n)"); [db.execute("insert into w values (?)", (i,)) for i in range(100)]; print(db.execute("select sum(n) from w").fetchone()[0])'
            rsync -a '\(source)/' bg/tree/
            cp '\(source)/a/big' bg/big.copy
            # Files only: rsync leaves the times of the directories it has just made as they
            # come (on tmpfs too, with a source made a moment before).
            (cd '\(source)' && find . -type f -printf '%P %m %T@\n' | sort) > "$S/source.attrs"
            (cd bg/tree && find . -type f -printf '%P %m %T@\n' | sort) | diff "$S/source.attrs" - && echo modes and times same while locked
            ls bg | tr '\n' ' '; echo
            ls "$M" > /dev/null 2>&1 || echo "the root refused"
            "$C" unlock --passfile '\(vault.passfile)' "$M" > /dev/null
            sqlite3 bg/new.db 'pragma integrity_check; select group_concat(v) from t;'
            sqlite3 bg/wal.db 'pragma integrity_check; select sum(n) from w;'
            cat bg/renamed; ls bg/gone 2>/dev/null || echo gone is gone
            diff -r '\(source)' bg/tree && echo tree same
            cmp '\(source)/a/big' bg/big.copy && echo copy same
            (cd bg/tree && find . -type f -printf '%P %m %T@\n' | sort) | diff "$S/source.attrs" - && echo modes and times same
            """.replacingOccurrences(of: "$S", with: scratch.path))
        XCTAssertEqual(r.stdout.split(separator: "\n").map(String.init),
                       ["4", "wal", "4950", "modes and times same while locked", "big.copy new.db renamed tree wal.db ", "the root refused", "ok", "a,b,ax,bx", "ok", "4950", "early", "gone is gone", "tree same", "copy same", "modes and times same"],
                       r.stdout + r.stderr)
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout)
    }

    /// While locked, what needs no key works in an unless-open directory: the modes,
    /// owners and times of the directory itself and of its files from before the lock
    /// that the kernel knew, so `rsync -a` of a tree into the directory (which sets the
    /// directory's own mode and times last) exits 0. A size change of such a file, which
    /// needs its key, and anything in a complete directory stay refused.
    func testModesOwnersAndTimesChangeWhileLockedWithoutAKey() {
        let vault = mountedVault()
        let source = scratch.mkdir("tree")
        assertOK(Harness.sh("""
            cd '\(source)' && mkdir -p a/b && echo one > a/one && echo two > a/b/two && chmod 640 a/one
            touch -d 2020-01-02 a/b/two a/b && chmod 751 . && touch -d 2019-05-06 .
            """), "source tree")
        let r = vault.sh("""
            C='\(Harness.coffer)'
            mkdir bg plain && "$C" protect --class unless-open bg > /dev/null
            echo early > bg/early && echo kept > plain/kept && ls -l bg plain > /dev/null
            "$C" lock "$M" > /dev/null
            chmod 600 bg/early && chown 1234:5678 bg/early && touch -d 2021-03-04 bg/early && echo "file changed"
            truncate -s 0 bg/early 2>/dev/null || echo "size refused"
            chmod 600 plain/kept 2>/dev/null || echo "complete refused"
            rsync -a '\(source)/' bg/; echo "rsync $?"
            stat -c '%n %a %u:%g %Y' bg/early
            "$C" unlock --passfile '\(vault.passfile)' "$M" > /dev/null
            cat bg/early; stat -c '%n %a %u:%g %Y' bg/early
            [ "$(stat -c '%a %Y' bg)" = "$(stat -c '%a %Y' '\(source)')" ] && echo "directory's mode and time as the source's"
            rm bg/early && diff -r '\(source)' bg && echo tree same
            # Files only below the top: rsync leaves the times of directories it has just
            # made as they come (ProtectionClassTests.testSqliteRsyncAndCpMakeNewFilesWhileLocked).
            (cd '\(source)' && find . -type f -printf '%P %m %T@\n' | sort) > "$S/source.attrs"
            (cd bg && find . -type f -printf '%P %m %T@\n' | sort) | diff "$S/source.attrs" - && echo modes and times same
            """.replacingOccurrences(of: "$S", with: scratch.path))
        XCTAssertEqual(r.stdout.split(separator: "\n").map(String.init),
                       ["file changed", "size refused", "complete refused", "rsync 0", "bg/early 600 1234:5678 1614816000",
                        "early", "bg/early 600 1234:5678 1614816000", "directory's mode and time as the source's", "tree same",
                        "modes and times same"],
                       r.stdout + r.stderr)
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout)
    }

    /// Format 8 makes symlinks while locked too (sealed to the drop key as a drop's name
    /// is): `rsync -a` of a tree with symlinks (one to a long target), modes and times
    /// into an unless-open directory during a lock exits 0, and after the unlock the tree
    /// is identical, the symlinks' times too. A second lock's symlink, left by a daemon
    /// killed while locked, is reported by fsck and converted by the next mount. In a
    /// format-7 vault the same rsync fails (symlinks need the keys there).
    func testRsyncOfATreeWithSymlinksGoesThroughALock() {
        let source = scratch.mkdir("tree")
        assertOK(Harness.sh("""
            cd '\(source)' && mkdir -p a/b && echo one > a/one && ln -s one a/link && ln -s ../a a/b/up && chmod 640 a/one
            ln -s "$(printf 'p%.0s' $(seq 2000))" a/far && touch -h -d 2020-01-02 a/link a/b/up a/far && touch -d 2019-05-06 a/one
            """), "source tree")
        // Not the directories' times: rsync leaves those of directories it has just made
        // as they come (testSqliteRsyncAndCpMakeNewFilesWhileLocked).
        let attrs = "find . -mindepth 1 ! -type d -printf '%P %y %m %s %T@ %l\\n' | sort"
        let vault = MountedVault(scratch: scratch, name: "eight", initOptions: ["--format", "8"])
        vault.mount()
        let r = vault.sh("""
            C='\(Harness.coffer)'
            mkdir bg && "$C" protect --class unless-open bg > /dev/null && ls bg > /dev/null
            "$C" lock "$M" > /dev/null
            rsync -a '\(source)/' bg/; echo "rsync $?"
            readlink bg/a/link
            "$C" unlock --passfile '\(vault.passfile)' "$M" > /dev/null
            diff -r --no-dereference '\(source)' bg && echo tree same
            diff <(cd '\(source)' && \(attrs)) <(cd bg && \(attrs)) && echo modes, sizes and times same
            "$C" lock "$M" > /dev/null
            ln -s 'made while locked' bg/late && python3 -c 'import os; os.sync()'
            """)
        XCTAssertEqual(r.stdout, "rsync 0\none\ntree same\nmodes, sizes and times same\n", r.stderr + vault.log)
        vault.killDaemon()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
        XCTAssertTrue(fsck.stdout.contains("dropped: /bg/late: made while locked"), fsck.stdout)
        vault.mount()
        XCTAssertEqual(vault.sh("readlink bg/late bg/a/link").stdout, "made while locked\none\n", vault.log)
        vault.unmount()
        let clean = vault.fsck()
        XCTAssertEqual(clean.status, 0, clean.stdout + clean.stderr)

        let seven = MountedVault(scratch: scratch, name: "seven", initOptions: ["--format", "7"])
        seven.mount()
        let old = seven.sh("""
            mkdir bg && '\(Harness.coffer)' protect --class unless-open bg > /dev/null && ls bg > /dev/null
            '\(Harness.coffer)' lock "$M" > /dev/null
            rsync -a '\(source)/' bg/ 2> /dev/null || echo "rsync $?"
            """)
        XCTAssertEqual(old.stdout, "rsync 23\n", old.stderr)
        seven.unmount()
    }

    /// The daemon is killed while locked, after files were made and fsynced: fsck reports
    /// them as made while locked (no damage), and the next mount serves each under its
    /// name, found by path without a listing first. A copy of the vault (another
    /// machine's) converts them to the same backing names and bytes.
    func testFilesMadeWhileLockedOutliveTheDaemonAndConvertTheSameEverywhere() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            mkdir -p bg/sub && '\(Harness.coffer)' protect -R --class unless-open bg > /dev/null && ls bg/sub > /dev/null
            '\(Harness.coffer)' lock "$M" > /dev/null
            python3 -c 'import os; fd = os.open("bg/made", os.O_CREAT | os.O_WRONLY, 0o644); os.write(fd, b"made while locked\\n"); os.fsync(fd)'
            mkdir bg/sub/dir && echo deeper > bg/sub/dir/file && sync
            """), "make while locked")
        vault.killDaemon()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
        XCTAssertTrue(fsck.stdout.contains("dropped: /bg/made: made while locked"), fsck.stdout)
        XCTAssertTrue(fsck.stdout.contains("dropped: /bg/sub/dir: made while locked"), fsck.stdout)
        let other = scratch.path + "/other.cipher"
        assertOK(Harness.sh("cp -a '\(vault.cipherdir)' '\(other)'"), "copy to the other machine")
        vault.mount()
        let r = vault.sh("cat bg/made bg/sub/dir/file")
        XCTAssertEqual(r.stdout, "made while locked\ndeeper\n", r.stderr)
        vault.unmount()
        let mountOther = Harness.run([Harness.coffer, "mount", "--passfile", vault.passfile, other, scratch.mkdir("other.plain")])
        XCTAssertEqual(mountOther.status, 0, mountOther.stderr)
        let o = Harness.sh("cd '\(scratch.path)/other.plain' && cat bg/made bg/sub/dir/file; cd / && '\(Harness.coffer)' unmount '\(scratch.path)/other.plain'")
        XCTAssertEqual(o.stdout, "made while locked\ndeeper\n", o.stderr)
        let same = Harness.sh("cd '\(vault.cipherdir)' && find . -path ./coffer.conf -prune -o -type f -print | sort | while read -r f; do cmp \"$f\" '\(other)'/\"$f\" || echo \"DIFFERS $f\"; done; diff <(cd '\(vault.cipherdir)' && find . | sort) <(cd '\(other)' && find . | sort) && echo same tree")
        XCTAssertTrue(same.stdout.contains("same tree"), same.stdout + same.stderr)
        XCTAssertFalse(same.stdout.contains("DIFFERS"), same.stdout)
    }

    /// The unlock's conversion of entries made while locked, killed at each kind of step
    /// it takes (strace kills the daemon as the thread running it makes its Nth call of
    /// one kind: a header write, a fsync, an open, a rename, a symlink, an unlink), in a
    /// format-8 vault (symlinks too): fsck finds no damage, and the next mount lists
    /// every entry once — files, a long name, a renamed file, directories with files, a
    /// symlink — with its content, and fsck is clean. Among the points: the 2nd unlink,
    /// after a symlink's converted twin was made and before its drop went (the listing
    /// showed that symlink twice).
    func testAnUnlockKilledWhileConvertingLosesAndDoublesNothing() {
        let vault = MountedVault(scratch: scratch, name: "drops", initOptions: ["--format", "8"])
        vault.mount()
        assertOK(vault.sh("mkdir bg && '\(Harness.coffer)' protect --class unless-open bg > /dev/null && echo old > bg/old"), "bg")
        vault.unmount()
        let original = scratch.path + "/drops-original"
        assertOK(Harness.sh("cp -a '\(vault.cipherdir)' '\(original)'"), "copy")
        let look = "cd bg && find . -printf '%p %y %s %l\\n' | sort && cat old d1 d2 d5 dd/x dd/e/y N*"
        var expected: String?
        for point in [("none", 0), ("pwrite64", 1), ("pwrite64", 4), ("fsync", 2), ("fsync", 7), ("openat", 2), ("renameat2", 1),
                      ("renameat2", 4), ("symlinkat", 1), ("unlinkat", 1), ("unlinkat", 2)] {
            assertOK(Harness.sh("rm -rf '\(vault.cipherdir)' '\(vault.stateDir)' && cp -a '\(original)' '\(vault.cipherdir)'"), "restore")
            vault.mount()
            assertOK(vault.sh("""
                ls bg > /dev/null && '\(Harness.coffer)' lock "$M" > /dev/null && cd bg
                for i in 1 2 4; do echo "d$i" > d$i; done && mv d4 d5 && mkdir -p dd/e && echo in > dd/x && echo deeper > dd/e/y
                echo long > "$(printf 'N%.0s' $(seq 100))" && ln -s d1 sl && sync
                """), "made while locked")
            let unlock = "'\(Harness.coffer)' unlock --passfile '\(vault.passfile)' \"$M\""
            guard point.0 != "none" else {
                assertOK(vault.sh(unlock + " > /dev/null"), "unlock")
                expected = vault.sh(look).stdout
                XCTAssertEqual(expected?.components(separatedBy: "./sl l").count, 2, expected ?? "")
                vault.unmount()
                continue
            }
            XCTAssertTrue(vault.killed(at: point, during: unlock), "not killed at \(point)")
            let cut = vault.fsck()
            XCTAssertEqual(cut.status, 0, "\(point): " + cut.stdout + cut.stderr)
            vault.mount()
            XCTAssertEqual(vault.sh(look).stdout, expected, "killed at \(point): \(vault.log)")
            vault.unmount()
            let fsck = vault.fsck()
            XCTAssertEqual(fsck.status, 0, "\(point): " + fsck.stdout + fsck.stderr)
        }
    }

    /// Nobody without the vault's keys makes a drop (its public key is never stored): a
    /// planted `coffer.drop.*` entry is damage — not shown, logged — and fsck says so.
    func testAPlantedDropIsDamageNotAFile() {
        let vault = mountedVault()
        assertOK(vault.sh("mkdir bg && echo real > bg/real"), "setup")
        let dir = Harness.sh("cd '\(vault.cipherdir)' && find . -mindepth 1 -maxdepth 1 -type d ! -name '.*' -printf '%f\\n'").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let planted = "coffer.drop." + String(repeating: "A", count: 86)
        assertOK(Harness.sh("echo planted > '\(vault.cipherdir)/\(dir)/\(planted)'"), "plant")
        let r = vault.sh("ls bg; cat bg/real")
        XCTAssertEqual(r.stdout, "real\nreal\n", r.stderr)
        XCTAssertTrue(vault.log.contains("damage: in /bg: an entry made while locked"), vault.log)
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 40, fsck.stdout)
        XCTAssertTrue(fsck.stdout.contains("damaged: /bg/<\(planted)>"), fsck.stdout)
    }

    /// The backing directory that `mkdir PATH` (a directory of the mount's root) makes.
    func backingDirectory(made path: String, in vault: MountedVault) -> String {
        let list = "cd '\(vault.cipherdir)' && find . -mindepth 1 -maxdepth 1 -type d ! -name '.*' -printf '%f\\n' | sort"
        let before = Set(Harness.sh(list).stdout.split(separator: "\n"))
        assertOK(vault.sh("mkdir '\(path)'"), "mkdir \(path)")
        let made = Set(Harness.sh(list).stdout.split(separator: "\n")).subtracting(before)
        XCTAssertEqual(made.count, 1, "mkdir \(path) made \(made)")
        return made.first.map(String.init) ?? "?"
    }

    /// Someone who can write CIPHERDIR and saw a drop's backing name once copies another
    /// file's backing file — or the converted drop itself — under that name into another
    /// directory: neither becomes a file there (the content of secret/pw.txt is never
    /// served as public/x), each is logged as refused, and fsck reports it as damage. In a
    /// format-6 vault by FoundDrop's rule for unbound drops, in format 7 by the binding.
    func testADropsNameNeverRelocatesAnotherFilesContent() {
        for format in ["6", "7"] {
            let vault = MountedVault(scratch: scratch, name: "f" + format, initOptions: ["--format", format])
            vault.mount()
            let secret = backingDirectory(made: "secret", in: vault)
            let bg = backingDirectory(made: "bg", in: vault)
            let publicDir = backingDirectory(made: "public", in: vault)
            let publicTwo = backingDirectory(made: "public2", in: vault)
            assertOK(vault.sh("echo 'the secret password' > secret/pw.txt && '\(Harness.coffer)' protect --class unless-open bg > /dev/null && ls bg"), "setup")
            assertOK(vault.sh("'\(Harness.coffer)' lock \"$M\" > /dev/null && echo 'made while locked' > bg/x"), "a drop")
            let drop = Harness.sh("cd '\(vault.cipherdir)/\(bg)' && ls | grep '^coffer[.]drop[.]'").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            XCTAssertTrue(drop.hasPrefix("coffer.drop."), drop)
            assertOK(Harness.run([Harness.coffer, "unlock", "--passfile", vault.passfile, vault.mountpoint]), "unlock")
            XCTAssertEqual(vault.sh("cat bg/x").stdout, "made while locked\n")
            let pw = Harness.sh("cd '\(vault.cipherdir)/\(secret)' && find . -maxdepth 1 -type f ! -name 'coffer.*' ! -name '.*' -printf '%f\\n'").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            let converted = Harness.sh("cd '\(vault.cipherdir)/\(bg)' && find . -maxdepth 1 -type f ! -name 'coffer.*' ! -name '.*' -printf '%f\\n'").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            assertOK(Harness.sh("""
                cp '\(vault.cipherdir)/\(secret)/\(pw)' '\(vault.cipherdir)/\(publicDir)/\(drop)'
                cp '\(vault.cipherdir)/\(bg)/\(converted)' '\(vault.cipherdir)/\(publicTwo)/\(drop)'
                """), "copy under the drop's name")
            let r = vault.sh("cat public/x || true; cat public2/x || true; ls public public2")
            XCTAssertFalse(r.stdout.contains("secret password"), "format \(format): another file's content served under a drop's name: \(r.stdout)")
            XCTAssertFalse(r.stdout.contains("made while locked"), "format \(format): a converted drop served again elsewhere: \(r.stdout)")
            let reasons = format == "6" ? ["not a file made while locked", "placed under another name already"]
                : ["in /public: an entry made while locked", "in /public2: an entry made while locked", "made for another directory or another file"]
            for reason in reasons { XCTAssertTrue(vault.log.contains(reason), "format \(format): \(reason): \(vault.log)") }
            XCTAssertEqual(vault.sh("cat secret/pw.txt bg/x").stdout, "the secret password\nmade while locked\n")
            vault.unmount()
            let fsck = vault.fsck()
            XCTAssertEqual(fsck.status, 40, fsck.stdout)
            XCTAssertTrue(fsck.stdout.contains("damaged: /public/x") && fsck.stdout.contains("damaged: /public2/x"), fsck.stdout)
        }
    }

    /// Format 7: a drop is converted once, where it was made. One moved to another
    /// directory while locked is refused there; a copy of one planted again after its
    /// conversion is refused (its key record is marked placed); and a file from before the
    /// lock that was renamed while locked by a daemon that then died is converted by the
    /// next mount, as its binding says.
    func testADropConvertsOnceWhereItWasMade() {
        let vault = mountedVault()
        let bg = backingDirectory(made: "bg", in: vault)
        let other = backingDirectory(made: "other", in: vault)
        assertOK(vault.sh("""
            '\(Harness.coffer)' protect --class unless-open bg > /dev/null && echo 'from before' > bg/old && ls bg
            '\(Harness.coffer)' lock "$M" > /dev/null
            echo 'moved by an attacker' > bg/moved; echo 'kept' > bg/kept
            """), "drops")
        let c = "'\(vault.cipherdir)'"
        let drops = Harness.sh("cd \(c)/\(bg) && ls | grep '^coffer[.]drop[.]'").stdout.split(separator: "\n").map(String.init)
        XCTAssertEqual(drops.count, 2)
        // Which is which is sealed; the attacker moves one and keeps a copy of both.
        assertOK(Harness.sh("cp -a \(c)/\(bg) \(c)/../then-bg && mv \(c)/\(bg)/\(drops[0]) \(c)/\(other)/"), "move one")
        assertOK(Harness.run([Harness.coffer, "unlock", "--passfile", vault.passfile, vault.mountpoint]), "unlock")
        let listed = vault.sh("ls other; ls bg").stdout
        XCTAssertEqual(listed.split(separator: "\n").filter { $0 == "moved" || $0 == "kept" }.count, 1, "one drop is gone (moved), the other converted where it was made: \(listed)")
        XCTAssertFalse(vault.sh("ls other").stdout.contains("moved") || vault.sh("ls other").stdout.contains("kept"), "a drop converted in another directory")
        XCTAssertTrue(vault.log.contains("damage: in /other: an entry made while locked"), vault.log)
        // Planted again after its conversion (its record now marked placed): refused.
        let kept = vault.sh("cat bg/kept 2>/dev/null || cat bg/moved").stdout
        assertOK(Harness.sh("cp \(c)/../then-bg/\(drops[1]) \(c)/\(bg)/"), "plant again")
        let again = vault.sh("ls bg").stdout
        XCTAssertFalse(again.contains("dropped"), "a drop planted again became a file: \(again)")
        XCTAssertTrue(vault.log.contains("converted already"), vault.log)
        XCTAssertFalse(kept.isEmpty)
        vault.unmount()

        // A file from before the lock renamed while locked; the daemon dies before the unlock.
        vault.mount()
        assertOK(vault.sh("ls bg > /dev/null && cat bg/old > /dev/null && '\(Harness.coffer)' lock \"$M\" > /dev/null && mv bg/old bg/renamed"), "rename while locked")
        vault.killDaemon()
        vault.mount()
        XCTAssertEqual(vault.sh("cat bg/renamed").stdout, "from before\n", vault.log)
        vault.unmount()
    }

    /// A program opens its database, made before the lock and not looked up since (a new
    /// daemon), with O_CREAT while locked: EACCES, never a second empty file under the same
    /// name that the unlock would show as "app.db (dropped …)". The name's lookup says
    /// EACCES (not ENOENT), so O_EXCL, mkdir and a rename onto it are refused too; new
    /// names work.
    func testAFileFromBeforeTheLockIsNeverForkedByAnOpenWhileLocked() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            mkdir bg && '\(Harness.coffer)' protect --class unless-open bg > /dev/null
            python3 -c 'import sqlite3; c = sqlite3.connect("bg/app.db"); c.execute("create table t(x)"); c.executemany("insert into t values (?)", [(i,) for i in range(10)]); c.commit()'
            mkdir bg/olddir
            """), "setup")
        vault.unmount()
        vault.mount()  // a new daemon: the kernel has looked up nothing in bg
        let r = vault.sh("""
            stat -c %F bg > /dev/null
            '\(Harness.coffer)' lock "$M" > /dev/null
            python3 - <<'PY'
            import errno, os
            def attempt(what, f):
                try:
                    f(); print(what, "ok")
                except OSError as e:
                    print(what, errno.errorcode[e.errno])
            attempt("open", lambda: os.close(os.open("bg/app.db", os.O_CREAT | os.O_RDWR, 0o644)))
            attempt("excl", lambda: os.close(os.open("bg/app.db", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)))
            attempt("stat", lambda: os.stat("bg/app.db"))
            attempt("mkdir", lambda: os.mkdir("bg/olddir"))
            attempt("new", lambda: os.close(os.open("bg/new.db", os.O_CREAT | os.O_RDWR, 0o644)))
            attempt("rename", lambda: os.rename("bg/new.db", "bg/app.db"))
            attempt("missing", lambda: os.stat("bg/missing"))
            PY
            '\(Harness.coffer)' unlock --passfile '\(vault.passfile)' "$M" > /dev/null
            ls bg
            sqlite3 bg/app.db 'select count(*) from t'
            """)
        XCTAssertEqual(r.stdout.split(separator: "\n").map(String.init), [
            "open EACCES", "excl EACCES", "stat EACCES", "mkdir EACCES", "new ok", "rename EACCES", "missing ENOENT",
            "app.db", "new.db", "olddir", "10",
        ], r.stderr)
    }

    /// A file made while locked keeps its key in a key record; removing the file after the
    /// unlock (rm, or a rename over it) removes its record too, and fsck finds no leftover.
    func testAKeyRecordGoesWithItsFile() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            mkdir bg && '\(Harness.coffer)' protect --class unless-open bg > /dev/null && ls bg
            '\(Harness.coffer)' lock "$M" > /dev/null
            for f in a b c d e; do echo "made while locked: $f" > bg/$f; done
            '\(Harness.coffer)' unlock --passfile '\(vault.passfile)' "$M" > /dev/null
            """), "files made while locked")
        let records = "ls '\(vault.cipherdir)/coffer.drops' | wc -l"
        XCTAssertEqual(Harness.sh(records).stdout, "5\n")
        assertOK(vault.sh("rm bg/a bg/b && mv bg/c bg/d && ls bg && cat bg/d bg/e"), "remove and replace")
        XCTAssertEqual(Harness.sh(records).stdout, "2\n", "the records of removed files stayed")
        XCTAssertEqual(vault.sh("cat bg/d bg/e").stdout, "made while locked: c\nmade while locked: e\n")
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout)
        XCTAssertFalse(fsck.stdout.contains("leftover"), fsck.stdout)
    }

    /// The log of the unlock names each entry made while locked by its whole path, though
    /// the lock forgot the names of the directories on the way.
    func testTheUnlockLogsWhereEachEntryMadeWhileLockedIs() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            mkdir -p home/bg && '\(Harness.coffer)' protect --class unless-open home/bg > /dev/null && ls home/bg
            '\(Harness.coffer)' lock "$M" > /dev/null
            echo a > home/bg/a && mkdir home/bg/new && echo b > home/bg/new/b
            '\(Harness.coffer)' unlock --passfile '\(vault.passfile)' "$M" > /dev/null
            """), "files made while locked")
        let lines = vault.log.split(separator: "\n").filter { $0.contains("made while locked: ") }
            .map { String($0[$0.range(of: "made while locked: ")!.upperBound...].prefix { $0 != " " }) }
        XCTAssertEqual(lines.sorted(), ["/home/bg/a", "/home/bg/new", "/home/bg/new/b"], vault.log)
    }

    /// A sync engine's conflict copy of a file made while locked holds the same file ID;
    /// removing the copy leaves the original's key record, and the original reads.
    func testRemovingAConflictCopyLeavesTheOriginalsKeyRecord() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            mkdir bg && '\(Harness.coffer)' protect --class unless-open bg > /dev/null && ls bg
            '\(Harness.coffer)' lock "$M" > /dev/null
            echo 'made while locked' > bg/mail
            '\(Harness.coffer)' unlock --passfile '\(vault.passfile)' "$M" > /dev/null
            backing=$(find "$C" -inum "$(stat -c %i bg/mail)" | head -1)
            cp -p "$backing" "$backing.sync-conflict-20261128-093000-ABCDEFG"
            copy=$(ls bg | grep sync-conflict) || { echo "the copy is not shown"; ls bg; exit 1; }
            rm "bg/$copy"
            ls '\(vault.cipherdir)/coffer.drops' | wc -l
            cat bg/mail
            """), "a conflict copy removed")
        XCTAssertEqual(vault.sh("cat bg/mail").stdout, "made while locked\n", vault.log)
        XCTAssertEqual(Harness.sh("ls '\(vault.cipherdir)/coffer.drops' | wc -l").stdout, "1\n", "the original's record went")
    }
}

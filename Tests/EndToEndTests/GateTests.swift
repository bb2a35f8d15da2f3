// End-to-end: the authorization gate — locked mounts, unlock and lock over the control
// socket, what a lock does to open files and mappings, idle lock, passwd, fsck, wipe,
// the socket's defences, and systemd readiness.
import Foundation
import XCTest

final class GateTests: EndToEndCase {
    /// A mounted vault that starts locked (no passphrase given).
    func lockedVault(_ extra: [String] = []) -> MountedVault {
        let vault = MountedVault(scratch: scratch)
        let r = Harness.run([Harness.coffer, "mount", "--log-file", vault.logFile] + extra + [vault.cipherdir, vault.mountpoint])
        XCTAssertEqual(r.status, 0, r.stderr)
        return vault
    }

    func testLifecycle() {
        let vault = lockedVault()
        let m = vault.mountpoint
        // Locked: the root answers stat (mountpoint, df), everything else is EACCES.
        assertOK(Harness.sh("mountpoint -q \(m) && stat \(m) >/dev/null && df \(m) >/dev/null"), "root of a locked mount")
        let ls = Harness.sh("ls \(m)")
        XCTAssertTrue(ls.stderr.contains("Permission denied"), ls.stderr)
        XCTAssertTrue(coffer(["status", m]).stdout.contains("State:           locked"))

        let wrong = scratch.file("wrong", "not it\n")
        let refused = coffer(["unlock", "--passfile", wrong, m])
        XCTAssertEqual(refused.status, 22, refused.stderr)
        XCTAssertTrue(refused.stderr.contains("next attempt accepted in"), refused.stderr)
        let throttled = coffer(["unlock", "--passfile", vault.passfile, m])
        let status = coffer(["status", "--json", m]).stdout
        // The attempt was inside the delay if the status, asked after it, still shows a
        // delay; on a loaded machine the delay may have passed before it arrived, and
        // then there is nothing to check about it here.
        let json = (try? JSONSerialization.jsonObject(with: Data(status.utf8))) as? [String: Any]
        if let retryAfter = json?["retryAfter"] as? Double, retryAfter > 0 {
            XCTAssertEqual(throttled.status, 26, "an attempt inside the delay is refused without trying: \(throttled.stderr)")
        }
        XCTAssertTrue(status.contains("\"failedAttempts\" : 1"), status)
        XCTAssertFalse(vault.log.contains("not it"), "the log never holds a secret")
        usleep(1_100_000)
        assertOK(coffer(["unlock", "--passfile", vault.passfile, m]), "unlock")
        XCTAssertTrue(coffer(["unlock", "--passfile", vault.passfile, m]).stdout.contains("already unlocked"))

        // Write, read, and keep a descriptor and a mapping across a lock.
        let script = """
            import mmap, os, signal, subprocess, sys
            coffer, m = sys.argv[1], sys.argv[2]
            def run(*a): subprocess.run([coffer, *a, m], check=True, stdout=subprocess.DEVNULL)
            path = os.path.join(m, "secret.txt")
            with open(path, "wb") as f: f.write(b"top secret " * 1000)
            fd = os.open(path, os.O_RDWR)
            assert os.pread(fd, 10, 0) == b"top secret"
            mapping = mmap.mmap(fd, 11000)
            assert mapping[:10] == b"top secret"
            assert open(path, "rb").read(10) == b"top secret"      # now in the page cache
            run("lock")
            for attempt in (lambda: os.listdir(m), lambda: open(path, "rb").read(),
                            lambda: os.pread(fd, 10, 0), lambda: os.pwrite(fd, b"x", 0)):
                try:
                    attempt(); sys.exit("plaintext or access after lock")
                except PermissionError:
                    pass
            pid = os.fork()
            if pid == 0:
                mapping[:10]              # must fault, not show plaintext
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGBUS, f"mapping after lock: {status}"
            run("unlock", "--passfile", sys.argv[3])
            assert os.pread(fd, 10, 0) == b"top secret", "the same fd reads again after unlock"
            assert mapping[:10] == b"top secret", "the same mapping reads again after unlock"
            mapping.close(); os.close(fd)
            print("lifecycle ok")
            """
        let r = Harness.run(["python3", "-c", script, Harness.coffer, m, vault.passfile])
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr)
        XCTAssertTrue(r.stdout.contains("lifecycle ok"), r.stdout + r.stderr)
        vault.unmount()
        vault.mount()
        XCTAssertEqual(vault.sh("head -c 10 secret.txt").stdout, "top secret")
    }

    /// Data the kernel still holds dirty (a shared mapping) and data just written reach
    /// the backing directory before the keys go: after unlock every byte is there.
    func testLockFlushesBeforeWipingKeys() {
        let vault = mountedVault()
        let script = """
            import mmap, os, subprocess, sys
            coffer, m, passfile = sys.argv[1:4]
            path = os.path.join(m, "dirty")
            with open(path, "wb") as f: f.write(b"\\0" * 65536)
            fd = os.open(path, os.O_RDWR)
            mapping = mmap.mmap(fd, 65536)
            pattern = bytes(range(256)) * 256
            mapping[:] = pattern                               # dirty pages, no msync
            os.pwrite(fd, b"written", 70000)                   # a write() past the mapping
            subprocess.run([coffer, "lock", m], check=True, stdout=subprocess.DEVNULL)
            subprocess.run([coffer, "unlock", "--passfile", passfile, m], check=True, stdout=subprocess.DEVNULL)
            with open(path, "rb") as f: data = f.read()
            assert data[:65536] == pattern, "mmap writes were lost by the lock"
            assert data[70000:70007] == b"written", "write() was lost by the lock"
            print("flushed")
            """
        let r = Harness.run(["python3", "-c", script, Harness.coffer, vault.mountpoint, vault.passfile])
        XCTAssertTrue(r.stdout.contains("flushed"), r.stdout + r.stderr)
        vault.unmount()
        vault.mount()
        XCTAssertEqual(vault.sh("dd if=dirty bs=1 skip=70000 count=7 status=none").stdout, "written")
        XCTAssertEqual(vault.sh("cmp <(head -c 65536 dirty) <(python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256))*256)')").status, 0)
    }

    func testSocketIsPrivateAndRefusesOtherUsers() throws {
        let socketDir = scratch.mkdir("sockets")
        let socket = socketDir + "/s.sock"
        let vault = lockedVault(["--socket", socket])
        let mode = Harness.sh("stat -c %a \(socket)").stdout
        XCTAssertEqual(mode, "600\n")
        // Even with the socket opened up by mistake, the peer check refuses others.
        assertOK(Harness.sh("chmod 755 \(scratch.path) \(socketDir) && chmod 666 \(socket)"), "open up")
        var r = Outcome(status: 0, stdout: "", stderr: "")
        // The refusal reads what the peer sent and stops at the first read that finds
        // nothing: a handful of receives, not 17 for each of its two drains (34).
        let status = coffer(["status", "--json", "--socket", socket, vault.mountpoint]).stdout
        let pid = try XCTUnwrap((try JSONSerialization.jsonObject(with: Data(status.utf8)) as? [String: Any])?["pid"] as? Int)
        let receives = try tracing(Int32(pid), calls: "recvfrom") {
            r = Harness.sh("runuser -u nobody -- \(Harness.coffer) status --socket \(socket) \(vault.mountpoint); true")
        }.filter { $0.contains("recvfrom(") }
        XCTAssertTrue(r.stderr.contains("only the mount's owner"), r.stderr)
        // The refusal is logged after the connection is closed: perhaps after the client
        // has returned.
        let logged = Date().addingTimeInterval(10)
        while !vault.log.contains("refused a connection") && Date() < logged { usleep(100_000) }
        XCTAssertTrue(vault.log.contains("refused a connection from uid 65534"), vault.log)
        XCTAssertLessThanOrEqual(receives.count, 6, receives.joined(separator: "\n"))
        XCTAssertEqual(coffer(["status", "--socket", socket, vault.mountpoint]).status, 0)
    }

    func testMalformedRequestsGetErrorsAndTheDaemonKeepsServing() {
        let socket = scratch.mkdir("s") + "/c.sock"
        let vault = lockedVault(["--socket", socket])
        let script = """
            import json, socket, struct, sys, time
            path = sys.argv[1]
            def exchange(raw, wait=False):
                s = socket.socket(socket.AF_UNIX); s.connect(path); s.sendall(raw)
                if wait: time.sleep(6)
                data = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk: break
                    data += chunk
                s.close()
                (n,) = struct.unpack(">I", data[:4])
                return json.loads(data[4:4 + n])
            frame = lambda obj: (lambda b: struct.pack(">I", len(b)) + b)(json.dumps(obj).encode())
            cases = {
                "not json": struct.pack(">I", 5) + b"hello",
                "oversized": struct.pack(">I", 10_000_000),
                "unknown op": frame({"version": 1, "op": "format-disk"}),
                "wrong version": frame({"version": 99, "op": "status"}),
                "bad unlock": frame({"version": 1, "op": "unlock", "secret": "passphrase", "secretLength": 99999}),
            }
            for name, raw in cases.items():
                answer = exchange(raw)
                assert answer["ok"] is False and answer["error"], (name, answer)
                print(name, answer["error"])
            answer = exchange(struct.pack(">I", 100) + b"{", wait=True)
            assert answer["error"] == "timeout", answer
            print("truncated", answer["error"])
            assert exchange(frame({"version": 1, "op": "status"}))["status"]["state"] == "locked"
            print("still serving")
            """
        let r = Harness.run(["python3", "-c", script, socket], timeout: 60)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr)
        for expected in ["not json malformed-request", "oversized request-too-large", "unknown op unknown-operation",
                         "wrong version unsupported-version", "bad unlock malformed-request", "truncated timeout", "still serving"] {
            XCTAssertTrue(r.stdout.contains(expected), "\(expected): \(r.stdout)")
        }
        XCTAssertTrue(vault.isMounted)
    }

    func testIdleLockFires() {
        let vault = mountedVault("idle", ["--idle-lock", "2s"])
        XCTAssertTrue(coffer(["status", vault.mountpoint]).stdout.contains("locks after 2 s idle"))
        let deadline = Date().addingTimeInterval(30)
        var state = ""
        while Date() < deadline {
            state = coffer(["status", "--json", vault.mountpoint]).stdout
            if state.contains("\"state\" : \"locked\"") { break }
            usleep(250_000)
        }
        XCTAssertTrue(state.contains("\"state\" : \"locked\""), state)
        XCTAssertTrue(vault.log.contains("idle for 2 s"), vault.log)
    }

    func testPasswdKeepsRecoveryAndLeavesNoOldSlot() throws {
        let vault = MountedVault(scratch: scratch)
        let recovery = scratch.path + "/rk"
        // A second vault made with a recovery-key file, so the test knows the key.
        let cipher = scratch.mkdir("v2.cipher"), plain = scratch.mkdir("v2.plain")
        assertOK(coffer(["init", "--kdf-ops", "2", "--kdf-memory", "64", "--passfile", vault.passfile, "--recovery-key-out", recovery, cipher]), "init")
        let old = try String(contentsOfFile: cipher + "/coffer.conf", encoding: .utf8)
        let oldSlot = old.components(separatedBy: "\"wrappedKey\" : \"")[1].prefix(96)
        let newPass = scratch.file("new", "brand new passphrase\n")
        assertOK(coffer(["passwd", "--passfile", vault.passfile, "--new-passfile", newPass, cipher]), "passwd")
        XCTAssertEqual(Harness.sh("(grep -r -F '\(oldSlot)' \(cipher) || true); ls -A \(cipher) | grep -c -e bak -e tmp || true").stdout, "0\n")
        XCTAssertEqual(coffer(["mount", "--passfile", vault.passfile, cipher, plain]).status, 22, "old passphrase refused")
        assertOK(coffer(["mount", "--passfile", newPass, cipher, plain]), "new passphrase")
        assertOK(coffer(["lock", plain]), "lock")
        assertOK(coffer(["unlock", "--recovery-key-file", recovery, plain]), "recovery key still works")
        assertOK(coffer(["unmount", plain]), "unmount")
        // Forgotten passphrase: the recovery key proves ownership.
        assertOK(coffer(["passwd", "--recovery-key-file", recovery, "--new-passfile", vault.passfile, cipher]), "passwd by recovery key")
        assertOK(coffer(["fsck", "--passfile", vault.passfile, cipher]), "new passphrase opens")
    }

    func testFsckFindsTheDamagedFileAndBlock() {
        let vault = mountedVault()
        assertOK(vault.sh("mkdir -p a/b && head -c 50000 /dev/urandom > a/b/report.pdf && echo small > note && ln -s note link"), "write")
        vault.unmount()
        let clean = coffer(["fsck", "--passfile", vault.passfile, vault.cipherdir])
        XCTAssertEqual(clean.status, 0, clean.stdout + clean.stderr)
        XCTAssertTrue(clean.stdout.contains("no problems"), clean.stdout)
        let file = Harness.sh("find \(vault.cipherdir) -type f -size +40k").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        assertOK(Harness.flipByte(of: file, at: 34 + 7 * 4136 + 9), "flip")
        let damaged = coffer(["fsck", "--passfile", vault.passfile, vault.cipherdir])
        XCTAssertEqual(damaged.status, 40, damaged.stderr)
        XCTAssertTrue(damaged.stdout.contains("/a/b/report.pdf: block 7 failed authentication"), damaged.stdout)
        XCTAssertTrue(damaged.stdout.contains("1 problem"), damaged.stdout)
    }

    func testWipeMakesTheVaultUnopenable() {
        let vault = MountedVault(scratch: scratch)
        let recovery = scratch.path + "/rk"
        let cipher = scratch.mkdir("w.cipher"), plain = scratch.mkdir("w.plain")
        assertOK(coffer(["init", "--kdf-ops", "2", "--kdf-memory", "64", "--passfile", vault.passfile, "--recovery-key-out", recovery, cipher]), "init")
        assertOK(coffer(["mount", "--passfile", vault.passfile, cipher, plain]), "mount")
        assertOK(Harness.sh("echo precious > \(plain)/f"), "write")
        XCTAssertEqual(coffer(["wipe", cipher], input: "wrong-name\n").status, 41, "not confirmed")
        assertOK(coffer(["wipe", "--yes", cipher]), "wipe")
        XCTAssertTrue(coffer(["status", plain]).stdout.contains("locked"))
        XCTAssertEqual(coffer(["unlock", "--passfile", vault.passfile, plain]).status, 27)
        XCTAssertEqual(coffer(["unlock", "--recovery-key-file", recovery, plain]).status, 27)
        XCTAssertTrue(Harness.sh("cat \(plain)/f").stderr.contains("Permission denied"))
        assertOK(coffer(["unmount", plain]), "unmount")
        XCTAssertEqual(coffer(["mount", "--passfile", vault.passfile, cipher, plain]).status, 12)
        XCTAssertEqual(coffer(["fsck", "--recovery-key-file", recovery, cipher]).status, 12)
    }

    func testSystemdUnitsVerify() throws {
        let etc = scratch.mkdir("etc"), runtime = scratch.mkdir("run")
        chmod(runtime, 0o700)
        _ = scratch.file("etc/test.conf", "CIPHERDIR=/tmp/a\nMOUNTPOINT=/tmp/b\n")
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
        // The units name /usr/local/bin/coffer; verify them against the built binary.
        for (unit, name, user) in [("systemd/coffer@.service", "coffer@test.service", false),
                                   ("systemd/user/coffer@.service", "coffer@u.service", true)] {
            let text = try String(contentsOfFile: root + "/" + unit, encoding: .utf8)
                .replacingOccurrences(of: "/usr/local/bin/coffer", with: Harness.coffer)
                .replacingOccurrences(of: "/etc/coffer/%i.conf", with: etc + "/%i.conf")
            try text.write(toFile: scratch.path + "/" + name, atomically: true, encoding: .utf8)
            let r = Harness.sh("XDG_RUNTIME_DIR=\(runtime) systemd-analyze \(user ? "--user" : "") verify \(scratch.path)/\(name) 2>&1")
            XCTAssertEqual(r.status, 0, r.stdout)
            XCTAssertEqual(r.stdout, "", "systemd-analyze verify \(unit) warns:\n\(r.stdout)")
        }
    }

    func testReadyIsNotifiedOnlyOnceTheMountAnswers() {
        let vault = MountedVault(scratch: scratch)
        let script = """
            import os, socket, subprocess, sys, time
            coffer, cipher, plain, passfile, sock = sys.argv[1:6]
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind(sock); s.settimeout(60)
            env = dict(os.environ, NOTIFY_SOCKET=sock)
            daemon = subprocess.Popen([coffer, "mount", "--foreground", "--passfile", passfile, cipher, plain], env=env,
                                      stderr=subprocess.DEVNULL)
            message = s.recv(4096).decode()
            assert "READY=1" in message, message
            assert os.path.ismount(plain), "READY=1 before the mount was live"
            os.listdir(plain)
            subprocess.run(["fusermount3", "-u", plain], check=True)
            assert "STOPPING=1" in s.recv(4096).decode()
            assert daemon.wait(timeout=30) == 0
            print("ready ok")
            """
        let r = Harness.run(["python3", "-c", script, Harness.coffer, vault.cipherdir, vault.mountpoint, vault.passfile, scratch.path + "/notify"])
        XCTAssertTrue(r.stdout.contains("ready ok"), r.stdout + r.stderr)
    }
}

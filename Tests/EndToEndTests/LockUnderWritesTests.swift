// The lock under load: writers that append and overwrite from several threads while
// the mount locks. Every write() that returned success must be readable after the
// unlock, byte for byte; every write() after the lock must fail.
import Foundation
import XCTest

final class LockUnderWritesTests: EndToEndCase {
    /// Four threads, one file each: appends and overwrites of 1 byte … 9 KB until a
    /// write fails; each keeps a model of what its file must hold.
    static let script = """
        import os, random, subprocess, sys, threading, time
        coffer, m, passfile, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
        N = 4
        models = [bytearray() for _ in range(N)]
        counts, failures = [0] * N, [None] * N
        locked = threading.Event()
        def writer(i):
            fd = os.open(os.path.join(m, "s%dw%d" % (seed, i)), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            rnd, model = random.Random(seed * 10 + i), models[i]
            while True:
                record = bytes([rnd.randrange(1, 256)]) * rnd.randrange(1, 9000)
                offset = rnd.randrange(len(model)) if model and rnd.random() < 0.3 else len(model)
                try:
                    n = os.pwrite(fd, record, offset)
                except OSError as e:
                    failures[i] = e.errno
                    break
                # A short write acknowledges the bytes it counts (the kernel splits a
                # write into requests; one refused after another was served is short).
                if offset + n > len(model):
                    model.extend(bytes(offset + n - len(model)))
                model[offset:offset + n] = record[:n]
                counts[i] += 1
                if locked.is_set() and time.monotonic() > deadline:
                    failures[i] = "still writing 5 s after the lock"
                    break
            try:
                os.close(fd)
            except OSError:
                pass
        threads = [threading.Thread(target=writer, args=(i,)) for i in range(N)]
        for t in threads: t.start()
        time.sleep(1.5)
        deadline = time.monotonic() + 5
        locked.set()
        subprocess.run([coffer, "lock", m], check=True, stdout=subprocess.DEVNULL)
        for t in threads: t.join()
        subprocess.run([coffer, "unlock", "--passfile", passfile, m], check=True, stdout=subprocess.DEVNULL)
        print("writes", counts, "failures", failures)
        assert all(f == 13 for f in failures), "every writer must end with EACCES: %r" % failures
        for i in range(N):
            with open(os.path.join(m, "s%dw%d" % (seed, i)), "rb") as f:
                data = f.read()
            assert data == bytes(models[i]), "w%d: %d bytes on the mount, %d acknowledged; first difference at %s" % (
                i, len(data), len(models[i]), next((k for k in range(min(len(data), len(models[i]))) if data[k] != models[i][k]), "the end"))
        print("all acknowledged writes readable")
        """

    func testEveryAcknowledgedWriteSurvivesALockUnderLoad() {
        let vault = mountedVault()
        for seed in 1...3 {
            let r = Harness.run(["python3", "-c", Self.script, Harness.coffer, vault.mountpoint, vault.passfile, String(seed)])
            XCTAssertTrue(r.stdout.contains("all acknowledged writes readable"), "seed \(seed): \(r.stdout)\(r.stderr)")
            XCTAssertTrue(vault.log.contains("locked (requested)") || vault.log.contains("locked ("), vault.log)
        }
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
    }
}

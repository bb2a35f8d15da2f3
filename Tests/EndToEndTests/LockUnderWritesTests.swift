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
        locked = threading.Event()                      # set once `coffer lock` returned
        def writer(i):
            fd = os.open(os.path.join(m, "s%dw%d" % (seed, i)), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            rnd, model = random.Random(seed * 10 + i), models[i]
            while True:
                record = bytes([rnd.randrange(1, 256)]) * rnd.randrange(1, 9000)
                offset = rnd.randrange(len(model)) if model and rnd.random() < 0.3 else len(model)
                after_lock = locked.is_set()
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
                if after_lock:
                    failures[i] = "a write made after the lock returned succeeded"
                    break
            try:
                os.close(fd)
            except OSError:
                pass
        threads = [threading.Thread(target=writer, args=(i,)) for i in range(N)]
        for t in threads: t.start()
        time.sleep(1.5)
        subprocess.run([coffer, "lock", m], check=True, stdout=subprocess.DEVNULL)
        locked.set()
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

    /// One 128 MiB write() whose source pages fault in from the disk one by one (so the
    /// kernel's invalidation at the lock can overtake it), locked 0.3 s in: what the
    /// call returns must be exactly what the file holds after the unlock. With the
    /// kernel's writeback cache this fails (docs/PERFORMANCE.md, "Writeback cache").
    static let straddlingScript = """
        import mmap, os, subprocess, sys, threading, time
        coffer, m, passfile, src = sys.argv[1:5]
        size = 128 << 20
        with open(src, "wb") as f:
            for _ in range(128): f.write(os.urandom(1 << 20))
        for trial in range(3):
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f: f.write("3\\n")
            source = mmap.mmap(os.open(src, os.O_RDONLY), size, prot=mmap.PROT_READ)
            source.madvise(mmap.MADV_RANDOM)
            path = os.path.join(m, "straddled%d" % trial)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            result = {}
            def write():
                try:
                    result["n"] = os.write(fd, source)
                except OSError as e:
                    result["n"] = 0
            writer = threading.Thread(target=write)
            writer.start()
            time.sleep(0.3)
            subprocess.run([coffer, "lock", m], check=True, stdout=subprocess.DEVNULL)
            writer.join()
            try:
                os.close(fd)
            except OSError:
                pass
            subprocess.run([coffer, "unlock", "--passfile", passfile, m], check=True, stdout=subprocess.DEVNULL)
            with open(path, "rb") as f:
                data = f.read()
            print("trial", trial, "acknowledged", result["n"], "stored", len(data))
            assert data == source[:result["n"]], "trial %d: %d bytes acknowledged, %d stored" % (trial, result["n"], len(data))
        print("what was acknowledged was stored")
        """

    func testAWriteStraddlingTheLockStoresWhatItAcknowledged() {
        let vault = mountedVault()
        let r = Harness.run(["python3", "-c", Self.straddlingScript, Harness.coffer, vault.mountpoint, vault.passfile,
                             scratch.path + "/source"])
        XCTAssertTrue(r.stdout.contains("what was acknowledged was stored"), r.stdout + r.stderr)
        vault.unmount()
    }

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

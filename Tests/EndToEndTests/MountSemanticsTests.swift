// End-to-end: POSIX semantics of the mount — links, holes, names, concurrency,
// renames, mmap, locks, fsync of unlinked files, special files, xattrs, times.
import Foundation
import XCTest

final class MountSemanticsTests: EndToEndCase {
    func testHardLinksCountAndShareContent() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            echo one > a && ln a b && ln a c
            test "$(stat -c %h a)" = 3
            echo two >> b && grep -qx two c
            rm a && test "$(stat -c %h b)" = 2
            mkdir d && test "$(stat -c %h d)" = 2 && mkdir d/e && test "$(stat -c %h d)" = 3
            """), "hard links")
    }

    /// A file says 1 MiB is its best I/O size (st_blksize), so cp into the mount writes
    /// 1 MiB at a time, where the backing file system's 4 KiB would have had it write
    /// 128 KiB (its floor) at a time. A directory keeps the backing one. (Within one
    /// file system cp uses copy_file_range, which the kernel carries out itself.)
    func testFilesAskForMebibyteIO() {
        let vault = mountedVault()
        let r = vault.sh("""
            head -c 3145728 /dev/urandom > ../src && cp ../src src && stat -c '%o' src
            stat -c '%o' . | grep -vx 1048576 > /dev/null && echo dir keeps its own
            strace -f -e trace=write -e signal=none -o ../cp.trace cp ../src copy && cmp ../src copy && echo copy same
            grep -Ec 'write\\([0-9]+, .*= 1048576$' ../cp.trace
            """)
        XCTAssertEqual(r.stdout, "1048576\ndir keeps its own\ncopy same\n3\n", r.stderr)
    }

    func testSparseFileStaysSparse() {
        let vault = mountedVault()
        assertOK(vault.sh("truncate -s 10G sparse && printf x | dd of=sparse bs=1 seek=5000000000 conv=notrunc status=none"), "sparse")
        XCTAssertEqual(vault.sh("stat -c %s sparse").stdout, "10737418240\n")
        let used = Int(Harness.sh("du -sk \(vault.cipherdir) | cut -f1").stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? .max
        XCTAssertLessThan(used, 1024, "backing directory uses \(used) KiB for a 10 GiB sparse file")
        XCTAssertEqual(vault.sh("dd if=sparse bs=1 skip=4999999999 count=3 status=none | od -An -c | tr -d ' '").stdout, "\\0x\\0\n")
    }

    func testLongestNameWorksAndLongerIsRefused() {
        let vault = mountedVault()
        let longest = String(repeating: "n", count: 255), tooLong = String(repeating: "n", count: 256)
        assertOK(vault.sh("echo ok > \(longest) && cat \(longest) && ls | grep -x \(longest) > /dev/null && mkdir d && mv \(longest) d/ && test -f d/\(longest)"), "255-byte name")
        let r = vault.sh("touch \(tooLong) 2>&1; true")
        XCTAssertTrue(r.stdout.contains("File name too long"), r.stdout)
        for length in [159, 160, 200] {
            assertOK(vault.sh("touch \(String(repeating: "k", count: length)) && ls | grep -x \(String(repeating: "k", count: length)) > /dev/null"), "name of \(length) bytes")
        }
    }

    func testUnicodeNames() {
        let vault = mountedVault()
        let names = ["Grüße.txt", "日本語のファイル", "emoji-😀-🎉", "Ελληνικά", "x\u{301}"]
        for name in names { assertOK(vault.sh("echo '\(name)' > '\(name)'"), name) }
        let listed = Set(vault.sh("ls -1").stdout.split(separator: "\n").map(String.init))
        XCTAssertEqual(listed, Set(names))
        for name in names { XCTAssertEqual(vault.sh("cat '\(name)'").stdout, name + "\n") }
    }

    func testConcurrentWritersToFilesAndBlocks() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            for i in 1 2 3 4; do head -c 3000000 /dev/urandom > /tmp/src.$$.$i; done
            for i in 1 2 3 4; do cp /tmp/src.$$.$i f$i & done; wait
            for i in 1 2 3 4; do cmp f$i /tmp/src.$$.$i; done
            # Four writers into different (and unaligned) regions of one file.
            truncate -s 12000000 shared
            for i in 0 1 2 3; do dd if=/tmp/src.$$.$((i+1)) of=shared bs=1000 seek=$((i*3000)) count=3000 conv=notrunc status=none & done; wait
            for i in 0 1 2 3; do cmp <(dd if=shared bs=1000 skip=$((i*3000)) count=3000 status=none) /tmp/src.$$.$((i+1)); done
            rm -f /tmp/src.$$.*
            """), "concurrent writers")
    }

    func testEverythingSurvivesARemount() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            cp -a /usr/include/linux/netfilter tree && head -c 5000000 /dev/urandom > big && ln -s big link
            mkfifo fifo && setfattr -n user.k -v v big && find . -type f -exec sha256sum {} + | sort > /tmp/sums.$PPID
            """), "write")
        vault.unmount()
        XCTAssertEqual(Harness.sh("ls -A \(vault.mountpoint)").stdout, "", "nothing visible once unmounted")
        vault.mount()
        assertOK(vault.sh("find . -type f -exec sha256sum {} + | sort | diff - /tmp/sums.$PPID && test \"$(readlink link)\" = big && test -p fifo && getfattr -n user.k big | grep v > /dev/null; rm -f /tmp/sums.$PPID"), "verify after remount")
    }

    func testRenameVariants() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            echo a > a && echo b > b && mkdir d
            mv a d/a2 && test -f d/a2 && test ! -e a
            mv b d/a2 && grep -qx b d/a2
            long=$(printf 'L%.0s' $(seq 200)); echo l > $long && mv $long d/$long && mv d/$long short && grep -qx l short
            python3 - <<'PY'
            import ctypes, os
            libc = ctypes.CDLL(None, use_errno=True)
            AT = -100
            open("x", "w").write("x"); open("y", "w").write("y")
            assert libc.renameat2(AT, b"x", AT, b"y", 1) == -1 and ctypes.get_errno() == 17, "NOREPLACE"
            assert libc.renameat2(AT, b"x", AT, b"y", 2) == 0, "EXCHANGE"
            assert open("x").read() == "y" and open("y").read() == "x"
            os.mkdir("e"); open("e/in", "w").write("in")
            assert libc.renameat2(AT, b"e", AT, b"x", 2) == 0, "EXCHANGE dir and file"
            assert open("x/in").read() == "in" and open("e").read() == "y"
            # RENAME_WHITEOUT (overlayfs's) is refused: a whiteout left under a long name
            # would have no sidecar to name it (xfstests generic/013, 078).
            long = b"W" * 200
            open(long, "w").write("w")
            assert libc.renameat2(AT, long, AT, b"white", 4) == -1 and ctypes.get_errno() == 22, "WHITEOUT"
            assert open(long).read() == "w" and not os.path.exists("white")
            os.unlink(long)
            # A rewind sees what was made since the opendir (rewinddir(3); generic/471).
            os.mkdir("r"); fd = os.open("r", os.O_RDONLY | os.O_DIRECTORY)
            open("r/made-after-opendir", "w").write("")
            assert os.listdir(fd) == ["made-after-opendir"], os.listdir(fd)
            open("r/made-after-the-first-listing", "w").write("")
            assert sorted(os.listdir(fd)) == ["made-after-opendir", "made-after-the-first-listing"]
            os.close(fd)
            PY
            test -z "$(ls $C | grep -c '\\.name$' | grep -v '^0$')"
            """), "renames")
        // Only the sidecars of long names still in use remain.
        XCTAssertEqual(Harness.sh("find \(vault.cipherdir) -name 'coffer.long.*' | wc -l").stdout, "0\n")
    }

    func testDirectoryReplacesAnEmptyDirectory() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            mkdir a b && echo in > a/f && mv -T a b && test -f b/f && test ! -e a
            mkdir c && echo x > c/g && mkdir d && ! mv -T d c 2>/dev/null && test -d d
            python3 -c "import os; os.mkdir('e'); os.mkdir('f'); os.replace('e', 'f'); assert not os.path.exists('e')"
            rmdir f d
            """), "rename over an empty directory")
    }

    func testAbsurdSizesAreEFBIGAndTheDaemonSurvives() {
        let vault = mountedVault()
        let r = vault.sh("echo x > f; truncate -s 9150000000000000000 f 2>&1; dd if=/dev/zero of=f bs=1 count=1 seek=9150000000000000000 2>&1; true")
        XCTAssertTrue(r.stdout.contains("File too large"), r.stdout)
        XCTAssertEqual(vault.sh("cat f").stdout, "x\n", "the file is unchanged and the daemon alive")
    }

    func testMmapSharedWritesReachTheFile() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            python3 - <<'PY'
            import mmap, os
            with open("m", "wb") as f: f.write(b"\\0" * 20000)
            with open("m", "r+b") as f:
                m = mmap.mmap(f.fileno(), 20000)
                m[4090:4100] = b"0123456789"; m[19990:] = b"abcdefghij"; m.flush(); m.close()
            data = open("m", "rb").read()
            assert data[4090:4100] == b"0123456789" and data[19990:] == b"abcdefghij" and data[:10] == b"\\0" * 10
            PY
            """), "mmap")
        vault.unmount()
        vault.mount()
        XCTAssertEqual(vault.sh("dd if=m bs=1 skip=4090 count=10 status=none").stdout, "0123456789")
    }

    func testPosixAndFlockLocks() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            touch lockfile
            flock -n lockfile -c 'flock -n lockfile -c true && exit 1 || exit 0'
            python3 - <<'PY'
            import fcntl, os, subprocess, sys
            f = open("lockfile", "r+")
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            r = subprocess.run([sys.executable, "-c", "import fcntl; f=open('lockfile','r+'); fcntl.lockf(f, fcntl.LOCK_EX|fcntl.LOCK_NB)"])
            assert r.returncode != 0, "a second process got the POSIX lock"
            PY
            """), "locks")
    }

    func testFsyncOfAnOpenButUnlinkedFile() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            python3 - <<'PY'
            import os
            fd = os.open("gone", os.O_RDWR | os.O_CREAT, 0o600)
            os.unlink("gone")
            os.write(fd, b"still here" * 1000)
            os.fsync(fd); os.fdatasync(fd)
            os.lseek(fd, 0, 0)
            assert os.read(fd, 10) == b"still here"
            os.close(fd)
            assert not os.path.exists("gone")
            PY
            """), "fsync unlinked")
    }

    func testSpecialFilesXattrsTimesAndOpenFlags() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            mkfifo fifo && test -p fifo
            python3 -c "import socket; s=socket.socket(socket.AF_UNIX); s.bind('sock')" && test -S sock
            echo x > f
            setfattr -n user.one -v 1 f && setfattr -n user.two -v "$(head -c 3000 /dev/zero | tr '\\0' z)" f
            getfattr -d f | grep 'user.one="1"' > /dev/null && test "$(getfattr --only-values -n user.two f | wc -c)" = 3000
            setfattr -x user.one f && ! getfattr -n user.one f 2>/dev/null
            test "$(getfattr -d f | grep -c user)" = 1
            python3 -c "import os, errno, sys
            try: os.getxattr('f', 'security.selinux')
            except OSError as e: sys.exit(e.errno != errno.EOPNOTSUPP)
            sys.exit(1)"
            ! setfattr -n security.selinux -v x f 2>/dev/null
            touch -d '2010-01-01 00:00:00' f && test "$(stat -c %Y f)" = 1262304000
            touch -a -d '2011-01-01 00:00:00' f && test "$(stat -c %Y f)" = 1262304000
            touch -m f && test "$(stat -c %Y f)" -gt 1262304000
            echo one >> app && echo two >> app && test "$(cat app)" = "$(printf 'one\\ntwo')"
            python3 -c "import os; os.open('f', os.O_CREAT | os.O_EXCL | os.O_WRONLY)" 2>/dev/null && exit 1
            printf 'longer content' > t && python3 -c "import os; os.close(os.open('t', os.O_WRONLY | os.O_TRUNC))" && test ! -s t
            printf 'abc' > t && : > t && test ! -s t && printf 'new' >> t && test "$(cat t)" = new
            fallocate -l 100000 fa && test "$(stat -c %s fa)" = 100000 && test "$(head -c 100000 fa | tr -d '\\0' | wc -c)" = 0
            fallocate -n -l 1000000 fa && test "$(stat -c %s fa)" = 100000
            chmod 600 f && test "$(stat -c %a f)" = 600
            df -P . | tail -1 | awk '{ exit !($2 > 0) }'
            test "$(stat -f -c %l .)" = 255
            """), "special files, xattrs, times, flags")
    }

    /// Writes, truncates and chowns clear setuid/setgid as on a local file system: the
    /// mount asks the kernel to leave that to coffer (HANDLE_KILLPRIV_V2), so the same
    /// steps must give the same modes in the mount and in a plain directory.
    func testSetIDBitsAreClearedAsOnALocalFileSystem() {
        let vault = mountedVault("vault", ["--allow-other"])
        let plain = scratch.mkdir("plain")
        assertOK(Harness.sh("chmod 755 \(scratch.path) \(plain)"), "let nobody in")
        let steps = """
            as_nobody() { runuser -u nobody -- "$@"; }
            fresh() { rm -f f; printf x > f; chmod "$1" f; }
            fresh 6777; as_nobody sh -c 'printf y >> f'; echo "nobody write: $(stat -c %a f)"
            fresh 6777; printf y >> f; echo "root write: $(stat -c %a f)"
            fresh 6767; as_nobody sh -c 'printf y >> f'; echo "nobody write, setgid without g+x: $(stat -c %a f)"
            fresh 6777; as_nobody truncate -s 0 f; echo "nobody truncate: $(stat -c %a f)"
            fresh 6777; as_nobody sh -c ': > f'; echo "nobody O_TRUNC: $(stat -c %a f)"
            fresh 6777; chown nobody f; echo "root chown: $(stat -c %a f)"
            fresh 6777; chmod 6777 f; echo "chmod keeps: $(stat -c %a f)"
            """
        let mounted = vault.sh(steps)
        let local = Harness.sh("cd \(plain) && " + steps)
        assertOK(local, "steps in a plain directory")
        assertOK(mounted, "steps in the mount")
        XCTAssertTrue(local.stdout.contains("nobody write: 777"), "the reference is the kernel's own rule:\n\(local.stdout)")
        XCTAssertTrue(local.stdout.contains("root write: 6777"), local.stdout)
        XCTAssertEqual(mounted.stdout, local.stdout)
    }

    /// What the kernel has to ask the daemon, read from libfuse's debug log: a second
    /// write to a file asks nothing but the WRITE (HANDLE_KILLPRIV_V2 was negotiated),
    /// a chown needs no GETATTR first, and a file read again after a reopen comes from
    /// the kept page cache.
    func testTheKernelAsksOnlyWhatItMust() throws {
        let vault = MountedVault(scratch: scratch)
        let script = """
            import os, subprocess, sys, time
            coffer, cipher, plain, passfile, log = sys.argv[1:6]
            with open(log, "wb") as out:
                daemon = subprocess.Popen([coffer, "mount", "--foreground", "-o", "debug", "--passfile", passfile, cipher, plain],
                                          stderr=out, stdout=subprocess.DEVNULL)
            deadline = time.time() + 30
            while not os.path.ismount(plain) and time.time() < deadline: time.sleep(0.05)
            def asked(step):
                start = os.path.getsize(log)
                step()
                quiet_by, size = time.time() + 10, -1   # until the log stops growing: the daemon caught up
                while os.path.getsize(log) != size and time.time() < quiet_by:
                    size = os.path.getsize(log); time.sleep(0.2)
                with open(log, "rb") as f:
                    f.seek(start)
                    text = f.read().decode(errors="replace")
                return lambda op: text.count(f"opcode: {op} ")
            f = os.path.join(plain, "f")
            def two_writes():
                fd = os.open(f, os.O_CREAT | os.O_WRONLY, 0o644)
                os.write(fd, b"a" * 4096); os.write(fd, b"b" * 4096); os.close(fd)
            n = asked(two_writes)
            print("writes", n("WRITE"), "getxattr", n("GETXATTR"))
            n = asked(lambda: os.chown(f, 0, 0))
            print("chown getattr", n("GETATTR"), "setattr", n("SETATTR"))
            def read_after_drop():
                fd = os.open(f, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.read(fd, 20000); os.close(fd)
            n = asked(read_after_drop)
            print("first read", n("READ"))
            def reread():
                fd = os.open(f, os.O_RDONLY); os.read(fd, 20000); os.close(fd)
            n = asked(reread)
            print("reread", n("READ"))
            # libfuse logs the flags the kernel offered at INIT; bit 28 is HANDLE_KILLPRIV_V2.
            offered = int(open(log, errors="replace").read().split("flags=0x", 1)[1].split()[0], 16)
            print("killpriv_v2 offered", bool(offered & (1 << 28)))
            subprocess.run(["fusermount3", "-u", plain], check=True)
            daemon.wait(timeout=30)
            """
        let r = Harness.run(["python3", "-c", script, Harness.coffer, vault.cipherdir, vault.mountpoint, vault.passfile,
                             scratch.path + "/debug.log"])
        XCTAssertEqual(r.status, 0, r.stderr)
        XCTAssertTrue(r.stdout.contains("first read 1\n"), "the control: pages dropped, so READ:\n\(r.stdout)")
        XCTAssertTrue(r.stdout.contains("reread 0\n"), "pages kept across opens:\n\(r.stdout)")
        // A kernel older than 5.11 cannot hand setuid clearing to the file system.
        try XCTSkipUnless(r.stdout.contains("killpriv_v2 offered True"), "this kernel does not offer HANDLE_KILLPRIV_V2")
        XCTAssertTrue(r.stdout.contains("writes 2 getxattr 1\n"), "only the first write is checked:\n\(r.stdout)")
        XCTAssertTrue(r.stdout.contains("chown getattr 0 setattr 1\n"), r.stdout)
    }

    /// A write through the mount must not make the kernel drop the file's pages when it
    /// next fetches the attributes (the mtime changed): that drop also takes pages whose
    /// write is still on its way to the daemon, and a read that overtakes the write then
    /// caches the old bytes — how sqlite in WAL mode lost committed transactions.
    func testTheMountsOwnWritesKeepTheFilesPages() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            head -c 65536 /dev/urandom > f; cat f > /dev/null
            [ "$(fincore -b -n -o RES f | tr -d ' ')" = 65536 ] || { echo "not cached: $(fincore f)"; exit 1; }
            sleep 0.1                                   # the write below gets another mtime
            printf x | dd of=f bs=1 seek=100 conv=notrunc 2>/dev/null
            stat f > /dev/null                          # the attributes, fetched again
            [ "$(fincore -b -n -o RES f | tr -d ' ')" = 65536 ] || { echo "pages dropped: $(fincore f)"; exit 1; }
            """), "pages kept through a write")
    }

    /// Each node holds one O_PATH descriptor; once the kernel forgets the inodes (cache
    /// drop), the table must shrink again rather than grow without bound.
    func testForgottenNodesAreReleased() {
        let vault = mountedVault()
        assertOK(vault.sh("mkdir many && cd many && seq 1 3000 | xargs touch && ls -l > /dev/null"), "create and stat 3000 files")
        let pid = Harness.sh("pgrep -f -- '--log-file \(vault.logFile)'").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let descriptors = { Int(Harness.sh("ls /proc/\(pid)/fd | wc -l").stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1 }
        XCTAssertGreaterThan(descriptors(), 3000, "every looked-up file holds a node")
        Harness.sh("sync && echo 2 > /proc/sys/vm/drop_caches")
        let deadline = Date().addingTimeInterval(30)
        while descriptors() > 200 && Date() < deadline { usleep(100_000) }
        XCTAssertLessThan(descriptors(), 200, "nodes were not released after the kernel forgot them")
        XCTAssertEqual(vault.sh("ls many | wc -l").stdout, "3000\n")
    }

    /// An error that is no answer a request can expect — here the daemon out of
    /// descriptors — is logged with the operation's name and without the file's name;
    /// the ENODATA of an ordinary miss is not logged.
    func testUnexpectedErrorsAreLoggedWithTheOperation() {
        let vault = mountedVault()
        assertOK(vault.sh("mkdir d && cd d && for i in $(seq 1 100); do : > secretname$i; done"), "create")
        XCTAssertFalse(vault.sh("python3 -c \"import os; os.getxattr('d', 'user.none')\"").stderr.isEmpty, "ENODATA")
        guard let pid = vault.daemonPID else { return XCTFail("no daemon pid") }
        let limit = Harness.sh("prlimit --pid \(pid) --nofile --raw --noheadings -o SOFT,HARD").stdout
            .split(separator: " ", omittingEmptySubsequences: true).map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }
        XCTAssertEqual(limit.count, 2, "prlimit: \(limit)")
        // Until the kernel's forgets are handled: the descriptor count holds still for 0.2 s (up to 10 s).
        Harness.sh("echo 2 > /proc/sys/vm/drop_caches; a=; for i in $(seq 50); do b=$(ls /proc/\(pid)/fd | wc -l); "
                   + "[ \"$a\" = \"$b\" ] && break; a=$b; sleep 0.2; done")
        let open = Int(Harness.sh("ls /proc/\(pid)/fd | wc -l").stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
        assertOK(Harness.sh("prlimit --pid \(pid) --nofile=\(open + 20):\(limit.last ?? "1024")"), "lower the daemon's limit")
        let r = vault.sh("""
            python3 -c '
            import os
            held = []
            try:
                for i in range(1, 101): held.append(open("d/secretname%d" % i))
            except OSError as e:
                print("refused", e.errno)
            '
            """)
        assertOK(Harness.sh("prlimit --pid \(pid) --nofile=\(limit.first ?? "1024"):\(limit.last ?? "1024")"), "restore the limit")
        XCTAssertTrue(r.stdout.contains("refused 24"), "the daemon never ran out of descriptors: \(r.stdout) \(r.stderr)")
        let lines = vault.log.split(separator: "\n").filter { $0.contains("unexpected error") }
        XCTAssertTrue(lines.contains { $0.contains(": lookup: ") || $0.contains(": open: ") }, vault.log)
        XCTAssertTrue(lines.allSatisfy { $0.contains("answered errno 24") }, vault.log)
        XCTAssertFalse(vault.log.contains("secretname"), "a plaintext name in the log: \(vault.log)")
        XCTAssertFalse(vault.log.contains("errno \(ENODATA):"), "an ordinary ENODATA was logged: \(vault.log)")
        assertOK(vault.sh("cat d/secretname100"), "served again once descriptors are free")
    }

    /// Symlink targets up to PATH_MAX − 1 bytes, as on ext4: a target too long for the
    /// backing symlink lives in a sidecar that follows the link through hard links,
    /// renames and removal, and survives a remount; fsck checks it.
    func testSymlinkTargetsUpToPathMax() {
        let vault = mountedVault()
        let script = """
            t() { head -c "$1" /dev/zero | tr '\\0' t; }
            for n in 3031 3032 4000 4095; do
              ln -s "$(t $n)" link$n && test "$(readlink link$n)" = "$(t $n)" && test "$(stat -c %s link$n)" = $n
            done
            ! ln -s "$(t 4096)" link4096 2>/dev/null
            mkdir d && mv link4000 d/moved && test "$(readlink d/moved)" = "$(t 4000)"
            python3 -c "import os; os.link('link4095', 'hard4095', follow_symlinks=False)"
            rm link4095 && test "$(readlink hard4095)" = "$(t 4095)"
            ln -s short replacement && mv -T replacement link3032 && test "$(readlink link3032)" = short
            """
        assertOK(vault.sh(script), "long targets")
        let sidecars = { Harness.sh("ls \(self.scratch.path)/vault.cipher | grep -c '^coffer.target.'; true").stdout }
        XCTAssertEqual(sidecars(), "2\n", "one sidecar each for d/moved and hard4095, none left by rm and mv")
        vault.unmount()
        vault.mount()
        assertOK(vault.sh("""
            t() { head -c "$1" /dev/zero | tr '\\0' t; }
            test "$(readlink d/moved)" = "$(t 4000)" && test "$(readlink hard4095)" = "$(t 4095)" && test "$(readlink link3031)" = "$(t 3031)"
            ls -l d/moved | grep ' -> ttt' > /dev/null
            """), "after a remount")
        vault.unmount()
        let fsck = Harness.run([Harness.coffer, "fsck", "--passfile", vault.passfile, vault.cipherdir])
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
        vault.mount()
        assertOK(vault.sh("rm d/moved hard4095"), "remove the last links")
        XCTAssertEqual(sidecars(), "0\n")
    }

    /// A format-1 vault keeps format 1's limit, so that an older coffer never meets a
    /// symlink it cannot read; a new vault is format 7.
    func testAFormat1VaultKeepsItsSymlinkLimit() {
        let (dir, made) = initVault("old")
        XCTAssertEqual(made.status, 0, made.stderr)
        let format = 7
        XCTAssertTrue(Harness.sh("grep -q '\"format\" : \(format)' \(dir)/coffer.conf").status == 0, "new vaults here are format \(format)")
        let cipherdir = scratch.mkdir("v1.cipher"), mountpoint = scratch.mkdir("v1.plain")
        let passfile = scratch.file("v1.pass", "pass\n")
        assertOK(Harness.run([Harness.coffer, "init", "--cipher", "xchacha20-poly1305", "--format", "1", "--kdf-ops", "2", "--kdf-memory", "64", "--passfile", passfile, cipherdir]), "init --format 1")
        XCTAssertTrue(Harness.run([Harness.coffer, "info", cipherdir]).stdout.contains("Format version: 1"))
        assertOK(Harness.run([Harness.coffer, "mount", "--passfile", passfile, cipherdir, mountpoint]), "mount")
        let r = Harness.sh("""
            cd \(mountpoint)
            ln -s "$(head -c 3031 /dev/zero | tr '\\0' t)" fits
            ln -s "$(head -c 3032 /dev/zero | tr '\\0' t)" toolong 2>&1 || true
            """)
        Harness.run([Harness.coffer, "unmount", mountpoint])
        XCTAssertEqual(r.status, 0, r.stderr)
        XCTAssertTrue(r.stdout.contains("File name too long"), r.stdout)
        XCTAssertEqual(Harness.sh("ls \(cipherdir) | grep -c '^coffer.target.'; true").stdout, "0\n")
    }
}

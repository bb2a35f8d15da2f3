// End-to-end: a mounted vault driven with the tools people use — coreutils, tar, rsync,
// git, sqlite3, an editor-style save, fio with verification.
import Foundation
import XCTest

final class MountToolTests: EndToEndCase {
    /// The same coreutils script in the mount and in a plain directory must give the
    /// same tree: names, contents, sizes, modes, link counts, types.
    func testCoreutilsBehaveAsOnAPlainDirectory() {
        let vault = mountedVault()
        let plain = scratch.mkdir("plain")
        let script = """
            printf 'hello\\n' > a.txt
            cp -a a.txt b.txt
            mkdir -p dir/sub && cp -a a.txt dir/sub/c.txt
            mv b.txt dir/moved.txt
            ln a.txt hard.txt
            ln -s a.txt sym && ln -s dir/sub/c.txt dir/relsym
            chmod 640 a.txt && chmod 711 dir
            truncate -s 5000 grown && truncate -s 3 dir/moved.txt
            touch -d '2001-02-03 04:05:06' dir/moved.txt
            head -c 100000 /dev/urandom > rnd 2>/dev/null || true
            cp rnd rnd.orig
            printf 'XYZ' | dd of=rnd bs=1 seek=4095 conv=notrunc status=none
            printf 'ABCDEFG' | dd of=rnd bs=1 seek=8190 conv=notrunc status=none
            dd if=/dev/zero of=rnd bs=1 count=10 seek=99995 conv=notrunc status=none
            printf 'tail' >> a.txt
            rm rnd.orig
            """
        // Random bytes differ between the runs; make them the same first.
        let seed = scratch.path + "/seed"
        Harness.sh("head -c 100000 /dev/urandom > \(seed)")
        let fixed = script.replacingOccurrences(of: "head -c 100000 /dev/urandom > rnd 2>/dev/null || true", with: "cp \(seed) rnd")
        assertOK(vault.sh(fixed), "script in the mount")
        assertOK(Harness.sh("cd \(plain) && " + fixed), "script in a plain directory")
        assertOK(Harness.sh("diff -r --no-dereference \(plain) \(vault.mountpoint)"), "diff -r")
        let listing = "find . -printf '%p %s %m %n %y %l\\n' | sort"
        let a = Harness.sh("cd \(plain) && \(listing)"), b = vault.sh(listing)
        XCTAssertEqual(a.stdout, b.stdout)
        XCTAssertEqual(vault.sh("stat -c %Y dir/moved.txt").stdout, "981173106\n")
    }

    func testTarCreateAndExtractOfARealTree() {
        let vault = mountedVault()
        assertOK(vault.sh("tar -C /usr/include -cf - linux | tar -xf - && diff -r /usr/include/linux linux"), "tar extract into the mount")
        assertOK(vault.sh("tar -cf \(scratch.path)/out.tar linux && mkdir \(scratch.path)/x && tar -C \(scratch.path)/x -xf \(scratch.path)/out.tar && diff -r linux \(scratch.path)/x/linux"),
                 "tar create from the mount")
    }

    func testRsyncWithHardLinksAndXattrs() {
        let vault = mountedVault()
        let src = scratch.mkdir("src")
        assertOK(Harness.sh("""
            cd \(src) && cp -a /usr/include/linux/netfilter . && echo one > f && ln f f2 && ln -s f s
            setfattr -n user.tag -v blue f && mkfifo pipe
            """), "source tree")
        assertOK(Harness.sh("rsync -aHX \(src)/ \(vault.mountpoint)/copy/"), "rsync -aHX")
        // diff cannot compare FIFOs; the FIFO's type is checked below.
        assertOK(Harness.sh("diff -r --no-dereference -x pipe \(src) \(vault.mountpoint)/copy"), "diff")
        XCTAssertEqual(vault.sh("stat -c %h copy/f").stdout, "2\n")
        XCTAssertEqual(vault.sh("stat -c '%i' copy/f copy/f2 | uniq | wc -l").stdout, "1\n", "hard link kept")
        XCTAssertEqual(vault.sh("getfattr --only-values -n user.tag copy/f").stdout, "blue")
        XCTAssertEqual(vault.sh("stat -c %F copy/pipe").stdout, "fifo\n")
        // A second run finds nothing to do.
        XCTAssertEqual(Harness.sh("rsync -aHXi \(src)/ \(vault.mountpoint)/copy/").stdout, "")
    }

    func testGitRepositoryLifecycle() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@e GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@e
            git init -q repo && cd repo
            cp -a /usr/include/linux/netfilter . && git add -A && git commit -qm one
            echo change >> netfilter/x_tables.h && git commit -qam two
            git log --oneline | wc -l | grep -x 2 > /dev/null
            git gc -q && git fsck --strict --no-progress
            git status --porcelain | wc -l | grep -x 0 > /dev/null
            """), "git")
    }

    func testSqliteWALWithConcurrentReaders() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            sq() { sqlite3 -cmd '.timeout 10000' "$@"; }
            sq db 'PRAGMA journal_mode=WAL;' 'CREATE TABLE t(i INTEGER PRIMARY KEY, v TEXT);' >/dev/null
            ( for i in $(seq 1 40); do sq db "BEGIN; INSERT INTO t(v) SELECT hex(randomblob(200)) FROM (SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5); COMMIT;"; done ) &
            writer=$!
            for r in 1 2 3; do ( for i in $(seq 1 30); do sq db 'SELECT count(*) FROM t;' >/dev/null; done ) & done
            wait $writer; wait
            sq db 'SELECT count(*) FROM t;' | grep -x 200 > /dev/null
            sq db 'PRAGMA integrity_check;' | grep -x ok > /dev/null
            """), "sqlite3 WAL")
    }

    func testEditorStyleSaveReplacesAtomically() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            printf 'version 1\\n' > doc.txt
            python3 - <<'PY'
            import os
            fd = os.open("doc.txt.swp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, b"version 2\\n" * 1000)
            os.fsync(fd); os.close(fd)
            os.rename("doc.txt.swp", "doc.txt")
            d = os.open(".", os.O_RDONLY); os.fsync(d); os.close(d)
            PY
            test "$(head -1 doc.txt)" = "version 2" && test "$(wc -l < doc.txt)" = 1000 && test ! -e doc.txt.swp
            """), "editor save")
    }

    func testFioRandomWritesVerify() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            fio --name=verify --filename=fio.dat --size=24m --rw=randwrite --bsrange=1k-64k \
                --ioengine=psync --verify=crc32c --do_verify=1 --verify_fatal=1 --numjobs=1 --output=/dev/null
            fio --name=again --filename=fio.dat --size=24m --rw=randrw --bs=4k --ioengine=psync \
                --verify=crc32c --verify_fatal=1 --numjobs=1 --output=/dev/null
            """), "fio with verification")
    }
}

// End-to-end: what an attacker or a disk fault does to CIPHERDIR is reported, never
// shown as wrong data; and nothing readable is stored there.
import Foundation
import XCTest

final class MountDamageTests: EndToEndCase {
    /// The backing path of the single regular file in CIPHERDIR's root besides the config.
    func backingFile(_ vault: MountedVault) -> String {
        Harness.sh("find \(vault.cipherdir) -maxdepth 1 -type f ! -name 'coffer.*'").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func testNoPlaintextNameOrContentInCipherdir() {
        let vault = mountedVault()
        assertOK(vault.sh("""
            mkdir -p SecretProjectDir/deeper && echo 'MARKER-CONTENT-7f3a' > SecretProjectDir/deeper/SecretFileName.txt
            ln -s SecretLinkTarget SecretLinkName && setfattr -n user.SecretAttrName -v SecretAttrValue SecretProjectDir
            head -c 100000 /dev/zero | tr '\\0' 'Q' > zeros.txt
            """), "write")
        let grep = Harness.sh("grep -r -a -l -e Secret -e MARKER-CONTENT -e QQQQQQQQ \(vault.cipherdir); find \(vault.cipherdir) -name '*Secret*'; getfattr -R -d \(vault.cipherdir) 2>/dev/null | grep -i secret; true")
        XCTAssertEqual(grep.stdout, "", "plaintext found in CIPHERDIR")
    }

    func testTamperedBlockIsEIOForThatBlockOnly() {
        let vault = mountedVault()
        assertOK(vault.sh("head -c 20000 /dev/urandom > data && cp data /tmp/data.$PPID"), "write")
        vault.unmount()
        let file = backingFile(vault)
        // Flip one byte inside block 2 (plaintext 8192…12287).
        assertOK(Harness.flipByte(of: file, at: 34 + 2 * 4136 + 100), "tamper")
        vault.mount()
        let bad = vault.sh("dd if=data bs=4096 skip=2 count=1 status=none")
        XCTAssertNotEqual(bad.status, 0)
        XCTAssertTrue(bad.stderr.contains("Input/output error"), bad.stderr)
        assertOK(vault.sh("cmp <(head -c 8192 data) <(head -c 8192 /tmp/data.$PPID) && cmp <(tail -c +12289 data) <(tail -c +12289 /tmp/data.$PPID); rm -f /tmp/data.$PPID"),
                 "other blocks still read")
        XCTAssertTrue(vault.log.contains("damage: /data") && vault.log.contains("block 2"), vault.log)
    }

    func testForeignOrTamperedNameIsHiddenAndLogged() {
        let vault = mountedVault()
        assertOK(vault.sh("echo a > visible"), "write")
        Harness.sh("touch \(vault.cipherdir)/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA \(vault.cipherdir)/not-base64")
        let listing = vault.sh("ls -A")
        XCTAssertEqual(listing.stdout, "visible\n")
        XCTAssertEqual(listing.status, 0)
        XCTAssertTrue(vault.log.contains("entry hidden"), vault.log)
    }

    /// A vault whose daemon and fsck take no directory without its IV file for one a
    /// sync engine is still filling (DirectoryIV.arrivalWindow): these directories lose
    /// their IV files seconds after they were made.
    func vaultWithoutArrivals() -> MountedVault {
        let vault = MountedVault(scratch: scratch)
        vault.environment = ["COFFER_ARRIVAL_WINDOW": "0"]
        vault.mount()
        return vault
    }

    func testMissingDirectoryIVIsEIOForThatDirectory() {
        let vault = vaultWithoutArrivals()
        assertOK(vault.sh("mkdir d && echo x > d/f && mkdir ok && echo y > ok/g"), "write")
        // Inode numbers are the backing file system's: they find d's backing directory.
        let inode = vault.sh("stat -c %i d").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        vault.unmount()
        assertOK(Harness.sh("rm \"$(find \(vault.cipherdir) -inum \(inode))/coffer.diriv\""), "remove d's IV")
        vault.mount()
        let r = vault.sh("ls d")
        XCTAssertNotEqual(r.status, 0)
        XCTAssertTrue(r.stderr.contains("Input/output error"), r.stderr)
        XCTAssertEqual(vault.sh("cat ok/g").stdout, "y\n", "the other directory still works")
    }

    /// A directory's IV file, a class file or a key record replaced by a file larger than
    /// any coffer writes is damage like any other: EIO (not EFBIG) and a log line, and fsck
    /// says so (the fuzzer, scripts/fuzz-cipherdir, found EFBIG served).
    func testAnOversizedIVFileIsEIOForThatDirectory() {
        let vault = vaultWithoutArrivals()
        assertOK(vault.sh("mkdir d && echo x > d/f && mkdir ok && echo y > ok/g"), "write")
        let inode = vault.sh("stat -c %i d").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        vault.unmount()
        assertOK(Harness.sh("f=\"$(find \(vault.cipherdir) -inum \(inode))/coffer.diriv\"; chmod 600 \"$f\"; head -c 100 /dev/urandom > \"$f\""), "grow d's IV file")
        vault.mount()
        let r = vault.sh("ls d")
        XCTAssertNotEqual(r.status, 0)
        XCTAssertTrue(r.stderr.contains("Input/output error"), r.stderr)
        XCTAssertTrue(vault.log.contains("larger than an IV file"), vault.log)
        XCTAssertEqual(vault.sh("cat ok/g").stdout, "y\n", "the other directory still works")
        vault.unmount()
        XCTAssertEqual(vault.fsck().status, 40)
    }

    func testTruncatedBackingFileIsReported() {
        let vault = mountedVault()
        assertOK(vault.sh("head -c 10000 /dev/urandom > data"), "write")
        vault.unmount()
        let file = backingFile(vault)
        assertOK(Harness.sh("truncate -s -100 '\(file)'"), "cut")
        vault.mount()
        let r = vault.sh("cat data > /dev/null")
        XCTAssertNotEqual(r.status, 0)
        XCTAssertTrue(r.stderr.contains("Input/output error"), r.stderr)
        // Format 4 authenticates the length: a cut file is refused at open, not served
        // as a shorter one (formats 1–3 served the whole blocks before the cut).
        XCTAssertTrue(vault.sh("head -c 4096 data").stderr.contains("Input/output error"), "a cut file is refused at open")
        assertOK(vault.sh(": > data && echo fresh > data && cat data"), "a damaged file can be emptied and rewritten")
    }

    /// The backing path of the entry with inode number `inode` (inode numbers are the
    /// backing file system's).
    func backingPath(_ vault: MountedVault, inode: String) -> String {
        Harness.sh("find \(vault.cipherdir) -inum \(inode.trimmingCharacters(in: .whitespacesAndNewlines))").stdout
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Every name operation that meets a damaged directory IV answers EIO and logs a
    /// line naming the directory (FORMAT.md §9), not only a listing.
    func testDirectoryIVDamageIsLoggedForEveryNameOperation() {
        let vault = vaultWithoutArrivals()
        assertOK(vault.sh("mkdir d && echo x > d/f && mkdir d/e"), "write")
        let inode = vault.sh("stat -c %i d").stdout
        vault.unmount()
        assertOK(Harness.sh("f='\(backingPath(vault, inode: inode))/coffer.diriv' && chmod 600 \"$f\" && truncate -s 5 \"$f\""), "cut d's IV")
        vault.mount()
        for step in ["cat d/f", "touch d/new", "mkdir d/new", "ln -s x d/new", "rm d/f", "rmdir d/e", "mv d/f d/g", "mv d/f g"] {
            let before = vault.log.components(separatedBy: "damage: /d (").count
            let r = vault.sh(step)
            XCTAssertNotEqual(r.status, 0, step)
            XCTAssertTrue(r.stderr.contains("Input/output error"), "\(step): \(r.stderr)")
            XCTAssertGreaterThan(vault.log.components(separatedBy: "damage: /d (").count, before, "\(step) left no log line:\n\(vault.log)")
        }
        XCTAssertTrue(vault.log.contains("directory IV damaged"), vault.log)
    }

    /// A backing file whose length cannot be (a last block cut inside its overhead,
    /// bytes appended after whole blocks, a header cut short) is EIO with a log line,
    /// never served as the whole blocks before the cut.
    func testImpossibleBackingLengthsAreEIOAndLogged() {
        let vault = mountedVault()
        assertOK(vault.sh("head -c 10000 /dev/urandom > cut && head -c 8192 /dev/urandom > appended && echo tiny > header"), "write")
        let inodes = vault.sh("stat -c %i cut appended header").stdout.split(separator: "\n").map(String.init)
        vault.unmount()
        let (cut, appended, header) = (backingPath(vault, inode: inodes[0]), backingPath(vault, inode: inodes[1]), backingPath(vault, inode: inodes[2]))
        assertOK(Harness.sh("""
            truncate -s $((34 + 2 * 4136 + 20)) '\(cut)'
            head -c 30 /dev/urandom >> '\(appended)'
            truncate -s 10 '\(header)'
            """), "damage the lengths")
        vault.mount()
        for name in ["cut", "appended", "header"] {
            let r = vault.sh("cat \(name) > /dev/null")
            XCTAssertNotEqual(r.status, 0, "\(name) was served")
            XCTAssertTrue(r.stderr.contains("Input/output error"), "\(name): \(r.stderr)")
            XCTAssertTrue(vault.log.contains("damage: /\(name) ("), "\(name) not logged:\n\(vault.log)")
        }
        XCTAssertTrue(vault.log.contains("file truncated"), vault.log)
        assertOK(vault.sh(": > cut && echo fresh > cut && test \"$(cat cut)\" = fresh"), "a damaged file can be emptied and rewritten")
    }

    /// A long symlink target's sidecar that was altered is EIO in the mount (logged) and
    /// damage for fsck; one that no symlink names is reported as a harmless leftover.
    func testDamagedAndOrphanSymlinkTargetSidecars() {
        let vault = mountedVault()
        assertOK(vault.sh("ln -s \"$(head -c 4000 /dev/zero | tr '\\0' a)\" a && ln -s \"$(head -c 3500 /dev/zero | tr '\\0' b)\" b"), "long links")
        let inodes = vault.sh("stat -c %i a b").stdout.split(separator: "\n").map(String.init)
        vault.unmount()
        let (a, b) = (backingPath(vault, inode: inodes[0]), backingPath(vault, inode: inodes[1]))
        assertOK(Harness.sh("""
            s="\(vault.cipherdir)/$(readlink '\(a)')" && chmod 600 "$s" && \(Harness.flipByte) "$s" 100
            rm '\(b)'
            """), "alter a's sidecar, remove b's link")
        let fsck = Harness.run([Harness.coffer, "fsck", "--passfile", vault.passfile, vault.cipherdir])
        XCTAssertNotEqual(fsck.status, 0)
        let report = fsck.stdout + fsck.stderr
        XCTAssertTrue(report.contains("/a: symlink-target sidecar coffer.target."), report)
        XCTAssertTrue(report.contains("leftover: /<coffer.target.") && report.contains("orphan symlink-target sidecar (harmless)"), report)
        vault.mount()
        let r = vault.sh("readlink -v a")
        XCTAssertNotEqual(r.status, 0)
        XCTAssertTrue(r.stderr.contains("Input/output error"), r.stderr)
        XCTAssertTrue(vault.log.contains("damage: /a ("), vault.log)
    }
}

// End-to-end: what an attacker who can write CIPHERDIR (a cloud provider, a sync peer,
// a shared server) can no longer do undetected in a format-4 vault — content copied or
// moved to another name or directory, swapped within one, a file cut at any byte — and
// in a format-5 vault — a directory's contents served under another directory's name,
// through a planted IV file — and what keeps working: coffer's own renames, hard links,
// conflict copies, and a header or IV file a crash left stale. Each attack is also run
// on the format before, where it passes silently: that is the difference the format
// makes (FORMAT.md §9's table).
import Foundation
import XCTest

final class IntegrityTests: EndToEndCase {
    /// A vault of `format` with files a/x, b/y, z and w (different contents), unmounted.
    func vaultWithFiles(_ format: Int) -> MountedVault {
        let vault = MountedVault(scratch: scratch, name: "f\(format)", initOptions: ["--format", "\(format)"])
        vault.mount()
        assertOK(vault.sh("""
            mkdir a b && echo 'content of a/x' > a/x && echo 'content of b/y' > b/y &&
            echo 'content of z' > z && echo 'content of w' > w &&
            head -c 8192 /dev/urandom > even && head -c 5000 /dev/urandom > odd
            """), "files")
        return vault
    }

    /// The backing paths of mount entries, found while mounted.
    func backing(_ vault: MountedVault, _ names: [String]) -> [String: String] {
        Dictionary(uniqueKeysWithValues: names.map { ($0, vault.backingPath(of: $0)) })
    }

    /// Runs `attack` on the backing directory while unmounted (no cache hides it), mounts
    /// again and returns what reading `name` gives.
    func afterAttack(_ vault: MountedVault, read name: String, _ attack: String) -> Outcome {
        vault.unmount()
        assertOK(Harness.sh(attack), "attack")
        vault.mount()
        return vault.sh("cat '\(name)' | od -c | head -2")
    }

    /// Mounts, reads `name`, unmounts and runs fsck: what the read and fsck gave.
    func readThenCheck(_ vault: MountedVault, _ name: String) -> (read: Outcome, fsck: Outcome) {
        vault.mount()
        let read = vault.sh("cat '\(name)'")
        vault.unmount()
        return (read, vault.fsck())
    }

    func testContentCopiedOrMovedToAnotherNameOrDirectoryIsRefused() {
        let vault = vaultWithFiles(4)
        let paths = backing(vault, ["a/x", "b/y", "z", "w"])
        // 1. a/x's content copied over b/y (the audit's finding: another directory).
        let copied = afterAttack(vault, read: "b/y", "cat '\(paths["a/x"]!)' > '\(paths["b/y"]!)'")
        XCTAssertTrue(copied.stderr.contains("Input/output error"), "copied content is refused: \(copied.stdout)")
        XCTAssertFalse(copied.stdout.contains("content of a/x"))
        XCTAssertTrue(vault.log.contains("damage: /b/y"), vault.log)
        XCTAssertTrue(vault.log.contains("belongs to another name or directory"), vault.log)
        // 2. Two files of one directory swap contents (names stay, contents move).
        let swapped = afterAttack(vault, read: "z", """
            cp '\(paths["z"]!)' /tmp/coffer-swap.$$ && cp '\(paths["w"]!)' '\(paths["z"]!)' && cp /tmp/coffer-swap.$$ '\(paths["w"]!)' && rm /tmp/coffer-swap.$$
            """)
        XCTAssertTrue(swapped.stderr.contains("Input/output error"), "swapped content is refused: \(swapped.stdout)")
        XCTAssertTrue(vault.sh("cat w").stderr.contains("Input/output error"))
        // 3. The backing file renamed over another name of another directory.
        vault.unmount()
        assertOK(Harness.sh("mv '\(paths["a/x"]!)' '\(paths["b/y"]!)'"), "move")
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 40, "fsck finds every misplaced file: \(fsck.stdout)\(fsck.stderr)")
        for name in ["/b/y", "/z", "/w"] {
            XCTAssertTrue(fsck.stdout.contains("damaged: \(name): its content belongs to another name or directory"), fsck.stdout)
        }
    }

    func testTheSameMovesPassSilentlyInAFormat3Vault() {
        let vault = vaultWithFiles(3)
        let paths = backing(vault, ["a/x", "b/y"])
        let copied = afterAttack(vault, read: "b/y", "cat '\(paths["a/x"]!)' > '\(paths["b/y"]!)'")
        XCTAssertEqual(copied.status, 0)
        XCTAssertTrue(copied.stdout.contains("c   o   n   t   e   n   t       o   f       a   /   x"), copied.stdout)
        vault.unmount()
        XCTAssertEqual(vault.fsck().status, 0, "format 3 binds content to its file ID only")
    }

    func testACutAtAnyByteIsDetected() {
        let vault = vaultWithFiles(4)
        let paths = backing(vault, ["even", "odd", "z"])
        // even: 8192 bytes, two whole blocks and an empty final block; odd: 5000 bytes.
        let cuts: [(String, String, Int)] = [
            ("even", paths["even"]!, 34 + 4136),        // at a block boundary
            ("odd", paths["odd"]!, 34 + 4136 + 40),     // the final block's bytes gone, 40 left
            ("z", paths["z"]!, 0),                      // nothing left
        ]
        vault.unmount()
        for (_, path, at) in cuts { assertOK(Harness.sh("truncate -s \(at) '\(path)'"), "cut") }
        vault.mount()
        for (name, _, at) in cuts {
            let read = vault.sh("cat \(name) > /dev/null")
            XCTAssertTrue(read.stderr.contains("Input/output error"), "\(name) cut at \(at) is refused: \(read.stderr)")
            XCTAssertTrue(vault.log.contains("damage: /\(name)"), vault.log)
        }
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 40, fsck.stdout + fsck.stderr)
        for (name, _, _) in cuts { XCTAssertTrue(fsck.stdout.contains("damaged: /\(name):"), fsck.stdout) }
    }

    /// fsck names each damaged block once: the final block, which it checks first (it
    /// authenticates the length), is not reported again by the walk over every block.
    func testFsckNamesEachDamagedBlockOnce() {
        let vault = vaultWithFiles(7)
        let paths = backing(vault, ["z", "odd"])
        vault.unmount()
        // z: one final block 0 (bytes 34…); odd: 5000 bytes, block 0 and final block 1.
        let flips = [(paths["z"]!, 34 + 30), (paths["odd"]!, 34 + 100), (paths["odd"]!, 34 + 4136 + 100)]
        for (path, at) in flips {
            assertOK(Harness.sh("python3 -c 'f = open(\"\(path)\", \"r+b\"); f.seek(\(at)); b = f.read(1); f.seek(\(at)); f.write(bytes([b[0] ^ 1]))'"),
                     "flip")
        }
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 40, fsck.stdout + fsck.stderr)
        let lines = fsck.stdout.split(separator: "\n").filter { $0.hasPrefix("damaged:") }.map(String.init)
        XCTAssertEqual(lines.sorted(), ["damaged: /odd: block 0 failed authentication", "damaged: /odd: block 1 failed authentication",
                                        "damaged: /z: block 0 failed authentication"], fsck.stdout)
    }

    func testACutAtABlockBoundaryPassesSilentlyInAFormat3Vault() {
        let vault = vaultWithFiles(3)
        let even = vault.backingPath(of: "even")
        vault.unmount()
        assertOK(Harness.sh("truncate -s \(18 + 4136) '\(even)'"), "cut")
        vault.mount()
        XCTAssertEqual(vault.sh("stat -c %s even").stdout.trimmingCharacters(in: .whitespacesAndNewlines), "4096",
                       "format 3 serves the cut file as a shorter one")
        vault.unmount()
        XCTAssertEqual(vault.fsck().status, 0)
    }

    func testRenamesLinksAndConflictCopiesKeepWorking() {
        let vault = vaultWithFiles(4)
        assertOK(vault.sh("""
            mv a/x a/x2 && mv a/x2 b/x3 && mv b/y y && chmod 444 z && mv z z2 && ln w b/w-link && ln b/w-link w-link2 &&
            python3 -c 'import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); \
            assert libc.renameat2(-100, b"y", -100, b"odd", 2) == 0, os.strerror(ctypes.get_errno())' &&
            echo new > fresh && : > empty && mv fresh a/ && mv empty b/
            """), "renames and links")
        let expected = "content of a/x\ncontent of b/y\ncontent of z\ncontent of w\ncontent of w\ncontent of w\nnew\n"
        let script = "cat b/x3 odd z2 w b/w-link w-link2 a/fresh b/empty && head -c 1 y > /dev/null"
        let before = vault.sh(script)
        XCTAssertEqual(before.stdout, expected, before.stderr)
        // A sync engine's conflict copy of b/x3 holds a version of b/x3: it opens.
        let x3 = vault.backingPath(of: "b/x3")
        vault.unmount()
        assertOK(Harness.sh("cp '\(x3)' '\(x3).sync-conflict-20261123-101500-ABCDEFG'"), "conflict copy")
        vault.mount()
        let after = vault.sh(script + " && cat b/x3.sync-conflict-20261123-101500-ABCDEFG")
        XCTAssertEqual(after.stdout, expected + "content of a/x\n", after.stderr)
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
        XCTAssertFalse(fsck.stdout.contains("damaged"), fsck.stdout)
    }

    /// Another directory's IV file planted as a conflict copy of a's (as a sync engine
    /// names one), with that directory's files copied beside it: format 4 serves b's
    /// files as a's, and its next change in a settles them there for good; format 5
    /// serves none of them, logs the planted copy as damage, settles nothing of it, and
    /// fsck reports it.
    func testAnIVFileOfAnotherDirectoryServesNothingOfIt() {
        let conflict = "coffer.sync-conflict-20260101-000000-ABCDEFG.diriv"
        for format in [4, 5] {
            let vault = vaultWithFiles(format)
            assertOK(vault.sh("echo 'content of b/only' > b/only"), "one more file")
            let a = vault.backingPath(of: "a"), b = vault.backingPath(of: "b")
            vault.unmount()
            assertOK(Harness.sh("""
                cp '\(b)/coffer.diriv' '\(a)/\(conflict)'
                for f in '\(b)'/*; do n=$(basename "$f"); [ "$n" = coffer.diriv ] || cp "$f" '\(a)'/"$n"; done
                """), "plant")
            vault.mount()
            let served = vault.sh("ls a | tr '\\n' ' '; cat a/only a/y 2>/dev/null || true; echo new > a/new && ls a | tr '\\n' ' '")
            if format == 4 {
                XCTAssertTrue(served.stdout.contains("content of b/only"), "format 4 serves b's files in a (FORMAT.md's residual): \(served.stdout)")
                continue
            }
            XCTAssertEqual(served.stdout, "x new x ", "nothing of b is served in a, before or after a change there: \(served.stdout)\(served.stderr)")
            XCTAssertEqual(vault.sh("cat a/x").stdout, "content of a/x\n")
            XCTAssertTrue(vault.log.contains("damage: /a (backing inode"), vault.log)
            XCTAssertTrue(vault.log.contains("\(conflict) belongs to another directory"), vault.log)
            vault.unmount()
            XCTAssertTrue(FileManager.default.fileExists(atPath: "\(a)/\(conflict)"), "the planted copy was not settled into a")
            let fsck = vault.fsck()
            XCTAssertEqual(fsck.status, 40, fsck.stdout + fsck.stderr)
            XCTAssertTrue(fsck.stdout.contains("damaged: /a/<\(conflict)>: directory IV damaged: \(conflict) belongs to another directory"), fsck.stdout)
            XCTAssertFalse(fsck.stdout.contains("conflict: /a/<\(conflict)>"), fsck.stdout)
        }
    }

    /// Two directories exchange their contents in CIPHERDIR (the backing directories'
    /// names swapped, IV files and all): format 4 serves b's files as a's; format 5
    /// refuses both directories (EIO, a log line naming each) and fsck reports them.
    func testDirectoriesThatExchangeTheirContentsAreRefused() {
        for format in [4, 5] {
            let vault = vaultWithFiles(format)
            let a = vault.backingPath(of: "a"), b = vault.backingPath(of: "b")
            vault.unmount()
            assertOK(Harness.sh("mv '\(a)' '\(a).swap' && mv '\(b)' '\(a)' && mv '\(a).swap' '\(b)'"), "swap")
            vault.mount()
            let listed = vault.sh("ls a; cat a/y || true")
            if format == 4 {
                XCTAssertEqual(listed.stdout, "y\ncontent of b/y\n", "format 4 serves b's contents as a's (FORMAT.md's residual)")
                continue
            }
            XCTAssertTrue(listed.stderr.contains("Input/output error"), listed.stdout + listed.stderr)
            XCTAssertFalse(listed.stdout.contains("content of b/y"), listed.stdout)
            XCTAssertTrue(vault.sh("ls b").stderr.contains("Input/output error"))
            XCTAssertTrue(vault.log.contains("damage: /a (backing inode"), vault.log)
            XCTAssertTrue(vault.log.contains("coffer.diriv belongs to another directory"), vault.log)
            vault.unmount()
            let fsck = vault.fsck()
            XCTAssertEqual(fsck.status, 40, fsck.stdout + fsck.stderr)
            for name in ["/a", "/b"] {
                XCTAssertTrue(fsck.stdout.contains("damaged: \(name): directory IV damaged: coffer.diriv belongs to another directory"), fsck.stdout)
            }
        }
    }

    /// A name that only reads like a copy (`doc (1).pdf`: a browser's second download)
    /// is bound to itself: the content of `doc.pdf` copied over it is refused, in
    /// format 4 as in 5. A sync engine's own conflict copy of doc.pdf still opens
    /// (testRenamesLinksAndConflictCopiesKeepWorking).
    func testContentOfAFileCopiedOverANameThatReadsAsItsCopyIsRefused() {
        let vault = vaultWithFiles(4)
        assertOK(vault.sh("echo 'the first' > 'doc.pdf' && echo 'the second' > 'doc (1).pdf'"), "downloads")
        let paths = backing(vault, ["doc.pdf", "doc (1).pdf"])
        let copied = afterAttack(vault, read: "doc (1).pdf", "cat '\(paths["doc.pdf"]!)' > '\(paths["doc (1).pdf"]!)'")
        XCTAssertTrue(copied.stderr.contains("Input/output error"), "copied content is refused: \(copied.stdout)")
        XCTAssertFalse(copied.stdout.contains("f   i   r   s   t"), copied.stdout)
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 40, fsck.stdout + fsck.stderr)
        XCTAssertTrue(fsck.stdout.contains("damaged: /doc (1).pdf: its content belongs to another name or directory"), fsck.stdout)
    }

    /// Renamed directories keep their contents readable, across a mount and by fsck
    /// (format 5 writes the IV file's new tag, on the disk, before the rename). A power
    /// cut that loses the rename after the tag was written leaves the directory at its
    /// old place with the new tag in front: the previous tag still fits there (rebuilt
    /// here by renaming the backing directory back). An IV file whose tags fit nowhere
    /// is refused.
    func testRenamedDirectoriesKeepWorkingAndARenameLostByACrashStillFits() {
        let vault = vaultWithFiles(5)
        assertOK(vault.sh("mkdir -p a/sub && echo deep > a/sub/f && mv a a2 && mv a2/sub b/sub2 && mv b b2 && chmod 555 b2/sub2"),
                 "directory renames")
        let old = vault.backingPath(of: "b2/sub2")
        assertOK(vault.sh("mv b2/sub2 sub3"), "the last rename")
        let new = vault.backingPath(of: "sub3")
        XCTAssertEqual(vault.sh("cat a2/x b2/y sub3/f").stdout, "content of a/x\ncontent of b/y\ndeep\n")
        vault.unmount()
        XCTAssertEqual(vault.fsck().status, 0)
        assertOK(Harness.sh("mv '\(new)' '\(old)'"), "the rename lost")
        let (back, fsck) = readThenCheck(vault, "b2/sub2/f")
        XCTAssertEqual(back.stdout, "deep\n", back.stderr)
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
        // Tags of no place it ever had: refused.
        assertOK(Harness.sh("""
            python3 -c 'import sys, os
            p = sys.argv[1] + "/coffer.diriv"; b = open(p, "rb").read(); assert len(b) == 48, len(b)
            os.chmod(p, 0o600); open(p, "wb").write(b[:16] + bytes(32)); os.chmod(p, 0o400)' '\(old)'
            """), "tags gone")
        vault.mount()
        XCTAssertTrue(vault.sh("cat b2/sub2/f").stderr.contains("Input/output error"))
        vault.unmount()
        XCTAssertEqual(vault.fsck().status, 40)
    }

    /// A power cut can keep a rename but not the header bytes written before it: the
    /// place xattr, a metadata change ordered before the rename, still opens the file.
    /// Rebuilt here by putting the old tag back into the header after a rename.
    func testAHeaderLeftStaleByARenameStillOpens() {
        let vault = vaultWithFiles(4)
        assertOK(vault.sh("mv z b/z-moved"), "rename")
        let moved = vault.backingPath(of: "b/z-moved")
        vault.unmount()
        assertOK(Harness.sh("""
            python3 -c 'import os, sys
            old = os.getxattr(sys.argv[1], "user.coffer.place")[:16]
            with open(sys.argv[1], "r+b") as f: f.seek(18); f.write(old)' '\(moved)'
            """), "stale header")
        let (read, fsck) = readThenCheck(vault, "b/z-moved")
        XCTAssertEqual(read.stdout, "content of z\n", read.stderr)
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
        XCTAssertTrue(fsck.stdout.contains("leftover: /b/z-moved: its header still names the place it had before a rename"), fsck.stdout)
        // Without the xattr, the stale header is what an attacker's move looks like.
        assertOK(Harness.sh("python3 -c 'import os, sys; os.removexattr(sys.argv[1], \"user.coffer.place\")' '\(moved)'"), "remove xattr")
        vault.mount()
        XCTAssertTrue(vault.sh("cat b/z-moved").stderr.contains("Input/output error"))
    }
}

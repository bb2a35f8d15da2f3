// End-to-end: another program writes CIPHERDIR while it is mounted, as a sync engine
// does — a backing file replaced by rename, created, deleted, renamed, cut or grown in
// place, conflict copies beside it — and the mount serves each change at the next
// access, keeps every write it acknowledges, and shows conflict copies under their own
// names. (The same with the real engine: SyncthingTests.)
import Foundation
import XCTest

final class OtherWritersTests: EndToEndCase {
    /// Bash functions for the scripts: `backing NAME` prints the backing name of mount
    /// entry NAME (found by inode number), `replace FROM TO` replaces backing entry TO
    /// by a copy of FROM the way sync engines do (temporary file, rename over),
    /// `elsewhere NAME CONTENT KEPT` makes CONTENT a version of mount entry NAME as
    /// another machine would have written it (bound to NAME's place, FORMAT.md §4), kept
    /// as backing entry KEPT, and then empties NAME again, and
    /// `soon COMMAND` runs COMMAND until it succeeds, for at most 10 s: the daemon learns
    /// of a change a moment after it is made (usually well before the next command), and
    /// promises to serve it within 1 s, which a loaded machine stretches (the bound here
    /// is for a daemon that never learns of it).
    let helpers = """
        backing() { find "$C" -maxdepth 1 -inum "$(stat -c %i "$M/$1")" -printf '%f\\n' | head -1; }
        replace() { cp -p "$C/$1" "$C/.syncthing.tmp" && mv "$C/.syncthing.tmp" "$C/$2"; }
        elsewhere() { printf '%s\n' "$2" > "$1" && cp -p "$(find "$C" -inum "$(stat -c %i "$M/$1")" | head -1)" "$C/$3" && : > "$1"; }
        soon() { local i; for i in $(seq 400); do eval "$1" 2>/dev/null && return 0; sleep 0.025; done; eval "$1"; }

        """

    func testAFileReplacedByRenameIsServedNewAtOnceAndAnAppendLandsInIt() {
        let vault = mountedVault()
        assertOK(vault.sh(helpers + """
            elsewhere f 'version 2 from the other machine' .other; echo 'version 1' > f
            cat f >/dev/null; stat f >/dev/null          # the kernel caches f's name, attributes and pages
            bf=$(backing f)
            replace .other "$bf"
            soon '[ "$(cat f)" = "version 2 from the other machine" ]' || { echo "stale: $(cat f)"; exit 1; }
            [ "$(stat -c %s f)" = 33 ] || { echo "stale size $(stat -c %s f)"; exit 1; }
            echo 'appended here' >> f
            """), "replace, read, append")
        vault.unmount()
        vault.mount()
        XCTAssertEqual(vault.sh("cat f").stdout, "version 2 from the other machine\nappended here\n",
                       "the append landed in the file that is there, not in the replaced one")
    }

    func testADescriptorOpenedBeforeAReplacementHasItsWritesRefused() {
        let vault = mountedVault()
        let r = vault.sh(helpers + """
            elsewhere f theirs .theirs; echo 'mine' > f
            bf=$(backing f); bo=.theirs
            python3 - "$M/f" "$C" "$bo" "$bf" <<'EOF'
            import errno, os, shutil, sys
            path, cipher, theirs, mine = sys.argv[1:]
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
            os.write(fd, b"before\\n")                    # acknowledged: lands in the file
            shutil.copy(os.path.join(cipher, theirs), os.path.join(cipher, ".tmp"))
            os.rename(os.path.join(cipher, ".tmp"), os.path.join(cipher, mine))
            try:
                os.write(fd, b"after\\n")
                print("write after the replacement was acknowledged")
            except OSError as e:
                print("refused:", errno.errorcode[e.errno])
            # The refused bytes landed nowhere: not even in the replaced file this
            # descriptor still reads.
            if b"after" in os.pread(fd, 100, 0): print("the refused write is in the replaced file")
            EOF
            soon '[ "$(cat f)" = theirs ]'; cat f
            """)
        assertOK(r, "write after replacement")
        XCTAssertTrue(r.stdout.hasPrefix("refused: ESTALE\ntheirs\n"), r.stdout + r.stderr)
        XCTAssertTrue(vault.log.contains("write refused (ESTALE): /f"), vault.log)
        XCTAssertFalse(vault.log.contains("unexpected"), "a refusal is no unexpected error: \(vault.log)")
        // A file unlinked through the mount keeps working on its open descriptor, as on ext4.
        assertOK(vault.sh("""
            python3 - "$M/g" <<'EOF'
            import os, sys
            fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
            os.unlink(sys.argv[1])
            os.write(fd, b"scratch"); os.fsync(fd)
            assert os.pread(fd, 7, 0) == b"scratch"
            EOF
            """), "open, unlink, write")
    }

    func testCreateDeleteAndRenameFromOutsideShowAtTheNextAccess() {
        let vault = mountedVault()
        assertOK(vault.sh(helpers + """
            elsewhere y one .y-renamed                    # x renamed to y on another machine
            echo one > x; echo two > y; echo three > z
            bx=$(backing x); by=$(backing y); bz=$(backing z)
            rm y; mv "$C/$bz" "$C/.away"
            soon '! cat z' || { echo "z still served after its deletion"; exit 1; }
            ! cat y 2>/dev/null                            # y is now cached as absent
            rm "$C/$bx"; mv "$C/.y-renamed" "$C/$by"         # renamed from outside: x is now y
            soon '[ "$(cat y)" = one ]' || { echo "y not found after it appeared"; exit 1; }
            soon '! stat x' || { echo "x still there after it was renamed away"; exit 1; }
            mv "$C/.away" "$C/$bz"
            soon '[ "$(cat z)" = three ]' || { echo "z not found after it came back"; exit 1; }
            [ "$(ls | tr '\\n' ' ')" = 'y z ' ] || { echo "listing: $(ls)"; exit 1; }
            """), "create, delete, rename outside")
    }

    func testAFileCutAndRestoredInPlaceIsServedAsItIsNow() {
        let vault = mountedVault()
        assertOK(vault.sh(helpers + """
            head -c 10000 /dev/urandom > f; sum1=$(md5sum < f)
            bf=$(backing f); cp "$C/$bf" "$C/.saved"
            truncate -s $((34 + 4136)) "$C/$bf"           # header and one whole block, cut in place
            soon '[ "$(stat -c %s f)" = 4096 ]' || { echo "size after the cut: $(stat -c %s f)"; exit 1; }
            ! cat f > /dev/null 2>&1 || { echo "a file cut at a block boundary was served"; exit 1; }
            cat "$C/.saved" > "$C/$bf"                        # rewritten in place, same inode
            soon '[ "$(stat -c %s f)" = 10000 ]' || { echo "size after the restore: $(stat -c %s f)"; exit 1; }
            [ "$(md5sum < f)" = "$sum1" ] || { echo "content after the restore differs"; exit 1; }
            rm "$C/.saved"
            """), "cut and restore in place")
    }

    func testConflictCopiesAreShownUnderTheirOwnNamesAndBehaveAsFiles() {
        let vault = mountedVault()
        let marker = ".sync-conflict-20261123-101500-ABCDEFG"
        assertOK(vault.sh(helpers + "mkdir d; elsewhere d/report.odt 'the loser' .loser; echo 'the winner' > d/report.odt"), "setup")
        // The copy is made in the backing directory of d.
        let r = vault.sh(helpers + """
            D=$(find "$C" -mindepth 1 -maxdepth 1 -type d ! -name '.*' -printf '%f'); C="$C/$D"
            br=$(backing d/report.odt); cd d
            mv "$C/../.loser" "$C/$br\(marker)"
            mv "$C/$br" "$C/.keep"; cp "$C/.keep" "$C/$br"; rm "$C/.keep"   # sync engines also touch the winner
            echo "--- listing"; ls
            echo "--- original"; cat report.odt
            echo "--- copy"; cat 'report\(marker).odt'
            """)
        assertOK(r, "conflict copy")
        XCTAssertEqual(r.stdout, """
            --- listing
            report.odt
            report\(marker).odt
            --- original
            the winner
            --- copy
            the loser

            """)
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
        XCTAssertTrue(fsck.stdout.contains("conflict: /d/report\(marker).odt: a sync engine's conflict copy"), fsck.stdout)
        vault.mount()
        assertOK(vault.sh("""
            cd d
            mv 'report\(marker).odt' report-theirs.odt
            [ "$(cat report-theirs.odt)" = 'the loser' ]
            [ "$(ls | tr '\\n' ' ')" = "report-theirs.odt report.odt " ] || { ls; exit 1; }
            # A name that looks like a copy's, made through the mount, is an ordinary name.
            echo mine > 'notes (1).txt'; [ "$(cat 'notes (1).txt')" = mine ]
            cd ..; rm -rf d; [ -z "$(ls)" ]
            """), "rename, list, rm -rf")
    }

    /// Issue 37, item 1: a directory another program makes before the files in it, its
    /// IV file among them and last (as Syncthing may pull them), is served as empty until
    /// the IV file comes — no EIO, no damage line while a reader lists and reads it in a
    /// loop — and then whole. An entry made in it meanwhile gives it an IV of its own,
    /// and the one that arrives (kept by the engine as a conflict copy) is served beside
    /// it. A directory left without its IV file past the arrival window is damage, as
    /// before; fsck says which directories are still arriving.
    func testADirectoryArrivingBeforeItsIVIsServedEmptyUntilTheIVComes() {
        // A short arrival window for the daemon and fsck: a directory's change time
        // cannot be set back to make one stale.
        let vault = MountedVault(scratch: scratch)
        vault.environment = ["COFFER_ARRIVAL_WINDOW": "10"]  // wide enough for a loaded machine
        vault.mount()
        let marker = ".sync-conflict-20261126-000000-ABCDEFG"
        assertOK(vault.sh(helpers + """
            mkdir src; for i in $(seq 30); do echo "file $i" > src/f$i; done
            bs=$(backing src); mv "$C/$bs" "$C/../incoming"
            soon '[ ! -e src ]'
            mkdir "$C/$bs"                                        # the directory comes first
            soon '[ -d src ]'
            : > "$C/../errs"
            ( while [ ! -e "$C/../stop" ]; do
                ls src > /dev/null 2>> "$C/../errs" || true
                for f in $(ls src 2>/dev/null); do cat "src/$f" > /dev/null 2>> "$C/../errs" || true; done
              done ) &
            for f in "$C/../incoming"/*; do
              n=$(basename "$f"); [ "$n" = coffer.diriv ] || { cp "$f" "$C/$bs/.tmp" && mv "$C/$bs/.tmp" "$C/$bs/$n"; }; sleep 0.01
            done
            [ -z "$(ls src)" ] || { echo "names shown before the IV file came"; ls src; exit 1; }
            cp "$C/../incoming/coffer.diriv" "$C/$bs/.tmp" && mv "$C/$bs/.tmp" "$C/$bs/coffer.diriv"   # the IV file last
            soon '[ "$(ls src | wc -l)" = 30 ]' || { ls src; exit 1; }
            [ "$(cat src/f7)" = "file 7" ]
            touch "$C/../stop"; wait
            [ ! -s "$C/../errs" ] || { echo "errors while the directory arrived:"; cat "$C/../errs"; exit 1; }
            rm -rf "$C/../incoming" "$C/../errs" "$C/../stop"

            mkdir two; echo 'made there' > two/theirs; bt=$(backing two); mv "$C/$bt" "$C/../there"
            soon '[ ! -e two ]'
            mkdir "$C/$bt"; soon '[ -d two ]'
            echo 'made here' > two/mine                           # made while the directory arrives
            mv "$C/../there/coffer.diriv" "$C/$bt/coffer\(marker).diriv"
            mv "$C/../there"/* "$C/$bt/"; rmdir "$C/../there"
            soon '[ "$(ls two | tr "\\n" " ")" = "mine theirs " ]' || { ls two; exit 1; }
            [ "$(cat two/theirs) $(cat two/mine)" = "made there made here" ]

            mkdir stale; bo=$(backing stale); rm "$C/$bo/coffer.diriv"
            sleep 10.5                                            # past the arrival window
            mkdir young; by=$(backing young); rm "$C/$by/coffer.diriv"
            case "$(ls stale 2>&1 || true)" in *'Input/output error'*) ;; *) echo "a directory without its IV past the window is not damage"; exit 1 ;; esac
            [ -z "$(ls young)" ]
            """), "arriving directories")
        let young = vault.backingPath(of: "young")
        XCTAssertFalse(vault.log.contains("damage: /src"), vault.log)
        XCTAssertFalse(vault.log.contains("damage: /two"), vault.log)
        XCTAssertFalse(vault.log.contains("damage: /young"), vault.log)
        XCTAssertTrue(vault.log.contains("damage: /stale"), vault.log)
        vault.unmount()
        assertOK(Harness.sh("touch '\(young)'"), "still arriving")
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 40, fsck.stdout + fsck.stderr)
        XCTAssertTrue(fsck.stdout.contains("damaged: /stale: directory IV damaged: coffer.diriv is missing"), fsck.stdout)
        XCTAssertTrue(fsck.stdout.contains("arriving: /young: a directory another program is still filling"), fsck.stdout)
        XCTAssertTrue(fsck.stdout.contains("1 directory still arriving"), fsck.stdout)
    }

    /// An IV file that arrives while the daemon is finding it missing (between its read
    /// and its look at whether the directory is arriving) is read, not damage: readers
    /// list an arriving directory in a loop while its IV file comes and goes 300 times.
    func testAnIVFileArrivingDuringItsReadIsNotDamage() {
        let vault = mountedVault()
        assertOK(vault.sh(helpers + """
            mkdir d; echo x > d/f; bd=$(backing d)
            python3 - "$M/d" "$C/$bd/coffer.diriv" "$C/../away" <<'EOF'
            import os, sys, threading, time
            view, iv, away = sys.argv[1:]
            stop = False
            def list_forever():
                while not stop:
                    try: os.listdir(view)
                    except OSError: pass
            readers = [threading.Thread(target=list_forever) for _ in range(2)]
            for r in readers: r.start()
            for _ in range(300):
                os.rename(iv, away); time.sleep(0.003)
                os.rename(away, iv); time.sleep(0.003)
            stop = True
            for r in readers: r.join()
            EOF
            """), "an IV file that comes and goes")
        XCTAssertFalse(vault.log.contains("damage"), vault.log)
    }

    /// An engine that keeps one side of a conflict (Unison's prefer, rclone bisync's
    /// conflict-loser delete) replaces the IV file coffer gave an arriving directory with
    /// the one it arrives with, instead of keeping both: the file made here stays readable
    /// beside the arrived ones (under coffer's kept copy of its IV), settles under the
    /// arrived IV at the next change, and fsck finds no damage.
    func testAnArrivingIVFileThatReplacesCoffersHidesNothingMadeHere() {
        let vault = MountedVault(scratch: scratch)
        vault.environment = ["COFFER_ARRIVAL_WINDOW": "10"]
        vault.mount()
        assertOK(vault.sh(helpers + """
            mkdir two; echo 'made there' > two/theirs; bt=$(backing two); mv "$C/$bt" "$C/../there"
            soon '[ ! -e two ]'
            mkdir "$C/$bt"; soon '[ -d two ]'
            echo 'made here' > two/mine                           # made while the directory arrives
            cp "$C/../there/coffer.diriv" "$C/$bt/.tmp" && mv -f "$C/$bt/.tmp" "$C/$bt/coffer.diriv"   # replaces coffer's
            rm "$C/../there/coffer.diriv"; mv "$C/../there"/* "$C/$bt/"; rmdir "$C/../there"
            soon '[ "$(ls two | tr "\n" " ")" = "mine theirs " ]' || { ls two; exit 1; }
            [ "$(cat two/theirs) $(cat two/mine)" = "made there made here" ]
            echo 'a change' > two/third                           # settles the directory on one IV
            [ "$(ls two | tr "\n" " ")" = "mine theirs third " ] || { ls two; exit 1; }
            [ "$(cat two/mine)" = "made here" ]
            [ ! -e "$C/$bt/coffer.kept.diriv" ] || { echo "the kept copy outlived the settlement"; exit 1; }
            """), "an arriving IV replaces coffer's")
        XCTAssertFalse(vault.log.contains("damage"), vault.log)
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
    }

    func testADirectoryMadeOnTwoMachinesKeepsEveryFileAndSettlesOnOneIV() {
        let vault = mountedVault()
        let marker = ".sync-conflict-20261123-101500-ABCDEFG"
        // What a sync engine leaves when both machines made d/: one machine's IV file, the
        // other's as a conflict copy, and the files of both, each named under its own IV.
        // The other machine's d is made here first and taken out of the vault, then d is
        // made again (the same place: a format-5 IV file is bound to it) and merged.
        assertOK(vault.sh(helpers + """
            mkdir d; echo 'changed there' > d/theirs.txt; bd=$(backing d)
            tb=$(find "$C/$bd" -inum "$(stat -c %i d/theirs.txt)" -printf '%f')
            cp "$C/$bd/$tb" "$C/../theirs.v2"                  # a later version, for the watch below
            echo 'made there' > d/theirs.txt; echo 'there' > d/both.txt; mkdir d/sub; echo 'deep there' > d/sub/x
            mv "$C/$bd" "$C/../there"
            soon '[ ! -e d ]'
            mkdir d; echo 'made here' > d/mine.txt; echo 'here' > d/both.txt; mkdir d/sub; echo 'deep here' > d/sub/y
            [ "$(backing d)" = "$bd" ] || { echo "d has another backing name"; exit 1; }
            for f in "$C/../there"/*; do
              case "$(basename "$f")" in coffer.diriv) mv "$f" "$C/$bd/coffer\(marker).diriv" ;;
                *) n=$(basename "$f"); [ -e "$C/$bd/$n" ] && { echo "name clash"; exit 1; }; mv "$f" "$C/$bd/$n" ;; esac
            done
            rmdir "$C/../there"
            # A name made on both machines is shown once each, the other machine's under
            # the name it will settle to, and both are reached (issue 37, item 2).
            soon '[ "$(ls d | tr "\\n" " ")" = "both (1).txt both.txt mine.txt sub sub (1) theirs.txt " ]' || { ls d; exit 1; }
            [ "$(cat d/theirs.txt)" = 'made there' ]
            [ "$(cat d/mine.txt)" = 'made here' ]
            [ "$(cat d/both.txt) $(cat 'd/both (1).txt')" = 'here there' ]
            [ "$(cat d/sub/y) $(cat 'd/sub (1)/x')" = 'deep here deep there' ]
            [ "$(ls d/sub) $(ls 'd/sub (1)')" = 'y x' ]
            # Another program changes an entry named under the other IV once the kernel
            # may keep names here for long: the watch decodes it and the change shows.
            sleep 2.2; cat d/theirs.txt > /dev/null
            cp "$C/../theirs.v2" "$C/$bd/.incoming" && mv "$C/$bd/.incoming" "$C/$bd/$tb"; rm "$C/../theirs.v2"
            soon '[ "$(cat d/theirs.txt)" = "changed there" ]' || { echo "the change under the other IV is not served"; exit 1; }
            """), "a split directory is served whole")
        vault.unmount()
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
        XCTAssertTrue(fsck.stdout.contains("conflict: /d/<coffer\(marker).diriv>: the directory was made on two machines"), fsck.stdout)
        vault.mount()
        assertOK(vault.sh(helpers + """
            echo new > d/new.txt                               # the next change settles d on one IV
            bd=$(backing d)
            [ -z "$(ls "$C/$bd" | grep sync-conflict)" ] || { echo "IV copy still there"; ls "$C/$bd"; exit 1; }
            soon '[ "$(ls d | tr "\\n" " ")" = "both (1).txt both.txt mine.txt new.txt sub sub (1) theirs.txt " ]' || { ls d; exit 1; }
            [ "$(cat d/sub/y) $(cat 'd/sub (1)/x')" = 'deep here deep there' ]
            [ "$(cat d/theirs.txt)" = 'changed there' ]
            [ "$(cat d/both.txt 'd/both (1).txt' | sort | tr '\\n' ' ')" = "here there " ]
            """), "settled")
        vault.unmount()
        let after = vault.fsck()
        XCTAssertEqual(after.status, 0, after.stdout + after.stderr)
        XCTAssertFalse(after.stdout.contains("conflict:"), after.stdout)
        vault.mount()
        XCTAssertEqual(vault.sh("cat d/both.txt 'd/both (1).txt' | sort | tr '\\n' ' '").stdout, "here there ")
    }

    func testAPassphraseChangedOnTwoMachinesLeavesBothWorkingUntilTheNextPasswd() {
        let vault = MountedVault(scratch: scratch)
        let (c, b, d) = (scratch.file("c.pass", "passphrase C\n"), scratch.file("b.pass", "passphrase B\n"),
                         scratch.file("d.pass", "passphrase D\n"))
        let copy = "coffer.sync-conflict-20261123-101500-ABCDEFG.conf"
        // Machine 2 changes the passphrase to C, machine 1 to B; the engine keeps B's
        // config and C's as a conflict copy.
        assertOK(Harness.sh("""
            cd '\(vault.cipherdir)'; cp -p coffer.conf ../before.conf
            '\(Harness.coffer)' passwd --passfile '\(vault.passfile)' --new-passfile '\(c)' .
            cp -p coffer.conf ../c.conf; rm -f coffer.conf; cp -p ../before.conf coffer.conf
            '\(Harness.coffer)' passwd --passfile '\(vault.passfile)' --new-passfile '\(b)' .
            cp -p ../c.conf '\(copy)'
            """), "passwd on two machines")
        let info = Harness.run([Harness.coffer, "info", vault.cipherdir])
        XCTAssertTrue(info.stdout.contains("either passphrase unlocks"), info.stdout)
        for pass in [b, c] {
            let r = Harness.run([Harness.coffer, "mount", "--passfile", pass, vault.cipherdir, vault.mountpoint])
            XCTAssertEqual(r.status, 0, r.stderr)
            XCTAssertTrue(Harness.run([Harness.coffer, "status", vault.mountpoint]).stdout.contains("unlocked"))
            vault.unmount()
        }
        let fsck = Harness.run([Harness.coffer, "fsck", "--passfile", c, vault.cipherdir])
        XCTAssertEqual(fsck.status, 0, fsck.stdout + fsck.stderr)
        XCTAssertTrue(fsck.stdout.contains("conflict: /<\(copy)>"), fsck.stdout)
        // The next passwd settles it: only the new passphrase opens the vault.
        assertOK(Harness.run([Harness.coffer, "passwd", "--passfile", c, "--new-passfile", d, vault.cipherdir]), "passwd")
        XCTAssertFalse(FileManager.default.fileExists(atPath: vault.cipherdir + "/" + copy))
        XCTAssertEqual(Harness.run([Harness.coffer, "fsck", "--passfile", c, vault.cipherdir]).status, 22)
        XCTAssertEqual(Harness.run([Harness.coffer, "fsck", "--passfile", d, vault.cipherdir]).status, 0)
    }

    func testWithoutWatchesAChangeShowsWithinOneSecond() {
        let vault = mountedVault("vault", ["--watch-limit", "0"])
        assertOK(vault.sh(helpers + """
            elsewhere f 'version 2' .other; echo 'version 1' > f
            cat f >/dev/null
            replace .other "$(backing f)"
            sleep 1.2
            [ "$(cat f)" = 'version 2' ] || { echo "stale after 1.2 s: $(cat f)"; exit 1; }
            """), "unwatched")
        XCTAssertTrue(vault.log.contains("cannot be watched") || vault.log.contains("cached for"), vault.log)
    }
}

// End-to-end with the real engine: one vault on two "machines" — two CIPHERDIRs kept in
// sync by two Syncthing instances on 127.0.0.1, in a private network namespace
// (scripts/syncthing-pair), each mounted by its own coffer daemon — through the steps a
// user meets: an edit, an append, an edit on both sides while apart, a directory made on
// both sides (with the same names made on both), a large file synced while it is
// written, a directory of many files arriving while the other side reads it, and a file
// made on one side while it is locked (converted on both, to one file).
import Foundation
import XCTest

final class SyncthingTests: EndToEndCase {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    /// What every script of the pair begins with: `fail`, `soon` (10 s at most, for a
    /// loaded machine), `synced`, `apart`, `together`, and both mounts gone at the end.
    static let prelude = #"""
        set -euo pipefail
        fail() { echo "FAIL: $*"; exit 1; }
        soon() { local i; for i in $(seq 400); do eval "$1" 2>/dev/null && return 0; sleep 0.025; done; eval "$1"; }
        synced() { "$ST_PAIR" wait-synced 60 >/dev/null; }
        apart() { "$ST_PAIR" pause A; "$ST_PAIR" pause B; }
        together() { "$ST_PAIR" resume A; "$ST_PAIR" resume B; synced; }
        trap 'fusermount3 -u -z "$MA" 2>/dev/null; fusermount3 -u -z "$MB" 2>/dev/null; true' EXIT

        """#

    /// The steps, run as the pair's command: $A and $B are the two CIPHERDIRs, $MA and $MB
    /// their mounts. `soon` allows the daemon its moment to learn of a change (10 s at
    /// most, for a loaded machine).
    static let steps = prelude + #"""
        "$COFFER" mount --passfile "$PF" --state-dir "$W/state-a" --log-file "$W/a.log" "$A" "$MA"
        synced                                     # the vault reaches B's CIPHERDIR
        "$COFFER" mount --passfile "$PF" --state-dir "$W/state-b" --log-file "$W/b.log" "$B" "$MB"

        echo "1. an edit is served on the other side once the sync is done"
        echo 'version 1' > "$MA/doc.txt"; synced
        [ "$(cat "$MB/doc.txt")" = 'version 1' ] || fail "B: $(cat "$MB/doc.txt")"
        echo 'version 2' > "$MA/doc.txt"; synced
        [ "$(cat "$MB/doc.txt")" = 'version 2' ] || fail "B serves a stale doc.txt: $(cat "$MB/doc.txt")"

        echo "2. an append made then is kept on both sides"
        echo 'appended on B' >> "$MB/doc.txt"; synced
        for m in "$MA" "$MB"; do
          soon '[ "$(cat "$m/doc.txt")" = "$(printf "version 2\nappended on B")" ]' || fail "$m: $(cat "$m/doc.txt")"
        done

        echo "3. both sides edit while apart: both versions, under distinct names, on both sides"
        apart
        echo 'edit from A' > "$MA/doc.txt"; sleep 1.1
        echo 'edit from B' > "$MB/doc.txt"
        together
        for m in "$MA" "$MB"; do
          soon '[ "$(ls "$m" | grep -c "^doc")" = 2 ]' || fail "$m: $(ls "$m")"
          copy=$(ls "$m" | grep -E '^doc\.sync-conflict-[0-9]{8}-[0-9]{6}-[A-Z0-9]{7}\.txt$') || fail "$m: no copy: $(ls "$m")"
          [ "$(cat "$m/doc.txt" "$m/$copy" | sort | tr '\n' ' ')" = 'edit from A edit from B ' ] || fail "$m: versions"
        done

        echo "4. the same directory made on both sides keeps every file, on both"
        apart
        mkdir "$MA/d" "$MA/d/sub"; echo 'from A' > "$MA/d/a.txt"; echo 'A' > "$MA/d/same.txt"; echo 'deep A' > "$MA/d/sub/x"
        mkdir "$MB/d" "$MB/d/sub"; echo 'from B' > "$MB/d/b.txt"; echo 'B' > "$MB/d/same.txt"; echo 'deep B' > "$MB/d/sub/y"
        together
        # Each entry once, under one name, reached: the other machine's same.txt and sub
        # under the names they will settle to (issue 37, item 2).
        names="a.txt b.txt same (1).txt same.txt sub sub (1) "
        for m in "$MA" "$MB"; do
          soon '[ "$(ls "$m/d" | tr "\n" " ")" = "$names" ]' || fail "$m/d: $(ls "$m/d")"
          [ "$(cat "$m/d/a.txt" "$m/d/b.txt" | tr '\n' ' ')" = 'from A from B ' ] || fail "$m/d: contents"
          [ "$(cat "$m/d/same.txt" "$m/d/same (1).txt" | sort | tr '\n' ' ')" = 'A B ' ] || fail "$m/d: same.txt"
          [ "$(cat "$m/d/sub"/* "$m/d/sub (1)"/* | sort | tr '\n' ' ')" = 'deep A deep B ' ] || fail "$m/d: sub"
        done
        echo 'settles it' > "$MA/d/c.txt"; synced       # the next change settles d on one IV
        for m in "$MA" "$MB"; do
          soon '[ "$(ls "$m/d" | tr "\n" " ")" = "a.txt b.txt c.txt same (1).txt same.txt sub sub (1) " ]' || fail "$m/d after settling: $(ls "$m/d")"
          [ "$(cat "$m/d/b.txt")" = 'from B' ] || fail "$m/d/b.txt"
          [ "$(cat "$m/d/same.txt" "$m/d/same (1).txt" | sort | tr '\n' ' ')" = 'A B ' ] || fail "$m/d: same.txt after settling"
        done
        [ -z "$(find "$A" "$B" -name 'coffer.sync-conflict-*')" ] || fail "an IV copy is left"

        echo "5. a 50 MB file synced while it is written: no EIO, no stale view once synced"
        head -c 50000000 /dev/urandom > "$W/big"
        ( for i in $(seq 0 49); do dd if="$W/big" of="$MA/big" bs=1000000 skip=$i seek=$i count=1 conv=notrunc status=none; sleep 0.02; done ) &
        writer=$!
        sleep 0.3; "$ST_PAIR" wait-synced 60 >/dev/null || true   # a sync in the middle of the writes
        wait $writer; synced
        want=$(md5sum < "$W/big")
        for m in "$MA" "$MB"; do
          soon '[ "$(md5sum < "$m/big")" = "$want" ]' || fail "$m/big differs (size $(stat -c %s "$m/big"))"
        done

        echo "6. a directory of 200 files made on A while B lists and reads it: no EIO on B"
        : > "$W/errs"
        ( while [ ! -e "$W/stop" ]; do
            ls "$MB/burst" > /dev/null 2>> "$W/errs" || true
            for f in $(ls "$MB/burst" 2>/dev/null); do cat "$MB/burst/$f" > /dev/null 2>> "$W/errs" || true; done
            sleep 0.005
          done ) &
        reader=$!
        mkdir "$MA/burst"; for i in $(seq 200); do echo "file $i" > "$MA/burst/f$i"; done
        synced
        soon '[ "$(ls "$MB/burst" | wc -l)" = 200 ]' || fail "B/burst: $(ls "$MB/burst" | wc -l) files"
        touch "$W/stop"; wait $reader
        [ "$(cat "$MB/burst/f123")" = 'file 123' ] || fail "B/burst/f123"
        grep -v 'No such file or directory' "$W/errs" && fail "B got errors while the directory arrived" || true

        echo "7. a file made on A while A is locked reads on B; both convert it, to one file"
        mkdir "$MA/mail"; "$COFFER" protect --class unless-open "$MA/mail" > /dev/null; ls "$MA/mail"; synced
        touch "$W/before-drops"; sleep 1.1
        "$COFFER" lock "$MA" > /dev/null
        echo 'made on A while locked' > "$MA/mail/msg"; synced
        apart
        soon '[ "$(cat "$MB/mail/msg")" = "made on A while locked" ]' || fail "B/mail: $(ls "$MB/mail")"
        "$COFFER" unlock --passfile "$PF" "$MA" > /dev/null
        together
        for m in "$MA" "$MB"; do
          soon '[ "$(ls "$m/mail" | tr "\n" " ")" = "msg " ]' || fail "$m/mail: $(ls "$m/mail")"
          [ "$(cat "$m/mail/msg")" = 'made on A while locked' ] || fail "$m/mail/msg"
        done
        [ -z "$(find "$A" "$B" -name '*sync-conflict*' -newer "$W/before-drops")" ] || fail "a conflict copy: $(find "$A" "$B" -name '*sync-conflict*' -newer "$W/before-drops")"
        [ -z "$(find "$A" "$B" -name 'coffer.drop.*')" ] || fail "an entry left unconverted"

        grep -h "damage:\|unexpected" "$W/a.log" "$W/b.log" && fail "the daemons logged damage" || true
        echo "all steps passed"
        """#

    /// Format 8: both machines give the same directory the after-first-unlock class while
    /// apart (each moves its entries into the other key domain); together again, Syncthing
    /// finds the same bytes on both sides — no conflict copy — and each side serves every
    /// file, through a lock too. Then A changes it back while B is apart and B, receiving
    /// the half-way states, serves the files once synced.
    static let classSteps = prelude + #"""
        "$COFFER" mount --passfile "$PF" --state-dir "$W/state-a" --log-file "$W/a.log" "$A" "$MA"
        mkdir -p "$MA/mail/cur"; for i in $(seq 40); do echo "message $i" > "$MA/mail/cur/m$i"; done
        ln -s cur "$MA/mail/link"; echo note > "$MA/mail/note"; setfattr -n user.seen -v yes "$MA/mail/note"
        synced
        "$COFFER" mount --passfile "$PF" --state-dir "$W/state-b" --log-file "$W/b.log" "$B" "$MB"
        want=$(cd "$MA/mail" && find . | sort | md5sum)
        soon '[ "$(cd "$MB/mail" && find . | sort | md5sum)" = "$want" ]' || fail "B/mail before: $(ls "$MB/mail")"
        touch "$W/before"; sleep 1.1

        echo "1. both sides change the class while apart: the same bytes, no conflict copy"
        apart
        "$COFFER" protect -R --class after-first-unlock "$MA/mail" > /dev/null
        "$COFFER" protect -R --class after-first-unlock "$MB/mail" > /dev/null
        together
        [ -z "$(find "$A" "$B" -name '*sync-conflict*' -newer "$W/before")" ] || fail "conflict copies: $(find "$A" "$B" -name '*sync-conflict*')"
        diff <(cd "$A" && find . -path ./.stfolder -prune -o -type f -print0 | sort -z | xargs -0 md5sum) \
             <(cd "$B" && find . -path ./.stfolder -prune -o -type f -print0 | sort -z | xargs -0 md5sum) > /dev/null || fail "the sides differ"
        for m in "$MA" "$MB"; do
          [ "$(cd "$m/mail" && find . | sort | md5sum)" = "$want" ] || fail "$m/mail: $(ls "$m/mail")"
          [ "$(cat "$m/mail/cur/m17")" = 'message 17' ] || fail "$m/mail/cur/m17"
          # (Syncthing carries no xattrs unless asked: B never had it.)
          [ "$m" = "$MB" ] || [ "$(getfattr --only-values -n user.seen "$m/mail/note")" = yes ] || fail "$m/mail/note's xattr"
          "$COFFER" lock "$m" > /dev/null
          [ "$(cat "$m/mail/cur/m40")" = 'message 40' ] || fail "$m/mail/cur/m40 through a lock"
          "$COFFER" unlock --passfile "$PF" "$m" > /dev/null
        done

        echo "2. A changes it back while B is apart; B serves it once synced"
        "$ST_PAIR" pause B
        "$COFFER" protect -R --class complete "$MA/mail" > /dev/null
        "$ST_PAIR" resume B; synced
        soon '[ "$("$COFFER" protect "$MB/mail")" = "$MB/mail: complete" ]' || fail "B/mail: $("$COFFER" protect "$MB/mail")"
        soon '[ "$(cd "$MB/mail" && find . | sort | md5sum)" = "$want" ]' || fail "B/mail after: $(ls "$MB/mail")"
        [ "$(cat "$MB/mail/cur/m5")" = 'message 5' ] || fail "B/mail/cur/m5"
        [ -z "$(find "$A" "$B" -name '*sync-conflict*' -newer "$W/before")" ] || fail "conflict copies after"

        grep -h "damage:\|unexpected" "$W/a.log" "$W/b.log" && fail "the daemons logged damage" || true
        echo "all steps passed"
        """#

    func testTwoMachinesChangingAClassAtOnceConverge() throws {
        try runPair(Self.classSteps, initOptions: ["--format", "8"])
    }

    func testOneVaultOnTwoMachinesSyncedBySyncthing() throws {
        try runPair(Self.steps)
    }

    /// Runs `steps` as the pair's command on a new vault (made with `initOptions`).
    private func runPair(_ script: String, initOptions: [String] = []) throws {
        let w = scratch.path
        let (a, b) = (scratch.mkdir("A"), scratch.mkdir("B"))
        let (ma, mb) = (scratch.mkdir("MA"), scratch.mkdir("MB"))
        let passfile = scratch.file("pass", "one passphrase\n")
        assertOK(Harness.run([Harness.coffer, "init", "--kdf-ops", "2", "--kdf-memory", "64", "--passfile", passfile] + initOptions + [a]),
                 "init")
        let steps = scratch.file("steps.sh", script)
        let r = Harness.run(["/usr/bin/env", "W=\(w)", "A=\(a)", "B=\(b)", "MA=\(ma)", "MB=\(mb)", "PF=\(passfile)",
                             "COFFER=\(Harness.coffer)",
                             Self.repository + "/scripts/syncthing-pair", "run", w + "/syncthing", a, b, "--", "bash", steps],
                            timeout: 240)
        XCTAssertEqual(r.status, 0, "\(r.stdout)\n\(r.stderr)\n--- daemon A:\n\((try? String(contentsOfFile: w + "/a.log", encoding: .utf8)) ?? "")\n--- daemon B:\n\((try? String(contentsOfFile: w + "/b.log", encoding: .utf8)) ?? "")")
        XCTAssertTrue(r.stdout.contains("all steps passed"), r.stdout)
    }
}

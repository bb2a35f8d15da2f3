// End-to-end: programs hear what happens to a mount (`coffer events`, docs/CONTROL.md's
// "Events"): every subscriber gets each event in order; a lock announced with a grace
// waits for the subscribers that asked for time, never past its deadline; a subscriber
// that never reads holds up neither the daemon nor a lock.
import Foundation
import XCTest

final class EventsTests: EndToEndCase {
    /// A subscriber speaking the protocol itself (python3 SOCKET MODE): prints the answer
    /// and each event's kind; with MODE `saves` it asked for time and says `done` half a
    /// second after each will-lock, with `stalls` it asked for time and never says it,
    /// with `deaf` it never reads at all and ends once the file STOP exists.
    static let subscriber = #"""
        import json, os, socket, struct, sys, time
        path, mode = sys.argv[1], sys.argv[2]
        s = socket.socket(socket.AF_UNIX); s.connect(path)
        def send(obj):
            b = json.dumps(obj).encode(); s.sendall(struct.pack('>I', len(b)) + b)
        def recv_exactly(n):
            b = b''
            while len(b) < n:
                c = s.recv(n - len(b))
                if not c: return None
                b += c
            return b
        def recv():
            h = recv_exactly(4)
            return None if h is None else json.loads(recv_exactly(struct.unpack('>I', h)[0]))
        send({"version": 1, "op": "subscribe", "delays": mode != "deaf"})
        print("answer", recv()["ok"], flush=True)
        if mode == "deaf":
            while not os.path.exists(sys.argv[3]): time.sleep(0.05)
            sys.exit(0)
        while True:
            e = recv()
            if e is None: break
            print(e["event"], e.get("reason"), e.get("graceSeconds"), flush=True)
            if e["event"] == "will-lock" and mode == "saves":
                time.sleep(0.5); print("saved", flush=True); send({"op": "done"})
        """#

    /// Shell helpers: `subscribers N` waits until the daemon counts N subscribers;
    /// `started CMD…` runs CMD in the background outside the mount (which it would keep
    /// busy), its output in files the caller names; whatever is still running when the
    /// script ends (a failed step) is ended with it.
    static let helpers = """
        started() { (cd / && exec "$@") & }
        trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
        soon() { local i; for i in $(seq 100); do eval "$1" 2>/dev/null && return 0; sleep 0.05; done; eval "$1"; }
        subscribers() { soon "[ \\"\\$(\\"$COFFER\\" status --json \\"$M\\" | jq .subscribers)\\" = $1 ]"; }
        socket() { "$COFFER" status --json "$M" | jq -r .socket; }

        """

    func run(_ vault: MountedVault, _ script: String) -> Outcome {
        let program = scratch.file("subscriber.py", Self.subscriber)
        return vault.sh("export COFFER='\(Harness.coffer)' S='\(scratch.path)' SUB='\(program)'\n" + Self.helpers + script)
    }

    func testEverySubscriberHearsEachEventInOrder() {
        let vault = mountedVault()
        let r = run(vault, """
            started "$COFFER" events --json "$M" > "$S/json" 2>&1; one=$!
            started "$COFFER" events "$M" > "$S/text" 2>&1; two=$!
            subscribers 2
            echo hello > f; head -c 10000 /dev/urandom > g
            "$COFFER" lock "$M" > /dev/null
            "$COFFER" unlock --passfile '\(vault.passfile)' "$M" > /dev/null
            bg=$(find "$C" -maxdepth 1 -inum "$(stat -c %i g)"); bf=$(find "$C" -maxdepth 1 -inum "$(stat -c %i f)")
            python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(200); b = f.read(1); f.seek(200); f.write(bytes([b[0] ^ 255]))' "$bg"
            soon '! cat g > /dev/null 2>&1'                                 # a damaged block refused
            cp "$bf" "$bf.sync-conflict-20260101-000000-ABCDEFG"            # a conflict copy arrives
            soon '[ -e f.sync-conflict-20260101-000000-ABCDEFG ]'
            for i in $(seq 100); do grep -q '"event":"conflict"' "$S/json" && break; sleep 0.1; done   # heard before the wipe
            "$COFFER" wipe --yes "$C" > /dev/null                           # locks for good
            cd /; "$COFFER" unmount "$M"
            wait $one $two                                                  # both end with the mount
            jq -r '[.event, .reason // empty] | join(" ")' "$S/json" | grep -v '^damage\\|^conflict'
            echo ---
            jq -r 'select(.event == "damage" or .event == "conflict") | "\\(.event) \\(.path)"' "$S/json" | sort -u
            echo ---
            grep -c ' will-lock reason=command deadline=' "$S/text"
            """)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr + vault.log)
        XCTAssertEqual(r.stdout, """
            will-lock command
            locked command
            unlocked
            will-lock wipe
            locked wipe
            unmounting
            ---
            conflict /f.sync-conflict-20260101-000000-ABCDEFG
            damage /g
            ---
            1

            """, vault.log)
    }

    func testAnAnnouncedLockWaitsForWhoAskedForTimeButNotPastItsDeadline() {
        let vault = mountedVault("vault", ["--lock-grace", "3s"])
        let r = run(vault, """
            started python3 "$SUB" "$(socket)" saves > "$S/saves" 2>&1; saves=$!
            subscribers 1
            "$COFFER" lock --grace "$M" > /dev/null                         # waits for "saved"
            cat "$S/saves"; echo ---
            "$COFFER" unlock --passfile '\(vault.passfile)' "$M" > /dev/null
            started python3 "$SUB" "$(socket)" stalls > "$S/stalls" 2>&1; stalls=$!
            subscribers 2
            "$COFFER" lock --grace "$M" > /dev/null                         # the deadline ends the wait
            "$COFFER" status --json "$M" | jq -r .state
            cd /; "$COFFER" unmount "$M"; wait $saves $stalls
            cat "$S/stalls"
            """)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr + vault.log)
        XCTAssertEqual(r.stdout, """
            answer True
            will-lock command 3
            saved
            locked command None
            ---
            locked
            answer True
            will-lock command 3
            locked command None
            unmounting None None

            """, vault.log)
    }

    func testASubscriberThatNeverReadsIsDroppedAndHoldsNothingUp() {
        let vault = mountedVault()
        let r = run(vault, """
            started python3 "$SUB" "$(socket)" deaf "$S/stop" > /dev/null 2>&1; deaf=$!
            subscribers 1
            head -c 10000 /dev/urandom > g; bg=$(find "$C" -maxdepth 1 -inum "$(stat -c %i g)")
            python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(200); b = f.read(1); f.seek(200); f.write(bytes([b[0] ^ 255]))' "$bg"
            soon '! cat g > /dev/null 2>&1'
            python3 -c '
            import os, sys
            for _ in range(3000):                                         # a damage event each
                fd = os.open(sys.argv[1], os.O_RDONLY)
                try: os.pread(fd, 4096, 0)
                except OSError: pass
                os.close(fd)
            ' "$M/g"
            subscribers 0                                                   # dropped, not waited for
            "$COFFER" lock "$M"                                             # and the lock goes through
            touch "$S/stop"; wait $deaf
            """)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr)
        XCTAssertTrue(r.stdout.contains("locked"), r.stdout)
        XCTAssertTrue(vault.log.contains("events: 1 subscriber dropped: it does not read what is sent"), vault.log)
    }
}

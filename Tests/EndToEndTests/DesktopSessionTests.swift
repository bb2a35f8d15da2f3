// End-to-end: the desktop session (docs/CONTROL.md, "D-Bus" and "The session locks
// the vault"). Each test runs its own dbus-daemon on a socket in its scratch directory
// — the owner's session bus, and a system bus with Debian's deny-by-default policy and
// logind's own policy file, where a stand-in for logind (python3-dbus,
// the methods and signals coffer uses and nothing else) answers — and ends both with
// it. The mount's object is read and called with busctl, its signals heard with gdbus;
// the stand-in says when coffer took and released its inhibitor, and the vault's state
// at that moment.
import Foundation
import XCTest

final class DesktopSessionTests: EndToEndCase {
    /// logind as far as coffer uses it: Manager.Inhibit (the read end of the returned
    /// descriptor watched for its close), ListSessions (session c1 of the owner, c2 of
    /// another uid), InhibitDelayMaxUSec, PrepareForSleep; Session.Lock and LockedHint.
    /// Commands on standard input: `sleep` (PrepareForSleep(true), then the sleep once
    /// every inhibitor is released or after 5 s, as logind), `resume`, `lock c1|c2`,
    /// `hint c1|c2`, `quit` (logind leaves the bus). Logs each step, with the vault's state
    /// where it matters.
    static let logind = #"""
        import os, subprocess, sys, time
        import dbus, dbus.service
        from dbus.mainloop.glib import DBusGMainLoop
        from gi.repository import GLib

        address, owner, log_path, coffer, mountpoint = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
        LOGIND, PATH, MANAGER, SESSION = "org.freedesktop.login1", "/org/freedesktop/login1", "org.freedesktop.login1.Manager", "org.freedesktop.login1.Session"
        PROPS = "org.freedesktop.DBus.Properties"
        log_file = open(log_path, "a", buffering=1)
        def log(*words): print(*words, file=log_file, flush=True)
        def state():
            r = subprocess.run([coffer, "status", "--json", mountpoint], capture_output=True, text=True)
            return "state=" + (r.stdout.split('"state" : "')[1].split('"')[0] if '"state"' in r.stdout else "?")

        DBusGMainLoop(set_as_default=True)
        bus = dbus.bus.BusConnection(address)
        held = {}      # read end -> who, of every delay inhibitor not yet released

        class Manager(dbus.service.Object):
            @dbus.service.method(MANAGER, in_signature="ssss", out_signature="h")
            def Inhibit(self, what, who, why, mode):
                r, w = os.pipe()
                held[r] = who
                def released(fd, condition):
                    del held[fd]; os.close(fd)
                    log("released", who, state())
                    return False
                GLib.io_add_watch(r, GLib.IO_HUP | GLib.IO_ERR, released)
                log("inhibit", what, who, mode)
                fd = dbus.types.UnixFd(w); os.close(w)
                return fd
            @dbus.service.method(MANAGER, out_signature="a(susso)")
            def ListSessions(self):
                return [("c1", dbus.UInt32(owner), "owner", "seat0", dbus.ObjectPath(PATH + "/session/c1")),
                        ("c2", dbus.UInt32(owner + 4242), "other", "seat0", dbus.ObjectPath(PATH + "/session/c2"))]
            @dbus.service.method(PROPS, in_signature="ss", out_signature="v")
            def Get(self, interface, name):
                return dbus.UInt64(5000000, variant_level=1)
            @dbus.service.signal(MANAGER, signature="b")
            def PrepareForSleep(self, start): pass

        class Session(dbus.service.Object):
            @dbus.service.signal(SESSION)
            def Lock(self): pass
            @dbus.service.signal(PROPS, signature="sa{sv}as")
            def PropertiesChanged(self, interface, changed, invalidated): pass

        name = dbus.service.BusName(LOGIND, bus)
        manager = Manager(bus, PATH)
        sessions = {s: Session(bus, PATH + "/session/" + s) for s in ("c1", "c2")}
        loop = GLib.MainLoop()

        def command(source, condition):
            line = sys.stdin.readline()
            if not line: loop.quit(); return False
            word = line.split()
            if word[0] == "sleep":
                log("prepare for sleep", state())
                manager.PrepareForSleep(True)
                deadline = time.monotonic() + 5      # logind's InhibitDelayMaxSec
                def allowed():
                    if held and time.monotonic() < deadline: return True
                    log("sleep", "allowed" if not held else "forced with %d inhibitor(s) held" % len(held), state())
                    return False
                GLib.timeout_add(20, allowed)
            elif word[0] == "quit":
                log("quit"); loop.quit(); return False
            elif word[0] == "resume":
                manager.PrepareForSleep(False); log("resumed")
            elif word[0] == "lock":
                sessions[word[1]].Lock(); log("session lock", word[1])
            elif word[0] == "hint":
                sessions[word[1]].PropertiesChanged(SESSION, {"LockedHint": dbus.Boolean(True, variant_level=1)}, dbus.Array([], signature="s"))
                log("locked hint", word[1])
            return True

        GLib.io_add_watch(sys.stdin, GLib.IO_IN | GLib.IO_HUP, command)
        log("ready")
        loop.run()
        """#

    /// Shell helpers: `started CMD…` runs CMD in the background (outside the mount);
    /// `bus_up` starts a private session bus at $S/bus (its address in $BUS) that any user
    /// may reach (the tests call it as nobody too), and a system bus at $S/sysbus ($SYSBUS)
    /// with the system bus's deny-by-default policy and logind's own policy file;
    /// `logind_up` starts the stand-in on the system bus, commanded through fd 3; whatever
    /// runs when the script ends is ended with it.
    static let helpers = """
        started() { (cd / && exec "$@") & }
        trap 'exec 3>&- 2>/dev/null; kill $(jobs -p) 2>/dev/null || true' EXIT
        soon() { local i; for i in $(seq 100); do eval "$1" 2>/dev/null && return 0; sleep 0.05; done; eval "$1"; }
        bus_up() {
          cat > "$S/bus.conf" <<CONF
        <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
        <busconfig><type>session</type><listen>unix:path=$S/bus</listen><auth>EXTERNAL</auth>
          <policy context="default"><allow user="*"/><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy>
        </busconfig>
        CONF
          started dbus-daemon --config-file="$S/bus.conf" --nofork --nopidfile > "$S/bus.log" 2>&1
          # The system bus, as Debian configures it: deny by default, what logind's own
          # policy file opens (installed with systemd) for logind's methods.
          cat > "$S/sysbus.conf" <<CONF
        <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
        <busconfig><type>system</type><listen>unix:path=$S/sysbus</listen><auth>EXTERNAL</auth>
          <policy context="default">
            <allow user="*"/><deny own="*"/><deny send_type="method_call"/>
            <allow send_type="signal"/><allow send_requested_reply="true" send_type="method_return"/>
            <allow send_requested_reply="true" send_type="error"/>
            <allow receive_type="method_call"/><allow receive_type="method_return"/><allow receive_type="error"/><allow receive_type="signal"/>
            <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
            <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
            <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Properties"/>
          </policy>
          <include>/usr/share/dbus-1/system.d/org.freedesktop.login1.conf</include>
        </busconfig>
        CONF
          started dbus-daemon --config-file="$S/sysbus.conf" --nofork --nopidfile > "$S/sysbus.log" 2>&1
          soon '[ -S "$S/bus" ] && [ -S "$S/sysbus" ]'
          BUS="unix:path=$S/bus" SYSBUS="unix:path=$S/sysbus"
        }
        logind_up() {
          mkfifo "$S/ctl"; exec 3<> "$S/ctl"     # read-write: opening it waits for no reader
          # Not through `started`: a background job's own redirection is what keeps its stdin.
          (cd / && exec /usr/bin/python3 "$LOGIND" "$SYSBUS" "$(id -u)" "$S/logind" "$COFFER" "$M") < "$S/ctl" > "$S/logind.err" 2>&1 &
          soon 'grep -q ready "$S/logind"'
        }
        mount_vault() {
          DBUS_SESSION_BUS_ADDRESS="$BUS" COFFER_LOGIND_BUS_ADDRESS="$SYSBUS" \\
            "$COFFER" mount --passfile "$PASS" --log-file "$LOG" --state-dir "$S/state" "$@" "$C" "$M"
        }
        state() { "$COFFER" status --json "$M" | jq -r .state; }
        unmount_vault() { "$COFFER" unmount "$M" || { fuser -vm "$M" >&2; false; }; }

        """

    func run(_ script: String, _ vault: MountedVault, timeout: TimeInterval = 120) -> Outcome {
        let standin = scratch.file("logind.py", Self.logind), subscriber = scratch.file("subscriber.py", EventsTests.subscriber)
        return Harness.sh("""
            export COFFER='\(Harness.coffer)' S='\(scratch.path)' LOGIND='\(standin)' SUB='\(subscriber)' C='\(vault.cipherdir)' M='\(vault.mountpoint)' \
              PASS='\(vault.passfile)' LOG='\(vault.logFile)'
            """ + "\n" + Self.helpers + script, timeout: timeout)
    }

    func testTheMountIsOnTheSessionBus() {
        let vault = MountedVault(scratch: scratch)
        chmod(scratch.path, 0o755)  // nobody reaches the bus, not the vault (its directories are 0700)
        let r = run("""
            bus_up; mount_vault
            N=$("$COFFER" status --json "$M" | jq -r .busName); P=/io/github/coffer/Mount/${N#io.github.coffer.Mount.}
            echo "$N"; "$COFFER" status "$M" | grep '^Desktop:' | sed "s/$N/NAME/"
            started stdbuf -oL gdbus monitor --address "$BUS" --dest "$N" > "$S/monitor"
            soon 'grep -q "is owned by" "$S/monitor"'
            busctl --address="$BUS" get-property "$N" "$P" io.github.coffer.Mount1 Locked Mountpoint | sed "s#$M#MOUNTPOINT#"
            runuser -u nobody -- busctl --address="$BUS" call "$N" "$P" io.github.coffer.Mount1 Lock b false 2>&1 || true
            state
            busctl --address="$BUS" call "$N" "$P" io.github.coffer.Mount1 Lock b false
            busctl --address="$BUS" get-property "$N" "$P" io.github.coffer.Mount1 Locked
            "$COFFER" unlock --passfile "$PASS" "$M" > /dev/null
            busctl --address="$BUS" get-property "$N" "$P" io.github.coffer.Mount1 Locked
            soon 'grep -q Unlocked "$S/monitor"'
            unmount_vault
            echo ---
            grep -o 'Mount1\\.[A-Za-z]* ([^,)]*\\|{.Locked.: <[a-z]*>}' "$S/monitor"
            """, vault)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr + vault.log)
        let name = r.stdout.split(separator: "\n").first.map(String.init) ?? ""
        XCTAssertTrue(name.hasPrefix("io.github.coffer.Mount.vault_plain_"), name)
        XCTAssertEqual(r.stdout, """
            \(name)
            Desktop:         on the session bus as NAME
            b false
            s "MOUNTPOINT"
            Call failed: Access denied
            unlocked
            b true
            b false
            ---
            Mount1.WillLock ('command'
            Mount1.Locked ('command'
            {'Locked': <true>}
            Mount1.Unlocked (
            {'Locked': <false>}
            Mount1.Locked ('unmount'
            {'Locked': <true>}

            """, vault.log)
        XCTAssertTrue(vault.log.contains("D-Bus: Lock refused to uid 65534"), vault.log)
    }

    /// Another program of the owner holds the mount's name on the session bus: the mount
    /// runs without it and `status` says why; with --lock-on (programs wait for the lock's
    /// announcement on that name) the mount is refused with status 49.
    func testAMountWhoseBusNameIsHeldSaysSoAndLockOnIsRefused() {
        let vault = MountedVault(scratch: scratch)
        let r = run("""
            bus_up; mount_vault
            N=$("$COFFER" status --json "$M" | jq -r .busName)
            unmount_vault
            started /usr/bin/python3 -c 'import dbus, sys, time; b = dbus.bus.BusConnection(sys.argv[1]); b.request_name(sys.argv[2]); print("held", flush=True); time.sleep(120)' "$BUS" "$N" > "$S/holder"
            soon 'grep -q held "$S/holder"'
            mount_vault
            "$COFFER" status "$M" | grep '^Desktop:' | sed "s/$N/NAME/"
            "$COFFER" status --json "$M" | jq -r .busProblem | sed "s/$N/NAME/"
            unmount_vault
            logind_up
            mount_vault --lock-on screen 2>&1 | sed "s/$N/NAME/" || true
            mountpoint -q "$M" || echo "not mounted"
            """, vault)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr + vault.log)
        XCTAssertEqual(r.stdout, """
            Desktop:         not on D-Bus: its name NAME is held by another program on the session bus
            its name NAME is held by another program on the session bus
            coffer: --lock-on: the mount cannot announce its locks on D-Bus: its name NAME is held by another program on the session bus
            not mounted

            """, vault.log)
    }

    /// logind restarts (it forgets every inhibitor): the mount takes a new one from the
    /// new logind, so the next suspend still waits until the vault is locked.
    func testAfterLogindRestartsASuspendStillWaitsForTheLock() {
        let vault = MountedVault(scratch: scratch)
        let r = run("""
            bus_up; logind_up; mount_vault --lock-on suspend
            echo quit >&3; exec 3>&-                             # logind leaves the bus
            soon 'grep -q "logind left the system bus" "$LOG"'
            rm "$S/ctl"; mv "$S/logind" "$S/logind.first"
            logind_up                                            # a new logind, knowing no inhibitor
            soon 'grep -q "^inhibit" "$S/logind"'
            echo sleep >&3
            soon 'grep -q "^sleep " "$S/logind"'
            unmount_vault
            cat "$S/logind"
            """, vault)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr + vault.log)
        XCTAssertEqual(r.stdout, """
            ready
            inhibit sleep coffer delay
            prepare for sleep state=unlocked
            released coffer state=locked
            sleep allowed state=locked

            """, vault.log)
    }

    /// An ordinary user's mount with --lock-on suspend, on a system bus that denies by
    /// default: every call it makes to logind is one logind's policy allows any user, so it
    /// holds its inhibitor and the suspend waits for the lock.
    func testAUsersMountFollowsSuspendOnADenyByDefaultSystemBus() {
        let vault = MountedVault(scratch: scratch)
        let r = run("""
            bus_up; logind_up
            chmod 755 "$S"; chown -R nobody: "$C" "$M" "$PASS"; mkdir "$S/nobody"; chown nobody: "$S/nobody"
            runuser -u nobody -- env DBUS_SESSION_BUS_ADDRESS="$BUS" COFFER_LOGIND_BUS_ADDRESS="$SYSBUS" HOME="$S/nobody" \\
              "$COFFER" mount --passfile "$PASS" --socket "$S/nobody/s" --log-file "$S/nobody/log" --state-dir "$S/nobody/state" \\
              --lock-on suspend "$C" "$M"
            soon 'grep -q "^inhibit" "$S/logind"'
            echo sleep >&3
            soon 'grep -q "^sleep " "$S/logind"'
            "$COFFER" status --json --socket "$S/nobody/s" "$M" | jq -r .state
            runuser -u nobody -- "$COFFER" unmount "$M"
            sed 's/ state=.*//' "$S/logind"
            """, vault)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr + ((try? String(contentsOfFile: scratch.path + "/nobody/log", encoding: .utf8)) ?? ""))
        XCTAssertEqual(r.stdout, """
            locked
            ready
            inhibit sleep coffer delay
            prepare for sleep
            released coffer
            sleep allowed

            """, r.stderr)
    }

    func testWithoutASessionBusTheDaemonRunsAndSaysSoOnce() {
        let vault = MountedVault(scratch: scratch)
        vault.environment = ["DBUS_SESSION_BUS_ADDRESS": "unix:path=\(scratch.path)/no-bus"]
        vault.mount()
        assertOK(vault.sh("echo hello > f; cat f; '\(Harness.coffer)' lock \"$M\""), "use")
        vault.unmount()
        XCTAssertEqual(vault.log.components(separatedBy: "D-Bus: no session bus").count - 1, 1, vault.log)
    }

    func testASuspendWaitsUntilTheVaultIsLocked() {
        let vault = MountedVault(scratch: scratch)
        let r = run("""
            bus_up; logind_up; mount_vault --lock-on suspend --lock-grace 10s
            # A program that asks for time and saves for half a second: the lock, and so the
            # sleep, waits for it (the grace cut to half of logind's 5 s).
            started python3 "$SUB" "$("$COFFER" status --json "$M" | jq -r .socket)" saves > "$S/events"; events=$!
            soon '[ "$("$COFFER" status --json "$M" | jq .subscribers)" = 1 ]'
            "$COFFER" status --json "$M" | jq -c .lockOn
            "$COFFER" status "$M" | grep '^Desktop:' | sed 's/as [^;]*;/as NAME;/'
            echo sleep >&3
            soon 'grep -q "^sleep " "$S/logind"'
            echo resume >&3
            soon '[ $(grep -c "^inhibit" "$S/logind") = 2 ]'
            "$COFFER" unlock --passfile "$PASS" "$M" > /dev/null
            echo sleep >&3                                       # and again, with the new inhibitor
            soon '[ $(grep -c "^sleep " "$S/logind") = 2 ]'
            unmount_vault; wait $events || true                  # (its output is what counts)
            cat "$S/logind"; echo ---
            cat "$S/events"
            """, vault)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr + vault.log)
        XCTAssertEqual(r.stdout, """
            ["suspend"]
            Desktop:         on the session bus as NAME; locks with the session's suspend
            ready
            inhibit sleep coffer delay
            prepare for sleep state=unlocked
            released coffer state=locked
            sleep allowed state=locked
            resumed
            inhibit sleep coffer delay
            prepare for sleep state=unlocked
            released coffer state=locked
            sleep allowed state=locked
            ---
            answer True
            will-lock suspend 2.5
            saved
            locked suspend None
            unlocked None None
            will-lock suspend 2.5
            saved
            locked suspend None
            unmounting None None

            """, vault.log)
    }

    /// A suspend drops the after-first-unlock class's keys too (format 8), as `lock --all`
    /// does: its directories are refused until the unlock. A mount with
    /// `--suspend-keeps-after-first-unlock` keeps them, as `coffer lock` does: mail/ reads
    /// and takes new files through the suspend while docs/ is refused.
    func testASuspendDropsTheAfterFirstUnlockClassUnlessTheMountKeepsIt() {
        let vault = MountedVault(scratch: scratch, initOptions: ["--format", "8"])
        let r = run("""
            bus_up; logind_up; mount_vault --lock-on suspend
            cd "$M" && mkdir mail docs && "$COFFER" protect --class after-first-unlock mail > /dev/null && echo m > mail/m && echo d > docs/d
            cd /
            suspend() { echo sleep >&3; soon "[ \\$(grep -c '^sleep ' \"$S/logind\") = $1 ]"; echo resume >&3; }
            suspend 1
            "$COFFER" status "$M" | grep -c 'kept:' || true
            { cat "$M/mail/m" || true; } 2>&1 | sed "s#$M/##"
            "$COFFER" unlock --passfile "$PASS" "$M" > /dev/null; unmount_vault
            mount_vault --lock-on suspend --suspend-keeps-after-first-unlock
            ls "$M/mail" > /dev/null        # a lock reaches the directories the kernel knew
            suspend 2
            "$COFFER" status "$M" | grep -o 'kept: .*'
            cat "$M/mail/m"; echo n > "$M/mail/n" && cat "$M/mail/n"
            { cat "$M/docs/d" || true; } 2>&1 | sed "s#$M/##"
            unmount_vault
            "$COFFER" mount --passfile "$PASS" --suspend-keeps-after-first-unlock "$C" "$M" 2>&1 || true
            """, vault)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr + vault.log)
        XCTAssertEqual(r.stdout, """
            0
            cat: mail/m: Permission denied
            kept: after-first-unlock
            m
            n
            cat: docs/d: Permission denied
            coffer: --suspend-keeps-after-first-unlock goes with --lock-on suspend (see coffer mount --help)

            """, vault.log)
    }

    /// An fstab line's lock_on= and lock_grace= reach the daemon through mount.coffer: its
    /// status names them, and a suspend waits for the lock.
    func testFstabsLockOnAndLockGraceReachTheMount() throws {
        try linkMountHelper(to: Harness.coffer, for: self)
        let vault = MountedVault(scratch: scratch)
        let r = run("""
            bus_up; logind_up
            DBUS_SESSION_BUS_ADDRESS="$BUS" COFFER_LOGIND_BUS_ADDRESS="$SYSBUS" \\
              mount -t coffer "$C" "$M" -o "passfile=$PASS,log_file=$LOG,lock_on=suspend,lock_grace=4s"
            "$COFFER" status --json "$M" | jq -c '[.lockOn, .lockGraceSeconds]'
            echo sleep >&3
            soon 'grep -q "^sleep " "$S/logind"'
            state
            umount "$M"
            cat "$S/logind"
            """, vault)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr + vault.log)
        XCTAssertEqual(r.stdout, """
            [["suspend"],4]
            locked
            ready
            inhibit sleep coffer delay
            prepare for sleep state=unlocked
            released coffer state=locked
            sleep allowed state=locked

            """, vault.log)
    }

    func testTheOwnersScreenLockLocksTheVault() {
        let vault = MountedVault(scratch: scratch)
        let r = run("""
            bus_up; logind_up; mount_vault --lock-on screen
            echo "lock c2" >&3                                   # another user's session
            soon 'grep -q "session lock c2" "$S/logind"'; sleep 0.5
            state
            echo "lock c1" >&3                                   # the owner's: loginctl lock-session
            soon '[ "$(grep -c "locked (screen" "$LOG")" = 1 ]'; state   # the lock done, not only begun
            "$COFFER" unlock --passfile "$PASS" "$M" > /dev/null
            echo "hint c1" >&3                                   # a locker that sets LockedHint
            soon '[ "$(grep -c "locked (screen" "$LOG")" = 2 ]'; state
            unmount_vault
            grep -c 'locked (screen' "$LOG"
            """, vault)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr + vault.log)
        XCTAssertEqual(r.stdout, "unlocked\nlocked\nlocked\n2\n", vault.log)
    }

    func testLockOnWithoutLogindIsRefused() {
        let vault = MountedVault(scratch: scratch)
        let r = run("""
            bus_up                                               # a bus, but no logind on it
            mount_vault --lock-on suspend || echo "status $?"
            COFFER_LOGIND_BUS_ADDRESS="unix:path=$S/no-bus" "$COFFER" mount --passfile "$PASS" --lock-on screen "$C" "$M" 2>&1 || echo "status $?"
            mountpoint -q "$M" || echo "not mounted"
            """, vault)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr)
        XCTAssertTrue(r.stdout.hasPrefix("status 49\ncoffer: --lock-on: logind cannot be reached on the system bus: "), r.stdout)
        XCTAssertTrue(r.stdout.hasSuffix("status 49\nnot mounted\n"), r.stdout)
        XCTAssertTrue(r.stderr.contains("--lock-on: logind cannot be reached"), r.stderr)
    }

    func testTheUnitsStatusLineSaysLockedOrUnlocked() {
        let vault = MountedVault(scratch: scratch)
        let script = """
            import os, socket, subprocess, sys
            coffer, cipher, plain, passfile, sock = sys.argv[1:6]
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind(sock); s.settimeout(30)
            daemon = subprocess.Popen([coffer, "mount", "--foreground", cipher, plain], env=dict(os.environ, NOTIFY_SOCKET=sock),
                                      stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            def status():
                while True:
                    lines = [l for l in s.recv(4096).decode().split("\\n") if l.startswith("STATUS=")]
                    if lines: return lines[0].replace(plain, "MOUNTPOINT")
            print(status())
            subprocess.run([coffer, "unlock", "--passfile", passfile, plain], check=True, stdout=subprocess.DEVNULL)
            print(status())
            subprocess.run([coffer, "lock", plain], check=True, stdout=subprocess.DEVNULL)
            print(status())
            subprocess.run([coffer, "unmount", plain], check=True)
            daemon.wait(timeout=30)
            """
        let r = Harness.run(["python3", "-c", script, Harness.coffer, vault.cipherdir, vault.mountpoint, vault.passfile,
                             scratch.path + "/notify"])
        XCTAssertEqual(r.stdout, "STATUS=MOUNTPOINT locked\nSTATUS=MOUNTPOINT unlocked\nSTATUS=MOUNTPOINT locked\n", r.stderr)
    }
}

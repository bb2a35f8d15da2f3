// End-to-end: modes, set-ID bits and ownership of new entries come out as on a local
// file system, whatever the daemon's own umask, and a failure to give a new entry to
// its creator leaves nothing behind.
import Foundation
import XCTest

final class MountModesTests: EndToEndCase {
    /// Runs `steps` (bash) in the mount and in a plain directory and asserts the same
    /// output; `nobody` must be able to reach both.
    func assertSameAsPlainDirectory(_ vault: MountedVault, _ steps: String, file: StaticString = #filePath, line: UInt = #line) {
        let plain = scratch.mkdir("plain")
        assertOK(Harness.sh("chmod 755 \(scratch.path) \(plain)"), "let nobody in", file: file, line: line)
        let helpers = "as_nobody() { runuser -u nobody -- \"$@\"; }\n"
        let local = Harness.sh("cd \(plain) && " + helpers + steps)
        let mounted = vault.sh(helpers + steps)
        assertOK(local, "steps in a plain directory", file: file, line: line)
        assertOK(mounted, "steps in the mount", file: file, line: line)
        XCTAssertFalse(local.stdout.isEmpty, file: file, line: line)
        XCTAssertEqual(mounted.stdout, local.stdout, file: file, line: line)
    }

    /// The kernel applies the caller's umask; a daemon started under umask 077 (the
    /// systemd units' UMask=0077) must not apply its own on top.
    func testTheDaemonsUmaskIsNotAppliedAgain() {
        let vault = MountedVault(scratch: scratch)
        assertOK(Harness.sh("umask 077; \(Harness.coffer) mount --passfile \(vault.passfile) --log-file \(vault.logFile) \(vault.cipherdir) \(vault.mountpoint)"),
                 "mount under umask 077")
        assertSameAsPlainDirectory(vault, """
            umask 0
            python3 - <<'PY'
            import os, socket, stat
            for name, mode in (("f620", 0o620), ("f642", 0o642), ("f777", 0o777)):
                os.close(os.open(name, os.O_CREAT | os.O_WRONLY, mode))
            os.mknod("node664", stat.S_IFREG | 0o664)
            os.mkfifo("fifo642", 0o642)
            os.mkdir("dir775", 0o775)
            socket.socket(socket.AF_UNIX).bind("sock")
            PY
            stat -c '%n %a' f620 f642 f777 node664 fifo642 dir775 sock
            umask 022 && touch f644 && mkdir d755 && stat -c '%n %a' f644 d755
            """)
    }

    /// Set-ID bits given at create survive on a shared mount (a root daemon chowns the
    /// new file to its creator, which must not clear them), for root and for others.
    func testSetIDBitsGivenAtCreateAreKept() {
        let vault = mountedVault("vault", ["--allow-other"])
        assertSameAsPlainDirectory(vault, """
            umask 0
            mkdir -m 1777 shared
            cat > /tmp/create-modes.$$.py <<'PY'
            import os, stat, sys
            for mode in (0o4755, 0o2755, 0o6755, 0o2745):
                os.close(os.open("%s/c%o" % (sys.argv[1], mode), os.O_CREAT | os.O_WRONLY, mode))
                os.mknod("%s/n%o" % (sys.argv[1], mode), stat.S_IFREG | mode)
            PY
            python3 /tmp/create-modes.$$.py .
            as_nobody sh -c "umask 0; python3 /tmp/create-modes.$$.py shared"
            rm /tmp/create-modes.$$.py
            stat -c '%n %a %U %G' c* n* shared/*
            """)
    }

    /// A directory made in a setgid directory is setgid and belongs to the directory's
    /// group; a file made there belongs to that group too — for root and for others.
    func testSetgidDirectoriesPassOnTheirGroupAndSetgid() {
        let vault = mountedVault("vault", ["--allow-other"])
        assertSameAsPlainDirectory(vault, """
            umask 022
            mkdir g && chgrp users g && chmod 2777 g
            mkdir g/root-dir && mkdir -m 700 g/root-700 && touch g/root-file && mkfifo g/root-fifo
            as_nobody sh -c 'umask 022; mkdir g/nobody-dir && touch g/nobody-file && mkdir g/nobody-dir/deeper'
            stat -c '%n %a %U %G' g/* g/nobody-dir/deeper
            """)
    }

    /// A small LD_PRELOAD library that makes fchown/fchownat (`fchown` armed) or fchmod
    /// (`fchmod` armed) fail with EPERM while a file of that name exists in `dir`.
    func faultLibrary(armedIn dir: String) -> String {
        let source = scratch.file("fault.c", """
            #define _GNU_SOURCE
            #include <dlfcn.h>
            #include <errno.h>
            #include <fcntl.h>
            #include <stdio.h>
            #include <sys/stat.h>
            #include <unistd.h>
            static int armed(const char *call) {
                char path[512];
                snprintf(path, sizeof path, "\(dir)/%s", call);
                struct stat st;
                return stat(path, &st) == 0;
            }
            int fchown(int fd, uid_t u, gid_t g) {
                if (armed("fchown")) { errno = EPERM; return -1; }
                return ((int (*)(int, uid_t, gid_t))dlsym(RTLD_NEXT, "fchown"))(fd, u, g);
            }
            int fchownat(int d, const char *p, uid_t u, gid_t g, int f) {
                if (armed("fchown")) { errno = EPERM; return -1; }
                return ((int (*)(int, const char *, uid_t, gid_t, int))dlsym(RTLD_NEXT, "fchownat"))(d, p, u, g, f);
            }
            int fchmod(int fd, mode_t m) {
                if (armed("fchmod")) { errno = EPERM; return -1; }
                return ((int (*)(int, mode_t))dlsym(RTLD_NEXT, "fchmod"))(fd, m);
            }
            """)
        let library = scratch.path + "/fault.so"
        assertOK(Harness.sh("cc -shared -fPIC -o \(library) \(source) -ldl"), "build the fault library")
        return library
    }

    /// A mount whose daemon runs with the fault library; returns it and the arming directory.
    func mountWithFaults() -> (MountedVault, String) {
        let vault = MountedVault(scratch: scratch)
        let faults = scratch.mkdir("faults")
        let library = faultLibrary(armedIn: faults)
        assertOK(Harness.sh("chmod 755 \(scratch.path) && LD_PRELOAD=\(library) \(Harness.coffer) mount --allow-other --passfile \(vault.passfile) --log-file \(vault.logFile) \(vault.cipherdir) \(vault.mountpoint)"),
                 "mount with the fault library")
        return (vault, faults)
    }

    /// Descriptors (other than O_PATH ones) that the daemon holds on `backing`.
    func openDescriptors(_ vault: MountedVault, on backing: String) -> String {
        let pid = Harness.sh("pgrep -f -- '--log-file \(vault.logFile)'").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        return Harness.run(["python3", "-c", """
            import os, sys
            pid, path = sys.argv[1:3]
            n = 0
            for fd in os.listdir("/proc/%s/fd" % pid):
                try:
                    if os.readlink("/proc/%s/fd/%s" % (pid, fd)) != path: continue
                    flags = int(open("/proc/%s/fdinfo/%s" % (pid, fd)).read().split("flags:")[1].split()[0], 8)
                    n += not flags & 0o10000000
                except OSError:
                    pass
            print(n)
            """, pid, backing]).stdout
    }

    /// An O_TRUNC open whose clearing of setuid fails is refused and leaves no open
    /// descriptor behind in the daemon (no RELEASE will ever come for it), and nothing
    /// is truncated.
    func testAFailedSetIDClearingAtOpenLeaksNothing() {
        let (vault, faults) = mountWithFaults()
        assertOK(vault.sh("printf content > f && chmod 4777 f"), "a setuid file")
        let backing = Harness.sh("find \(vault.cipherdir) -maxdepth 1 -type f ! -name 'coffer.*'").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        XCTAssertFalse(backing.isEmpty)
        Harness.sh("touch \(faults)/fchmod")
        let r = vault.sh("runuser -u nobody -- python3 -c \"import os; os.open('f', os.O_WRONLY | os.O_TRUNC)\"")
        Harness.sh("rm \(faults)/fchmod")
        XCTAssertNotEqual(r.status, 0, "the open cannot succeed while the setuid bit cannot be cleared")
        XCTAssertEqual(openDescriptors(vault, on: backing), "0\n", "the daemon kept the failed open's descriptor")
        XCTAssertEqual(vault.sh("cat f; stat -c ' %a' f").stdout, "content 4777\n", "nothing changed")
        assertOK(vault.sh("runuser -u nobody -- sh -c ': > f' && test ! -s f && test \"$(stat -c %a f)\" = 777"), "works again")
    }

    /// When a new entry cannot be given to its creator, every kind of create fails the
    /// same way and leaves nothing in the mount or in CIPHERDIR.
    func testAFailedChownOfANewEntryLeavesNothing() {
        let (vault, faults) = mountWithFaults()
        assertOK(vault.sh("mkdir -m 1777 shared"), "a shared directory")
        let before = Harness.sh("find \(vault.cipherdir) | sort").stdout
        Harness.sh("touch \(faults)/fchown")
        let long = String(repeating: "l", count: 200)
        for step in ["touch shared/file", "touch shared/\(long)", "mkfifo shared/fifo", "ln -s target shared/link",
                     "mkdir shared/dir", "python3 -c \"import os, stat; os.mknod('shared/node', stat.S_IFREG | 0o644)\""] {
            let r = vault.sh("runuser -u nobody -- \(step)")
            XCTAssertNotEqual(r.status, 0, "\(step) succeeded although the new entry could not be given to nobody")
        }
        Harness.sh("rm \(faults)/fchown")
        XCTAssertEqual(vault.sh("ls -A shared").stdout, "", "entries left behind in the mount")
        XCTAssertEqual(Harness.sh("find \(vault.cipherdir) | sort").stdout, before, "entries left behind in CIPHERDIR")
        assertOK(vault.sh("runuser -u nobody -- touch shared/file && test \"$(stat -c %U shared/file)\" = nobody"), "works again")
    }

    /// The system unit must not forbid what the mount promises: set-ID bits that chmod
    /// sets (RestrictSUIDSGID= would make `chmod u+s` EPERM for every user of the mount).
    func testTheSystemUnitAllowsSetIDBits() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        for unit in ["systemd/coffer@.service", "systemd/user/coffer@.service"] {
            let text = try String(contentsOf: root.appendingPathComponent(unit), encoding: .utf8)
            let directives = text.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.hasPrefix("#") }
            let restrict = directives.filter { $0.hasPrefix("RestrictSUIDSGID=") }
            XCTAssertTrue(restrict.allSatisfy { $0 == "RestrictSUIDSGID=no" }, "\(unit): \(restrict)")
        }
        let system = try String(contentsOf: root.appendingPathComponent("systemd/coffer@.service"), encoding: .utf8)
        XCTAssertTrue(system.contains("# RestrictSUIDSGID="), "the unit's comments say why RestrictSUIDSGID= is not set")
        // The unit stays valid for systemd where its verifier runs here.
        let verify = Harness.sh("command -v systemd-analyze >/dev/null || exit 0; systemd-analyze verify \(root.path)/systemd/coffer@.service 2>&1 | grep -i restrictsuid; true")
        XCTAssertEqual(verify.stdout, "")
    }
}

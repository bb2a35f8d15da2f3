// MountedVault creates a vault, mounts it with the built coffer, and unmounts it at the
// end of the test whatever happened (the scratch directory's cleanup unmounts too).
import CofferSystem
import Foundation
import Glibc
import XCTest

final class MountedVault {
    let cipherdir: String
    let mountpoint: String
    let passfile: String
    let logFile: String
    /// This machine's state directory for the vault (--state-dir): in the scratch
    /// directory unless a test puts it elsewhere (on a disk whose power it cuts).
    var stateDir: String
    /// Variables added to the environment of `coffer mount` (the daemon) and `coffer fsck`.
    var environment: [String: String] = [:]
    private var mergedEnvironment: [String: String]? {
        environment.isEmpty ? nil : ProcessInfo.processInfo.environment.merging(environment) { $1 }
    }

    /// A new vault in `cipherdir` (by default a directory of the scratch directory).
    init(scratch: Scratch, name: String = "vault", cipherdir: String? = nil, initOptions: [String] = []) {
        self.cipherdir = cipherdir ?? scratch.mkdir(name + ".cipher")
        if let cipherdir { try? FileManager.default.createDirectory(atPath: cipherdir, withIntermediateDirectories: true) }
        mountpoint = scratch.mkdir(name + ".plain")
        passfile = scratch.file(name + ".pass", "passphrase of \(name)\n")
        logFile = scratch.path + "/" + name + ".log"
        stateDir = scratch.path + "/" + name + ".state"
        let r = Harness.run([Harness.coffer, "init", "--kdf-ops", "2", "--kdf-memory", "64", "--passfile", passfile] + initOptions + [self.cipherdir])
        XCTAssertEqual(r.status, 0, "init: \(r.stderr)")
    }

    /// Mounts; returns the outcome of `coffer mount`.
    @discardableResult
    func mount(_ extra: [String] = []) -> Outcome {
        let r = Harness.run([Harness.coffer, "mount", "--passfile", passfile, "--log-file", logFile, "--state-dir", stateDir]
                            + extra + [cipherdir, mountpoint], environment: mergedEnvironment)
        XCTAssertEqual(r.status, 0, "mount: \(r.stderr)")
        return r
    }

    /// Unmounts and waits until the daemon has let go of the mountpoint.
    func unmount() {
        let r = Harness.run([Harness.coffer, "unmount", mountpoint])
        XCTAssertEqual(r.status, 0, "unmount: \(r.stderr)")
        XCTAssertFalse(isMounted, "still mounted after unmount")
    }

    var isMounted: Bool {
        let mounts = KernelFiles.text("/proc/mounts") ?? ""
        return mounts.split(separator: "\n").contains { $0.split(separator: " ").dropFirst().first.map(String.init) == mountpoint }
    }

    var log: String { (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? "" }

    /// The daemon's process ID, from `coffer status --json`.
    var daemonPID: Int32? {
        let r = Harness.run([Harness.coffer, "status", "--json", mountpoint])
        guard let data = r.stdout.data(using: .utf8),
              let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { return nil }
        return (object["pid"] as? Int).map(Int32.init)
    }

    /// Kills the daemon with SIGKILL, as a crash would, and clears the dead mount.
    /// `pid`: the daemon's, if known (a stopped daemon answers no `status`).
    func killDaemon(pid known: Int32? = nil) {
        guard let pid = known ?? daemonPID else { return XCTFail("no daemon pid") }
        kill(pid, SIGKILL)
        // Gone once /proc has no live process by that number (a zombie has closed all);
        // up to 30 s.
        for _ in 0..<3000 {
            let stat = KernelFiles.text("/proc/\(pid)/stat") ?? ""
            if stat.isEmpty || stat.contains(") Z ") { break }
            usleep(10_000)
        }
        Harness.run(["fusermount3", "-u", "-z", mountpoint])
    }

    /// Runs `script` in the mount while strace kills the daemon as one of its threads makes
    /// its `point.n`th call `point.call` (the call is not made: a crash just before it),
    /// then clears the dead mount. Whether the daemon was killed.
    func killed(at point: (call: String, n: Int), during script: String) -> Bool {
        guard let pid = daemonPID else { return false }
        sh("""
            strace -f -qq -o /dev/null -e trace=\(point.call) -e inject=\(point.call):error=EIO:signal=KILL:when=\(point.n) -p \(pid) & s=$!
            i=0  # until strace has every thread (up to 10 s)
            until (for t in /proc/\(pid)/task/*/status; do grep -q "^TracerPid:[[:space:]]$s$" "$t" || exit 1; done) || [ $((i += 1)) -gt 500 ]; do
                sleep 0.02
            done
            \(script) > /dev/null 2>&1 || true
            sleep 0.3; kill -INT $s 2>/dev/null || true; wait $s || true
            """)
        let state = KernelFiles.text("/proc/\(pid)/stat") ?? ""
        killDaemon(pid: pid)
        return state.isEmpty || state.contains(") Z ")
    }

    /// `coffer fsck` of the vault (unmounted), with `extra` options.
    func fsck(_ extra: [String] = []) -> Outcome {
        Harness.run([Harness.coffer, "fsck", "--passfile", passfile, "--state-dir", stateDir] + extra + [cipherdir],
                    environment: mergedEnvironment)
    }

    /// The backing path of mount entry `name` (while mounted): found by its inode number,
    /// which the mount shows as the backing file system's.
    func backingPath(of name: String) -> String {
        let inode = sh("stat -c %i '\(name)'").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        return Harness.sh("find '\(cipherdir)' -inum \(inode) | head -1").stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Runs a bash script in the mountpoint (`$M`), with `$C` the cipherdir.
    @discardableResult
    func sh(_ script: String, timeout: TimeInterval = 300) -> Outcome {
        Harness.sh("export M='\(mountpoint)' C='\(cipherdir)'; cd \"$M\"; " + script, timeout: timeout)
    }
}

extension EndToEndCase {
    /// A fresh vault, mounted.
    func mountedVault(_ name: String = "vault", _ extra: [String] = []) -> MountedVault {
        let vault = MountedVault(scratch: scratch, name: name)
        vault.mount(extra)
        return vault
    }

    /// Asserts that a script succeeded, showing its output if not.
    func assertOK(_ outcome: Outcome, _ what: String, file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertEqual(outcome.status, 0, "\(what) failed:\n\(outcome.stdout)\n\(outcome.stderr)", file: file, line: line)
    }
}

// MountedVault creates a vault, mounts it with the built coffer, and unmounts it at the
// end of the test whatever happened (the scratch directory's cleanup unmounts too).
import Foundation
import XCTest

final class MountedVault {
    let cipherdir: String
    let mountpoint: String
    let passfile: String
    let logFile: String

    init(scratch: Scratch, name: String = "vault") {
        cipherdir = scratch.mkdir(name + ".cipher")
        mountpoint = scratch.mkdir(name + ".plain")
        passfile = scratch.file(name + ".pass", "passphrase of \(name)\n")
        logFile = scratch.path + "/" + name + ".log"
        let r = Harness.run([Harness.coffer, "init", "--kdf-ops", "2", "--kdf-memory", "64", "--passfile", passfile, cipherdir])
        XCTAssertEqual(r.status, 0, "init: \(r.stderr)")
    }

    /// Mounts; returns the outcome of `coffer mount`.
    @discardableResult
    func mount(_ extra: [String] = []) -> Outcome {
        let r = Harness.run([Harness.coffer, "mount", "--passfile", passfile, "--log-file", logFile] + extra + [cipherdir, mountpoint])
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
        let mounts = (try? String(contentsOfFile: "/proc/mounts", encoding: .utf8)) ?? ""
        return mounts.split(separator: "\n").contains { $0.split(separator: " ").dropFirst().first.map(String.init) == mountpoint }
    }

    var log: String { (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? "" }

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

// Directory listings: read and decrypted once per opendir, and read again at a rewind.
import Foundation
import XCTest

final class ListingTests: EndToEndCase {
    func testAListingReadsTheBackingDirectoryOnce() throws {
        let vault = mountedVault()
        assertOK(vault.sh("mkdir d && cd d && for i in $(seq 300); do : > file-$i; done"), "fill")
        let pid = try XCTUnwrap(vault.daemonPID)
        let trace = scratch.path + "/trace"
        let strace = Process()
        strace.executableURL = URL(fileURLWithPath: "/usr/bin/strace")
        strace.arguments = ["-f", "-qq", "-e", "trace=getdents64", "-o", trace, "-p", "\(pid)"]
        try strace.run()
        defer { if strace.isRunning { strace.interrupt() }; strace.waitUntilExit() }
        // strace writes nothing until a call is traced: wait until it has attached to
        // every thread (each of the daemon's threads shows it as its tracer).
        let deadline = Date().addingTimeInterval(10)
        func allTraced() -> Bool {
            let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
            return !tasks.isEmpty && tasks.allSatisfy { task in
                let status = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/status", encoding: .utf8)) ?? ""
                return status.contains("TracerPid:\t\(strace.processIdentifier)\n")
            }
        }
        while !allTraced() && Date() < deadline { usleep(20_000) }
        XCTAssertTrue(allTraced(), "strace did not attach to every thread of the daemon")
        let listed = vault.sh("ls -f d | wc -l")
        XCTAssertEqual(listed.stdout.trimmingCharacters(in: .whitespacesAndNewlines), "302", listed.stderr)
        usleep(200_000)
        strace.interrupt()
        strace.waitUntilExit()
        let calls = try String(contentsOfFile: trace, encoding: .utf8).split(separator: "\n").filter { $0.contains("getdents64(") }
        // One pass: getdents64 calls that return entries, then one that returns 0.
        let ends = calls.filter { $0.hasSuffix("= 0") }
        XCTAssertEqual(ends.count, 1, "the directory was read \(ends.count) times:\n" + calls.joined(separator: "\n"))
    }

    func testRewinddirSeesEntriesMadeSinceOpendir() {
        let vault = mountedVault()
        let script = """
            import ctypes, os
            libc = ctypes.CDLL(None)
            libc.opendir.restype = ctypes.c_void_p
            libc.opendir.argtypes = [ctypes.c_char_p]
            libc.readdir.restype = ctypes.c_void_p
            libc.readdir.argtypes = [ctypes.c_void_p]
            libc.rewinddir.argtypes = [ctypes.c_void_p]
            libc.closedir.argtypes = [ctypes.c_void_p]
            d = libc.opendir(b".")
            def names():
                out = []
                while True:
                    entry = libc.readdir(d)
                    if not entry:
                        return sorted(out)
                    out.append(ctypes.string_at(entry + 19).decode())  # d_name of struct dirent64
            first = names()
            open("made-after-opendir", "w").close()
            libc.rewinddir(d)
            second = names()
            libc.closedir(d)
            print(first, second)
            assert "made-after-opendir" not in first and "made-after-opendir" in second
            """
        assertOK(vault.sh("touch old && python3 -c '\(script)'"), "rewinddir")
    }
}

// Directory listings: read and decrypted once per opendir, and read again at a rewind.
import Foundation
import XCTest

final class ListingTests: EndToEndCase {
    func testAListingReadsTheBackingDirectoryOnce() throws {
        let vault = mountedVault()
        assertOK(vault.sh("mkdir d && cd d && for i in $(seq 300); do : > file-$i; done"), "fill")
        let pid = try XCTUnwrap(vault.daemonPID)
        let calls = try tracing(pid, calls: "getdents64") {
            let listed = vault.sh("ls -f d | wc -l")
            XCTAssertEqual(listed.stdout.trimmingCharacters(in: .whitespacesAndNewlines), "302", listed.stderr)
        }.filter { $0.contains("getdents64(") }
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

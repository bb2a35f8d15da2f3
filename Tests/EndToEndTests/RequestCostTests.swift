// The backing-file calls a request makes, read off strace, where a change took one away
// (docs/PERFORMANCE.md says what each costs).
import Foundation
import XCTest

final class RequestCostTests: EndToEndCase {
    /// The first write of a new file needs its header for two things (its ID, and
    /// whether a lock sealed it to a key of its own); it is read once.
    func testTheFirstWriteOfANewFileReadsItsHeaderOnce() throws {
        let vault = mountedVault()
        assertOK(vault.sh("mkdir d"), "mkdir")
        let pid = try XCTUnwrap(vault.daemonPID)
        let reads = try tracing(pid, calls: "pread64") {
            assertOK(vault.sh("""
                python3 -c '
                block = bytes(4096)
                for i in range(3):
                    with open("d/new-%d" % i, "wb") as f: f.write(block)'
                """), "three new files")
        }.filter { $0.contains("pread64(") }
        // The header: version, file ID and place tag, the first 34 bytes (FORMAT.md §4).
        let headerReads = reads.filter { $0.hasSuffix(", 34, 0) = 34") }
        XCTAssertEqual(headerReads.count, 3, "header reads:\n" + reads.joined(separator: "\n"))
    }

    /// An aligned write stats its backing file twice: once for its size (which also
    /// serves the check that no other program removed the file before the write), once
    /// after it (the same check, and the set-ID clearing). Counted as the difference
    /// between a run of 21 writes and a run of 1, so the open and close do not count.
    func testAnAlignedWriteStatsTheBackingFileTwice() throws {
        let vault = mountedVault()
        assertOK(vault.sh("head -c 1M /dev/zero > f"), "a file")
        let pid = try XCTUnwrap(vault.daemonPID)
        func stats(writes: Int) throws -> [Substring] {
            try tracing(pid, calls: "%%stat") {
                assertOK(vault.sh("""
                    python3 -c '
                    import os
                    fd = os.open("f", os.O_WRONLY)
                    for i in range(\(writes)): os.pwrite(fd, bytes(4096), 4096 * i)
                    os.close(fd)'
                    """), "\(writes) writes")
            }
        }
        let one = try stats(writes: 1), many = try stats(writes: 21)
        XCTAssertLessThanOrEqual(many.count - one.count, 2 * 20,
                                 "one write:\n\(one.joined(separator: "\n"))\n21 writes:\n\(many.joined(separator: "\n"))")
    }
}

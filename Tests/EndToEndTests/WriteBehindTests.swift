// The disk started behind a long sequential write (WriteBehind), and only there, by the
// write-behind thread: the daemon's sync_file_range calls, read off strace.
import CofferSystem
import Foundation
import XCTest

final class WriteBehindTests: EndToEndCase {
    /// The writeback starts among strace's lines: a call that waits (an fsync's
    /// write-out) is not what this is about.
    private func startCalls(_ lines: [Substring]) -> [Substring] {
        lines.filter { $0.contains("sync_file_range(") && $0.contains(", SYNC_FILE_RANGE_WRITE)") }
    }

    /// (offset, length) of each start.
    private func ranges(_ starts: [Substring]) -> [(Int64, Int64)] {
        starts.map { call in
            let fields = call.split(separator: "(", maxSplits: 1)[1].split(separator: ",")
            return (Int64(fields[1].trimmingCharacters(in: .whitespaces)) ?? -1,
                    Int64(fields[2].trimmingCharacters(in: .whitespaces)) ?? -1)
        }
    }

    /// The daemon's writeback starts of backing files during `body`, traced until
    /// `until` holds for those seen so far (see `tracing`): (offset, length).
    private func starts(_ vault: MountedVault, until: (([(Int64, Int64)]) -> Bool)? = nil,
                        during body: () -> Void) throws -> [(Int64, Int64)] {
        let pid = try XCTUnwrap(vault.daemonPID)
        let traced: (([Substring]) -> Bool)? = until.map { until in
            { lines in until(self.ranges(self.startCalls(lines))) }
        }
        let lines = try tracing(pid, calls: "sync_file_range", until: traced, during: body)
        let starts = startCalls(lines)
        // Each on the write-behind thread, never on a thread that answers requests.
        for call in starts {
            let thread = call.prefix { $0 != " " }
            let name = KernelFiles.text("/proc/\(pid)/task/\(thread)/comm")
            XCTAssertEqual(name, "coffer-wbehind\n", "started by thread \(thread): \(call)")
        }
        return ranges(starts)
    }

    func testALongSequentialWriteStartsTheDiskBehindItInOrder() throws {
        let vault = mountedVault()
        let source = scratch.path + "/source"
        assertOK(Harness.sh("head -c 40M /dev/urandom > '\(source)'"), "source")
        // The backing file's size, once the stream is written.
        func backingSize() -> Int64? {
            vault.sh("stat -c %s \"$(find \"$C\" -type f -size +1M)\"").stdout
                .split(separator: "\n").first.flatMap { Int64($0) }
        }
        // Traced until the thread's last start (it may come after dd returns, on a slow
        // machine): one reaching within 5 MiB of the end, or 20 s.
        var written: Int64?
        let started = try starts(vault, until: { seen in
            guard let written, let last = seen.last else { return false }
            return last.0 + last.1 > written - (5 << 20)
        }) {
            assertOK(vault.sh("dd if='\(source)' of=stream bs=1M status=none"), "stream")
            written = backingSize()
        }
        // 40 MiB: from 8 MiB on, every 4 MiB (fewer calls if some waited for the thread
        // and were merged); none waits, each in whole pages, the first from the file's
        // start, each where the one before ended, none reaching the run's last block.
        XCTAssertGreaterThanOrEqual(started.count, 1, "\(started)")
        XCTAssertLessThanOrEqual(started.count, 9, "\(started)")
        XCTAssertEqual(started.first?.0, 0, "\(started)")
        for (index, (offset, length)) in started.enumerated() {
            XCTAssertEqual(offset % 4096, 0)
            XCTAssertEqual(length % 4096, 0)
            XCTAssertGreaterThan(length, 0)
            if index > 0 {
                let before = started[index - 1]
                XCTAssertEqual(offset, before.0 + before.1, "\(started)")
            }
        }
        let size = try XCTUnwrap(backingSize())
        XCTAssertLessThan(started.last.map { $0.0 + $0.1 } ?? 0, size)
        XCTAssertGreaterThan(started.last.map { $0.0 + $0.1 } ?? 0, size - (5 << 20))
        // What was written reads back.
        assertOK(vault.sh("cmp stream '\(source)'"), "stream read back")
    }

    func testShortFilesRewritesInPlaceAndSynchronousWritesAreLeftToTheKernel() throws {
        let vault = mountedVault()
        assertOK(vault.sh("truncate -s 32M db"), "sparse file")
        let started = try starts(vault) {
            // Files up to the run's threshold, one write or many.
            assertOK(vault.sh("dd if=/dev/zero of=short bs=1M count=7 status=none"), "short")
            assertOK(vault.sh("for i in $(seq 40); do head -c 64K /dev/zero > small-$i; done"), "small files")
            // 4 KiB writes in a 32 MiB file at offsets that never follow one another.
            assertOK(vault.sh("""
                python3 -c '
                import os, random
                fd = os.open("db", os.O_WRONLY); r = random.Random(7); block = os.urandom(4096)
                for _ in range(3000): os.pwrite(fd, block, r.randrange(0, 8192, 2) * 4096)
                os.close(fd)'
                """), "rewrites")
            // O_DSYNC: every write is on the disk when it returns.
            assertOK(vault.sh("dd if=/dev/zero of=synced bs=1M count=12 oflag=dsync status=none"), "synchronous")
        }
        XCTAssertEqual(started.count, 0, "writeback started for: \(started)")
    }
}

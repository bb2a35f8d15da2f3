// Keeps scripts/bench working: one round on tiny sizes (no timing is asserted — only
// that every workload ran on all three targets and produced a number).
import Foundation
import XCTest

final class BenchSmokeTests: EndToEndCase {
    func testQuickBenchRunsEveryWorkloadOnEveryTarget() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
        let json = scratch.path + "/bench.json"
        let r = Harness.run([root + "/scripts/bench", "--quick", "--coffer", Harness.coffer, "--dir", scratch.path, "--json", json],
                            timeout: 600)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr)
        XCTAssertTrue(r.stdout.contains("coffer/gocryptfs") || r.stdout.contains("c/gocryptfs"), r.stdout)
        let data = try Data(contentsOf: URL(fileURLWithPath: json))
        let rows = try XCTUnwrap((try JSONSerialization.jsonObject(with: data) as? [String: Any])?["rows"] as? [[String: Any]])
        XCTAssertEqual(rows.count, 10)
        for row in rows {
            XCTAssertGreaterThan((row["coffer"] as? Double) ?? 0, 0, "\(row)")
            XCTAssertGreaterThan((row["gocryptfs"] as? Double) ?? 0, 0, "\(row)")
            XCTAssertNotNil(row["coffer/gocryptfs"] as? Double, "\(row)")
        }
        XCTAssertFalse(Harness.sh("grep -E ' fuse\\\\.(coffer|gocryptfs) ' /proc/mounts | grep \(scratch.path)").stdout.contains(scratch.path),
                       "bench left a mount behind")
    }
}

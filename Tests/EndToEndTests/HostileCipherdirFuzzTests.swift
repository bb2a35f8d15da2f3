// End-to-end: a few seeded rounds of scripts/fuzz-cipherdir, the hostile-CIPHERDIR
// fuzzer, against the built coffer. Each round changes a vault's backing directory as a
// writer of it could and checks that every path serves what was written there, or EIO
// with a log line, and that fsck agrees. Thousands of rounds are for the script itself.
import Foundation
import XCTest

final class HostileCipherdirFuzzTests: EndToEndCase {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    func testSeededRoundsOfAHostileWriterHoldThePromise() {
        let rounds = 12
        let r = Harness.run(["python3", Self.repository + "/scripts/fuzz-cipherdir", "--coffer", Harness.coffer,
                             "--seed", "4545", "--rounds", String(rounds), "--no-shrink"], timeout: 600)
        XCTAssertEqual(r.status, 0, r.stdout + r.stderr)
        XCTAssertTrue(r.stdout.contains("fuzz-cipherdir: \(rounds) rounds, 0 failed (seed 4545)"), r.stdout + r.stderr)
    }
}

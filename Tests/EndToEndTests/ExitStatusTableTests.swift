// The README's table of exit statuses and the code's one list of them
// (Sources/coffer/ExitCodes.swift) say the same, so the two cannot drift apart; and the
// failures that once exited with a status or a message the table does not give.
import Foundation
import XCTest

final class ExitStatusTableTests: EndToEndCase {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    /// Status → the line's text, from `| N | meaning |` rows of the README's "Exit statuses".
    func readmeTable() throws -> [Int: String] {
        let readme = try String(contentsOfFile: Self.repository + "/README.md", encoding: .utf8)
        let section = try XCTUnwrap(readme.components(separatedBy: "## Exit statuses").dropFirst().first)
            .components(separatedBy: "\n## ").first ?? ""
        var out: [Int: String] = [:]
        for line in section.split(separator: "\n") where line.hasPrefix("| ") {
            let cells = line.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
            if let status = Int(cells.first ?? "") { out[status] = cells.dropFirst().first ?? "" }
        }
        return out
    }

    /// Status values of `case name = N` in the code's list.
    func codeTable() throws -> Set<Int> {
        let code = try String(contentsOfFile: Self.repository + "/Sources/coffer/ExitCodes.swift", encoding: .utf8)
        return Set(code.split(separator: "\n").compactMap { line -> Int? in
            let t = line.trimmingCharacters(in: .whitespaces)
            guard t.hasPrefix("case "), let eq = t.range(of: " = ") else { return nil }
            return Int(t[eq.upperBound...])
        })
    }

    func testTheReadmeTableListsExactlyTheStatusesTheCodeHas() throws {
        let readme = try readmeTable(), code = try codeTable()
        XCTAssertGreaterThan(code.count, 30)
        XCTAssertEqual(Set(readme.keys), code, "README only: \(Set(readme.keys).subtracting(code).sorted()); code only: \(code.subtracting(readme.keys).sorted())")
    }

    func testFsckWithDamageSaysSoInOneLineOnStderr() {
        let vault = mountedVault()
        assertOK(vault.sh("head -c 9000 /dev/urandom > f"), "write")
        vault.unmount()
        assertOK(Harness.sh("cd '\(vault.cipherdir)' && for f in *; do [ \"$(stat -c %s \"$f\" 2>/dev/null)\" -gt 9000 ] && printf x | dd of=\"$f\" bs=1 seek=100 conv=notrunc status=none || true; done"), "tamper")
        let r = vault.fsck()
        XCTAssertEqual(r.status, 40, r.stdout)
        XCTAssertEqual(r.stderr.split(separator: "\n").count, 1, r.stderr)
        XCTAssertTrue(r.stderr.hasPrefix("coffer: ") && r.stderr.contains("1 problem found"), r.stderr)
    }

    func testAHugeOrSymlinkedConfigIsAMalformedConfig() {
        let (dir, made) = initVault()
        assertOK(made, "init")
        for plant in ["truncate -s 2G coffer.conf", "ln -s real.conf coffer.conf"] {
            assertOK(Harness.sh("cd '\(dir)' && rm -f coffer.conf && \(plant)"), plant)
            let r = Harness.run([Harness.coffer, "info", dir])
            XCTAssertEqual(r.status, 13, "\(plant): \(r.stderr)")
            XCTAssertEqual(r.stderr.split(separator: "\n").count, 1, r.stderr)
        }
    }

    /// A symlinked IV file is damage, reported with a log line naming the directory,
    /// not a bare ELOOP.
    func testASymlinkedDirectoryIVIsReportedAsDamage() {
        let vault = mountedVault()
        assertOK(vault.sh("mkdir d"), "mkdir")
        let d = vault.backingPath(of: "d")
        vault.unmount()
        assertOK(Harness.sh("mv '\(d)/coffer.diriv' '\(vault.cipherdir)/iv.elsewhere' && ln -s ../iv.elsewhere '\(d)/coffer.diriv'"), "plant")
        vault.mount()
        XCTAssertTrue(vault.sh("ls d").stderr.contains("Input/output error"))
        XCTAssertTrue(vault.log.contains("damage: /d") && vault.log.contains("coffer.diriv is a symlink"), vault.log)
    }

    func testAnotherUsersLockIsRefusedAs28() {
        let vault = mountedVault()
        chmod(scratch.path, 0o755)  // nobody reaches the mountpoint, not the vault
        let r = Harness.sh("cd /; runuser -u nobody -- env -u XDG_RUNTIME_DIR '\(Harness.coffer)' lock '\(vault.mountpoint)' || echo \"status $?\"")
        XCTAssertTrue(r.stdout.contains("status 28"), r.stdout + r.stderr)
        XCTAssertTrue(r.stderr.contains("uid 0's mount"), r.stderr)
        XCTAssertTrue(Harness.run([Harness.coffer, "status", vault.mountpoint]).stdout.contains("unlocked"))
    }
}

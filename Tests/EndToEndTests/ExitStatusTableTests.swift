// The table of exit statuses in docs/guide/exit-statuses.md and the code's one list of
// them (Sources/coffer/ExitCodes.swift) say the same, so the two cannot drift apart; and
// the failures that once exited with a status or a message the table does not give.
import Foundation
import XCTest

final class ExitStatusTableTests: EndToEndCase {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path
    /// Where the table lives (README links to it).
    static let tablePath = "/docs/guide/exit-statuses.md"

    /// Status → the line's text, from the `| N | meaning |` rows of the table that follows
    /// the `| status | meaning |` header, up to its first line that is no table row.
    /// Fails on a missing header, a row that is not `| N | text |`, an empty meaning or a
    /// status listed twice.
    func documentedTable() throws -> [Int: String] {
        let text = try String(contentsOfFile: Self.repository + Self.tablePath, encoding: .utf8)
        let lines = text.components(separatedBy: "\n")
        let header = try XCTUnwrap(lines.firstIndex(of: "| status | meaning |"), "\(Self.tablePath) has no | status | meaning | table")
        var out: [Int: String] = [:]
        for line in lines.dropFirst(header + 2) {
            guard line.hasPrefix("|") else { break }
            let cells = line.split(separator: "|", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            let status = try XCTUnwrap(cells.count >= 4 ? Int(cells[1]) : nil, "not a status row: \(line)")
            let meaning = cells[2...].dropLast().joined(separator: "|")
            XCTAssertFalse(meaning.isEmpty, "status \(status) has no meaning")
            XCTAssertNil(out[status], "status \(status) is listed twice")
            out[status] = meaning
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

    func testTheDocumentedTableListsExactlyTheStatusesTheCodeHas() throws {
        let documented = try documentedTable(), code = try codeTable()
        XCTAssertGreaterThan(code.count, 30)
        let documentedOnly = Set(documented.keys).subtracting(code).sorted(), codeOnly = code.subtracting(documented.keys).sorted()
        XCTAssertEqual(Set(documented.keys), code, "\(Self.tablePath) only: \(documentedOnly); code only: \(codeOnly)")
        let readme = try String(contentsOfFile: Self.repository + "/README.md", encoding: .utf8)
        XCTAssertTrue(readme.contains("(docs/guide/exit-statuses.md)"), "README no longer links the table of exit statuses")
    }

    func testFsckWithDamageSaysSoInOneLineOnStderr() {
        let vault = mountedVault()
        assertOK(vault.sh("head -c 9000 /dev/urandom > f"), "write")
        vault.unmount()
        assertOK(Harness.sh("cd '\(vault.cipherdir)' && for f in ./*; do [ \"$(stat -c %s \"$f\" 2>/dev/null)\" -gt 9000 ] && \(Harness.flipByte) \"$f\" 100 || true; done"), "tamper")
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

    /// A path longer than Linux takes is a directory argument that cannot be one (10), or
    /// a mountpoint that cannot exist (30), said in one line that does not repeat 5,000 bytes.
    func testAPathTooLongForLinuxIsSaidSo() {
        let long = scratch.path + "/" + String(repeating: String(repeating: "a", count: 250) + "/", count: 20)
        for (command, status) in [(["info", long], 10), (["mount", long, scratch.path], 10), (["lock", long], 30), (["unmount", long], 30)] {
            let r = Harness.run([Harness.coffer] + command)
            XCTAssertEqual(r.status, Int32(status), "\(command[0]): \(r.stderr)")
            XCTAssertEqual(r.stderr.split(separator: "\n").count, 1, r.stderr)
            XCTAssertTrue(r.stderr.contains("too long a path") && r.stderr.utf8.count < 300, r.stderr)
        }
    }

    /// An undo journal that is not a regular file (a FIFO, a symlink) makes the state
    /// directory unusable: 44, and the mount does not come up.
    func testAJournalThatIsNotARegularFileIsAnUnusableStateDirectory() {
        for plant in ["mkfifo coffer.journal", "ln -s /etc/passwd coffer.journal"] {
            let vault = MountedVault(scratch: scratch, name: "j\(plant.count)")
            assertOK(Harness.sh("mkdir -m 700 '\(vault.stateDir)' && cd '\(vault.stateDir)' && \(plant)"), plant)
            let r = Harness.run([Harness.coffer, "mount", "--passfile", vault.passfile, "--state-dir", vault.stateDir, vault.cipherdir, vault.mountpoint])
            XCTAssertEqual(r.status, 44, "\(plant): \(r.stderr)")
            XCTAssertEqual(r.stderr.split(separator: "\n").count, 1, r.stderr)
            XCTAssertTrue(r.stderr.contains("coffer.journal"), r.stderr)
            XCTAssertFalse(vault.isMounted)
        }
    }

    /// A daemon that answers every request with `busy` (here a stand-in that does only
    /// that) is retried for 10 s, then the command exits 45 in one line.
    func testADaemonThatStaysBusyExits45() throws {
        let socket = scratch.path + "/busy.sock"
        let server = Process()
        server.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        server.arguments = ["-c", """
            import json, socket, struct, sys
            s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(64)
            body = json.dumps({"version": 1, "ok": False, "error": "busy", "message": "the daemon is busy; try again"}).encode()
            while True:
                c, _ = s.accept()
                try:
                    n = struct.unpack(">I", c.recv(4))[0]; c.recv(n); c.sendall(struct.pack(">I", len(body)) + body)
                except OSError:
                    pass
                c.close()
            """, socket]
        try server.run()
        defer { server.terminate(); server.waitUntilExit() }
        for _ in 0..<500 where !FileManager.default.fileExists(atPath: socket) { usleep(20_000) }  // up to 10 s
        XCTAssertTrue(FileManager.default.fileExists(atPath: socket), "the stand-in daemon is not listening")
        let r = Harness.run([Harness.coffer, "status", "--socket", socket, scratch.path])
        XCTAssertEqual(r.status, 45, r.stderr)
        XCTAssertEqual(r.stderr.split(separator: "\n").count, 1, r.stderr)
        XCTAssertTrue(r.stderr.contains("stayed busy"), r.stderr)
    }
}

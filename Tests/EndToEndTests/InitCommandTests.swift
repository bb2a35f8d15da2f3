// End-to-end tests of `coffer init` and `coffer info`: results, messages, exit statuses.
import Foundation
import XCTest

final class InitCommandTests: EndToEndCase {
    func testInitCreatesAVaultWithoutSecretsInIt() {
        let (dir, outcome) = initVault(passphrase: "sekrit phrase 42")
        XCTAssertEqual(outcome.status, 0, outcome.stderr)
        XCTAssertTrue(outcome.stdout.contains("Recovery key"))
        let key = outcome.stdout.split(separator: "\n").last.map(String.init) ?? ""
        XCTAssertEqual(key.count, 79, "recovery key printed as 16 groups of 4 hex digits")
        let grep = Harness.run(["grep", "-r", "-e", "sekrit phrase 42", "-e", key, dir])
        XCTAssertEqual(grep.status, 1, "neither passphrase nor recovery key in any file: \(grep.stdout)")
        let info = Harness.run([Harness.coffer, "info", dir])
        XCTAssertEqual(info.status, 0)
        let format = "7"
        XCTAssertTrue(info.stdout.contains("Format version: \(format)"), "new vaults here are format \(format): \(info.stdout)")
        XCTAssertTrue(info.stdout.contains("argon2id13, 2 passes, 64 MiB"))
        XCTAssertFalse(info.stdout.contains(key))
    }

    func testRecoveryKeyOutWritesAPrivateFile() throws {
        let dir = scratch.mkdir("v")
        let out = scratch.path + "/rk"
        let r = Harness.run([Harness.coffer, "init", "--kdf-ops", "2", "--kdf-memory", "64",
                             "--recovery-key-out", out, dir], input: "pass\n")
        XCTAssertEqual(r.status, 0, r.stderr)
        let attrs = try FileManager.default.attributesOfItem(atPath: out)
        XCTAssertEqual((attrs[.posixPermissions] as? NSNumber)?.intValue, 0o600)
        XCTAssertEqual(try String(contentsOfFile: out, encoding: .utf8).count, 80)
        XCTAssertFalse(r.stdout.contains(try String(contentsOfFile: out, encoding: .utf8).prefix(20)))
    }

    func testEveryUserErrorHasItsMessageAndStatus() {
        let passfile = scratch.file("p", "pass\n")
        let full = scratch.mkdir("full")
        _ = scratch.file("full/x", "x")
        let cases: [([String], String?, Int32, String)] = [
            (["init", "--passfile", passfile, full], nil, 11, "is not empty"),
            (["init", "--passfile", passfile, scratch.path + "/missing"], nil, 10, "is not a directory"),
            (["init", "--passfile", passfile, passfile], nil, 10, "is not a directory"),
            (["init", scratch.mkdir("e1")], "", 20, "empty passphrase"),
            (["init", scratch.mkdir("e2")], "\n", 20, "empty passphrase"),
            (["init", "--passfile", scratch.path + "/nofile", scratch.mkdir("e3")], nil, 24, "cannot read passphrase file"),
            (["init", "--kdf-ops", "1", scratch.mkdir("e4")], "p\n", 64, "--kdf-ops"),
            (["info", full], nil, 12, "is not a coffer vault"),
        ]
        for (arguments, input, status, message) in cases {
            let r = Harness.run([Harness.coffer] + arguments, input: input ?? "")
            XCTAssertEqual(r.status, status, "\(arguments): \(r.stderr)")
            XCTAssertTrue(r.stderr.contains(message), "\(arguments): \(r.stderr)")
            XCTAssertEqual(r.stderr.split(separator: "\n").count, r.status == 64 ? r.stderr.split(separator: "\n").count : 1,
                           "one line: \(r.stderr)")
        }
    }

    /// `coffer init` killed at each step (strace kills it as it makes its Nth call of a
    /// kind: the IV file's or the config's write, a fsync, the rename): what it left
    /// mounts with one clear message (status 12), and `init` run again makes the vault,
    /// which mounts and works. A directory holding anything else is still not empty.
    func testAnInitCutShortIsMadeAgain() {
        let passfile = scratch.file("p", "pass\n")
        var cutShort = 0
        for (call, n) in [("pwrite64", 1), ("pwrite64", 2), ("fsync", 1), ("fsync", 2), ("renameat2", 1), ("rename", 1)] {
            let dir = scratch.mkdir("cut-\(call)-\(n)"), mountpoint = scratch.mkdir("cut-\(call)-\(n).plain")
            let cut = Harness.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=\(call)", "-e", "inject=\(call):error=EIO:signal=KILL:when=\(n)",
                                   Harness.coffer, "init", "--kdf-ops", "2", "--kdf-memory", "64", "--passfile", passfile, dir])
            guard cut.status != 0 else { continue }  // this step is not one init makes
            let left = (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []
            if !left.contains("coffer.conf") {
                cutShort += left.isEmpty ? 0 : 1
                let mount = coffer(["mount", "--passfile", passfile, dir, mountpoint])
                XCTAssertEqual(mount.status, 12, "\(call) \(n): \(mount.stderr)")
                XCTAssertTrue(mount.stderr.contains("what an init cut short leaves") || left.isEmpty, "\(call) \(n): \(left) \(mount.stderr)")
                assertOK(coffer(["init", "--kdf-ops", "2", "--kdf-memory", "64", "--passfile", passfile, dir]), "\(call) \(n): init again")
            }
            assertOK(coffer(["mount", "--passfile", passfile, dir, mountpoint]), "\(call) \(n): mount")
            assertOK(Harness.sh("echo x > '\(mountpoint)/f' && cat '\(mountpoint)/f' > /dev/null"), "\(call) \(n): use")
            assertOK(coffer(["unmount", mountpoint]), "unmount")
        }
        XCTAssertGreaterThan(cutShort, 0, "no kill left an init's files without its config")
        let other = scratch.mkdir("other")
        _ = scratch.file("other/coffer.diriv", "x")
        _ = scratch.file("other/notes", "mine")
        let refused = coffer(["init", "--passfile", passfile, other])
        XCTAssertEqual(refused.status, 11, refused.stderr)
    }

    func testDamagedConfigIsReported() throws {
        let (dir, outcome) = initVault()
        XCTAssertEqual(outcome.status, 0)
        let conf = dir + "/coffer.conf"
        chmod(conf, 0o600)
        var text = try String(contentsOfFile: conf, encoding: .utf8)
        text = text.replacingOccurrences(of: "\"blockSize\" : 4096", with: "\"blockSize\" : 8192")
        try text.write(toFile: conf, atomically: false, encoding: .utf8)
        let r = Harness.run([Harness.coffer, "info", dir])
        XCTAssertEqual(r.status, 13, r.stderr)
        XCTAssertTrue(r.stderr.contains("modified or damaged"), r.stderr)
        try "{\"format\": 9}".write(toFile: conf, atomically: false, encoding: .utf8)
        let v = Harness.run([Harness.coffer, "info", dir])
        XCTAssertEqual(v.status, 14, v.stderr)
        XCTAssertTrue(v.stderr.contains("format version 9"), v.stderr)
    }

    func testSpeedPrintsEngineAndRawFigures() {
        let r = Harness.run([Harness.coffer, "speed", "--seconds", "0.05"])
        XCTAssertEqual(r.status, 0)
        XCTAssertTrue(r.stdout.contains("seal (random nonce)"))
        XCTAssertTrue(r.stdout.contains("raw libsodium"))
    }
}

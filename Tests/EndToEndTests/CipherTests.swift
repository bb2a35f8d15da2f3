// The two content ciphers end to end: which one `init` chooses, that both serve the
// same workload and pass fsck, what each writes on disk, and that an AES-256-GCM vault
// is refused with its own status on a CPU without AES-NI (simulated with LD_PRELOAD).
import CofferSystem
import Foundation
import XCTest

final class CipherTests: EndToEndCase {
    /// The `contentCipher` and `format` of a vault's coffer.conf.
    func cipherAndFormat(_ cipherdir: String) throws -> (String, Int) {
        let data = try Data(contentsOf: URL(fileURLWithPath: cipherdir + "/coffer.conf"))
        let object = try XCTUnwrap(JSONSerialization.jsonObject(with: data) as? [String: Any])
        return (try XCTUnwrap(object["contentCipher"] as? String), try XCTUnwrap(object["format"] as? Int))
    }

    /// A library that makes libsodium report no AES-NI, for LD_PRELOAD.
    func noAESLibrary() throws -> String {
        let source = scratch.file("noaes.c", "int crypto_aead_aes256gcm_is_available(void) { return 0; }\n")
        let library = scratch.path + "/noaes.so"
        let r = Harness.run(["clang", "-shared", "-fPIC", "-o", library, source])
        XCTAssertEqual(r.status, 0, "clang: \(r.stderr)")
        return library
    }

    func withoutAES() throws -> [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["LD_PRELOAD"] = try noAESLibrary()
        return environment
    }

    func testInitChoosesAESWhereTheCPUHasItAndXChaChaOnRequest() throws {
        let aes = MountedVault(scratch: scratch, name: "aes")
        let (cipher, format) = try cipherAndFormat(aes.cipherdir)
        let hasAES = ContentAlgorithmProbe.aesAvailable
        XCTAssertEqual(cipher, hasAES ? "aes256gcm" : "xchacha20-poly1305")
        XCTAssertEqual(format, 7, "new vaults of either cipher are format 7")
        let xchacha = MountedVault(scratch: scratch, name: "xchacha", initOptions: ["--cipher", "xchacha20-poly1305"])
        let (cipher2, format2) = try cipherAndFormat(xchacha.cipherdir)
        XCTAssertEqual(cipher2, "xchacha20-poly1305")
        XCTAssertEqual(format2, 7)
        let old = MountedVault(scratch: scratch, name: "old", initOptions: ["--cipher", "xchacha20-poly1305", "--format", "2"])
        XCTAssertEqual(try cipherAndFormat(old.cipherdir).1, 2, "--format makes a vault that coffers knowing format 2 read")
        let info = Harness.run([Harness.coffer, "info", xchacha.cipherdir])
        XCTAssertTrue(info.stdout.contains("Content cipher: xchacha20-poly1305"), info.stdout)
        let bad = Harness.run([Harness.coffer, "init", "--cipher", "rot13", "--passfile", aes.passfile, scratch.mkdir("bad")])
        XCTAssertEqual(bad.status, 64, bad.stderr)
        XCTAssertTrue(bad.stderr.contains("aes256gcm") && bad.stderr.contains("xchacha20-poly1305"), bad.stderr)
    }

    func testBothCiphersServeTheSameWorkloadAndPassFsck() throws {
        try XCTSkipUnless(ContentAlgorithmProbe.aesAvailable, "no AES-NI here")
        for cipher in ["aes256gcm", "xchacha20-poly1305"] {
            let vault = MountedVault(scratch: scratch, name: cipher, initOptions: ["--cipher", cipher])
            vault.mount()
            let reference = scratch.mkdir(cipher + ".reference")
            let sources = scratch.mkdir(cipher + ".sources")
            assertOK(Harness.sh("cd '\(sources)' && head -c 1048577 /dev/urandom > big && head -c 300 /dev/urandom > patch && for n in 0 1 4095 4096 4097; do head -c $n /dev/urandom > f$n; done"), "sources")
            // The same operations in the mount and in a plain directory; the trees must match.
            let script = """
                set -e
                cp '\(sources)'/big '\(sources)'/f* .
                cp big copy; printf 'appended' >> copy
                dd if='\(sources)'/patch of=copy bs=1 seek=5000 conv=notrunc status=none
                truncate -s 7000 f4097; truncate -s 20000 f1
                """
            assertOK(vault.sh(script), "\(cipher): workload")
            assertOK(Harness.sh("cd '\(reference)' && " + script), "\(cipher): the workload in a plain directory")
            assertOK(Harness.sh("diff -r '\(vault.mountpoint)' '\(reference)'"), "\(cipher): contents")
            vault.unmount()
            vault.mount()
            assertOK(Harness.sh("diff -r '\(vault.mountpoint)' '\(reference)'"), "\(cipher): contents after remount")
            // The nonce field of block 0 of a backing file (after the 34-byte header of
            // format 4): AES-256-GCM leaves its last 12 bytes zero.
            let spare = Harness.sh("cd '\(vault.cipherdir)' && for f in ./*; do [ \"$(stat -c %s \"$f\")\" -gt 100000 ] && od -An -tx1 -j 46 -N 12 \"$f\" | tr -d ' \\n' && break || true; done")
            if cipher == "aes256gcm" {
                XCTAssertEqual(spare.stdout, String(repeating: "00", count: 12), "\(cipher): spare nonce bytes")
            } else {
                XCTAssertNotEqual(spare.stdout, String(repeating: "00", count: 12), "\(cipher): a 24-byte random nonce")
                XCTAssertEqual(spare.stdout.count, 24, spare.stderr)
            }
            vault.unmount()
            let fsck = vault.fsck()
            XCTAssertEqual(fsck.status, 0, "\(cipher): \(fsck.stdout)\(fsck.stderr)")
            XCTAssertTrue(fsck.stdout.contains("no problems"), fsck.stdout)
        }
    }

    /// The two AES-256-GCM engines (COFFER_AES_ENGINE) make the same format: what a mount
    /// run by one wrote — whole and partial blocks, an empty file, a hole, a block
    /// rewritten in place — reads byte for byte under the other, which rewrites and
    /// appends in turn for the first to read back; fsck under each passes. The daemon's
    /// log names the engine it was told to use.
    func testAVaultWrittenByOneAESEngineReadsUnderTheOther() throws {
        try XCTSkipUnless(ContentAlgorithmProbe.aesAvailable, "no AES-NI here")
        let vault = MountedVault(scratch: scratch, name: "engines", initOptions: ["--cipher", "aes256gcm"])
        let reference = scratch.mkdir("engines.reference")
        let sources = scratch.mkdir("engines.sources")
        assertOK(Harness.sh("cd '\(sources)' && head -c 1048577 /dev/urandom > big && head -c 300 /dev/urandom > patch && for n in 0 1 4095 4096 4097; do head -c $n /dev/urandom > f$n; done"), "sources")
        let steps = [
            ("ipsec-mb", "cp '\(sources)'/big '\(sources)'/f* . && truncate -s 3000000 sparse && dd if='\(sources)'/patch of=sparse bs=1 seek=2000000 conv=notrunc status=none"),
            ("libsodium", "dd if='\(sources)'/patch of=big bs=1 seek=5000 conv=notrunc status=none && printf 'appended' >> f4097 && cp f4096 copy && truncate -s 20000 f1"),
            ("ipsec-mb", "dd if='\(sources)'/patch of=copy bs=1 seek=10 conv=notrunc status=none && cat '\(sources)'/patch >> big"),
        ]
        for (n, (engine, script)) in steps.enumerated() {
            vault.environment["COFFER_AES_ENGINE"] = engine
            vault.mount()
            let said = vault.log.split(separator: "\n").last { $0.contains("AES-256-GCM content blocks by") }.map(String.init) ?? ""
            if engine == "ipsec-mb", said.contains("libsodium instead") {
                vault.unmount()
                throw XCTSkip("ipsec-mb does not run here: \(said)")
            }
            XCTAssertTrue(said.contains("by \(engine) ") && said.contains("COFFER_AES_ENGINE=\(engine)"), "step \(n): \(said)")
            // Read what the other engine wrote, then write under this one.
            assertOK(Harness.sh("diff -r '\(vault.mountpoint)' '\(reference)'"), "step \(n) (\(engine)): reading the previous step's files")
            assertOK(vault.sh(script), "step \(n) (\(engine)): writing")
            assertOK(Harness.sh("cd '\(reference)' && " + script), "step \(n): the same in a plain directory")
            vault.unmount()
        }
        vault.environment["COFFER_AES_ENGINE"] = "libsodium"
        vault.mount()
        assertOK(Harness.sh("diff -r '\(vault.mountpoint)' '\(reference)'"), "the last step's files under libsodium")
        vault.unmount()
        for engine in ["libsodium", "ipsec-mb"] {
            vault.environment["COFFER_AES_ENGINE"] = engine
            let fsck = vault.fsck()
            XCTAssertEqual(fsck.status, 0, "fsck by \(engine): \(fsck.stdout)\(fsck.stderr)")
            XCTAssertTrue(fsck.stdout.contains("no problems"), fsck.stdout)
        }
    }

    /// A value of COFFER_AES_ENGINE that names no engine is refused by `coffer mount`.
    func testAnUnknownAESEngineIsRefused() throws {
        let vault = MountedVault(scratch: scratch, name: "unknown")
        var environment = ProcessInfo.processInfo.environment
        environment["COFFER_AES_ENGINE"] = "openssl"
        let r = Harness.run([Harness.coffer, "mount", "--passfile", vault.passfile, vault.cipherdir, vault.mountpoint], environment: environment)
        XCTAssertNotEqual(r.status, 0)
        XCTAssertTrue(r.stderr.contains("COFFER_AES_ENGINE=openssl: not an AES engine"), r.stderr)
        XCTAssertFalse(vault.isMounted)
    }

    func testAChangedSpareNonceByteIsDamageInAnAESVault() throws {
        try XCTSkipUnless(ContentAlgorithmProbe.aesAvailable, "no AES-NI here")
        let vault = MountedVault(scratch: scratch, name: "aes", initOptions: ["--cipher", "aes256gcm"])
        vault.mount()
        assertOK(vault.sh("head -c 10000 /dev/urandom > f"), "write")
        vault.unmount()
        // Byte 34 + 20 of the only content file: inside the spare half of block 0's nonce field.
        assertOK(Harness.sh("cd '\(vault.cipherdir)' && for f in ./*; do [ \"$(stat -c %s \"$f\")\" -gt 9000 ] && printf '\\x01' | dd of=\"$f\" bs=1 seek=54 conv=notrunc status=none || true; done"), "tamper")
        let fsck = vault.fsck()
        XCTAssertEqual(fsck.status, 40, fsck.stdout + fsck.stderr)
        XCTAssertTrue(fsck.stdout.contains("block 0 failed authentication"), fsck.stdout)
        vault.mount()
        let read = vault.sh("cat f > /dev/null")
        XCTAssertNotEqual(read.status, 0)
        XCTAssertTrue(read.stderr.contains("Input/output error"), read.stderr)
        vault.unmount()
    }

    func testAnAESVaultIsRefusedOnACPUWithoutAESNI() throws {
        try XCTSkipUnless(ContentAlgorithmProbe.aesAvailable, "no AES-NI here")
        let vault = MountedVault(scratch: scratch, name: "aes", initOptions: ["--cipher", "aes256gcm"])
        let environment = try withoutAES()
        let mount = Harness.run([Harness.coffer, "mount", "--passfile", vault.passfile, vault.cipherdir, vault.mountpoint],
                                environment: environment)
        XCTAssertEqual(mount.status, 16, mount.stderr)
        XCTAssertTrue(mount.stderr.contains("AES-NI"), mount.stderr)
        XCTAssertFalse(vault.isMounted)
        let fsck = Harness.run([Harness.coffer, "fsck", "--passfile", vault.passfile, vault.cipherdir], environment: environment)
        XCTAssertEqual(fsck.status, 16, fsck.stderr)
        // What needs no content key still works there.
        XCTAssertEqual(Harness.run([Harness.coffer, "info", vault.cipherdir], environment: environment).status, 0)
        let forced = Harness.run([Harness.coffer, "init", "--cipher", "aes256gcm", "--passfile", vault.passfile, scratch.mkdir("forced")],
                                 environment: environment)
        XCTAssertEqual(forced.status, 16, forced.stderr)
        let fallback = scratch.mkdir("fallback")
        let plain = Harness.run([Harness.coffer, "init", "--kdf-ops", "2", "--kdf-memory", "64", "--passfile", vault.passfile, fallback],
                                environment: environment)
        XCTAssertEqual(plain.status, 0, plain.stderr)
        XCTAssertEqual(try cipherAndFormat(fallback).0, "xchacha20-poly1305", "without AES-NI, init falls back")
    }
}

/// Whether this CPU has AES-NI, as the kernel reports it.
enum ContentAlgorithmProbe {
    static let aesAvailable = (KernelFiles.text("/proc/cpuinfo") ?? "").contains(" aes ")
}

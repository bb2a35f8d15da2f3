// Tests of vault creation and unlocking: key slots, recovery key, passphrase change,
// and refusal of every kind of edited or damaged config.
import CofferCrypto
@testable import CofferVault
import Foundation
import TestSupport
import XCTest

final class VaultConfigTests: XCTestCase, VaultTestCase {
    var dir: TempDirectory!
    let passphrase = "correct horse battery staple"

    override func setUp() { dir = TempDirectory() }
    override func tearDown() { dir = nil }

    func editConfig(_ edit: (inout [String: Any]) -> Void) throws {
        let url = URL(fileURLWithPath: dir.path + "/" + VaultConfig.fileName)
        var json = try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as! [String: Any]
        edit(&json)
        chmod(url.path, 0o600)
        try JSONSerialization.data(withJSONObject: json).write(to: url)
    }

    func testPassphraseAndRecoveryKeyOpenTheSameMasterKey() throws {
        let (vault, recovery) = try makeVault()
        let a = try vault.unlock(passphrase: secret(passphrase))
        let b = try vault.unlock(recoveryKey: recovery)
        XCTAssertEqual(contentKey(a), contentKey(b))
        let reopened = try Vault.open(at: dir.path)
        XCTAssertEqual(contentKey(try reopened.unlock(passphrase: secret(passphrase))), contentKey(a))
    }

    func testWrongSecretsHaveTheirOwnErrors() throws {
        let (vault, _) = try makeVault()
        XCTAssertThrowsError(try vault.unlock(passphrase: secret("wrong"))) { XCTAssertEqual($0 as? VaultError, .wrongPassphrase) }
        XCTAssertThrowsError(try vault.unlock(recoveryKey: .random(count: 32))) { XCTAssertEqual($0 as? VaultError, .wrongRecoveryKey) }
    }

    func testInitRefusesNonEmptyOrMissingDirectory() throws {
        dir.write("x", [1])
        XCTAssertThrowsError(try makeVault()) { XCTAssertEqual($0 as? VaultError, .directoryNotEmpty(path: dir.path)) }
        XCTAssertThrowsError(try Vault.create(at: dir.path + "/x", passphrase: secret("p"), kdf: .floor)) {
            XCTAssertEqual($0 as? VaultError, .notADirectory(path: dir.path + "/x"))
        }
        XCTAssertThrowsError(try Vault.open(at: dir.path)) { XCTAssertEqual($0 as? VaultError, .notAVault(path: dir.path)) }
    }

    func testNoSecretInAnyFile() throws {
        let (vault, recovery) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        let needles: [[UInt8]] = [Array(passphrase.utf8), master.secret.withUnsafeBytes { Array($0) },
                                  recovery.withUnsafeBytes { Array($0) }, contentKey(master),
                                  RecoveryKey.format(recovery).withUnsafeBytes { Array($0) }]
        for file in dir.allFiles() {
            let bytes = Array(FileManager.default.contents(atPath: file) ?? Data())
            for needle in needles {
                XCTAssertFalse(bytes.containsSubsequence(needle), "\(file) holds a secret")
            }
        }
    }

    func testEveryFlippedByteOfTheConfigIsRefused() throws {
        let (vault, recovery) = try makeVault()
        let original = vault.config.serialized()
        for i in stride(from: 0, to: original.count, by: 3) {
            var bad = original
            bad[i] ^= 0x01
            guard let config = try? VaultConfig.parse(bad) else { continue }  // refused on load
            // Parsed (e.g. a flip inside a base64 slot): unlocking must still fail.
            try config.save(in: dir.fd)
            let reopened = try Vault.open(at: dir.path)
            if config == vault.config { continue }  // flip landed in whitespace: same config
            // A flip in one slot breaks that slot; the other may still open.
            let passphraseOpens = (try? reopened.unlock(passphrase: secret(passphrase))) != nil
            let recoveryOpens = (try? reopened.unlock(recoveryKey: recovery)) != nil
            XCTAssertFalse(passphraseOpens && recoveryOpens, "flip at \(i) went unnoticed")
        }
    }

    func testWeakenedKDFIsRefused() throws {
        _ = try makeVault()
        try editConfig { json in
            var kdf = json["kdf"] as! [String: Any]
            kdf["opsLimit"] = 1
            json["kdf"] = kdf
            // A careful attacker also fixes the checksum.
            let data = try! JSONSerialization.data(withJSONObject: json)
            var c = try! JSONDecoder().decode(VaultConfig.self, from: data)
            json["checksum"] = c.computedChecksum()
            c.checksum = ""
        }
        XCTAssertThrowsError(try Vault.open(at: dir.path)) {
            XCTAssertEqual($0 as? VaultError, .kdfParametersRefused(opsLimit: 1, memLimit: 64 << 20))
        }
    }

    func testEditedParameterWithFixedChecksumFailsToUnlock() throws {
        _ = try makeVault()
        try editConfig { json in
            var kdf = json["kdf"] as! [String: Any]
            kdf["opsLimit"] = 3  // stronger, but still an edit: the slot's AD no longer matches
            json["kdf"] = kdf
            json["created"] = "2020-01-01T00:00:00Z"
            let c = try! JSONDecoder().decode(VaultConfig.self, from: JSONSerialization.data(withJSONObject: json))
            json["checksum"] = c.computedChecksum()
        }
        let vault = try Vault.open(at: dir.path)
        XCTAssertThrowsError(try vault.unlock(passphrase: secret(passphrase))) { XCTAssertEqual($0 as? VaultError, .wrongPassphrase) }
    }

    func testEditedParameterWithoutChecksumIsDamage() throws {
        _ = try makeVault()
        try editConfig { $0["created"] = "2020-01-01T00:00:00Z" }
        XCTAssertThrowsError(try Vault.open(at: dir.path)) { XCTAssertEqual($0 as? VaultError, .configDamaged) }
    }

    /// AES-256-GCM came with format 3: a lower format naming it (with a correct checksum)
    /// is refused, never read with the wrong cipher.
    func testAESInAFormat2ConfigIsRefused() throws {
        _ = try makeVault()
        var config = try VaultConfig.parse(dir.read(VaultConfig.fileName))
        config.format = 2
        config.contentCipher = ContentAlgorithm.aes256gcm.rawValue
        config.checksum = config.computedChecksum()
        XCTAssertThrowsError(try VaultConfig.parse(config.serialized())) {
            XCTAssertEqual($0 as? VaultError, .unsupportedParameter("cipher aes256gcm in format 2"))
        }
        config.format = 3
        config.checksum = config.computedChecksum()
        XCTAssertEqual(try VaultConfig.parse(config.serialized()).contentAlgorithm, .aes256gcm)
    }

    func testUnknownFormatAndMalformedConfig() throws {
        _ = try makeVault()
        try editConfig { $0["format"] = 9 }
        XCTAssertThrowsError(try Vault.open(at: dir.path)) { XCTAssertEqual($0 as? VaultError, .unsupportedFormat(version: 9)) }
        dir.write(VaultConfig.fileName, Array("{\"format\": 1}".utf8))
        XCTAssertThrowsError(try Vault.open(at: dir.path)) {
            guard case .configMalformed = $0 as? VaultError else { return XCTFail("\($0)") }
        }
        dir.write(VaultConfig.fileName, Array("garbage".utf8))
        XCTAssertThrowsError(try Vault.open(at: dir.path)) {
            guard case .configMalformed = $0 as? VaultError else { return XCTFail("\($0)") }
        }
    }

    func testChangePassphraseRewrapsOnlyItsSlot() throws {
        let (vault, recovery) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        let oldSlot = try vault.config.slot(VaultConfig.passphraseSlot).wrappedKey
        let recoverySlot = try vault.config.slot(VaultConfig.recoverySlot)
        try vault.changePassphrase(master: master, newPassphrase: secret("new passphrase"))
        let reopened = try Vault.open(at: dir.path)
        XCTAssertEqual(contentKey(try reopened.unlock(passphrase: secret("new passphrase"))), contentKey(master))
        XCTAssertThrowsError(try reopened.unlock(passphrase: secret(passphrase))) { XCTAssertEqual($0 as? VaultError, .wrongPassphrase) }
        XCTAssertEqual(contentKey(try reopened.unlock(recoveryKey: recovery)), contentKey(master))
        XCTAssertEqual(try reopened.config.slot(VaultConfig.recoverySlot), recoverySlot)
        for file in dir.allFiles() {
            let text = String(decoding: FileManager.default.contents(atPath: file) ?? Data(), as: UTF8.self)
            XCTAssertFalse(text.contains(oldSlot), "\(file) still holds the old wrapped key")
        }
    }
}

extension Array where Element == UInt8 {
    func containsSubsequence(_ needle: [UInt8]) -> Bool {
        guard !needle.isEmpty, count >= needle.count else { return false }
        return (0...(count - needle.count)).contains { self[$0..<$0 + needle.count].elementsEqual(needle) }
    }
}

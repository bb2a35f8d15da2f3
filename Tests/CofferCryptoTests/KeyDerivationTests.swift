// Tests of the passphrase KDF, the sealed box, base64url and recovery-key parsing.
import CofferCrypto
import XCTest

final class KeyDerivationTests: XCTestCase {
    func secret(_ text: String) -> SecureBytes {
        let bytes = Array(text.utf8)
        let s = SecureBytes(count: bytes.count)
        s.withUnsafeMutableBytes { $0.copyBytes(from: bytes) }
        return s
    }

    func testArgon2idIsDeterministicAndPassphraseSensitive() throws {
        let salt = Sodium.randomArray(count: PassphraseKDF.saltSize)
        let a = try PassphraseKDF.deriveKey(passphrase: secret("one"), salt: salt, parameters: .floor)
        let b = try PassphraseKDF.deriveKey(passphrase: secret("one"), salt: salt, parameters: .floor)
        let c = try PassphraseKDF.deriveKey(passphrase: secret("two"), salt: salt, parameters: .floor)
        XCTAssertTrue(a.constantTimeEquals(b))
        XCTAssertFalse(a.constantTimeEquals(c))
        XCTAssertThrowsError(try PassphraseKDF.deriveKey(passphrase: secret("one"), salt: [1, 2], parameters: .floor))
    }

    func testFloorAndCeiling() {
        XCTAssertTrue(KDFParameters.standard.isAcceptable)
        XCTAssertTrue(KDFParameters.floor.isAcceptable)
        XCTAssertFalse(KDFParameters(opsLimit: 1, memLimit: 64 << 20).isAcceptable)
        XCTAssertFalse(KDFParameters(opsLimit: 2, memLimit: 32 << 20).isAcceptable)
        XCTAssertFalse(KDFParameters(opsLimit: 2, memLimit: 1 << 40).isAcceptable)
    }

    func testSealedBoxBindsAssociatedData() throws {
        let box = SealedBox(key: .random(count: 32))
        let sealed = try Array("target".utf8).withUnsafeBytes { try box.seal($0, associatedData: [1]) }
        XCTAssertEqual(try box.openPublic(sealed, associatedData: [1], what: "x"), Array("target".utf8))
        XCTAssertThrowsError(try box.openPublic(sealed, associatedData: [2], what: "x"))
        var bad = sealed
        bad[bad.count - 1] ^= 0x80
        XCTAssertThrowsError(try box.openPublic(bad, associatedData: [1], what: "x"))
    }

    func testBase64URLIsFileSystemSafeAndStrict() throws {
        for length in 0...64 {
            let bytes = Sodium.randomArray(count: length)
            let text = Base64URL.encode(bytes)
            XCTAssertEqual(text.utf8.count, Base64URL.encodedLength(length))
            XCTAssertFalse(text.contains("/") || text.contains("=") || text.contains("+"))
            XCTAssertEqual(try Base64URL.decode(text), bytes)
        }
        XCTAssertThrowsError(try Base64URL.decode("ab/c"))
        // One spelling per byte string: non-zero unused bits in the last character are refused.
        XCTAssertEqual(try Base64URL.decode("AA"), [0])
        XCTAssertThrowsError(try Base64URL.decode("AB"))
        XCTAssertThrowsError(try Base64URL.decode("a"))
    }

    func testRecoveryKeyFormatsAndParses() throws {
        let key = SecureBytes.random(count: 32)
        let text = RecoveryKey.format(key)
        XCTAssertEqual(text.count, 79)
        XCTAssertTrue(try RecoveryKey.parse(text).constantTimeEquals(key))
        let upper = text.withUnsafeBytes { Array($0) }.map { $0 >= 0x61 && $0 <= 0x66 ? $0 - 32 : $0 } + [0x0a]
        XCTAssertTrue(try RecoveryKey.parse(secret(String(decoding: upper, as: UTF8.self))).constantTimeEquals(key))
        XCTAssertThrowsError(try RecoveryKey.parse(secret("abcd")))
        XCTAssertThrowsError(try RecoveryKey.parse(secret(String(repeating: "z", count: 64))))
        XCTAssertThrowsError(try RecoveryKey.parse(secret(String(repeating: "a", count: 66))))
    }
}

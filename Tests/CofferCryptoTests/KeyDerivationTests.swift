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
        // The whole text is decoded: a valid name with a suffix (a sync engine's
        // conflict copy) is not that name.
        let name = Base64URL.encode(Array(0..<32))
        for suffix in [".sync-conflict-20261123-101500-ABCDEFG", " (1)", "~", ".", "=", "\n"] {
            XCTAssertThrowsError(try Base64URL.decode(name + suffix), suffix)
        }
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

    /// The forms a user may type, pinned: any case, '-', space, tab, CR and LF anywhere
    /// (even between the two digits of a byte), exactly 64 hex digits, nothing else.
    func testRecoveryKeyAcceptsExactlyTheDocumentedForms() throws {
        let key = SecureBytes(count: 32)
        key.withUnsafeMutableBytes { for i in 0..<32 { $0[i] = UInt8(i * 8 + 7) } }
        let formatted = RecoveryKey.format(key).withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
        XCTAssertEqual(formatted, "070f-171f-272f-373f-474f-575f-676f-777f-878f-979f-a7af-b7bf-c7cf-d7df-e7ef-f7ff")
        let digits = formatted.filter { $0 != "-" }
        let accepted = [
            digits, digits.uppercased(), formatted + "\n", formatted + "\r\n", " \t" + formatted,
            digits.map { "\($0)-" }.joined(),                 // a separator after every digit
            String(digits.prefix(3)) + " \n" + String(digits.dropFirst(3)),
        ]
        for text in accepted {
            XCTAssertTrue(try RecoveryKey.parse(secret(text)).constantTimeEquals(key), text)
        }
        let refused = [
            "", String(digits.dropLast()), digits + "0", digits + "00", String(digits.dropLast()) + "g",
            digits + ".", "_" + digits, digits + "\u{0}", String(digits.prefix(10)) + "\u{0}" + String(digits.dropFirst(10)),
            "0x" + digits, String(repeating: "-", count: 79),
        ]
        for text in refused {
            XCTAssertThrowsError(try RecoveryKey.parse(secret(text)), text.debugDescription) {
                XCTAssertEqual($0 as? CryptoError, .malformedRecoveryKey)
            }
        }
    }
}

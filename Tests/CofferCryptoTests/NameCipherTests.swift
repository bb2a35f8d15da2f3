// Tests of name encryption: determinism per directory, authentication, padding.
import CofferCrypto
import XCTest

final class NameCipherTests: XCTestCase {
    let names = NameCipher(macKey: .random(count: 32), streamKey: .random(count: 32))
    let iv = Sodium.randomArray(count: 16)

    func testRoundTripForEveryLength() throws {
        for length in 1...255 {
            let name = Sodium.randomArray(count: length)
            let encrypted = try names.encrypt(name, dirIV: iv)
            XCTAssertEqual(encrypted.count, NameCipher.encryptedLength(plainLength: length))
            XCTAssertEqual(encrypted.count % 16, 0)
            XCTAssertEqual(try names.decrypt(encrypted, dirIV: iv), name)
        }
    }

    func testDeterministicWithinADirectoryDifferentAcross() throws {
        let name = Array("report.pdf".utf8)
        XCTAssertEqual(try names.encrypt(name, dirIV: iv), try names.encrypt(name, dirIV: iv))
        XCTAssertNotEqual(try names.encrypt(name, dirIV: iv), try names.encrypt(name, dirIV: Sodium.randomArray(count: 16)))
    }

    func testLengthLeaksOnlyToSixteenBytes() throws {
        let lengths = Set(try (1...15).map { try names.encrypt(Array(repeating: 0x61, count: $0), dirIV: iv).count })
        XCTAssertEqual(lengths, [32])
    }

    func testEveryTamperedByteIsRefused() throws {
        let encrypted = try names.encrypt(Array("secret-plans.txt".utf8), dirIV: iv)
        for i in encrypted.indices {
            var bad = encrypted
            bad[i] ^= 0x01
            XCTAssertThrowsError(try names.decrypt(bad, dirIV: iv), "byte \(i)") {
                XCTAssertEqual($0 as? CryptoError, .nameAuthenticationFailed)
            }
        }
        XCTAssertThrowsError(try names.decrypt(Array(encrypted.dropLast(16)), dirIV: iv))
        XCTAssertThrowsError(try names.decrypt(encrypted + [1], dirIV: iv))
        XCTAssertThrowsError(try names.decrypt([], dirIV: iv))
    }

    func testForeignDirectoryOrKeyIsRefused() throws {
        let encrypted = try names.encrypt(Array("a".utf8), dirIV: iv)
        XCTAssertThrowsError(try names.decrypt(encrypted, dirIV: Sodium.randomArray(count: 16)))
        let other = NameCipher(macKey: .random(count: 32), streamKey: .random(count: 32))
        XCTAssertThrowsError(try other.decrypt(encrypted, dirIV: iv))
    }
}

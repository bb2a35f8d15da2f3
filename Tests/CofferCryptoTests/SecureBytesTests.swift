// Tests of the secret buffer: wiping, constant-time comparison, copies.
import CofferCrypto
import XCTest

final class SecureBytesTests: XCTestCase {
    func testWipeLeavesOnlyZerosBeforeFree() {
        let secret = SecureBytes.random(count: 64)
        XCTAssertFalse(secret.isAllZero, "64 random bytes are not all zero")
        secret.wipe()
        XCTAssertTrue(secret.isAllZero)
        secret.withUnsafeBytes { XCTAssertEqual(Array($0), [UInt8](repeating: 0, count: 64)) }
    }

    func testKeySetWipeZeroesEverySubkey() {
        let master = MasterKey.generate()
        let keys = KeySet(master: master)
        master.wipe()
        XCTAssertTrue(master.secret.isAllZero)
        keys.wipe()
        // After wiping, the content key is zero: sealing gives what a zero key gives.
        let zero = ContentCipher(key: SecureBytes(count: 32))
        let plain = [UInt8](repeating: 7, count: 100)
        let nonce = [UInt8](repeating: 1, count: 24)
        var a = [UInt8](repeating: 0, count: 140), b = a
        plain.withUnsafeBytes { p in
            a.withUnsafeMutableBytes { keys.content.sealBlockWithFixedNonce(p, blockIndex: 0, fileID: FileID(bytes: .init(repeating: 0, count: 16)), nonce: nonce, into: $0) }
            b.withUnsafeMutableBytes { zero.sealBlockWithFixedNonce(p, blockIndex: 0, fileID: FileID(bytes: .init(repeating: 0, count: 16)), nonce: nonce, into: $0) }
        }
        XCTAssertEqual(a, b)
    }

    func testConstantTimeEqualsAndPrefix() {
        let a = SecureBytes.random(count: 32)
        let b = a.prefix(32)
        XCTAssertTrue(a.constantTimeEquals(b))
        b.withUnsafeMutableBytes { $0[5] ^= 1 }
        XCTAssertFalse(a.constantTimeEquals(b))
        XCTAssertFalse(a.constantTimeEquals(a.prefix(31)))
    }

    func testSubkeysAreDistinctAndDeterministic() {
        let master = MasterKey(secret: SecureBytes.random(count: 32))
        let keys = SubkeyPurpose.allCases.map { master.subkey($0) }
        for i in keys.indices {
            XCTAssertTrue(keys[i].constantTimeEquals(master.subkey(SubkeyPurpose.allCases[i])))
            for j in keys.indices where j != i { XCTAssertFalse(keys[i].constantTimeEquals(keys[j])) }
        }
    }
}

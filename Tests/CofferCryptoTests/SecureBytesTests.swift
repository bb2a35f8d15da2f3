// Tests of the secret buffer: wiping, constant-time comparison, copies.
import CofferCrypto
import Foundation
import Synchronization
import XCTest

final class SecureBytesTests: XCTestCase {
    /// Pooled buffers (an open file's prepared key) are 64-byte aligned chunks of shared
    /// sodium memory, distinct while alive, and come back zeroed.
    func testPooledBuffersAreAlignedDistinctAndZeroedForTheNextUser() {
        var buffers = (0..<150).map { _ in SecureBytes.pooled(count: 1087) }
        let addresses = Set(buffers.map { $0.withUnsafeBytes { UInt(bitPattern: $0.baseAddress!) } })
        XCTAssertEqual(addresses.count, 150)
        XCTAssertTrue(addresses.allSatisfy { $0 % 64 == 0 })
        buffers.forEach { $0.withUnsafeMutableBytes { _ = $0.initializeMemory(as: UInt8.self, repeating: 0xa5) } }
        buffers.removeAll()
        let again = (0..<150).map { _ in SecureBytes.pooled(count: 1087) }
        XCTAssertTrue(again.allSatisfy(\.isAllZero), "a chunk came back with a secret in it")
        XCTAssertEqual(Set(again.map { $0.withUnsafeBytes { UInt(bitPattern: $0.baseAddress!) } }), addresses, "chunks were not reused")
    }

    func testWipeLeavesOnlyZerosBeforeFree() {
        let secret = SecureBytes.random(count: 64)
        XCTAssertFalse(secret.isAllZero, "64 random bytes are not all zero")
        secret.wipe()
        XCTAssertTrue(secret.isAllZero)
        secret.withUnsafeBytes { XCTAssertEqual(Array($0), [UInt8](repeating: 0, count: 64)) }
    }

    func testKeySetWipeZeroesEverySubkeyAndRefusesLaterUse() throws {
        let master = MasterKey.generate()
        let keys = KeySet(master: master, content: .preferred)
        master.wipe()
        XCTAssertTrue(master.secret.isAllZero)
        let plain = [UInt8](repeating: 7, count: 100)
        var sealed = [UInt8](repeating: 0, count: 140)
        let id = FileID(bytes: .init(repeating: 0, count: 16))
        try plain.withUnsafeBytes { p in try sealed.withUnsafeMutableBytes { try keys.content.seal(p, firstBlock: 0, fileID: id, into: $0) } }
        keys.wipe()
        XCTAssertTrue(keys.metadata.key.isAllZero)
        // An operation that still holds the wiped keys (a lock that did not wait for it)
        // gets an error, never a result computed with a zeroed key.
        XCTAssertThrowsError(try plain.withUnsafeBytes { p in
            try sealed.withUnsafeMutableBytes { try keys.content.seal(p, firstBlock: 0, fileID: id, into: $0) }
        }) { XCTAssertEqual($0 as? CryptoError, .keyRetired) }
        XCTAssertThrowsError(try keys.names.encrypt([1, 2, 3], dirIV: [UInt8](repeating: 0, count: 16))) {
            XCTAssertEqual($0 as? CryptoError, .keyRetired)
        }
        XCTAssertThrowsError(try [UInt8](repeating: 1, count: 8).withUnsafeBytes { try keys.metadata.seal($0, associatedData: []) }) {
            XCTAssertEqual($0 as? CryptoError, .keyRetired)
        }
    }

    func testRetireWaitsForAComputationInProgress() throws {
        let key = SecureBytes.random(count: 32)
        let started = DispatchSemaphore(value: 0)
        let seen = SeenFlag()
        Thread.detachNewThread {
            try? key.lend { bytes in
                started.signal()
                usleep(200_000)
                seen.value.withLock { $0 = bytes[0] == 0 && bytes[31] == 0 && !key.isAllZero }
            }
        }
        started.wait()
        key.retire()
        XCTAssertTrue(key.isAllZero)
        XCTAssertFalse(seen.value.withLock { $0 }, "the key was zeroed while lent")
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

/// What the lending thread saw, handed back to the test's thread.
private final class SeenFlag: Sendable {
    let value = Mutex(false)
}

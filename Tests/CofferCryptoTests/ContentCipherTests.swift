// Tests of content-block sealing, for each content cipher: round trips at block
// boundaries and every tamper case.
import CofferCrypto
import XCTest

final class ContentCipherTests: XCTestCase {
    var cipher = ContentCipher(key: .random(count: 32))
    let fileID = FileID.random()

    /// Runs `body` once per content cipher this CPU runs (AES-256-GCM needs AES-NI), for
    /// AES-256-GCM once per engine that runs here, and under ipsec-mb once more with the
    /// key prepared in an open file's slot.
    func forEachCipher(_ body: () throws -> Void) rethrows {
        for algorithm in ContentAlgorithm.allCases where algorithm.isAvailable {
            let engines = algorithm == .aes256gcm ? AESEngine.allCases.filter { $0.unavailableReason == nil } : [.libsodium]
            for engine in engines {
                cipher = ContentCipher(key: .random(count: 32), algorithm: algorithm, engine: engine)
                try body()
            }
            let slot = BlockKeySlot()
            slot.fileOpened()
            defer { slot.fileClosed() }
            cipher = ContentCipher(key: .random(count: 32), algorithm: algorithm, engine: engines.last!).using(slot)
            try body()
        }
    }

    func seal(_ plain: [UInt8], first: UInt64 = 0, id: FileID? = nil) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: ContentCipher.cipherLength(plainLength: plain.count))
        plain.withUnsafeBytes { p in out.withUnsafeMutableBytes { try! cipher.seal(p, firstBlock: first, fileID: id ?? fileID, into: $0) } }
        return out
    }

    func open(_ sealed: [UInt8], plainLength: Int, first: UInt64 = 0, id: FileID? = nil) throws -> [UInt8] {
        var out = [UInt8](repeating: 0xee, count: plainLength)
        try sealed.withUnsafeBytes { c in try out.withUnsafeMutableBytes { _ = try cipher.open(c, firstBlock: first, fileID: id ?? fileID, into: $0) } }
        return out
    }

    func testRoundTripAtBlockBoundaries() throws {
        try forEachCipher {
            for length in [0, 1, 4095, 4096, 4097, 8192, 3 * 4096 + 17, 32 * 4096] {
                let plain = Sodium.randomArray(count: length)
                let sealed = seal(plain, first: 5)
                XCTAssertEqual(sealed.count, ContentCipher.cipherLength(plainLength: length))
                XCTAssertEqual(try open(sealed, plainLength: length, first: 5), plain, "length \(length)")
                // The paths that split long runs across the cores agree with the serial ones.
                var parallel = [UInt8](repeating: 0, count: sealed.count)
                try plain.withUnsafeBytes { p in try parallel.withUnsafeMutableBytes { try cipher.sealInParallel(p, firstBlock: 5, fileID: fileID, into: $0) } }
                XCTAssertEqual(try open(parallel, plainLength: length, first: 5), plain, "length \(length)")
                var opened = [UInt8](repeating: 0, count: length)
                try sealed.withUnsafeBytes { c in try opened.withUnsafeMutableBytes { _ = try cipher.openInParallel(c, firstBlock: 5, fileID: fileID, into: $0) } }
                XCTAssertEqual(opened, plain, "length \(length)")
            }
        }
    }

    func testOverheadIsUnderOnePercent() {
        XCTAssertEqual(ContentCipher.overhead, 40)
        XCTAssertLessThanOrEqual(Double(ContentCipher.overhead) / Double(ContentCipher.blockSize), 0.01)
    }

    func testSameBlockSealsDifferentlyEachTime() {
        forEachCipher {
            let plain = Sodium.randomArray(count: 4096)
            XCTAssertNotEqual(seal(plain), seal(plain))
        }
    }

    func testAllZeroBlockIsAHole() throws {
        try forEachCipher {
            let zeros = [UInt8](repeating: 0, count: 2 * ContentCipher.cipherBlockSize + 100)
            XCTAssertEqual(try open(zeros, plainLength: 2 * 4096 + 60), [UInt8](repeating: 0, count: 2 * 4096 + 60))
        }
    }

    func testEveryRegionOfABlockIsAuthenticated() throws {
        try forEachCipher {
            let plain = Sodium.randomArray(count: 3 * 4096)
            let sealed = seal(plain)
            // Nonce, body and tag of the middle block, and a bit in each byte position class.
            let block1 = ContentCipher.cipherBlockSize
            for offset in [0, 11, 23, 24, 100, 4119, 4120, 4135] {
                for bit in [0, 7] {
                    var bad = sealed
                    bad[block1 + offset] ^= UInt8(1 << bit)
                    XCTAssertThrowsError(try open(bad, plainLength: plain.count)) {
                        XCTAssertEqual($0 as? CryptoError, .blockAuthenticationFailed(blockIndex: 1), "offset \(offset)")
                    }
                }
            }
        }
    }

    func testSwappedBlocksFail() throws {
        try forEachCipher {
            let plain = Sodium.randomArray(count: 2 * 4096)
            var sealed = seal(plain)
            let n = ContentCipher.cipherBlockSize
            let first = Array(sealed[0..<n])
            sealed.replaceSubrange(0..<n, with: sealed[n..<2 * n])
            sealed.replaceSubrange(n..<2 * n, with: first)
            XCTAssertThrowsError(try open(sealed, plainLength: plain.count)) {
                XCTAssertEqual($0 as? CryptoError, .blockAuthenticationFailed(blockIndex: 0))
            }
        }
    }

    func testBlockFromAnotherFileOrIndexFails() throws {
        try forEachCipher {
            let plain = Sodium.randomArray(count: 4096)
            let sealed = seal(plain, first: 2)
            XCTAssertThrowsError(try open(sealed, plainLength: 4096, first: 2, id: .random()))
            XCTAssertThrowsError(try open(sealed, plainLength: 4096, first: 3))
            XCTAssertNoThrow(try open(sealed, plainLength: 4096, first: 2))
        }
    }

    func testAESBlocksUseAKeyPerFileAndZerosInTheSpareNonceBytes() throws {
        guard ContentAlgorithm.aes256gcm.isAvailable else { throw XCTSkip("no AES-NI on this CPU") }
        let key = SecureBytes.random(count: 32)
        cipher = ContentCipher(key: key, algorithm: .aes256gcm)
        let sealed = seal(Sodium.randomArray(count: 4096))
        XCTAssertEqual(Array(sealed[12..<24]), [UInt8](repeating: 0, count: 12))
        XCTAssertNotEqual(Array(sealed[0..<12]), [UInt8](repeating: 0, count: 12))
        // The same content key under XChaCha20-Poly1305 does not open it.
        cipher = ContentCipher(key: key, algorithm: .xchacha20poly1305)
        XCTAssertThrowsError(try open(sealed, plainLength: 4096))
    }

    func testTruncatedBlockFails() throws {
        try forEachCipher {
            let sealed = seal(Sodium.randomArray(count: 4096))
            // Cut inside the data: the tag no longer matches.
            XCTAssertThrowsError(try open(Array(sealed.prefix(2000)), plainLength: 2000 - 40)) {
                XCTAssertEqual($0 as? CryptoError, .blockAuthenticationFailed(blockIndex: 0))
            }
            // Cut inside nonce+tag: too short to be a block.
            XCTAssertThrowsError(try open(Array(sealed.prefix(30)), plainLength: 0)) {
                XCTAssertEqual($0 as? CryptoError, .blockTooShort(blockIndex: 0, length: 30))
            }
        }
    }

    // MARK: Per-file keys (format 6)

    /// A one-file cipher (what a lock leaves an unless-open file) opens and seals its
    /// file's blocks exactly as the vault's cipher does, refuses every other file, and
    /// refuses everything once retired.
    func testAOneFileCipherServesItsFileOnlyUntilRetired() throws {
        for algorithm in ContentAlgorithm.allCases where algorithm.isAvailable {
            cipher = ContentCipher(key: .random(count: 32), algorithm: algorithm, perFileKeys: true)
            let vault = cipher, other = FileID.random()
            let plain = Sodium.randomArray(count: 3 * 4096 + 5)
            let sealedByVault = seal(plain), otherSealed = seal(plain, id: other)
            let one = try vault.fileCipher(for: fileID)
            cipher = one
            XCTAssertEqual(try open(sealedByVault, plainLength: plain.count), plain, "\(algorithm)")
            let sealedByOne = seal(plain)
            cipher = vault
            XCTAssertEqual(try open(sealedByOne, plainLength: plain.count), plain, "\(algorithm)")
            cipher = one
            XCTAssertThrowsError(try open(otherSealed, plainLength: plain.count, id: other)) {
                XCTAssertEqual($0 as? CryptoError, .keyRetired, "\(algorithm)")
            }
            XCTAssertThrowsError(try one.fileCipher(for: other))
            one.retire()
            XCTAssertThrowsError(try open(sealedByVault, plainLength: plain.count)) {
                XCTAssertEqual($0 as? CryptoError, .keyRetired, "\(algorithm)")
            }
        }
    }

    /// Format 6 seals XChaCha20-Poly1305 blocks under a key per file: a reader of the
    /// vault-wide key (formats 1–5) cannot open them, nor the other way round.
    func testFormat6SealsXChaChaBlocksUnderTheFilesOwnKey() throws {
        let key = SecureBytes.random(count: 32)
        let whole = ContentCipher(key: key, algorithm: .xchacha20poly1305)
        let perFile = ContentCipher(key: key, algorithm: .xchacha20poly1305, perFileKeys: true)
        XCTAssertFalse(whole.perFileKeys)
        XCTAssertTrue(perFile.perFileKeys)
        let plain = Sodium.randomArray(count: 100)
        cipher = perFile
        let sealed = seal(plain)
        cipher = whole
        XCTAssertThrowsError(try open(sealed, plainLength: plain.count))
        cipher = perFile
        XCTAssertEqual(try open(sealed, plainLength: plain.count), plain)
    }
}

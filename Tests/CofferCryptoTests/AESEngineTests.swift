// Tests of the two AES-256-GCM engines (libsodium, ipsec-mb): the same blocks from both,
// each opens the other's and refuses the same tampering; the engine choice; and the
// prepared keys an open file keeps (BlockKeySlot).
import CofferCrypto
import XCTest

final class AESEngineTests: XCTestCase {
    let fileID = FileID(bytes: (0..<16).map { UInt8(0x30 + $0) })

    /// The content key of these tests, and ciphers under it run by each engine.
    func ciphers() throws -> (sodium: ContentCipher, intel: ContentCipher) {
        guard ContentAlgorithm.aes256gcm.isAvailable else { throw XCTSkip("no AES-NI on this CPU") }
        if let why = AESEngine.ipsecMB.unavailableReason {
            // Missing is a machine's state; disagreeing with libsodium is a bug.
            XCTAssertFalse(why.contains("self-test"), why)
            throw XCTSkip("ipsec-mb: \(why)")
        }
        let key = SecureBytes(count: 32)
        key.withUnsafeMutableBytes { for i in 0..<32 { $0[i] = UInt8(0x80 + i) } }
        return (ContentCipher(key: key, algorithm: .aes256gcm, engine: .libsodium),
                ContentCipher(key: key, algorithm: .aes256gcm, engine: .ipsecMB))
    }

    func sealFixed(_ cipher: ContentCipher, _ plain: [UInt8], index: UInt64, nonce: [UInt8]) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: plain.count + ContentCipher.overhead)
        try plain.withUnsafeBytes { p in
            try out.withUnsafeMutableBytes { try cipher.sealBlockWithFixedNonce(p, blockIndex: index, fileID: fileID, nonce: nonce, into: $0) }
        }
        return out
    }

    func open(_ cipher: ContentCipher, _ sealed: [UInt8], plainLength: Int, first: UInt64) throws -> [UInt8] {
        var out = [UInt8](repeating: 0xee, count: plainLength)
        try sealed.withUnsafeBytes { c in try out.withUnsafeMutableBytes { _ = try cipher.open(c, firstBlock: first, fileID: fileID, into: $0) } }
        return out
    }

    /// For one key, nonce, file and index, both engines seal every length of a block
    /// (empty, one byte, partial GHASH blocks, full) to the same bytes; each opens the
    /// other's, and both refuse a flipped bit anywhere (nonce, data, tag).
    func testBothEnginesSealTheSameBlocksAndOpenEachOthers() throws {
        let (sodium, intel) = try ciphers()
        let nonce = (0..<12).map { UInt8(0xc0 + $0) } + [UInt8](repeating: 0, count: 12)
        for length in [0, 1, 15, 16, 17, 100, 4095, 4096] {
            let plain = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 5) }
            let bySodium = try sealFixed(sodium, plain, index: 41, nonce: nonce)
            let byIntel = try sealFixed(intel, plain, index: 41, nonce: nonce)
            XCTAssertEqual(bySodium, byIntel, "length \(length)")
            guard length > 0 else { continue }  // an empty block is a final block (openFinalBlock below)
            XCTAssertEqual(try open(intel, bySodium, plainLength: length, first: 41), plain, "length \(length)")
            XCTAssertEqual(try open(sodium, byIntel, plainLength: length, first: 41), plain, "length \(length)")
            for position in [0, 11, 24, 24 + length - 1, byIntel.count - 1] {
                var tampered = byIntel
                tampered[position] ^= 0x01
                for (name, opener) in [("libsodium", sodium), ("ipsec-mb", intel)] {
                    XCTAssertThrowsError(try open(opener, tampered, plainLength: length, first: 41), "\(name), length \(length), bit at \(position)") {
                        XCTAssertEqual($0 as? CryptoError, .blockAuthenticationFailed(blockIndex: 41))
                    }
                }
            }
            // Another index (the associated data) fails under both.
            XCTAssertThrowsError(try open(intel, bySodium, plainLength: length, first: 42))
            XCTAssertThrowsError(try open(sodium, byIntel, plainLength: length, first: 42))
        }
        // An empty final block (format 4) opens across engines too.
        let empty = try sealFixed(intel, [], index: 3, nonce: nonce)
        var none: [UInt8] = []
        XCTAssertEqual(try empty.withUnsafeBytes { c in try none.withUnsafeMutableBytes { try sodium.openFinalBlock(c, index: 3, fileID: fileID, into: $0) } }, 0)
    }

    /// Runs of blocks under random nonces (and split across cores) open under the other
    /// engine, holes included.
    func testRunsSealedByOneEngineOpenUnderTheOther() throws {
        let (sodium, intel) = try ciphers()
        let plain = Sodium.randomArray(count: 40 * 4096 + 123)
        for (sealer, opener) in [(sodium, intel), (intel, sodium)] {
            var sealed = [UInt8](repeating: 0, count: ContentCipher.cipherLength(plainLength: plain.count))
            try plain.withUnsafeBytes { p in try sealed.withUnsafeMutableBytes { try sealer.sealInParallel(p, firstBlock: 7, fileID: fileID, into: $0) } }
            // Block 2 becomes a hole.
            for i in 2 * ContentCipher.cipherBlockSize..<3 * ContentCipher.cipherBlockSize { sealed[i] = 0 }
            var expected = plain
            for i in 2 * 4096..<3 * 4096 { expected[i] = 0 }
            var out = [UInt8](repeating: 0xee, count: plain.count)
            try sealed.withUnsafeBytes { c in try out.withUnsafeMutableBytes { _ = try opener.openInParallel(c, firstBlock: 7, fileID: fileID, into: $0) } }
            XCTAssertEqual(out, expected, "sealed by \(sealer.engine), opened by \(opener.engine)")
        }
    }

    /// ipsec-mb seals and opens a long run on the calling thread; libsodium's engines
    /// split it across the cores (measured both ways: docs/PERFORMANCE.md).
    func testOnlyLibsodiumSplitsLongRunsAcrossTheCores() throws {
        let (sodium, intel) = try ciphers()
        XCTAssertFalse(intel.splitsLongRuns)
        XCTAssertTrue(sodium.splitsLongRuns)
        XCTAssertTrue(ContentCipher(key: SecureBytes.random(count: 32), algorithm: .xchacha20poly1305).splitsLongRuns)
    }

    /// COFFER_AES_ENGINE names the engine; a name that is no engine, or one that does not
    /// run here, leaves libsodium, and the reason says so.
    func testTheEnvironmentForcesAnEngine() throws {
        XCTAssertEqual(AESEngine.choose(forced: "libsodium").engine, .libsodium)
        let bogus = AESEngine.choose(forced: "openssl")
        XCTAssertEqual(bogus.engine, .libsodium)
        XCTAssertTrue(bogus.reason.contains("COFFER_AES_ENGINE=openssl is not an engine"), bogus.reason)
        let forced = AESEngine.choose(forced: "ipsec-mb")
        if let why = AESEngine.ipsecMB.unavailableReason {
            XCTAssertEqual(forced.engine, .libsodium)
            XCTAssertTrue(forced.reason.contains(why), forced.reason)
        } else {
            XCTAssertEqual(forced.engine, .ipsecMB)
        }
        // Unforced, the choice is a measurement (or why ipsec-mb cannot run).
        let free = AESEngine.choose(forced: nil)
        XCTAssertTrue(free.reason.contains("MB/s") || AESEngine.ipsecMB.unavailableReason != nil, free.reason)
    }

    /// A file's prepared key is kept only while a file of it is open, goes at the last
    /// close and at a wipe (the lock), is not kept from a key retired meanwhile, and a
    /// cipher whose key is retired cannot use the one kept.
    func testAnOpenFilesPreparedKeyLivesFromFirstUseToCloseOrLock() throws {
        for engine in AESEngine.allCases where engine.unavailableReason == nil {
            let key = SecureBytes.random(count: 32)
            let slot = BlockKeySlot()
            let cipher = ContentCipher(key: key, algorithm: .aes256gcm, engine: engine).using(slot)
            let plain = Sodium.randomArray(count: 5000)
            func seal() throws -> [UInt8] {
                var out = [UInt8](repeating: 0, count: ContentCipher.cipherLength(plainLength: plain.count))
                try plain.withUnsafeBytes { p in try out.withUnsafeMutableBytes { try cipher.seal(p, firstBlock: 0, fileID: fileID, into: $0) } }
                return out
            }
            _ = try seal()
            XCTAssertFalse(slot.holdsKey, "\(engine): kept with no file open")
            slot.fileOpened()
            slot.fileOpened()
            let sealed = try seal()
            XCTAssertTrue(slot.holdsKey, "\(engine): not kept while open")
            XCTAssertEqual(try open(cipher, sealed, plainLength: plain.count, first: 0), plain)
            slot.fileClosed()
            XCTAssertTrue(slot.holdsKey, "\(engine): gone before the last close")
            slot.fileClosed()
            XCTAssertFalse(slot.holdsKey, "\(engine): outlived the last close")
            slot.fileOpened()
            _ = try seal()
            slot.wipe()
            XCTAssertFalse(slot.holdsKey, "\(engine): outlived the wipe")
            XCTAssertEqual(try open(cipher, sealed, plainLength: plain.count, first: 0), plain, "\(engine): not prepared again after a wipe")
            key.retire()
            XCTAssertThrowsError(try seal()) { XCTAssertEqual($0 as? CryptoError, .keyRetired) }
            slot.fileClosed()
        }
    }

    /// No more than `BlockKeySlot.limit` prepared keys are kept at once, process-wide:
    /// a file opened beyond it seals and opens with a key prepared per call, and keeps
    /// one again once another file's is gone.
    func testPreparedKeysAreKeptForAtMostTheLimitOfOpenFiles() throws {
        let cipher = ContentCipher(key: .random(count: 32), algorithm: .xchacha20poly1305, perFileKeys: true)
        let plain = Sodium.randomArray(count: 100)
        func use(_ slot: BlockKeySlot) throws {
            var out = [UInt8](repeating: 0, count: ContentCipher.cipherLength(plainLength: plain.count))
            try plain.withUnsafeBytes { p in try out.withUnsafeMutableBytes { try cipher.using(slot).seal(p, firstBlock: 0, fileID: fileID, into: $0) } }
            XCTAssertEqual(try open(cipher, out, plainLength: plain.count, first: 0), plain)
        }
        let slots = (0...BlockKeySlot.limit).map { _ in BlockKeySlot() }
        for slot in slots {
            slot.fileOpened()
            try use(slot)
        }
        defer { slots.forEach { $0.fileClosed() } }
        XCTAssertEqual(slots.filter(\.holdsKey).count, BlockKeySlot.limit)
        XCTAssertFalse(slots.last!.holdsKey)
        slots[0].wipe()
        try use(slots.last!)
        XCTAssertTrue(slots.last!.holdsKey, "a key was not kept once another was wiped")
    }
}

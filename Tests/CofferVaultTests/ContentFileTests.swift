// Tests of random-access content I/O on a real backing file: boundaries, a random
// model check, holes, and damage (tamper, swap, move, truncation).
import CofferCrypto
import CofferSystem
@testable import CofferVault
import Glibc
import TestSupport
import XCTest

class ContentFileTests: XCTestCase {
    let cipher = ContentCipher(key: .random(count: 32))
    var dir: TempDirectory!

    override func setUp() { dir = TempDirectory() }
    override func tearDown() { dir = nil }

    /// The layout under test: formats 1–3 here, format 4 in ContentFileFormat4Tests.
    class var layout: BlockLayout { .unbound }

    func file(_ name: String = "f") -> ContentFile {
        let file = ContentFile(fd: dir.openFile(name), cipher: cipher, layout: Self.layout)
        if Self.layout.endsInFinalBlock, (try? Sys.stat(file.fd).st_size) == 0 {
            XCTAssertNoThrow(try file.initialize { _ in [UInt8](repeating: 7, count: PlaceMAC.tagSize) })
        }
        return file
    }

    func read(_ f: ContentFile, _ count: Int, at offset: Int64) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        let n = try out.withUnsafeMutableBytes { try f.read(into: $0, at: offset) }
        return Array(out.prefix(n))
    }

    func testWritesAtEveryBoundary() throws {
        for length in [1, 4095, 4096, 4097, 3 * 4096 + 5] {
            for offset: Int64 in [0, 1, 4095, 4096, 4097, 10000] {
                let f = file("b\(length)-\(offset)")
                var model = [UInt8]()
                let first = Sodium.randomArray(count: 9000)
                try write(f, first, at: 0)
                model = first
                let data = Sodium.randomArray(count: length)
                try write(f, data, at: offset)
                let end = Int(offset) + length
                if model.count < end { model += [UInt8](repeating: 0, count: end - model.count) }
                model.replaceSubrange(Int(offset)..<end, with: data)
                XCTAssertEqual(try f.plainSize(), Int64(model.count))
                XCTAssertEqual(try readAll(f), model, "length \(length) offset \(offset)")
                close(f.fd)
            }
        }
    }

    /// Random writes, truncates and reads against an in-memory model. Seeded: a failure
    /// names its seed, and COFFER_SEED=<seed> replays the same operations and data.
    func testRandomOperationsAgainstAModel() throws {
        try runModel(file())
    }

    /// The same with every cipher this CPU runs, and with the undo journal deciding on
    /// records (an fsync now and then makes blocks durable, so rewrites take durable
    /// records as well as ring records); afterwards a journal opened afresh finds no
    /// block torn.
    func testRandomOperationsAgainstAModelWithTheJournalAndEachCipher() throws {
        for algorithm in ContentAlgorithm.allCases where algorithm.isAvailable {
            let journal = try UndoJournal(directory: dir.fd)
            let volatile = VolatileBlocks()
            let cipher = ContentCipher(key: .random(count: 32), algorithm: algorithm)
            let name = "journaled-\(algorithm.rawValue)"
            let open = { [dir, layout = Self.layout] in
                ContentFile(fd: dir!.openFile(name), cipher: cipher, layout: layout,
                            safety: RewriteSafety(journal: journal, volatile: volatile))
            }
            let f = open()
            if Self.layout.endsInFinalBlock {
                try f.initialize { _ in [UInt8](repeating: 7, count: PlaceMAC.tagSize) }
            }
            try runModel(f, reopen: open, fsync: { volatile.removeAll() })
            let records = try UndoJournal(directory: dir.fd).pendingRecords(try XCTUnwrap(try f.fileID()))
            XCTAssertEqual(try f.tornBlocks(records, repair: false), [], "\(algorithm)")
        }
    }

    /// Runs 300 seeded random operations on `f` against a model; `fsync` is called now
    /// and then, and `reopen` makes a second handle on the same backing file at the end.
    func runModel(_ f: ContentFile, reopen: (() -> ContentFile)? = nil, fsync: () -> Void = {}) throws {
        var rng = SeededRandom.fromEnvironment()
        let replay = rng.replay
        var model = [UInt8]()
        for step in 0..<300 {
            do {
                switch Int.random(in: 0..<11, using: &rng) {
                case 0..<6:
                    let offset = Int.random(in: 0...max(0, model.count + 5000), using: &rng)
                    let data = rng.bytes(Int.random(in: 1...20000, using: &rng))
                    try write(f, data, at: Int64(offset))
                    if model.count < offset + data.count { model += [UInt8](repeating: 0, count: offset + data.count - model.count) }
                    model.replaceSubrange(offset..<offset + data.count, with: data)
                case 6..<8:
                    let size = Int.random(in: 0...model.count + 10000, using: &rng)
                    try f.truncate(to: Int64(size))
                    model = size <= model.count ? Array(model.prefix(size)) : model + [UInt8](repeating: 0, count: size - model.count)
                case 8..<10:
                    let offset = Int.random(in: 0...model.count + 10, using: &rng)
                    let count = Int.random(in: 1...30000, using: &rng)
                    let expected = offset < model.count ? Array(model[offset..<min(model.count, offset + count)]) : []
                    XCTAssertEqual(try read(f, count, at: Int64(offset)), expected, "step \(step); \(replay)")
                default:
                    fsync()
                }
                XCTAssertEqual(try f.plainSize(), Int64(model.count), "step \(step); \(replay)")
            } catch {
                return XCTFail("step \(step): \(error); \(replay)")
            }
        }
        XCTAssertEqual(try readAll(f), model, replay)
        // A second handle on the same backing file (as after a remount) reads the same.
        XCTAssertEqual(try readAll(reopen?() ?? file()), model, replay)
    }

    func testSeededRandomReplaysFromItsSeed() {
        var a = SeededRandom(seed: 42), b = SeededRandom(seed: 42), c = SeededRandom(seed: 43)
        let first = (0..<8).map { _ in a.next() }
        XCTAssertEqual(first, (0..<8).map { _ in b.next() }, "one seed, one sequence")
        XCTAssertNotEqual(first, (0..<8).map { _ in c.next() })
        XCTAssertEqual(SeededRandom(seed: 0).replay, "replay with COFFER_SEED=0")
    }

    func testTruncateUpMakesHolesNotCiphertext() throws {
        let f = file()
        try write(f, Array("head".utf8), at: 0)
        try f.truncate(to: 1 << 30)
        var st = stat()
        fstat(f.fd, &st)
        XCTAssertEqual(st.st_size, Int(Self.layout.cipherSize(plainSize: 1 << 30)))
        XCTAssertLessThan(st.st_blocks * 512, 1 << 20, "a 1 GiB sparse file stays small on disk")
        XCTAssertEqual(try read(f, 8, at: 0), Array("head".utf8) + [0, 0, 0, 0])
        XCTAssertEqual(try read(f, 5000, at: 500 << 20), [UInt8](repeating: 0, count: 5000))
        try write(f, [9], at: (1 << 30) - 1)
        XCTAssertEqual(try read(f, 2, at: (1 << 30) - 2), [0, 9])
    }

    /// Up to format 3 an emptied file has no header; from format 4 it keeps its header
    /// (its file ID and place) and an empty final block.
    func testEmptiedFileKeepsOnlyWhatItsLayoutNeeds() throws {
        let f = file()
        XCTAssertEqual(try f.plainSize(), 0)
        try write(f, [1, 2, 3], at: 0)
        try f.truncate(to: 0)
        XCTAssertEqual(Int64(dir.read("f").count), Self.layout.cipherSize(plainSize: 0))
        XCTAssertEqual(try read(f, 10, at: 0), [])
    }

    // MARK: Damage

    func makeDamagedCopy(_ damage: (inout [UInt8]) -> Void) throws -> (ContentFile, [UInt8]) {
        let plain = Sodium.randomArray(count: 3 * 4096 + 100)
        let f = file("orig")
        try write(f, plain, at: 0)
        var bytes = dir.read("orig")
        damage(&bytes)
        dir.write("bad", bytes)
        return (file("bad"), plain)
    }

    func testFlippedByteFailsOnlyItsBlock() throws {
        let (f, plain) = try makeDamagedCopy { $0[18 + 4136 + 500] ^= 0x20 }
        XCTAssertThrowsError(try read(f, 10, at: 4096 + 10)) {
            XCTAssertEqual($0 as? VaultError, .blockDamaged(blockIndex: 1))
        }
        XCTAssertEqual(try read(f, 4096, at: 0), Array(plain[0..<4096]), "block 0 still reads")
        XCTAssertEqual(try read(f, 200, at: 8192), Array(plain[8192..<8392]), "block 2 still reads")
        XCTAssertThrowsError(try f.write([UInt8](repeating: 1, count: 10).withUnsafeBytes { $0 }, at: 4100))
    }

    func testFlippedHeaderBitFails() throws {
        let (f, _) = try makeDamagedCopy { $0[5] ^= 0x01 }  // inside the file ID
        XCTAssertThrowsError(try read(f, 10, at: 0)) { XCTAssertEqual($0 as? VaultError, .blockDamaged(blockIndex: 0)) }
        let (g, _) = try makeDamagedCopy { $0[1] ^= 0x01 }  // the version
        XCTAssertThrowsError(try read(g, 10, at: 0)) {
            XCTAssertEqual($0 as? VaultError, .fileHeaderDamaged(reason: "unknown header version \(Self.layout.headerVersion ^ 1)"))
        }
    }

    func testSwappedBlocksFail() throws {
        let (f, _) = try makeDamagedCopy { b in
            let a = Array(b[18..<18 + 4136])
            b.replaceSubrange(18..<18 + 4136, with: b[18 + 4136..<18 + 2 * 4136])
            b.replaceSubrange(18 + 4136..<18 + 2 * 4136, with: a)
        }
        XCTAssertThrowsError(try read(f, 10, at: 0)) { XCTAssertEqual($0 as? VaultError, .blockDamaged(blockIndex: 0)) }
    }

    func testBlockMovedFromAnotherFileFails() throws {
        let other = file("other")
        try write(other, Sodium.randomArray(count: 8192), at: 0)
        let foreign = Array(dir.read("other")[18..<18 + 4136])
        let (f, _) = try makeDamagedCopy { $0.replaceSubrange(18..<18 + 4136, with: foreign) }
        XCTAssertThrowsError(try read(f, 10, at: 0)) { XCTAssertEqual($0 as? VaultError, .blockDamaged(blockIndex: 0)) }
    }

    func testTruncatedMidBlockFails() throws {
        let (f, _) = try makeDamagedCopy { $0.removeLast(300) }
        XCTAssertThrowsError(try read(f, 100, at: 3 * 4096 - 200)) {
            XCTAssertEqual($0 as? VaultError, .blockDamaged(blockIndex: 2))
        }
        let (g, _) = try makeDamagedCopy { $0.removeLast(120) }  // leaves 20 bytes: inside the nonce
        XCTAssertThrowsError(try g.plainSize()) {
            guard case .fileTruncated = $0 as? VaultError else { return XCTFail("\($0)") }
        }
    }
}

/// Every test above again on format 4's layout (a header with the place tag, and a final
/// block that authenticates the length), and what only that layout promises.
final class ContentFileFormat4Tests: ContentFileTests {
    override class var layout: BlockLayout { .bound }

    /// A cut at any byte — a block boundary, the final block's start, nothing left — no
    /// longer reads as a shorter file: the size is refused or the final block fails.
    func testACutAnywhereIsDetected() throws {
        for size in [0, 1, 100, 4095, 4096, 4097, 8192, 10000] {
            let f = file("s\(size)")
            try write(f, Sodium.randomArray(count: size), at: 0)
            XCTAssertNoThrow(try f.checkFinalBlock(), "size \(size)")
            let cipherSize = Int64(try Sys.stat(f.fd).st_size)
            XCTAssertEqual(cipherSize, Self.layout.cipherSize(plainSize: Int64(size)))
            for cut in Set([0, Self.layout.headerSize, cipherSize - 1, cipherSize - 40, cipherSize - 41,
                            Self.layout.cipherOffset(block: 1), Self.layout.cipherOffset(block: 2)]) where cut >= 0 && cut < cipherSize {
                let copy = file("s\(size)-cut\(cut)")
                var bytes = [UInt8](repeating: 0, count: Int(cut))
                _ = try bytes.withUnsafeMutableBytes { try Sys.readFully(f.fd, into: $0, at: 0) }
                try Sys.truncate(copy.fd, to: 0)
                try bytes.withUnsafeBytes { try Sys.writeFully(copy.fd, $0, at: 0) }
                XCTAssertThrowsError(try copy.checkFinalBlock(), "size \(size) cut at \(cut)")
                close(copy.fd)
            }
            close(f.fd)
        }
    }

    /// Zeros appended after the final block, or a final block replaced by zeros, are
    /// refused: the final block is never a hole.
    func testZerosAtTheEndAreRefused() throws {
        let f = file()
        try write(f, Sodium.randomArray(count: 5000), at: 0)
        let size = Int64(try Sys.stat(f.fd).st_size)
        try Sys.truncate(f.fd, to: size + 4136)
        XCTAssertThrowsError(try f.checkFinalBlock())
        try Sys.truncate(f.fd, to: size)
        XCTAssertNoThrow(try f.checkFinalBlock())
        let zeros = [UInt8](repeating: 0, count: Int(size - Self.layout.cipherOffset(block: 1)))
        try zeros.withUnsafeBytes { try Sys.writeFully(f.fd, $0, at: Self.layout.cipherOffset(block: 1)) }
        XCTAssertThrowsError(try f.checkFinalBlock())
    }
}

// ContentCipher seals and opens file content blocks with XChaCha20-Poly1305, each
// bound to its file and its index; it works in caller-provided buffers only.
import CSodium
import Dispatch
import Glibc

/// The random per-file ID stored in a file's header; part of every block's associated data.
public struct FileID: Equatable, Hashable, Sendable {
    /// Size in bytes (128 bits: collisions between files are negligible).
    public static let size = 16
    public let bytes: [UInt8]

    public init(bytes: [UInt8]) {
        precondition(bytes.count == FileID.size)
        self.bytes = bytes
    }

    /// A fresh file ID from the thread's nonce pool (IDs are public; they must be unique).
    public static func random() -> FileID {
        var bytes = [UInt8](repeating: 0, count: size)
        bytes.withUnsafeMutableBytes { NoncePool.current.fill($0) }
        return FileID(bytes: bytes)
    }
}

public struct ContentCipher: Sendable {
    /// Plaintext bytes per block: 4 KiB, the page size, so one kernel page is one block.
    public static let blockSize = 4096
    /// Nonce bytes at the start of each ciphertext block (XChaCha20: 192-bit random nonces).
    public static let nonceSize = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    /// Poly1305 tag bytes at the end of each ciphertext block.
    public static let tagSize = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)
    /// Bytes each block grows by: 40, i.e. 0.98% of a full 4096-byte block.
    public static let overhead = nonceSize + tagSize
    /// Bytes of a full ciphertext block.
    public static let cipherBlockSize = blockSize + overhead
    /// Associated data: file ID (16) ‖ block index as big-endian UInt64 (8).
    static let adSize = FileID.size + 8

    let key: SecureBytes

    public init(key: SecureBytes) {
        precondition(key.count == Int(crypto_aead_xchacha20poly1305_ietf_KEYBYTES))
        self.key = key
    }

    /// Ciphertext length of a run of plaintext: full blocks plus one partial block.
    public static func cipherLength(plainLength: Int) -> Int {
        let full = plainLength / blockSize, rest = plainLength % blockSize
        return full * cipherBlockSize + (rest > 0 ? rest + overhead : 0)
    }

    /// Seals `plaintext` (consecutive blocks from `firstBlock`, the last may be short)
    /// into `ciphertext`, which must hold `cipherLength(plainLength:)` bytes.
    /// Nonces come from the thread's NoncePool; nothing is allocated on the heap.
    public func seal(_ plaintext: UnsafeRawBufferPointer, firstBlock: UInt64, fileID: FileID,
                     into ciphertext: UnsafeMutableRawBufferPointer) throws {
        try key.lend { sealRun(plaintext, firstBlock: firstBlock, fileID: fileID, into: ciphertext, key: $0) }
    }

    private func sealRun(_ plaintext: UnsafeRawBufferPointer, firstBlock: UInt64, fileID: FileID,
                         into ciphertext: UnsafeMutableRawBufferPointer, key: UnsafePointer<UInt8>) {
        let blocks = (plaintext.count + Self.blockSize - 1) / Self.blockSize
        precondition(ciphertext.count >= Self.cipherLength(plainLength: plaintext.count))
        guard blocks > 0 else { return }
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: blocks * Self.nonceSize) { nonces in
            NoncePool.current.fill(UnsafeMutableRawBufferPointer(nonces))
            for i in 0..<blocks {
                sealOne(plaintext, block: i, firstBlock: firstBlock, fileID: fileID,
                        nonce: UnsafeRawPointer(nonces.baseAddress! + i * Self.nonceSize), into: ciphertext, key: key)
            }
        }
    }

    /// Runs of at least this many blocks are split across the CPU cores: 128 KiB, the
    /// size of the kernel's readahead requests. Below that, handing work to another
    /// thread costs more than it saves.
    public static let parallelThreshold = 32

    /// Like `seal`, with long runs split across the CPU cores.
    public func sealInParallel(_ plaintext: UnsafeRawBufferPointer, firstBlock: UInt64, fileID: FileID,
                               into ciphertext: UnsafeMutableRawBufferPointer) throws {
        let blocks = (plaintext.count + Self.blockSize - 1) / Self.blockSize
        let parts = Self.parts(blocks)
        guard parts > 1 else { return try seal(plaintext, firstBlock: firstBlock, fileID: fileID, into: ciphertext) }
        let perPart = (blocks + parts - 1) / parts
        try key.lend { key in DispatchQueue.concurrentPerform(iterations: parts) { part in
            let first = part * perPart
            let plainRange = first * Self.blockSize..<min(plaintext.count, (first + perPart) * Self.blockSize)
            guard !plainRange.isEmpty else { return }
            let cipherStart = first * Self.cipherBlockSize
            sealRun(UnsafeRawBufferPointer(rebasing: plaintext[plainRange]), firstBlock: firstBlock + UInt64(first), fileID: fileID,
                    into: UnsafeMutableRawBufferPointer(rebasing: ciphertext[cipherStart..<cipherStart + Self.cipherLength(plainLength: plainRange.count)]),
                    key: key)
        } }
    }

    /// Like `open`, with long runs split across the CPU cores; throws for the first bad
    /// block of the run (the lowest index).
    @discardableResult
    public func openInParallel(_ ciphertext: UnsafeRawBufferPointer, firstBlock: UInt64, fileID: FileID,
                               into plaintext: UnsafeMutableRawBufferPointer) throws -> Int {
        let blocks = (ciphertext.count + Self.cipherBlockSize - 1) / Self.cipherBlockSize
        let parts = Self.parts(blocks)
        guard parts > 1 else { return try open(ciphertext, firstBlock: firstBlock, fileID: fileID, into: plaintext) }
        let perPart = (blocks + parts - 1) / parts
        let failures = UnsafeMutableBufferPointer<CryptoError?>.allocate(capacity: parts)
        failures.initialize(repeating: nil)
        defer { failures.deallocate() }
        var total = 0
        let totals = UnsafeMutableBufferPointer<Int>.allocate(capacity: parts)
        totals.initialize(repeating: 0)
        defer { totals.deallocate() }
        try key.lend { key in DispatchQueue.concurrentPerform(iterations: parts) { part in
            let first = part * perPart
            let cipherRange = first * Self.cipherBlockSize..<min(ciphertext.count, (first + perPart) * Self.cipherBlockSize)
            guard !cipherRange.isEmpty else { return }
            let plainStart = first * Self.blockSize
            do {
                totals[part] = try openRun(UnsafeRawBufferPointer(rebasing: ciphertext[cipherRange]), firstBlock: firstBlock + UInt64(first),
                                           fileID: fileID, into: UnsafeMutableRawBufferPointer(rebasing: plaintext[plainStart...]), key: key)
            } catch {
                failures[part] = error as? CryptoError ?? .blockAuthenticationFailed(blockIndex: firstBlock + UInt64(first))
            }
        } }
        if let failure = failures.first(where: { $0 != nil }) { throw failure! }
        for part in 0..<parts { total += totals[part] }
        return total
    }

    /// How many parts a run of `blocks` blocks is split into.
    static func parts(_ blocks: Int) -> Int {
        guard blocks >= parallelThreshold else { return 1 }
        return min(ProcessInfoCores.count, blocks / (parallelThreshold / 2))
    }

    /// Seals one block with a caller-chosen nonce. Only known-answer tests call this;
    /// reusing a nonce under the same key would break confidentiality.
    public func sealBlockWithFixedNonce(_ plaintext: UnsafeRawBufferPointer, blockIndex: UInt64,
                                        fileID: FileID, nonce: [UInt8],
                                        into ciphertext: UnsafeMutableRawBufferPointer) throws {
        precondition(plaintext.count <= Self.blockSize && nonce.count == Self.nonceSize)
        try key.lend { key in
            nonce.withUnsafeBytes { n in
                sealOne(plaintext, block: 0, firstBlock: blockIndex, fileID: fileID,
                        nonce: n.baseAddress!, into: ciphertext, key: key)
            }
        }
    }

    @inline(__always)
    private func sealOne(_ plaintext: UnsafeRawBufferPointer, block i: Int, firstBlock: UInt64,
                         fileID: FileID, nonce: UnsafeRawPointer,
                         into ciphertext: UnsafeMutableRawBufferPointer, key: UnsafePointer<UInt8>) {
        let plainStart = i * Self.blockSize
        let plainCount = Swift.min(Self.blockSize, plaintext.count - plainStart)
        let out = ciphertext.baseAddress!.assumingMemoryBound(to: UInt8.self) + i * Self.cipherBlockSize
        out.update(from: nonce.assumingMemoryBound(to: UInt8.self), count: Self.nonceSize)
        withAssociatedData(fileID: fileID, blockIndex: firstBlock + UInt64(i)) { ad in
            var written: UInt64 = 0
            _ = crypto_aead_xchacha20poly1305_ietf_encrypt(
                out + Self.nonceSize, &written,
                plaintext.baseAddress!.assumingMemoryBound(to: UInt8.self) + plainStart, UInt64(plainCount),
                ad.baseAddress, UInt64(ad.count), nil, out, key)
        }
    }

    /// Opens consecutive ciphertext blocks starting at block `firstBlock` into `plaintext`,
    /// which must hold the plaintext length. An all-zero block is a hole and opens as zeros.
    /// Returns the number of plaintext bytes written; throws for the first bad block.
    @discardableResult
    public func open(_ ciphertext: UnsafeRawBufferPointer, firstBlock: UInt64, fileID: FileID,
                     into plaintext: UnsafeMutableRawBufferPointer) throws -> Int {
        try key.lend { try openRun(ciphertext, firstBlock: firstBlock, fileID: fileID, into: plaintext, key: $0) }
    }

    private func openRun(_ ciphertext: UnsafeRawBufferPointer, firstBlock: UInt64, fileID: FileID,
                         into plaintext: UnsafeMutableRawBufferPointer, key: UnsafePointer<UInt8>) throws -> Int {
        var cipherOffset = 0, plainOffset = 0, index = firstBlock
        let cbase = ciphertext.baseAddress?.assumingMemoryBound(to: UInt8.self)
        let pbase = plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self)
        while cipherOffset < ciphertext.count {
            let length = Swift.min(Self.cipherBlockSize, ciphertext.count - cipherOffset)
            guard length > Self.overhead else {
                throw CryptoError.blockTooShort(blockIndex: index, length: length)
            }
            let plainLength = length - Self.overhead
            precondition(plainOffset + plainLength <= plaintext.count)
            let block = cbase! + cipherOffset
            if Self.isHole(block, length) {
                (pbase! + plainOffset).initialize(repeating: 0, count: plainLength)
            } else {
                let rc = withAssociatedData(fileID: fileID, blockIndex: index) { ad -> Int32 in
                    var written: UInt64 = 0
                    return crypto_aead_xchacha20poly1305_ietf_decrypt(
                        pbase! + plainOffset, &written, nil, block + Self.nonceSize,
                        UInt64(length - Self.nonceSize), ad.baseAddress, UInt64(ad.count), block, key)
                }
                guard rc == 0 else { throw CryptoError.blockAuthenticationFailed(blockIndex: index) }
            }
            cipherOffset += length
            plainOffset += plainLength
            index += 1
        }
        return plainOffset
    }

    /// True if the stored block is all zeros (a hole). Whether a block is a hole is not
    /// secret, so this need not be constant-time: a sealed block's random nonce is
    /// almost never zero, so the first word nearly always decides.
    @inline(__always)
    static func isHole(_ block: UnsafePointer<UInt8>, _ length: Int) -> Bool {
        let raw = UnsafeRawPointer(block)
        var i = 0
        while i + 8 <= length {
            if raw.loadUnaligned(fromByteOffset: i, as: UInt64.self) != 0 { return false }
            i += 8
        }
        while i < length {
            if block[i] != 0 { return false }
            i += 1
        }
        return true
    }

    @inline(__always)
    private func withAssociatedData<R>(fileID: FileID, blockIndex: UInt64,
                                       _ body: (UnsafeBufferPointer<UInt8>) -> R) -> R {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: Self.adSize) { ad in
            _ = ad.initialize(from: fileID.bytes)
            var big = blockIndex.bigEndian
            withUnsafeBytes(of: &big) { raw in
                for j in 0..<8 { ad[FileID.size + j] = raw[j] }
            }
            return body(UnsafeBufferPointer(ad))
        }
    }
}

/// The number of CPU cores available, read once.
enum ProcessInfoCores {
    static let count = max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
}

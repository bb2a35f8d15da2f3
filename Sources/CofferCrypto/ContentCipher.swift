// ContentCipher seals and opens file content blocks with the vault's AEAD
// (XChaCha20-Poly1305 or AES-256-GCM), each block bound to its file and its index;
// it works in caller-provided buffers only.
import CSodium
import Dispatch
import Glibc

/// The content ciphers of the format (docs/FORMAT.md §4). Both share one block layout:
/// a 24-byte nonce field, the data, a 16-byte tag.
public enum ContentAlgorithm: String, CaseIterable, Sendable {
    /// 192-bit random nonces under the one content key; runs everywhere.
    case xchacha20poly1305 = "xchacha20-poly1305"
    /// 96-bit random nonces under a key per file; needs AES-NI and PCLMUL.
    case aes256gcm = "aes256gcm"

    /// True if this CPU can run the cipher (libsodium has no portable AES-GCM).
    public var isAvailable: Bool {
        switch self {
        case .xchacha20poly1305: return true
        case .aes256gcm:
            Sodium.ensureInitialized()
            return crypto_aead_aes256gcm_is_available() == 1
        }
    }

    /// The faster cipher this CPU runs: AES-256-GCM where the CPU has it.
    public static var preferred: ContentAlgorithm { aes256gcm.isAvailable ? .aes256gcm : .xchacha20poly1305 }
}

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
    /// AES-256-GCM's nonce: the first 12 bytes of the nonce field; the other 12 are zero.
    static let gcmNonceSize = Int(crypto_aead_aes256gcm_NPUBBYTES)
    /// BLAKE2b personalization of the per-file AES key (exactly 16 bytes).
    static let fileKeyPersonal = Array("coffer-aes-file1".utf8)

    /// BLAKE2b personalization of the per-file XChaCha20-Poly1305 key (format 6; exactly 16 bytes).
    static let xchachaFileKeyPersonal = Array("coffer-xch-file1".utf8)

    let key: SecureBytes
    public let algorithm: ContentAlgorithm
    /// Every file's blocks are sealed under a key of its own, derived from the content
    /// subkey and the file ID: always for AES-256-GCM, for XChaCha20-Poly1305 from
    /// format 6 on (so that one file's key can outlive the lock: `fileCipher`).
    public let perFileKeys: Bool
    /// Set on a cipher that holds one file's key only (`fileCipher`): it refuses every
    /// other file.
    public let onlyFile: FileID?
    /// The library that runs AES-256-GCM (libsodium for XChaCha20-Poly1305).
    public let engine: AESEngine
    /// Where the file's prepared block key is kept while it is open (`using`); without
    /// one, every call prepares its own.
    let keySlot: BlockKeySlot?

    /// A cipher under the 32-byte content subkey. AES-256-GCM needs a CPU that has it:
    /// callers check `algorithm.isAvailable` first and refuse the vault with a message.
    /// `perFileKeys` (format 6) derives XChaCha20-Poly1305 keys per file as AES's are.
    /// `engine` runs AES-256-GCM: by default the one chosen for this process
    /// (`AESEngine.chosen`); one given must run here (`unavailableReason` nil).
    public init(key: SecureBytes, algorithm: ContentAlgorithm = .xchacha20poly1305, perFileKeys: Bool = false,
                engine: AESEngine? = nil) {
        self.init(key: key, algorithm: algorithm, perFileKeys: perFileKeys || algorithm == .aes256gcm, onlyFile: nil,
                  engine: algorithm == .aes256gcm ? engine ?? AESEngine.chosen.engine : .libsodium, keySlot: nil)
    }

    private init(key: SecureBytes, algorithm: ContentAlgorithm, perFileKeys: Bool, onlyFile: FileID?,
                 engine: AESEngine, keySlot: BlockKeySlot?) {
        precondition(key.count == Int(crypto_aead_xchacha20poly1305_ietf_KEYBYTES))
        precondition(algorithm.isAvailable, "\(algorithm.rawValue) is not available on this CPU")
        self.key = key
        self.algorithm = algorithm
        self.perFileKeys = perFileKeys
        self.onlyFile = onlyFile
        self.engine = engine
        self.keySlot = keySlot
    }

    /// This cipher, keeping the prepared key of the file it seals and opens in `slot`
    /// (the file's inode's) instead of preparing one per call. A vault-wide key needs
    /// no preparing: it is returned as it is.
    public func using(_ slot: BlockKeySlot) -> ContentCipher {
        guard perFileKeys else { return self }
        return ContentCipher(key: key, algorithm: algorithm, perFileKeys: true, onlyFile: onlyFile, engine: engine, keySlot: slot)
    }

    /// A cipher for the blocks of `fileID` only, holding that file's key alone (in
    /// sodium memory) and not the content subkey: what an `unless-open` file open at a
    /// lock keeps (docs/FORMAT.md §4). Needs per-file keys; throws `keyRetired` once
    /// this cipher's key is wiped. The caller retires the new cipher's key when done.
    public func fileCipher(for fileID: FileID) throws -> ContentCipher {
        precondition(perFileKeys, "a vault-wide content key has no per-file key")
        if let onlyFile {
            guard onlyFile == fileID else { throw CryptoError.keyRetired }
            return self
        }
        let fileKey = SecureBytes(count: 32)
        try key.lend { contentKey in Self.deriveFileKey(into: fileKey.bytes, from: contentKey, fileID: fileID, algorithm: algorithm) }
        return ContentCipher(key: fileKey, algorithm: algorithm, perFileKeys: true, onlyFile: fileID, engine: engine, keySlot: nil)
    }

    /// A copy of this cipher's key, for known-answer tests of a one-file cipher only
    /// (internal: the tests reach it through `@testable import`).
    func keyBytesForTests() throws -> [UInt8] {
        precondition(onlyFile != nil, "only a one-file cipher's key may be copied out")
        return try key.lend { Array(UnsafeBufferPointer(start: $0, count: 32)) }
    }

    /// Zeroes this cipher's key for good (see `SecureBytes.retire`): a one-file cipher's
    /// when its file closes.
    public func retire() { key.retire() }

    /// A cipher for the blocks of `fileID` under its own random key `fileKey` (a file
    /// made while locked, whose key is sealed to the drop key: docs/FORMAT.md §12).
    public static func sealedFile(key fileKey: SecureBytes, algorithm: ContentAlgorithm, fileID: FileID,
                                  engine: AESEngine? = nil) -> ContentCipher {
        ContentCipher(key: fileKey, algorithm: algorithm, perFileKeys: true, onlyFile: fileID,
                      engine: algorithm == .aes256gcm ? engine ?? AESEngine.chosen.engine : .libsodium, keySlot: nil)
    }

    /// A one-file cipher with a copy of this one's key, to be retired on its own.
    public func copy() -> ContentCipher {
        precondition(onlyFile != nil, "only a one-file cipher is copied")
        return ContentCipher(key: key.prefix(key.count), algorithm: algorithm, perFileKeys: true, onlyFile: onlyFile,
                             engine: engine, keySlot: nil)
    }

    /// The key of one file: BLAKE2b-256(key: content subkey, salt: file ID, personal:
    /// "coffer-aes-file1" or "coffer-xch-file1").
    private static func deriveFileKey(into out: UnsafeMutablePointer<UInt8>, from contentKey: UnsafePointer<UInt8>,
                                      fileID: FileID, algorithm: ContentAlgorithm) {
        let personal = algorithm == .aes256gcm ? fileKeyPersonal : xchachaFileKeyPersonal
        let rc = fileID.bytes.withUnsafeBufferPointer { salt in
            personal.withUnsafeBufferPointer { personal in
                crypto_generichash_blake2b_salt_personal(out, 32, nil, 0, contentKey, 32, salt.baseAddress, personal.baseAddress)
            }
        }
        // The key is also in blake2b_final's dead frame (coffer_scrub_stack says why).
        coffer_scrub_stack()
        precondition(rc == 0, "crypto_generichash_blake2b_salt_personal failed")
    }

    /// What sealing and opening one file's blocks need: the content key itself
    /// (XChaCha20-Poly1305 up to format 5), the file's key (XChaCha20-Poly1305 from
    /// format 6), or the file's key expanded for AES-256-GCM by libsodium or ipsec-mb.
    struct BlockKey {
        enum Kind: Equatable, Sendable {
            case xchacha20poly1305, libsodiumAES, ipsecMBAES

            /// Bytes a prepared key of this kind takes, with room to align it to 64.
            var preparedSize: Int {
                switch self {
                case .xchacha20poly1305: return 32
                case .libsodiumAES: return crypto_aead_aes256gcm_statebytes() + 63
                case .ipsecMBAES: return IPSecMB.keyDataSize + 63
                }
            }
        }
        let kind: Kind
        let pointer: UnsafeRawPointer
    }

    /// The form this cipher's blocks need their key in.
    private var blockKeyKind: BlockKey.Kind {
        switch (algorithm, engine) {
        case (.xchacha20poly1305, _): return .xchacha20poly1305
        case (.aes256gcm, .libsodium): return .libsodiumAES
        case (.aes256gcm, .ipsecMB): return .ipsecMBAES
        }
    }

    /// Lends the key for the blocks of `fileID` to `body`: the content key itself
    /// (XChaCha20-Poly1305 up to format 5), else the file's key — derived (`deriveFileKey`)
    /// or held by a one-file cipher, for AES-256-GCM expanded — prepared once per open
    /// file and kept in sodium memory, in the file's BlockKeySlot (given by `using`),
    /// until its last close or the lock.
    ///
    /// A call with no open file to keep the key for (fsck, a truncate by path, a cipher
    /// without a slot) prepares it in a temporary buffer (the stack's, or for ipsec-mb's
    /// 1 KiB of key data the heap's) zeroed before this returns: it lives
    /// for one call (0.3–1 µs to make, where sodium_malloc costs several system calls),
    /// inside `lend`, so a lock's wipe waits for it to be zeroed; and it shares the
    /// call's stack with the plaintext it protects, so locking its page against swap
    /// would protect nothing the plaintext buffers do not already expose.
    func withBlockKey<R>(fileID: FileID, _ body: (BlockKey) throws -> R) throws -> R {
        if let onlyFile, onlyFile != fileID { throw CryptoError.keyRetired }
        guard perFileKeys else {
            return try key.lend { try body(BlockKey(kind: .xchacha20poly1305, pointer: UnsafeRawPointer($0))) }
        }
        let kind = blockKeyKind
        if let kept = try keySlot?.prepared(owner: key, fileID: fileID, kind: kind, size: kind.preparedSize,
                                            make: { try prepare($0, fileID: fileID, kind: kind) }) {
            do {
                // Under this cipher's key too: once the lock retires it, the key prepared
                // from it serves nobody, even before the lock wipes the slot.
                return try key.lend { _ in
                    try kept.lend { try body(BlockKey(kind: kind, pointer: Self.aligned(UnsafeMutableRawPointer(mutating: $0), kind))) }
                }
            } catch CryptoError.keyRetired {
                // Wiped by the file's last close or by the lock since: prepared anew below,
                // which throws too if the lock retired this cipher's key.
            }
        }
        return try key.lend { contentKey in
            try withUnsafeTemporaryAllocation(byteCount: kind.preparedSize, alignment: 16) { scratch in
                defer { sodium_memzero(scratch.baseAddress!, scratch.count) }
                let target = Self.aligned(scratch.baseAddress!, kind)
                prepare(target, from: contentKey, fileID: fileID, kind: kind)
                return try body(BlockKey(kind: kind, pointer: UnsafeRawPointer(target)))
            }
        }
    }

    /// Fills `prepared` (sodium memory) with the key of `fileID` in form `kind`.
    private func prepare(_ prepared: SecureBytes, fileID: FileID, kind: BlockKey.Kind) throws {
        try key.lend { contentKey in
            try prepared.lend { prepare(Self.aligned(UnsafeMutableRawPointer(mutating: $0), kind), from: contentKey, fileID: fileID, kind: kind) }
        }
    }

    /// Writes the key of `fileID` in form `kind` at `target` (aligned by `aligned`),
    /// from this cipher's key `ownKey`. An AES file key passes through a stack buffer
    /// that is zeroed before this returns.
    private func prepare(_ target: UnsafeMutableRawPointer, from ownKey: UnsafePointer<UInt8>, fileID: FileID, kind: BlockKey.Kind) {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 32) { scratch in
            defer { sodium_memzero(scratch.baseAddress!, 32) }
            let fileKey = kind == .xchacha20poly1305 ? target.assumingMemoryBound(to: UInt8.self) : scratch.baseAddress!
            if onlyFile != nil {
                fileKey.update(from: ownKey, count: 32)
            } else {
                Self.deriveFileKey(into: fileKey, from: ownKey, fileID: fileID, algorithm: algorithm)
            }
            switch kind {
            case .xchacha20poly1305: break
            case .libsodiumAES:
                _ = crypto_aead_aes256gcm_beforenm(target.assumingMemoryBound(to: crypto_aead_aes256gcm_state.self), fileKey)
            case .ipsecMBAES:
                IPSecMB.prepare(fileKey, into: target)
            }
        }
    }

    /// Where in a buffer of `kind.preparedSize` bytes the prepared key starts: the AES
    /// forms 64-byte aligned (ipsec-mb's key data needs it; libsodium's state 16).
    private static func aligned(_ base: UnsafeMutableRawPointer, _ kind: BlockKey.Kind) -> UnsafeMutableRawPointer {
        guard kind != .xchacha20poly1305 else { return base }
        return base.alignedUp(toMultipleOf: 64)
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
        try withBlockKey(fileID: fileID) { sealRun(plaintext, firstBlock: firstBlock, fileID: fileID, into: ciphertext, key: $0) }
    }

    private func sealRun(_ plaintext: UnsafeRawBufferPointer, firstBlock: UInt64, fileID: FileID,
                         into ciphertext: UnsafeMutableRawBufferPointer, key: BlockKey) {
        let blocks = (plaintext.count + Self.blockSize - 1) / Self.blockSize
        precondition(ciphertext.count >= Self.cipherLength(plainLength: plaintext.count))
        guard blocks > 0 else { return }
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: blocks * Self.nonceSize) { nonces in
            if key.kind != .xchacha20poly1305 {
                // 12 random bytes, then 12 zero bytes, per block.
                for i in 0..<blocks {
                    let nonce = UnsafeMutableRawBufferPointer(start: nonces.baseAddress! + i * Self.nonceSize, count: Self.nonceSize)
                    NoncePool.current.fill(UnsafeMutableRawBufferPointer(rebasing: nonce[0..<Self.gcmNonceSize]))
                    nonce[Self.gcmNonceSize...].initializeMemory(as: UInt8.self, repeating: 0)
                }
            } else {
                NoncePool.current.fill(UnsafeMutableRawBufferPointer(nonces))
            }
            for i in 0..<blocks {
                sealOne(plaintext, block: i, firstBlock: firstBlock, fileID: fileID,
                        nonce: UnsafeRawPointer(nonces.baseAddress! + i * Self.nonceSize), into: ciphertext, key: key)
            }
        }
    }

    /// Runs of at least this many blocks are split across the CPU cores, by the engines
    /// that split at all (`splitsLongRuns`): 128 KiB, the size of the kernel's readahead
    /// requests. Below that, handing work to another thread costs more than it saves.
    public static let parallelThreshold = 32

    /// Whether long runs are split across the cores at all: not by ipsec-mb, which seals
    /// a 1 MiB request in about 120 µs on one core. Measured (docs/PERFORMANCE.md,
    /// 2026-11-26 late night): split, its streaming reads were 0.69–0.82 of unsplit ones
    /// and cost 30–40 % more daemon CPU, on both transports, writes level; libsodium's
    /// XChaCha20 (1.3 GB/s) still reads 1.2× faster and writes 1.1× faster split.
    public var splitsLongRuns: Bool { engine != .ipsecMB }

    /// Like `seal`, with long runs split across the CPU cores.
    public func sealInParallel(_ plaintext: UnsafeRawBufferPointer, firstBlock: UInt64, fileID: FileID,
                               into ciphertext: UnsafeMutableRawBufferPointer) throws {
        let blocks = (plaintext.count + Self.blockSize - 1) / Self.blockSize
        let parts = splitsLongRuns ? Self.parts(blocks) : 1
        guard parts > 1 else { return try seal(plaintext, firstBlock: firstBlock, fileID: fileID, into: ciphertext) }
        let perPart = (blocks + parts - 1) / parts
        try withBlockKey(fileID: fileID) { key in
            // Unchecked on purpose: each part writes a disjoint range of `ciphertext`,
            // the key is only read, and concurrentPerform returns after the last part.
            nonisolated(unsafe) let plaintext = plaintext, ciphertext = ciphertext, key = key
            DispatchQueue.concurrentPerform(iterations: parts) { part in
                let first = part * perPart
                let plainRange = first * Self.blockSize..<min(plaintext.count, (first + perPart) * Self.blockSize)
                guard !plainRange.isEmpty else { return }
                let cipherStart = first * Self.cipherBlockSize
                let cipherEnd = cipherStart + Self.cipherLength(plainLength: plainRange.count)
                sealRun(UnsafeRawBufferPointer(rebasing: plaintext[plainRange]), firstBlock: firstBlock + UInt64(first), fileID: fileID,
                        into: UnsafeMutableRawBufferPointer(rebasing: ciphertext[cipherStart..<cipherEnd]),
                        key: key)
            }
        }
    }

    /// Like `open`, with long runs split across the CPU cores; throws for the first bad
    /// block of the run (the lowest index).
    @discardableResult
    public func openInParallel(_ ciphertext: UnsafeRawBufferPointer, firstBlock: UInt64, fileID: FileID,
                               into plaintext: UnsafeMutableRawBufferPointer) throws -> Int {
        let blocks = (ciphertext.count + Self.cipherBlockSize - 1) / Self.cipherBlockSize
        let parts = splitsLongRuns ? Self.parts(blocks) : 1
        guard parts > 1 else { return try open(ciphertext, firstBlock: firstBlock, fileID: fileID, into: plaintext) }
        let perPart = (blocks + parts - 1) / parts
        let failures = UnsafeMutableBufferPointer<CryptoError?>.allocate(capacity: parts)
        failures.initialize(repeating: nil)
        defer { failures.deallocate() }
        var total = 0
        let totals = UnsafeMutableBufferPointer<Int>.allocate(capacity: parts)
        totals.initialize(repeating: 0)
        defer { totals.deallocate() }
        try withBlockKey(fileID: fileID) { key in
            // Unchecked on purpose: part N writes only plaintext's range N, totals[N] and
            // failures[N]; the key is only read; concurrentPerform returns after the last part.
            nonisolated(unsafe) let ciphertext = ciphertext, plaintext = plaintext, key = key
            nonisolated(unsafe) let totals = totals, failures = failures
            DispatchQueue.concurrentPerform(iterations: parts) { part in
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
            }
        }
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
        precondition(algorithm != .aes256gcm || nonce[Self.gcmNonceSize...].allSatisfy { $0 == 0 },
                     "an AES-256-GCM nonce field ends in 12 zero bytes")
        try withBlockKey(fileID: fileID) { key in
            nonce.withUnsafeBytes { n in
                sealOne(plaintext, block: 0, firstBlock: blockIndex, fileID: fileID,
                        nonce: n.baseAddress!, into: ciphertext, key: key)
            }
        }
    }

    @inline(__always)
    func sealOne(_ plaintext: UnsafeRawBufferPointer, block i: Int, firstBlock: UInt64,
                         fileID: FileID, nonce: UnsafeRawPointer,
                         into ciphertext: UnsafeMutableRawBufferPointer, key: BlockKey) {
        let plainStart = i * Self.blockSize
        let plainCount = Swift.min(Self.blockSize, plaintext.count - plainStart)
        let out = ciphertext.baseAddress!.assumingMemoryBound(to: UInt8.self) + i * Self.cipherBlockSize
        let input = plaintext.baseAddress!.assumingMemoryBound(to: UInt8.self) + plainStart
        out.update(from: nonce.assumingMemoryBound(to: UInt8.self), count: Self.nonceSize)
        withAssociatedData(fileID: fileID, blockIndex: firstBlock + UInt64(i)) { ad in
            var written: UInt64 = 0
            switch key.kind {
            case .xchacha20poly1305:
                _ = crypto_aead_xchacha20poly1305_ietf_encrypt(
                    out + Self.nonceSize, &written, input, UInt64(plainCount),
                    ad.baseAddress, UInt64(ad.count), nil, out, key.pointer.assumingMemoryBound(to: UInt8.self))
            case .libsodiumAES:
                _ = crypto_aead_aes256gcm_encrypt_afternm(
                    out + Self.nonceSize, &written, input, UInt64(plainCount),
                    ad.baseAddress, UInt64(ad.count), nil, out, key.pointer.assumingMemoryBound(to: crypto_aead_aes256gcm_state.self))
            case .ipsecMBAES:
                IPSecMB.seal(keyData: key.pointer, out: out + Self.nonceSize, input, length: plainCount, iv: out, ad: ad,
                             tag: out + Self.nonceSize + plainCount)
            }
        }
    }

    /// Opens consecutive ciphertext blocks starting at block `firstBlock` into `plaintext`,
    /// which must hold the plaintext length. An all-zero block is a hole and opens as zeros.
    /// Returns the number of plaintext bytes written; throws for the first bad block.
    @discardableResult
    public func open(_ ciphertext: UnsafeRawBufferPointer, firstBlock: UInt64, fileID: FileID,
                     into plaintext: UnsafeMutableRawBufferPointer) throws -> Int {
        try withBlockKey(fileID: fileID) { try openRun(ciphertext, firstBlock: firstBlock, fileID: fileID, into: plaintext, key: $0) }
    }

    private func openRun(_ ciphertext: UnsafeRawBufferPointer, firstBlock: UInt64, fileID: FileID,
                         into plaintext: UnsafeMutableRawBufferPointer, key: BlockKey) throws -> Int {
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
                guard openOne(block, length: length, index: index, fileID: fileID, into: pbase! + plainOffset, key: key) else {
                    throw CryptoError.blockAuthenticationFailed(blockIndex: index)
                }
            }
            cipherOffset += length
            plainOffset += plainLength
            index += 1
        }
        return plainOffset
    }

    /// Opens one sealed block of `length` bytes (nonce ‖ ciphertext ‖ tag); false if it
    /// fails authentication.
    @inline(__always)
    private func openOne(_ block: UnsafePointer<UInt8>, length: Int, index: UInt64, fileID: FileID,
                         into plain: UnsafeMutablePointer<UInt8>, key: BlockKey) -> Bool {
        withAssociatedData(fileID: fileID, blockIndex: index) { ad -> Int32 in
            var written: UInt64 = 0
            switch key.kind {
            case .xchacha20poly1305:
                return crypto_aead_xchacha20poly1305_ietf_decrypt(
                    plain, &written, nil, block + Self.nonceSize,
                    UInt64(length - Self.nonceSize), ad.baseAddress, UInt64(ad.count), block,
                    key.pointer.assumingMemoryBound(to: UInt8.self))
            case .libsodiumAES, .ipsecMBAES:
                // The unused half of the nonce field is not authenticated by GCM:
                // anything but zeros there is tampering.
                guard Self.isHole(block + Self.gcmNonceSize, Self.nonceSize - Self.gcmNonceSize) else { return -1 }
                guard key.kind == .ipsecMBAES else {
                    return crypto_aead_aes256gcm_decrypt_afternm(
                        plain, &written, nil, block + Self.nonceSize,
                        UInt64(length - Self.nonceSize), ad.baseAddress, UInt64(ad.count), block,
                        key.pointer.assumingMemoryBound(to: crypto_aead_aes256gcm_state.self))
                }
                let plainLength = length - Self.overhead
                return IPSecMB.open(keyData: key.pointer, out: plain, block + Self.nonceSize, length: plainLength, iv: block, ad: ad,
                                    tag: block + Self.nonceSize + plainLength) ? 0 : -1
            }
        } == 0
    }

    /// Seals the final block of a file (format 4): `plaintext` holds 0…4095 bytes, and
    /// `ciphertext` its length + 40.
    public func sealFinalBlock(_ plaintext: UnsafeRawBufferPointer, index: UInt64, fileID: FileID,
                               into ciphertext: UnsafeMutableRawBufferPointer) throws {
        precondition(plaintext.count < Self.blockSize && ciphertext.count >= plaintext.count + Self.overhead)
        var empty: UInt8 = 0
        try withUnsafeMutablePointer(to: &empty) { dummy in
            // A block of no bytes still needs an address to read from.
            let input = plaintext.count > 0 ? plaintext : UnsafeRawBufferPointer(start: dummy, count: 0)
            try withBlockKey(fileID: fileID) { key in
                var nonce = [UInt8](repeating: 0, count: Self.nonceSize)
                nonce.withUnsafeMutableBytes { n in
                    NoncePool.current.fill(UnsafeMutableRawBufferPointer(
                        rebasing: n[0..<(key.kind == .xchacha20poly1305 ? Self.nonceSize : Self.gcmNonceSize)]))
                }
                nonce.withUnsafeBytes { n in
                    sealOne(input, block: 0, firstBlock: index, fileID: fileID, nonce: n.baseAddress!, into: ciphertext, key: key)
                }
            }
        }
    }

    /// Opens the final block of a file (format 4): 40…4135 bytes, never a hole (a final
    /// block of zeros is a cut file). Returns its plaintext length.
    @discardableResult
    public func openFinalBlock(_ ciphertext: UnsafeRawBufferPointer, index: UInt64, fileID: FileID,
                               into plaintext: UnsafeMutableRawBufferPointer) throws -> Int {
        let length = ciphertext.count
        guard length >= Self.overhead, length < Self.cipherBlockSize else {
            throw CryptoError.blockTooShort(blockIndex: index, length: length)
        }
        precondition(plaintext.count >= length - Self.overhead)
        let block = ciphertext.baseAddress!.assumingMemoryBound(to: UInt8.self)
        guard !Self.isHole(block, length) else { throw CryptoError.blockAuthenticationFailed(blockIndex: index) }
        var empty: UInt8 = 0
        let ok = try withUnsafeMutablePointer(to: &empty) { dummy in
            try withBlockKey(fileID: fileID) { key in
                openOne(block, length: length, index: index, fileID: fileID,
                        into: plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? dummy, key: key)
            }
        }
        guard ok else { throw CryptoError.blockAuthenticationFailed(blockIndex: index) }
        return length - Self.overhead
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

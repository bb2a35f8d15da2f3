// ReverseKey is a reverse view's key, K_rev (subkey 10): every choice a vault leaves
// random — directory IVs, entry IDs, block and symlink nonces — made a keyed function of
// the plaintext instead, so that a view gives the same bytes on every mount
// (docs/FORMAT.md §14). Bytes in, bytes out.
import CSodium
import Dispatch
import Synchronization

public final class ReverseKey: Sendable {
    private let key: SecureBytes

    /// K_rev of `master` (subkey 10).
    public init(master: MasterKey) { key = master.subkey(.reverse) }

    /// Wraps a key given as is (test vectors).
    package init(key: SecureBytes) { self.key = key }

    /// The root directory's IV.
    public func rootIV() throws -> [UInt8] { try mac(16, Self.diriv) }

    /// The IV of directory `name` in the directory with IV `parentIV`.
    public func directoryIV(parentIV: [UInt8], name: [UInt8]) throws -> [UInt8] {
        try mac(16, Self.diriv + parentIV + name)
    }

    /// The ID of entry `name` (one link) in the directory with IV `dirIV`.
    public func entryID(dirIV: [UInt8], name: [UInt8]) throws -> FileID {
        FileID(bytes: try mac(16, Self.file + dirIV + name))
    }

    /// The ID of every name of inode `inode` (more than one link).
    public func linkedEntryID(inode: UInt64) throws -> FileID {
        var big = inode.bigEndian
        return FileID(bytes: try mac(16, Self.inode + withUnsafeBytes(of: &big) { Array($0) }))
    }

    /// The nonce a symlink of entry `id` with `target` is sealed with.
    public func symlinkNonce(entryID id: FileID, target: [UInt8]) throws -> [UInt8] {
        try mac(24, Self.link + id.bytes + target)
    }

    /// Writes block `index`'s nonce for `plaintext` (its bytes) of file `fileID` at `out`
    /// (24 bytes; for AES-256-GCM its first 12 bytes and 12 zero bytes). The plaintext is
    /// hashed where it lies; the hash state is zeroed after.
    func blockNonce(fileID: FileID, index: UInt64, plaintext: UnsafeRawBufferPointer, gcm: Bool,
                    into out: UnsafeMutablePointer<UInt8>) throws {
        let size = crypto_generichash_statebytes()
        try withUnsafeTemporaryAllocation(byteCount: size, alignment: 64) { memory in
            defer { sodium_memzero(memory.baseAddress!, size) }
            let state = OpaquePointer(memory.baseAddress!)
            var big = index.bigEndian
            let rc = try key.lend { key in
                crypto_generichash_init(state, key, 32, 24)
                    | Self.block.withUnsafeBufferPointer { crypto_generichash_update(state, $0.baseAddress, UInt64($0.count)) }
                    | fileID.bytes.withUnsafeBufferPointer { crypto_generichash_update(state, $0.baseAddress, UInt64($0.count)) }
                    | withUnsafeBytes(of: &big) {
                        crypto_generichash_update(state, $0.baseAddress!.assumingMemoryBound(to: UInt8.self), 8)
                    }
                    | crypto_generichash_update(state, plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self),
                                                UInt64(plaintext.count))
                    | crypto_generichash_final(state, out, 24)
            }
            precondition(rc == 0, "crypto_generichash failed")
        }
        if gcm { (out + ContentCipher.gcmNonceSize).initialize(repeating: 0, count: 24 - ContentCipher.gcmNonceSize) }
    }

    /// Zeroes the key now rather than when the last reference goes.
    public func wipe() { key.retire() }

    private static let diriv = Array("coffer.rev.diriv".utf8) + [0]
    private static let file = Array("coffer.rev.file".utf8) + [0]
    private static let inode = Array("coffer.rev.inode".utf8) + [0]
    private static let link = Array("coffer.rev.link".utf8) + [0]
    private static let block = Array("coffer.rev.block".utf8) + [0]

    /// BLAKE2b-n keyed with K_rev of `input` (public: names, IDs, IVs).
    private func mac(_ n: Int, _ input: [UInt8]) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: n)
        let rc = try key.lend { key in crypto_generichash(&out, n, input, UInt64(input.count), key, 32) }
        precondition(rc == 0, "crypto_generichash failed")
        return out
    }
}

extension ContentCipher {
    /// Seals `plaintext` — consecutive blocks from `firstBlock`, the last of which may be
    /// short, or one empty final block — into `ciphertext` (`cipherLength`, or 40 bytes for
    /// an empty block), each block under the nonce `reverse` derives from its bytes and
    /// position (a synthetic IV: the same block gives the same bytes). Runs of
    /// `parallelThreshold` blocks and more are split across the cores.
    public func sealSynthetic(_ plaintext: UnsafeRawBufferPointer, firstBlock: UInt64, fileID: FileID, reverse: ReverseKey,
                              into ciphertext: UnsafeMutableRawBufferPointer) throws {
        let blocks = max(1, (plaintext.count + Self.blockSize - 1) / Self.blockSize)
        precondition(ciphertext.count >= blocks * Self.overhead + plaintext.count)
        let gcm = algorithm == .aes256gcm
        try withBlockKey(fileID: fileID) { key in
            var empty: UInt8 = 0
            try withUnsafeMutablePointer(to: &empty) { dummy in
                // A block of no bytes still needs an address to read from.
                let input = plaintext.count > 0 ? plaintext : UnsafeRawBufferPointer(start: dummy, count: 0)
                let parts = splitsLongRuns ? Self.parts(blocks) : 1
                let perPart = (blocks + parts - 1) / parts
                guard parts > 1 else {
                    return try sealSyntheticBlocks(0..<blocks, of: input, firstBlock: firstBlock, fileID: fileID, reverse: reverse,
                                                   gcm: gcm, into: ciphertext, key: key)
                }
                let failures = UnsafeMutableBufferPointer<Bool>.allocate(capacity: parts)
                failures.initialize(repeating: false)
                defer { failures.deallocate() }
                // Unchecked on purpose: each part writes a disjoint range of `ciphertext` and
                // its own failure flag, the keys are only read, and concurrentPerform returns
                // after the last part.
                nonisolated(unsafe) let sharedInput = input, sharedOut = ciphertext, sharedKey = key, flags = failures
                DispatchQueue.concurrentPerform(iterations: parts) { part in
                    do {
                        try sealSyntheticBlocks(part * perPart..<min(blocks, (part + 1) * perPart), of: sharedInput,
                                                firstBlock: firstBlock, fileID: fileID, reverse: reverse, gcm: gcm,
                                                into: sharedOut, key: sharedKey)
                    } catch {
                        flags[part] = true
                    }
                }
                if failures.contains(true) { throw CryptoError.keyRetired }
            }
        }
    }

    /// Seals blocks `range` of `input` (whose block 0 is block `firstBlock` of the file).
    private func sealSyntheticBlocks(_ range: Range<Int>, of input: UnsafeRawBufferPointer, firstBlock: UInt64, fileID: FileID,
                                     reverse: ReverseKey, gcm: Bool, into ciphertext: UnsafeMutableRawBufferPointer,
                                     key: BlockKey) throws {
        try withUnsafeTemporaryAllocation(of: UInt8.self, capacity: Self.nonceSize) { nonce in
            for i in range {
                let start = i * Self.blockSize
                let block = UnsafeRawBufferPointer(rebasing: input[start..<min(input.count, start + Self.blockSize)])
                try reverse.blockNonce(fileID: fileID, index: firstBlock + UInt64(i), plaintext: block, gcm: gcm, into: nonce.baseAddress!)
                sealOne(input, block: i, firstBlock: firstBlock, fileID: fileID, nonce: nonce.baseAddress!, into: ciphertext, key: key)
            }
        }
    }
}

// EngineBenchmark measures the engine's sealing and opening of 4 KiB blocks against
// raw libsodium calls on the same buffers, for `coffer speed`.
import CofferCrypto
import CofferSystem
import CSodium
import Glibc

public enum EngineBenchmark {
    public struct Result {
        /// MB/s (10^6 bytes of plaintext per second), engine and raw libsodium.
        public var engineSeal: Double, engineOpen: Double, rawSeal: Double, rawOpen: Double
    }

    /// Blocks per call: 32 × 4 KiB = 128 KiB, the kernel's default FUSE request size.
    static let batchBlocks = 32

    /// Runs `body` (which processes `bytesPerCall` bytes) for about `seconds`; returns MB/s.
    static func rate(seconds: Double, bytesPerCall: Int, _ body: () -> Void) -> Double {
        var calls = 0
        let start = Sys.monotonicNow()
        var elapsed = 0.0
        repeat {
            for _ in 0..<8 { body() }
            calls += 8
            elapsed = Sys.monotonicNow() - start
        } while elapsed < seconds
        return Double(calls * bytesPerCall) / elapsed / 1e6
    }

    /// Measures the contestants in short alternating slices and keeps each one's best
    /// slice, so that a noisy neighbour or a clock change hurts both alike.
    static func best(seconds: Double, bytesPerCall: Int, _ contestants: [() -> Void]) -> [Double] {
        let slice = 0.05
        let rounds = max(3, Int(seconds / slice / Double(contestants.count)))
        var best = [Double](repeating: 0, count: contestants.count)
        contestants.forEach { $0() }  // warm-up
        for _ in 0..<rounds {
            for (i, body) in contestants.enumerated() {
                best[i] = max(best[i], rate(seconds: slice, bytesPerCall: bytesPerCall, body))
            }
        }
        return best
    }

    /// Measures each of the four figures of `algorithm` (AES-256-GCM run by `engine`)
    /// for about `seconds`. Both sides use one prepared key for all blocks: raw libsodium
    /// one key (for AES-256-GCM, one expanded key), the engine the file's key prepared
    /// once, as for an open file.
    public static func run(algorithm: ContentAlgorithm, engine: AESEngine = .libsodium, seconds: Double = 1.0) -> Result {
        let slot = BlockKeySlot()
        slot.fileOpened()
        defer { slot.fileClosed() }
        let cipher = ContentCipher(key: .random(count: 32), algorithm: algorithm, engine: engine).using(slot)
        // Raw libsodium's key: a throwaway for measuring, not a secret, so an ordinary array.
        let key = Sodium.randomArray(count: 32)
        let state = UnsafeMutableRawPointer.allocate(byteCount: crypto_aead_aes256gcm_statebytes(), alignment: 16)
            .bindMemory(to: crypto_aead_aes256gcm_state.self, capacity: 1)
        defer { sodium_memzero(state, crypto_aead_aes256gcm_statebytes()); state.deallocate() }
        if algorithm == .aes256gcm { crypto_aead_aes256gcm_beforenm(state, key) }
        func rawSeal(_ out: UnsafeMutablePointer<UInt8>, _ input: UnsafePointer<UInt8>, _ nonce: UnsafePointer<UInt8>, _ ad: UnsafePointer<UInt8>) {
            var n: UInt64 = 0
            switch algorithm {
            case .xchacha20poly1305:
                crypto_aead_xchacha20poly1305_ietf_encrypt(out, &n, input, UInt64(ContentCipher.blockSize), ad, 24, nil, nonce, key)
            case .aes256gcm:
                crypto_aead_aes256gcm_encrypt_afternm(out, &n, input, UInt64(ContentCipher.blockSize), ad, 24, nil, nonce, state)
            }
        }
        func rawOpen(_ out: UnsafeMutablePointer<UInt8>, _ input: UnsafePointer<UInt8>, _ nonce: UnsafePointer<UInt8>, _ ad: UnsafePointer<UInt8>) {
            var n: UInt64 = 0
            let length = UInt64(ContentCipher.cipherBlockSize - ContentCipher.nonceSize)
            let rc: Int32
            switch algorithm {
            case .xchacha20poly1305:
                rc = crypto_aead_xchacha20poly1305_ietf_decrypt(out, &n, nil, input, length, ad, 24, nonce, key)
            case .aes256gcm:
                rc = crypto_aead_aes256gcm_decrypt_afternm(out, &n, nil, input, length, ad, 24, nonce, state)
            }
            // The blocks were sealed just before under the same key: opening them cannot fail.
            precondition(rc == 0, "raw libsodium refused its own block")
        }
        let fileID = FileID.random()
        let plainLength = batchBlocks * ContentCipher.blockSize
        let plain = UnsafeMutableRawBufferPointer.allocate(byteCount: plainLength, alignment: 16)
        let sealed = UnsafeMutableRawBufferPointer.allocate(
            byteCount: ContentCipher.cipherLength(plainLength: plainLength), alignment: 16)
        defer { plain.deallocate(); sealed.deallocate() }
        Sodium.randomBytes(plain)

        let nonce = [UInt8](repeating: 1, count: ContentCipher.nonceSize)
        let ad = [UInt8](repeating: 2, count: 24)
        let p = plain.baseAddress!.assumingMemoryBound(to: UInt8.self)
        let c = sealed.baseAddress!.assumingMemoryBound(to: UInt8.self)
        let block = ContentCipher.blockSize, cblock = ContentCipher.cipherBlockSize
        let seals = best(seconds: seconds, bytesPerCall: plainLength, [
            // The benchmark's key is never retired: seal cannot throw here.
            { try! cipher.seal(UnsafeRawBufferPointer(plain), firstBlock: 7, fileID: fileID, into: sealed) },
            // Raw libsodium: the same AEAD over the same blocks, fixed nonce, fixed AD.
            { for i in 0..<batchBlocks { rawSeal(c + i * cblock + 24, p + i * block, nonce, ad) } },
        ])
        // The raw contestant overwrote `sealed`: seal it again for the engine to open, and
        // give raw libsodium its own sealed copy.
        try! cipher.seal(UnsafeRawBufferPointer(plain), firstBlock: 7, fileID: fileID, into: sealed)
        let rawSealed = UnsafeMutableRawBufferPointer.allocate(byteCount: sealed.count, alignment: 16)
        defer { rawSealed.deallocate() }
        let r = rawSealed.baseAddress!.assumingMemoryBound(to: UInt8.self)
        for i in 0..<batchBlocks {
            (r + i * cblock).update(from: nonce, count: 24)
            rawSeal(r + i * cblock + 24, p + i * block, nonce, ad)
        }
        let opens = best(seconds: seconds, bytesPerCall: plainLength, [
            { _ = try! cipher.open(UnsafeRawBufferPointer(sealed), firstBlock: 7, fileID: fileID, into: plain) },
            { for i in 0..<batchBlocks { rawOpen(p + i * block, r + i * cblock + 24, nonce, ad) } },
        ])
        let (engineSeal, rawSeal, engineOpen, rawOpen) = (seals[0], seals[1], opens[0], opens[1])
        return Result(engineSeal: engineSeal, engineOpen: engineOpen, rawSeal: rawSeal, rawOpen: rawOpen)
    }
}

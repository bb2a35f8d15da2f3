// AESEngine chooses the library that seals and opens AES-256-GCM content blocks:
// libsodium, or on x86-64 Intel's ipsec-mb where it is installed and faster. Both make
// the same blocks (docs/FORMAT.md §4); only the speed differs. Everything else coffer
// encrypts stays libsodium's.
import CIPSecMB
import CSodium
import Glibc
import Synchronization

public enum AESEngine: String, CaseIterable, Sendable {
    case libsodium
    case ipsecMB = "ipsec-mb"

    /// Why this engine cannot run here; nil if it can.
    public var unavailableReason: String? {
        switch self {
        case .libsodium: return ContentAlgorithm.aes256gcm.isAvailable ? nil : "this CPU lacks AES-NI or PCLMUL"
        case .ipsecMB: return ContentAlgorithm.aes256gcm.isAvailable ? IPSecMB.loadFailure : "this CPU lacks AES-NI or PCLMUL"
        }
    }

    /// The engine's name with what it runs on ("ipsec-mb 1.3.0 (avx512)").
    public var detail: String {
        switch self {
        case .libsodium: return "libsodium \(String(cString: sodium_version_string()))"
        case .ipsecMB: return "ipsec-mb \(String(cString: cipsecmb_version())) (\(String(cString: cipsecmb_arch())))"
        }
    }

    /// An engine and why it was chosen, for the daemon's log.
    public struct Choice: Sendable {
        public let engine: AESEngine
        public let reason: String
    }

    /// The engine of this process, chosen at its first use: the one COFFER_AES_ENGINE
    /// names (for tests and diagnosis) if it runs here, else the faster one on this CPU.
    public static let chosen: Choice = choose(forced: getenv(environmentVariable).map { String(cString: $0) })

    /// The environment variable that forces an engine.
    public static let environmentVariable = "COFFER_AES_ENGINE"

    /// The choice: `forced` if it names an engine that runs here; else libsodium where
    /// ipsec-mb cannot run (the reason says why), else whichever seals 128 KiB of 4 KiB
    /// blocks faster, best of 5 tries each (about a millisecond in all). A measurement,
    /// not a rule about CPU features: ipsec-mb's gain ranges from about 1.5× (SSE code)
    /// to 6× (VAES, AVX-512) of libsodium's, and a CPU that throttles wide vectors could
    /// reverse it; only a measurement on the machine says.
    public static func choose(forced: String?) -> Choice {
        if let forced {
            if let engine = AESEngine(rawValue: forced) {
                if let why = engine.unavailableReason {
                    return Choice(engine: .libsodium, reason: "\(environmentVariable)=\(forced), but \(why); libsodium instead")
                }
                return Choice(engine: engine, reason: "\(environmentVariable)=\(forced)")
            }
            // MountCommand refuses such a value; other commands fall back.
            return Choice(engine: .libsodium, reason: "\(environmentVariable)=\(forced) is not an engine (libsodium or ipsec-mb)")
        }
        if let why = ipsecMB.unavailableReason { return Choice(engine: .libsodium, reason: why) }
        let rates = allCases.map { engine -> (AESEngine, Double) in (engine, sealRate(engine)) }
        let faster = rates.max { $0.1 < $1.1 }!.0
        let figures = rates.map { "\($0.0.rawValue) \(Int($0.1)) MB/s" }.joined(separator: ", ")
        return Choice(engine: faster, reason: "faster on this CPU (\(figures); 4 KiB blocks, best of 5)")
    }

    /// MB/s at which `engine` seals 32 blocks of 4 KiB with a prepared key, best of 5.
    static func sealRate(_ engine: AESEngine) -> Double {
        let cipher = ContentCipher(key: .random(count: 32), algorithm: .aes256gcm, engine: engine)
        let slot = BlockKeySlot()
        slot.fileOpened()
        defer { slot.fileClosed() }
        let prepared = cipher.using(slot)
        let plainLength = 32 * ContentCipher.blockSize
        let plain = UnsafeMutableRawBufferPointer.allocate(byteCount: plainLength, alignment: 64)
        let sealed = UnsafeMutableRawBufferPointer.allocate(byteCount: ContentCipher.cipherLength(plainLength: plainLength), alignment: 64)
        defer { plain.deallocate(); sealed.deallocate() }
        plain.initializeMemory(as: UInt8.self, repeating: 7)
        let id = FileID(bytes: [UInt8](repeating: 1, count: FileID.size))
        var best = Double.infinity
        for _ in 0..<6 {  // the first try prepares the key and warms the caches
            var start = timespec(), end = timespec()
            clock_gettime(CLOCK_MONOTONIC, &start)
            // A fresh key, never retired while measuring: seal cannot throw.
            try! prepared.seal(UnsafeRawBufferPointer(plain), firstBlock: 0, fileID: id, into: sealed)
            clock_gettime(CLOCK_MONOTONIC, &end)
            best = min(best, Double(end.tv_sec - start.tv_sec) + Double(end.tv_nsec - start.tv_nsec) / 1e9)
        }
        return Double(plainLength) / max(best, 1e-9) / 1e6
    }
}

/// ipsec-mb's AES-256-GCM, loaded once; the expanded keys are the caller's sodium memory
/// (BlockKeySlot), each call's context a per-thread sodium buffer zeroed after the call.
enum IPSecMB {
    /// Nil once the library is loaded and has sealed and opened blocks exactly as
    /// libsodium does; else why it is not used.
    static let loadFailure: String? = {
        var why: UnsafePointer<CChar>?
        guard cipsecmb_load(&why) == 0 else { return String(cString: why!) }
        guard agreesWithLibsodium() else {
            return "\(AESEngine.ipsecMB.detail) made other blocks than libsodium in its self-test"
        }
        return nil
    }()

    /// Bytes of the expanded key and hash keys (struct gcm_key_data) and their alignment.
    static let keyDataSize = cipsecmb_key_data_size()
    static let keyDataAlignment = cipsecmb_key_data_alignment()

    /// Expands `key` (32 bytes) into the key data at `keyData`.
    static func prepare(_ key: UnsafePointer<UInt8>, into keyData: UnsafeMutableRawPointer) {
        precondition(Int(bitPattern: keyData) % keyDataAlignment == 0)
        cipsecmb_prepare(key, keyData)
    }

    /// Seals `length` bytes of `input` into `out` and the tag into `tag`.
    static func seal(keyData: UnsafeRawPointer, out: UnsafeMutablePointer<UInt8>, _ input: UnsafePointer<UInt8>, length: Int,
                     iv: UnsafePointer<UInt8>, ad: UnsafeBufferPointer<UInt8>, tag: UnsafeMutablePointer<UInt8>) {
        Context.current.use { cipsecmb_seal(keyData, $0, out, input, UInt64(length), iv, ad.baseAddress, UInt64(ad.count), tag) }
    }

    /// Opens `length` bytes of `input` into `out`; false (and `out` zeroed) if `tag`
    /// does not match, compared in constant time.
    static func open(keyData: UnsafeRawPointer, out: UnsafeMutablePointer<UInt8>, _ input: UnsafePointer<UInt8>, length: Int,
                     iv: UnsafePointer<UInt8>, ad: UnsafeBufferPointer<UInt8>, tag: UnsafePointer<UInt8>) -> Bool {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 16) { computed in
            Context.current.use {
                cipsecmb_open(keyData, $0, out, input, UInt64(length), iv, ad.baseAddress, UInt64(ad.count), computed.baseAddress!)
            }
            guard sodium_memcmp(computed.baseAddress!, tag, 16) == 0 else {
                sodium_memzero(out, length)
                return false
            }
            return true
        }
    }

    /// One thread's struct gcm_context_data (partial GHASH, the counter, a partial
    /// block's key stream) in sodium memory, zeroed after every call.
    final class Context {
        /// A multiple of 64 bytes: sodium_malloc puts the buffer at the end of its page,
        /// so its size decides its alignment.
        private let memory = SecureBytes(count: (cipsecmb_context_size() + 63) / 64 * 64)

        func use(_ body: (UnsafeMutableRawPointer) -> Void) {
            memory.withUnsafeMutableBytes { context in
                body(context.baseAddress!)
                sodium_memzero(context.baseAddress!, context.count)
            }
        }

        private static let contexts = PerThread { Context() }

        /// The calling thread's context, made on its first call.
        static var current: Context { contexts.current }
    }

    /// The self-test: a full and a short block sealed under one key, nonce and AD by
    /// both libraries must be byte for byte the same, each opens the other's, and a
    /// flipped tag bit fails.
    private static func agreesWithLibsodium() -> Bool {
        guard ContentAlgorithm.aes256gcm.isAvailable else { return false }
        let key = SecureBytes(count: 32)
        key.withUnsafeMutableBytes { for i in 0..<32 { $0[i] = UInt8(i) } }
        let id = FileID(bytes: (0..<16).map { UInt8(0xa0 + $0) })
        let nonce = (0..<12).map { UInt8(0x50 + $0) } + [UInt8](repeating: 0, count: 12)
        let sodium = ContentCipher.sealedFile(key: key, algorithm: .aes256gcm, fileID: id, engine: .libsodium)
        let intel = ContentCipher.sealedFile(key: key.prefix(32), algorithm: .aes256gcm, fileID: id, engine: .ipsecMB)
        for length in [ContentCipher.blockSize, 100] {
            let plain = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 7) }
            var a = [UInt8](repeating: 0, count: length + ContentCipher.overhead), b = a
            do {
                try plain.withUnsafeBytes { p in
                    try a.withUnsafeMutableBytes { try sodium.sealBlockWithFixedNonce(p, blockIndex: 9, fileID: id, nonce: nonce, into: $0) }
                    try b.withUnsafeMutableBytes { try intel.sealBlockWithFixedNonce(p, blockIndex: 9, fileID: id, nonce: nonce, into: $0) }
                }
                guard a == b else { return false }
                var out = [UInt8](repeating: 0, count: length)
                for (opener, block) in [(intel, a), (sodium, b)] {
                    _ = try block.withUnsafeBytes { c in try out.withUnsafeMutableBytes { try opener.open(c, firstBlock: 9, fileID: id, into: $0) } }
                    guard out == plain else { return false }
                }
                b[b.count - 1] ^= 1
                let refused = b.withUnsafeBytes { c in
                    out.withUnsafeMutableBytes { (try? intel.open(c, firstBlock: 9, fileID: id, into: $0)) == nil }
                }
                guard refused else { return false }
            } catch {
                return false
            }
        }
        return true
    }
}

// EntryNames keeps the plaintext names the kernel may hold in its dentry cache under one
// directory — found, created, renamed or linked there, and the negative entries of names
// looked up and not found or removed — so that a lock can invalidate every one of them.
// The bytes live in buffers of their own, zeroed when the names are forgotten.
import Glibc
import Synchronization

/// Sendable: the buffers are owned by the Mutex's value and lent out only as a `Span`
/// (checked, and valid only for the body it is lent to), under the lock. A leaf lock.
final class EntryNames: Sendable {
    /// Names by a hash of their bytes (Hasher is seeded per process).
    private struct Buffers: ~Copyable {
        var byHash: [Int: [UnsafeMutableBufferPointer<UInt8>]] = [:]

        mutating func forgetAll() {
            Self.free(byHash)
            byHash = [:]
        }

        deinit { Self.free(byHash) }

        private static func free(_ byHash: [Int: [UnsafeMutableBufferPointer<UInt8>]]) {
            for name in byHash.values.joined() {
                if let base = name.baseAddress { explicit_bzero(base, name.count) }
                name.deallocate()
            }
        }
    }

    private let buffers = Mutex(Buffers())

    func insert(_ name: [UInt8]) {
        let key = name.hashValue
        buffers.withLock { buffers in
            let bucket = buffers.byHash[key, default: []]
            guard !bucket.contains(where: { $0.elementsEqual(name) }) else { return }
            let copy = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: name.count)
            _ = copy.initialize(from: name)
            buffers.byHash[key] = bucket + [copy]
        }
    }

    /// Calls `body` with every name (lent for the call only).
    func forEach(_ body: (Span<UInt8>) -> Void) {
        buffers.withLock { buffers in
            for name in buffers.byHash.values.joined() { body(UnsafeBufferPointer(name).span) }
        }
    }

    /// Zeroes and frees every name.
    func forgetAll() {
        buffers.withLock { $0.forgetAll() }
    }
}

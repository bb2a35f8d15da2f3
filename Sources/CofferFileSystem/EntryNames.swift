// EntryNames keeps the plaintext names the kernel may hold in its dentry cache under one
// directory — found, created, renamed or linked there, and the negative entries of names
// looked up and not found or removed — so that a lock can invalidate every one of them.
// The bytes live in buffers of their own, zeroed when the names are forgotten.
import Glibc
import Synchronization

/// Sendable, unchecked: every access to `byHash` is under `lock`; the buffers are owned
/// here and `forEach` lends a name only for its body, under the lock. (The Mutex cannot
/// own them as its value: the lent buffer pointers are not Sendable, and `forEach`'s
/// body would join the Mutex's region — "inout sending parameter cannot be
/// task-isolated". It guards them as a plain lock instead.) A leaf lock.
final class EntryNames: @unchecked Sendable {
    private let lock = Mutex(())
    /// Names by a hash of their bytes (Hasher is seeded per process).
    private var byHash: [Int: [UnsafeMutableBufferPointer<UInt8>]] = [:]

    deinit { forgetAll() }

    func insert(_ name: [UInt8]) {
        let key = name.hashValue
        lock.withLock { _ in
            let bucket = byHash[key, default: []]
            guard !bucket.contains(where: { $0.elementsEqual(name) }) else { return }
            let copy = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: name.count)
            _ = copy.initialize(from: name)
            byHash[key] = bucket + [copy]
        }
    }

    /// Calls `body` with every name (its bytes are valid only during the call).
    func forEach(_ body: (UnsafeBufferPointer<UInt8>) -> Void) {
        lock.withLock { _ in byHash.values.joined().forEach { body(UnsafeBufferPointer($0)) } }
    }

    /// Zeroes and frees every name.
    func forgetAll() {
        lock.withLock { _ in
            for name in byHash.values.joined() {
                if let base = name.baseAddress { explicit_bzero(base, name.count) }
                name.deallocate()
            }
            byHash = [:]
        }
    }
}

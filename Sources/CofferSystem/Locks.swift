// Locks wraps the pthread reader-writer lock for the plaintext view's nodes and the undo
// journal. Plain mutual exclusion is Synchronization.Mutex everywhere; this exists only
// because Synchronization has no reader-writer lock and coffer needs writer preference.
import CLinux
import Glibc

/// A reader-writer lock (pthread_rwlock): many readers or one writer. A waiting writer
/// goes before readers that arrive after it (glibc's default lets a stream of readers
/// starve writers), so readers must never take the same lock twice on one thread.
///
/// Sendable, unchecked: the pthread_rwlock_t lives at a fixed heap address for the
/// object's lifetime (never moved, as pthread requires) and is only touched through
/// pthread calls, which are thread-safe by definition.
public final class ReadWriteLock: @unchecked Sendable {
    private let lock = UnsafeMutablePointer<pthread_rwlock_t>.allocate(capacity: 1)

    public init() {
        var attributes = pthread_rwlockattr_t()
        pthread_rwlockattr_init(&attributes)
        _ = clinux_rwlockattr_prefer_writers(&attributes)
        pthread_rwlock_init(lock, &attributes)
        pthread_rwlockattr_destroy(&attributes)
    }

    deinit {
        pthread_rwlock_destroy(lock)
        lock.deallocate()
    }

    public func reading<R>(_ body: () throws -> R) rethrows -> R {
        pthread_rwlock_rdlock(lock)
        defer { pthread_rwlock_unlock(lock) }
        return try body()
    }

    public func writing<R>(_ body: () throws -> R) rethrows -> R {
        pthread_rwlock_wrlock(lock)
        defer { pthread_rwlock_unlock(lock) }
        return try body()
    }
}

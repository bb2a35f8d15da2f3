// SecureBytes holds a key or a passphrase in sodium_malloc memory: guard pages,
// mlock'ed against swapping, zeroed when wiped or freed.
import CSodium
import Glibc
import Synchronization

/// A fixed-size secret buffer. Its bytes are only ever lent out through closures;
/// nothing in the engine copies them into ordinary Swift arrays or strings.
///
/// Sendable, unchecked: `base` and `count` never change, and the bytes behind them are
/// shared the way a key is: written while one thread owns the object (filled at
/// creation, before it is handed on) and afterwards only read, through `lend`, until
/// `retire` — which the `users` atomic makes wait for every lend in progress and
/// refuse every later one — zeroes them. `withUnsafeMutableBytes` and `wipe` are for
/// the owning thread (creation, or a passphrase used by one request).
public final class SecureBytes: @unchecked Sendable {
    /// Number of bytes in the buffer.
    public let count: Int
    private let base: UnsafeMutableRawPointer
    /// The arena the bytes are a chunk of (`pooled`); nil for a region of their own.
    private let arena: SecureArena?
    /// Number of `lend` calls using the bytes now, plus `retiredBit` once `retire` began.
    private let users = Atomic<Int>(0)
    private static let retiredBit = 1 << 62

    /// A zero-filled secret buffer of `count` bytes (at least one byte is allocated).
    public init(count: Int) {
        precondition(count >= 0)
        Sodium.ensureInitialized()
        guard let pointer = sodium_malloc(Swift.max(count, 1)) else {
            fatalError("sodium_malloc(\(count)) failed: out of locked memory")
        }
        self.count = count
        self.base = pointer
        self.arena = nil
        sodium_memzero(pointer, Swift.max(count, 1))
    }

    /// A zero-filled buffer of `count` bytes (at most `SecureArena.chunkSize`), page
    /// aligned, carved from a sodium_malloc region shared with others: no system call
    /// to make or free it. For keys that come and go with open files (BlockKeySlot).
    public static func pooled(count: Int) -> SecureBytes {
        precondition(count <= SecureArena.chunkSize)
        return SecureBytes(chunk: SecureArena.shared.take(), count: count)
    }

    private init(chunk: UnsafeMutableRawPointer, count: Int) {
        self.count = count
        self.base = chunk
        self.arena = SecureArena.shared
    }

    /// A buffer of `count` random bytes.
    public static func random(count: Int) -> SecureBytes {
        let secret = SecureBytes(count: count)
        secret.withUnsafeMutableBytes { Sodium.randomBytes($0) }
        return secret
    }

    /// A new secret buffer holding the first `length` bytes of this one.
    public func prefix(_ length: Int) -> SecureBytes {
        precondition(length <= count)
        let copy = SecureBytes(count: length)
        if length > 0 { copy.base.copyMemory(from: base, byteCount: length) }
        return copy
    }

    deinit {
        if let arena {
            sodium_memzero(base, count)
            arena.give(base)
        } else {
            // sodium_free zeroes the region before unmapping it.
            sodium_free(base)
        }
    }

    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try body(UnsafeRawBufferPointer(start: base, count: count))
    }

    public func withUnsafeMutableBytes<R>(_ body: (UnsafeMutableRawBufferPointer) throws -> R) rethrows -> R {
        try body(UnsafeMutableRawBufferPointer(start: base, count: count))
    }

    /// Lends the bytes of a key for one computation (no I/O, no waiting inside `body`);
    /// throws `keyRetired` once `retire` has begun, so a key is never used half-wiped.
    public func lend<R>(_ body: (UnsafePointer<UInt8>) throws -> R) throws -> R {
        let before = users.wrappingAdd(1, ordering: .acquiring).oldValue
        defer { users.wrappingSubtract(1, ordering: .releasing) }
        guard before & Self.retiredBit == 0 else { throw CryptoError.keyRetired }
        return try body(bytes)
    }

    /// Zeroes the key for good while other threads may still hold this object: new
    /// `lend` calls throw from now on, and the zeroing waits only for computations
    /// already running (microseconds to milliseconds: `lend` bodies never block).
    public func retire() {
        users.bitwiseOr(Self.retiredBit, ordering: .acquiringAndReleasing)
        while users.load(ordering: .acquiring) & ~Self.retiredBit != 0 { sched_yield() }
        wipe()
    }

    /// True once `retire` has begun: the key is zeroed or about to be.
    public var isRetired: Bool { users.load(ordering: .acquiring) & Self.retiredBit != 0 }

    /// Typed pointer to the first byte, for C calls that take `unsigned char *`.
    var bytes: UnsafeMutablePointer<UInt8> { base.assumingMemoryBound(to: UInt8.self) }

    /// Overwrites every byte with zeros (sodium_memzero: not optimised away).
    public func wipe() { sodium_memzero(base, count) }

    /// True if every byte is zero, checked in constant time (sodium_is_zero).
    public var isAllZero: Bool { count == 0 || sodium_is_zero(bytes, count) == 1 }

    /// Constant-time equality (sodium_memcmp); buffers of different size are unequal.
    public func constantTimeEquals(_ other: SecureBytes) -> Bool {
        count == other.count && (count == 0 || sodium_memcmp(base, other.base, count) == 0)
    }
}

/// Fixed-size chunks of sodium_malloc memory (guard pages, locked, zeroed when given
/// back) for secrets made and dropped often: sodium_malloc and sodium_free cost an mmap,
/// mprotects, an mlock and an munmap each (TLB flushes, which a virtual machine pays
/// dearly: one region per open file made creating 3,000 small files take 1.3–1.5 times
/// as long in scripts/bench). A
/// region of `chunksPerRegion` chunks is made when none is free and kept for the
/// process's life (BlockKeySlot.limit bounds how many are in use).
final class SecureArena: Sendable {
    static let shared = SecureArena()
    /// Bytes per chunk: a page, so that no two keys share one (keys packed 1,088 bytes
    /// apart made streaming reads bimodal, half of them at half speed, in scripts/bench).
    static let chunkSize = 4096
    /// Chunks per region: 16, 64 KiB.
    static let chunksPerRegion = 16

    /// Free chunks, by address; a leaf lock.
    private let free = Mutex<[UInt]>([])

    func take() -> UnsafeMutableRawPointer {
        if let chunk = free.withLock({ $0.popLast() }) { return UnsafeMutableRawPointer(bitPattern: chunk)! }
        let size = Self.chunkSize * Self.chunksPerRegion
        // sodium_malloc ends the region at its guard page: a size that is a multiple of
        // 64 starts it 64-byte aligned.
        guard let region = sodium_malloc(size) else { fatalError("sodium_malloc(\(size)) failed: out of locked memory") }
        sodium_memzero(region, size)
        let chunks = (1..<Self.chunksPerRegion).map { UInt(bitPattern: region + $0 * Self.chunkSize) }
        free.withLock { $0.append(contentsOf: chunks) }
        return region
    }

    /// Takes back a chunk the caller has zeroed.
    func give(_ chunk: UnsafeMutableRawPointer) {
        free.withLock { $0.append(UInt(bitPattern: chunk)) }
    }
}

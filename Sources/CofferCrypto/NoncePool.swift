// NoncePool hands out random nonces from a per-thread buffer that is refilled from the
// CSPRNG (getrandom) 4 KiB at a time, so sealing a block does not cost a system call.
//
// Nonces are public and only have to be unique; bytes from getrandom, handed out once
// each, are. The buffer is per thread and never shared or copied; coffer never forks
// after filling one (the daemon is started with posix_spawn), so no two processes can
// hold the same buffer.
import CSodium
import Glibc

final class NoncePool {
    /// Bytes fetched from the CSPRNG per refill.
    static let capacity = 4096

    private let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: capacity, alignment: 16)
    private var position = capacity

    deinit {
        sodium_memzero(buffer.baseAddress, buffer.count)
        buffer.deallocate()
    }

    private static let pools = PerThread { NoncePool() }

    /// The calling thread's pool.
    static var current: NoncePool { pools.current }

    /// Fills `out` with bytes never handed out before.
    func fill(_ out: UnsafeMutableRawBufferPointer) {
        var done = 0
        while done < out.count {
            if position == Self.capacity {
                Sodium.randomBytes(buffer)
                position = 0
            }
            let n = min(out.count - done, Self.capacity - position)
            (out.baseAddress! + done).copyMemory(from: buffer.baseAddress! + position, byteCount: n)
            // Each byte is used once: wipe it as it leaves the pool.
            sodium_memzero(buffer.baseAddress! + position, n)
            position += n
            done += n
        }
    }
}

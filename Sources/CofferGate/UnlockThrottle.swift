// UnlockThrottle slows down passphrase guessing: after each failed unlock the next
// attempt is refused until a delay has passed, doubling from 1 s up to 5 minutes.
import CofferSystem
import Glibc

public struct UnlockThrottle: Sendable {
    /// Delay after the first failure, in seconds.
    public static let firstDelay = 1.0
    /// Longest delay, in seconds.
    public static let maxDelay = 300.0

    /// Failed attempts since the last successful unlock.
    public private(set) var failures = 0
    private var notBefore = 0.0

    public init() {}

    /// Seconds until an attempt is accepted (0: now).
    public var retryAfter: Double { max(0, notBefore - Sys.monotonicNow()) }

    public mutating func recordFailure() {
        failures += 1
        notBefore = Sys.monotonicNow() + min(Self.maxDelay, Self.firstDelay * pow2(failures - 1))
    }

    public mutating func recordSuccess() {
        failures = 0
        notBefore = 0
    }

    private func pow2(_ n: Int) -> Double { n >= 30 ? Self.maxDelay : Double(1 << n) }
}

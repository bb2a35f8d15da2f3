// SeededRandom makes randomised tests replayable: the seed comes from COFFER_SEED when
// it is set, else from the system, and every failure message names it.
import Foundation

/// SplitMix64 (Steele, Lea, Flood 2014): a small generator whose whole state is the seed.
struct SeededRandom: RandomNumberGenerator {
    let seed: UInt64
    private var state: UInt64

    init(seed: UInt64) {
        self.seed = seed
        state = seed
    }

    /// Seeded from the environment's COFFER_SEED (decimal), or randomly.
    static func fromEnvironment() -> SeededRandom {
        if let text = ProcessInfo.processInfo.environment["COFFER_SEED"], let seed = UInt64(text) {
            return SeededRandom(seed: seed)
        }
        return SeededRandom(seed: UInt64.random(in: 0...UInt64.max))
    }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    mutating func bytes(_ count: Int) -> [UInt8] { (0..<count).map { _ in UInt8.random(in: 0...255, using: &self) } }

    /// What to put in a failure message to replay the run.
    var replay: String { "replay with COFFER_SEED=\(seed)" }
}

// ProcessHardening keeps the daemon's memory out of core dumps and ptrace by other
// processes of the same user (prctl PR_SET_DUMPABLE 0).
import Glibc

enum ProcessHardening {
    /// PR_SET_DUMPABLE from <linux/prctl.h>.
    private static let PR_SET_DUMPABLE: Int32 = 4

    /// prctl is variadic in C, which Swift cannot call directly; its integer arguments
    /// pass in the same registers through this fixed signature on every Linux ABI.
    private typealias Prctl = @convention(c) (Int32, UInt, UInt, UInt, UInt) -> Int32

    static func disableCoreDumps() {
        guard let symbol = dlsym(nil, "prctl") else { return }
        _ = unsafeBitCast(symbol, to: Prctl.self)(PR_SET_DUMPABLE, 0, 0, 0, 0)
    }
}

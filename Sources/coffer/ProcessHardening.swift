// ProcessHardening prepares the daemon's process: its memory stays out of core dumps
// and ptrace by other processes of the same user (prctl PR_SET_DUMPABLE 0), and it may
// hold as many descriptors as the system allows.
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

    /// Every node the kernel holds keeps one O_PATH descriptor: raise the soft limit on
    /// descriptors to the hard limit, so large trees do not run into EMFILE.
    static func raiseDescriptorLimit() {
        var limit = rlimit()
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        guard getrlimit(resource, &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(resource, &limit)
    }
}

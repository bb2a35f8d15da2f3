// ProcessHardening prepares the daemon's process: its memory stays out of core dumps
// and ptrace by other processes of the same user (prctl PR_SET_DUMPABLE 0), and it may
// hold as many descriptors as the system allows.
import CofferSystem
import Foundation
import Glibc

enum ProcessHardening {
    /// prctl(PR_SET_DUMPABLE, 0).
    static func disableCoreDumps() { Sys.setDumpable(false) }

    /// Every node the kernel holds keeps one O_PATH descriptor, so the number of files
    /// the kernel can keep cached is the descriptor limit: raise the soft limit to the
    /// hard one, and as root both to the kernel's maximum (fs.nr_open), so that trees
    /// like a kernel source (80,000 entries) never run into EMFILE.
    static func raiseDescriptorLimit() {
        var limit = rlimit()
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        guard getrlimit(resource, &limit) == 0 else { return }
        if geteuid() == 0, let text = KernelFiles.text("/proc/sys/fs/nr_open"),
           let maximum = rlim_t(text.trimmingCharacters(in: .whitespacesAndNewlines)), maximum > limit.rlim_max {
            var raised = rlimit(rlim_cur: maximum, rlim_max: maximum)
            if setrlimit(resource, &raised) == 0 { return }
        }
        guard limit.rlim_cur < limit.rlim_max else { return }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(resource, &limit)
    }
}

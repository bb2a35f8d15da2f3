// VaultClaim keeps a second daemon off a vault that is already mounted. Two daemons
// would each let the kernel cache names and attributes (for up to a minute) that the
// other one changes, and could give one new file two headers. The claim is an flock
// on CIPHERDIR, held for the daemon's life; the kernel drops it when the daemon ends,
// however it ends.
import CofferSystem
import Glibc

public final class VaultClaim {
    private let fd: Int32

    /// Claims `vault`, waiting up to `patience` seconds for a daemon that is ending (an
    /// unmount returns once the mount is gone, a moment before its daemon exits).
    public init(_ vault: Vault, patience: Double = 2) throws {
        fd = try Sys.open(vault.path, flags: O_RDONLY | O_DIRECTORY)
        var waited = 0.0
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let code = errno
            if code == EWOULDBLOCK && waited < patience {
                usleep(50_000)
                waited += 0.05
                continue
            }
            if code == EINTR { continue }
            Sys.close(fd)
            throw code == EWOULDBLOCK ? VaultError.alreadyMounted(path: vault.path) : Errno(code, "flock")
        }
    }

    deinit { Sys.close(fd) }
}

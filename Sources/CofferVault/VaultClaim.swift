// VaultClaim keeps a second daemon off a vault that is already mounted. Two daemons
// would each let the kernel cache names and attributes (for up to a minute) that the
// other one changes, and could give one new file two headers. The claim is an flock
// on CIPHERDIR, held for the daemon's life; the kernel drops it when the daemon ends,
// however it ends. It is taken on the vault's own directory handle (reopened, so that
// the lock is the claim's and goes with it), never on the path opened again.
import CofferSystem
import Glibc

public final class VaultClaim {
    /// A descriptor of its own (a new open file description: flock belongs to that), of
    /// the directory `vault.root` names; closing it drops the lock.
    private let fd: FileDescriptor

    /// Claims `vault`, waiting up to `patience` seconds for a daemon that is ending (an
    /// unmount returns once the mount is gone, a moment before its daemon exits).
    public init(_ vault: Vault, patience: Double = 2) throws {
        let fd = try vault.root.reopenDirectory(flags: O_RDONLY)
        var waited = 0.0
        while true {
            do {
                try Sys.lockFile(fd.rawValue, LOCK_EX | LOCK_NB)
                break
            } catch let error as Errno where error.code == EWOULDBLOCK {
                guard waited < patience else { throw VaultError.alreadyMounted(path: vault.path) }
                usleep(50_000)
                waited += 0.05
            }
        }
        self.fd = fd
    }
}

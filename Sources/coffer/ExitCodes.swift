// ExitCodes lists every exit status of the coffer command, in one place.
// The table of exit statuses in docs/guide/exit-statuses.md is written by hand;
// ExitStatusTableTests checks that it lists exactly these.
import ArgumentParser

public enum ExitStatus: Int32, CaseIterable, Sendable {
    case ok = 0
    /// An unexpected system error (I/O error, out of memory…); the message says which.
    case failure = 1
    /// Command-line usage error (ArgumentParser's EX_USAGE).
    case usage = 64
    /// CIPHERDIR (or MOUNTPOINT) is missing or not a directory.
    case notADirectory = 10
    /// `init` was given a directory that is not empty (`init --reverse`: one with a view's config).
    case notEmpty = 11
    /// CIPHERDIR has no coffer.conf: not a vault (`mount --reverse`: PLAINDIR has no view's config).
    case notAVault = 12
    /// coffer.conf is malformed or was modified.
    case configDamaged = 13
    /// coffer.conf uses a format version or parameter this build does not support.
    case unsupported = 14
    /// coffer.conf's key-derivation parameters are outside the accepted range.
    case kdfRefused = 15
    /// The vault's content cipher (AES-256-GCM) needs CPU instructions this machine lacks.
    case cipherUnavailable = 16
    /// The passphrase given was empty.
    case emptyPassphrase = 20
    /// The two passphrases typed did not match.
    case passphraseMismatch = 21
    /// Wrong passphrase.
    case wrongPassphrase = 22
    /// Wrong or malformed recovery key.
    case wrongRecoveryKey = 23
    /// The passphrase could not be read (passfile missing, unreadable, too long; no input).
    case passphraseUnreadable = 24
    /// The recovery key could not be written to --recovery-key-out.
    case recoveryKeyUnwritable = 25
    /// MOUNTPOINT does not exist.
    case mountpointMissing = 30
    /// MOUNTPOINT is not a directory.
    case mountpointNotDirectory = 31
    /// MOUNTPOINT is not empty.
    case mountpointNotEmpty = 32
    /// MOUNTPOINT is already a mount point.
    case mountpointBusy = 33
    /// /dev/fuse cannot be opened (no FUSE in this kernel or container).
    case fuseUnavailable = 34
    /// The kernel refused the mount (fusermount3 missing or not setuid, mount limits…).
    case mountFailed = 35
    /// MOUNTPOINT is not a coffer mount (unmount).
    case notMounted = 36
    /// The mount is in use and cannot be unmounted.
    case unmountBusy = 37
    /// The daemon ended before reporting the mount live.
    case daemonDied = 38
    /// The control socket cannot be created (another daemon, unsafe directory) or reached.
    case socketUnavailable = 39
    /// Too many wrong secrets: the daemon asks to wait before the next attempt.
    case retryLater = 26
    /// The vault was wiped: it cannot be unlocked any more.
    case vaultWiped = 27
    /// The daemon refused the request (not the mount's owner, malformed request).
    case requestRefused = 28
    /// Another coffer daemon serves this CIPHERDIR already.
    case alreadyMounted = 29
    /// fsck found damage.
    case damageFound = 40
    /// wipe was not confirmed.
    case notConfirmed = 41
    /// --log-file is a symlink, not a regular file, or in a directory others can write.
    case logFileRefused = 42
    /// The --extpass command could not be started, failed, or was killed.
    case extpassFailed = 43
    /// The vault's state directory (--state-dir or the default) cannot be made, is not
    /// private to the user, or holds an undo journal that is not a regular file.
    case stateDirectoryUnusable = 44
    /// The daemon stayed busy (a flood of connections to its socket) for as long as the
    /// command retried; nothing was done.
    case daemonBusy = 45
    /// mount --transport uring: this kernel does not serve FUSE over io_uring, or this
    /// process may not make a ring.
    case transportUnavailable = 46
    /// wipe: a regular copy of the key slots could not be overwritten (it has other hard
    /// links, is not writable by the user, or an I/O error); each is named. The rest was
    /// destroyed and every daemon locked or ended. keyslot remove: the same for a file
    /// of the removed slot.
    case wipeIncomplete = 47
    /// protect: the vault is locked (or the directory cannot be read); unlock it first.
    case locked = 48
    /// mount --lock-on: logind cannot be reached on the system bus, or refused the
    /// inhibitor or the session list.
    case sessionUnavailable = 49
    /// keyslot remove: the slot is the vault's last way in; add another first.
    case lastWayIn = 50
    /// keyslot remove, passwd --slot: no slot has that label or id.
    case slotNotFound = 51
    /// keyslot add: a slot with that label exists already.
    case slotLabelTaken = 52
    /// keyslot remove, passwd --slot: the label names several slots (added on two
    /// machines at once); give an id.
    case slotAmbiguous = 53
    /// --tpm2, --with-tpm2: no TPM 2.0 here (no /dev/tpmrm0, libtss2 not installed,
    /// COFFER_TPM2_TCTI names nothing that answers), or the TPM refused to make its
    /// storage key.
    case tpm2Unavailable = 54
    /// unlock --tpm2, --with-tpm2: this machine's TPM2 slot is sealed to PCRs whose values
    /// changed since (a firmware, boot loader or kernel update); unlock with a passphrase
    /// and add it again.
    case tpm2PolicyMismatch = 55
    /// unlock --tpm2, --with-tpm2: the vault has no TPM2 slot of this machine (none, or
    /// only other machines').
    case noTPM2Slot = 56
    /// unlock --tpm2, --keyring, --with-tpm2, --with-keyring: the slot key was refused
    /// (the slot was removed or its file modified meanwhile).
    case wrongSlotKey = 57
    /// --keyring, --with-keyring: no desktop keyring to use (no session bus, no Secret
    /// Service on it, no default collection, libsecret not installed), it is locked, or it
    /// refused the item.
    case keyringUnavailable = 58
    /// unlock --keyring, --with-keyring: no keyring slot of the vault has its key in this
    /// user's keyring (none added, removed, or the keyring item deleted).
    case noKeyringSlot = 59
    /// protect: a class change between key domains (format 8) was refused before it began:
    /// a file in the directory has more than one hard link, or was made while locked.
    case classChangeRefused = 60
}

/// An error the command reports with one line on stderr and a distinct exit status.
struct CommandFailure: Error {
    let status: ExitStatus
    let message: String
}

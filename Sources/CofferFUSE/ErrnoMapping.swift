// ErrnoMapping is the one place where an error thrown below the bridge becomes the
// errno the kernel is told, and where it is decided which errors deserve a log line.
import CofferSystem
import CofferVault
import Glibc

public enum ErrnoMapping {
    public static func code(for error: Error) -> Int32 {
        switch error {
        case let error as Errno:
            return error.code
        case let error as VaultError:
            switch error {
            case .nameTooLong: return ENAMETOOLONG
            case .invalidName: return EINVAL
            case .tooLong(.symlinkTarget): return ENAMETOOLONG
            case .tooLong(.xattrName): return ERANGE
            case .tooLong(.xattrValue): return E2BIG
            // Not damage: the file was replaced by another program (PlainFileSystem logs it).
            case .replacedByOtherWriter: return ESTALE
            // Damage of any kind: the data cannot be trusted, so it is not returned.
            default: return EIO
            }
        default:
            return EIO
        }
    }

    /// Whether `error` is an answer a request can expect in normal use, sent without a
    /// log line. The rule:
    /// - An `Errno` is expected when its code is one of `expectedCodes`: the request's
    ///   own mistake, the state of the tree it asks about, the gate (EACCES while
    ///   locked), or a full or read-only backing disk. Any other code (EIO from the
    ///   backing disk, EMFILE/ENFILE/ENOMEM, ESTALE, EFAULT, …) is trouble of the daemon
    ///   or of its backing file system: unexpected.
    /// - A `VaultError` is expected: a name or value that is invalid or too long is the
    ///   request's mistake, and damage is logged by PlainFileSystem where it is found,
    ///   with the file's path (which the bridge does not know); a second line here
    ///   would add nothing.
    /// - Any other error (a `CryptoError` such as a key wiped under an operation that
    ///   outlived a lock's wait, or anything new) is unexpected: it becomes EIO, and the
    ///   log line is the only trace of why.
    public static func isExpected(_ error: Error) -> Bool {
        switch error {
        case let error as Errno: return expectedCodes.contains(error.code)
        case is VaultError: return true
        default: return false
        }
    }

    /// The errno values a POSIX caller meets in normal use of a file system.
    static let expectedCodes: Set<Int32> = [
        ENOENT, EEXIST, ENOTDIR, EISDIR, ENOTEMPTY, ENAMETOOLONG, ELOOP, EXDEV, EMLINK,  // the tree
        EACCES, EPERM, EROFS, ETXTBSY, EBUSY,                                            // permission, state
        EINVAL, EBADF, EOPNOTSUPP, ENOSYS, EAGAIN, EINTR,                                // the request
        ENODATA, ERANGE, E2BIG,                                                          // xattrs
        ENOSPC, EDQUOT, EFBIG,                                                           // space
    ]
}

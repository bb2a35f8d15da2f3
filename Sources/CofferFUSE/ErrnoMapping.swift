// ErrnoMapping is the one place where an error thrown below the bridge becomes the
// errno the kernel is told.
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
            // Damage of any kind: the data cannot be trusted, so it is not returned.
            default: return EIO
            }
        default:
            return EIO
        }
    }
}

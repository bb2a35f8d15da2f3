// ErrnoMapping is the one place where an error thrown below the bridge becomes the
// errno the kernel is told.
import CofferCrypto
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
            case .tooLong(let what): return what.hasPrefix("xattr") ? (what.hasSuffix("value") ? E2BIG : ERANGE) : ENAMETOOLONG
            // Damage of any kind: the data cannot be trusted, so it is not returned.
            case .blockDamaged, .fileTruncated, .fileHeaderDamaged, .nameDamaged, .longNameDamaged,
                 .directoryIVDamaged, .metadataDamaged:
                return EIO
            default:
                return EIO
            }
        case is CryptoError:
            return EIO
        default:
            return EIO
        }
    }
}

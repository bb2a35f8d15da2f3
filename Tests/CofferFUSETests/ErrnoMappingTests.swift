// The bridge's one errno mapping: what the kernel is told for each error below it.
import CofferFUSE
import CofferSystem
import CofferVault
import Glibc
import XCTest

final class ErrnoMappingTests: XCTestCase {
    func testEveryKindOfErrorHasItsErrno() {
        XCTAssertEqual(ErrnoMapping.code(for: Errno(EACCES, "locked")), EACCES)
        XCTAssertEqual(ErrnoMapping.code(for: Errno(ENOENT)), ENOENT)
        XCTAssertEqual(ErrnoMapping.code(for: VaultError.nameTooLong), ENAMETOOLONG)
        XCTAssertEqual(ErrnoMapping.code(for: VaultError.invalidName), EINVAL)
        XCTAssertEqual(ErrnoMapping.code(for: VaultError.tooLong(.symlinkTarget)), ENAMETOOLONG)
        XCTAssertEqual(ErrnoMapping.code(for: VaultError.tooLong(.xattrName)), ERANGE)
        XCTAssertEqual(ErrnoMapping.code(for: VaultError.tooLong(.xattrValue)), E2BIG)
        for damage: VaultError in [.blockDamaged(blockIndex: 3), .nameDamaged(backingName: "x"), .fileTruncated(cipherSize: 5),
                                   .directoryIVDamaged(reason: "missing"), .metadataDamaged(what: "symlink target")] {
            XCTAssertEqual(ErrnoMapping.code(for: damage), EIO, "\(damage)")
        }
        struct Unexpected: Error {}
        XCTAssertEqual(ErrnoMapping.code(for: Unexpected()), EIO)
    }

    /// Answers a request can expect are sent quietly; trouble of the daemon or its disk,
    /// and errors of unknown kinds, get a log line.
    func testOnlyUnexpectedErrorsAreLogged() {
        for code in [ENOENT, EEXIST, EACCES, EPERM, ENOTEMPTY, EINVAL, ENOSPC, ENODATA, ERANGE, EXDEV, EOPNOTSUPP] {
            XCTAssertTrue(ErrnoMapping.isExpected(Errno(code)), "errno \(code)")
        }
        for code in [EIO, EMFILE, ENFILE, ENOMEM, ESTALE, EFAULT] {
            XCTAssertFalse(ErrnoMapping.isExpected(Errno(code)), "errno \(code)")
        }
        // Damage is logged where it is found, with the path; invalid names are the caller's.
        XCTAssertTrue(ErrnoMapping.isExpected(VaultError.blockDamaged(blockIndex: 1)))
        XCTAssertTrue(ErrnoMapping.isExpected(VaultError.nameTooLong))
        struct Unexpected: Error {}
        XCTAssertFalse(ErrnoMapping.isExpected(Unexpected()))
    }
}

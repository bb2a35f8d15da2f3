// The bridge's one errno mapping: what the kernel is told for each error below it.
import CofferFUSE
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
}

// FileSystemTestHelpers holds what the file-system tests share: a PlainFileSystem on a
// new vault in a temp dir, unlocked, driven without FUSE.
import CofferCrypto
@testable import CofferFileSystem
import CofferVault
import Glibc
import TestSupport
import XCTest

class FileSystemTestCase: XCTestCase {
    var dir: TempDirectory!
    var fs: PlainFileSystem!
    var vault: Vault!
    /// The vault's recovery key, to unlock it again after a lock.
    var recovery: SecureBytes!
    var savedUmask: mode_t = 0
    let root = NodeTable.rootID
    let me = PlainFileSystem.Caller(uid: geteuid(), gid: getegid())

    override func setUpWithError() throws {
        dir = TempDirectory()
        // The daemon runs with umask 0: each new entry gets exactly the mode asked for.
        savedUmask = umask(0)
        (vault, recovery) = try Vault.create(at: dir.path, passphrase: secret("p"), kdf: .floor)
        fs = try PlainFileSystem(vault: vault)
        fs.unlock(try vault.unlock(recoveryKey: recovery))
    }

    override func tearDown() {
        fs = nil
        vault = nil
        recovery = nil
        dir = nil
        umask(savedUmask)
    }
}

extension XCTestCase {
    /// `text` as a file name: its UTF-8 bytes.
    func name(_ text: String) -> [UInt8] { Array(text.utf8) }
}

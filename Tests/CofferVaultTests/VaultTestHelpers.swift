// VaultTestHelpers holds what several vault tests share: a vault made in the test's
// directory, a master key's content key as bytes, and whole reads and writes of a file.
import CofferCrypto
@testable import CofferVault
import TestSupport
import XCTest

/// A test case that makes vaults in its temp directory, all under one passphrase.
protocol VaultTestCase: AnyObject {
    var dir: TempDirectory! { get }
    var passphrase: String { get }
}

extension VaultTestCase {
    /// Creates a vault in `path` (the test's directory if nil) under `passphrase` with the
    /// cheapest accepted KDF; returns it and its recovery key.
    func makeVault(in path: String? = nil) throws -> (Vault, SecureBytes) {
        try Vault.create(at: path ?? dir.path, passphrase: secret(passphrase), kdf: .floor)
    }
}

/// The content subkey of `master`, as bytes to compare.
func contentKey(_ master: MasterKey) -> [UInt8] { bytes(master.subkey(.content)) }

/// The whole plaintext of `f`; fails the test if the read returns less than its size.
func readAll(_ f: ContentFile) throws -> [UInt8] {
    let size = Int(try f.plainSize())
    var out = [UInt8](repeating: 0, count: size)
    let n = try out.withUnsafeMutableBytes { try f.read(into: $0, at: 0) }
    XCTAssertEqual(n, size)
    return out
}

/// Writes `bytes` to `f` at `offset`.
func write(_ f: ContentFile, _ bytes: [UInt8], at offset: Int64) throws {
    try bytes.withUnsafeBytes { try f.write($0, at: offset) }
}

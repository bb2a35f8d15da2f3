// WriteSecretLine writes a secret (a recovery key, a passphrase for the daemon) to a
// descriptor without copying it out of secure memory.
import CofferCrypto
import CofferSystem

/// Writes a secret followed by a newline straight from secure memory.
func writeSecretLine(_ secret: SecureBytes, to fd: Int32) throws {
    try secret.withUnsafeBytes { try Sys.send(fd, $0) }
    try [UInt8(ascii: "\n")].withUnsafeBytes { try Sys.send(fd, $0) }
}

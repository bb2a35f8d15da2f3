// SystemdCredential reads the passphrase that systemd hands a unit as the credential
// coffer.passphrase (LoadCredentialEncrypted=, in $CREDENTIALS_DIRECTORY).
import CofferCrypto
import Glibc

enum SystemdCredential {
    /// The credential's name: `LoadCredentialEncrypted=coffer.passphrase:…` in the unit.
    static let passphraseName = "coffer.passphrase"

    /// The credential's first line, or nil when the process was given no such credential.
    static func passphrase() throws -> SecureBytes? {
        guard let value = getenv("CREDENTIALS_DIRECTORY") else { return nil }
        let directory = String(cString: value)
        guard directory.hasPrefix("/") else { return nil }
        let path = directory + "/" + passphraseName
        var st = stat()
        if lstat(path, &st) != 0 && errno == ENOENT { return nil }
        return try PassphraseReader.fromFile(path)
    }
}

// SystemdCredential reads the passphrase that systemd hands a unit as the credential
// coffer.passphrase (LoadCredentialEncrypted=, in $CREDENTIALS_DIRECTORY).
import CofferCrypto
import CofferSystem
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
        do {
            _ = try Sys.stat(path, in: AT_FDCWD)
        } catch let error as Errno where error.code == ENOENT {
            return nil
        } catch {}
        return try PassphraseReader.fromFile(path)
    }
}

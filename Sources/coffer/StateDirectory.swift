// StateDirectory decides where this machine keeps its own state of a vault — the undo
// journal, a crash's record of this machine's writes — outside CIPHERDIR, so that a sync
// engine never carries it to another machine (which must never apply it) and its churn
// never becomes sync traffic or a conflict: /var/lib/coffer/ for root, else
// $XDG_STATE_HOME/coffer/ (~/.local/state/coffer/), one private directory per vault.
import CofferCrypto
import CofferGate
import CofferVault
import Foundation
import Glibc

enum StateDirectory {
    /// The state directory of `vault` (opened at its canonical path `cipherdir`), created
    /// 0700 and verified; `given` (--state-dir) replaces the default. With `create` false
    /// (a look that writes nothing: fsck), nil where it does not exist.
    static func forVault(_ vault: Vault, at cipherdir: String, given: String? = nil, create: Bool = true,
                         environment: [String: String] = ProcessInfo.processInfo.environment) throws -> String? {
        let uid = geteuid()
        if let given {
            guard create || FileManager.default.fileExists(atPath: given) else { return nil }
            try SocketPath.ensurePrivateDirectory(given, uid: uid, purpose: "the vault's state")
            return given
        }
        let base: String
        if uid == 0 {
            base = "/var/lib/coffer"
        } else if let state = environment["XDG_STATE_HOME"], state.hasPrefix("/") {
            base = state + "/coffer"
        } else {
            let home = environment["HOME"] ?? getpwuid(uid).map { String(cString: $0.pointee.pw_dir) } ?? "/nonexistent"
            base = home + "/.local/state/coffer"
        }
        // The parents are made as `mkdir -p` would, private; only coffer's own are checked.
        if !create && !FileManager.default.fileExists(atPath: base) { return nil }
        try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        try SocketPath.ensurePrivateDirectory(base, uid: uid, purpose: "the vault's state")
        let path = base + "/" + name(of: vault, at: cipherdir)
        guard create || FileManager.default.fileExists(atPath: path) else { return nil }
        try SocketPath.ensurePrivateDirectory(path, uid: uid, purpose: "the vault's state")
        return path
    }

    /// The directory's name: the vault's last path component, made safe and short, and
    /// a hash of its KDF salt (random per vault, kept by passwd) and its path, so that
    /// two copies of one vault on this machine never share their state.
    static func name(of vault: Vault, at cipherdir: String) -> String {
        let last = cipherdir.split(separator: "/").last.map(String.init) ?? "root"
        let safe = String(last.unicodeScalars.map {
            $0.isASCII && (CharacterSet.alphanumerics.contains($0) || "._-".unicodeScalars.contains($0)) ? Character($0) : "_"
        }.prefix(24))
        let identity = Array(vault.config.kdf.salt.utf8) + [0] + Array(cipherdir.utf8)
        return safe + "-" + Hash.blake2b256(identity).prefix(8).map { String(format: "%02x", $0) }.joined()
    }
}

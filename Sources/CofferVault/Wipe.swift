// Wipe crypto-erases a vault: every copy of the key slots (the config and any temp copy
// an interrupted passwd left) is overwritten in place with random bytes, synced, and
// removed. Without a slot, no secret can recover the master key, so every file left in
// the backing directory stays unreadable.
import CofferCrypto
import CofferSystem
import Glibc

extension Vault {
    /// Overwrites coffer.conf and its temp copies with random bytes of the same length,
    /// fsyncs and removes them, and syncs the directory. On journaling or copy-on-write
    /// file systems and SSDs old copies of the blocks may survive physically; the key
    /// slots were only ever stored there wrapped, so what survives still needs the
    /// passphrase or recovery key.
    public func wipe() throws {
        try removeStaleConfigCopies()
        try overwriteAndRemove(VaultConfig.fileName)
        try AtomicFile.syncDirectory(root.rawValue)
    }

    /// Destroys the temp copies of the config (AtomicFile's ".coffer.conf.tmp.PID") that
    /// an interrupted passwd left, and the conflict copies a sync engine kept of it
    /// (passwd on two machines): each holds key slots that open with a passphrase.
    public func removeStaleConfigCopies() throws {
        let prefix = AtomicFile.tempPrefix(of: VaultConfig.fileName)
        for name in try Sys.listDirectory(root.rawValue) where name.hasPrefix(prefix) || VaultConfig.isConflictCopy(name) {
            try overwriteAndRemove(name)
        }
    }

    /// Overwrites the regular file `name` twice with random bytes, fsyncing each time, and removes it.
    private func overwriteAndRemove(_ name: String) throws {
        let size: Int
        do {
            let fd = try FileDescriptor.openRegular(name, in: root.rawValue)
            size = Int(try Sys.stat(fd.rawValue).st_size)
        }
        try Sys.chmod(Sys.procPath(root.rawValue) + "/" + name, 0o600)
        let writable = try FileDescriptor.openRegular(name, in: root.rawValue, flags: O_WRONLY)
        for _ in 0..<2 {
            let noise = Sodium.randomArray(count: size)
            try noise.withUnsafeBytes { try Sys.writeFully(writable.rawValue, $0, at: 0) }
            try Sys.fsync(writable.rawValue)
        }
        writable.close()
        try Sys.unlink(name, in: root.rawValue)
    }
}

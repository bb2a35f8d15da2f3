// Wipe crypto-erases a vault: the key slots are overwritten in place with random
// bytes, synced, and the config removed. Without a slot, no secret can recover the
// master key, so every file left in the backing directory stays unreadable.
import CofferCrypto
import Glibc

extension Vault {
    /// Overwrites coffer.conf with random bytes of the same length, fsyncs it, removes
    /// it, and syncs the directory. On journaling or copy-on-write file systems and SSDs
    /// old copies of the blocks may survive physically; the key slots were only ever
    /// stored there wrapped, so what survives still needs the passphrase or recovery key.
    public func wipe() throws {
        let fd = try Sys.openRegular(VaultConfig.fileName, in: rootFD)
        let size = Int(try Sys.stat(fd).st_size)
        Sys.close(fd)
        try retryOnInterrupt("chmod") { chmod("/proc/self/fd/\(rootFD)/\(VaultConfig.fileName)", 0o600) }
        let writable = try Sys.openRegular(VaultConfig.fileName, in: rootFD, flags: O_WRONLY)
        defer { Sys.close(writable) }
        for _ in 0..<2 {
            let noise = Sodium.randomArray(count: size)
            try noise.withUnsafeBytes { try Sys.writeFully(writable, $0, at: 0) }
            try Sys.fsync(writable)
        }
        try Sys.unlink(VaultConfig.fileName, in: rootFD)
        try AtomicFile.syncDirectory(rootFD)
    }
}

// DirectoryIV is the random 16-byte IV file in every backing directory; it makes the
// same plaintext name encrypt differently in different directories.
import CofferCrypto
import CofferSystem
import Glibc

public enum DirectoryIV {
    /// Name of the IV file in each backing directory.
    public static let fileName = "coffer.diriv"
    /// Prefix of a backing directory on its way in (mkdir) or out (rmdir).
    public static let temporaryPrefix = ".coffer.dir."

    /// A name for a backing directory on its way in or out: it starts with '.', so
    /// listings pass over it, and `coffer fsck --repair` removes one that a crash left.
    public static func temporaryName() -> String {
        temporaryPrefix + Sodium.randomArray(count: 8).map { String(format: "%02x", $0) }.joined()
    }

    /// Creates the IV file of a new, empty backing directory. With `durable: false` it is
    /// not fsynced, so that mkdir does not pay an fsync (the mount syncs it before a file
    /// below is made durable: PlainFileSystem.makeAncestorsDurable), but its bytes are
    /// written out to the disk before this returns: the directory is renamed into place
    /// afterwards, and a journaling file system makes that rename durable (on any fsync
    /// of anything on the disk) only with the IV file's earlier allocation and size, so
    /// a power cut never leaves the directory's entry without its IV (issue 19, item 2).
    @discardableResult
    public static func create(in dir: Int32, durable: Bool = true) throws -> [UInt8] {
        let iv = Sodium.randomArray(count: NameCipher.ivSize)
        try write(iv, in: dir, durable: durable)
        return iv
    }

    /// fsyncs the IV file of `dir`.
    public static func sync(in dir: Int32) throws {
        let fd = try FileDescriptor.openRegular(fileName, in: dir)
        try Sys.fsync(fd.rawValue)
    }

    /// Writes `iv` as the IV file of `dir` (which must not have one).
    static func write(_ iv: [UInt8], in dir: Int32, durable: Bool = true) throws {
        let fd = try FileDescriptor.open(fileName, in: dir, flags: O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode: 0o400)
        do {
            try iv.withUnsafeBytes { try Sys.writeFully(fd.rawValue, $0, at: 0) }
            if durable { try Sys.fsync(fd.rawValue) } else { try Sys.writeOut(fd.rawValue) }
        } catch {
            try? Sys.unlink(fileName, in: dir)
            throw error
        }
    }

    /// Whether backing entry `name` is a sync engine's conflict copy of the IV file: the
    /// directory was made on two machines, and the names each made are encrypted under
    /// its own IV (FORMAT.md §5).
    public static func isConflictCopy(_ name: String) -> Bool { ConflictName.isCopy(name, of: fileName) }

    /// The IVs of the conflict copies of `dir`'s IV file, by name (one listing of `dir`).
    /// A copy that is not a valid IV is left out.
    public static func alternates(in dir: Int32) throws -> [(name: String, iv: [UInt8])] {
        try Sys.listDirectory(dir).filter(isConflictCopy).sorted().compactMap { name in
            (try? read(name, in: dir)).map { (name, $0) }
        }
    }

    /// Reads the IV of the backing directory `dir`.
    public static func read(in dir: Int32) throws -> [UInt8] { try read(fileName, in: dir) }

    private static func read(_ fileName: String, in dir: Int32) throws -> [UInt8] {
        let bytes: [UInt8]
        do {
            bytes = try Sys.readFile(fileName, in: dir, limit: 64)
        } catch let error as Errno where error.code == ENOENT {
            throw VaultError.directoryIVDamaged(reason: "\(fileName) is missing")
        } catch let error as Errno where error.code == EINVAL {
            throw VaultError.directoryIVDamaged(reason: "\(fileName) is not a regular file")
        } catch let error as Errno where error.code == ELOOP {
            throw VaultError.directoryIVDamaged(reason: "\(fileName) is a symlink")
        }
        guard bytes.count == NameCipher.ivSize else {
            throw VaultError.directoryIVDamaged(reason: "\(fileName) has \(bytes.count) bytes instead of \(NameCipher.ivSize)")
        }
        return bytes
    }

    /// The entries of backing directory `fd` that an empty plaintext directory may hold
    /// (its IV file and conflict copies of it, orphan long-name sidecars), or nil if it
    /// holds anything else.
    public static func leftovers(in fd: Int32) throws -> [String]? {
        let entries = try Sys.listDirectory(fd)
        let orphans = NameTransform.orphanSidecars(entries)
        guard entries.allSatisfy({ $0 == fileName || isConflictCopy($0) || orphans.contains($0) }) else { return nil }
        return entries
    }

    /// Removes backing directory `name` of `dir` with its IV file and orphan sidecars,
    /// which must be all it holds (ENOTEMPTY otherwise).
    public static func removeEmptyDirectory(_ name: String, in dir: Int32) throws {
        let fd = try FileDescriptor.open(name, in: dir, flags: O_PATH | O_DIRECTORY | O_NOFOLLOW)
        guard let entries = try leftovers(in: fd.rawValue) else { throw Errno(ENOTEMPTY, "rmdir") }
        // A directory its owner made read-only (mkdir -m 555) still has to lose its IV.
        let st = try Sys.stat(fd.rawValue)
        if st.st_mode & 0o200 == 0 { _ = chmod(Sys.procPath(fd.rawValue), (st.st_mode & 0o7777) | 0o200) }
        for entry in entries { try Sys.unlink(entry, in: fd.rawValue) }
        try Sys.unlink(name, in: dir, directory: true)
    }
}

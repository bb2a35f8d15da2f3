// DirectoryIV is the IV file in every backing directory: a random 16-byte IV that makes
// the same plaintext name encrypt differently in different directories, and from format
// 5 on the tags that bind it to its directory's place (FORMAT.md §5), so that an IV file
// copied into another directory, or a directory's contents moved under another name, is
// refused.
import CofferCrypto
import CofferSystem
import Glibc

public enum DirectoryIV {
    /// Name of the IV file in each backing directory.
    public static let fileName = "coffer.diriv"
    /// Prefix of a backing directory on its way in (mkdir) or out (rmdir).
    public static let temporaryPrefix = ".coffer.dir."
    /// Seconds since its last change during which a directory without its IV file is
    /// taken to be arriving from a sync engine rather than damaged. Syncthing makes a
    /// directory before it pulls the files in it, the IV file among them, in any order;
    /// each file it adds changes the directory, so a directory still being filled stays
    /// young. One that has not changed for a minute and still has no IV file is damaged.
    /// (The environment variable COFFER_ARRIVAL_WINDOW sets other seconds, for tests: a
    /// directory's change time cannot be set back.)
    public static let arrivalWindow: Int = getenv("COFFER_ARRIVAL_WINDOW").flatMap { Int(String(cString: $0)) } ?? 60

    /// An IV file as read: the IV, and from format 5 its tags — the tag of its place and
    /// the tag of the place it had before its last rename (zeros for a directory never
    /// renamed), either of which may fit (a crash may keep a rename and not the write of
    /// the new tag before it, or the reverse).
    public struct Record: Equatable, Sendable {
        public let iv: [UInt8]
        /// Empty up to format 4.
        public let tags: [[UInt8]]

        init(_ bytes: [UInt8]) {
            iv = Array(bytes[..<NameCipher.ivSize])
            tags = stride(from: NameCipher.ivSize, to: bytes.count, by: PlaceMAC.tagSize).map {
                Array(bytes[$0..<$0 + PlaceMAC.tagSize])
            }
        }
    }

    /// Bytes of an IV file: the IV alone up to format 4; from format 5 (`bound`) the IV,
    /// the tag of its place and the tag of its previous place (16 + 16 + 16).
    public static func fileSize(bound: Bool) -> Int { NameCipher.ivSize + (bound ? 2 * PlaceMAC.tagSize : 0) }

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
    /// `tag` (format 5 on) gives the tag of the new IV at the directory's place.
    @discardableResult
    /// `iv`: the IV to give it (a directory made while locked: derived from its dropped
    /// name, so that every machine converting it writes the same file), else random.
    public static func create(in dir: Int32, durable: Bool = true, iv given: [UInt8]? = nil,
                              tag: (([UInt8]) throws -> [UInt8])? = nil) throws -> [UInt8] {
        let iv = given ?? Sodium.randomArray(count: NameCipher.ivSize)
        let tags = try tag.map { try $0(iv) + [UInt8](repeating: 0, count: PlaceMAC.tagSize) } ?? []
        try write(iv + tags, in: dir, durable: durable)
        return iv
    }

    /// Rebinds IV file `fileName` (the IV file or a conflict copy of it) of `dir`, whose
    /// content is `record` (format 5), to `tag`: writes `tag` ‖ its present tag in place
    /// and waits until the bytes are on the disk, before the caller's rename of the
    /// directory (so a power cut that keeps the rename keeps the new tag; one that does
    /// not leaves the old tag, which still fits). An IV file is mode 0400: made writable
    /// for the write.
    public static func rebind(_ fileName: String = fileName, in dir: Int32, record: Record, to tag: [UInt8]) throws {
        precondition(record.tags.count == 2 && tag.count == PlaceMAC.tagSize)
        let path = try FileDescriptor.open(fileName, in: dir, flags: O_PATH | O_NOFOLLOW)
        let st = try Sys.stat(path.rawValue)
        guard st.st_mode & S_IFMT == S_IFREG else { throw VaultError.directoryIVDamaged(reason: "\(fileName) is not a regular file") }
        let bytes = tag + record.tags[0]
        try path.withReopened(flags: O_WRONLY, owner: st) { fd in
            try bytes.withUnsafeBytes { try Sys.writeFully(fd, $0, at: Int64(NameCipher.ivSize)) }
            try Sys.writeOut(fd)
        }
    }

    /// fsyncs the IV file of `dir`. A directory made while locked (format 6) has none
    /// until its conversion: it is fsynced itself.
    public static func sync(in dir: Int32) throws {
        do {
            let fd = try FileDescriptor.openRegular(fileName, in: dir)
            try Sys.fsync(fd.rawValue)
        } catch let error as Errno where error.code == ENOENT {
            guard let path = try? Sys.readlink(Sys.procPath(dir), in: AT_FDCWD),
                  DropName.isDrop(String(path.split(separator: "/").last ?? "")) else { throw error }
            try AtomicFile.syncDirectory(dir)
        }
    }

    /// Writes `bytes` as the IV file of `dir` (which must not have one).
    static func write(_ bytes: [UInt8], in dir: Int32, durable: Bool = true) throws {
        let fd = try FileDescriptor.open(fileName, in: dir, flags: O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode: 0o400)
        do {
            try bytes.withUnsafeBytes { try Sys.writeFully(fd.rawValue, $0, at: 0) }
            if durable { try Sys.fsync(fd.rawValue) } else { try Sys.writeOut(fd.rawValue) }
        } catch {
            try? Sys.unlink(fileName, in: dir)
            throw error
        }
    }

    /// Whether backing directory `dir` is arriving: it has no IV file, or one still being
    /// written (shorter than an IV file is), and it changed within `arrivalWindow`
    /// seconds (the sync engine that made it is still filling it). Coffer never makes a
    /// directory without its IV (mkdir renames it into place with its IV file in it), so
    /// only another program's directory can be arriving.
    public static func isArriving(_ dir: Int32) -> Bool {
        let file = try? Sys.stat(fileName, in: dir)
        if let file, file.st_mode & S_IFMT != S_IFREG || file.st_size >= fileSize(bound: false) { return false }
        guard let st = try? Sys.stat(dir) else { return false }
        let changed = max(st.st_mtim.tv_sec, st.st_ctim.tv_sec, file?.st_mtim.tv_sec ?? 0)
        return time(nil) - changed < arrivalWindow
    }

    /// Whether backing entry `name` is a sync engine's conflict copy of the IV file: the
    /// directory was made on two machines, and the names each made are encrypted under
    /// its own IV (FORMAT.md §5). coffer's own kept copy (`keptCopyName`) counts as one.
    public static func isConflictCopy(_ name: String) -> Bool { name == keptCopyName || ConflictName.isCopy(name, of: fileName) }

    /// The copy coffer keeps of the IV file it gives a directory that is still arriving
    /// (`isArriving`) when an entry is made in it. An engine that keeps one side of a
    /// conflict may then replace coffer's IV file with the one the directory arrives with,
    /// instead of keeping both: the names made here stay readable under this copy, which
    /// serves as an alternate IV like an engine's conflict copy until the directory
    /// settles on one IV. While it holds the directory's own IV it stands for nothing.
    public static let keptCopyName = "coffer.kept.diriv"

    /// Keeps a copy of `dir`'s IV file under `keptCopyName` (synced), if there is none.
    public static func keepCopy(in dir: Int32) throws {
        guard (try? Sys.stat(keptCopyName, in: dir)) == nil else { return }
        let bytes = try Sys.readFile(fileName, in: dir, limit: 64)
        let fd = try FileDescriptor.open(keptCopyName, in: dir, flags: O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode: 0o400)
        do {
            try bytes.withUnsafeBytes { try Sys.writeFully(fd.rawValue, $0, at: 0) }
            try Sys.fsync(fd.rawValue)
        } catch {
            try? Sys.unlink(keptCopyName, in: dir)
            throw error
        }
    }

    /// The conflict copies of `dir`'s IV file, by name (one listing of `dir`). A copy
    /// that is not a valid IV file is left out; whether one was made for this directory
    /// is the caller's to check (`DirectoryBinding`).
    public static func alternates(in dir: Int32, bound: Bool) throws -> [(name: String, record: Record)] {
        try Sys.listDirectory(dir).filter(isConflictCopy).sorted().compactMap { name in
            (try? read(name, in: dir, bound: bound)).map { (name, $0) }
        }
    }

    /// Reads the IV file of the backing directory `dir` (`bound`: a format-5 vault's).
    public static func read(in dir: Int32, bound: Bool) throws -> Record { try read(fileName, in: dir, bound: bound) }

    /// Reads IV file `fileName` (the IV file or a conflict copy of it) of `dir`.
    public static func read(_ fileName: String, in dir: Int32, bound: Bool) throws -> Record {
        let bytes: [UInt8]
        do {
            bytes = try Sys.readFile(fileName, in: dir, limit: 64)
        } catch let error as Errno where error.code == ENOENT {
            throw VaultError.directoryIVDamaged(reason: "\(fileName) is missing")
        } catch let error as Errno where error.code == EINVAL {
            throw VaultError.directoryIVDamaged(reason: "\(fileName) is not a regular file")
        } catch let error as Errno where error.code == ELOOP {
            throw VaultError.directoryIVDamaged(reason: "\(fileName) is a symlink")
        } catch let error as Errno where error.code == EFBIG {
            throw VaultError.directoryIVDamaged(reason: "\(fileName) is larger than an IV file")
        }
        guard bytes.count == fileSize(bound: bound) else {
            throw VaultError.directoryIVDamaged(reason: "\(fileName) has \(bytes.count) bytes instead of \(fileSize(bound: bound))")
        }
        return Record(bytes)
    }

    /// The entries of backing directory `fd` that an empty plaintext directory may hold
    /// (its IV file and class file and conflict copies of them, orphan long-name
    /// sidecars), or nil if it holds anything else.
    public static func leftovers(in fd: Int32) throws -> [String]? {
        let entries = try Sys.listDirectory(fd)
        let orphans = NameTransform.orphanSidecars(entries)
        guard entries.allSatisfy({
            $0 == fileName || isConflictCopy($0) || $0 == ProtectionClass.fileName || ProtectionClass.isConflictCopy($0)
                || orphans.contains($0)
        }) else { return nil }
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

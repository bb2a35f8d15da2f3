// Wipe crypto-erases a vault: every copy of the key slots (the config, a temp copy an
// interrupted passwd left, a conflict copy a sync engine kept, every file in coffer.slots)
// is overwritten in place with random bytes, synced, and removed. Without a slot, no secret can recover the master
// key, so every file left in the backing directory stays unreadable. CIPHERDIR may have
// other writers (a sync peer, another user of a shared vault): each name is opened once
// without following it (O_PATH | O_NOFOLLOW) and everything after goes through that
// descriptor; anything odd under such a name is reported, never a reason to stop.
import CofferCrypto
import CofferSystem
import Glibc

/// What a wipe, or passwd's clean-up of stale copies, did with each name that can hold
/// key slots.
public struct KeySlotReport: Sendable {
    public struct Entry: Sendable, CustomStringConvertible {
        public let name: String
        public let what: String
        public var description: String { "\(name): \(what)" }
    }

    /// Regular files overwritten twice, synced and removed.
    public var destroyed: [String] = []
    /// Entries that are not regular files (a directory, FIFO or symlink another writer
    /// made): coffer never reads a key slot from one, so they are left as they are.
    public var leftAlone: [Entry] = []
    /// Regular files whose bytes could not be destroyed: another hard link (whose other
    /// names are beyond the wipe), not writable by this user, an I/O error.
    public var notDestroyed: [Entry] = []
}

/// What to do with an entry found under a name that can hold key slots, decided from
/// what fstat says of it alone.
enum KeySlotAction: Equatable {
    /// A regular file with no other name: overwrite, sync, remove.
    case overwrite
    /// Not a regular file: never read as key slots, never followed or opened; left alone.
    case leaveAlone(String)
    /// A regular file with other hard links: overwriting would write into a file that
    /// lives elsewhere too (a planted link to another file); only this name is removed.
    case removeNameOnly(String)

    static func decide(mode: mode_t, links: UInt) -> KeySlotAction {
        let kinds: [mode_t: String] = [S_IFDIR: "a directory", S_IFIFO: "a FIFO", S_IFLNK: "a symlink",
                                       S_IFSOCK: "a socket", S_IFCHR: "a character device", S_IFBLK: "a block device"]
        guard mode & S_IFMT == S_IFREG else {
            return .leaveAlone("\(kinds[mode & S_IFMT] ?? "not a regular file"), not a key slot: left alone")
        }
        guard links == 1 else {
            return .removeNameOnly(
                "a file with \(links - 1) other hard link\(links == 2 ? "" : "s"), which keep\(links == 2 ? "s" : "") its bytes: not overwritten")
        }
        return .overwrite
    }
}

extension Vault {
    /// The most bytes of one file overwritten: a config is at most 64 KiB (VaultConfig
    /// reads no more), so a larger file under a key-slot name holds its slots, if any,
    /// in this much; the rest is not written twice over for nothing.
    static let overwriteLimit = 1 << 20

    /// Overwrites coffer.conf and every copy of it (temp and conflict copies) with random
    /// bytes, fsyncs and removes them, and syncs the directory. On journaling or
    /// copy-on-write file systems and SSDs old copies of the blocks may survive
    /// physically; the key slots were only ever stored there wrapped, so what survives
    /// still needs the passphrase or recovery key.
    public func wipe() throws -> KeySlotReport {
        try Vault.destroyKeySlots(in: root.rawValue, includingConfig: true)
    }

    /// Destroys the temp copies of the config (AtomicFile's ".coffer.conf.tmp.…") that an
    /// interrupted passwd left, and the conflict copies a sync engine kept of it (passwd
    /// on two machines): each holds key slots that open with a passphrase.
    public func removeStaleConfigCopies() throws -> KeySlotReport {
        try Vault.destroyKeySlots(in: root.rawValue, includingConfig: false)
    }

    /// The wipe of directory `dir` (a descriptor of it), also where its config cannot be
    /// read (damaged, or replaced by something else): every regular file under a name
    /// that can hold key slots is destroyed, whatever else is there. The config goes
    /// last: a wipe cut short leaves a vault that a wipe run again finishes, never a
    /// slot file without a config. Throws only when the directory cannot be listed or
    /// synced.
    public static func destroyKeySlots(in dir: Int32, includingConfig: Bool) throws -> KeySlotReport {
        var report = KeySlotReport()
        if includingConfig { destroySlotDirectory(in: dir, into: &report) }
        for name in try Sys.listDirectory(dir).filter(holdsConfigCopy).sorted() + (includingConfig ? [VaultConfig.fileName] : []) {
            destroy(name, in: dir, into: &report)
        }
        try AtomicFile.syncDirectory(dir)
        return report
    }

    /// Whether `name` in a vault's directory is a copy of its config: a temp file of a
    /// config write, or a sync engine's conflict copy.
    static func holdsConfigCopy(_ name: String) -> Bool {
        name.hasPrefix(AtomicFile.tempPrefix(of: VaultConfig.fileName)) || VaultConfig.isConflictCopy(name)
    }

    /// Whether directory `dir` holds anything a wipe destroys: a config, a copy of one,
    /// or coffer.slots.
    public static func holdsKeySlots(_ dir: Int32) -> Bool {
        let entries = (try? Sys.listDirectory(dir)) ?? []
        return entries.contains { $0 == VaultConfig.fileName || $0 == SlotFile.directory || holdsConfigCopy($0) }
    }

    /// Destroys every regular file in coffer.slots (slot files, their conflict copies, the
    /// temp files of an interrupted add or passwd: whatever the name) as `destroy` does,
    /// then removes the directory if it is empty. coffer.slots is opened without following
    /// a symlink; anything else under its name is reported and left alone.
    static func destroySlotDirectory(in root: Int32, into report: inout KeySlotReport) {
        let slots: FileDescriptor
        do {
            slots = try openSlotDirectory(in: root, create: false)
        } catch let error as Errno where error.code == ENOENT {
            return
        } catch let error as Errno where error.code == ELOOP || error.code == ENOTDIR {
            return report.leftAlone.append(.init(name: SlotFile.directory,
                                                 what: "\(error.code == ELOOP ? "a symlink" : "not a directory"), not key slots: left alone"))
        } catch {
            return report.notDestroyed.append(.init(name: SlotFile.directory, what: "cannot be opened (\(error))"))
        }
        let names: [String]
        do {
            names = try Sys.listDirectory(slots.rawValue).sorted()
        } catch {
            return report.notDestroyed.append(.init(name: SlotFile.directory, what: "cannot be listed (\(error))"))
        }
        for name in names {
            destroy(name, in: slots.rawValue, shownAs: SlotFile.directory + "/" + name, into: &report)
        }
        do {
            try AtomicFile.syncDirectory(slots.rawValue)
            try Sys.unlink(SlotFile.directory, in: root, directory: true)
        } catch let error as Errno where error.code == ENOTEMPTY || error.code == EEXIST {
            // What was left alone inside keeps it; each is reported above.
        } catch {
            report.notDestroyed.append(.init(name: SlotFile.directory, what: "its files are destroyed, but it could not be removed (\(error))"))
        }
    }

    /// Destroys the entry `name` of `dir` if it is a regular file of one name; reports it
    /// as `shown` (its path from the vault root; `name` if nil).
    static func destroy(_ name: String, in dir: Int32, shownAs shown: String? = nil, into report: inout KeySlotReport) {
        let shown = shown ?? name
        let entry: FileDescriptor
        do {
            entry = try FileDescriptor.open(name, in: dir, flags: O_PATH | O_NOFOLLOW)
        } catch let error as Errno where error.code == ENOENT {
            return  // gone since the listing
        } catch {
            return report.notDestroyed.append(.init(name: shown, what: "cannot be opened (\(error))"))
        }
        do {
            let found = try Sys.stat(entry.rawValue)
            switch KeySlotAction.decide(mode: found.st_mode, links: UInt(found.st_nlink)) {
            case .leaveAlone(let what):
                report.leftAlone.append(.init(name: shown, what: what))
            case .removeNameOnly(let why):
                report.notDestroyed.append(.init(name: shown, what: why + nameOnly(name, in: dir, naming: found)))
            case .overwrite:
                if let refusal = try overwrite(entry, found: found) {
                    report.notDestroyed.append(.init(name: shown, what: refusal + nameOnly(name, in: dir, naming: found)))
                } else if let kept = removeName(name, in: dir, naming: found) {
                    report.notDestroyed.append(.init(name: shown, what: "overwritten, but \(kept)"))
                } else {
                    report.destroyed.append(shown)
                }
            }
        } catch {
            report.notDestroyed.append(.init(name: shown, what: "could not be overwritten (\(error))" + nameOnly(name, in: dir, naming: nil)))
        }
    }

    /// Removes the name of a file that was not overwritten, and says so for the report.
    private static func nameOnly(_ name: String, in dir: Int32, naming found: stat?) -> String {
        removeName(name, in: dir, naming: found).map { "; \($0)" } ?? "; only its name was removed"
    }

    /// Overwrites the regular file `entry` (an O_PATH descriptor; `found` its fstat) twice
    /// with random bytes, fsyncing each time. Returns why it did not, where that is not an
    /// error: the user may not write it, or it gained a hard link since it was looked at.
    private static func overwrite(_ entry: borrowing FileDescriptor, found: stat) throws -> String? {
        do {
            let file = try openForWriting(entry)
            let opened = try Sys.stat(file.rawValue)
            guard opened.st_dev == found.st_dev, opened.st_ino == found.st_ino, opened.st_nlink == 1 else {
                return "it gained another hard link while being wiped: not overwritten"
            }
            let size = min(Int(opened.st_size), overwriteLimit)
            for _ in 0..<2 {
                let noise = Sodium.randomArray(count: size)
                try noise.withUnsafeBytes { try Sys.writeFully(file.rawValue, $0, at: 0) }
                try Sys.fsync(file.rawValue)
            }
            return nil
        } catch let error as Errno where error.code == EPERM {
            return "not writable by this user (it belongs to uid \(found.st_uid)): not overwritten"
        }
    }

    /// A writable descriptor of the regular file `entry` (an O_PATH descriptor) names. The
    /// owner's own 0400 copy is made writable first, through the descriptor, never a path
    /// (EPERM: not the owner).
    private static func openForWriting(_ entry: borrowing FileDescriptor) throws -> FileDescriptor {
        do {
            return try entry.reopen(flags: O_WRONLY)
        } catch let error as Errno where error.code == EACCES {}
        try Sys.chmod(Sys.procPath(entry.rawValue), 0o600)
        return try entry.reopen(flags: O_WRONLY)
    }

    /// Removes `name` from `dir` if it still names the inode `found` (nil: whatever is
    /// there). Returns why it did not, or nil once it is gone.
    private static func removeName(_ name: String, in dir: Int32, naming found: stat?) -> String? {
        if let found {
            guard let now = try? Sys.stat(name, in: dir) else { return nil }  // gone already
            guard now.st_dev == found.st_dev, now.st_ino == found.st_ino else {
                return "replaced by another entry while being wiped; that one was left alone"
            }
        }
        do {
            try Sys.unlink(name, in: dir)
            return nil
        } catch let error as Errno where error.code == ENOENT {
            return nil
        } catch {
            return "its name could not be removed (\(error))"
        }
    }
}

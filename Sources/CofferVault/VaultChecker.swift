// VaultChecker walks a whole backing directory with the keys and reports every name,
// block, symlink target and xattr that fails authentication — damage — apart from the
// harmless leftovers of a crash (orphan long-name sidecars, temporary directories and
// files, blocks that the undo journal puts back), which it can also remove or repair.
import CofferCrypto
import CofferSystem
import Glibc

public struct VaultProblem: CustomStringConvertible {
    /// Plaintext path of the damaged file, or of the directory holding a damaged name.
    public let path: String
    /// The backing (encrypted) name when the name itself is the problem.
    public let backingName: String?
    public let what: String
    /// A harmless leftover of a crash, not damage.
    public let isLeftover: Bool
    /// A sync engine's conflict copy: no damage, shown under its own name (ConflictName).
    public var isConflict = false
    /// A directory a sync engine is still filling, its IV file not there yet
    /// (DirectoryIV.isArriving): no damage, nothing to repair; check again later.
    public var isArriving = false
    /// Not a problem: a directory's protection class other than `complete` (format 6).
    public var isClass = false
    /// Not a problem: an entry made while locked that no mount has converted yet.
    public var isDropped = false

    /// The line's label: "damaged", "leftover", "conflict", "arriving", "class" or "dropped".
    public var kind: String {
        isDropped ? "dropped" : isClass ? "class" : isArriving ? "arriving" : isConflict ? "conflict" : isLeftover ? "leftover" : "damaged"
    }

    public var description: String {
        backingName.map { "\(path == "/" ? "" : path)/<\($0)>: \(what)" } ?? "\(path): \(what)"
    }
}

public struct VaultCheckSummary {
    public var directories = 0
    public var files = 0
    public var bytes: Int64 = 0
    /// Damage found.
    public var problems = 0
    /// Harmless crash leftovers found (and, with repair, removed or put right).
    public var leftovers = 0
    /// Damage that repair put right (a directory given a new IV), counted apart from
    /// `problems`: nothing of it is left.
    public var repaired = 0
    /// Sync engines' conflict copies found (left as they are).
    public var conflicts = 0
    /// Directories still arriving from a sync engine (not checked).
    public var arriving = 0
    /// Directories of a protection class other than `complete`.
    public var classed = 0
    /// Entries made while locked, not converted yet.
    public var dropped = 0
}

public final class VaultChecker {
    /// The vault checked: held so that its root descriptor stays open while the checker runs.
    private let vault: Vault
    /// The vault's root directory (`vault.root`), where the walk starts.
    private var root: Int32 { vault.root.rawValue }
    /// The vault domain's keys, and from format 8 the after-first-unlock domain's
    /// (docs/FORMAT.md §12); `domain` says which the directory being checked uses.
    private let vaultKeys: KeySet
    private let vaultCodecs: VaultCodecs
    private let afterFirstUnlock: (keys: KeySet, codecs: VaultCodecs)?
    private var domain = KeyDomain.vault
    private var keys: KeySet { domain == .afterFirstUnlock ? afterFirstUnlock!.keys : vaultKeys }
    private var codecs: VaultCodecs { domain == .afterFirstUnlock ? afterFirstUnlock!.codecs : vaultCodecs }
    /// The block layout of the vault's format.
    private let layout: BlockLayout
    /// IV files carry tags binding them to their directories' places (format 5 on).
    private let bindsDirectories: Bool
    /// Files made while locked are bound to their directory and themselves (format 7).
    private let bindsDrops: Bool
    public private(set) var summary = VaultCheckSummary()
    private let report: (VaultProblem) -> Void
    private let progress: (VaultCheckSummary) -> Void
    /// The undo journal's records, if the vault has any; repairing needs it writable.
    private let journal: UndoJournal?
    private let repair: Bool

    /// With `repair`, leftovers are removed or put right (the vault must not be mounted).
    public init(vault: Vault, master: MasterKey, journal: UndoJournal? = nil, repair: Bool = false,
                report: @escaping (VaultProblem) -> Void, progress: @escaping (VaultCheckSummary) -> Void = { _ in }) {
        self.vault = vault
        self.journal = journal
        self.repair = repair
        let long = vault.config.storesLongSymlinkTargets
        vaultKeys = vault.keys(from: master)
        vaultCodecs = VaultCodecs(vaultKeys, longSymlinkTargets: long)
        let afu = vault.config.hasKeyDomains ? vault.keys(from: master, domain: .afterFirstUnlock) : nil
        afterFirstUnlock = afu.map { ($0, VaultCodecs($0, longSymlinkTargets: long)) }
        layout = BlockLayout.of(format: vault.config.format)
        bindsDirectories = vault.config.bindsDirectories
        bindsDrops = vault.config.bindsDrops
        self.report = { problem in report(problem) }
        self.progress = progress
    }

    deinit {
        vaultKeys.wipe()
        afterFirstUnlock?.keys.wipe()
    }

    /// The key domain of backing directory `dir` (format 8): its class's, told by the key
    /// that opens its class record; the vault domain's without one.
    private func domain(of dir: Int32) -> KeyDomain {
        guard let afterFirstUnlock, let record = try? DirectoryIV.read(in: dir, bound: bindsDirectories),
              let found = try? ProtectionClass.read(in: dir, dirIV: record.iv, box: vaultKeys.metadata,
                                                    afterFirstUnlock: afterFirstUnlock.keys.metadata) else { return .vault }
        return found.domain
    }

    /// Whether IV file `record` fits one of `places` under the tags of the directory's
    /// domain, or (a crash in the middle of a class change, format 8) the other's.
    private func fits(_ record: DirectoryIV.Record, places: [Place]) throws -> Bool {
        if try DirectoryBinding.fits(record, places: places, macs: keys.places) { return true }
        guard let afterFirstUnlock else { return false }
        let other = domain == .vault ? afterFirstUnlock.keys.places : vaultKeys.places
        return try DirectoryBinding.fits(record, places: places, macs: other)
    }

    private func problem(_ path: String, _ what: String, backingName: String? = nil) {
        summary.problems += 1
        report(VaultProblem(path: path.isEmpty ? "/" : path, backingName: backingName, what: what, isLeftover: false))
    }

    /// The plaintext directory at the vault root that holds what a repair could not
    /// put back under its name, as e2fsck's does.
    public static let lostAndFound = "lost+found"

    /// Gives `dir`, whose IV is lost, a new one, and moves each of its entries — whose
    /// names were encrypted under the lost IV — to /lost+found as `#INODE` (a long
    /// name's sidecar goes). Their contents are bound to their file IDs, not to their
    /// names, so they read as before. Returns how many were moved.
    /// The entries move first and the new IV comes last (a crash in between leaves the
    /// lost IV, and the next repair goes on), except at the root, which lost+found needs.
    private func giveNewIV(_ dir: Int32, place: Place) throws -> Int {
        let entries = try Sys.readDirectory(dir).filter { !NameTransform.isReserved($0.name) }
        let isRoot = try Sys.stat(dir).st_ino == Sys.stat(root).st_ino
        if isRoot { try replaceIV(in: dir, place: place) }
        let target = try lostAndFoundDirectory()
        let targetIV = try DirectoryIV.read(in: target.rawValue, bound: bindsDirectories).iv
        for entry in entries {
            let name = try codecs.names.backingName(for: Array("#\(entry.ino)".utf8), dirIV: targetIV)
            try NameTransform.writeSidecar(name, in: target.rawValue)
            // Its old place cannot be checked any more (its name was under the lost IV).
            let newPlace = Place(dirIV: targetIV, name: Array("#\(entry.ino)".utf8))
            if entry.type == UInt8(DT_REG) { try bind(entry.name, in: dir, to: newPlace) }
            if entry.type == UInt8(DT_DIR) { try bindDirectory(entry.name, in: dir, to: newPlace) }
            try Sys.rename(entry.name, in: dir, to: name.name, in: target.rawValue, flags: RENAME_NOREPLACE)
            NameTransform.removeSidecar(ofEntry: entry.name, in: dir)
        }
        try AtomicFile.syncDirectory(target.rawValue)
        if !isRoot { try replaceIV(in: dir, place: place) }
        return entries.count
    }

    private func replaceIV(in dir: Int32, place: Place) throws {
        if (try? Sys.stat(DirectoryIV.fileName, in: dir)) != nil { try Sys.unlink(DirectoryIV.fileName, in: dir) }
        try createIV(in: dir, place: place)
        try AtomicFile.syncDirectory(dir)
    }

    /// Makes the IV file of `dir`, bound (format 5) to `place`.
    private func createIV(in dir: Int32, place: Place) throws {
        try DirectoryIV.create(in: dir, tag: bindsDirectories ? DirectoryBinding.tagging(at: place, macs: keys.places) : nil)
    }

    /// The backing directory of /lost+found, made (as mkdir makes one: under a temporary
    /// name, given its IV, renamed into place) if it is not there.
    private func lostAndFoundDirectory() throws -> FileDescriptor {
        let rootIV = try DirectoryIV.read(in: root, bound: bindsDirectories).iv
        let name = try codecs.names.backingName(for: Array(Self.lostAndFound.utf8), dirIV: rootIV).name
        if let existing = try? FileDescriptor.open(name, in: root, flags: O_RDONLY | O_DIRECTORY | O_NOFOLLOW) { return existing }
        let temp = DirectoryIV.temporaryName()
        try Sys.mkdir(temp, in: root, mode: 0o700)
        let fd = try FileDescriptor.open(temp, in: root, flags: O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
        try createIV(in: fd.rawValue, place: Place(dirIV: rootIV, name: Array(Self.lostAndFound.utf8)))
        try Sys.rename(temp, in: root, to: name, in: root, flags: RENAME_NOREPLACE)
        try AtomicFile.syncDirectory(root)
        return fd
    }

    /// Reports a sync engine's conflict copy (never repaired: it is a version of a file).
    private func conflict(_ path: String, _ what: String, backingName: String? = nil) {
        summary.conflicts += 1
        var line = VaultProblem(path: path.isEmpty ? "/" : path, backingName: backingName, what: what, isLeftover: false)
        line.isConflict = true
        report(line)
    }

    /// Reports a harmless leftover; with repair, `fix` removes it first.
    private func leftover(_ path: String, _ what: String, backingName: String? = nil, fix: () throws -> Void) {
        summary.leftovers += 1
        var what = what
        if repair {
            do { try fix(); what += "; repaired" } catch { what += "; repair failed: \(error)" }
        }
        report(VaultProblem(path: path.isEmpty ? "/" : path, backingName: backingName, what: what, isLeftover: true))
    }

    /// Checks everything below the vault root.
    public func run() -> VaultCheckSummary {
        checkDirectory(root, path: "", places: [Place.root])
        checkTargetSidecars()
        checkDropRecords()
        checkSlotFiles()
        return summary
    }

    /// The entries of coffer.slots (§13): a temp file of an interrupted keyslot add or
    /// passwd --slot, or a slot file of an interrupted removal, is a leftover (repair
    /// destroys it as wipe would: it holds a wrapped key); anything else that is not a
    /// slot record is damage. A record of a kind this coffer does not know is not (a newer
    /// coffer's).
    private func checkSlotFiles() {
        guard let slots = try? Vault.openSlotDirectory(in: root, create: false),
              let names = try? Sys.listDirectory(slots.rawValue) else { return }
        for name in names.sorted() where name.hasPrefix(".") {
            let what = SlotFile.isRemovalLeftover(name)
                ? "a slot whose removal was interrupted (it may still hold its wrapped key: --repair destroys it)"
                : "temporary file of an interrupted keyslot add or passwd (harmless)"
            leftover("", what, backingName: SlotFile.directory + "/" + name) {
                var report = KeySlotReport()
                Vault.destroy(name, in: slots.rawValue, shownAs: SlotFile.directory + "/" + name, into: &report)
                if let failed = (report.notDestroyed + report.leftAlone).first { throw SlotFileProblem(failed.what) }
            }
        }
        for entry in Vault.slotEntries(in: root) {
            if case .failure(let problem) = entry.record {
                self.problem("", "not a key slot: \(problem)", backingName: SlotFile.directory + "/" + entry.name)
            }
        }
    }

    /// File IDs of the files whose key is in a key record, seen by the walk.
    private var sealedFiles = Set<String>()
    /// Whether the walk met a directory made while locked (not descended into).
    private var skippedDrops = false

    /// Key records whose file is gone (a crash between making the record and the file,
    /// or a file removed while locked on another machine): leftovers. Only after a walk
    /// that saw every file.
    private func checkDropRecords() {
        guard !skippedDrops else { return }
        for name in DropRecord.recorded(root: root) where !sealedFiles.contains(name) {
            leftover("", "key record of a file that no longer exists (harmless)", backingName: DropRecord.directory + "/" + name) {
                try Sys.unlink(DropRecord.directory + "/" + name, in: self.root)
            }
        }
    }

    /// An entry made while locked (format 6), not converted yet: reported with its name;
    /// a file's content is checked, a directory's is not (it is, once a mount converts it).
    /// What a mount would refuse to convert (`FoundDrop`) is damage. `iv` is the IV of
    /// the directory `dir`, `names` its names' codec.
    private func checkDrop(_ name: String, in dir: Int32, path: String, iv: [UInt8], names: DirectoryNames) {
        guard let drops = keys.drops else { return problem(path, "an entry made while locked in a vault without drops", backingName: name) }
        let shown: [UInt8]
        let binding: [UInt8]?
        do {
            (shown, binding) = try DropName.decode(name, keys: drops, bound: bindsDrops)
        } catch {
            return problem(path, "\(error)", backingName: name)
        }
        summary.dropped += 1
        let childPath = path + "/" + String(decoding: shown, as: UTF8.self)
        guard let st = try? Sys.stat(name, in: dir) else { return }
        // The name a mount's conversion gives it: its own, or "NAME (dropped MARK)" if taken.
        let taken = (try? names.names.backingName(for: shown, dirIV: iv)).map { (try? Sys.stat($0.name, in: dir)) != nil } ?? false
        let place = Place(dirIV: iv, name: taken ? DropName.alternative(shown, mark: FoundDrop.mark(backingName: name)) : shown)
        let refusal: String?
        switch st.st_mode & S_IFMT {
        case S_IFREG: refusal = foundFileRefusal(name, in: dir, place: place, binding: binding, drops: drops)
        case S_IFDIR: refusal = foundDirectoryRefusal(name, in: dir, place: place, binding: binding)
        case S_IFLNK where afterFirstUnlock != nil || vault.config.hasKeyDomains:
            refusal = foundSymlinkRefusal(name, in: dir, iv: iv, binding: binding, drops: drops)
        default:
            refusal = "neither a file nor a directory"
        }
        if let refusal { return problem(childPath, "\(VaultError.dropRefused(reason: refusal))", backingName: name) }
        var line = VaultProblem(path: childPath, backingName: nil,
                                what: "made while locked; a mount makes it an ordinary entry when it lists the directory", isLeftover: false)
        line.isDropped = true
        report(line)
        switch st.st_mode & S_IFMT {
        case S_IFDIR: skippedDrops = true
        case S_IFREG: checkFile(name, in: dir, path: childPath, places: [])
        default: break
        }
    }

    /// Why the symlink under drop name `name` would not be converted (format 8): its
    /// target does not open under the drop key, or its binding is not this directory's
    /// and its sealed target's.
    private func foundSymlinkRefusal(_ name: String, in dir: Int32, iv: [UInt8], binding: [UInt8]?, drops: DropKeys) -> String? {
        guard let sealed = (try? Sys.readlink(name, in: dir)).flatMap(SymlinkDrop.sealed),
              let opened = try? drops.open(sealed, what: "target made while locked") else {
            return "its target is no target sealed to the drop key"
        }
        opened.wipe()
        guard !bindsDrops || binding == DropName.binding(dirIV: iv, id: SymlinkDrop.id(sealed: sealed)) else {
            return "it was made in another directory, or its target replaced"
        }
        return nil
    }

    /// Why the file under drop name `name` would not be converted to `place` (FoundDrop).
    private func foundFileRefusal(_ name: String, in dir: Int32, place: Place, binding: [UInt8]?, drops: DropKeys) -> String? {
        let header: FileHeader
        do {
            let fd = try FileDescriptor.openRegular(name, in: dir)
            header = try ContentFile(fd: fd.rawValue, cipher: keys.content, layout: layout).header()
        } catch {
            return "its header cannot be read (\(error))"
        }
        let tag = (try? keys.places.tag(fileID: header.fileID.bytes, dirIV: place.dirIV, name: place.name)) ?? []
        if bindsDrops {
            return FoundDrop.boundFileRefusal(header, binding: binding, dirIV: place.dirIV, expectedTag: tag, record: {
                (try? DropRecord.readRecord(fileID: header.fileID, root: root, keys: keys)).map { record in
                    record.key.wipe()
                    return record.placed
                }
            })
        }
        return FoundDrop.fileRefusal(header, expectedTag: tag, recordOpens: {
            (try? DropRecord.read(fileID: header.fileID, root: root, keys: keys))?.wipe() != nil
        })
    }

    /// Why the directory under drop name `name` would not be converted to `place`.
    private func foundDirectoryRefusal(_ name: String, in dir: Int32, place: Place, binding: [UInt8]?) -> String? {
        guard let sub = try? FileDescriptor.open(name, in: dir, flags: O_PATH | O_DIRECTORY | O_NOFOLLOW) else {
            return "it cannot be opened"
        }
        if bindsDrops {
            let record = try? DirectoryIV.read(in: sub.rawValue, bound: true)
            let fits = record.map { (try? DirectoryBinding.fits($0, places: [place], macs: keys.places)) == true } ?? false
            return FoundDrop.boundDirectoryRefusal(record, binding: binding, dirIV: place.dirIV, fitsPlace: fits)
        }
        guard (try? Sys.stat(DirectoryIV.fileName, in: sub.rawValue)) != nil else { return nil }
        guard let record = try? DirectoryIV.read(in: sub.rawValue, bound: bindsDirectories) else { return "its IV file is damaged" }
        let fits = (try? DirectoryBinding.fits(record, places: [place], macs: keys.places)) == true
        return FoundDrop.directoryRefusal(record, derivedIV: FoundDrop.directoryIV(backingName: name), fitsPlace: fits)
    }

    /// Long-target sidecars that some symlink named.
    private var namedTargetSidecars = Set<String>()

    /// Sidecars of long symlink targets that no symlink names (left by a crash between
    /// writing one and making the link, or removing the link and the sidecar).
    private func checkTargetSidecars() {
        guard let entries = try? Sys.listDirectory(root) else { return }
        for name in entries where name.hasPrefix(SymlinkCodec.sidecarPrefix) && !namedTargetSidecars.contains(name) {
            leftover("", "orphan symlink-target sidecar (harmless)", backingName: name) { try Sys.unlink(name, in: root) }
        }
    }

    /// `places`: where the directory may stand (its IV file must fit one, format 5).
    private func checkDirectory(_ dir: Int32, path: String, places: [Place]) {
        summary.directories += 1
        let outer = domain
        defer { domain = outer }
        domain = domain(of: dir)
        // A class change between key domains that a crash cut (format 8): its names and
        // its own xattrs are in both domains until a mount finishes it.
        let classRecord = afterFirstUnlock.flatMap { afterFirstUnlock in
            (try? DirectoryIV.read(in: dir, bound: bindsDirectories)).flatMap {
                try? ProtectionClass.readRecord(in: dir, dirIV: $0.iv, box: vaultKeys.metadata, afterFirstUnlock: afterFirstUnlock.keys.metadata)
            }
        }
        if case .converting? = classRecord, let afterFirstUnlock {
            checkXattrs(Sys.procPath(dir), path: path, in: [vaultCodecs, afterFirstUnlock.codecs])
        } else {
            checkXattrs(Sys.procPath(dir), path: path)
        }
        let iv: [UInt8]
        do {
            let record = try DirectoryIV.read(in: dir, bound: bindsDirectories)
            guard try fits(record, places: places) else {
                return problem(path, "\(VaultError.directoryIVMisplaced(DirectoryIV.fileName)); the names in it are not checked")
            }
            iv = record.iv
        } catch {
            if dir != root, DirectoryIV.isArriving(dir) {
                summary.arriving += 1
                var line = VaultProblem(path: path, backingName: nil,
                                        what: "a directory another program is still filling: its IV file has not come yet, "
                                            + "so nothing in it can be checked (check again once the sync is done)",
                                        isLeftover: false)
                line.isArriving = true
                return report(line)
            }
            guard repair else {
                return problem(path, "\(error); names in it cannot be read "
                                   + "(fsck --repair gives it a new IV and moves its entries to /\(Self.lostAndFound))")
            }
            do {
                let moved = try giveNewIV(dir, place: places[0])
                summary.repaired += 1
                report(VaultProblem(path: path.isEmpty ? "/" : path, backingName: nil,
                                    what: "\(error); repaired: a new IV, and its \(moved) entr\(moved == 1 ? "y" : "ies") moved to "
                                        + "/\(Self.lostAndFound) (as #INODE, contents intact)",
                                    isLeftover: false))
            } catch let failure {
                return problem(path, "\(error); repair failed: \(failure)")
            }
            return checkDirectory(dir, path: path, places: places)
        }
        if case .converting(let from, let to)? = classRecord {
            summary.classed += 1
            var line = VaultProblem(path: path.isEmpty ? "/" : path, backingName: nil,
                                    what: "protection class changing from \(from.name) to \(to.name), cut by a crash (or arriving from "
                                        + "another machine): the mount finishes it when the directory is entered; its entries are not "
                                        + "checked until then",
                                    isLeftover: false)
            line.isClass = true
            return report(line)
        }
        let entries: [Sys.DirectoryEntry]
        do { entries = try Sys.readDirectory(dir) } catch { return problem(path, "cannot list: \(error)") }
        let orphans = Set(NameTransform.orphanSidecars(entries.map(\.name)))
        // Conflict copies of the IV file, only those made for this directory (format 5).
        var alternates: [DirectoryNames.Alternate] = []
        var misplaced = Set<String>()
        for copy in (try? DirectoryIV.alternates(in: dir, bound: bindsDirectories)) ?? [] {
            if copy.record.iv == iv && copy.name == DirectoryIV.keptCopyName {
                misplaced.insert(copy.name)  // coffer's kept copy of the IV it gave an arriving directory: nothing to report
            } else if (try? fits(copy.record, places: places)) == true {
                alternates.append(.init(fileName: copy.name, iv: copy.record.iv))
            } else {
                misplaced.insert(copy.name)
                problem(path, "\(VaultError.directoryIVMisplaced(copy.name)); the names encrypted under it are not served", backingName: copy.name)
            }
        }
        checkClass(dir, path: path, iv: iv, entries: entries.map(\.name))
        // Names made on the other machine are under the IV it gave the directory.
        let names = DirectoryNames(codecs.names, own: iv, alternates: alternates)
        for entry in entries {
            if orphans.contains(entry.name) {
                leftover(path, "orphan long-name sidecar, left by a crash (harmless)", backingName: entry.name) {
                    try Sys.unlink(entry.name, in: dir)
                }
                continue
            }
            if entry.name.hasPrefix(DirectoryIV.temporaryPrefix) {
                leftover(path, "temporary directory of an interrupted mkdir or rmdir (harmless)", backingName: entry.name) {
                    try DirectoryIV.removeEmptyDirectory(entry.name, in: dir)
                }
                continue
            }
            if entry.name.hasPrefix(".") && entry.name.contains(".tmp.") && entry.type == UInt8(DT_REG) {
                leftover(path, "temporary file of an interrupted config or journal write (harmless)", backingName: entry.name) {
                    try Sys.unlink(entry.name, in: dir)
                }
                continue
            }
            if DropName.isDrop(entry.name) {
                checkDrop(entry.name, in: dir, path: path, iv: iv, names: names)
                continue
            }
            let name: [UInt8]
            let copy = ConflictName.parse(backingName: entry.name)
            do {
                guard let decoded = try names.decode(entry.name, in: dir)?.name else {
                    if misplaced.contains(entry.name) { continue }
                    if DirectoryIV.isConflictCopy(entry.name) {
                        conflict(path, "the directory was made on two machines: a sync engine's copy of its IV file, "
                                     + "under which the other machine's names are encrypted "
                                     + "(the mount serves both and settles the directory on one IV at its next change)",
                                 backingName: entry.name)
                    } else if let copy {
                        conflict(path, "a sync engine's copy of \(String(decoding: copy.original, as: UTF8.self))", backingName: entry.name)
                    }
                    continue
                }
                name = decoded
            } catch {
                problem(path, "\(error)", backingName: entry.name)
                continue
            }
            let childPath = path + "/" + String(decoding: name, as: UTF8.self)
            let childPlaces = Place.candidates(shownAs: name, ivs: [iv] + alternates.map(\.iv), storedAsCopy: copy != nil)
            if copy != nil { conflict(childPath, "a sync engine's conflict copy, shown under this name") }
            do {
                let st = try Sys.stat(entry.name, in: dir)
                switch st.st_mode & S_IFMT {
                case S_IFDIR:
                    let fd = try FileDescriptor.open(entry.name, in: dir, flags: O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
                    checkDirectory(fd.rawValue, path: childPath, places: childPlaces)
                case S_IFREG:
                    checkFile(entry.name, in: dir, path: childPath, places: childPlaces)
                case S_IFLNK:
                    do {
                        let linkTarget = try Sys.readlink(entry.name, in: dir)
                        if let sidecar = codecs.symlinks.sidecar(of: linkTarget) { namedTargetSidecars.insert(sidecar) }
                        _ = try codecs.symlinks.decrypt(linkTarget, sidecarsIn: root)
                    } catch {
                        problem(childPath, "\(error)")
                    }
                default:
                    break
                }
            } catch {
                problem(childPath, "cannot read: \(error)")
            }
        }
    }

    /// Reports the directory's protection class if it is not `complete`, or its damaged
    /// class record (format 6).
    private func checkClass(_ dir: Int32, path: String, iv: [UInt8], entries: [String]) {
        guard vault.config.hasProtectionClasses else { return }
        do {
            let found = try ProtectionClass.read(in: dir, dirIV: iv, box: vaultKeys.metadata,
                                                 afterFirstUnlock: afterFirstUnlock?.keys.metadata, entries: entries)
            guard found != .complete else { return }
            summary.classed += 1
            var line = VaultProblem(path: path.isEmpty ? "/" : path, backingName: nil,
                                    what: "protection class \(found.name)", isLeftover: false)
            line.isClass = true
            report(line)
        } catch {
            problem(path, "\(error) (the mount takes the directory as complete; `coffer protect` sets its class again)")
        }
    }

    /// Binds the content of backing file `name` of `dir` (format 4) to `place`, whatever
    /// its tag says now (a repair that moves it where its old place cannot be checked).
    private func bind(_ name: String, in dir: Int32, to place: Place) throws {
        guard layout.endsInFinalBlock else { return }
        let fd = try FileDescriptor.openRegular(name, in: dir, flags: O_RDWR)
        let file = ContentFile(fd: fd.rawValue, cipher: keys.content, layout: layout)
        let header = try file.header()
        let tag = try keys.places.tag(fileID: header.fileID.bytes, dirIV: place.dirIV, name: place.name)
        try PlaceBinding.rewrite(file, from: header.placeTag ?? tag, to: tag)
    }

    /// Binds the IV file of backing directory `name` of `dir` (format 5) to `place`,
    /// whatever its tags say now (a repair that moves it where its old place cannot be
    /// checked).
    private func bindDirectory(_ name: String, in dir: Int32, to place: Place) throws {
        guard bindsDirectories else { return }
        let fd = try FileDescriptor.open(name, in: dir, flags: O_PATH | O_DIRECTORY | O_NOFOLLOW)
        let record = try DirectoryIV.read(in: fd.rawValue, bound: true)
        try DirectoryIV.rebind(in: fd.rawValue, record: record,
                               to: keys.places.directoryTag(iv: record.iv, at: place))
    }

    /// From format 4: the content of `file` must belong to one of `places`, and its final
    /// block must open. After a crash, a file whose header never reached the disk (empty)
    /// and a header left stale by a rename are leftovers. False if the file is damaged
    /// (reported).
    private func checkPlace(_ file: ContentFile, path: String, places: [Place]) -> Bool {
        guard layout.endsInFinalBlock else { return true }
        if let journal, journal.foundAtOpen, (try? Sys.stat(file.fd).st_size) == 0, let place = places.first {
            leftover(path, "made just before a crash, which kept none of its content; the mount makes it an empty file") {
                try file.initialize { try self.keys.places.tag(fileID: $0.bytes, dirIV: place.dirIV, name: place.name) }
            }
            return false
        }
        do {
            let header = try file.header()
            if case .xattr(let tag) = try PlaceBinding.check(header, places: places, xattrOf: file.fd,
                                                             macs: keys.places) {
                leftover(path,
                         "its header still names the place it had before a rename (a crash kept the rename, not the header); --repair mends it") {
                    try file.setPlaceTag(tag)
                }
            }
            return true
        } catch {
            problem(path, "\(error)")
            return false
        }
    }

    private func checkFile(_ backingName: String, in dir: Int32, path: String, places: [Place]) {
        summary.files += 1
        let fd: FileDescriptor
        do { fd = try FileDescriptor.openRegular(backingName, in: dir, flags: repair ? O_RDWR : O_RDONLY) } catch {
            return problem(path, "cannot open: \(error)")
        }
        checkXattrs(Sys.procPath(fd.rawValue), path: path)
        // Borrows fd, which lives to the end of this function.
        var file = ContentFile(fd: fd.rawValue, cipher: keys.content, layout: layout)
        if let header = try? file.header(), header.isSealed {
            // Made while locked: its key is in its key record.
            guard keys.drops != nil else { return problem(path, "a file made while locked in a vault without drops") }
            sealedFiles.insert(DropRecord.fileName(header.fileID))
            do {
                let key = try DropRecord.read(fileID: header.fileID, root: root, keys: keys)
                file = ContentFile(fd: fd.rawValue, cipher: .sealedFile(key: key, algorithm: keys.content.algorithm, fileID: header.fileID),
                                   layout: layout)
            } catch {
                return problem(path, "\(error)")
            }
        } else if let header = try? file.header(), let wrap = header.keyWrap {
            // Format 8: its key wrapped in its header, in its directory's domain (or, after a
            // crash in the middle of a move, the other's).
            let boxes = [keys.metadata, domain == .vault ? afterFirstUnlock?.keys.metadata : vaultKeys.metadata].compactMap { $0 }
            guard let key = boxes.lazy.compactMap({ try? FileKeyWrap.unwrap(wrap, fileID: header.fileID.bytes, under: $0) }).first else {
                return problem(path, "its key wrap opens under no key of this vault")
            }
            file = ContentFile(fd: fd.rawValue, cipher: .sealedFile(key: key, algorithm: keys.content.algorithm, fileID: header.fileID),
                               layout: layout)
        }
        guard places.isEmpty || checkPlace(file, path: path, places: places) else { return }
        // Blocks a crash tore that the undo journal puts back are leftovers, not damage.
        var torn: Set<UInt64> = []
        if let journal, journal.hasPending, let id = try? file.fileID() {
            let records = journal.pendingRecords(id)
            if !records.isEmpty, let blocks = try? file.tornBlocks(records, repair: repair) {
                for block in blocks {
                    leftover(path, "block \(block) torn by a crash; the undo journal holds its last version, which the mount puts back") {}
                    if !repair { torn.insert(UInt64(block)) }
                }
            }
        }
        // After a crash, a tail of blocks torn mid-append is a leftover too (cut by repair);
        // the blocks before it are checked as any.
        var tornTail: Int64?
        if let journal, journal.foundAtOpen, let kept = try? file.tornTail(repair: false) {
            leftover(path, "its last blocks, appended after its last fsync, were torn by a crash; the mount cuts them (\(kept) bytes kept)") {
                _ = try file.tornTail(repair: true)
            }
            tornTail = kept
        }
        let size: Int64
        do { size = try tornTail ?? file.plainSize() } catch { return problem(path, "\(error)") }
        // The final block authenticates the length (format 4); one it finds damaged is
        // not named again by the walk below.
        var finalDamaged: UInt64?
        if tornTail == nil {
            do {
                try file.checkFinalBlock()
            } catch VaultError.blockDamaged(let index) {
                finalDamaged = index
                problem(path, "block \(index) failed authentication")
            } catch {
                problem(path, "\(error)")
            }
        }
        // Block by block, so that every damaged block is named, not only the first.
        let chunk = Int(BlockLayout.plainBlockSize)
        var buffer = [UInt8](repeating: 0, count: chunk)
        var offset: Int64 = 0
        while offset < size {
            do {
                _ = try buffer.withUnsafeMutableBytes { try file.read(into: $0, at: offset) }
            } catch is VaultError where torn.contains(UInt64(offset / Int64(chunk))) {
                // Reported above as a leftover.
            } catch VaultError.blockDamaged(let index) where index == finalDamaged {
                // Reported above.
            } catch VaultError.blockDamaged(let index) {
                problem(path, "block \(index) failed authentication")
            } catch {
                problem(path, "\(error)")
                return
            }
            offset += Int64(chunk)
            summary.bytes += Int64(chunk)
            if summary.bytes % (64 << 20) == 0 { progress(summary) }
        }
        progress(summary)
    }

    /// `domains`: the codecs an xattr may be sealed under (nil: the current domain's).
    private func checkXattrs(_ procPath: String, path: String, in domains: [VaultCodecs]? = nil) {
        guard let list = try? Sys.listXattrs(procPath) else { return }
        for backing in list where backing.hasPrefix(XattrCodec.backingPrefix) && backing != PlaceBinding.xattrName {
            guard let codecs = (domains ?? [codecs]).first(where: { $0.xattrs.plaintextName(ofBacking: backing) != nil }) else {
                problem(path, "xattr name failed authentication", backingName: backing)
                continue
            }
            do {
                _ = try codecs.xattrs.openValue(try Sys.getXattr(procPath, backing), backingName: backing)
            } catch {
                problem(path, "value of an xattr failed authentication")
            }
        }
    }
}

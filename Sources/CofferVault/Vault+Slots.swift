// Vault+Slots reads, adds and removes the key slots kept as files in coffer.slots, unlocks
// with a keyed slot's slot key, and re-wraps a passphrase slot (passwd --slot). Adding
// writes one new file; removing destroys the slot's files; neither rewrites coffer.conf
// unless a slot kept there is removed.
import CofferCrypto
import CofferSystem
import Foundation
import Glibc

/// A key slot as `coffer keyslot list` shows it: one kept in coffer.conf or in a file.
public struct KeySlotSummary: Sendable {
    /// "passphrase", "recovery" or what a slot file says.
    public let kind: String
    public let label: String
    /// The slot file's id; nil for the slots kept in coffer.conf.
    public let id: String?
    /// Where it is, from the vault root: coffer.conf or coffer.slots/<name>.
    public let location: String
    /// When it was added (slot files only).
    public let created: String?
    /// Whether this build can use it to unlock (a known kind).
    public let usable: Bool
    /// A tpm2 slot's binding (its machine, its PCRs).
    public let tpm2: SlotFile.TPM2Binding?
}

extension Vault {
    /// The entries of coffer.slots (at most `SlotFile.maxEntries`, by name), each read
    /// without following symlinks or opening anything but a regular file; an empty list
    /// if there is no such directory (or something else under its name).
    public func slotEntries() -> [SlotEntry] { Vault.slotEntries(in: root.rawValue) }

    static func slotEntries(in root: Int32) -> [SlotEntry] {
        guard let dir = try? openSlotDirectory(in: root, create: false),
              let names = try? Sys.listDirectory(dir.rawValue) else { return [] }
        return names.filter { !$0.hasPrefix(".") }.sorted().prefix(SlotFile.maxEntries).map { name in
            do {
                return SlotEntry(name: name, record: .success(try SlotFile.parse(Sys.readFile(name, in: dir.rawValue, limit: SlotFile.sizeLimit))))
            } catch let problem as SlotFileProblem {
                return SlotEntry(name: name, record: .failure(problem))
            } catch {
                return SlotEntry(name: name, record: .failure(SlotFileProblem("cannot be read (\(error))")))
            }
        }
    }

    /// coffer.slots, opened as a directory without following a symlink (O_DIRECTORY also
    /// refuses a FIFO without opening it); made (0700, the root synced) if `create`.
    static func openSlotDirectory(in root: Int32, create: Bool) throws -> FileDescriptor {
        if create {
            do {
                try Sys.mkdir(SlotFile.directory, in: root, mode: 0o700)
                try AtomicFile.syncDirectory(root)
            } catch let error as Errno where error.code == EEXIST {}
        }
        return try FileDescriptor.open(SlotFile.directory, in: root, flags: O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
    }

    /// Every key slot: those of coffer.conf, then the slot files (records that cannot be
    /// read are left out: `slotEntries` names them).
    public func keySlots() -> [KeySlotSummary] {
        let builtIn = config.slots.map {
            KeySlotSummary(kind: $0.kind, label: $0.kind, id: nil, location: VaultConfig.fileName, created: nil,
                           usable: SlotFile.builtInLabels.contains($0.kind), tpm2: nil)
        }
        let files = slotEntries().compactMap { entry -> KeySlotSummary? in
            guard case .success(let record) = entry.record else { return nil }
            return KeySlotSummary(kind: record.kind, label: record.label, id: record.id,
                                  location: SlotFile.directory + "/" + entry.name, created: record.created,
                                  usable: SlotFile.knownKinds.contains(record.kind), tpm2: record.tpm2)
        }
        return builtIn + files
    }

    /// The keyed slots (tpm2, keyring) of `kind`: every record, each slot's own file
    /// (<id>.slot) first, then a sync engine's copies of slots (a copy may hold other
    /// blobs, or have been planted: each is tried in turn, none decides alone).
    public func keyedSlots(kind: String) -> [SlotFile] {
        let records = slotEntries().compactMap { entry -> (own: Bool, record: SlotFile)? in
            guard case .success(let record) = entry.record, record.kind == kind else { return nil }
            return (entry.name == record.id + SlotFile.suffix, record)
        }
        return records.filter(\.own).map(\.record) + records.filter { !$0.own }.map(\.record)
    }

    /// Unwraps the master key with the slot key of the keyed slot `id` (tpm2 or keyring),
    /// which its device gave; throws `wrongSlotKey` if no slot of that id opens with it.
    public func unlock(slotKey: SecureBytes, slot id: String) throws -> MasterKey {
        guard slotKey.count == SlotFile.slotKeySize else { throw VaultError.wrongSlotKey }
        let config = self.config
        for entry in slotEntries() {
            guard case .success(let record) = entry.record, record.id == id, SlotFile.keyedKinds.contains(record.kind),
                  let master = record.unwrap(with: slotKey, config: config) else { continue }
            return master
        }
        throw VaultError.wrongSlotKey
    }

    /// A new slot's id: 16 random bytes in lowercase hex.
    public static func newSlotID() -> String {
        Sodium.randomArray(count: 16).map { String(format: "%02x", $0) }.joined()
    }

    /// Refuses a label a new slot cannot have: malformed, or taken by a slot of this vault.
    public func checkNewLabel(_ label: String) throws {
        if let problem = SlotFile.labelProblem(label) { throw VaultError.invalidSlotLabel(problem) }
        guard !keySlots().contains(where: { $0.label == label }) else { throw VaultError.slotLabelTaken(label) }
    }

    /// Writes `record` as a new file coffer.slots/<id>.slot, atomically, synced with its
    /// directory (made if missing).
    private func writeNewSlot(_ record: SlotFile) throws {
        let dir = try Vault.openSlotDirectory(in: root.rawValue, create: true)
        try AtomicFile.write(record.serialized(), to: SlotFile.fileName(id: record.id), in: dir.rawValue, mode: 0o400)
    }

    /// Adds a keyed slot (`kind` tpm2 with its `tpm2` binding, or keyring) with the id
    /// `id` (from `newSlotID`; the device may already know it) that wraps `master` under
    /// `slotKey`, the random key its device keeps. One new file; nothing else is written.
    @discardableResult
    public func addKeyedSlot(kind: String, id: String, label: String, master: MasterKey, slotKey: SecureBytes,
                             tpm2: SlotFile.TPM2Binding? = nil) throws -> SlotFile {
        try checkNewLabel(label)
        let record = try SlotFile.keyed(kind: kind, id: id, label: label, created: Vault.now(), tpm2: tpm2,
                                        master: master, slotKey: slotKey, config: config)
        try writeNewSlot(record)
        return record
    }

    /// The slot file `selector` (a label or an id) names, or nil for a slot of coffer.conf.
    public func slotFile(_ selector: String) throws -> SlotFile? {
        guard case .file(let id) = try target(of: selector) else { return nil }
        return records(id: id).first
    }

    /// The records of coffer.slots with `id` (a slot and a sync engine's copies of it).
    private func records(id: String) -> [SlotFile] {
        slotEntries().compactMap { entry -> SlotFile? in
            guard case .success(let record) = entry.record, record.id == id else { return nil }
            return record
        }
    }

    /// Adds a passphrase slot labelled `label` that wraps `master` (which the caller got
    /// from an existing way in): a new file coffer.slots/<random id>.slot, written
    /// atomically and synced with its directory. Its Argon2id salt is its own; its costs
    /// are the config's. Nothing else is written.
    @discardableResult
    public func addPassphraseSlot(master: MasterKey, passphrase: SecureBytes, label: String,
                                  derive: KeyDerivation = Vault.deriveInProcess) throws -> SlotFile {
        try checkNewLabel(label)
        let config = self.config
        let salt = Sodium.randomArray(count: PassphraseKDF.saltSize)
        let kdf = VaultConfig.KDF(algorithm: PassphraseKDF.algorithmName, opsLimit: config.kdf.opsLimit,
                                  memLimit: config.kdf.memLimit, salt: Base64URL.encode(salt))
        let kek = try derive(passphrase, salt, kdf.parameters)
        defer { kek.wipe() }
        let record = try SlotFile.passphrase(id: Vault.newSlotID(), label: label, created: Vault.now(), kdf: kdf,
                                             master: master, kek: kek, config: config)
        try writeNewSlot(record)
        return record
    }

    /// What `selector` (a label or an id) names: a slot of coffer.conf, or the id of a
    /// slot file. Throws if it names nothing, or several slot files by one label.
    enum SlotTarget: Equatable {
        case builtIn(String)
        case file(id: String)
    }

    func target(of selector: String) throws -> SlotTarget {
        if SlotFile.builtInLabels.contains(selector) {
            guard config.slots.contains(where: { $0.kind == selector }) else { throw VaultError.slotNotFound(selector) }
            return .builtIn(selector)
        }
        let files = keySlots().filter { $0.id != nil }
        if files.contains(where: { $0.id == selector }) { return .file(id: selector) }
        let ids = Set(files.filter { $0.label == selector }.compactMap(\.id)).sorted()
        guard let id = ids.first else { throw VaultError.slotNotFound(selector) }
        guard ids.count == 1 else { throw VaultError.slotAmbiguous(label: selector, ids: ids) }
        return .file(id: id)
    }

    /// Whether removing `target` leaves the vault a way in this build can use.
    public func leavesAWayIn(removing selector: String) throws -> Bool {
        let target = try target(of: selector)
        let remaining = keySlots().filter { slot in
            guard slot.usable else { return false }
            switch target {
            case .builtIn(let kind): return slot.id != nil || slot.kind != kind
            case .file(let id): return slot.id != id
            }
        }
        return !remaining.isEmpty
    }

    /// Removes the slot `selector` names (a label or an id), refusing to remove the last
    /// way in. A slot of coffer.conf: the config is rewritten without it (atomically) and
    /// the stale copies of the config are destroyed. A slot file: every file of that id
    /// (a sync engine's conflict copies too) is overwritten, synced and removed, as wipe
    /// does. Returns what became of each file.
    @discardableResult
    public func removeSlot(_ selector: String) throws -> KeySlotReport {
        guard try leavesAWayIn(removing: selector) else { throw VaultError.lastWayIn("slot \"\(selector)\"") }
        switch try target(of: selector) {
        case .builtIn(let kind):
            var updated = config
            updated.slots.removeAll { $0.kind == kind }
            let report = try removeStaleConfigCopies()
            try updated.save(in: root.rawValue)
            replaceConfig(updated)
            return report
        case .file(let id):
            return try destroySlotFiles(id: id, keeping: nil)
        }
    }

    /// Destroys every entry of coffer.slots whose record has `id`, but the one named `kept`.
    /// Each leaves the slots' names first (renamed to a removal's name, the directory
    /// synced), so a crash before its overwrite ends leaves a removal's leftover — which
    /// the next removal, `fsck --repair` and a wipe destroy — never a damaged slot.
    private func destroySlotFiles(id: String, keeping kept: String?) throws -> KeySlotReport {
        let dir = try Vault.openSlotDirectory(in: root.rawValue, create: false)
        var report = KeySlotReport()
        for name in (try? Sys.listDirectory(dir.rawValue)) ?? [] where SlotFile.isRemovalLeftover(name) {
            Vault.destroy(name, in: dir.rawValue, shownAs: SlotFile.directory + "/" + name, into: &report)
        }
        for entry in slotEntries() where entry.name != kept {
            guard case .success(let record) = entry.record, record.id == id else { continue }
            let removing = SlotFile.removalName(of: entry.name)
            try Sys.rename(entry.name, in: dir.rawValue, to: removing, in: dir.rawValue, flags: RENAME_NOREPLACE)
            try AtomicFile.syncDirectory(dir.rawValue)
            Vault.destroy(removing, in: dir.rawValue, shownAs: SlotFile.directory + "/" + entry.name, into: &report)
        }
        // A temp file an interrupted write of this slot left (.<id>.slot.tmp.…) holds its
        // wrapped key too.
        let temp = AtomicFile.tempPrefix(of: SlotFile.fileName(id: id))
        for name in (try? Sys.listDirectory(dir.rawValue)) ?? [] where name.hasPrefix(temp) {
            Vault.destroy(name, in: dir.rawValue, shownAs: SlotFile.directory + "/" + name, into: &report)
        }
        try AtomicFile.syncDirectory(dir.rawValue)
        return report
    }

    /// Re-wraps the passphrase slot `selector` names (a label or an id; "passphrase" is
    /// the one in coffer.conf) under `newPassphrase`. A slot file gets a new salt and is
    /// replaced atomically under its own name; its conflict copies are destroyed.
    @discardableResult
    public func changePassphrase(master: MasterKey, newPassphrase: SecureBytes, slot selector: String,
                                 derive: KeyDerivation = Vault.deriveInProcess) throws -> KeySlotReport {
        switch try target(of: selector) {
        case .builtIn(let kind):
            guard kind == VaultConfig.passphraseSlot else { throw VaultError.slotNotFound(selector) }
            return try changePassphrase(master: master, newPassphrase: newPassphrase)
        case .file(let id):
            guard let old = records(id: id).first, old.kind == VaultConfig.passphraseSlot, let oldKDF = old.kdf else {
                throw VaultError.slotNotFound(selector)
            }
            let salt = Sodium.randomArray(count: PassphraseKDF.saltSize)
            var kdf = oldKDF
            kdf.salt = Base64URL.encode(salt)
            let kek = try derive(newPassphrase, salt, kdf.parameters)
            defer { kek.wipe() }
            let record = try SlotFile.passphrase(id: id, label: old.label, created: old.created, kdf: kdf,
                                                 master: master, kek: kek, config: config)
            let dir = try Vault.openSlotDirectory(in: root.rawValue, create: false)
            let name = SlotFile.fileName(id: id)
            try AtomicFile.write(record.serialized(), to: name, in: dir.rawValue, mode: 0o400)
            return try destroySlotFiles(id: id, keeping: name)
        }
    }

    /// The passphrase slot `selector` names (nil: the one of coffer.conf), checked before
    /// any secret is asked: a label or id that names no passphrase slot throws.
    public func passphraseSlotToChange(_ selector: String?) throws -> String {
        let selector = selector ?? VaultConfig.passphraseSlot
        switch try target(of: selector) {
        case .builtIn(let kind) where kind == VaultConfig.passphraseSlot: return selector
        case .file(let id) where keySlots().contains(where: { $0.id == id && $0.kind == VaultConfig.passphraseSlot }): return selector
        default: throw VaultError.slotNotFound(selector)
        }
    }

    /// The time now, ISO 8601 UTC.
    static func now() -> String {
        let formatter = ISO8601DateFormatter()
        formatter.timeZone = TimeZone(identifier: "UTC")
        return formatter.string(from: Date())
    }
}

/// The key-wrapping keys one passphrase gives under each salt and parameters met during
/// one unlock, each derived once; wiped together.
final class PassphraseKeys {
    private let passphrase: SecureBytes
    private let derive: Vault.KeyDerivation
    private var keys: [String: SecureBytes] = [:]

    init(passphrase: SecureBytes, derive: @escaping Vault.KeyDerivation) {
        self.passphrase = passphrase
        self.derive = derive
    }

    /// The key under base64url `salt` and `parameters`, derived on first use.
    func key(salt: String, parameters: KDFParameters) throws -> SecureBytes {
        let index = "\(salt)/\(parameters.opsLimit)/\(parameters.memLimit)"
        if let key = keys[index] { return key }
        let key = try derive(passphrase, try Base64URL.decode(salt), parameters)
        keys[index] = key
        return key
    }

    func wipe() {
        for key in keys.values { key.wipe() }
        keys = [:]
    }
}

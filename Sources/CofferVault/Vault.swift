// Vault is a backing directory, opened once and then reached only through that one
// descriptor: it creates one, opens its config, and unwraps the master key from a key
// slot with a passphrase or the recovery key.
import CofferCrypto
import CofferSystem
import Foundation
import Glibc
import Synchronization

public final class Vault: Sendable {
    /// The backing directory as given by the user: for messages and status only. Nothing
    /// opens it again by name; every part of the vault works through `root`.
    public let path: String
    /// The backing directory, opened once (O_RDONLY | O_DIRECTORY): the claim flocks a
    /// descriptor reopened from it, the file system's root node, the journal, fsck and
    /// wipe reach the directory through it, and `reopened()` rereads the config through
    /// it. If CIPHERDIR is renamed or replaced meanwhile, all of them still agree on the
    /// directory that was opened.
    public let root: FileDescriptor
    /// The config as last read or written; `changePassphrase` replaces it while a
    /// mount's threads may read it, hence the Mutex (a leaf lock).
    private let currentConfig: Mutex<VaultConfig>
    public var config: VaultConfig { currentConfig.withLock { $0 } }

    private init(path: String, root: consuming FileDescriptor, config: VaultConfig) {
        self.path = path
        self.root = root
        self.currentConfig = Mutex(config)
    }

    /// Opens the backing directory `path`: a real descriptor (not O_PATH), so that it can
    /// be flocked, listed and fstatfs'ed as well as used for *at calls.
    static func openDirectory(_ path: String) throws -> FileDescriptor {
        do {
            return try FileDescriptor.open(path, flags: O_RDONLY | O_DIRECTORY)
        } catch let error as Errno where error.code == ENOTDIR || error.code == ENOENT {
            throw VaultError.notADirectory(path: path)
        } catch let error as Errno where error.code == ENAMETOOLONG {
            throw VaultError.pathTooLong(path: path)
        }
    }

    /// Opens an existing vault: reads and checks its config. Needs no secret.
    public static func open(at path: String) throws -> Vault {
        let root = try openDirectory(path)
        let config = try VaultConfig.load(in: root.rawValue, path: path)
        return Vault(path: path, root: root, config: config)
    }

    /// The same backing directory with its config read anew (a passwd or a wipe may have
    /// changed it since): reached through `root`, never through `path`, so it is the
    /// directory this vault was opened on even if CIPHERDIR was renamed or replaced.
    public func reopened() throws -> Vault {
        let root = try self.root.reopenDirectory(flags: O_RDONLY)
        let config = try VaultConfig.load(in: root.rawValue, path: path)
        return Vault(path: path, root: root, config: config)
    }

    /// Throws unless `path` is an empty directory in which a vault can be created, or one
    /// holding only what an interrupted `init` left (`leftByInterruptedInit`).
    public static func checkCreatable(at path: String) throws {
        let root = try openDirectory(path)
        let entries = try Sys.listDirectory(root.rawValue)
        guard entries.isEmpty || leftByInterruptedInit(entries, in: root.rawValue) else { throw VaultError.directoryNotEmpty(path: path) }
    }

    /// Whether `entries` of directory `root` are what an `init` a crash or a kill cut
    /// leaves: the root's IV file, the config's temp files, no config — so no key of it
    /// was ever given out, and nothing was stored under it. Each a regular file no larger
    /// than a config.
    static func leftByInterruptedInit(_ entries: [String], in root: Int32) -> Bool {
        let temp = AtomicFile.tempPrefix(of: VaultConfig.fileName)
        return !entries.isEmpty && entries.allSatisfy { name in
            guard name == DirectoryIV.fileName || name.hasPrefix(temp), let st = try? Sys.stat(name, in: root) else { return false }
            return st.st_mode & S_IFMT == S_IFREG && st.st_size <= 64 << 10
        }
    }

    /// Creates a vault in the empty directory `path`: a new master key wrapped under
    /// `passphrase` (Argon2id with `kdf`) and under a new recovery key, which is returned
    /// and must be shown to the user once.
    /// `cipher` defaults to the fastest this CPU runs; `format` to the oldest that has it.
    public static func create(at path: String, passphrase: SecureBytes, kdf: KDFParameters = .standard,
                              cipher: ContentAlgorithm = .preferred,
                              format: Int? = nil) throws -> (vault: Vault, recoveryKey: SecureBytes) {
        let format = format ?? VaultConfig.defaultFormat(for: cipher)
        precondition(format >= VaultConfig.minimumFormat(for: cipher), "format \(format) has no \(cipher.rawValue)")
        guard cipher.isAvailable else { throw VaultError.cipherUnavailable(cipher.rawValue) }
        let root = try openDirectory(path)
        let entries = try Sys.listDirectory(root.rawValue)
        guard entries.isEmpty || leftByInterruptedInit(entries, in: root.rawValue) else { throw VaultError.directoryNotEmpty(path: path) }
        guard kdf.isAcceptable else {
            throw VaultError.kdfParametersRefused(opsLimit: kdf.opsLimit, memLimit: kdf.memLimit)
        }
        let (config, master, recoveryKey) = try newConfig(format: format, cipher: cipher, kdf: kdf, passphrase: passphrase)
        defer { master.wipe() }
        for name in entries { try Sys.unlink(name, in: root.rawValue) }  // an interrupted init's
        if config.bindsDirectories {
            let placeKey = master.subkey(.place)
            defer { placeKey.wipe() }
            let places = PlaceMAC(key: placeKey)
            try DirectoryIV.create(in: root.rawValue, tag: DirectoryBinding.tagging(at: Place.root, macs: places))
        } else {
            try DirectoryIV.create(in: root.rawValue)
        }
        try config.save(in: root.rawValue)
        return (Vault(path: path, root: root, config: config), recoveryKey)
    }

    /// A new config of `format` and its new master key, wrapped under `passphrase`
    /// (Argon2id with `kdf`) and under a new recovery key, returned with it.
    private static func newConfig(format: Int, cipher: ContentAlgorithm, kdf: KDFParameters,
                                  passphrase: SecureBytes) throws -> (VaultConfig, MasterKey, SecureBytes) {
        let salt = Sodium.randomArray(count: PassphraseKDF.saltSize)
        let formatter = ISO8601DateFormatter()
        formatter.timeZone = TimeZone(identifier: "UTC")
        var config = VaultConfig(
            format: format, created: formatter.string(from: Date()),
            contentCipher: cipher.rawValue, blockSize: ContentCipher.blockSize,
            kdf: .init(algorithm: PassphraseKDF.algorithmName, opsLimit: kdf.opsLimit,
                       memLimit: kdf.memLimit, salt: Base64URL.encode(salt)),
            slots: [], checksum: "")
        config.checksum = config.computedChecksum()

        let master = MasterKey.generate()
        let recoveryKey = SecureBytes.random(count: RecoveryKey.size)
        let passKey = try PassphraseKDF.deriveKey(passphrase: passphrase, salt: salt, parameters: kdf)
        defer { passKey.wipe() }
        let recoveryWrap = RecoveryKey.wrappingKey(recoveryKey)
        defer { recoveryWrap.wipe() }
        config.slots = [
            try wrap(master, with: passKey, kind: VaultConfig.passphraseSlot, config: config),
            try wrap(master, with: recoveryWrap, kind: VaultConfig.recoverySlot, config: config),
        ]
        return (config, master, recoveryKey)
    }

    /// Throws unless a reverse view can be set up for the directory `path`: one without a
    /// view's config.
    public static func checkReverseCreatable(at path: String) throws {
        let root = try openDirectory(path)
        guard (try? Sys.stat(ReverseFormat.configName, in: root.rawValue)) == nil else {
            throw VaultError.reverseConfigExists(path: path)
        }
    }

    /// Creates the config of a reverse view of the directory `path` (docs/FORMAT.md §14):
    /// `ReverseFormat.configName` in it, a format-7 config as `create` makes. Returns the
    /// new recovery key, to be shown once.
    public static func createReverse(at path: String, passphrase: SecureBytes, kdf: KDFParameters = .standard,
                                     cipher: ContentAlgorithm = .preferred) throws -> SecureBytes {
        guard cipher.isAvailable else { throw VaultError.cipherUnavailable(cipher.rawValue) }
        guard kdf.isAcceptable else {
            throw VaultError.kdfParametersRefused(opsLimit: kdf.opsLimit, memLimit: kdf.memLimit)
        }
        try checkReverseCreatable(at: path)
        let root = try openDirectory(path)
        let (config, master, recoveryKey) = try newConfig(format: ReverseFormat.format, cipher: cipher, kdf: kdf, passphrase: passphrase)
        master.wipe()
        try config.save(in: root.rawValue, as: ReverseFormat.configName)
        return recoveryKey
    }

    /// Opens the plaintext directory `path` of a reverse view with its config
    /// (`ReverseFormat.configName`), to unlock as a vault is. Needs no secret.
    public static func openReverse(at path: String) throws -> Vault {
        let root = try openDirectory(path)
        let config: VaultConfig
        do {
            config = try VaultConfig.load(in: root.rawValue, path: path, named: ReverseFormat.configName)
        } catch VaultError.notAVault {
            throw VaultError.notAReverseSource(path: path)
        }
        guard config.format == ReverseFormat.format else { throw VaultError.unsupportedFormat(version: config.format) }
        return Vault(path: path, root: root, config: config)
    }

    static func wrap(_ master: MasterKey, with key: SecureBytes, kind: String, config: VaultConfig,
                     nonce: [UInt8]? = nil) throws -> VaultConfig.KeySlot {
        let box = SealedBox(key: key)
        let ad = config.associatedData(slot: kind)
        let sealed = try master.secret.withUnsafeBytes { bytes in
            try nonce.map { try box.seal(bytes, associatedData: ad, nonce: $0) } ?? box.seal(bytes, associatedData: ad)
        }
        return .init(kind: kind, wrappedKey: Base64URL.encode(sealed))
    }

    private func unwrap(slot kind: String, with key: SecureBytes, of config: VaultConfig? = nil) throws -> MasterKey? {
        let config = config ?? self.config
        let slot = try config.slot(kind)
        guard let sealed = try? Base64URL.decode(slot.wrappedKey) else {
            throw VaultError.configMalformed(reason: "\(kind) slot is not base64url")
        }
        guard let secret = try? SealedBox(key: key).open(sealed, associatedData: config.associatedData(slot: kind),
                                                        what: "\(kind) key slot"),
              secret.count == MasterKey.size else { return nil }
        return MasterKey(secret: secret)
    }

    /// How a passphrase becomes a key-wrapping key: Argon2id, in this process or elsewhere.
    /// Throws unless this CPU runs the vault's content cipher: mount and fsck call it
    /// before they ask for a passphrase.
    public func checkCipherAvailable() throws {
        guard config.contentAlgorithm.isAvailable else { throw VaultError.cipherUnavailable(config.contentCipher) }
    }

    /// The run-time keys of this vault (`checkCipherAvailable` first).
    public func keys(from master: MasterKey) -> KeySet { keys(from: master, domain: .vault) }

    /// The keys of `domain` (format 8, docs/FORMAT.md §12): the after-first-unlock
    /// domain's are derived from subkey 9 and take no drops (files are made while locked
    /// only in unless-open directories, which are the vault domain's).
    public func keys(from master: MasterKey, domain: KeyDomain) -> KeySet {
        switch domain {
        case .vault:
            return KeySet(master: master, content: config.contentAlgorithm, perFileKeys: config.hasPerFileKeys)
        case .afterFirstUnlock:
            let root = master.root(of: .afterFirstUnlock)
            defer { root.wipe() }
            return KeySet(master: root, content: config.contentAlgorithm, perFileKeys: true, drops: false)
        }
    }

    public typealias KeyDerivation = @Sendable (_ passphrase: SecureBytes, _ salt: [UInt8], _ parameters: KDFParameters) throws -> SecureBytes

    /// Argon2id in this process.
    public static let deriveInProcess: KeyDerivation = { try PassphraseKDF.deriveKey(passphrase: $0, salt: $1, parameters: $2) }

    /// Unwraps the master key with the passphrase (runs Argon2id: about a second).
    /// `derive` lets the daemon run Argon2id in a short-lived helper process, so that its
    /// own memory never grows by Argon2id's working area.
    /// A passphrase that opens a conflict copy of the config (`configConflictCopies`)
    /// unlocks too: the passphrase was changed on another machine as well, and each
    /// machine's passphrase keeps working until a `passwd` settles it.
    /// Then the passphrase slot files (coffer.slots), each with its own salt: one Argon2id
    /// run per slot tried, at most `UnlockPlan.maxDerivations` in all, none above the
    /// config's costs (`passphrasePlan`); with `slot` (an id), that slot file alone.
    public func unlock(passphrase: SecureBytes, derive: KeyDerivation = Vault.deriveInProcess, slot: String? = nil) throws -> MasterKey {
        try withoutActuallyEscaping(derive) { derive in
            let keys = PassphraseKeys(passphrase: passphrase, derive: derive)
            defer { keys.wipe() }
            return try unlock(with: keys, plan: passphrasePlan(slot: slot))
        }
    }

    /// Which passphrase slots an unlock tries and which it passes over (UnlockPlan); with
    /// `slot` (an id), that slot file alone.
    public func passphrasePlan(slot: String? = nil) -> UnlockPlan {
        UnlockPlan.passphrase(config: config, copies: slot == nil ? configConflictCopies() : [], entries: slotEntries(), slot: slot)
    }

    private func unlock(with keys: PassphraseKeys, plan: UnlockPlan) throws -> MasterKey {
        let config = self.config
        for attempt in plan.attempts {
            let key = try keys.key(salt: attempt.kdf.salt, parameters: attempt.kdf.parameters)
            switch attempt.source {
            case .config:
                if let master = try unwrap(slot: VaultConfig.passphraseSlot, with: key) { return master }
            case .configCopy(let copy):
                if let master = try? unwrap(slot: VaultConfig.passphraseSlot, with: key, of: copy) { return master }
            case .slotFile(let record):
                if let master = record.unwrap(with: key, config: config) { return master }
            }
        }
        throw VaultError.wrongPassphrase
    }

    /// The copies a sync engine kept of coffer.conf when the passphrase was changed on
    /// two machines before they synced (`coffer.sync-conflict-….conf`, …), by name: only
    /// those that are configs of this vault — the same creation time, format, cipher
    /// and recovery slot (which passwd never changes); anything else is ignored.
    public func configConflictCopies() -> [(name: String, config: VaultConfig)] {
        let config = self.config
        guard let recovery = try? config.slot(VaultConfig.recoverySlot),
              let names = try? Sys.listDirectory(root.rawValue) else { return [] }
        return names.filter(VaultConfig.isConflictCopy).sorted().compactMap { name in
            guard let bytes = try? Sys.readFile(name, in: root.rawValue, limit: 64 << 10),
                  let copy = try? VaultConfig.parse(bytes),
                  copy.created == config.created, copy.format == config.format, copy.contentCipher == config.contentCipher,
                  (try? copy.slot(VaultConfig.recoverySlot))?.wrappedKey == recovery.wrappedKey else { return nil }
            return (name, copy)
        }
    }

    /// Unwraps the master key with the 32-byte recovery key.
    public func unlock(recoveryKey: SecureBytes) throws -> MasterKey {
        let key = RecoveryKey.wrappingKey(recoveryKey)
        defer { key.wipe() }
        guard let master = try unwrap(slot: VaultConfig.recoverySlot, with: key) else { throw VaultError.wrongRecoveryKey }
        return master
    }

    /// Re-wraps the passphrase slot under `newPassphrase` and replaces the config
    /// atomically. Content is not re-encrypted; the recovery slot is kept as it is.
    /// Returns what became of the stale copies of the config (destroyed, or odd entries
    /// under their names, which do not stop it).
    @discardableResult
    public func changePassphrase(master: MasterKey, newPassphrase: SecureBytes) throws -> KeySlotReport {
        let config = self.config
        guard config.slots.contains(where: { $0.kind == VaultConfig.passphraseSlot }) else {
            throw VaultError.slotNotFound(VaultConfig.passphraseSlot)
        }
        let salt = try Base64URL.decode(config.kdf.salt)
        let key = try PassphraseKDF.deriveKey(passphrase: newPassphrase, salt: salt, parameters: config.kdf.parameters)
        defer { key.wipe() }
        var updated = config
        updated.slots = try updated.slots.map {
            try $0.kind == VaultConfig.passphraseSlot
                ? Vault.wrap(master, with: key, kind: VaultConfig.passphraseSlot, config: config) : $0
        }
        // A copy left by an interrupted passwd opens with the passphrase it was made for.
        let report = try removeStaleConfigCopies()
        try updated.save(in: root.rawValue)
        replaceConfig(updated)
        return report
    }

    /// Makes `updated` (just saved) the config this vault reads.
    func replaceConfig(_ updated: VaultConfig) {
        currentConfig.withLock { $0 = updated }
    }
}

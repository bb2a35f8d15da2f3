// UnlockPlan decides which passphrase slots an unlock tries, in which order, and which it
// passes over (docs/FORMAT.md §13, "Reading"). Anything in CIPHERDIR may have been planted:
// a slot file or a copy of the config whose Argon2id costs are above the vault's own is
// tried only when the owner names it (`unlock --slot`), and one unlock makes at most
// `maxDerivations` Argon2id runs, so planted files never cost the owner more than about
// that many runs of the vault's own costs.
import CofferCrypto

public struct UnlockPlan: Sendable {
    /// What one attempt unwraps.
    public enum Source: Sendable {
        /// The passphrase slot of coffer.conf.
        case config
        /// The passphrase slot of a sync engine's copy of coffer.conf.
        case configCopy(VaultConfig)
        /// A passphrase slot file.
        case slotFile(SlotFile)
    }

    public struct Attempt: Sendable {
        /// The entry it comes from (coffer.conf, a copy's name, coffer.slots/NAME).
        public let name: String
        public let source: Source
        public let kdf: VaultConfig.KDF
    }

    /// A slot the unlock passes over, and why (for `keyslot list`, `status` and the log).
    public struct Skipped: Sendable, Equatable {
        public let name: String
        public let reason: String
    }

    public let attempts: [Attempt]
    public let skipped: [Skipped]

    /// Most Argon2id runs (distinct salts and costs) one unlock makes: the config's slot,
    /// and seven slot files or copies — more labelled passphrases than a vault is expected
    /// to have; the rest are named by `keyslot list` and tried with `--slot`.
    public static let maxDerivations = 8

    /// The plan for a passphrase against `config`, its sync copies `copies` (name, config)
    /// and the entries of coffer.slots; with `slot` (an id), that slot file alone, whatever
    /// its costs (within the KDF's ceiling, which parsing enforces).
    public static func passphrase(config: VaultConfig, copies: [(name: String, config: VaultConfig)],
                                  entries: [SlotEntry], slot: String? = nil) -> UnlockPlan {
        var candidates: [Attempt] = []
        var skipped: [Skipped] = []
        let limit = config.kdf.parameters
        func aboveLimit(_ kdf: VaultConfig.KDF) -> Bool {
            kdf.opsLimit > limit.opsLimit || kdf.memLimit > limit.memLimit
        }
        func costs(_ kdf: VaultConfig.KDF) -> String { "\(kdf.opsLimit) passes, \(kdf.memLimit >> 20) MiB" }
        let passphraseSlot = VaultConfig.passphraseSlot
        if slot == nil {
            if config.slots.contains(where: { $0.kind == passphraseSlot }) {
                candidates.append(Attempt(name: VaultConfig.fileName, source: .config, kdf: config.kdf))
            }
            for copy in copies where copy.config.slots.contains(where: { $0.kind == passphraseSlot }) {
                if aboveLimit(copy.config.kdf) {
                    skipped.append(Skipped(name: copy.name,
                                           reason: "its Argon2id costs (\(costs(copy.config.kdf))) are above the vault's (\(costs(config.kdf)))"))
                } else {
                    candidates.append(Attempt(name: copy.name, source: .configCopy(copy.config), kdf: copy.config.kdf))
                }
            }
        }
        // A slot's own file (<id>.slot) before a sync engine's copies of slots.
        let records = entries.compactMap { entry -> (name: String, record: SlotFile)? in
            guard case .success(let record) = entry.record, record.kind == passphraseSlot, record.kdf != nil,
                  slot == nil || record.id == slot else { return nil }
            return (SlotFile.directory + "/" + entry.name, record)
        }
        let ordered = records.filter { $0.name.hasSuffix("/" + $0.record.id + SlotFile.suffix) }
            + records.filter { !$0.name.hasSuffix("/" + $0.record.id + SlotFile.suffix) }
        for (name, record) in ordered {
            let kdf = record.kdf!
            if slot == nil && aboveLimit(kdf) {
                skipped.append(Skipped(
                    name: name,
                    reason: "its Argon2id costs (\(costs(kdf))) are above the vault's (\(costs(config.kdf))): tried only with --slot \(record.id)"))
            } else {
                candidates.append(Attempt(name: name, source: .slotFile(record), kdf: kdf))
            }
        }
        // The budget counts distinct derivations: a copy of a slot shares its slot's key.
        var derivations = Set<String>()
        var attempts: [Attempt] = []
        for attempt in candidates {
            let key = "\(attempt.kdf.salt)/\(attempt.kdf.opsLimit)/\(attempt.kdf.memLimit)"
            if derivations.contains(key) || derivations.count < maxDerivations {
                derivations.insert(key)
                attempts.append(attempt)
            } else {
                skipped.append(Skipped(name: attempt.name, reason: "past the \(maxDerivations) Argon2id runs one unlock makes"))
            }
        }
        return UnlockPlan(attempts: attempts, skipped: skipped)
    }
}

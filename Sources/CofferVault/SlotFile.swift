// SlotFile is one key slot kept in a file of its own, CIPHERDIR/coffer.slots/<id>.slot:
// the master key wrapped for one way in (a labelled passphrase, or a slot key that a
// device keeps: this machine's TPM, the desktop keyring), bound to the vault's parameters
// and to the slot's own id, kind, label, KDF and device fields. Each slot is its own file,
// so two machines that add or remove slots at once never write the same file (FORMAT.md §13).
import CofferCrypto
import CofferSystem
import Foundation

public struct SlotFile: Codable, Equatable, Sendable {
    /// The directory at the vault root that holds the slot files.
    public static let directory = "coffer.slots"
    /// How a slot file's name ends (its name is `<id>` ‖ this).
    public static let suffix = ".slot"
    /// The version of the record this build writes and reads.
    public static let currentVersion = 1
    /// The largest slot file read, in bytes (a record is about 400).
    public static let sizeLimit = 16 << 10
    /// The most entries of `coffer.slots` looked at: each passphrase slot costs one Argon2id
    /// run at every unlock, so a directory stuffed by another writer must not stall it.
    public static let maxEntries = 64
    /// The longest label, in bytes of UTF-8.
    public static let maxLabelLength = 64
    /// The kind of a slot whose key is sealed to a TPM 2.0 (`tpm2` holds its blobs).
    public static let tpm2Kind = "tpm2"
    /// The kind of a slot whose key the desktop keyring (Secret Service) keeps.
    public static let keyringKind = "keyring"
    /// Kinds whose wrapping key is a random slot key kept by a device, not a passphrase.
    public static let keyedKinds: Set<String> = [tpm2Kind, keyringKind]
    /// Every kind this build reads; a record of another kind is listed and skipped.
    public static let knownKinds: Set<String> = keyedKinds.union([VaultConfig.passphraseSlot])
    /// Bytes of a keyed slot's slot key (the AEAD key that wraps the master key).
    public static let slotKeySize = 32
    /// Labels of the two slots kept in coffer.conf: no slot file may take them.
    public static let builtInLabels: Set<String> = [VaultConfig.passphraseSlot, VaultConfig.recoverySlot]

    /// Record version (`currentVersion`).
    public var slot: Int
    /// 32 lowercase hex digits (16 random bytes): the slot's identity, also its file name.
    public var id: String
    /// "passphrase", "tpm2" or "keyring"; other kinds are listed and skipped.
    public var kind: String
    /// The name the user gave the slot, unique among the vault's slots when added.
    public var label: String
    /// When the slot was added, ISO 8601 UTC (informative, not authenticated).
    public var created: String
    /// The Argon2id parameters and salt of this slot's passphrase (kind passphrase).
    public var kdf: VaultConfig.KDF?
    /// base64url of nonce (24) ‖ AEAD seal of the master key ‖ tag: 72 bytes.
    public var wrappedKey: String
    /// Kind tpm2: the sealed slot key and what it is sealed to.
    public var tpm2: TPM2Binding?

    /// Where a tpm2 slot's key is sealed: the TPM's blobs (opaque), the PCRs of its
    /// policy, and the TPM it was sealed by.
    public struct TPM2Binding: Codable, Equatable, Sendable {
        /// base64url of the sealed object's marshalled TPM2B_PUBLIC.
        public var publicBlob: String
        /// base64url of its marshalled TPM2B_PRIVATE (wrapped by the TPM's storage key).
        public var privateBlob: String
        /// The PCR indexes of its PolicyPCR policy, ascending; empty: no PCR policy.
        public var pcrs: [Int]
        /// The PCR bank of the policy: "sha256".
        public var pcrBank: String
        /// The TPM2 Name of the TPM's storage primary key, hex: which machine's TPM.
        public var machine: String

        /// The one PCR bank used.
        public static let sha256Bank = "sha256"
        /// PCR indexes a TPM 2.0 has (PC client: 24).
        public static let pcrRange = 0...23

        enum CodingKeys: String, CodingKey {
            case publicBlob = "public", privateBlob = "private", pcrs, pcrBank, machine
        }

        public init(publicBlob: String, privateBlob: String, pcrs: [Int], pcrBank: String = sha256Bank, machine: String) {
            self.publicBlob = publicBlob
            self.privateBlob = privateBlob
            self.pcrs = pcrs
            self.pcrBank = pcrBank
            self.machine = machine
        }
    }

    /// The file name of the slot with `id`.
    public static func fileName(id: String) -> String { id + suffix }

    /// The name slot file `name` takes while it is destroyed (a temp file's, so what
    /// passes over temp files passes over it).
    static func removalName(of name: String) -> String { AtomicFile.tempPrefix(of: name) + removalMark }

    /// Whether `name` is what a removal that a crash cut left: a slot file that may still
    /// hold its wrapped key.
    public static func isRemovalLeftover(_ name: String) -> Bool { name.hasPrefix(".") && name.hasSuffix(".tmp." + removalMark) }

    private static let removalMark = "removing"

    /// Why `label` cannot be a slot's label, or nil if it can: 1–64 bytes, printable, no
    /// control characters, not "passphrase" or "recovery", not 32 hex digits (an id).
    public static func labelProblem(_ label: String) -> String? {
        if label.isEmpty { return "a label cannot be empty" }
        if label.utf8.count > maxLabelLength { return "a label has at most \(maxLabelLength) bytes" }
        if label.unicodeScalars.contains(where: { $0.properties.generalCategory == .control || $0 == "/" }) {
            return "a label cannot hold control characters or '/'"
        }
        if builtInLabels.contains(label) { return "\"\(label)\" is the label of a slot in \(VaultConfig.fileName)" }
        if isID(label) { return "a label cannot look like a slot id (32 hex digits)" }
        return nil
    }

    /// Whether `text` is a slot id: 32 lowercase hex digits.
    public static func isID(_ text: String) -> Bool {
        text.utf8.count == 32 && text.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }

    /// The associated data that binds the wrapped key to the vault and to this slot:
    /// "coffer.slot" ‖ 0x00 ‖ u32 version ‖ the config's canonical parameters (§3) ‖ str id
    /// ‖ str kind ‖ str label ‖ str kdf.algorithm ‖ u64 opsLimit ‖ u64 memLimit ‖ str kdf.salt
    /// (without a KDF: str "" ‖ u64 0 ‖ u64 0 ‖ str ""); a tpm2 slot then appends str
    /// public ‖ str private ‖ str pcrs (decimal, comma-separated) ‖ str pcrBank ‖ str
    /// machine. Other kinds append nothing, so a passphrase slot's AD is as it always was.
    public func associatedData(config: VaultConfig) -> [UInt8] {
        var out = CanonicalBytes(tag: "coffer.slot")
        out.u32(slot)
        out.append(config.canonicalParameters)
        out.str(id); out.str(kind); out.str(label)
        out.str(kdf?.algorithm ?? ""); out.u64(kdf?.opsLimit ?? 0); out.u64(kdf?.memLimit ?? 0); out.str(kdf?.salt ?? "")
        if kind == SlotFile.tpm2Kind, let tpm2 {
            out.str(tpm2.publicBlob); out.str(tpm2.privateBlob)
            out.str(tpm2.pcrs.map(String.init).joined(separator: ",")); out.str(tpm2.pcrBank); out.str(tpm2.machine)
        }
        return out.bytes
    }

    /// A passphrase slot for `master`, wrapped under `kek` (the passphrase's Argon2id key
    /// with `kdf`); `nonce` only for test vectors.
    static func passphrase(id: String, label: String, created: String, kdf: VaultConfig.KDF, master: MasterKey,
                           kek: SecureBytes, config: VaultConfig, nonce: [UInt8]? = nil) throws -> SlotFile {
        try SlotFile(slot: currentVersion, id: id, kind: VaultConfig.passphraseSlot, label: label,
                     created: created, kdf: kdf, wrappedKey: "").wrapping(master, under: kek, config: config, nonce: nonce)
    }

    /// A keyed slot of `kind` (tpm2, with its `tpm2` binding, or keyring) for `master`,
    /// wrapped under the random `slotKey` its device keeps; `nonce` only for test vectors.
    static func keyed(kind: String, id: String, label: String, created: String, tpm2: TPM2Binding?, master: MasterKey,
                      slotKey: SecureBytes, config: VaultConfig, nonce: [UInt8]? = nil) throws -> SlotFile {
        precondition(keyedKinds.contains(kind) && (kind == tpm2Kind) == (tpm2 != nil) && slotKey.count == slotKeySize)
        return try SlotFile(slot: currentVersion, id: id, kind: kind, label: label, created: created, kdf: nil,
                            wrappedKey: "", tpm2: tpm2).wrapping(master, under: slotKey, config: config, nonce: nonce)
    }

    /// This record with `wrappedKey` set: `master` sealed under `kek` with the record's AD.
    private func wrapping(_ master: MasterKey, under kek: SecureBytes, config: VaultConfig, nonce: [UInt8]?) throws -> SlotFile {
        var record = self
        let ad = associatedData(config: config)
        let box = SealedBox(key: kek)
        let sealed = try master.secret.withUnsafeBytes { bytes in
            try nonce.map { try box.seal(bytes, associatedData: ad, nonce: $0) } ?? box.seal(bytes, associatedData: ad)
        }
        record.wrappedKey = Base64URL.encode(sealed)
        return record
    }

    /// The master key this slot wraps under `kek`, or nil if it does not open (a wrong
    /// key, or a record edited, moved from another vault, or made for other parameters).
    func unwrap(with kek: SecureBytes, config: VaultConfig) -> MasterKey? {
        guard let sealed = try? Base64URL.decode(wrappedKey),
              let secret = try? SealedBox(key: kek).open(sealed, associatedData: associatedData(config: config), what: "slot \(id)"),
              secret.count == MasterKey.size else { return nil }
        return MasterKey(secret: secret)
    }

    /// Parses and checks a slot record's shape (not its seal): version, id, label, a
    /// passphrase slot's KDF within the bounds the config's KDF has.
    public static func parse(_ bytes: [UInt8]) throws -> SlotFile {
        guard let record = try? JSONDecoder().decode(SlotFile.self, from: Data(bytes)) else {
            throw SlotFileProblem("not a slot record (JSON with slot, id, kind, label, created, wrappedKey)")
        }
        guard record.slot == currentVersion else { throw SlotFileProblem("slot record version \(record.slot) is not supported") }
        guard isID(record.id) else { throw SlotFileProblem("its id is not 32 lowercase hex digits") }
        if let problem = labelProblem(record.label) { throw SlotFileProblem("its label is refused: \(problem)") }
        guard let sealed = try? Base64URL.decode(record.wrappedKey), sealed.count == SealedBox.nonceSize + MasterKey.size + SealedBox.tagSize else {
            throw SlotFileProblem("its wrappedKey is not the base64url of 72 bytes")
        }
        if record.kind == VaultConfig.passphraseSlot {
            guard let kdf = record.kdf, kdf.algorithm == PassphraseKDF.algorithmName,
                  let salt = try? Base64URL.decode(kdf.salt), salt.count == PassphraseKDF.saltSize else {
                throw SlotFileProblem("a passphrase slot without an Argon2id KDF and a 16-byte salt")
            }
            guard kdf.parameters.isAcceptable else {
                throw SlotFileProblem("its KDF parameters (\(kdf.opsLimit) passes, \(kdf.memLimit) bytes) are outside the accepted range")
            }
        }
        if keyedKinds.contains(record.kind), record.kdf != nil {
            throw SlotFileProblem("a \(record.kind) slot with a KDF (its key is no passphrase)")
        }
        if record.kind == tpm2Kind {
            guard let tpm2 = record.tpm2 else { throw SlotFileProblem("a tpm2 slot without its tpm2 object") }
            if let problem = tpm2.problem { throw SlotFileProblem("its tpm2 object is refused: \(problem)") }
        }
        return record
    }

    /// The record as JSON, keys sorted, ending in a newline.
    public func serialized() -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        // Encoding plain strings and integers cannot fail.
        return Array(try! encoder.encode(self)) + [0x0a]
    }
}

extension SlotFile.TPM2Binding {
    /// Why these fields cannot be a TPM2 binding, or nil: blobs of base64url of 1–1024
    /// bytes, PCRs 0–23 ascending without repeats, the sha256 bank, a hex machine name.
    var problem: String? {
        for blob in [publicBlob, privateBlob] {
            guard let bytes = try? Base64URL.decode(blob), (1...1024).contains(bytes.count) else {
                return "public and private are base64url of 1 to 1024 bytes"
            }
        }
        guard pcrs.allSatisfy(Self.pcrRange.contains), zip(pcrs, pcrs.dropFirst()).allSatisfy({ $0 < $1 }) else {
            return "pcrs are indexes 0–23, ascending, each once"
        }
        guard pcrBank == Self.sha256Bank else { return "the PCR bank is not sha256" }
        guard (2...132).contains(machine.utf8.count), machine.utf8.count % 2 == 0,
              machine.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }) else {
            return "machine is not a TPM2 Name in lowercase hex"
        }
        return nil
    }
}

/// Why an entry of coffer.slots is not a usable slot record.
public struct SlotFileProblem: Error, CustomStringConvertible, Sendable {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// An entry of coffer.slots as read: a record, or why it is none.
public struct SlotEntry: Sendable {
    /// The entry's name in coffer.slots (a sync engine's conflict copy has its own).
    public let name: String
    public let record: Result<SlotFile, SlotFileProblem>
}

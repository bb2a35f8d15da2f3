// SlotFile is one key slot kept in a file of its own, CIPHERDIR/coffer.slots/<id>.slot:
// the master key wrapped for one way in (a labelled passphrase), bound to the vault's
// parameters and to the slot's own id, kind, label and KDF. Each slot is its own file, so
// two machines that add or remove slots at once never write the same file (FORMAT.md §13).
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
    /// Labels of the two slots kept in coffer.conf: no slot file may take them.
    public static let builtInLabels: Set<String> = [VaultConfig.passphraseSlot, VaultConfig.recoverySlot]

    /// Record version (`currentVersion`).
    public var slot: Int
    /// 32 lowercase hex digits (16 random bytes): the slot's identity, also its file name.
    public var id: String
    /// "passphrase" (the only kind written yet); other kinds are listed and skipped.
    public var kind: String
    /// The name the user gave the slot, unique among the vault's slots when added.
    public var label: String
    /// When the slot was added, ISO 8601 UTC (informative, not authenticated).
    public var created: String
    /// The Argon2id parameters and salt of this slot's passphrase (kind passphrase).
    public var kdf: VaultConfig.KDF?
    /// base64url of nonce (24) ‖ AEAD seal of the master key ‖ tag: 72 bytes.
    public var wrappedKey: String

    /// The file name of the slot with `id`.
    public static func fileName(id: String) -> String { id + suffix }

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

    static func isID(_ text: String) -> Bool {
        text.utf8.count == 32 && text.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }

    /// The associated data that binds the wrapped key to the vault and to this slot:
    /// "coffer.slot" ‖ 0x00 ‖ u32 version ‖ the config's canonical parameters (§3) ‖ str id
    /// ‖ str kind ‖ str label ‖ str kdf.algorithm ‖ u64 opsLimit ‖ u64 memLimit ‖ str kdf.salt
    /// (without a KDF: str "" ‖ u64 0 ‖ u64 0 ‖ str "").
    public func associatedData(config: VaultConfig) -> [UInt8] {
        var out = CanonicalBytes(tag: "coffer.slot")
        out.u32(slot)
        out.append(config.canonicalParameters)
        out.str(id); out.str(kind); out.str(label)
        out.str(kdf?.algorithm ?? ""); out.u64(kdf?.opsLimit ?? 0); out.u64(kdf?.memLimit ?? 0); out.str(kdf?.salt ?? "")
        return out.bytes
    }

    /// A passphrase slot for `master`, wrapped under `kek` (the passphrase's Argon2id key
    /// with `kdf`); `nonce` only for test vectors.
    static func passphrase(id: String, label: String, created: String, kdf: VaultConfig.KDF, master: MasterKey,
                           kek: SecureBytes, config: VaultConfig, nonce: [UInt8]? = nil) throws -> SlotFile {
        var record = SlotFile(slot: currentVersion, id: id, kind: VaultConfig.passphraseSlot, label: label,
                              created: created, kdf: kdf, wrappedKey: "")
        let ad = record.associatedData(config: config)
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

// VaultConfig is coffer.conf at the vault root: format version, cipher, KDF parameters
// and the key slots that wrap the master key. Its parameters are bound to every slot
// as associated data, so an edited parameter makes unlocking fail.
import CofferCrypto
import CofferSystem
import Foundation

public struct VaultConfig: Codable, Equatable, Sendable {
    /// Name of the config file at the root of the backing directory.
    public static let fileName = "coffer.conf"

    /// Whether backing entry `name` is a sync engine's conflict copy of the config.
    public static func isConflictCopy(_ name: String) -> Bool { ConflictName.isCopy(name, of: fileName) }
    /// The newest format version this build writes (docs/FORMAT.md).
    public static let currentFormat = 7
    /// Format versions this build reads: 1 differs from 2 only in refusing long symlink
    /// targets, 2 from 3 only in having no AES-256-GCM, 3 from 4 in binding content to
    /// its place and authenticating its length (BlockLayout, PlaceBinding), 4 from 5 in
    /// binding each directory's IV file to the directory's place (DirectoryBinding), 5
    /// from 6 in a content key per file and protection classes (ProtectionClass), 6 from
    /// 7 in binding a file made while locked to its directory and file (DropName's binding)
    /// and consuming its key record at its conversion (FoundDrop).
    /// 7 from 8 in key domains (after-first-unlock) and file keys wrapped in the header:
    /// made only on request (`init --format 8`) until it is complete.
    public static let supportedFormats = 1...8

    /// The oldest format that has `cipher`.
    public static func minimumFormat(for cipher: ContentAlgorithm) -> Int {
        switch cipher {
        case .xchacha20poly1305: return 1
        case .aes256gcm: return 3
        }
    }

    /// The format a new vault is written in: the newest, whose content and directory IVs
    /// are bound to their places and whose length is authenticated (`coffer init --format` makes an older
    /// one, for a machine whose coffer knows only that).
    public static func defaultFormat(for cipher: ContentAlgorithm) -> Int { currentFormat }

    public struct KDF: Codable, Equatable, Sendable {
        public var algorithm: String
        public var opsLimit: UInt64
        public var memLimit: UInt64
        /// base64url of the 16-byte salt.
        public var salt: String

        public var parameters: KDFParameters { KDFParameters(opsLimit: opsLimit, memLimit: memLimit) }
    }

    public struct KeySlot: Codable, Equatable, Sendable {
        /// "passphrase" or "recovery".
        public var kind: String
        /// base64url of nonce ‖ sealed master key ‖ tag.
        public var wrappedKey: String
    }

    public static let passphraseSlot = "passphrase"
    public static let recoverySlot = "recovery"

    public var format: Int
    /// Symlink targets too long for the backing symlink go into a sidecar (format 2 on).
    public var storesLongSymlinkTargets: Bool { format >= 2 }
    /// Each directory's IV file carries the tags binding it to its place (format 5 on).
    public var bindsDirectories: Bool { format >= 5 }
    /// Each file's blocks are sealed under a key of its own, whatever the cipher (format 6 on).
    public var hasPerFileKeys: Bool { format >= 6 }
    /// Directories may have a protection class (format 6 on).
    public var hasProtectionClasses: Bool { format >= 6 }
    /// A file made while locked is bound to its directory and to itself by its sealed name,
    /// and its key record is marked placed at its conversion (format 7 on).
    public var bindsDrops: Bool { format >= 7 }
    /// Directories of class after-first-unlock are in a key domain of their own, and each
    /// file's key is wrapped in its header (format 8 on).
    public var hasKeyDomains: Bool { format >= 8 }
    /// Creation time, ISO 8601 UTC.
    public var created: String
    public var contentCipher: String
    /// The content cipher (checked by `parse`).
    public var contentAlgorithm: ContentAlgorithm { ContentAlgorithm(rawValue: contentCipher) ?? .xchacha20poly1305 }
    public var blockSize: Int
    public var kdf: KDF
    public var slots: [KeySlot]
    /// base64url of BLAKE2b-256 over `canonicalParameters`: catches accidental edits
    /// with a precise message. Deliberate edits are caught by the slots' AD.
    public var checksum: String

    /// The parameters as bytes, in a fixed order (docs/FORMAT.md §3):
    /// "coffer.conf\0" ‖ u32 format ‖ str created ‖ str contentCipher ‖ u32 blockSize ‖
    /// str kdf.algorithm ‖ u64 opsLimit ‖ u64 memLimit ‖ str salt, where str is a u16
    /// big-endian length followed by UTF-8 bytes.
    public var canonicalParameters: [UInt8] {
        var out = CanonicalBytes(tag: "coffer.conf")
        out.u32(format); out.str(created); out.str(contentCipher); out.u32(blockSize)
        out.str(kdf.algorithm); out.u64(kdf.opsLimit); out.u64(kdf.memLimit); out.str(kdf.salt)
        return out.bytes
    }

    /// Associated data of the slot of `kind`: the canonical parameters ‖ str kind.
    public func associatedData(slot kind: String) -> [UInt8] {
        let bytes = Array(kind.utf8)
        return canonicalParameters + withUnsafeBytes(of: UInt16(bytes.count).bigEndian, Array.init) + bytes
    }

    public func computedChecksum() -> String { Base64URL.encode(Hash.blake2b256(canonicalParameters)) }

    public func slot(_ kind: String) throws -> KeySlot {
        guard let slot = slots.first(where: { $0.kind == kind }) else { throw VaultError.missingKeySlot(kind: kind) }
        return slot
    }

    // MARK: Reading and writing

    /// Parses and checks a config: format, checksum, supported parameters, KDF bounds.
    public static func parse(_ bytes: [UInt8]) throws -> VaultConfig {
        struct Version: Decodable { var format: Int }
        guard let version = try? JSONDecoder().decode(Version.self, from: Data(bytes)) else {
            throw VaultError.configMalformed(reason: "not a JSON object with a numeric \"format\"")
        }
        guard supportedFormats.contains(version.format) else { throw VaultError.unsupportedFormat(version: version.format) }
        let config: VaultConfig
        do {
            config = try JSONDecoder().decode(VaultConfig.self, from: Data(bytes))
        } catch {
            throw VaultError.configMalformed(reason: "missing or mistyped field")
        }
        guard config.checksum == config.computedChecksum() else { throw VaultError.configDamaged }
        guard let cipher = ContentAlgorithm(rawValue: config.contentCipher), config.format >= minimumFormat(for: cipher) else {
            throw VaultError.unsupportedParameter("cipher \(config.contentCipher) in format \(config.format)")
        }
        guard config.blockSize == ContentCipher.blockSize else { throw VaultError.unsupportedParameter("block size \(config.blockSize)") }
        guard config.kdf.algorithm == PassphraseKDF.algorithmName else {
            throw VaultError.unsupportedParameter("key derivation \(config.kdf.algorithm)")
        }
        guard let salt = try? Base64URL.decode(config.kdf.salt), salt.count == PassphraseKDF.saltSize else {
            throw VaultError.configMalformed(reason: "kdf.salt is not the base64url of \(PassphraseKDF.saltSize) bytes")
        }
        guard config.kdf.parameters.isAcceptable else {
            throw VaultError.kdfParametersRefused(opsLimit: config.kdf.opsLimit, memLimit: config.kdf.memLimit)
        }
        return config
    }

    /// Reads the config of the backing directory `dir`.
    public static func load(in dir: Int32, path: String, named fileName: String = fileName) throws -> VaultConfig {
        let bytes: [UInt8]
        do {
            bytes = try Sys.readFile(fileName, in: dir, limit: 64 << 10)
        } catch let error as Errno where error.code == ENOENT {
            if fileName == Self.fileName, let entries = try? Sys.listDirectory(dir), Vault.leftByInterruptedInit(entries, in: dir) {
                throw VaultError.interruptedInit(path: path)
            }
            throw VaultError.notAVault(path: path)
        } catch let error as Errno where error.code == EINVAL {
            throw VaultError.configMalformed(reason: "\(fileName) is not a regular file")
        } catch let error as Errno where error.code == ELOOP {
            throw VaultError.configMalformed(reason: "\(fileName) is a symlink")
        } catch let error as Errno where error.code == EFBIG {
            throw VaultError.configMalformed(reason: "\(fileName) is larger than 64 KiB")
        }
        return try parse(bytes)
    }

    /// The config as JSON, keys sorted, ending in a newline.
    public func serialized() -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        // Encoding plain strings and integers cannot fail.
        return Array(try! encoder.encode(self)) + [0x0a]
    }

    /// Writes the config into `dir` atomically.
    public func save(in dir: Int32, as fileName: String = fileName) throws {
        try AtomicFile.write(serialized(), to: fileName, in: dir, mode: 0o400)
    }
}

// Checks the known-answer vectors printed in docs/FORMAT.md against the code, so the
// specification cannot drift from the implementation.
@testable import CofferCrypto
import CofferSystem
@testable import CofferVault
import Foundation
import Glibc
import TestSupport
import XCTest

final class FormatVectorTests: XCTestCase {
    static func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }
    static func bytes(from: UInt8, count: Int) -> [UInt8] { (0..<count).map { from &+ UInt8($0) } }

    static func master() -> MasterKey {
        let key = SecureBytes(count: 32)
        key.withUnsafeMutableBytes { $0.copyBytes(from: bytes(from: 0x00, count: 32)) }
        return MasterKey(secret: key)
    }

    /// The format 2 config of the config vectors (§10): created 2026-01-01T00:00:00Z,
    /// XChaCha20-Poly1305, 2 passes, 64 MiB, salt 10 … 1f; its checksum computed.
    static func vectorConfig() -> VaultConfig {
        var config = VaultConfig(format: 2, created: "2026-01-01T00:00:00Z", contentCipher: ContentAlgorithm.xchacha20poly1305.rawValue,
                                 blockSize: 4096,
                                 kdf: .init(algorithm: PassphraseKDF.algorithmName, opsLimit: 2, memLimit: 64 << 20,
                                            salt: Base64URL.encode(bytes(from: 0x10, count: 16))),
                                 slots: [], checksum: "")
        config.checksum = config.computedChecksum()
        return config
    }

    /// The TPM2 binding of the tpm2 slot vector: public blob 01 … 10, private blob
    /// 21 … 30 (opaque stand-ins for a TPM's), PCRs 0 and 7, machine 000b ‖ 40 … 5f.
    static let vectorBinding = SlotFile.TPM2Binding(publicBlob: Base64URL.encode(bytes(from: 0x01, count: 16)),
                                                    privateBlob: Base64URL.encode(bytes(from: 0x21, count: 16)), pcrs: [0, 7],
                                                    machine: "000b" + hex(bytes(from: 0x40, count: 32)))

    static func slotKey(from first: UInt8) -> SecureBytes {
        let key = SecureBytes(count: 32)
        key.withUnsafeMutableBytes { $0.copyBytes(from: bytes(from: first, count: 32)) }
        return key
    }

    /// The keyed slot vector of `kind`: tpm2 (id ff ee … 00, label "laptop TPM") or
    /// keyring (id 01 23 … ef twice, label "keyring"), created 2026-11-26T00:00:00Z.
    static func keyedVectorSlot(kind: String, master: MasterKey, slotKey: SecureBytes, nonce: [UInt8]? = nil) throws -> SlotFile {
        let tpm2 = kind == SlotFile.tpm2Kind
        return try SlotFile.keyed(kind: kind, id: tpm2 ? "ffeeddccbbaa99887766554433221100" : "0123456789abcdef0123456789abcdef",
                                  label: tpm2 ? "laptop TPM" : "keyring", created: "2026-11-26T00:00:00Z",
                                  tpm2: tpm2 ? vectorBinding : nil, master: master, slotKey: slotKey, config: vectorConfig(), nonce: nonce)
    }

    /// Every vector, computed by the code from the fixed inputs the spec lists.
    static func computed() throws -> [(String, String)] {
        let master = master()
        var out: [(String, String)] = [("master_key", hex(master.secret.withUnsafeBytes { Array($0) }))]
        for purpose in SubkeyPurpose.allCases {
            out.append(("subkey_\(purpose.rawValue)", hex(master.subkey(purpose).withUnsafeBytes { Array($0) })))
        }
        let keys = KeySet(master: master, content: .xchacha20poly1305)

        // Content block 3 of a file, 100 bytes of plaintext 00 01 … 63.
        let fileID = FileID(bytes: bytes(from: 0xa0, count: 16))
        let plain = bytes(from: 0x00, count: 100)
        var block = [UInt8](repeating: 0, count: 140)
        try plain.withUnsafeBytes { p in
            try block.withUnsafeMutableBytes {
                try keys.content.sealBlockWithFixedNonce(p, blockIndex: 3, fileID: fileID, nonce: bytes(from: 0x40, count: 24), into: $0)
            }
        }
        out.append(("content_file_header", hex(FileHeader(version: 1, fileID: fileID).bytes)))
        out.append(("content_block_3", hex(block)))
        // Format 4: the file's place (directory IV f0 … ff, name hello.txt), its tag with
        // hard links, the header carrying the place tag, and the empty final block 1 of
        // a file of 4096 bytes (nonce 40 … 57).
        let placeTag = try keys.places.tag(fileID: fileID.bytes, dirIV: bytes(from: 0xf0, count: 16), name: Array("hello.txt".utf8))
        out.append(("place_tag", hex(placeTag)))
        out.append(("place_tag_linked", hex(try keys.places.linkedTag(fileID: fileID.bytes))))
        out.append(("content_file_header_v2", hex(FileHeader(version: 2, fileID: fileID, placeTag: placeTag).bytes)))
        // Format 8: the AFU domain's subkeys, the key 30 … 4f of that file wrapped in each
        // domain, and the version-4 header of that file in the AFU domain (its place tag
        // there for hello.txt in the directory with IV f0 … ff).
        let afuRoot = master.root(of: .afterFirstUnlock)
        for purpose in SubkeyPurpose.allCases where purpose.rawValue <= SubkeyPurpose.place.rawValue {
            out.append(("afu_subkey_\(purpose.rawValue)", hex(afuRoot.subkey(purpose).withUnsafeBytes { Array($0) })))
        }
        let afu = KeySet(master: afuRoot, content: .xchacha20poly1305, perFileKeys: true)
        let fileKey = slotKey(from: 0x30)
        out.append(("file_key_wrap", hex(try FileKeyWrap.wrap(fileKey, fileID: fileID.bytes, under: keys.metadata))))
        let afuWrap = try FileKeyWrap.wrap(fileKey, fileID: fileID.bytes, under: afu.metadata)
        out.append(("file_key_wrap_afu", hex(afuWrap)))
        let afuTag = try afu.places.tag(fileID: fileID.bytes, dirIV: bytes(from: 0xf0, count: 16), name: Array("hello.txt".utf8))
        out.append(("content_file_header_v4_afu", hex(FileHeader(version: 4, fileID: fileID, placeTag: afuTag, keyWrap: afuWrap).bytes)))
        out.append(("class_record_converting_afu", hex(try ProtectionClass.afterFirstUnlock.sealedConverting(
            from: .complete, dirIV: bytes(from: 0xf0, count: 16), box: afu.metadata))))
        // Format 5: the IV file of directory "docs" (IV f0 … ff) in a directory with IV
        // e0 … ef, never renamed (previous tag zero), and the tag of that IV at the root.
        let docsIV = bytes(from: 0xf0, count: 16)
        let dirTag = try keys.places.directoryTag(iv: docsIV, parentIV: bytes(from: 0xe0, count: 16), name: Array("docs".utf8))
        out.append(("dir_tag", hex(dirTag)))
        out.append(("dir_tag_root", hex(try keys.places.directoryTag(iv: docsIV, parentIV: [], name: []))))
        out.append(("diriv_file_v5", hex(docsIV + dirTag + [UInt8](repeating: 0, count: 16))))
        var final = [UInt8](repeating: 0, count: 40)
        var nothing: UInt8 = 0
        try withUnsafeMutablePointer(to: &nothing) { dummy in
            try final.withUnsafeMutableBytes {
                try keys.content.sealBlockWithFixedNonce(UnsafeRawBufferPointer(start: dummy, count: 0), blockIndex: 1, fileID: fileID,
                                                         nonce: bytes(from: 0x40, count: 24), into: $0)
            }
        }
        out.append(("content_final_block_1_empty", hex(final)))
        // The same block under AES-256-GCM (format 3): nonce 40 … 4b, then 12 zero bytes.
        if ContentAlgorithm.aes256gcm.isAvailable {
            let aes = KeySet(master: master, content: .aes256gcm)
            var aesBlock = [UInt8](repeating: 0, count: 140)
            try plain.withUnsafeBytes { p in
                try aesBlock.withUnsafeMutableBytes {
                    try aes.content.sealBlockWithFixedNonce(p, blockIndex: 3, fileID: fileID,
                                                            nonce: bytes(from: 0x40, count: 12) + [UInt8](repeating: 0, count: 12), into: $0)
                }
            }
            out.append(("content_block_3_aes256gcm", hex(aesBlock)))
        }
        // Format 6: the same XChaCha20-Poly1305 block under the file's own key, and the
        // class record (unless-open) of the directory with IV f0 … ff, nonce c0 … d7.
        let v6 = KeySet(master: master, content: .xchacha20poly1305, perFileKeys: true)
        var v6Block = [UInt8](repeating: 0, count: 140)
        try plain.withUnsafeBytes { p in
            try v6Block.withUnsafeMutableBytes {
                try v6.content.sealBlockWithFixedNonce(p, blockIndex: 3, fileID: fileID, nonce: bytes(from: 0x40, count: 24), into: $0)
            }
        }
        out.append(("file_key_xchacha_v6", hex(try v6.content.fileCipher(for: fileID).keyBytesForTests())))
        out.append(("content_block_3_v6", hex(v6Block)))
        out.append(("class_record_unless_open",
                    hex(try ProtectionClass.unlessOpen.sealed(dirIV: bytes(from: 0xf0, count: 16), box: keys.metadata))))

        // Names in a directory whose IV is f0 f1 … ff.
        let dirIV = bytes(from: 0xf0, count: 16)
        let names = NameTransform(cipher: keys.names)
        out.append(("name_short_plain", "hello.txt"))
        out.append(("name_short_backing", try names.backingName(for: Array("hello.txt".utf8), dirIV: dirIV).name))
        // A sync engine's conflict copy of it (§5): shown under the plaintext name with the
        // engine's marker before the extension; the same name with any other suffix is no name.
        let short = try names.backingName(for: Array("hello.txt".utf8), dirIV: dirIV).name
        let copy = short + ".sync-conflict-20261123-101500-ABCDEFG"
        out.append(("name_conflict_backing", copy))
        out.append(("name_conflict_shown", String(decoding: try names.plaintextName(ofBacking: copy, dirIV: dirIV, in: -1)!, as: UTF8.self)))
        out.append(("name_suffixed_backing", short + ".bak"))
        XCTAssertThrowsError(try names.plaintextName(ofBacking: short + ".bak", dirIV: dirIV, in: -1))
        let long = try names.backingName(for: [UInt8](repeating: 0x4c, count: 200), dirIV: dirIV)
        out.append(("name_long_plain", "200 × 'L' (0x4c)"))
        out.append(("name_long_backing", long.name))
        if case .long(_, let encoded) = long { out.append(("name_long_sidecar", encoded)) }

        // Symlink targets sealed under the nonce c0 c1 … d7: one in the link, one in a sidecar.
        let symlinks = SymlinkCodec(box: keys.metadata, longTargets: true)
        let symlinkNonce = bytes(from: 0xc0, count: 24)
        out.append(("symlink_short_plain", "../target"))
        out.append(("symlink_short_backing", try symlinks.encrypt(Array("../target".utf8), nonce: symlinkNonce).linkTarget))
        out.append(("symlink_long_plain", "3100 × 't' (0x74)"))
        out.append(("symlink_long_backing", try symlinks.encrypt([UInt8](repeating: 0x74, count: 3100), nonce: symlinkNonce).linkTarget))

        // Key slots of a config with fixed salt, time and nonces.
        // A format 2 config (XChaCha20-Poly1305); format 3 differs only in the number and cipher name.
        out.append(("config_format", "2"))
        let config = vectorConfig()
        out.append(("config_canonical_parameters", hex(config.canonicalParameters)))
        out.append(("config_checksum", config.checksum))
        let pass = SecureBytes(count: 28)
        pass.withUnsafeMutableBytes { $0.copyBytes(from: Array("correct horse battery staple".utf8)) }
        let passKey = try PassphraseKDF.deriveKey(passphrase: pass, salt: bytes(from: 0x10, count: 16), parameters: .floor)
        out.append(("slot_passphrase", "correct horse battery staple"))
        out.append(("slot_passphrase_kek", hex(passKey.withUnsafeBytes { Array($0) })))
        out.append(("slot_passphrase_wrapped",
                    try Vault.wrap(master, with: passKey, kind: "passphrase", config: config, nonce: bytes(from: 0x60, count: 24)).wrappedKey))
        let recovery = SecureBytes(count: 32)
        recovery.withUnsafeMutableBytes { $0.copyBytes(from: bytes(from: 0x80, count: 32)) }
        out.append(("slot_recovery_key", String(decoding: RecoveryKey.format(recovery).withUnsafeBytes { Array($0) }, as: UTF8.self)))
        out.append(("slot_recovery_wrapped",
                    try Vault.wrap(master, with: RecoveryKey.wrappingKey(recovery), kind: "recovery", config: config,
                               nonce: bytes(from: 0x90, count: 24)).wrappedKey))
        // A slot file (§13) of that config: id 00 11 … ff, label "laptop", its own salt
        // b0 … bf, 2 passes, 64 MiB, nonce 20 … 37.
        let slotWords = SecureBytes(count: 11)
        slotWords.withUnsafeMutableBytes { $0.copyBytes(from: Array("Tr0ub4dor&3".utf8)) }
        let slotKDF = VaultConfig.KDF(algorithm: PassphraseKDF.algorithmName, opsLimit: 2, memLimit: 64 << 20,
                                      salt: Base64URL.encode(bytes(from: 0xb0, count: 16)))
        let slotKEK = try PassphraseKDF.deriveKey(passphrase: slotWords, salt: bytes(from: 0xb0, count: 16), parameters: .floor)
        let slotFile = try SlotFile.passphrase(id: "00112233445566778899aabbccddeeff", label: "laptop", created: "2026-11-26T00:00:00Z",
                                               kdf: slotKDF, master: master, kek: slotKEK, config: config, nonce: bytes(from: 0x20, count: 24))
        out.append(("slot_file_passphrase", "Tr0ub4dor&3"))
        out.append(("slot_file_ad", hex(slotFile.associatedData(config: config))))
        out.append(("slot_file_kek", hex(slotKEK.withUnsafeBytes { Array($0) })))
        out.append(("slot_file_wrapped", slotFile.wrappedKey))
        // Keyed slot files (§13) of that config: a tpm2 slot with slot key c0 … df and a
        // keyring slot with slot key e0 … ff (the keys a TPM and a keyring would keep).
        for (kind, key, nonce) in [(SlotFile.tpm2Kind, UInt8(0xc0), UInt8(0x38)), (SlotFile.keyringKind, 0xe0, 0x50)] {
            let record = try keyedVectorSlot(kind: kind, master: master, slotKey: slotKey(from: key), nonce: bytes(from: nonce, count: 24))
            out.append(("slot_\(kind)_key", hex(bytes(from: key, count: 32))))
            out.append(("slot_\(kind)_ad", hex(record.associatedData(config: config))))
            out.append(("slot_\(kind)_wrapped", record.wrappedKey))
        }

        // The undo-journal record of content block 3 (§11): header, old slot, zeros.
        var record = UndoJournal.Record(fileID: fileID, block: 3, oldLength: 100, newNonce: bytes(from: 0x70, count: 24), sealed: block)
        record.sequence = 1
        let encoded = record.encoded
        XCTAssertEqual(encoded.count, 4208)
        XCTAssertEqual(Array(encoded[72..<212]), block)
        XCTAssertTrue(encoded[212...].allSatisfy { $0 == 0 })
        XCTAssertEqual(UndoJournal.Record(parsing: encoded)?.sealed, block)
        out.append(("journal_record_header", hex(Array(encoded.prefix(72)))))
        try out.append(contentsOf: reverseVectors(master))
        return out
    }

    /// §14: the reverse view of `docs/hello.txt` (the 100 bytes 00 … 63) and `docs/link`
    /// (to `hello.txt`), and the ID of inode 1234567's names.
    static func reverseVectors(_ master: MasterKey) throws -> [(String, String)] {
        var out: [(String, String)] = []
        for cipher in [ContentAlgorithm.xchacha20poly1305, .aes256gcm] where cipher.isAvailable {
            var config = vectorConfig()
            config.format = ReverseFormat.format
            config.contentCipher = cipher.rawValue
            let view = ReverseFormat(master: master, config: config)
            let root = try view.reverse.rootIV()
            let docs = try view.reverse.directoryIV(parentIV: root, name: Array("docs".utf8))
            let name = Array("hello.txt".utf8)
            let id = try view.entryID(dirIV: docs, name: name, links: 1, inode: 99)
            let plain = bytes(from: 0x00, count: 100)
            var block = [UInt8](repeating: 0, count: 140)
            try plain.withUnsafeBytes { p in
                try block.withUnsafeMutableBytes { try view.keys.content.sealSynthetic(p, firstBlock: 0, fileID: id, reverse: view.reverse, into: $0) }
            }
            guard cipher == .xchacha20poly1305 else {
                out.append(("reverse_final_block_0_aes256gcm", hex(block)))
                continue
            }
            out.append(("reverse_root_iv", hex(root)))
            out.append(("reverse_dir_iv", hex(docs)))
            out.append(("reverse_diriv_file", hex(try view.ivFile(iv: docs, parentIV: root, name: Array("docs".utf8)))))
            out.append(("reverse_file_id", hex(id.bytes)))
            out.append(("reverse_file_header", hex(try view.header(id: id, dirIV: docs, name: name, links: 1))))
            out.append(("reverse_final_block_0", hex(block)))
            out.append(("reverse_linked_file_id", hex(try view.entryID(dirIV: docs, name: name, links: 2, inode: 1234567).bytes)))
            let linkID = try view.entryID(dirIV: docs, name: Array("link".utf8), links: 1, inode: 98)
            out.append(("reverse_symlink_stored", try view.symlinkTarget(Array("hello.txt".utf8), id: linkID)!))
        }
        return out
    }

    /// The `name = value` lines between the vector markers of docs/FORMAT.md.
    static func documented() throws -> [String: String] {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let text = try String(contentsOf: root.appendingPathComponent("docs/FORMAT.md"), encoding: .utf8)
        guard let start = text.range(of: "<!-- vectors:begin -->"), let end = text.range(of: "<!-- vectors:end -->") else {
            return [:]
        }
        var out: [String: String] = [:]
        var lastKey: String?
        for line in text[start.upperBound..<end.lowerBound].split(separator: "\n") {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if let eq = trimmed.range(of: " = ") {
                let key = String(trimmed[..<eq.lowerBound])
                out[key] = String(trimmed[eq.upperBound...])
                lastKey = key
            } else if let key = lastKey, !trimmed.isEmpty, !trimmed.hasPrefix("`") {
                out[key]! += trimmed  // continuation of a long value
            }
        }
        return out
    }

    func testDocumentedVectorsMatchTheCode() throws {
        let documented = try Self.documented()
        let computed = try Self.computed()
        var missing: [String] = []
        for (key, value) in computed {
            guard let doc = documented[key] else { missing.append("\(key) = \(value)"); continue }
            XCTAssertEqual(doc, value, key)
        }
        XCTAssertTrue(missing.isEmpty, "vectors missing from docs/FORMAT.md:\n" + missing.joined(separator: "\n"))
    }

    func testDocumentedKeySlotsUnwrapTheDocumentedMasterKey() throws {
        let documented = try Self.documented()
        let pass = SecureBytes(count: 28)
        pass.withUnsafeMutableBytes { $0.copyBytes(from: Array("correct horse battery staple".utf8)) }
        let kek = try PassphraseKDF.deriveKey(passphrase: pass, salt: Self.bytes(from: 0x10, count: 16), parameters: .floor)
        let config = Self.vectorConfig()
        let sealed = try Base64URL.decode(try XCTUnwrap(documented["slot_passphrase_wrapped"]))
        let master = try SealedBox(key: kek).open(sealed, associatedData: config.associatedData(slot: "passphrase"), what: "slot")
        XCTAssertEqual(Self.hex(master.withUnsafeBytes { Array($0) }), documented["master_key"])
    }

    /// The documented slot file (§13), read as a record with the documented fields,
    /// opens to the master key with its passphrase, and to nothing once relabelled.
    func testDocumentedSlotFileOpens() throws {
        let documented = try Self.documented()
        let config = Self.vectorConfig()
        let json = """
            {"slot": 1, "id": "00112233445566778899aabbccddeeff", "kind": "passphrase", "label": "laptop",
             "created": "2026-11-26T00:00:00Z", "wrappedKey": "\(try XCTUnwrap(documented["slot_file_wrapped"]))",
             "kdf": {"algorithm": "argon2id13", "opsLimit": 2, "memLimit": 67108864, "salt": "\(Base64URL.encode(Self.bytes(from: 0xb0, count: 16)))"}}
            """
        var record = try SlotFile.parse(Array(json.utf8))
        let words = SecureBytes(count: 11)
        words.withUnsafeMutableBytes { $0.copyBytes(from: Array(try! XCTUnwrap(documented["slot_file_passphrase"]).utf8)) }
        let kek = try PassphraseKDF.deriveKey(passphrase: words, salt: Self.bytes(from: 0xb0, count: 16), parameters: .floor)
        let master = try XCTUnwrap(record.unwrap(with: kek, config: config))
        XCTAssertEqual(Self.hex(master.secret.withUnsafeBytes { Array($0) }), documented["master_key"])
        record.label = "desktop"
        XCTAssertNil(record.unwrap(with: kek, config: config))
    }

    /// The documented keyed slot files (§13), read as records with the documented fields,
    /// open to the master key with their slot keys, and to nothing once a bound field changes.
    func testDocumentedKeyedSlotFilesOpen() throws {
        let documented = try Self.documented()
        let config = Self.vectorConfig()
        let binding = Self.vectorBinding
        let records = [
            (SlotFile.tpm2Kind, """
                {"slot": 1, "id": "ffeeddccbbaa99887766554433221100", "kind": "tpm2", "label": "laptop TPM",
                 "created": "2026-11-26T00:00:00Z", "wrappedKey": "\(try XCTUnwrap(documented["slot_tpm2_wrapped"]))",
                 "tpm2": {"public": "\(binding.publicBlob)", "private": "\(binding.privateBlob)", "pcrs": [0, 7],
                          "pcrBank": "sha256", "machine": "\(binding.machine)"}}
                """),
            (SlotFile.keyringKind, """
                {"slot": 1, "id": "0123456789abcdef0123456789abcdef", "kind": "keyring", "label": "keyring",
                 "created": "2026-11-26T00:00:00Z", "wrappedKey": "\(try XCTUnwrap(documented["slot_keyring_wrapped"]))"}
                """),
        ]
        for (kind, json) in records {
            var record = try SlotFile.parse(Array(json.utf8))
            let key = SecureBytes(count: 32)
            let documentedKey = try XCTUnwrap(documented["slot_\(kind)_key"])
            key.withUnsafeMutableBytes { $0.copyBytes(from: stride(from: 0, to: 64, by: 2).map { UInt8(documentedKey.dropFirst($0).prefix(2), radix: 16)! }) }
            let master = try XCTUnwrap(record.unwrap(with: key, config: config), kind)
            XCTAssertEqual(Self.hex(master.secret.withUnsafeBytes { Array($0) }), documented["master_key"], kind)
            XCTAssertEqual(Self.hex(record.associatedData(config: config)), documented["slot_\(kind)_ad"], kind)
            if kind == SlotFile.tpm2Kind { record.tpm2?.pcrs = [7] } else { record.label = "another keyring" }
            XCTAssertNil(record.unwrap(with: key, config: config), kind)
        }
    }

    /// Format 6's drops: the documented public key is subkey 8's; the documented dropped
    /// name and key record (made once: sealing is random) open to `hello.txt` and to the
    /// content vector's file ID with key 30 … 4f; and what this code seals opens again.
    func testDocumentedDropsOpen() throws {
        let documented = try Self.documented()
        let keys = KeySet(master: Self.master(), content: .xchacha20poly1305, perFileKeys: true)
        let drops = try XCTUnwrap(keys.drops)
        XCTAssertEqual(Self.hex(drops.publicKey), documented["drop_public_key"])
        XCTAssertEqual(try DropName.decode(try XCTUnwrap(documented["drop_name_backing"]), keys: drops, bound: false).name, Array("hello.txt".utf8))
        // Conversion (FoundDrop): a dropped directory's IV, and the name a drop takes
        // when its own is taken, cut to fit 255 bytes — from the backing name alone.
        let backing = try XCTUnwrap(documented["drop_name_backing"])
        XCTAssertEqual(Self.hex(FoundDrop.directoryIV(backingName: backing)), documented["drop_directory_iv"])
        let taken = DropName.alternative(Array("hello.txt".utf8), mark: FoundDrop.mark(backingName: backing))
        XCTAssertEqual(String(decoding: taken, as: UTF8.self), documented["drop_taken_name"])
        let long = DropName.alternative([UInt8](repeating: 0x4c, count: 250), mark: FoundDrop.mark(backingName: backing))
        XCTAssertEqual(long.count, 255)
        XCTAssertTrue(String(decoding: long, as: UTF8.self).hasSuffix(String(decoding: taken.suffix(19), as: UTF8.self)))
        let record = try XCTUnwrap(documented["drop_key_record"])
        let bytes = stride(from: 0, to: record.count, by: 2).map { UInt8(record[record.index(record.startIndex, offsetBy: $0)...].prefix(2), radix: 16)! }
        let opened = try drops.open(bytes, what: "record").withUnsafeBytes { Array($0) }
        XCTAssertEqual(opened, [1] + Self.bytes(from: 0xa0, count: 16) + Self.bytes(from: 0x30, count: 32))
        let own = try DropName.encode(Array("hello.txt".utf8), to: drops.publicKey)
        XCTAssertEqual(try DropName.decode(own, keys: drops, bound: false).name, Array("hello.txt".utf8))
        XCTAssertNotEqual(own, try DropName.encode(Array("hello.txt".utf8), to: drops.publicKey), "sealing is random")
        for bound in [false, true] {
            let binding = bound ? [UInt8](repeating: 7, count: DropName.bindingSize) : nil
            let longest = DropName.maxNameLength(bound: bound)
            XCTAssertThrowsError(try DropName.encode([UInt8](repeating: 0x61, count: longest + 1), binding: binding, to: drops.publicKey))
            XCTAssertLessThanOrEqual(try DropName.encode([UInt8](repeating: 0x61, count: longest), binding: binding, to: drops.publicKey).utf8.count, 255)
        }
    }

    /// Format 7: the binding of the content vector's file in the directory of IV f0 … ff,
    /// the name sealed with it, and the key record marked placed (made once: sealing is
    /// random) open as documented.
    func testDocumentedBoundDropsOpen() throws {
        let documented = try Self.documented()
        let keys = KeySet(master: Self.master(), content: .xchacha20poly1305, perFileKeys: true)
        let drops = try XCTUnwrap(keys.drops)
        let binding = DropName.binding(dirIV: Self.bytes(from: 0xf0, count: 16), id: Self.bytes(from: 0xa0, count: 16))
        XCTAssertEqual(Self.hex(binding), documented["drop_binding"])
        let opened = try DropName.decode(try XCTUnwrap(documented["drop_name_backing_bound"]), keys: drops, bound: true)
        XCTAssertEqual(opened.name, Array("hello.txt".utf8))
        XCTAssertEqual(opened.binding, binding)
        // The placed record is deterministic: this code writes the documented bytes.
        let root = TempDirectory()
        XCTAssertEqual(mkdir(root.path + "/" + DropRecord.directory, 0o700), 0)
        let rootFD = try FileDescriptor.open(root.path, flags: O_RDONLY | O_DIRECTORY)
        let id = FileID(bytes: Self.bytes(from: 0xa0, count: 16))
        let fileKey = SecureBytes(count: 32)
        fileKey.withUnsafeMutableBytes { $0.copyBytes(from: Self.bytes(from: 0x30, count: 32)) }
        try DropRecord.markPlaced(key: fileKey, fileID: id, metadata: keys.metadata, root: rootFD.rawValue)
        let written = try Sys.readFile(DropRecord.directory + "/" + DropRecord.fileName(id), in: rootFD.rawValue)
        XCTAssertEqual(Self.hex(written), documented["drop_key_record_placed"])
        let read = try DropRecord.readRecord(fileID: id, root: rootFD.rawValue, keys: keys)
        XCTAssertTrue(read.placed)
        XCTAssertEqual(read.key.withUnsafeBytes { Array($0) }, Self.bytes(from: 0x30, count: 32))
        let own = try DropName.encode(Array("hello.txt".utf8), binding: binding, to: drops.publicKey)
        XCTAssertEqual(try DropName.decode(own, keys: drops, bound: true).binding, binding)
    }
}

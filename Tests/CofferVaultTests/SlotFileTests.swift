// Tests of the key slots kept as files (coffer.slots): adding, unlocking with each,
// binding to the vault and the slot, removing (never the last way in), passwd of one
// slot, two machines' slots merged, hostile entries, and the wipe of the directory.
import CofferCrypto
import CofferSystem
@testable import CofferVault
import Foundation
import Glibc
import Synchronization
import TestSupport
import XCTest

final class SlotFileTests: XCTestCase, VaultTestCase {
    var dir: TempDirectory!
    var outside: TempDirectory!
    let passphrase = "correct horse battery staple"

    override func setUp() { dir = TempDirectory(); outside = TempDirectory() }
    override func tearDown() { dir = nil; outside = nil }

    var slotsPath: String { dir.path + "/" + SlotFile.directory }

    func slotFileNames() throws -> [String] { try FileManager.default.contentsOfDirectory(atPath: slotsPath).sorted() }

    func testEachLabelledPassphraseOpensTheSameMasterKey() throws {
        let (vault, _) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        let laptop = try vault.addPassphraseSlot(master: master, passphrase: secret("laptop words"), label: "laptop")
        let phone = try vault.addPassphraseSlot(master: master, passphrase: secret("phone words"), label: "phone ☎")
        XCTAssertNotEqual(laptop.id, phone.id)
        XCTAssertNotEqual(laptop.kdf?.salt, phone.kdf?.salt)
        XCTAssertNotEqual(laptop.kdf?.salt, vault.config.kdf.salt)
        XCTAssertEqual(try slotFileNames(), [laptop.id + ".slot", phone.id + ".slot"].sorted())
        let reopened = try Vault.open(at: dir.path)
        for words in [passphrase, "laptop words", "phone words"] {
            XCTAssertEqual(contentKey(try reopened.unlock(passphrase: secret(words))), contentKey(master), words)
        }
        XCTAssertThrowsError(try reopened.unlock(passphrase: secret("wrong"))) { XCTAssertEqual($0 as? VaultError, .wrongPassphrase) }
        let labels = reopened.keySlots().map(\.label)
        XCTAssertEqual(Array(labels.prefix(2)), ["passphrase", "recovery"])
        XCTAssertEqual(Set(labels.dropFirst(2)), ["laptop", "phone ☎"])
        // The config was not written: adding a slot only makes a file.
        XCTAssertEqual(reopened.config, vault.config)
    }

    /// A wrong passphrase costs one key derivation per passphrase slot, each with its
    /// own salt; a right one stops at the slot that opens.
    func testEverySlotIsTriedWithItsOwnSalt() throws {
        let (vault, _) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        try vault.addPassphraseSlot(master: master, passphrase: secret("one"), label: "one")
        try vault.addPassphraseSlot(master: master, passphrase: secret("two"), label: "two")
        let salts = Mutex<[[UInt8]]>([])
        let counting: Vault.KeyDerivation = { words, salt, parameters in
            salts.withLock { $0.append(salt) }
            return try Vault.deriveInProcess(words, salt, parameters)
        }
        XCTAssertThrowsError(try vault.unlock(passphrase: secret("wrong"), derive: counting))
        XCTAssertEqual(salts.withLock { Set($0).count }, 3)
        XCTAssertEqual(salts.withLock { $0.count }, 3)
    }

    func testLabelsAreCheckedAndUnique() throws {
        let (vault, _) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        try vault.addPassphraseSlot(master: master, passphrase: secret("a"), label: "work")
        XCTAssertThrowsError(try vault.addPassphraseSlot(master: master, passphrase: secret("b"), label: "work")) {
            XCTAssertEqual($0 as? VaultError, .slotLabelTaken("work"))
        }
        for bad in ["", "passphrase", "recovery", "a/b", "tab\there", String(repeating: "x", count: 65), "0123456789abcdef0123456789abcdef"] {
            XCTAssertThrowsError(try vault.addPassphraseSlot(master: master, passphrase: secret("b"), label: bad), bad) {
                guard case .invalidSlotLabel = $0 as? VaultError else { return XCTFail("\(bad): \($0)") }
            }
        }
        XCTAssertEqual(try slotFileNames().count, 1)
    }

    /// The wrapped key is bound to the vault's parameters and to the slot's id, kind,
    /// label and KDF: an edited record, or one copied from another vault, does not open.
    func testASlotIsBoundToItsVaultAndItself() throws {
        let (vault, _) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        let record = try vault.addPassphraseSlot(master: master, passphrase: secret("mine"), label: "mine")
        let name = SlotFile.fileName(id: record.id)
        let original = try Sys.readFile(SlotFile.directory + "/" + name, in: dir.fd)
        func rewrite(_ edit: (inout SlotFile) -> Void) throws {
            var edited = try SlotFile.parse(original)
            edit(&edited)
            chmod(slotsPath + "/" + name, 0o600)
            try Data(edited.serialized()).write(to: URL(fileURLWithPath: slotsPath + "/" + name))
        }
        let edits: [(String, (inout SlotFile) -> Void)] = [
            ("label", { $0.label = "yours" }),
            ("id", { $0.id = String(repeating: "ab", count: 16) }),
            ("kind", { $0.kind = "recovery" }),
            ("memLimit", { $0.kdf?.memLimit *= 2 }),
        ]
        for (what, edit) in edits {
            try rewrite(edit)
            XCTAssertThrowsError(try vault.unlock(passphrase: secret("mine")), what) { XCTAssertEqual($0 as? VaultError, .wrongPassphrase) }
        }
        try rewrite { _ in }
        XCTAssertEqual(contentKey(try vault.unlock(passphrase: secret("mine"))), contentKey(master))

        // The same record in another vault (another salt and creation time in its
        // parameters) opens nothing there.
        let other = TempDirectory()
        let (otherVault, _) = try makeVault(in: other.path)
        XCTAssertEqual(mkdir(other.path + "/" + SlotFile.directory, 0o700), 0)
        try Data(original).write(to: URL(fileURLWithPath: other.path + "/" + SlotFile.directory + "/" + name))
        XCTAssertEqual(otherVault.keySlots().count, 3)
        XCTAssertThrowsError(try otherVault.unlock(passphrase: secret("mine"))) { XCTAssertEqual($0 as? VaultError, .wrongPassphrase) }
    }

    /// A temp file that an interrupted write of a slot left holds its wrapped key: removing
    /// the slot destroys it too; another slot's temp file stays.
    func testRemovingASlotDestroysItsInterruptedTempFiles() throws {
        let (vault, _) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        let laptop = try vault.addPassphraseSlot(master: master, passphrase: secret("laptop words"), label: "laptop")
        let phone = try vault.addPassphraseSlot(master: master, passphrase: secret("phone words"), label: "phone")
        let own = try Data(contentsOf: URL(fileURLWithPath: slotsPath + "/" + SlotFile.fileName(id: laptop.id)))
        try own.write(to: URL(fileURLWithPath: slotsPath + "/.\(laptop.id).slot.tmp.42.ab"))
        try own.write(to: URL(fileURLWithPath: slotsPath + "/.\(phone.id).slot.tmp.42.cd"))
        try vault.removeSlot("laptop")
        XCTAssertEqual(try slotFileNames(), [".\(phone.id).slot.tmp.42.cd", SlotFile.fileName(id: phone.id)].sorted())
    }

    func testRemovingNeverTakesTheLastWayIn() throws {
        let (vault, recovery) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        let laptop = try vault.addPassphraseSlot(master: master, passphrase: secret("laptop words"), label: "laptop")
        XCTAssertThrowsError(try vault.removeSlot("nothing")) { XCTAssertEqual($0 as? VaultError, .slotNotFound("nothing")) }

        // The slots of coffer.conf go by their labels; the config is rewritten without them.
        try vault.removeSlot("passphrase")
        XCTAssertThrowsError(try vault.unlock(passphrase: secret(passphrase))) { XCTAssertEqual($0 as? VaultError, .wrongPassphrase) }
        XCTAssertEqual(try Vault.open(at: dir.path).config.slots.map(\.kind), ["recovery"])
        XCTAssertThrowsError(try vault.changePassphrase(master: master, newPassphrase: secret("x"))) {
            XCTAssertEqual($0 as? VaultError, .slotNotFound("passphrase"))
        }
        XCTAssertEqual(contentKey(try vault.unlock(passphrase: secret("laptop words"))), contentKey(master))
        try vault.removeSlot("recovery")
        XCTAssertThrowsError(try vault.unlock(recoveryKey: recovery)) { XCTAssertEqual($0 as? VaultError, .missingKeySlot(kind: "recovery")) }

        // One way in is left: refused, by label and by id, and the file is still there.
        XCTAssertFalse(try vault.leavesAWayIn(removing: "laptop"))
        XCTAssertThrowsError(try vault.removeSlot("laptop")) { XCTAssertEqual($0 as? VaultError, .lastWayIn("slot \"laptop\"")) }
        XCTAssertThrowsError(try vault.removeSlot(laptop.id)) { guard case .lastWayIn = $0 as? VaultError else { return XCTFail("\($0)") } }
        XCTAssertEqual(try slotFileNames(), [laptop.id + ".slot"])

        // With a second slot, either can go; by id here.
        let desk = try vault.addPassphraseSlot(master: master, passphrase: secret("desk words"), label: "desk")
        let report = try vault.removeSlot(laptop.id)
        XCTAssertEqual(report.destroyed, [SlotFile.directory + "/" + laptop.id + ".slot"])
        XCTAssertEqual(try slotFileNames(), [desk.id + ".slot"])
        XCTAssertThrowsError(try vault.unlock(passphrase: secret("laptop words"))) { XCTAssertEqual($0 as? VaultError, .wrongPassphrase) }
    }

    /// Two machines add slots to copies of one vault at the same time: each writes only
    /// its own file, so the merged directory (what a sync engine makes of it) holds both,
    /// and each passphrase opens it. The same label on both machines is two slots, which
    /// a removal by label refuses to choose between.
    func testTwoMachinesAddingSlotsMergeWithoutConflict() throws {
        let (vault, _) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        try vault.addPassphraseSlot(master: master, passphrase: secret("shared words"), label: "shared")
        let machineB = TempDirectory()
        XCTAssertEqual(Harnessless.copyTree(dir.path, to: machineB.path), 0)
        let onB = try Vault.open(at: machineB.path)

        let a = try vault.addPassphraseSlot(master: master, passphrase: secret("words of A"), label: "A")
        let b = try onB.addPassphraseSlot(master: master, passphrase: secret("words of B"), label: "B")
        let twinA = try vault.addPassphraseSlot(master: master, passphrase: secret("twin A"), label: "twin")
        let twinB = try onB.addPassphraseSlot(master: master, passphrase: secret("twin B"), label: "twin")
        // The sync: B's new files arrive beside A's; nothing has the same name.
        for record in [b, twinB] {
            let name = SlotFile.fileName(id: record.id)
            XCTAssertFalse(FileManager.default.fileExists(atPath: slotsPath + "/" + name))
            try FileManager.default.copyItem(atPath: machineB.path + "/" + SlotFile.directory + "/" + name, toPath: slotsPath + "/" + name)
        }
        let merged = try Vault.open(at: dir.path)
        XCTAssertEqual(merged.keySlots().count, 2 + 5)
        for words in [passphrase, "shared words", "words of A", "words of B", "twin A", "twin B"] {
            XCTAssertEqual(contentKey(try merged.unlock(passphrase: secret(words))), contentKey(master), words)
        }
        XCTAssertThrowsError(try merged.removeSlot("twin")) {
            XCTAssertEqual($0 as? VaultError, .slotAmbiguous(label: "twin", ids: [twinA.id, twinB.id].sorted()))
        }
        try merged.removeSlot(twinB.id)
        XCTAssertThrowsError(try merged.unlock(passphrase: secret("twin B")))
        XCTAssertEqual(contentKey(try merged.unlock(passphrase: secret("twin A"))), contentKey(master))
        _ = a
    }

    /// passwd of a labelled slot re-wraps it under a new salt in its own file, and
    /// destroys the copies a sync engine kept of it (which open with the old passphrase).
    /// A TPM2 binding as a TPM would give it, with made-up blobs (opaque to the vault).
    func binding(machine: String = "000b" + String(repeating: "11", count: 32), pcrs: [Int] = [0, 7]) -> SlotFile.TPM2Binding {
        SlotFile.TPM2Binding(publicBlob: Base64URL.encode(Array(repeating: 0x50, count: 78)),
                             privateBlob: Base64URL.encode(Array(repeating: 0x70, count: 158)), pcrs: pcrs, machine: machine)
    }

    func testAKeyedSlotOpensWithItsSlotKeyAndIsBoundToItsDeviceFields() throws {
        let (vault, _) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        let tpmKey = SecureBytes.random(count: SlotFile.slotKeySize), keyringKey = SecureBytes.random(count: SlotFile.slotKeySize)
        let tpm = try vault.addKeyedSlot(kind: SlotFile.tpm2Kind, id: Vault.newSlotID(), label: "this laptop's TPM",
                                         master: master, slotKey: tpmKey, tpm2: binding())
        let keyring = try vault.addKeyedSlot(kind: SlotFile.keyringKind, id: Vault.newSlotID(), label: "keyring",
                                             master: master, slotKey: keyringKey)
        let reopened = try Vault.open(at: dir.path)
        XCTAssertEqual(reopened.keyedSlots(kind: SlotFile.tpm2Kind), [tpm])
        XCTAssertEqual(reopened.keyedSlots(kind: SlotFile.keyringKind), [keyring])
        XCTAssertEqual(reopened.keySlots().filter(\.usable).count, 4, "tpm2 and keyring slots are known kinds")
        XCTAssertEqual(contentKey(try reopened.unlock(slotKey: tpmKey, slot: tpm.id)), contentKey(master))
        XCTAssertEqual(contentKey(try reopened.unlock(slotKey: keyringKey, slot: keyring.id)), contentKey(master))
        // A slot key opens its own slot only; a short key is refused, not a crash.
        for (key, id, what) in [(keyringKey, tpm.id, "another slot's key"), (tpmKey, keyring.id, "the TPM key for the keyring"),
                                (secret("short"), tpm.id, "a short key"), (tpmKey, String(repeating: "0", count: 32), "no such slot")] {
            XCTAssertThrowsError(try reopened.unlock(slotKey: key, slot: id), what) { XCTAssertEqual($0 as? VaultError, .wrongSlotKey) }
        }
        // A passphrase never opens a keyed slot: it is tried on passphrase slots alone.
        XCTAssertThrowsError(try reopened.unlock(passphrase: secret("anything"))) { XCTAssertEqual($0 as? VaultError, .wrongPassphrase) }

        // Every device field is bound by the AD: an edited one makes the slot open nothing.
        let name = SlotFile.fileName(id: tpm.id)
        let original = try Sys.readFile(SlotFile.directory + "/" + name, in: dir.fd)
        let edits: [(String, (inout SlotFile) -> Void)] = [
            ("machine", { $0.tpm2?.machine = "000b" + String(repeating: "22", count: 32) }),
            ("pcrs", { $0.tpm2?.pcrs = [7] }),
            ("public", { $0.tpm2?.publicBlob = Base64URL.encode(Array(repeating: 0x51, count: 78)) }),
            ("private", { $0.tpm2?.privateBlob = Base64URL.encode(Array(repeating: 0x71, count: 158)) }),
            ("kind", { $0.kind = SlotFile.keyringKind }),
            ("label", { $0.label = "another TPM" }),
        ]
        for (what, edit) in edits {
            var edited = try SlotFile.parse(original)
            edit(&edited)
            chmod(slotsPath + "/" + name, 0o600)
            try Data(edited.serialized()).write(to: URL(fileURLWithPath: slotsPath + "/" + name))
            XCTAssertThrowsError(try reopened.unlock(slotKey: tpmKey, slot: tpm.id), what) { XCTAssertEqual($0 as? VaultError, .wrongSlotKey) }
        }
    }

    /// A new vault with one tpm2 slot "tpm" (made-up blobs), its master key and slot key.
    func vaultWithTPM2Slot() throws -> (Vault, MasterKey, SecureBytes, SlotFile) {
        let (vault, _) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        let key = SecureBytes.random(count: SlotFile.slotKeySize)
        let record = try vault.addKeyedSlot(kind: SlotFile.tpm2Kind, id: Vault.newSlotID(), label: "tpm", master: master,
                                            slotKey: key, tpm2: binding())
        return (vault, master, key, record)
    }

    func testKeyedRecordsOfTheWrongShapeAreSkipped() throws {
        let (vault, _, _, record) = try vaultWithTPM2Slot()
        let edits: [(String, (inout SlotFile) -> Void, String)] = [
            ("no tpm2 object", { $0.tpm2 = nil }, "without its tpm2 object"),
            ("a KDF", { $0.kdf = vault.config.kdf }, "with a KDF"),
            ("PCR 24", { $0.tpm2?.pcrs = [0, 24] }, "pcrs are indexes"),
            ("PCRs out of order", { $0.tpm2?.pcrs = [7, 0] }, "pcrs are indexes"),
            ("sha1 bank", { $0.tpm2?.pcrBank = "sha1" }, "bank"),
            ("machine in capitals", { $0.tpm2?.machine = "000B" + String(repeating: "AA", count: 32) }, "machine"),
            ("an empty blob", { $0.tpm2?.privateBlob = "" }, "public and private"),
        ]
        for (what, edit, problem) in edits {
            var edited = record
            edit(&edited)
            XCTAssertThrowsError(try SlotFile.parse(edited.serialized()), what) {
                XCTAssertTrue("\($0)".contains(problem), "\(what): \($0)")
            }
        }
        XCTAssertEqual(try SlotFile.parse(record.serialized()), record)
    }

    func testTwoMachinesAddingDeviceSlotsMergeWithoutConflict() throws {
        let (vault, _) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        let machineB = TempDirectory()
        XCTAssertEqual(Harnessless.copyTree(dir.path, to: machineB.path), 0)
        let onB = try Vault.open(at: machineB.path)
        // At the same time: each machine seals a slot key to its own TPM and keeps one in its keyring.
        let keys = (0..<4).map { _ in SecureBytes.random(count: SlotFile.slotKeySize) }
        let tpmA = try vault.addKeyedSlot(kind: SlotFile.tpm2Kind, id: Vault.newSlotID(), label: "A's TPM", master: master,
                                          slotKey: keys[0], tpm2: binding(machine: "000b" + String(repeating: "aa", count: 32)))
        let keyringA = try vault.addKeyedSlot(kind: SlotFile.keyringKind, id: Vault.newSlotID(), label: "A's keyring",
                                              master: master, slotKey: keys[1])
        let tpmB = try onB.addKeyedSlot(kind: SlotFile.tpm2Kind, id: Vault.newSlotID(), label: "B's TPM", master: master,
                                        slotKey: keys[2], tpm2: binding(machine: "000b" + String(repeating: "bb", count: 32)))
        let keyringB = try onB.addKeyedSlot(kind: SlotFile.keyringKind, id: Vault.newSlotID(), label: "B's keyring",
                                            master: master, slotKey: keys[3])
        // The sync, both ways: each side's new files arrive beside the other's; no name is on both sides.
        for (from, to) in [(machineB.path, dir.path), (dir.path, machineB.path)] {
            for name in try FileManager.default.contentsOfDirectory(atPath: from + "/" + SlotFile.directory) {
                let target = to + "/" + SlotFile.directory + "/" + name
                if FileManager.default.fileExists(atPath: target) { continue }
                try FileManager.default.copyItem(atPath: from + "/" + SlotFile.directory + "/" + name, toPath: target)
            }
        }
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: machineB.path + "/" + SlotFile.directory).sorted(),
                       try slotFileNames())
        XCTAssertEqual(try slotFileNames().count, 4, "four files, none written by both machines")
        for path in [dir.path, machineB.path] {
            let merged = try Vault.open(at: path)
            XCTAssertEqual(merged.keyedSlots(kind: SlotFile.tpm2Kind).map(\.id).sorted(), [tpmA.id, tpmB.id].sorted())
            for (key, slot) in zip(keys, [tpmA, keyringA, tpmB, keyringB]) {
                XCTAssertEqual(contentKey(try merged.unlock(slotKey: key, slot: slot.id)), contentKey(master), slot.label)
            }
        }
    }

    func testADeviceSlotIsAWayInAndNeverTheLastRemoved() throws {
        let (vault, master, key, tpm) = try vaultWithTPM2Slot()
        try vault.removeSlot(VaultConfig.passphraseSlot)
        try vault.removeSlot(VaultConfig.recoverySlot)
        XCTAssertThrowsError(try vault.removeSlot("tpm")) { XCTAssertEqual($0 as? VaultError, .lastWayIn("slot \"tpm\"")) }
        XCTAssertEqual(try vault.slotFile("tpm"), tpm)
        XCTAssertEqual(contentKey(try vault.unlock(slotKey: key, slot: tpm.id)), contentKey(master))
    }

    func testPasswdOfOneSlotReplacesItAndItsCopies() throws {
        let (vault, _) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        let record = try vault.addPassphraseSlot(master: master, passphrase: secret("old words"), label: "laptop")
        let name = SlotFile.fileName(id: record.id)
        let copy = record.id + ".sync-conflict-20261126-101500-ABCDEFG.slot"
        try FileManager.default.copyItem(atPath: slotsPath + "/" + name, toPath: slotsPath + "/" + copy)
        XCTAssertEqual(contentKey(try vault.unlock(passphrase: secret("old words"))), contentKey(master))

        XCTAssertEqual(try vault.passphraseSlotToChange("laptop"), "laptop")
        XCTAssertThrowsError(try vault.passphraseSlotToChange("recovery")) { XCTAssertEqual($0 as? VaultError, .slotNotFound("recovery")) }
        let report = try vault.changePassphrase(master: master, newPassphrase: secret("new words"), slot: "laptop")
        XCTAssertEqual(report.destroyed, [SlotFile.directory + "/" + copy])
        XCTAssertEqual(try slotFileNames(), [name])
        let changed = try SlotFile.parse(try Sys.readFile(SlotFile.directory + "/" + name, in: dir.fd))
        XCTAssertEqual(changed.id, record.id)
        XCTAssertEqual(changed.label, "laptop")
        XCTAssertNotEqual(changed.kdf?.salt, record.kdf?.salt)
        XCTAssertThrowsError(try vault.unlock(passphrase: secret("old words"))) { XCTAssertEqual($0 as? VaultError, .wrongPassphrase) }
        XCTAssertEqual(contentKey(try vault.unlock(passphrase: secret("new words"))), contentKey(master))
        // The passphrase of coffer.conf is untouched.
        XCTAssertEqual(contentKey(try vault.unlock(passphrase: secret(passphrase))), contentKey(master))
    }

    /// What another writer leaves in coffer.slots is never followed, opened or served
    /// (a FIFO would hang a reader that opened it), nor a reason to fail the unlock.
    func testHostileEntriesAreSkipped() throws {
        let (vault, _) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        let record = try vault.addPassphraseSlot(master: master, passphrase: secret("good"), label: "good")
        outside.write("outside.slot", try Sys.readFile(SlotFile.directory + "/" + SlotFile.fileName(id: record.id), in: dir.fd))
        XCTAssertEqual(mkfifo(slotsPath + "/fifo.slot", 0o600), 0)
        XCTAssertEqual(symlink(outside.path + "/outside.slot", slotsPath + "/link.slot"), 0)
        XCTAssertEqual(mkdir(slotsPath + "/dir.slot", 0o700), 0)
        try Data("{\"not\": \"a slot\"}".utf8).write(to: URL(fileURLWithPath: slotsPath + "/junk.slot"))
        try Data(repeating: 0x41, count: SlotFile.sizeLimit + 1).write(to: URL(fileURLWithPath: slotsPath + "/huge.slot"))
        var future = try SlotFile.parse(try Sys.readFile(SlotFile.directory + "/" + SlotFile.fileName(id: record.id), in: dir.fd))
        future.kind = "fido2"  // a kind this build does not know (tpm2 and keyring it does)
        future.label = "future"
        future.id = String(repeating: "0f", count: 16)
        try Data(future.serialized()).write(to: URL(fileURLWithPath: slotsPath + "/future.slot"))

        let entries = vault.slotEntries()
        XCTAssertEqual(entries.filter { if case .success = $0.record { return true }; return false }.map(\.name).sorted(),
                       ["future.slot", SlotFile.fileName(id: record.id)].sorted())
        XCTAssertEqual(entries.count, 7)
        XCTAssertEqual(vault.keySlots().first { $0.label == "future" }?.usable, false)
        XCTAssertEqual(contentKey(try vault.unlock(passphrase: secret("good"))), contentKey(master))
        XCTAssertThrowsError(try vault.unlock(passphrase: secret("bad"))) { XCTAssertEqual($0 as? VaultError, .wrongPassphrase) }
        // A slot of an unknown kind is no way in this build can count on.
        try vault.removeSlot("passphrase")
        try vault.removeSlot("recovery")
        XCTAssertThrowsError(try vault.removeSlot("good")) { guard case .lastWayIn = $0 as? VaultError else { return XCTFail("\($0)") } }

        // coffer.slots itself as a symlink to a directory of slots: not followed.
        try FileManager.default.moveItem(atPath: slotsPath, toPath: outside.path + "/moved")
        XCTAssertEqual(symlink(outside.path + "/moved", slotsPath), 0)
        XCTAssertTrue(vault.slotEntries().isEmpty)
        XCTAssertThrowsError(try vault.unlock(passphrase: secret("good"))) { XCTAssertEqual($0 as? VaultError, .wrongPassphrase) }
    }

    /// Wipe destroys every regular file in coffer.slots whatever its name, reaches them
    /// without following a symlink, never overwrites through another hard link, and
    /// removes the directory once it is empty.
    /// Writes `record` into coffer.slots as `name` (mode 0400), as someone who can write
    /// CIPHERDIR may.
    func plant(_ record: SlotFile, as name: String) throws {
        let path = slotsPath + "/" + name
        XCTAssertTrue(FileManager.default.createFile(atPath: path, contents: Data(record.serialized()), attributes: [.posixPermissions: 0o400]))
    }

    /// A slot file with the KDF ceiling's costs, named to sort first, is passed over by an
    /// unlock (it never runs Argon2id at 4 GiB), named by the plan, and tried with --slot.
    func testASlotFileCostlierThanTheVaultIsTriedOnlyWhenNamed() throws {
        let (vault, _) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        let laptop = try vault.addPassphraseSlot(master: master, passphrase: secret("laptop words"), label: "laptop")
        var costly = laptop
        costly.id = String(repeating: "f", count: 32)
        costly.kdf!.opsLimit = KDFParameters.ceiling.opsLimit
        costly.kdf!.memLimit = KDFParameters.ceiling.memLimit
        try plant(costly, as: "0-planted.slot")
        let derived = Mutex<[KDFParameters]>([])
        let counting: Vault.KeyDerivation = { words, salt, parameters in
            derived.withLock { $0.append(parameters) }
            guard parameters.memLimit <= vault.config.kdf.memLimit else { throw CryptoError.kdfFailed }
            return try Vault.deriveInProcess(words, salt, parameters)
        }
        let reopened = try Vault.open(at: dir.path)
        XCTAssertEqual(contentKey(try reopened.unlock(passphrase: secret("laptop words"), derive: counting)), contentKey(master))
        XCTAssertThrowsError(try reopened.unlock(passphrase: secret("a typo"), derive: counting)) {
            XCTAssertEqual($0 as? VaultError, .wrongPassphrase)
        }
        XCTAssertTrue(derived.withLock { $0 }.allSatisfy { $0 == vault.config.kdf.parameters }, "\(derived.withLock { $0 })")
        let skipped = reopened.passphrasePlan().skipped
        XCTAssertEqual(skipped.map(\.name), ["coffer.slots/0-planted.slot"])
        XCTAssertTrue(skipped.first?.reason.contains("above the vault's") ?? false, "\(skipped)")
        // Named with --slot, the costly record alone is tried (here: it fails to open).
        derived.withLock { $0 = [] }
        XCTAssertThrowsError(try reopened.unlock(passphrase: secret("laptop words"), derive: counting, slot: costly.id))
        XCTAssertEqual(derived.withLock { $0 }, [KDFParameters.ceiling])
    }

    /// Slot files planted by the dozen cost an unlock at most `maxDerivations` runs, and a
    /// slot's own file is tried before copies of it named to sort first.
    func testAnUnlockHasABudgetAndTriesASlotsOwnFileFirst() throws {
        let (vault, _) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        let laptop = try vault.addPassphraseSlot(master: master, passphrase: secret("laptop words"), label: "laptop")
        for i in 0..<12 {
            var copy = laptop
            copy.kdf!.salt = Base64URL.encode(SecureBytes.random(count: 16).withUnsafeBytes { Array($0) })
            try plant(copy, as: "\(laptop.id) (conflicted copy \(i)).slot")
        }
        let derived = Mutex(0)
        let counting: Vault.KeyDerivation = { words, salt, parameters in
            derived.withLock { $0 += 1 }
            return try Vault.deriveInProcess(words, salt, parameters)
        }
        let reopened = try Vault.open(at: dir.path)
        XCTAssertEqual(contentKey(try reopened.unlock(passphrase: secret("laptop words"), derive: counting)), contentKey(master))
        XCTAssertEqual(derived.withLock { $0 }, 2, "the config's slot, then the slot's own file")
        derived.withLock { $0 = 0 }
        XCTAssertThrowsError(try reopened.unlock(passphrase: secret("a typo"), derive: counting))
        XCTAssertEqual(derived.withLock { $0 }, UnlockPlan.maxDerivations)
        XCTAssertEqual(reopened.passphrasePlan().skipped.count, 13 + 1 - UnlockPlan.maxDerivations)
    }

    func testWipeDestroysEverySlotFile() throws {
        let (vault, recovery) = try makeVault()
        let master = try vault.unlock(passphrase: secret(passphrase))
        let one = try vault.addPassphraseSlot(master: master, passphrase: secret("one"), label: "one")
        let two = try vault.addPassphraseSlot(master: master, passphrase: secret("two"), label: "two")
        let copy = one.id + " (conflicted copy 2026-11-26).slot"
        try FileManager.default.copyItem(atPath: slotsPath + "/" + SlotFile.fileName(id: one.id), toPath: slotsPath + "/" + copy)
        dir.write(SlotFile.directory + "/.\(two.id).slot.tmp.1.ff", [1, 2, 3])
        let report = try vault.wipe()
        let slotNames = [SlotFile.fileName(id: one.id), SlotFile.fileName(id: two.id), copy, ".\(two.id).slot.tmp.1.ff"]
        XCTAssertEqual(Set(report.destroyed), Set([VaultConfig.fileName] + slotNames.map { SlotFile.directory + "/" + $0 }))
        XCTAssertTrue(report.notDestroyed.isEmpty && report.leftAlone.isEmpty, "\(report)")
        XCTAssertFalse(FileManager.default.fileExists(atPath: slotsPath))
        // An empty vault wiped holds only its root's IV file, as an init cut short does.
        XCTAssertThrowsError(try Vault.open(at: dir.path)) { XCTAssertEqual($0 as? VaultError, .interruptedInit(path: dir.path)) }
        _ = recovery

        // A hard link to a file elsewhere, a FIFO and a subdirectory planted in coffer.slots.
        let victim = outside.path + "/victim"
        outside.write("victim", Array("the victim's bytes".utf8))
        XCTAssertEqual(mkdir(slotsPath, 0o700), 0)
        XCTAssertEqual(link(victim, slotsPath + "/linked.slot"), 0)
        XCTAssertEqual(mkfifo(slotsPath + "/fifo.slot", 0o600), 0)
        dir.write(SlotFile.directory + "/plain.slot", Array(repeating: 0x41, count: 300))
        let second = try Vault.destroyKeySlots(in: dir.fd, includingConfig: true)
        XCTAssertEqual(second.destroyed, [SlotFile.directory + "/plain.slot"])
        XCTAssertEqual(second.notDestroyed.map(\.name), [SlotFile.directory + "/linked.slot"])
        XCTAssertEqual(second.leftAlone.map(\.name), [SlotFile.directory + "/fifo.slot"])
        XCTAssertEqual(outside.read("victim"), Array("the victim's bytes".utf8))
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: slotsPath), ["fifo.slot"])

        // coffer.slots as a symlink: left alone, nothing behind it touched.
        try FileManager.default.removeItem(atPath: slotsPath)
        outside.write("behind.slot", [9, 9])
        XCTAssertEqual(symlink(outside.path, slotsPath), 0)
        let third = try Vault.destroyKeySlots(in: dir.fd, includingConfig: true)
        XCTAssertEqual(third.leftAlone.map(\.name), [SlotFile.directory])
        XCTAssertEqual(outside.read("behind.slot"), [9, 9])
        // passwd's clean-up of the config's copies never reaches the slots.
        XCTAssertTrue(try Vault.destroyKeySlots(in: dir.fd, includingConfig: false).leftAlone.isEmpty)
    }
}

/// A copy of a directory tree as a sync engine would carry it (cp -a).
enum Harnessless {
    static func copyTree(_ from: String, to: String) -> Int32 {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/cp")
        process.arguments = ["-a", from + "/.", to]
        guard (try? process.run()) != nil else { return -1 }
        process.waitUntilExit()
        return process.terminationStatus
    }
}

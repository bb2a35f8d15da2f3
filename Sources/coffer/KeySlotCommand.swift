// KeySlotCommand lists, adds and removes a vault's key slots (`coffer keyslot`), on
// CIPHERDIR itself, mounted or not: a mount reads the slots anew at every unlock.
import ArgumentParser
import CofferCrypto
import CofferTPM
import CofferVault
import Foundation

struct KeySlotCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keyslot",
        abstract: "List, add and remove a vault's key slots (several passphrases, this machine's TPM, your keyring).",
        discussion: """
            A vault has the passphrase and recovery slots of coffer.conf and any number of \
            labelled slots (passphrases, slot keys sealed to a machine's TPM or kept in a \
            desktop keyring), each in a file of its own in CIPHERDIR/coffer.slots, \
            so that two machines adding or removing slots at once never write the same file. \
            These commands work on CIPHERDIR, whether or not it is mounted: a mount tries \
            every slot at each unlock.
            """,
        subcommands: [KeySlotList.self, KeySlotAdd.self, KeySlotRemove.self])
}

struct KeySlotList: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "List the key slots (no secret needed): kind, label, id, where it is kept.")

    @Argument(help: "The vault's backing directory.")
    var cipherdir: String

    func run() throws {
        try runReportingFailures {
            let vault = try Vault.open(at: cipherdir)
            let slots = vault.keySlots()
            // This machine's TPM, asked only if a slot needs it: which tpm2 slots are its own.
            let identity = slots.contains { $0.tpm2 != nil } ? try? TPM2().machineIdentity() : nil
            print("KIND        LABEL                 ID                                WHERE")
            for slot in slots {
                let kind = !slot.usable ? "\(slot.kind) (unknown kind, skipped)"
                    : slot.tpm2.map { "\(slot.kind) (\(TPM2Slots.note($0, identity: identity)))" } ?? slot.kind
                print(kind.padding(toLength: max(11, kind.count), withPad: " ", startingAt: 0) + " "
                      + slot.label.padding(toLength: max(21, slot.label.count), withPad: " ", startingAt: 0) + " "
                      + (slot.id ?? "-").padding(toLength: 33, withPad: " ", startingAt: 0) + " " + slot.location)
            }
            for skipped in vault.passphrasePlan().skipped {
                print("\(skipped.name): passed over at a passphrase unlock: \(skipped.reason)")
            }
            // Entries that hold no slot stop nothing: each is named on stderr.
            for entry in vault.slotEntries() {
                if case .failure(let problem) = entry.record {
                    FileHandleStandardError.write("coffer: keyslot list: \(cipherdir)/\(SlotFile.directory)/\(entry.name): \(problem); not a slot\n")
                }
            }
        }
    }
}

struct KeySlotAdd: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "add",
        abstract: "Add a passphrase, TPM2 or keyring slot with a label (needs an existing way in).",
        discussion: """
            The existing way in comes from --passfile, --extpass, --recovery-key-file, \
            --with-tpm2 or --with-keyring; the \
            new passphrase from --new-passfile or --new-extpass. Without them, both are asked \
            on the terminal, or read as the first and second lines of standard input. The slot \
            is one new file, coffer.slots/<id>.slot, written atomically and synced; nothing \
            else in CIPHERDIR changes. With --tpm2, no new passphrase: a random slot key is \
            sealed to this machine's TPM (the device COFFER_TPM2_TCTI names, by default \
            /dev/tpmrm0), with --tpm2-pcrs to the current values of those PCRs too, and \
            `coffer unlock --tpm2` opens the vault on this machine alone. With --keyring, a \
            random slot key goes into your desktop keyring (never the passphrase), and \
            `coffer unlock --keyring` opens the vault while the keyring is unlocked; removing \
            the slot clears the item too.
            """)

    @OptionGroup var secret: OfflineUnlock

    @Option(name: .long, help: "The new slot's label (1–64 bytes, unique in the vault), such as the machine or person it is for.")
    var label: String

    @Option(name: .long, help: "Read the new slot's passphrase from this file.")
    var newPassfile: String?

    @Option(name: .long, parsing: .unconditionalSingleValue, help: ArgumentHelp(
        "Run this command (as --extpass) and read the new slot's passphrase from its output.",
        valueName: "command"))
    var newExtpass: [String] = []

    @Flag(name: .long, help: "Add a slot sealed to this machine's TPM instead of a passphrase slot.")
    var tpm2 = false

    @Flag(name: .long,
          help: "Add a slot whose random key your desktop keyring keeps (the Secret Service's default collection) instead of a passphrase slot.")
    var keyring = false

    @Option(name: .long, help: ArgumentHelp(
        "With --tpm2: seal to the current values of these PCRs (sha256 bank), such as 7 or 0,7 (default 7, the Secure Boot state); "
            + "the slot stops opening when one changes. \"none\": no PCR, the slot opens whatever boots this machine.",
        valueName: "list"))
    var tpm2Pcrs: String?

    @Argument(help: "The vault's backing directory.")
    var cipherdir: String

    func validate() throws {
        if newPassfile != nil && !newExtpass.isEmpty {
            throw ValidationError("give --new-passfile or --new-extpass, not both")
        }
        if tpm2 && keyring { throw ValidationError("give --tpm2 or --keyring, not both") }
        if (tpm2 || keyring) && (newPassfile != nil || !newExtpass.isEmpty) {
            throw ValidationError("--\(tpm2 ? "tpm2" : "keyring") adds a slot without a passphrase: give it without --new-passfile or --new-extpass")
        }
        if let tpm2Pcrs {
            guard tpm2 else { throw ValidationError("--tpm2-pcrs goes with --tpm2") }
            guard TPM2Slots.parsePCRs(tpm2Pcrs) != nil else {
                throw ValidationError("--tpm2-pcrs takes PCR indexes 0–23 separated by commas, each once, such as 0,7, or none")
            }
        }
        if let problem = SlotFile.labelProblem(label) { throw ValidationError("--label: \(problem)") }
    }

    func run() throws {
        try runReportingFailures {
            let vault = try Vault.open(at: cipherdir)
            if vault.keySlots().contains(where: { $0.label == label }) { throw VaultError.slotLabelTaken(label) }
            // The TPM is opened before any secret is asked: no TPM, nothing to ask.
            let tpm = tpm2 ? try TPM2() : nil
            let master = try secret.masterKey(of: vault, prompt: "Existing passphrase: ")
            defer { master.wipe() }
            if let tpm {
                let pcrs = tpm2Pcrs.flatMap(TPM2Slots.parsePCRs) ?? TPM2Slots.defaultPCRs
                let record = try TPM2Slots.add(to: vault, tpm: tpm, master: master, label: label, pcrs: pcrs)
                let bound = pcrs.isEmpty ? "no PCR: it opens whatever boots this machine"
                    : "PCRs \(pcrs.map(String.init).joined(separator: ",")): it stops opening when one changes"
                print("Added TPM2 slot \"\(label)\" (id \(record.id)) to \(cipherdir), sealed to this machine's TPM and \(bound).")
                return
            }
            if keyring {
                let record = try KeyringSlots.add(to: vault, master: master, label: label)
                print("Added keyring slot \"\(label)\" (id \(record.id)) to \(cipherdir); its key is in your desktop keyring.")
                return
            }
            let new = try newPassfile.map { try PassphraseReader.fromFile($0) }
                ?? (newExtpass.isEmpty ? nil : ExternalPassphrase.read(newExtpass))
                ?? PassphraseReader.interactive(prompt: "New slot's passphrase: ", confirm: true)
            defer { new.wipe() }
            let record = try vault.addPassphraseSlot(master: master, passphrase: new, label: label)
            print("Added passphrase slot \"\(label)\" (id \(record.id)) to \(cipherdir).")
        }
    }
}

struct KeySlotRemove: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "remove",
        abstract: "Remove a key slot by label or id (needs a way in; the last way in is never removed).",
        discussion: """
            --slot passphrase and --slot recovery remove the slots kept in coffer.conf (the \
            config is rewritten atomically); any other label or id removes a slot file and the \
            copies a sync engine kept of it, each overwritten with random bytes, synced and \
            removed, as wipe does. Removing the vault's last usable slot is refused with exit \
            status 50. The secret that proves the way in may be the removed slot's own. \
            Removing a keyring slot also deletes its item from your desktop keyring (if the \
            keyring cannot be reached, the slot is removed and the item left is named).
            """)

    @OptionGroup var secret: OfflineUnlock

    @Option(name: .long, help: ArgumentHelp("The label or id of the slot to remove (coffer keyslot list shows them).", valueName: "label-or-id"))
    var slot: String

    @Argument(help: "The vault's backing directory.")
    var cipherdir: String

    func run() throws {
        try runReportingFailures {
            let vault = try Vault.open(at: cipherdir)
            // Refused before any secret is asked: a missing slot or the last way in.
            guard try vault.leavesAWayIn(removing: slot) else { throw VaultError.lastWayIn("slot \"\(slot)\"") }
            let master = try secret.masterKey(of: vault, prompt: "Passphrase: ")
            master.wipe()
            let removed = try vault.slotFile(slot)
            let report = try vault.removeSlot(slot)
            if let removed, removed.kind == SlotFile.keyringKind { KeyringSlots.clearItem(of: removed, in: vault) }
            for entry in report.leftAlone + report.notDestroyed {
                FileHandleStandardError.write("coffer: keyslot remove: \(cipherdir)/\(entry)\n")
            }
            print("Removed key slot \"\(slot)\" from \(cipherdir).")
            if !report.notDestroyed.isEmpty {
                throw CommandFailure(status: .wipeIncomplete,
                                     message: "\(cipherdir): \(report.notDestroyed.count) copies of the slot could not be overwritten "
                                         + "(named above); their names were removed")
            }
        }
    }
}

// KeyringSlots adds key slots whose slot key the user's desktop keyring keeps (`keyslot
// add --keyring`), opens them (`unlock --keyring`) and clears the keyring's item when such
// a slot is removed. The keyring holds a random slot key, never the passphrase: removing
// the slot revokes it, and no passphrase is ever stored.
import CofferCrypto
import CofferKeyring
import CofferVault
import Foundation

enum KeyringSlots {
    /// Stores a new random slot key in the keyring and adds the keyring slot `label` that
    /// it opens. If the slot file cannot be written, the item is taken back out.
    static func add(to vault: Vault, master: MasterKey, label: String) throws -> SlotFile {
        try vault.checkNewLabel(label)
        let id = Vault.newSlotID()
        let slotKey = SecureBytes.random(count: SlotFile.slotKeySize)
        defer { slotKey.wipe() }
        try Keyring.store(slotKey, vault: vault.config.checksum, slot: id,
                          label: "coffer: key slot \"\(label)\" of vault \(vault.config.checksum.prefix(12))")
        do {
            return try vault.addKeyedSlot(kind: SlotFile.keyringKind, id: id, label: label, master: master, slotKey: slotKey)
        } catch {
            try? Keyring.clear(vault: vault.config.checksum, slot: id)
            throw error
        }
    }

    /// Clears the keyring item of the removed keyring slot `record`, best effort: what
    /// went wrong is said on stderr (the slot file is gone, so the item opens nothing).
    static func clearItem(of record: SlotFile, in vault: Vault) {
        do {
            try Keyring.clear(vault: vault.config.checksum, slot: record.id)
        } catch KeyringError.notFound {
            // Not in this user's keyring: added on another machine, or cleared already.
        } catch {
            FileHandleStandardError.write("coffer: keyslot remove: the keyring item of slot \"\(record.label)\" was not cleared (\(error)); "
                                          + "the slot is gone, so the item opens nothing: "
                                          + "remove it with secret-tool clear -- vault \(vault.config.checksum) slot \(record.id)\n")
        }
    }

    /// Offers the slot key of each keyring slot of the vault that the user's keyring has
    /// an item for to `body`, in turn, until it returns a result. Throws `noKeyringSlot`
    /// if none has one, and the keyring's failure if it cannot be asked (`keyringUnavailable`).
    /// Each slot key is wiped after its turn.
    static func withSlotKey<R>(of vault: Vault, _ body: (SlotFile, SecureBytes) throws -> R?) throws -> R {
        let slots = vault.keyedSlots(kind: SlotFile.keyringKind)
        guard !slots.isEmpty else {
            throw CommandFailure(status: .noKeyringSlot, message: "\(vault.path) has no keyring slot (coffer keyslot add --keyring adds one)")
        }
        var refused = 0
        for slot in slots {
            let slotKey: SecureBytes
            do {
                slotKey = try Keyring.lookup(vault: vault.config.checksum, slot: slot.id, size: SlotFile.slotKeySize)
            } catch KeyringError.notFound {
                continue
            }
            defer { slotKey.wipe() }
            if let result = try body(slot, slotKey) { return result }
            refused += 1
        }
        if refused > 0 {
            throw CommandFailure(status: .wrongSlotKey,
                                 message: "your keyring gave the keys of \(refused) keyring slot\(refused == 1 ? "" : "s") of \(vault.path), "
                                     + "but none opens the vault")
        }
        throw CommandFailure(status: .noKeyringSlot,
                             message: "your keyring holds the key of none of the \(slots.count) keyring slot\(slots.count == 1 ? "" : "s") "
                                 + "of \(vault.path) (added by another user or on another machine, or its item was deleted)")
    }
}

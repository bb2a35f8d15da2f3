// TPM2Slots adds key slots sealed to this machine's TPM (`keyslot add --tpm2`) and opens
// them (`unlock --tpm2`, `mount --unlock-tpm2`): the TPM unseals a slot's random slot key,
// which goes to the daemon (or opens the vault offline); the master key never leaves it.
import CofferCrypto
import CofferTPM
import CofferVault
import Foundation

enum TPM2Slots {
    /// The PCRs a TPM2 slot is sealed to unless `--tpm2-pcrs` says otherwise: 7, the Secure
    /// Boot state (as systemd-cryptenroll binds), so that a stolen disk booted another way
    /// does not unseal.
    static let defaultPCRs = [7]

    /// Parses `--tpm2-pcrs`: PCR indexes 0–23, separated by commas, each once; sorted.
    /// "none": no PCR (the slot opens on this machine whatever boots it).
    static func parsePCRs(_ text: String) -> [Int]? {
        if text == "none" { return [] }
        let parts = text.split(separator: ",", omittingEmptySubsequences: false).map { Int($0.trimmingCharacters(in: .whitespaces)) }
        guard !parts.isEmpty, parts.allSatisfy({ $0.map(SlotFile.TPM2Binding.pcrRange.contains) ?? false }) else { return nil }
        let pcrs = parts.compactMap { $0 }
        return Set(pcrs).count == pcrs.count ? pcrs.sorted() : nil
    }

    /// Seals a new random slot key to this TPM (and `pcrs`) and adds the tpm2 slot
    /// `label` that it opens. The TPM is opened first (`tpm`), before any secret is asked.
    static func add(to vault: Vault, tpm: TPM2, master: MasterKey, label: String, pcrs: [Int]) throws -> SlotFile {
        let slotKey = SecureBytes.random(count: SlotFile.slotKeySize)
        defer { slotKey.wipe() }
        let sealed = try tpm.seal(slotKey, pcrs: pcrs)
        let binding = SlotFile.TPM2Binding(publicBlob: Base64URL.encode(sealed.publicBlob), privateBlob: Base64URL.encode(sealed.privateBlob),
                                           pcrs: pcrs, machine: try tpm.machineIdentity())
        return try vault.addKeyedSlot(kind: SlotFile.tpm2Kind, id: Vault.newSlotID(), label: label, master: master,
                                      slotKey: slotKey, tpm2: binding)
    }

    /// What `keyslot list` says of a tpm2 slot beside its kind: "other machine" when this
    /// machine's TPM (`identity`; nil: no TPM here) did not seal it, and its PCRs.
    static func note(_ binding: SlotFile.TPM2Binding, identity: String?) -> String {
        let pcrs = binding.pcrs.isEmpty ? "no PCRs" : "PCRs \(binding.pcrs.map(String.init).joined(separator: ","))"
        guard let identity else { return "\(pcrs), no TPM here" }
        return binding.machine == identity ? pcrs : "other machine"
    }

    /// Offers the slot key of each of the vault's tpm2 slots that this machine's TPM
    /// unseals to `body`, in turn, until it returns a result (nil: that key opened
    /// nothing — a slot copied from another vault — and the next is tried). A slot of
    /// another machine (another TPM's name, or blobs this TPM will not load) is passed
    /// over quietly. Throws `wrongSlotKey` if keys were unsealed but none opened,
    /// `tpm2PolicyMismatch` if this machine's slots are sealed to PCRs that have changed,
    /// `noTPM2Slot` if no slot is this machine's. Each slot key is wiped after its turn.
    static func withSlotKey<R>(of vault: Vault, _ body: (SlotFile, SecureBytes) throws -> R?) throws -> R {
        let slots = vault.keyedSlots(kind: SlotFile.tpm2Kind)
        guard !slots.isEmpty else {
            throw CommandFailure(status: .noTPM2Slot, message: "\(vault.path) has no TPM2 slot (coffer keyslot add --tpm2 adds one)")
        }
        let tpm = try TPM2()
        let identity = try tpm.machineIdentity()
        var changedPCRs: [String] = []
        var refused = 0
        for slot in slots {
            guard let binding = slot.tpm2, binding.machine == identity else { continue }
            let slotKey: SecureBytes
            do {
                slotKey = try tpm.unseal(SealedObject(publicBlob: try Base64URL.decode(binding.publicBlob),
                                                      privateBlob: try Base64URL.decode(binding.privateBlob)),
                                         pcrs: binding.pcrs, size: SlotFile.slotKeySize)
            } catch TPM2Error.policyMismatch {
                changedPCRs.append("\"\(slot.label)\" (PCRs \(binding.pcrs.map(String.init).joined(separator: ",")))")
                continue
            } catch TPM2Error.notThisTPM {
                continue
            }
            defer { slotKey.wipe() }
            if let result = try body(slot, slotKey) { return result }
            refused += 1
        }
        if refused > 0 {
            throw CommandFailure(status: .wrongSlotKey,
                                 message: "this machine's TPM unsealed \(refused) TPM2 slot\(refused == 1 ? "" : "s") of \(vault.path), "
                                     + "but none opens the vault (a slot copied from another vault?)")
        }
        if !changedPCRs.isEmpty {
            throw CommandFailure(status: .tpm2PolicyMismatch,
                                 message: "the PCRs that TPM2 slot \(changedPCRs.joined(separator: ", ")) is sealed to have changed "
                                     + "since it was added (a firmware, boot loader or kernel update?); "
                                     + "unlock with a passphrase, then remove the slot and add it again with coffer keyslot add --tpm2")
        }
        throw CommandFailure(status: .noTPM2Slot,
                             message: "\(vault.path) has no TPM2 slot of this machine "
                                 + "(its \(slots.count) TPM2 slot\(slots.count == 1 ? " is" : "s are") another machine's)")
    }
}

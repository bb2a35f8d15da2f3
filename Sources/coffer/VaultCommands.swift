// VaultCommands work on CIPHERDIR itself: `coffer passwd`, `coffer fsck`, `coffer wipe`.
import ArgumentParser
import CofferCrypto
import CofferGate
import CofferSystem
import CofferVault
import Foundation
import Glibc

/// How an offline command (passwd, fsck) proves it may open the vault.
struct OfflineUnlock: ParsableArguments {
    @OptionGroup var source: PassphraseSource

    @Option(name: .long, help: "Use the recovery key in this file instead of the passphrase (forgotten passphrase).")
    var recoveryKeyFile: String?

    @Flag(name: .long, help: "Open the vault with this machine's TPM (one of its TPM2 slots) instead of a passphrase.")
    var withTpm2 = false

    @Flag(name: .long, help: "Open the vault with a slot key in your desktop keyring (one of its keyring slots) instead of a passphrase.")
    var withKeyring = false

    func validate() throws {
        try source.validate(recoveryKeyFile: recoveryKeyFile)
        if [source.isGiven, recoveryKeyFile != nil, withTpm2, withKeyring].filter({ $0 }).count > 1 {
            throw ValidationError("prove the way in one way: --passfile, --extpass, --recovery-key-file, --with-tpm2 or --with-keyring")
        }
    }

    /// Unwraps the master key with this machine's TPM or the keyring (if asked), the
    /// recovery key (if given), --passfile or --extpass, or a prompt.
    func masterKey(of vault: Vault, prompt: String) throws -> MasterKey {
        if withTpm2 || withKeyring {
            let open: (SlotFile, SecureBytes) throws -> MasterKey? = { slot, slotKey in
                do {
                    return try vault.unlock(slotKey: slotKey, slot: slot.id)
                } catch VaultError.wrongSlotKey {
                    return nil  // this record's key opens nothing: the next is tried
                }
            }
            return try withTpm2 ? TPM2Slots.withSlotKey(of: vault, open) : KeyringSlots.withSlotKey(of: vault, open)
        }
        if let recoveryKeyFile {
            let text = try PassphraseReader.fromFile(recoveryKeyFile, what: "recovery key")
            defer { text.wipe() }
            return try vault.unlock(recoveryKey: try RecoveryKey.parse(text))
        }
        let passphrase = try source.read()
            ?? PassphraseReader.interactive(prompt: prompt, confirm: false)
        defer { passphrase.wipe() }
        return try vault.unlock(passphrase: passphrase)
    }
}

struct PasswdCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "passwd",
        abstract: "Change a vault's passphrase (no re-encryption; the recovery key keeps working).",
        discussion: """
            Only the passphrase key slot is rewritten, atomically (new file, fsync, rename, \
            fsync of the directory); no copy of the old slot is kept. The current passphrase \
            comes from --passfile or --extpass, the new one from --new-passfile or \
            --new-extpass; without them, both are asked on the terminal, or read as the \
            first and second lines of standard input. With --slot LABEL, the labelled \
            passphrase slot (coffer keyslot) is rewritten instead, under a new salt, in its \
            own file; any way into the vault may authorise it.
            """)

    @OptionGroup var secret: OfflineUnlock

    @Option(name: .long, help: ArgumentHelp(
        "Change the passphrase of this labelled slot (a label or id from coffer keyslot list; default: the slot of coffer.conf).",
        valueName: "label-or-id"))
    var slot: String?

    @Option(name: .long, help: "Read the new passphrase from this file.")
    var newPassfile: String?

    @Option(name: .long, parsing: .unconditionalSingleValue, help: ArgumentHelp(
        "Run this command (as --extpass) and read the new passphrase from its output.",
        valueName: "command"))
    var newExtpass: [String] = []

    func validate() throws {
        if newPassfile != nil && !newExtpass.isEmpty {
            throw ValidationError("give --new-passfile or --new-extpass, not both")
        }
    }

    @Argument(help: "The vault's backing directory.")
    var cipherdir: String

    func run() throws {
        try runReportingFailures {
            let vault = try Vault.open(at: cipherdir)
            // A slot that is not there is refused before any secret is asked.
            let changed = try vault.passphraseSlotToChange(slot)
            let master = try secret.masterKey(of: vault, prompt: "Current passphrase: ")
            defer { master.wipe() }
            let new = try newPassfile.map { try PassphraseReader.fromFile($0) }
                ?? (newExtpass.isEmpty ? nil : ExternalPassphrase.read(newExtpass))
                ?? PassphraseReader.interactive(prompt: "New passphrase: ", confirm: true)
            defer { new.wipe() }
            let stale = try vault.changePassphrase(master: master, newPassphrase: new, slot: changed)
            print(slot == nil ? "Passphrase of \(cipherdir) changed." : "Passphrase of slot \"\(changed)\" of \(cipherdir) changed.")
            // Odd entries under the names of the config's copies stop no passwd: each is named.
            for entry in stale.leftAlone + stale.notDestroyed {
                FileHandleStandardError.write("coffer: passwd: \(cipherdir)/\(entry)\n")
            }
        }
    }
}

struct FsckCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fsck",
        abstract: "Verify every name, block, symlink and xattr of a vault (read-only unless --repair).",
        discussion: """
            Each problem is printed as the plaintext path (or the encrypted name, when the name \
            itself is damaged), what is wrong, and the block index: "damaged:" lines for damage \
            (exit status 40), "leftover:" lines for the harmless leftovers of a crash (orphan \
            long-name sidecars, temporary directories and files, blocks torn by a crash that \
            the undo journal puts back), which alone leave the exit status 0; "conflict:" lines \
            for the copies a sync engine kept of a file changed on two machines (exit status 0: \
            each is a version of the file, shown in the mount under its own name). With --repair \
            (the vault must not be mounted), the leftovers are removed or put right.
            """)

    @OptionGroup var secret: OfflineUnlock

    @Flag(name: .long, help: "Remove the harmless leftovers of a crash and put back torn blocks from the undo journal (needs the vault unmounted).")
    var repair = false

    @Option(name: .long, help: ArgumentHelp(
        "This machine's state directory for the vault, if the mount was given one (--state-dir).",
        valueName: "dir"))
    var stateDir: String?

    @Argument(help: "The vault's backing directory.")
    var cipherdir: String

    /// The undo journal this machine keeps for `vault` (in its state directory, or one an
    /// older coffer left in CIPHERDIR), if there is one; opened for writing only to repair.
    private func undoJournal(of vault: Vault) throws -> UndoJournal? {
        let root = vault.root.rawValue
        if UndoJournal.exists(in: root) { return try UndoJournal(directory: root, readOnly: !repair) }
        let found: String?
        do {
            found = try StateDirectory.forVault(vault, at: MountPoint.canonical(cipherdir) ?? cipherdir, given: stateDir,
                                                create: repair)
        } catch where stateDir == nil {
            return nil  // no state directory could be made: a mount kept its journal in CIPHERDIR
        } catch {
            throw CommandFailure(status: .stateDirectoryUnusable, message: "\(error)")
        }
        guard let path = found else { return nil }  // no mount of this vault ever kept state here
        let state = try FileDescriptor.open(path, flags: O_PATH | O_DIRECTORY | O_NOFOLLOW)
        guard repair || UndoJournal.exists(in: state.rawValue) else { return nil }
        return try UndoJournal(directory: state.rawValue, data: root, readOnly: !repair)
    }

    func run() throws {
        try runReportingFailures {
            let vault = try Vault.open(at: cipherdir)
            try vault.checkCipherAvailable()
            // Repairing writes: no daemon may serve the vault meanwhile.
            let claim = repair ? try VaultClaim(vault) : nil
            defer { withExtendedLifetime(claim) {} }
            let master = try secret.masterKey(of: vault, prompt: "Passphrase: ")
            let journal = try undoJournal(of: vault)
            let onTerminal = isatty(2) == 1
            let checker = VaultChecker(vault: vault, master: master, journal: journal, repair: repair, report: { problem in
                if onTerminal { FileHandleStandardError.write("\r\u{1b}[K") }
                print("\(problem.kind): \(problem)")
                fflush(nil)  // every stream: stdout before the raw write to fd 1 (stdout itself is a C global Swift 6 refuses)
            }, progress: { summary in
                guard onTerminal else { return }
                FileHandleStandardError.write(
                    "\r\u{1b}[Kchecking: \(summary.directories) directories, \(summary.files) files, \(summary.bytes >> 20) MiB")
            })
            master.wipe()
            let summary = checker.run()
            if onTerminal { FileHandleStandardError.write("\r\u{1b}[K") }
            let leftovers = summary.leftovers == 0 ? ""
                : "; \(summary.leftovers) harmless leftover\(summary.leftovers == 1 ? "" : "s") of a crash"
                    + "\(repair ? " repaired" : " (coffer fsck --repair removes them)")"
            let repaired = summary.repaired == 0 ? ""
                : "; \(summary.repaired) damaged director\(summary.repaired == 1 ? "y" : "ies") repaired (see above)"
            let conflicts = summary.conflicts == 0 ? ""
                : "; \(summary.conflicts) conflict cop\(summary.conflicts == 1 ? "y" : "ies") of a sync engine "
                    + "(each listed; rename or delete them as any file)"
            let arriving = summary.arriving == 0 ? ""
                : "; \(summary.arriving) director\(summary.arriving == 1 ? "y" : "ies") still arriving from a sync engine, not checked"
            let classed = summary.classed == 0 ? ""
                : "; \(summary.classed) director\(summary.classed == 1 ? "y" : "ies") of a protection class other than complete"
            let dropped = summary.dropped == 0 ? ""
                : "; \(summary.dropped) entr\(summary.dropped == 1 ? "y" : "ies") made while locked, not converted yet "
                    + "(a mount converts each when it lists its directory)"
            print("fsck: \(summary.directories) directories, \(summary.files) files, \(summary.bytes >> 20) MiB checked; "
                  + "\(summary.problems == 0 ? "no problems" : "\(summary.problems) problem\(summary.problems == 1 ? "" : "s")")"
                  + "\(repaired)\(leftovers)\(conflicts)\(arriving)\(classed)\(dropped)")
            // Every record a crash could need was applied or found unneeded.
            if repair && summary.problems == 0 { try journal?.trim(keepingPending: false) }
            if summary.problems > 0 {
                throw CommandFailure(status: .damageFound,
                                     message: "\(cipherdir): \(summary.problems) problem\(summary.problems == 1 ? "" : "s") found (listed above)")
            }
        }
    }
}

struct WipeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "wipe",
        abstract: "Crypto-erase a vault: destroy its key slots so nothing in it can ever be decrypted.",
        discussion: """
            Asks you to type the vault directory's name unless --yes. Every copy of the key \
            slots (coffer.conf, its temp and conflict copies, every file in coffer.slots) is overwritten and removed; \
            what else is found under their names is left alone and named. Every running \
            daemon of the vault is locked for good, or ended (SIGTERM, then SIGKILL); one that \
            can be neither is named and the exit status is 39. A copy that could not be \
            overwritten (another hard link to it, not yours to write) is named and the exit \
            status is 47.
            """)

    @Flag(name: .long, help: "Do not ask for confirmation.")
    var yes = false

    @Argument(help: "The vault's backing directory.")
    var cipherdir: String

    /// A config that cannot be read stops no wipe: its copies and the daemons serving the
    /// vault are still there to be destroyed and locked.
    private static func isConfigProblem(_ error: VaultError) -> Bool {
        switch error {
        case .configMalformed, .configDamaged, .unsupportedFormat, .unsupportedParameter, .kdfParametersRefused, .missingKeySlot:
            return true
        default:
            return false
        }
    }

    /// The vault's directory, opened as a vault (its config read and checked) or, where
    /// only its config is wrong, as a directory, with a line that says so.
    /// With no config, a directory that still holds copies of it or slot files (a wipe
    /// cut short by an older coffer, which destroyed the config first) is wiped too.
    private func openVaultDirectory() throws -> FileDescriptor {
        do {
            return try Vault.open(at: cipherdir).root.reopenDirectory(flags: O_RDONLY)
        } catch let error as VaultError where Self.isConfigProblem(error) {
            FileHandleStandardError.write("coffer: wipe: \(error); destroying whatever holds key slots all the same\n")
        } catch let error as VaultError {
            switch error { case .notAVault, .interruptedInit: break; default: throw error }
            guard let dir = try? FileDescriptor.open(cipherdir, flags: O_RDONLY | O_DIRECTORY), Vault.holdsKeySlots(dir.rawValue) else {
                throw error
            }
            FileHandleStandardError.write("coffer: wipe: \(error), but key slots are left (a wipe cut short?); destroying them\n")
        }
        return try FileDescriptor.open(cipherdir, flags: O_RDONLY | O_DIRECTORY)
    }

    func run() throws {
        try runReportingFailures {
            let root = try openVaultDirectory()
            let name = URL(fileURLWithPath: cipherdir).lastPathComponent
            if !yes {
                FileHandleStandardError.write("This destroys the keys of \(cipherdir): nothing in it can be decrypted afterwards.\n"
                                              + "Type the directory's name (\(name)) to confirm: ")
                let answer = readLine(strippingNewline: true) ?? ""
                guard answer == name else {
                    throw CommandFailure(status: .notConfirmed, message: "not confirmed; nothing was wiped")
                }
            }
            // The key slots first, so that no daemon can be unlocked again after the lock.
            let destroyed = Result { try Vault.destroyKeySlots(in: root.rawValue, includingConfig: true) }
            // Every live daemon of this vault, found by the vault itself (whatever its
            // fsname, socket, owner or binary), is locked or ended, whatever happened above.
            var unreachable: [String] = []
            for daemon in LiveDaemons.serving(root.rawValue) {
                guard case .unreachable(let why) = LiveDaemons.silence(daemon) else { continue }
                unreachable.append("pid \(daemon.pid)" + (daemon.uid.map { " (uid \($0))" } ?? "")
                                   + (daemon.socket.map { ", socket \($0)" } ?? "") + ": " + why)
            }
            let daemons = unreachable.isEmpty ? ""
                : "; could not lock or end the daemon(s) still serving the vault: \(unreachable.joined(separator: "; ")); "
                    + "end them as their owner or as root"
            let report: KeySlotReport
            do {
                report = try destroyed.get()
            } catch {
                throw CommandFailure(status: .failure, message: "\(cipherdir): the key slots could not be destroyed: \(error)\(daemons)")
            }
            for entry in report.leftAlone + report.notDestroyed {
                FileHandleStandardError.write("coffer: wipe: \(cipherdir)/\(entry)\n")
            }
            if !unreachable.isEmpty {
                throw CommandFailure(status: .socketUnavailable, message: "\(cipherdir) is wiped" + daemons)
            }
            if !report.notDestroyed.isEmpty {
                let count = report.notDestroyed.count
                throw CommandFailure(status: .wipeIncomplete,
                                     message: "\(cipherdir): \(count) cop\(count == 1 ? "y" : "ies") of the key slots could not be overwritten "
                                         + "(named above); everything else is destroyed and no daemon serves the vault")
            }
            print("Wiped \(cipherdir): its key slots are destroyed.")
        }
    }
}

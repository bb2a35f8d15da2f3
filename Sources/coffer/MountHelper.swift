// MountHelper is mount(8)'s helper, `mount.coffer CIPHERDIR MOUNTPOINT [-sfnv] [-o OPTIONS]`
// (the coffer binary under that name): it turns mount and fstab options into `coffer mount`.
import ArgumentParser

struct MountHelperCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mount-helper",
        abstract: "mount(8)'s helper: what /sbin/mount.coffer runs.",
        discussion: """
            Installed as /sbin/mount.coffer, it makes `mount -t coffer CIPHERDIR MOUNTPOINT \
            -o OPTIONS` and /etc/fstab lines of type coffer work. Options: passfile=FILE, \
            extpass=CMD (split at spaces), idle_lock=DURATION, lock_grace=DURATION, lock_on=screen \
            and lock_on=suspend (one each: a comma ends an option), suspend_keeps_after_first_unlock, \
            allow_other (with default_permissions), ro, socket=PATH, \
            log_file=FILE, unlock_tpm2 (unlocked with this machine's TPM once mounted, as \
            --unlock-tpm2); mount(8)'s and systemd's own (rw, defaults, noauto, nofail, \
            _netdev, user, x-systemd.…, comment=…) are left to them; any other goes to FUSE \
            as -o. A passphrase is never an option's value: it comes from passfile=, extpass=, the \
            systemd credential coffer.passphrase, or `coffer unlock` later.
            """,
        shouldDisplay: false)

    @Argument(parsing: .captureForPassthrough, help: "CIPHERDIR MOUNTPOINT [-sfnv] [-o OPTIONS]")
    var words: [String] = []

    /// Options that mount(8), systemd or the fstab generator act on; the helper ignores them.
    static let leftToMount: Set<String> = ["rw", "defaults", "auto", "noauto", "nofail", "_netdev",
                                           "user", "nouser", "users", "owner", "group", "comment"]

    /// Option names that would carry a secret inline; refused, never passed on.
    static let inlineSecrets: Set<String> = ["passphrase", "password", "pass", "passwd", "pwd", "secret", "key"]

    /// Whether `option` (NAME or NAME=VALUE) names an inline secret, in any case, with
    /// or without '-' and '_' (Passphrase=, PASSWORD=, pass_word=…).
    static func isInlineSecret(_ option: String) -> Bool {
        let name = option.prefix { $0 != "=" }.lowercased().filter { $0 != "-" && $0 != "_" }
        return inlineSecrets.contains(name)
    }

    /// How an option is named in a message: its name only, never its value.
    static func named(_ option: String) -> String {
        option.contains("=") ? String(option.prefix { $0 != "=" }) + "=…" : option
    }

    /// The `coffer mount` arguments for mount(8)'s call; nil for a fake mount (-f).
    static func mountArguments(_ words: [String]) throws -> [String]? {
        var positional: [String] = [], options: [String] = [], fake = false
        var i = 0
        while i < words.count {
            let word = words[i]
            i += 1
            if word == "-o" || word == "-t" || word == "-N" {
                guard i < words.count else { throw ValidationError("\(word) needs a value") }
                if word == "-o" { options += words[i].split(separator: ",").map(String.init) }
                // mount(8) passes -N only for --namespace: this helper mounts in its own.
                if word == "-N" { throw ValidationError("-N (another mount namespace) is not supported") }
                i += 1
            } else if word.hasPrefix("-o") {
                options += word.dropFirst(2).split(separator: ",").map(String.init)
            } else if word.hasPrefix("-") && word.count > 1 {
                for flag in word.dropFirst() {
                    switch flag {
                    case "f": fake = true
                    case "s", "n", "v": break   // sloppy, no mtab, verbose: nothing to do
                    default: throw ValidationError("unknown flag -\(flag)")
                    }
                }
            } else {
                positional.append(word)
            }
        }
        guard positional.count == 2 else { throw ValidationError("usage: mount.coffer CIPHERDIR MOUNTPOINT [-sfnv] [-o OPTIONS]") }
        var arguments: [String] = []
        for option in options {
            let parts = option.split(separator: "=", maxSplits: 1)
            let key = String(parts[0]), value = parts.count > 1 ? String(parts[1]) : nil
            func required() throws -> String {
                guard let value, !value.isEmpty else { throw ValidationError("-o \(key) needs a value (\(key)=…)") }
                return value
            }
            if isInlineSecret(key) {
                throw ValidationError(
                    "-o \(key)=… is refused: a secret never goes in mount options; use passfile=FILE or the systemd credential coffer.passphrase")
            }
            switch key {
            case "passfile": arguments += ["--passfile", try required()]
            case "extpass": arguments += ["--extpass", try required()]
            case "idle_lock": arguments += ["--idle-lock", try required()]
            case "lock_grace": arguments += ["--lock-grace", try required()]
            case "lock_on": arguments += ["--lock-on", try required()]
            case "suspend_keeps_after_first_unlock": arguments.append("--suspend-keeps-after-first-unlock")
            case "socket": arguments += ["--socket", try required()]
            case "log_file": arguments += ["--log-file", try required()]
            case "unlock_tpm2": arguments.append("--unlock-tpm2")
            case "allow_other": arguments.append("--allow-other")
            case "ro": arguments.append("--read-only")
            case _ where leftToMount.contains(key) || key.hasPrefix("x-") || key.hasPrefix("X-"): continue
            default: arguments += ["-o", option]
            }
        }
        return fake ? nil : arguments + positional
    }

    func run() throws {
        let arguments: [String]?
        do {
            arguments = try Self.mountArguments(words)
        } catch {
            FileHandleStandardError.write("coffer: mount.coffer: \(Self.message(for: error))\n")
            throw ExitCode(ExitStatus.usage.rawValue)
        }
        guard let arguments else { return }
        let mount: MountCommand
        do {
            mount = try MountCommand.parse(arguments)
        } catch {
            FileHandleStandardError.write("coffer: mount.coffer: \(MountCommand.message(for: error))\n")
            throw ExitCode(MountCommand.exitCode(for: error).rawValue)
        }
        try mount.run()
    }
}

// Coffer is the command line: one subcommand type per verb of the user's path.
import ArgumentParser
import Foundation

@main
struct Coffer: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "coffer",
        abstract: "An encrypted directory for Linux.",
        discussion: """
            coffer keeps a directory's contents and names encrypted in a backing directory \
            (CIPHERDIR). Create one with `coffer init`. Exit statuses are listed in docs/guide/exit-statuses.md.
            """,
        version: cofferVersion,
        subcommands: [InitCommand.self, InfoCommand.self, MountCommand.self, UnlockCommand.self, LockCommand.self, StatusCommand.self,
                      EventsCommand.self, ProtectCommand.self, UnmountCommand.self, PasswdCommand.self, KeySlotCommand.self,
                      FsckCommand.self, WipeCommand.self, SpeedCommand.self, KDFHelperCommand.self, MountHelperCommand.self])
}

extension Coffer {
    /// Called as `mount.coffer` (mount(8)'s helper, a link to this binary), the command
    /// is `coffer mount-helper`.
    static func main() {
        let name = URL(fileURLWithPath: CommandLine.arguments.first ?? "coffer").lastPathComponent
        let arguments = Array(CommandLine.arguments.dropFirst())
        run(name == "mount.coffer" ? ["mount-helper"] + arguments : arguments)
    }

    /// Parses and runs the command. A usage error is one line on stderr, `coffer: WHAT
    /// (see coffer CMD --help)`, and exit status 64, like every other failure; help,
    /// and the statuses the commands set themselves, go as swift-argument-parser has them.
    static func run(_ arguments: [String]) {
        do {
            var command = try parseAsRoot(arguments)
            try command.run()
        } catch {
            let message = self.message(for: error)
            guard exitCode(for: error).rawValue == ExitStatus.usage.rawValue, !message.isEmpty else { exit(withError: error) }
            let verb = arguments.first { word in configuration.subcommands.contains { $0._commandName == word } }
            let hint = verb.map { " (see coffer \($0) --help)" } ?? " (see coffer --help)"
            let line = message.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }.joined(separator: "; ")
            FileHandleStandardError.write("coffer: \(line)\(hint)\n")
            exit(withError: ExitCode(ExitStatus.usage.rawValue))
        }
    }
}

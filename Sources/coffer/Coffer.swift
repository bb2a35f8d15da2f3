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
            (CIPHERDIR). Create one with `coffer init`. Exit statuses are listed in the README.
            """,
        subcommands: [InitCommand.self, InfoCommand.self, MountCommand.self, UnlockCommand.self, LockCommand.self, StatusCommand.self, UnmountCommand.self, PasswdCommand.self, FsckCommand.self, WipeCommand.self, SpeedCommand.self, KDFHelperCommand.self, MountHelperCommand.self])
}

extension Coffer {
    /// Called as `mount.coffer` (mount(8)'s helper, a link to this binary), the command
    /// is `coffer mount-helper`.
    static func main() {
        let name = URL(fileURLWithPath: CommandLine.arguments.first ?? "coffer").lastPathComponent
        let arguments = Array(CommandLine.arguments.dropFirst())
        main(name == "mount.coffer" ? ["mount-helper"] + arguments : arguments)
    }
}

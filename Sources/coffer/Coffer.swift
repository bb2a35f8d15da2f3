// Coffer is the command line: one subcommand type per verb of the user's path.
import ArgumentParser

@main
struct Coffer: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "coffer",
        abstract: "An encrypted directory for Linux.",
        discussion: """
            coffer keeps a directory's contents and names encrypted in a backing directory \
            (CIPHERDIR). Create one with `coffer init`. Exit statuses are listed in the README.
            """,
        subcommands: [InitCommand.self, InfoCommand.self, MountCommand.self, UnlockCommand.self, LockCommand.self, StatusCommand.self, UnmountCommand.self, PasswdCommand.self, FsckCommand.self, WipeCommand.self, SpeedCommand.self, KDFHelperCommand.self])
}

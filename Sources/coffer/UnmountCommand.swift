// UnmountCommand ends a mount: `coffer unmount MOUNTPOINT` (fusermount3 -u, which works
// for root and for the user who mounted). The daemon then locks and exits.
import ArgumentParser
import Foundation
import Glibc

struct UnmountCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unmount",
        abstract: "Unmount a coffer mount; its daemon wipes the keys and exits.")

    @Argument(help: "Where the vault is mounted.")
    var mountpoint: String

    func run() throws {
        try runReportingFailures {
            guard let path = MountPoint.canonical(mountpoint) else {
                throw CommandFailure(status: .mountpointMissing, message: "mountpoint \(mountpoint) does not exist")
            }
            guard let mount = MountPoint.isMounted(path),
                  mount.type == "fuse.coffer" else {
                throw CommandFailure(status: .notMounted, message: "\(mountpoint) is not a coffer mount")
            }
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/bin/fusermount3")
            process.arguments = ["-u", path]
            let errors = Pipe()
            process.standardError = errors
            try process.run()
            process.waitUntilExit()
            guard process.terminationStatus == 0 else {
                let text = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
                if text.contains("busy") || text.contains("Device or resource busy") {
                    throw CommandFailure(status: .unmountBusy, message: "\(mountpoint) is busy: a process still uses it")
                }
                throw CommandFailure(status: .failure, message: "fusermount3 -u \(path) failed: \(text.trimmingCharacters(in: .whitespacesAndNewlines))")
            }
        }
    }
}

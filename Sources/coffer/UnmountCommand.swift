// UnmountCommand ends a mount: `coffer unmount MOUNTPOINT` (fusermount3 -u, which works
// for root and for the user who mounted). The daemon then locks and exits, and unmount
// returns once it has: its keys are wiped and the vault is free for the next mount.
import ArgumentParser
import CofferGate
import CofferSystem
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
                throw MountPoint.missing(mountpoint)
            }
            guard let mount = MountPoint.isMounted(path),
                  mount.type == "fuse.coffer" else {
                throw CommandFailure(status: .notMounted, message: "\(mountpoint) is not a coffer mount")
            }
            // The daemon, asked before the mount goes (found through the mount's default
            // socket; a mount with --socket, or another user's, is not waited for). A busy
            // machine may take seconds to answer: the bound is for a daemon that hangs.
            let daemon = (try? SocketPath.forMountpoint(path))
                .flatMap { try? ControlClient.send(ControlRequest(op: .status), to: $0, timeout: 10).status?.pid }
                .flatMap { pid in LiveDaemons.startTime(pid_t(pid)).map { (pid_t(pid), $0) } }
            // A program that has just closed its last file in the mount may still hold it
            // for a moment: the kernel releases the file once the daemon has answered
            // (asynchronously), so "busy" is asked again for up to 5 s before it is final
            // (on a loaded machine the release can lag a second or two).
            // Without a daemon to ask (a reverse view has no control socket), the end of the
            // mount's FUSE connection says its daemon has let go of it.
            let connection = mount.device.split(separator: ":").last.map { "/sys/fs/fuse/connections/\($0)" }
            var (status, text) = try ChildProcess.run("/bin/fusermount3", ["fusermount3", "-u", path])
            for _ in 0..<50 where !status.succeeded && Self.isBusy(text) {
                usleep(100_000)
                (status, text) = try ChildProcess.run("/bin/fusermount3", ["fusermount3", "-u", path])
            }
            guard status.succeeded else {
                if Self.isBusy(text) {
                    throw CommandFailure(status: .unmountBusy, message: "\(mountpoint) is busy: a process still uses it")
                }
                throw CommandFailure(status: .failure,
                                     message: "fusermount3 -u \(path) failed: \(text.trimmingCharacters(in: .whitespacesAndNewlines))")
            }
            if let (pid, started) = daemon {
                LiveDaemons.waitForExit(pid, startedAt: started, seconds: 30)
            } else if let connection {
                for _ in 0..<300 where access(connection, F_OK) == 0 { usleep(100_000) }
            }
        }
    }

    /// Whether fusermount3's message says the mount is in use.
    static func isBusy(_ text: String) -> Bool { text.contains("busy") || text.contains("Device or resource busy") }
}

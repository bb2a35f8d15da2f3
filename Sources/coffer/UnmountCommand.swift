// UnmountCommand ends a mount: `coffer unmount MOUNTPOINT` (fusermount3 -u, which works
// for root and for the user who mounted). The daemon then locks and exits, and unmount
// returns once it has: its keys are wiped and the vault is free for the next mount.
import ArgumentParser
import CLinux
import CofferGate
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
            // The daemon, asked before the mount goes (found through the mount's default
            // socket; a mount with --socket, or another user's, is not waited for).
            let daemon = (try? SocketPath.forMountpoint(path))
                .flatMap { try? ControlClient.send(ControlRequest(op: .status), to: $0, timeout: 2).status?.pid }
                .flatMap { pid in Self.startTime(pid_t(pid)).map { (pid_t(pid), $0) } }
            let (status, text) = try ChildProcess.run("/bin/fusermount3", ["fusermount3", "-u", path])
            guard clinux_term_signal(status) == 0 && clinux_exit_status(status) == 0 else {
                if text.contains("busy") || text.contains("Device or resource busy") {
                    throw CommandFailure(status: .unmountBusy, message: "\(mountpoint) is busy: a process still uses it")
                }
                throw CommandFailure(status: .failure, message: "fusermount3 -u \(path) failed: \(text.trimmingCharacters(in: .whitespacesAndNewlines))")
            }
            if let (pid, started) = daemon { Self.waitForExit(pid, startedAt: started) }
        }
    }

    /// Waits (up to 30 s: a daemon making its last writes durable on a busy disk) until
    /// the process `pid` that started at `startedAt` has exited (or is a zombie).
    private static func waitForExit(_ pid: pid_t, startedAt: String) {
        for _ in 0..<3000 {
            guard startTime(pid) == startedAt else { return }
            usleep(10_000)
        }
    }

    /// The start time of live process `pid` (field 22 of /proc/PID/stat), which tells it
    /// from a later process with the same number; nil once it is gone or a zombie.
    private static func startTime(_ pid: pid_t) -> String? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let end = stat.range(of: ") ", options: .backwards) else { return nil }
        let fields = stat[end.upperBound...].split(separator: " ")
        guard fields.count > 19, fields[0] != "Z" else { return nil }
        return String(fields[19])
    }
}

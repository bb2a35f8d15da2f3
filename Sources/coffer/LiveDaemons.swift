// LiveDaemons finds the coffer daemons serving a vault by the vault itself — the processes
// holding its backing directory open (every daemon does: its root handle and its claim)
// — and their control sockets, whatever fsname, socket path or owner a mount was given.
// A user sees their own processes; root sees every user's. Also: waiting for a daemon to
// end (unmount), and ending one (wipe).
import CofferSystem
import Foundation
import Glibc

enum LiveDaemons {
    struct Daemon {
        let pid: pid_t
        /// The control socket it listens on, if one was found.
        let socket: String?
    }

    /// The coffer processes that hold directory `dir` (a descriptor of it) open.
    static func serving(_ dir: Int32) -> [Daemon] {
        guard let target = try? Sys.stat(dir) else { return [] }
        let listening = listeningSockets()
        let pids = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { pid_t($0) }
        return pids.compactMap { pid -> Daemon? in
            guard pid != getpid(), isCoffer(pid),
                  let fds = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd") else { return nil }
            var holds = false
            var socket: String?
            for fd in fds {
                let link = "/proc/\(pid)/fd/\(fd)"
                if let dest = try? FileManager.default.destinationOfSymbolicLink(atPath: link),
                   dest.hasPrefix("socket:["), let inode = UInt64(dest.dropFirst(8).dropLast()) {
                    socket = socket ?? listening[inode]
                    continue
                }
                var st = stat()
                if stat(link, &st) == 0, st.st_dev == target.st_dev, st.st_ino == target.st_ino { holds = true }
            }
            return holds ? Daemon(pid: pid, socket: socket) : nil
        }
    }

    /// Waits up to `seconds` until the process `pid` that started at `startedAt` has
    /// exited (or is a zombie); true if it has.
    @discardableResult
    static func waitForExit(_ pid: pid_t, startedAt: String, seconds: Double) -> Bool {
        for _ in 0..<Int(seconds * 100) {
            guard startTime(pid) == startedAt else { return true }
            usleep(10_000)
        }
        return startTime(pid) != startedAt
    }

    /// The start time of live process `pid` (field 22 of /proc/PID/stat), which tells it
    /// from a later process with the same number; nil once it is gone or a zombie.
    static func startTime(_ pid: pid_t) -> String? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let end = stat.range(of: ") ", options: .backwards) else { return nil }
        let fields = stat[end.upperBound...].split(separator: " ")
        guard fields.count > 19, fields[0] != "Z" else { return nil }
        return String(fields[19])
    }

    /// Ends daemon `pid` with SIGTERM (it unmounts and wipes its keys) and waits up to
    /// 10 s for it to go; true if it did.
    static func end(_ pid: pid_t) -> Bool {
        guard let started = startTime(pid), kill(pid, SIGTERM) == 0 else { return false }
        return waitForExit(pid, startedAt: started, seconds: 10)
    }

    /// Whether process `pid` runs the coffer binary (the daemon re-executes itself).
    private static func isCoffer(_ pid: pid_t) -> Bool {
        guard let exe = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/exe") else { return false }
        let name = URL(fileURLWithPath: exe).lastPathComponent
        return name == "coffer" || name == "mount.coffer"
    }

    /// Listening Unix sockets with a path, by inode (/proc/net/unix).
    private static func listeningSockets() -> [UInt64: String] {
        guard let text = try? String(contentsOfFile: "/proc/net/unix", encoding: .utf8) else { return [:] }
        var out: [UInt64: String] = [:]
        for line in text.split(separator: "\n").dropFirst() {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            // Num RefCount Protocol Flags Type St Inode Path; St 01 is listening.
            guard fields.count >= 8, fields[5] == "01", let inode = UInt64(fields[6]) else { continue }
            out[inode] = String(fields[7])
        }
        return out
    }
}

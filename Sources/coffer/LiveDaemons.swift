// LiveDaemons finds the coffer daemons serving a vault by the vault itself, whatever
// fsname, socket path, owner or binary a mount was given, and silences them for a wipe.
// A daemon is found two ways: it holds the vault's claim, an flock on CIPHERDIR that
// /proc/locks shows to every user (pid and dev:inode); or it is a coffer process holding
// CIPHERDIR open (/proc/PID/fd, which only root can read of a daemon: it is not dumpable).
// Its control socket is known only where its descriptors could be read. A user can signal
// their own processes; root reaches every user's. Also: waiting for a daemon to end (unmount).
import CofferGate
import CofferSystem
import Foundation
import Glibc

enum LiveDaemons {
    struct Daemon {
        let pid: pid_t
        /// Its owner (the real uid in /proc/PID/status), if it could be read.
        let uid: uid_t?
        /// The control socket it listens on, if its descriptors could be read.
        let socket: String?
        /// Whether it runs coffer (its argv[0] or its binary, even one replaced since it
        /// started, is named coffer or mount.coffer). Only such a process is signalled;
        /// any other holder of the claim is only named.
        let isCoffer: Bool
    }

    /// What became of a daemon the wipe turned to.
    enum Outcome: Equatable {
        /// Locked over its control socket: its keys are wiped, the mount stays.
        case locked
        /// It exited (or was killed): its keys died with it.
        case ended
        /// It could be neither locked nor ended; why.
        case unreachable(String)
    }

    /// Seconds a lock over the socket may take before the daemon is signalled instead (a
    /// lock waits at most 2 s for operations in flight, then writes back dirty pages; a
    /// loaded machine or a slow disk can stretch that). Waiting is safe: the daemon is
    /// locking, and if it never answers it is ended all the same, its keys with it.
    static let lockPatience = 15.0
    /// Seconds a daemon gets to exit after SIGTERM (it unmounts and wipes its keys).
    static let termPatience = 3.0
    /// Seconds a daemon gets to vanish after SIGKILL.
    static let killPatience = 2.0

    /// The processes serving the vault whose directory `dir` (a descriptor) is.
    static func serving(_ dir: Int32) -> [Daemon] {
        guard let target = try? Sys.stat(dir) else { return [] }
        let claimants = claimHolders(of: target)
        let listening = listeningSockets()
        let pids = KernelFiles.names(in: "/proc").compactMap { pid_t($0) }
        return pids.compactMap { pid -> Daemon? in
            guard pid != getpid() else { return nil }
            let coffer = isCoffer(pid)
            var holds = false
            var socket: String?
            if coffer {
                for fd in KernelFiles.names(in: "/proc/\(pid)/fd") {
                    let link = "/proc/\(pid)/fd/\(fd)"
                    if let dest = KernelFiles.link(link),
                       dest.hasPrefix("socket:["), let inode = UInt64(dest.dropFirst(8).dropLast()) {
                        socket = socket ?? listening[inode]
                        continue
                    }
                    if let st = try? Sys.stat(following: link), st.st_dev == target.st_dev, st.st_ino == target.st_ino { holds = true }
                }
            }
            guard holds || claimants.contains(pid) else { return nil }
            return Daemon(pid: pid, uid: owner(pid), socket: socket, isCoffer: coffer)
        }
    }

    /// Makes `daemon` stop serving plaintext the gentlest way that works, within seconds:
    /// a lock over its socket (skipped for a stopped process, which cannot answer), else
    /// SIGTERM (it unmounts and wipes its keys; with SIGCONT, so that a stopped one acts
    /// on it), else SIGKILL (the keys die with the process; the mount then answers ENOTCONN
    /// until it is unmounted). Killing is fair here: the vault's keys are being destroyed.
    static func silence(_ daemon: Daemon) -> Outcome {
        guard daemon.isCoffer else {
            return .unreachable("holds the vault's claim but does not run coffer, so it was not signalled")
        }
        guard let started = startTime(daemon.pid) else { return .ended }
        if let socket = daemon.socket, !isStopped(daemon.pid),
           (try? ControlClient.send(ControlRequest(op: .lock, reason: "wipe"), to: socket, timeout: lockPatience))?.ok == true {
            return .locked
        }
        do {
            try Sys.signal(daemon.pid, SIGTERM)
        } catch let error as Errno where error.code == EPERM {
            return .unreachable("not this user's to lock or signal")
        } catch {
            return .ended  // ESRCH: gone already
        }
        try? Sys.signal(daemon.pid, SIGCONT)
        if waitForExit(daemon.pid, startedAt: started, seconds: termPatience) { return .ended }
        try? Sys.signal(daemon.pid, SIGKILL)
        if waitForExit(daemon.pid, startedAt: started, seconds: killPatience) { return .ended }
        return .unreachable("still there after SIGKILL")
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
        guard let fields = statFields(pid), fields.count > 19, fields[0] != "Z" else { return nil }
        return String(fields[19])
    }

    /// Whether `pid` is stopped (SIGSTOP, a job-control stop) or stopped by a tracer: it
    /// reads no socket until it runs again.
    private static func isStopped(_ pid: pid_t) -> Bool {
        guard let state = statFields(pid)?.first else { return false }
        return state == "T" || state == "t"
    }

    /// The fields of /proc/PID/stat after the command name (the first is the state).
    private static func statFields(_ pid: pid_t) -> [Substring]? {
        guard let stat = KernelFiles.text("/proc/\(pid)/stat"),
              let end = stat.range(of: ") ", options: .backwards) else { return nil }
        return stat[end.upperBound...].split(separator: " ")
    }

    /// The names coffer runs under.
    private static let names: Set<String> = ["coffer", "mount.coffer"]

    /// Whether process `pid` runs coffer: its argv[0] (world-readable; the daemon is
    /// started as "coffer") or its binary is named so. A binary replaced since the process
    /// started (an upgrade) reads "/usr/bin/coffer (deleted)".
    static func isCoffer(_ pid: pid_t) -> Bool {
        if let cmdline = try? KernelFiles.read("/proc/\(pid)/cmdline"),
           let first = cmdline.split(separator: 0, maxSplits: 1, omittingEmptySubsequences: false).first,
           names.contains(URL(fileURLWithPath: String(decoding: first, as: UTF8.self)).lastPathComponent) {
            return true
        }
        guard var exe = KernelFiles.link("/proc/\(pid)/exe") else { return false }
        if exe.hasSuffix(" (deleted)") { exe.removeLast(" (deleted)".count) }
        return names.contains(URL(fileURLWithPath: exe).lastPathComponent)
    }

    /// The real uid of process `pid` (the "Uid:" line of /proc/PID/status).
    private static func owner(_ pid: pid_t) -> uid_t? {
        guard let status = KernelFiles.text("/proc/\(pid)/status"),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("Uid:") }) else { return nil }
        return line.split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst().first.flatMap { uid_t($0) }
    }

    /// The processes holding an flock on the inode `target` describes (/proc/locks:
    /// "1: FLOCK  ADVISORY  WRITE PID MAJOR:MINOR:INODE 0 EOF", the device in hex).
    private static func claimHolders(of target: stat) -> Set<pid_t> {
        guard let text = KernelFiles.text("/proc/locks") else { return [] }
        let dev = UInt64(target.st_dev)
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & ~0xfff), minor = (dev & 0xff) | ((dev >> 12) & ~0xff)
        var holders: Set<pid_t> = []
        for line in text.split(separator: "\n") where !line.contains("->") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 6, fields[1] == "FLOCK", let pid = pid_t(fields[4]) else { continue }
            let place = fields[5].split(separator: ":")
            guard place.count == 3, UInt64(place[0], radix: 16) == major, UInt64(place[1], radix: 16) == minor,
                  UInt64(place[2]) == UInt64(target.st_ino) else { continue }
            holders.insert(pid)
        }
        return holders
    }

    /// Listening Unix sockets with a path, by inode (/proc/net/unix).
    private static func listeningSockets() -> [UInt64: String] {
        guard let text = KernelFiles.text("/proc/net/unix") else { return [:] }
        var out: [UInt64: String] = [:]
        for line in text.split(separator: "\n").dropFirst() {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            // Num RefCount Protocol Flags Type St Inode Path; St 01 is listening.
            guard fields.count >= 8, fields[5] == "01", let inode = UInt64(fields[6]) else { continue }
            out[inode] = fields[7...].joined(separator: " ")  // a path may hold spaces
        }
        return out
    }
}

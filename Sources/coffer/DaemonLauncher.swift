// DaemonLauncher starts `coffer mount --foreground` as a detached child (new session,
// stdio on /dev/null) with a pipe for the passphrase and a pipe for its status, so no
// secret ever appears in argv or the environment.
import CLinux
import CofferCrypto
import CofferSystem
import Foundation
import Glibc

struct DaemonLauncher {
    let pid: pid_t
    private let secretFD: Int32
    private let statusFD: Int32

    /// Spawns /proc/self/exe with `arguments` (argv[0] first); the child sees the status
    /// pipe's write end as fd 3 and the passphrase pipe's read end as fd 4.
    static func spawn(arguments: [String]) throws -> DaemonLauncher {
        let (status, secret) = try twoPipes()
        let pid: pid_t
        do {
            pid = try spawnSelf(arguments, descriptors: [3: status[1], 4: secret[0]], newSession: true)
        } catch {
            [status[0], status[1], secret[0], secret[1]].forEach { close($0) }
            throw error
        }
        close(status[1])
        close(secret[0])
        return DaemonLauncher(pid: pid, secretFD: secret[1], statusFD: status[0])
    }

    /// Two close-on-exec pipes, each as [read end, write end].
    static func twoPipes() throws -> ([Int32], [Int32]) {
        let first = try Sys.pipe()
        do {
            let second = try Sys.pipe()
            return ([first.read, first.write], [second.read, second.write])
        } catch {
            close(first.read)
            close(first.write)
            throw error
        }
    }

    /// posix_spawn of this very binary with `arguments`; see `spawn`.
    static func spawnSelf(_ arguments: [String], descriptors: [Int32: Int32], newSession: Bool) throws -> pid_t {
        try spawn("/proc/self/exe", arguments, descriptors: descriptors, newSession: newSession)
    }

    /// posix_spawn of `program` (looked up in PATH when it has no slash) with `arguments`.
    /// In the child, each key of `descriptors` is a copy of its value, the other standard
    /// descriptors are /dev/null, and nothing else of ours is inherited. `newSession`
    /// detaches it (setsid).
    static func spawn(_ program: String, _ arguments: [String], descriptors: [Int32: Int32], newSession: Bool) throws -> pid_t {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        // Through descriptors above every source and target first: a source may itself be
        // another mapping's target (the status pipe's write end may be fd 4, which the
        // secret pipe is to become) or a standard descriptor that /dev/null is about to
        // replace (a caller started with 0 and 1 closed), and file actions run in order.
        let mappings = descriptors.sorted { $0.key < $1.key }
        let base = (Array(descriptors.keys) + Array(descriptors.values) + [2]).max()! + 1
        for (i, (_, source)) in mappings.enumerated() { posix_spawn_file_actions_adddup2(&actions, source, base + Int32(i)) }
        for fd: Int32 in 0...2 where descriptors[fd] == nil {
            posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0)
        }
        for (i, (target, _)) in mappings.enumerated() {
            posix_spawn_file_actions_adddup2(&actions, base + Int32(i), target)
        }
        // Nothing else of ours reaches the child (a caller's pipe or socket held open by
        // the daemon would make the caller wait for it forever).
        try Sys.addCloseFrom(&actions, max(3, (descriptors.keys.max() ?? 2) + 1))

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        if newSession { posix_spawnattr_setflags(&attributes, clinux_POSIX_SPAWN_SETSID) }

        var argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let rc = program.contains("/") ? posix_spawn(&pid, program, &actions, &attributes, &argv, environ)
            : posix_spawnp(&pid, program, &actions, &attributes, &argv, environ)
        guard rc == 0 else { throw Errno(rc, "posix_spawn") }
        return pid
    }

    /// Writes the secret (if any) and a newline into the child's passphrase pipe, then
    /// closes it.
    func sendSecret(_ secret: SecureBytes?) throws {
        defer { close(secretFD) }
        if let secret { try writeSecretLine(secret, to: secretFD) }
    }

    /// Waits for the child's status line; an exit without one is `daemonDied`.
    func waitForStatus() -> (Int32, String) {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        // Up to the first newline: a child of the daemon (fusermount3) may hold the pipe.
        while !bytes.contains(0x0a) {
            let n = read(statusFD, &buffer, buffer.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            bytes += buffer.prefix(n)
        }
        close(statusFD)
        let line = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .newlines)
        guard let space = line.firstIndex(of: " ") ?? (line.isEmpty ? nil : line.endIndex),
              let code = Int32(line[..<space]) else {
            // No status: the daemon is gone, or going. Wait for it a little, never forever.
            var status: Int32 = 0
            for _ in 0..<50 where waitpid(pid, &status, WNOHANG) == 0 { usleep(100_000) }
            return (ExitStatus.daemonDied.rawValue, "the daemon ended before the mount was live (exit status \(clinux_exit_status(status)))")
        }
        if code != 0 {
            var status: Int32 = 0
            waitpid(pid, &status, 0)
        }
        return (code, String(line[space...]).trimmingCharacters(in: .whitespaces))
    }
}

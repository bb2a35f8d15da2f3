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
            pid = try ChildProcess.spawnSelf(arguments, descriptors: [3: status[1], 4: secret[0]], newSession: true)
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
            ChildProcess.wait(pid)
        }
        return (code, String(line[space...]).trimmingCharacters(in: .whitespaces))
    }
}

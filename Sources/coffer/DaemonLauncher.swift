// DaemonLauncher starts `coffer mount --foreground` as a detached child (new session,
// stdio on /dev/null) with a pipe for the passphrase and a pipe for its status, so no
// secret ever appears in argv or the environment.
import CofferCrypto
import CofferSystem
import Foundation
import Glibc

struct DaemonLauncher: ~Copyable {
    let pid: pid_t
    /// Our end of the passphrase pipe, until `sendSecret` closes it.
    private var secretPipe: FileDescriptor?
    /// Our end of the status pipe.
    private let statusPipe: FileDescriptor

    /// Spawns /proc/self/exe with `arguments` (argv[0] first); the child sees the status
    /// pipe's write end as fd 3 and the passphrase pipe's read end as fd 4.
    static func spawn(arguments: [String]) throws -> DaemonLauncher {
        let status = try Sys.pipe()
        let secret = try Sys.pipe()
        let pid = try ChildProcess.spawnSelf(arguments, descriptors: [3: status.write.rawValue, 4: secret.read.rawValue],
                                             newSession: true)
        // The child's ends (status.write, secret.read) are closed here as they go out of scope.
        return DaemonLauncher(pid: pid, secretPipe: secret.write, statusPipe: status.read)
    }

    /// Writes the secret (if any) and a newline into the child's passphrase pipe, then
    /// closes it.
    mutating func sendSecret(_ secret: SecureBytes?) throws {
        guard let pipe = secretPipe.take() else { return }
        if let secret { try writeSecretLine(secret, to: pipe.rawValue) }
    }

    /// Waits for the child's status line; an exit without one is `daemonDied`.
    consuming func waitForStatus() -> (Int32, String) {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        // Up to the first newline: a child of the daemon (fusermount3) may hold the pipe.
        let source = statusPipe.rawValue
        while !bytes.contains(0x0a), let n = try? buffer.withUnsafeMutableBytes({ try Sys.read(source, into: $0) }), n > 0 {
            bytes += buffer.prefix(n)
        }
        statusPipe.close()
        let line = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .newlines)
        guard let space = line.firstIndex(of: " ") ?? (line.isEmpty ? nil : line.endIndex),
              let code = Int32(line[..<space]) else {
            // No status: the daemon is gone, or going. Wait for it a little, never forever.
            var ended = Sys.waitIfEnded(pid)
            for _ in 0..<50 where ended == nil {
                usleep(100_000)
                ended = Sys.waitIfEnded(pid)
            }
            return (ExitStatus.daemonDied.rawValue, "the daemon ended before the mount was live (exit status \((ended ?? WaitStatus(0)).exitStatus))")
        }
        if code != 0 {
            ChildProcess.wait(pid)
        }
        return (code, String(line[space...]).trimmingCharacters(in: .whitespaces))
    }
}

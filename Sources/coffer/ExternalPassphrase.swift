// ExternalPassphrase runs the command of --extpass (no shell) and reads the passphrase
// from the first line of its standard output, as gocryptfs's -extpass does.
import CofferCrypto
import CofferSystem
import Glibc

enum ExternalPassphrase {
    /// At most this much output after the first line is read (and zeroed) before the pipe
    /// is closed: `pass show` prints more lines, `yes` would print forever.
    static let maxDrain = 1 << 20

    /// The command's argv. One --extpass is split at spaces, as gocryptfs splits it (no
    /// quoting, no shell; runs of spaces count as one); several are argv[0], argv[1]… whole.
    static func argv(_ extpass: [String]) -> [String] {
        guard extpass.count == 1 else { return extpass }
        return extpass[0].split(separator: " ").map(String.init)
    }

    /// Runs the command with our standard input and error, its standard output on a pipe,
    /// and returns its first line. A command that cannot be started, exits non-zero or is
    /// killed is `extpassFailed`; one that succeeds and prints nothing, an empty passphrase.
    static func read(_ extpass: [String], what: String = "passphrase") throws -> SecureBytes {
        let words = argv(extpass)
        guard let program = words.first else {
            throw CommandFailure(status: .usage, message: "--extpass needs a command")
        }
        let pipe = try Sys.pipe()
        // Standard input and error stay the user's (systemd-ask-password, pinentry); a
        // closed one becomes /dev/null in the child.
        var descriptors: [Int32: Int32] = [1: pipe.write.rawValue]
        for fd: Int32 in [0, 2] where fcntl(fd, F_GETFD) >= 0 { descriptors[fd] = fd }
        let pid: pid_t
        do {
            pid = try ChildProcess.spawn(program, words, descriptors: descriptors, newSession: false)
        } catch let error as Errno {
            throw CommandFailure(status: .extpassFailed,
                                 message: "--extpass: cannot run \(program): \(error.text)")
        }
        pipe.write.close()
        let line: Result<SecureBytes?, Error>
        do {
            line = .success(try PassphraseReader.readOptionalLine(pipe.read.rawValue, what: what))
        } catch {
            line = .failure(error)
        }
        drain(pipe.read.rawValue)
        pipe.read.close()
        let status = ChildProcess.wait(pid)
        // The command's own verdict first: a failing command's partial output is no secret.
        let signal = status.signal, code = status.exitStatus
        guard signal == 0, code == 0 else {
            if case .success(let secret?) = line { secret.wipe() }
            throw CommandFailure(status: .extpassFailed,
                                 message: signal != 0 ? "--extpass: \(program) was killed by signal \(signal)"
                                                      : "--extpass: \(program) failed with exit status \(code)")
        }
        guard let secret = try line.get() else {
            throw CommandFailure(status: .emptyPassphrase, message: "empty \(what): --extpass \(program) printed nothing")
        }
        return secret
    }

    /// Reads what follows the first line into secure memory and zeroes it, so that the
    /// command is not killed by SIGPIPE for printing more than one line.
    private static func drain(_ fd: Int32) {
        let buffer = SecureBytes(count: 4096)
        defer { buffer.wipe() }
        var total = 0
        buffer.withUnsafeMutableBytes { bytes in
            while total < maxDrain, let n = try? Sys.read(fd, into: bytes), n > 0 {
                total += n
            }
        }
    }
}

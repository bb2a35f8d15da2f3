// KDFHelper runs Argon2id in a short-lived child process (`coffer kdf-helper`), so that
// the daemon, which lives for the whole mount, never holds Argon2id's working area
// (64 MiB to 4 GiB) in its own memory. Parameters and passphrase go to the child on a
// pipe, the 32-byte key comes back on another; nothing secret is in argv or the
// environment, and the child disables core dumps like the daemon and ends with it.
import ArgumentParser
import CofferCrypto
import CofferSystem
import Glibc

enum KDFHelper {
    /// The request: u64 opsLimit ‖ u64 memLimit ‖ salt (16) ‖ u32 passphrase length ‖ passphrase.
    /// The answer: one status byte (0: ok) ‖ 32 key bytes.
    static func derive(passphrase: SecureBytes, salt: [UInt8], parameters: KDFParameters) throws -> SecureBytes {
        let request = try Sys.pipe()
        let answer = try Sys.pipe()
        let pid = try ChildProcess.spawnSelf(["coffer", "kdf-helper", "--parent", String(getpid())],
                                             descriptors: [0: request.read.rawValue, 1: answer.write.rawValue], newSession: false)
        // The child's ends go; ours are closed when `exchange` returns, before the wait
        // (the child sees the end of its input even if the exchange failed halfway).
        request.read.close()
        answer.write.close()
        defer { ChildProcess.wait(pid) }
        return try exchange(request: request.write, answer: answer.read,
                            passphrase: passphrase, salt: salt, parameters: parameters)
    }

    /// Sends the request on `request`, reads the answer from `answer`; closes both.
    private static func exchange(request: consuming FileDescriptor, answer: consuming FileDescriptor, passphrase: SecureBytes,
                                 salt: [UInt8], parameters: KDFParameters) throws -> SecureBytes {
        let header = withUnsafeBytes(of: parameters.opsLimit.bigEndian, Array.init)
            + withUnsafeBytes(of: parameters.memLimit.bigEndian, Array.init) + salt
            + withUnsafeBytes(of: UInt32(passphrase.count).bigEndian, Array.init)
        try header.withUnsafeBytes { try Sys.send(request.rawValue, $0) }
        try passphrase.withUnsafeBytes { try Sys.send(request.rawValue, $0) }
        let key = SecureBytes(count: MasterKey.size)
        var status: UInt8 = 1
        // Sys.receive retries EINTR: a signal during the derivation is not a failure.
        guard withUnsafeMutableBytes(of: &status, { Sys.receive(answer.rawValue, into: $0) }), status == 0,
              key.withUnsafeMutableBytes({ Sys.receive(answer.rawValue, into: $0) }) else { throw CryptoError.kdfFailed }
        return key
    }
}

/// The child side: reads one request on stdin, answers on stdout, exits.
struct KDFHelperCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kdf-helper", abstract: "Internal: derives a key for the daemon.", shouldDisplay: false)

    @Option(help: "The daemon's pid: the helper ends when it does (Argon2id may take gigabytes for minutes).")
    var parent: Int32?

    func run() throws {
        if let parent { Sys.endWithParent(parent) }
        ProcessHardening.disableCoreDumps()
        var header = [UInt8](repeating: 0, count: 8 + 8 + PassphraseKDF.saltSize + 4)
        guard header.withUnsafeMutableBytes({ Sys.receive(0, into: $0) }) else { throw ExitCode(1) }
        func u64(_ at: Int) -> UInt64 { header[at..<at + 8].reduce(0) { $0 << 8 | UInt64($1) } }
        let parameters = KDFParameters(opsLimit: u64(0), memLimit: u64(8))
        let salt = Array(header[16..<16 + PassphraseKDF.saltSize])
        let length = Int(header[(16 + PassphraseKDF.saltSize)...].reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
        guard parameters.isAcceptable, length > 0, length <= PassphraseReader.maxLength else { throw ExitCode(1) }
        let passphrase = SecureBytes(count: length)
        guard passphrase.withUnsafeMutableBytes({ Sys.receive(0, into: $0) }) else { throw ExitCode(1) }
        guard let key = try? PassphraseKDF.deriveKey(passphrase: passphrase, salt: salt, parameters: parameters) else {
            var failed: UInt8 = 1
            _ = write(1, &failed, 1)
            throw ExitCode(1)
        }
        passphrase.wipe()
        var ok: UInt8 = 0
        guard write(1, &ok, 1) == 1, (try? key.withUnsafeBytes({ try Sys.send(1, $0) })) != nil else { throw ExitCode(1) }
        key.wipe()
    }
}

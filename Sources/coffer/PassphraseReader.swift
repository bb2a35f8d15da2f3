// PassphraseReader reads a passphrase or recovery key into secure memory: from a file
// (first line), from a terminal without echo, or from standard input.
import CofferCrypto
import CofferSystem
import Glibc

enum PassphraseReader {
    /// Longest accepted passphrase line, in bytes.
    static let maxLength = 4096

    /// Reads the first line of `path`.
    static func fromFile(_ path: String, what: String = "passphrase") throws -> SecureBytes {
        let fd: FileDescriptor
        do {
            fd = try FileDescriptor.open(path, flags: O_RDONLY)
        } catch let error as Errno {
            throw CommandFailure(status: .passphraseUnreadable,
                                 message: "cannot read \(what) file \(path): \(error.text)")
        }
        return try readLine(fd.rawValue, what: what)
    }

    /// Asks on the terminal (twice if `confirm`) with echo off, or reads standard input
    /// when it is not a terminal.
    static func interactive(prompt: String, confirm: Bool, what: String = "passphrase") throws -> SecureBytes {
        guard isatty(0) == 1 else { return try readLine(0, what: what) }
        let first = try promptNoEcho(prompt)
        guard confirm else { return first }
        let second = try promptNoEcho("Repeat \(what): ")
        guard first.constantTimeEquals(second) else {
            throw CommandFailure(status: .passphraseMismatch, message: "the two \(what)s do not match")
        }
        return first
    }

    private static func promptNoEcho(_ prompt: String) throws -> SecureBytes {
        ProcessHardening.disableCoreDumps()
        FileHandleStandardError.write(prompt)
        var saved = termios()
        tcgetattr(0, &saved)
        var quiet = saved
        quiet.c_lflag &= ~tcflag_t(ECHO)
        tcsetattr(0, TCSAFLUSH, &quiet)
        defer {
            tcsetattr(0, TCSAFLUSH, &saved)
            FileHandleStandardError.write("\n")
        }
        return try readLine(0, what: "passphrase")
    }

    /// Reads bytes one at a time until a newline or end of input, straight into
    /// sodium_malloc memory, so the secret never passes through a Swift String.
    static func readLine(_ fd: Int32, what: String) throws -> SecureBytes {
        guard let line = try readOptionalLine(fd, what: what) else {
            throw CommandFailure(status: .emptyPassphrase, message: "empty \(what)")
        }
        return line
    }

    /// Like `readLine`, but nil when the input ends before its first byte (nothing was
    /// given); an empty line is still an empty passphrase.
    static func readOptionalLine(_ fd: Int32, what: String) throws -> SecureBytes? {
        // Before the first byte arrives: other processes of the user must not read a
        // half-typed secret from this one's memory (ptrace, /proc/PID/mem).
        ProcessHardening.disableCoreDumps()
        let buffer = SecureBytes(count: maxLength)
        var length = 0
        var sawNewline = false
        try buffer.withUnsafeMutableBytes { bytes in
            while length < maxLength {
                let n: Int
                do {
                    n = try Sys.read(fd, into: UnsafeMutableRawBufferPointer(rebasing: bytes[length..<length + 1]))
                } catch let error as Errno {
                    throw CommandFailure(status: .passphraseUnreadable,
                                         message: "cannot read \(what): \(error.text)")
                }
                if n == 0 { break }
                if bytes[length] == 0x0a { bytes[length] = 0; sawNewline = true; break }
                length += 1
            }
            if !sawNewline && length == maxLength {
                throw CommandFailure(status: .passphraseUnreadable, message: "\(what) longer than \(maxLength) bytes")
            }
            if length > 0 && bytes[length - 1] == 0x0d { length -= 1; bytes[length] = 0 }
        }
        if length == 0 && !sawNewline { return nil }
        guard length > 0 else { throw CommandFailure(status: .emptyPassphrase, message: "empty \(what)") }
        return buffer.prefix(length)
    }
}

// DaemonLog sends the daemon's log lines to stderr (foreground), a file (--log-file),
// or syslog (background). Lines never carry secrets; plaintext names appear only in
// damage reports, which must say which file is damaged.
import Foundation
import Glibc

final class DaemonLog: @unchecked Sendable {
    enum Destination {
        case standardError
        case file(Int32)
        case syslog
    }

    private let destination: Destination
    private let lock = NSLock()

    init(destination: Destination) {
        self.destination = destination
        if case .syslog = destination { openlog("coffer", LOG_PID, LOG_DAEMON) }
    }

    /// Opens `path` for appending, or falls back to `fallback`.
    static func make(logFile: String?, fallback: Destination) -> DaemonLog {
        if let logFile {
            let fd = open(logFile, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600)
            if fd >= 0 { return DaemonLog(destination: .file(fd)) }
        }
        return DaemonLog(destination: fallback)
    }

    func write(_ message: String) {
        lock.lock()
        defer { lock.unlock() }
        switch destination {
        case .standardError:
            FileHandleStandardError.write("coffer[\(getpid())]: \(message)\n")
        case .file(let fd):
            var line = "coffer[\(getpid())]: \(message)\n"
            line.withUTF8 { _ = Glibc.write(fd, $0.baseAddress, $0.count) }
        case .syslog:
            withVaList([message]) { vsyslog(LOG_NOTICE, "%s", $0) }
        }
    }
}

// DaemonLog sends the daemon's log lines to stderr (foreground), a file (--log-file),
// or syslog (background); DaemonLogHandler is the swift-log handler the daemon installs
// over it, so that every `Logger` of the libraries writes there. Lines never carry
// secrets; plaintext names appear only in damage reports, which must say which file is
// damaged.
import CofferSystem
import Foundation
import Glibc
import Logging
import Synchronization

final class DaemonLog: Sendable {
    enum Destination: Sendable {
        case standardError
        case file(Int32)
        case syslog
    }

    private let destination: Destination
    /// Serialises writes, so that lines from worker threads never interleave.
    private let writing = Mutex(())

    init(destination: Destination) {
        self.destination = destination
        if case .syslog = destination { openlog("coffer", LOG_PID, LOG_DAEMON) }
    }

    /// Opens `logFile` for appending, or uses `fallback` without one. A root daemon
    /// must not be led to append to another file: the log file may not be a symlink
    /// (O_NOFOLLOW) or anything but a regular file, and its directory must belong to
    /// root or to this user and be writable by no one else.
    static func make(logFile: String?, fallback: Destination) throws -> DaemonLog {
        guard let logFile else { return DaemonLog(destination: fallback) }
        let refuse = { (why: String) in CommandFailure(status: .logFileRefused, message: "log file \(logFile): \(why)") }
        let url = URL(fileURLWithPath: logFile)
        let dirPath = url.deletingLastPathComponent().path
        let dir: FileDescriptor
        do {
            dir = try FileDescriptor.open(dirPath, flags: O_RDONLY | O_DIRECTORY)
        } catch let error as Errno {
            throw refuse("its directory cannot be opened (\(error.text))")
        }
        let st: stat
        do { st = try Sys.stat(dir.rawValue) } catch let error as Errno { throw refuse("fstat: \(error.text)") }
        guard st.st_mode & 0o022 == 0, st.st_uid == 0 || st.st_uid == geteuid() else {
            throw refuse("its directory \(dirPath) can be written by other users")
        }
        let file: FileDescriptor
        do {
            file = try FileDescriptor.open(url.lastPathComponent, in: dir.rawValue,
                                           flags: O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK, mode: 0o600)
        } catch let error as Errno {
            throw refuse(error.code == ELOOP ? "it is a symlink" : error.text)
        }
        guard let kind = try? Sys.stat(file.rawValue).st_mode & S_IFMT, kind == S_IFREG else { throw refuse("not a regular file") }
        // The log keeps it for the daemon's life.
        return DaemonLog(destination: .file(file.release()))
    }

    /// Writes one line; `priority` is the syslog priority (only syslog records it).
    func write(_ message: String, priority: Int32 = LOG_NOTICE) {
        writing.withLock { _ in
            switch destination {
            case .standardError:
                FileHandleStandardError.write("coffer[\(getpid())]: \(message)\n")
            case .file(let fd):
                var line = "coffer[\(getpid())]: \(message)\n"
                line.withUTF8 { _ = Glibc.write(fd, $0.baseAddress, $0.count) }
            case .syslog:
                withVaList([message]) { vsyslog(priority, "%s", $0) }
            }
        }
    }
}

/// Hands every log event of the daemon's `Logger`s to one DaemonLog, as a line of the
/// message alone (metadata, if a caller adds some, follows as `key=value`). Info and
/// above are written; the level becomes the syslog priority.
struct DaemonLogHandler: LogHandler {
    private let sink: DaemonLog
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]

    init(_ sink: DaemonLog) { self.sink = sink }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let all = metadata.merging(event.metadata ?? [:]) { $1 }
        let pairs = all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
        sink.write(([event.message.description] + pairs).joined(separator: " "), priority: Self.priority(event.level))
    }

    static func priority(_ level: Logger.Level) -> Int32 {
        switch level {
        case .trace, .debug: return LOG_DEBUG
        case .info: return LOG_INFO
        case .notice: return LOG_NOTICE
        case .warning: return LOG_WARNING
        case .error: return LOG_ERR
        case .critical: return LOG_CRIT
        }
    }
}

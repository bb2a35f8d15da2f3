// LogCapture keeps what a library logs in a test, so that the test can count the lines.
import Logging
import Synchronization

final class LogCapture: Sendable {
    private let lines = Mutex<[(level: Logger.Level, text: String)]>([])

    /// A logger whose every line lands here.
    var logger: Logger { Logger(label: "test", factory: { _ in Handler(capture: self) }) }

    /// The lines logged at `level`.
    func lines(at level: Logger.Level) -> [String] { lines.withLock { $0.filter { $0.level == level }.map(\.text) } }

    private struct Handler: LogHandler {
        let capture: LogCapture
        var logLevel = Logger.Level.trace
        var metadata: Logger.Metadata = [:]
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            capture.lines.withLock { $0.append((event.level, event.message.description)) }
        }
    }
}

// StatusReport is the daemon's side of the status pipe that `coffer mount` waits on:
// one line, "0" once the mount is live or "<status> <message>" if it cannot be.
import Glibc
import Synchronization

/// The daemon's side of the status pipe: one line, "0" or "<status> <message>". Only the
/// first line is sent; the pipe is closed with it, so a later report (a failure after
/// the mount went live) can never write into a descriptor number reused since.
final class StatusReport: Sendable {
    /// The pipe's write end; -1 once the line is sent (or without a pipe).
    private let fd: Atomic<Int32>
    let isPipe: Bool

    init(fd: Int32?) {
        self.fd = Atomic(fd ?? -1)
        isPipe = fd != nil
    }

    func succeed() { send("0\n") }

    /// Reports a failure; false if it went nowhere (no pipe, or the line was sent).
    @discardableResult
    func fail(_ status: ExitStatus, _ message: String) -> Bool { send("\(status.rawValue) \(message)\n") }

    @discardableResult
    private func send(_ line: String) -> Bool {
        let fd = self.fd.exchange(-1, ordering: .acquiringAndReleasing)
        guard fd >= 0 else { return false }
        var line = line
        line.withUTF8 { _ = Glibc.write(fd, $0.baseAddress, $0.count) }
        close(fd)
        return true
    }
}

// StatusReport is the daemon's side of the status pipe that `coffer mount` waits on:
// one line, "0" once the mount is live or "<status> <message>" if it cannot be.
import Glibc

/// The daemon's side of the status pipe: one line, "0" or "<status> <message>".
struct StatusReport {
    let fd: Int32?

    var isPipe: Bool { fd != nil }

    func succeed() { send("0\n") }

    func fail(_ status: ExitStatus, _ message: String) { send("\(status.rawValue) \(message)\n") }

    private func send(_ line: String) {
        guard let fd else { return }
        var line = line
        line.withUTF8 { _ = Glibc.write(fd, $0.baseAddress, $0.count) }
        close(fd)
    }
}

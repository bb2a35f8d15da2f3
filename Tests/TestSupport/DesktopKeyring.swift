// DesktopKeyring runs a private session bus (dbus-daemon on a socket in a directory the
// test gives, with no service activation) and gnome-keyring-daemon's Secret Service on it,
// its login keyring made and unlocked with a password given on standard input. The test
// ends both with `stop()` in its teardown, whatever happened.
import Foundation
import Glibc

public final class DesktopKeyring: @unchecked Sendable {
    public struct StartFailure: Error, CustomStringConvertible {
        public let description: String
    }

    public let directory: String
    public var bus: String { "unix:path=\(directory)/bus" }
    private var busDaemon: Process?
    private var keyringDaemon: Process?

    /// The environment of a program of this desktop session (coffer, secret-tool, busctl).
    public var environment: [String: String] {
        ProcessInfo.processInfo.environment.merging(["DBUS_SESSION_BUS_ADDRESS": bus]) { $1 }
    }

    /// Starts the bus and the keyring; throws (having ended what it started) if either
    /// does not come up (not installed? scripts/setup --test installs them).
    public init(directory: String) throws {
        self.directory = directory
        for sub in ["home", "runtime"] {
            try FileManager.default.createDirectory(atPath: directory + "/" + sub, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
        }
        // A session bus that any process of the test may reach, and that starts nothing
        // by itself (no <servicedir>): a keyring that is not running stays absent.
        let config = directory + "/bus.conf"
        try Data("""
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig><type>session</type><listen>unix:path=\(directory)/bus</listen><auth>EXTERNAL</auth>
              <policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy>
            </busconfig>
            """.utf8).write(to: URL(fileURLWithPath: config))
        do {
            busDaemon = try Self.launch("/usr/bin/dbus-daemon", ["--config-file=" + config, "--nofork", "--nopidfile"])
            for _ in 0..<1000 {  // up to 10 s
                if FileManager.default.fileExists(atPath: directory + "/bus") { break }
                usleep(10_000)
            }
            keyringDaemon = try Self.launch("/usr/bin/gnome-keyring-daemon", ["--foreground", "--unlock", "--components=secrets"],
                                            environment: environment.merging(["HOME": directory + "/home",
                                                                              "XDG_DATA_HOME": directory + "/home/data",
                                                                              "XDG_RUNTIME_DIR": directory + "/runtime"]) { $1 },
                                            input: "the login password")
            let deadline = Date().addingTimeInterval(30)
            while defaultCollection() == nil && Date() < deadline { usleep(10_000) }
            guard defaultCollection() == "/org/freedesktop/secrets/collection/login" else {
                throw StartFailure(description: "gnome-keyring-daemon did not come up on the private bus")
            }
        } catch {
            stop()
            throw error
        }
    }

    /// The object path of the Secret Service's default collection, if one answers.
    public func defaultCollection() -> String? {
        let (status, output) = busctl(["call", "org.freedesktop.secrets", "/org/freedesktop/secrets",
                                       "org.freedesktop.Secret.Service", "ReadAlias", "s", "default"])
        guard status == 0, let path = output.split(separator: "\"").dropFirst().first, path != "/" else { return nil }
        return String(path)
    }

    /// Locks the default collection, as a screen locker that locks the keyring would;
    /// busctl's exit status.
    @discardableResult
    public func lockCollection() -> Int32 {
        busctl(["call", "org.freedesktop.secrets", "/org/freedesktop/secrets", "org.freedesktop.Secret.Service",
                "Lock", "ao", "1", "/org/freedesktop/secrets/collection/login"]).status
    }

    /// Ends gnome-keyring-daemon: the session has no keyring any more.
    public func stopKeyring() { Self.end(&keyringDaemon) }

    /// Ends the keyring and the bus.
    public func stop() {
        Self.end(&keyringDaemon)
        Self.end(&busDaemon)
    }

    private func busctl(_ arguments: [String]) -> (status: Int32, output: String) {
        let out = Pipe()
        guard let process = try? Self.launch("/usr/bin/busctl", ["--address=" + bus] + arguments, output: out) else { return (-1, "") }
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    private static func launch(_ path: String, _ arguments: [String], environment: [String: String]? = nil,
                               input: String? = nil, output: Pipe? = nil) throws -> Process {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        if let environment { process.environment = environment }
        let stdin = Pipe()
        process.standardInput = stdin
        process.standardOutput = output ?? FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        if let input { stdin.fileHandleForWriting.write(Data(input.utf8)) }
        try? stdin.fileHandleForWriting.close()
        return process
    }

    private static func end(_ process: inout Process?) {
        guard let running = process else { return }
        if running.isRunning { running.terminate() }
        running.waitUntilExit()
        process = nil
    }
}

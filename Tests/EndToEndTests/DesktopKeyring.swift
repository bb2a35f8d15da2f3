// DesktopKeyring runs a private session bus (dbus-daemon on a socket in the scratch
// directory, with no service activation) and gnome-keyring-daemon's Secret Service on it,
// its login keyring made and unlocked with a password given on standard input, all for
// one test: both processes are ended by the test's teardown whatever happened.
import Foundation
import Glibc
import XCTest

final class DesktopKeyring {
    let directory: String
    var bus: String { "unix:path=\(directory)/bus" }
    private var busDaemon: Process?
    private var keyringDaemon: Process?

    /// The environment of a program of this desktop session (coffer, secret-tool, busctl).
    var environment: [String: String] {
        ProcessInfo.processInfo.environment.merging(["DBUS_SESSION_BUS_ADDRESS": bus]) { $1 }
    }

    init(directory: String, stoppedBy test: XCTestCase) {
        self.directory = directory
        test.addTeardownBlock { [self] in stopKeyring(); stop(&busDaemon) }
        for sub in ["home", "runtime"] {
            try? FileManager.default.createDirectory(atPath: directory + "/" + sub, withIntermediateDirectories: true,
                                                     attributes: [.posixPermissions: 0o700])
        }
        // A session bus that any process of the test may reach, and that starts nothing
        // by itself (no <servicedir>): a keyring that is not running stays absent.
        let config = directory + "/bus.conf"
        _ = FileManager.default.createFile(atPath: config, contents: Data("""
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig><type>session</type><listen>unix:path=\(directory)/bus</listen><auth>EXTERNAL</auth>
              <policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy>
            </busconfig>
            """.utf8))
        busDaemon = Harness.start(["dbus-daemon", "--config-file=" + config, "--nofork", "--nopidfile"])
        for _ in 0..<200 {
            if FileManager.default.fileExists(atPath: directory + "/bus") { break }
            usleep(10_000)
        }

        let keyring = Process()
        keyring.executableURL = URL(fileURLWithPath: "/usr/bin/gnome-keyring-daemon")
        keyring.arguments = ["--foreground", "--unlock", "--components=secrets"]
        keyring.environment = environment.merging(["HOME": directory + "/home", "XDG_DATA_HOME": directory + "/home/data",
                                                   "XDG_RUNTIME_DIR": directory + "/runtime"]) { $1 }
        let password = Pipe()
        keyring.standardInput = password
        keyring.standardOutput = FileHandle.nullDevice
        keyring.standardError = FileHandle.nullDevice
        do {
            try keyring.run()
        } catch {
            XCTFail("gnome-keyring-daemon: \(error) (scripts/setup --test installs it)")
            return
        }
        keyringDaemon = keyring
        password.fileHandleForWriting.write(Data("the login password".utf8))
        try? password.fileHandleForWriting.close()
        for _ in 0..<300 {
            if defaultCollection() != nil { break }
            usleep(10_000)
        }
        XCTAssertEqual(defaultCollection(), "/org/freedesktop/secrets/collection/login", "the keyring did not come up")
    }

    /// The object path of the Secret Service's default collection, if one answers.
    func defaultCollection() -> String? {
        let r = Harness.run(["busctl", "--address=" + bus, "call", "org.freedesktop.secrets", "/org/freedesktop/secrets",
                             "org.freedesktop.Secret.Service", "ReadAlias", "s", "default"])
        guard r.status == 0, let path = r.stdout.split(separator: "\"").dropFirst().first, path != "/" else { return nil }
        return String(path)
    }

    /// Locks the default collection, as a screen locker that locks the keyring would.
    func lockCollection() -> Outcome {
        Harness.run(["busctl", "--address=" + bus, "call", "org.freedesktop.secrets", "/org/freedesktop/secrets",
                     "org.freedesktop.Secret.Service", "Lock", "ao", "1", "/org/freedesktop/secrets/collection/login"])
    }

    /// Ends gnome-keyring-daemon: the session has no keyring any more.
    func stopKeyring() { stop(&keyringDaemon) }

    private func stop(_ process: inout Process?) {
        guard let running = process else { return }
        if running.isRunning { running.terminate() }
        running.waitUntilExit()
        process = nil
    }
}

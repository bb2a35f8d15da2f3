// SoftwareTPM runs swtpm (Debian's TPM 2.0 simulator) as a socket TPM on loopback for one
// test: its state in a directory the test gives, its two ports free ones picked at start.
// The test ends it with `stop()` in its teardown, whatever happened. `tcti` is what
// coffer's COFFER_TPM2_TCTI (and tpm2-tools' TPM2TOOLS_TCTI) take to reach it.
import Foundation
import Glibc

public final class SoftwareTPM: @unchecked Sendable {
    public struct StartFailure: Error, CustomStringConvertible {
        public let description: String
    }

    public let stateDirectory: String
    public private(set) var port: UInt16 = 0
    private var process: Process?

    /// The TCTI configuration string of this TPM.
    public var tcti: String { "swtpm:host=127.0.0.1,port=\(port)" }

    /// The environment of a command that uses this TPM (coffer and tpm2-tools alike).
    public var environment: [String: String] {
        ProcessInfo.processInfo.environment.merging(["COFFER_TPM2_TCTI": tcti, "TPM2TOOLS_TCTI": tcti]) { $1 }
    }

    /// Starts a TPM with its state in `stateDirectory` (a new one is a new TPM: another
    /// machine's); throws if swtpm does not come up (not installed?).
    public init(stateDirectory: String) throws {
        self.stateDirectory = stateDirectory
        try FileManager.default.createDirectory(atPath: stateDirectory, withIntermediateDirectories: true)
        // Another program may take a port between the probe and swtpm's bind: try again.
        for _ in 0..<5 {
            guard let free = Self.freePortPair() else { continue }
            let swtpm = Process()
            swtpm.executableURL = URL(fileURLWithPath: "/usr/bin/swtpm")
            swtpm.arguments = ["socket", "--tpm2", "--server", "type=tcp,port=\(free),bindaddr=127.0.0.1",
                               "--ctrl", "type=tcp,port=\(free + 1),bindaddr=127.0.0.1",
                               "--tpmstate", "dir=\(stateDirectory)", "--flags", "not-need-init,startup-clear"]
            swtpm.standardOutput = FileHandle.nullDevice
            swtpm.standardError = FileHandle.nullDevice
            do { try swtpm.run() } catch { throw StartFailure(description: "swtpm: \(error) (scripts/setup --test installs it)") }
            var up = false
            for _ in 0..<1000 {  // up to 10 s
                up = Self.answers(free)
                if up || !swtpm.isRunning { break }
                usleep(10_000)
            }
            if up {
                process = swtpm
                port = free
                return
            }
            if swtpm.isRunning { swtpm.terminate() }
            swtpm.waitUntilExit()
        }
        throw StartFailure(description: "swtpm did not come up on loopback")
    }

    /// Ends swtpm and waits for it (its state stays, as a powered-off TPM's).
    public func stop() {
        guard let process else { return }
        if process.isRunning { process.terminate() }
        process.waitUntilExit()
        self.process = nil
    }

    /// Extends PCR `index` of the sha256 bank with a fixed digest (tpm2_pcrextend), as a
    /// changed boot component would: a policy over that PCR stops matching.
    public func extendPCR(_ index: Int) throws {
        let tool = Process()
        tool.executableURL = URL(fileURLWithPath: "/usr/bin/tpm2_pcrextend")
        tool.arguments = ["\(index):sha256=" + String(repeating: "ab", count: 32)]
        tool.environment = environment
        tool.standardOutput = FileHandle.nullDevice
        tool.standardError = FileHandle.nullDevice
        try tool.run()
        tool.waitUntilExit()
        guard tool.terminationStatus == 0 else { throw StartFailure(description: "tpm2_pcrextend exited \(tool.terminationStatus)") }
    }

    /// A port P on 127.0.0.1 such that P and P+1 are both free now.
    private static func freePortPair() -> UInt16? {
        for _ in 0..<20 {
            guard let port = bound(0), port < UInt16.max, bound(port + 1) != nil else { continue }
            return port
        }
        return nil
    }

    /// Binds a TCP socket to 127.0.0.1:`port` (0: any) and closes it; the port it had.
    private static func bound(_ port: UInt16) -> UInt16? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var address = loopback(port)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0
            }
        }
        return ok ? UInt16(bigEndian: address.sin_port) : nil
    }

    /// The address 127.0.0.1:`port`.
    private static func loopback(_ port: UInt16) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return address
    }

    /// Whether something accepts connections on 127.0.0.1:`port`.
    private static func answers(_ port: UInt16) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = loopback(port)
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
    }
}

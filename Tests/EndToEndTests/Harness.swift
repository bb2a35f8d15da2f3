// Harness runs the built `coffer` binary and ordinary tools as a user would, and gives
// each test a scratch directory that is removed (and unmounted) even on failure.
import CofferSystem
import Foundation
import Synchronization
import XCTest

struct Outcome {
    let status: Int32
    let stdout: String
    let stderr: String
}

/// The bytes a reader thread collected from a pipe, handed to the thread that waits.
private final class Collected: Sendable {
    private let data = Mutex(Data())
    func set(_ bytes: Data) { data.withLock { $0 = bytes } }
    func get() -> Data { data.withLock { $0 } }
}

enum Harness {
    /// The directory holding the built products: the test runner lives beside `coffer`.
    static let binDirectory: String = {
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? ""
        var dir = URL(fileURLWithPath: exe).deletingLastPathComponent()
        // On Linux the runner is `<bin>/cofferPackageTests.xctest`, a plain executable.
        while !FileManager.default.fileExists(atPath: dir.appendingPathComponent("coffer").path) && dir.path != "/" {
            dir = dir.deletingLastPathComponent()
        }
        return dir.path
    }()

    static var coffer: String { binDirectory + "/coffer" }

    /// Runs `arguments[0]` with the rest as arguments; `input` goes to standard input.
    @discardableResult
    static func run(_ arguments: [String], input: String? = nil, environment: [String: String]? = nil,
                    timeout: TimeInterval = 120) -> Outcome {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: arguments[0].hasPrefix("/") ? arguments[0] : "/usr/bin/env")
        process.arguments = arguments[0].hasPrefix("/") ? Array(arguments.dropFirst()) : arguments
        if let environment { process.environment = environment }
        let out = Pipe(), err = Pipe(), inp = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = inp
        let stdoutData = Collected(), stderrData = Collected()
        let group = DispatchGroup()
        group.enter(); group.enter()
        DispatchQueue.global().async { stdoutData.set(out.fileHandleForReading.readDataToEndOfFile()); group.leave() }
        DispatchQueue.global().async { stderrData.set(err.fileHandleForReading.readDataToEndOfFile()); group.leave() }
        do { try process.run() } catch { return Outcome(status: -1, stdout: "", stderr: "\(error)") }
        if let input { inp.fileHandleForWriting.write(Data(input.utf8)) }
        try? inp.fileHandleForWriting.close()
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning { process.terminate() }
        process.waitUntilExit()
        group.wait()
        return Outcome(status: process.terminationStatus,
                       stdout: String(decoding: stdoutData.get(), as: UTF8.self),
                       stderr: String(decoding: stderrData.get(), as: UTF8.self))
    }

    /// Starts `arguments[0]` in the background with the rest as arguments, its output
    /// discarded; the caller terminates and waits for it.
    static func start(_ arguments: [String]) -> Process {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = arguments
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try? process.run()
        return process
    }

    /// A shell command that inverts the byte at offset $2 of file $1: a tamper that always
    /// changes it (writing a fixed byte leaves one in 256 random ciphertexts as they were).
    static let flipByte = "python3 -c 'import sys; f = open(sys.argv[1], \"r+b\"); f.seek(int(sys.argv[2])); "
        + "b = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 0xff]))'"

    /// The sanitizer coffer and the tests were built with (`scripts/test --sanitize`), if
    /// any. A memory scan reads no sanitizer's address space (its shadow maps terabytes).
    static var sanitizer: String? { ProcessInfo.processInfo.environment["COFFER_SANITIZER"] }

    /// Python that defines `scan(pid, needles)`: how often each of the byte strings in the
    /// dict `needles` occurs in the readable memory of process `pid` (read as root through
    /// /proc/PID/mem), by name; each find is printed too (`hit NAME COUNT in MAPPING`), to
    /// tell a failure where the copy was.
    static let memoryScan = """
        def scan(pid, needles):
            found = {name: 0 for name in needles}
            with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
                for line in maps:
                    fields = line.split()
                    if "r" not in fields[1] or line.rstrip().endswith(("[vvar]", "[vsyscall]")): continue
                    lo, hi = (int(x, 16) for x in fields[0].split("-"))
                    try:
                        mem.seek(lo); region = mem.read(hi - lo)
                    except OSError:
                        continue
                    for name, needle in needles.items():
                        count = region.count(needle)
                        found[name] += count
                        if count:  # where, for a failure's message
                            print("hit", name, count, "in", fields[5] if len(fields) > 5 else "[anonymous]", fields[0], fields[1],
                                  "first at +%#x" % region.find(needle))
            return found

        """

    /// The counts a memory scan printed (`memoryScan`'s `scan`, as JSON) on the line of
    /// `stdout` that begins with `prefix`; empty if there is none.
    static func scanCounts(_ stdout: String, _ prefix: String) -> [String: Int] {
        guard let line = stdout.split(separator: "\n").first(where: { $0.hasPrefix(prefix) }),
              let data = line.dropFirst(prefix.count).data(using: .utf8),
              let object = try? JSONSerialization.jsonObject(with: data) as? [String: Int] else { return [:] }
        return object
    }

    /// Runs a shell script with `bash -euo pipefail -c`.
    @discardableResult
    static func sh(_ script: String, timeout: TimeInterval = 300) -> Outcome {
        run(["/bin/bash", "-euo", "pipefail", "-c", script], timeout: timeout)
    }
}

/// A scratch directory for one test, removed when the test ends.
final class Scratch {
    let path: String

    init() {
        var template = Array("/tmp/coffer-e2e-XXXXXX".utf8CString)
        path = String(cString: mkdtemp(&template)!)
    }

    func cleanUp() {
        // Unmount anything still mounted below us before removing the tree.
        let mounts = KernelFiles.text("/proc/mounts") ?? ""
        for line in mounts.split(separator: "\n") {
            let fields = line.split(separator: " ")
            if fields.count > 1, fields[1].hasPrefix(path) {
                Harness.run(["fusermount3", "-u", "-z", String(fields[1])])
            }
        }
        try? FileManager.default.removeItem(atPath: path)
    }

    /// Writes `text` to a file in the scratch directory and returns its path.
    func file(_ name: String, _ text: String) -> String {
        let p = path + "/" + name
        _ = FileManager.default.createFile(atPath: p, contents: Data(text.utf8), attributes: [.posixPermissions: 0o600])
        return p
    }

    func mkdir(_ name: String) -> String {
        let p = path + "/" + name
        try? FileManager.default.createDirectory(atPath: p, withIntermediateDirectories: true)
        return p
    }
}

class EndToEndCase: XCTestCase {
    var scratch: Scratch!

    override func setUp() {
        super.setUp()
        scratch = Scratch()
        addTeardownBlock { [scratch] in scratch?.cleanUp() }
    }

    /// Creates a vault with the cheapest accepted KDF (tests are not about KDF cost).
    func initVault(_ name: String = "vault", passphrase: String = "test passphrase") -> (String, Outcome) {
        let dir = scratch.mkdir(name)
        let passfile = scratch.file(name + ".pass", passphrase + "\n")
        let outcome = Harness.run([Harness.coffer, "init", "--kdf-ops", "2", "--kdf-memory", "64",
                                   "--passfile", passfile, dir])
        return (dir, outcome)
    }

    /// Runs the built `coffer` with `arguments` (Harness.run): `input` goes to its
    /// standard input, and `environment`, if given, is laid over this process's.
    func coffer(_ arguments: [String], input: String? = nil, environment: [String: String]? = nil,
                timeout: TimeInterval = 120) -> Outcome {
        Harness.run([Harness.coffer] + arguments, input: input,
                    environment: environment.map { ProcessInfo.processInfo.environment.merging($0) { $1 } },
                    timeout: timeout)
    }

    /// The system calls `calls` (strace's `trace=` list) that process `pid` makes, in
    /// any of its threads, while `body` runs: strace's lines. strace is attached to
    /// every thread before `body` starts, and stopped when this returns: once the lines
    /// traced so far satisfy `until` (up to 20 s after `body`), or without it 0.2 s
    /// after `body`.
    func tracing(_ pid: Int32, calls: String, until: (([Substring]) -> Bool)? = nil,
                 during body: () -> Void) throws -> [Substring] {
        let trace = scratch.path + "/trace-\(pid)-\(calls)"
        let strace = Process()
        strace.executableURL = URL(fileURLWithPath: "/usr/bin/strace")
        strace.arguments = ["-f", "-qq", "-e", "trace=" + calls, "-o", trace, "-p", "\(pid)"]
        try strace.run()
        defer { if strace.isRunning { strace.interrupt() }; strace.waitUntilExit() }
        // strace writes nothing until a call is traced: wait until it has attached to
        // every thread (each of the daemon's threads shows it as its tracer).
        let deadline = Date().addingTimeInterval(10)
        func allTraced() -> Bool {
            let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
            return !tasks.isEmpty && tasks.allSatisfy { task in
                let status = KernelFiles.text("/proc/\(pid)/task/\(task)/status") ?? ""
                return status.contains("TracerPid:\t\(strace.processIdentifier)\n")
            }
        }
        while !allTraced() && Date() < deadline { usleep(20_000) }
        XCTAssertTrue(allTraced(), "strace did not attach to every thread of process \(pid)")
        body()
        if let until {
            let stopBy = Date().addingTimeInterval(20)
            func lines() -> [Substring] {
                ((try? String(contentsOfFile: trace, encoding: .utf8)) ?? "").split(separator: "\n")
            }
            while !until(lines()) && Date() < stopBy { usleep(100_000) }
        } else {
            usleep(200_000)
        }
        strace.interrupt()
        strace.waitUntilExit()
        return try String(contentsOfFile: trace, encoding: .utf8).split(separator: "\n")
    }
}

extension Harness {
    /// Inverts every bit of the byte at `offset` of `file`: a change whatever the byte
    /// was (writing a fixed value leaves one byte in 256 as it was).
    @discardableResult
    static func flipByte(of file: String, at offset: Int) -> Outcome {
        run(["python3", "-c", """
            import sys
            path, at = sys.argv[1], int(sys.argv[2])
            with open(path, "r+b") as f:
                f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ 0xff]))
            """, file, String(offset)])
    }
}

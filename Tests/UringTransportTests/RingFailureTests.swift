// A ring that cannot go on: each failure is logged once, says what it means, and ends the
// mount instead of leaving its CPU's requests waiting — without a kernel (ring calls that
// fail on cue) and on a real mount over FUSE over io_uring (one CPU's ring made to fail).
import CLinux
@testable import CofferFUSE
@testable import CofferUring
import CofferFileSystem
import CofferVault
import CofferSystem
import Foundation
import Glibc
import Synchronization
import TestSupport
import XCTest

/// A count (or a flag, a round, an address) that threads of a test share.
final class Shared: Sendable {
    let value = Atomic<Int>(0)
    var current: Int { value.load(ordering: .acquiring) }
    func set(_ new: Int) { value.store(new, ordering: .releasing) }
    /// Adds one; the value before.
    func next() -> Int { value.add(1, ordering: .acquiringAndReleasing).oldValue }
}

final class RingFailureTests: XCTestCase {
    /// Ring calls that succeed without a kernel and never complete anything; a waiting
    /// enter sleeps a little, as a real one would sleep long.
    static var quietRing: UringTransport.RingCalls {
        var calls = UringTransport.RingCalls()
        calls.enable = { _ in 0 }
        calls.command = { _, _, _, _, _, _, _ in 0 }
        calls.pollInput = { _, _, _ in 0 }
        calls.enter = { _, wait in
            if wait > 0 { usleep(1000) }
            return 0
        }
        calls.collect = { _ in 0 }
        calls.nextCompletion = { _, _, _ in false }
        return calls
    }

    /// A transport on `calls` whose `failed` signals `ended` (and counts).
    func transport(_ calls: UringTransport.RingCalls, queues: Int, log: LogCapture, ended: DispatchSemaphore,
                   endings: Shared) throws -> UringTransport {
        try UringTransport(fuseFD: -1, payloadCapacity: 8192, queueCount: queues, calls: calls, logger: log.logger,
                           dispatcher: { _, _ in XCTFail("nothing to dispatch") }, reader: { _, _ in -Int(EIO) },
                           failed: {
                               _ = endings.next()
                               ended.signal()
                           })
    }

    func testAFailedEnterIsLoggedOnceAndEndsTheMount() throws {
        var calls = Self.quietRing
        calls.enter = { _, _ in -EIO }
        let log = LogCapture(), ended = DispatchSemaphore(value: 0), endings = Shared()
        let transport = try transport(calls, queues: 1, log: log, ended: ended, endings: endings)
        transport.start()
        XCTAssertEqual(ended.wait(timeout: .now() + 10), .success, "the mount was not ended")
        transport.stop()
        XCTAssertEqual(endings.current, 1)
        let errors = log.lines(at: .error)
        XCTAssertEqual(errors.count, 1, "\(errors)")
        XCTAssertTrue(errors.first?.contains("io_uring queue 0: io_uring_enter failed (Input/output error)") == true, "\(errors)")
        XCTAssertTrue(errors.first?.contains("the mount ends") == true, "\(errors)")
    }

    func testAThreadThatCannotStartIsLoggedAndEndsTheMountOnce() throws {
        var calls = Self.quietRing
        calls.startThread = { _, _ in EAGAIN }
        let log = LogCapture(), ended = DispatchSemaphore(value: 0), endings = Shared()
        let transport = try transport(calls, queues: 2, log: log, ended: ended, endings: endings)
        transport.start()
        XCTAssertEqual(ended.wait(timeout: .now() + 10), .success, "the mount was not ended")
        transport.stop()
        let errors = log.lines(at: .error)
        XCTAssertEqual(errors.count, 2, "one line for each queue's failure: \(errors)")
        XCTAssertTrue(errors.allSatisfy { $0.contains("pthread_create failed") }, "\(errors)")
        XCTAssertEqual(endings.current, 1, "the mount is ended once")
    }

    /// The kernel refuses one entry's command after another: each lost entry is a warning
    /// and the queue goes on with the rest; the last one ends the mount.
    func testEntriesTheKernelEndsAreLoggedAndTheLastEndsTheMount() throws {
        var calls = Self.quietRing
        let next = Shared()
        calls.nextCompletion = { _, tag, result in
            let entry = next.next()
            guard entry < UringTransport.depth else { return false }
            tag = UInt64(entry)
            result = -EINVAL
            return true
        }
        let log = LogCapture(), ended = DispatchSemaphore(value: 0), endings = Shared()
        let transport = try transport(calls, queues: 1, log: log, ended: ended, endings: endings)
        transport.start()
        XCTAssertEqual(ended.wait(timeout: .now() + 10), .success, "the mount was not ended")
        transport.stop()
        let warnings = log.lines(at: .warning), errors = log.lines(at: .error)
        XCTAssertEqual(warnings.count, UringTransport.depth - 1, "\(warnings)")
        XCTAssertTrue(warnings.first?.contains("the kernel ended entry 0's command (Invalid argument); the queue goes on with 7 entries") == true,
                      "\(warnings)")
        XCTAssertEqual(errors.count, 1, "\(errors)")
        XCTAssertEqual(endings.current, 1)
    }

    // MARK: On a real mount

    static let uringSwitch = "/sys/module/fuse/parameters/enable_uring"

    /// io_uring_enter of CPU 0's ring fails once a request is on its way: the failure is
    /// logged once, the session's loop ends as after a signal, the unmount goes through,
    /// and the request does not wait for ever.
    func testAFailingRingEndsTheMountCleanlyAndLeavesNoRequestWaiting() throws {
        guard let before = try? String(contentsOfFile: Self.uringSwitch, encoding: .utf8) else {
            throw XCTSkip("this kernel has no FUSE over io_uring (no \(Self.uringSwitch))")
        }
        try XCTSkipUnless(geteuid() == 0, "mounting needs root")
        addTeardownBlock { try? (before.hasPrefix("Y") ? "1" : "0").write(toFile: Self.uringSwitch, atomically: false, encoding: .utf8) }
        try "1".write(toFile: Self.uringSwitch, atomically: false, encoding: .utf8)

        let dir = TempDirectory()
        let vaultPath = dir.path + "/vault", mountpoint = dir.path + "/mnt"
        for path in [vaultPath, mountpoint] { XCTAssertEqual(mkdir(path, 0o700), 0) }
        let (vault, _) = try Vault.create(at: vaultPath, passphrase: secret("p"), kdf: .floor)
        let log = LogCapture()
        let fs = try PlainFileSystem(vault: vault, logger: log.logger)

        // CPU 0's ring, once its thread starts; its enter fails once `armed`.
        let cpu0Ring = Shared(), armed = Shared(), registered = Shared()
        var calls = UringTransport.RingCalls.kernel
        calls.startThread = { queue, body in
            if queue.index == 0 { cpu0Ring.set(Int(bitPattern: UInt(bitPattern: queue.ring))) }
            return queue.start(body)
        }
        calls.command = { ring, fd, command, queue, commitID, buffers, tag in
            if buffers != nil { _ = registered.next() }
            return clinux_uring_fuse_command(ring, fd, command, queue, commitID, buffers, tag)
        }
        calls.enter = { ring, wait in
            armed.current == 1 && Int(bitPattern: UInt(bitPattern: ring)) == cpu0Ring.current
                ? -EIO : clinux_uring_enter(ring, wait)
        }
        let settled = Mutex<String?>(nil)
        var options = FuseSession.Options()
        options.transport = .uring
        options.ringCalls = calls
        options.transportSettled = { transport in settled.withLock { $0 = transport } }
        var session: FuseSession? = try FuseSession(fs: fs, options: options)
        try session!.mount(at: mountpoint)
        let served = DispatchSemaphore(value: 0)
        Thread.detachNewThread { [session] in
            session!.run(threads: 2)
            served.signal()
        }
        // Served through the rings once every entry of every queue is registered.
        let deadline = Date().addingTimeInterval(10)
        while registered.current < UringTransport.possibleCPUs() * UringTransport.depth && Date() < deadline {
            usleep(10_000)
        }
        XCTAssertEqual(settled.withLock { $0 }, "io_uring")
        armed.set(1)

        // Lookups from CPU 0 (locked: each answered EACCES), through the failing ring.
        let probe = Process()
        probe.executableURL = URL(fileURLWithPath: "/usr/bin/timeout")
        probe.arguments = ["30", "taskset", "-c", "0", "stat", mountpoint + "/a", mountpoint + "/b", mountpoint + "/c"]
        probe.standardOutput = FileHandle.nullDevice
        probe.standardError = FileHandle.nullDevice
        try probe.run()

        XCTAssertEqual(served.wait(timeout: .now() + 20), .success, "the session's loop did not end")
        XCTAssertTrue(session!.endedByFailure, "the session does not say that its transport failed (the daemon would exit 0)")
        session!.unmount()
        session = nil
        probe.waitUntilExit()
        XCTAssertNotEqual(probe.terminationStatus, 124, "a request waited until `timeout` ended it")
        let errors = log.lines(at: .error)
        XCTAssertEqual(errors.count, 1, "\(errors)")
        XCTAssertTrue(errors.first?.contains("io_uring queue 0: io_uring_enter failed (Input/output error)") == true, "\(errors)")
        let mounts = KernelFiles.text("/proc/self/mounts") ?? ""
        XCTAssertFalse(mounts.contains(mountpoint), "still mounted")
    }
}

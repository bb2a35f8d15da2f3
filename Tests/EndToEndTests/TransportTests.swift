// End-to-end: the transport a mount is asked for is the one it serves through — FUSE
// over io_uring where asked and offered, /dev/fuse by default or when asked — and
// io_uring serves data, the lock and the unmount as /dev/fuse does. Each test sets the
// fuse module's enable_uring switch as it needs it and puts it back.
import CofferSystem
import Foundation
import XCTest

final class TransportTests: EndToEndCase {
    static let uringSwitch = "/sys/module/fuse/parameters/enable_uring"

    /// Sets the switch for the rest of the test, or skips (saying why) on a kernel
    /// without FUSE over io_uring.
    func setUringSwitch(_ on: Bool) throws {
        guard let before = try? String(contentsOfFile: Self.uringSwitch, encoding: .utf8) else {
            throw XCTSkip("this kernel has no FUSE over io_uring (no \(Self.uringSwitch)): io_uring is not tested")
        }
        addTeardownBlock {
            try? (before.hasPrefix("Y") ? "1" : "0").write(toFile: Self.uringSwitch, atomically: false, encoding: .utf8)
        }
        try (on ? "1" : "0").write(toFile: Self.uringSwitch, atomically: false, encoding: .utf8)
    }

    func transport(_ vault: MountedVault) -> String? {
        let r = Harness.run([Harness.coffer, "status", "--json", vault.mountpoint])
        let object = try? JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any]
        return object?["transport"] as? String
    }

    /// True once `pid` has exited (gone, or a zombie its parent has not reaped yet),
    /// within 30 s.
    func ended(_ pid: Int32) -> Bool {
        for _ in 0..<300 {
            guard let stat = KernelFiles.text("/proc/\(pid)/stat") else { return true }
            if stat.split(separator: ")").last?.split(separator: " ").first == "Z" { return true }
            usleep(100_000)
        }
        return false
    }

    func testUringServesData_TheLock_AndTheUnmount() throws {
        try setUringSwitch(true)
        let vault = MountedVault(scratch: scratch)
        vault.mount(["--transport", "uring"])
        XCTAssertEqual(transport(vault), "io_uring")
        XCTAssertTrue(vault.log.contains("requests come through io_uring"), vault.log)
        // Every kind of request, with sizes across the 128 KiB request limit, from two
        // processes at once (both CPUs' queues).
        assertOK(vault.sh("""
            head -c 3000000 /dev/urandom > /tmp/coffer-transport.$$ && trap 'rm -f /tmp/coffer-transport.$$' EXIT
            for n in 1 2; do (cp /tmp/coffer-transport.$$ big$n && mkdir -p d$n/e && echo hi > d$n/e/f$n && ln -s f$n d$n/e/l$n) & done; wait
            mv d1 d3 && ln big1 hard && setfattr -n user.k -v v big2 && truncate -s 1000001 big2
            echo 3 > /proc/sys/vm/drop_caches
            cmp big1 /tmp/coffer-transport.$$ && cmp hard big1 && head -c 1000001 /tmp/coffer-transport.$$ | cmp - big2
            [ "$(getfattr --only-values -n user.k big2)" = v ] && [ "$(cat d3/e/l1)" = hi ] && ls -lR . | grep -c f2
            """), "data through io_uring")
        assertOK(Harness.run([Harness.coffer, "lock", vault.mountpoint]), "lock")
        XCTAssertNotEqual(vault.sh("cat d3/e/f1").status, 0, "a locked mount reads nothing")
        XCTAssertFalse(vault.sh("ls").stdout.contains("big1"), "nor lists names")
        assertOK(Harness.run([Harness.coffer, "unlock", "--passfile", vault.passfile, vault.mountpoint]), "unlock")
        XCTAssertEqual(vault.sh("cat d3/e/f1").stdout, "hi\n")
        let pid = vault.daemonPID
        vault.unmount()
        XCTAssertNotNil(pid)
        if let pid { XCTAssertTrue(ended(pid), "the daemon ended with its rings") }
    }

    /// Each ring's thread is bound to the CPU whose requests its ring gets (what lets a
    /// caller and its answer share a CPU); on /dev/fuse no thread is bound.
    func testEachRingsThreadIsBoundToItsCPU() throws {
        try setUringSwitch(true)
        // "0-1", "0" or "0,2-3": every online CPU is to have a thread bound to it alone.
        let online = (try String(contentsOfFile: "/sys/devices/system/cpu/online", encoding: .utf8))
            .trimmingCharacters(in: .whitespacesAndNewlines)
        let cpus = Set(online.split(separator: ",").flatMap { range -> [String] in
            let ends = range.split(separator: "-").compactMap { Int($0) }
            return (ends.first!...ends.last!).map(String.init)
        })
        guard cpus.count > 1 else { throw XCTSkip("one CPU online: every thread runs on it, bound or not") }
        func boundCPUs(_ vault: MountedVault) -> Set<String> {
            guard let pid = vault.daemonPID else { XCTFail("no daemon"); return [] }
            let listing = Harness.sh("grep -h Cpus_allowed_list /proc/\(pid)/task/*/status | awk '{print $2}'").stdout
            return Set(listing.split(separator: "\n").map(String.init).filter { !$0.contains("-") && !$0.contains(",") })
        }
        let uring = MountedVault(scratch: scratch, name: "uring")
        uring.mount(["--transport", "uring"])
        let classic = MountedVault(scratch: scratch, name: "classic")
        classic.mount(["--transport", "classic"])
        defer { for vault in [uring, classic] { vault.unmount() } }
        XCTAssertEqual(boundCPUs(uring), cpus, "a ring thread bound to each online CPU")
        XCTAssertEqual(boundCPUs(classic), [], "no thread bound on /dev/fuse")
    }

    func testAutoTakesUringWhereOfferedAndClassicStaysClassic() throws {
        try setUringSwitch(true)
        let auto = MountedVault(scratch: scratch, name: "auto")
        auto.mount(["--transport", "auto"])
        XCTAssertEqual(transport(auto), "io_uring")
        let classic = MountedVault(scratch: scratch, name: "classic")
        classic.mount(["--transport", "classic"])
        XCTAssertEqual(transport(classic), "/dev/fuse")
        XCTAssertTrue(classic.log.contains("requests come through /dev/fuse"), classic.log)
        assertOK(classic.sh("echo x > f && cat f"), "classic serves")
        // COFFER_TRANSPORT is the default a mount without --transport takes.
        let fromEnvironment = MountedVault(scratch: scratch, name: "environment")
        var environment = ProcessInfo.processInfo.environment
        environment["COFFER_TRANSPORT"] = "uring"
        assertOK(Harness.run([Harness.coffer, "mount", "--passfile", fromEnvironment.passfile, fromEnvironment.cipherdir,
                              fromEnvironment.mountpoint], environment: environment), "mount with COFFER_TRANSPORT=uring")
        XCTAssertEqual(transport(fromEnvironment), "io_uring")
        for vault in [auto, classic, fromEnvironment] { vault.unmount() }
    }

    /// Without a choice a mount takes `auto`: io_uring where the kernel offers it, else
    /// /dev/fuse, with a log line saying why.
    func testWithoutAChoiceAMountTakesUringWhereOffered() throws {
        try setUringSwitch(true)
        let vault = MountedVault(scratch: scratch)
        var environment = ProcessInfo.processInfo.environment
        environment["COFFER_TRANSPORT"] = nil
        let mount = [Harness.coffer, "mount", "--passfile", vault.passfile, "--log-file", vault.logFile,
                     "--state-dir", vault.stateDir, vault.cipherdir, vault.mountpoint]
        assertOK(Harness.run(mount, environment: environment), "mount")
        XCTAssertEqual(transport(vault), "io_uring", "where offered, io_uring is the default")
        vault.unmount()
        try setUringSwitch(false)
        assertOK(Harness.run(mount, environment: environment), "mount")
        XCTAssertEqual(transport(vault), "/dev/fuse", "elsewhere, /dev/fuse")
        XCTAssertTrue(vault.log.contains("requests come through /dev/fuse (not io_uring: this kernel does not serve FUSE over io_uring"),
                      vault.log)
        vault.unmount()
        environment["COFFER_TRANSPORT"] = "fast"
        let r = Harness.run([Harness.coffer, "mount", "--passfile", vault.passfile, vault.cipherdir, vault.mountpoint],
                            environment: environment)
        XCTAssertEqual(r.status, 64, r.stderr)
        XCTAssertTrue(r.stderr.contains("COFFER_TRANSPORT=fast"), r.stderr)
    }

    func testUringIsRefusedWhereTheKernelDoesNotOfferIt() throws {
        try setUringSwitch(false)
        let vault = MountedVault(scratch: scratch)
        let r = Harness.run([Harness.coffer, "mount", "--transport", "uring", "--passfile", vault.passfile,
                             vault.cipherdir, vault.mountpoint])
        XCTAssertEqual(r.status, 46, r.stderr)
        XCTAssertTrue(r.stderr.contains("enable_uring"), r.stderr)
        XCTAssertFalse(vault.isMounted)
        vault.mount(["--transport", "auto"])
        XCTAssertEqual(transport(vault), "/dev/fuse", "auto falls back")
        vault.unmount()
    }

    /// A daemon killed while requests run through its rings leaves a mount that fails
    /// (ENOTCONN), not one that hangs.
    func testAKilledUringDaemonLeavesNoHang() throws {
        try setUringSwitch(true)
        let vault = MountedVault(scratch: scratch)
        vault.mount(["--transport", "uring"])
        let writer = Harness.start(["sh", "-c", "while :; do echo x >> \(vault.mountpoint)/f || exit; done"])
        defer { writer.terminate(); writer.waitUntilExit() }
        // Requests are running once the file has content (up to 10 s).
        Harness.sh("for i in $(seq 100); do [ -s '\(vault.mountpoint)/f' ] && break; sleep 0.1; done")
        guard let pid = vault.daemonPID else { return XCTFail("no daemon") }
        kill(pid, SIGKILL)
        // stat itself reports the error (one stopped by the timeout would say nothing):
        // ENOTCONN, ECONNABORTED, or ECANCELED for a request the dying ring held.
        let r = Harness.run(["stat", vault.mountpoint + "/f"], timeout: 20)
        XCTAssertNotEqual(r.status, 0)
        XCTAssertTrue(r.stderr.contains("cannot statx"), "stat hung or was killed: \(r.stderr)")
        assertOK(Harness.run(["fusermount3", "-u", "-z", vault.mountpoint]), "clear the dead mount")
    }
}

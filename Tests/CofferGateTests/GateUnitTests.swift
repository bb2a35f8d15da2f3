// Unit tests of the gate's parts that need no mount: the unlock throttle, socket
// paths and their directory checks, the wire frames.
@testable import CofferGate
import Foundation
import XCTest

final class GateUnitTests: XCTestCase {
    func testThrottleDoublesFromOneSecondAndResets() {
        var throttle = UnlockThrottle()
        XCTAssertEqual(throttle.retryAfter, 0)
        throttle.recordFailure()
        XCTAssertEqual(throttle.retryAfter, 1, accuracy: 0.1)
        throttle.recordFailure()
        XCTAssertEqual(throttle.retryAfter, 2, accuracy: 0.1)
        throttle.recordFailure()
        XCTAssertEqual(throttle.retryAfter, 4, accuracy: 0.1)
        for _ in 0..<40 { throttle.recordFailure() }
        XCTAssertEqual(throttle.retryAfter, UnlockThrottle.maxDelay, accuracy: 0.1, "capped")
        XCTAssertEqual(throttle.failures, 43)
        throttle.recordSuccess()
        XCTAssertEqual(throttle.retryAfter, 0)
        XCTAssertEqual(throttle.failures, 0)
    }

    func testSocketNamesAreShortSafeAndDistinct() {
        let long = "/home/alice/" + String(repeating: "日本語", count: 40)
        let name = SocketPath.name(forMountpoint: long)
        XCTAssertTrue(name.allSatisfy { $0.isASCII && $0 != "/" }, name)
        XCTAssertLessThanOrEqual(name.utf8.count, 24 + 1 + 12 + 5)
        XCTAssertNotEqual(SocketPath.name(forMountpoint: "/a/Private"), SocketPath.name(forMountpoint: "/b/Private"))
        XCTAssertTrue(SocketPath.name(forMountpoint: "/home/alice/Private").hasPrefix("Private-"))
    }

    func testSocketDirectoryMustBePrivateRealAndOwned() throws {
        let base = NSTemporaryDirectory() + "coffer-gate-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: base) }
        try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
        let fresh = base + "/fresh"
        XCTAssertNoThrow(try SocketPath.ensurePrivateDirectory(fresh, uid: geteuid()))
        var st = stat()
        stat(fresh, &st)
        XCTAssertEqual(st.st_mode & 0o777, 0o700)
        let open = base + "/open"
        mkdir(open, 0o755)
        chmod(open, 0o755)
        XCTAssertThrowsError(try SocketPath.ensurePrivateDirectory(open, uid: geteuid()))
        let link = base + "/link"
        symlink(fresh, link)
        XCTAssertThrowsError(try SocketPath.ensurePrivateDirectory(link, uid: geteuid()), "a symlink is refused")
        XCTAssertThrowsError(try SocketPath.ensurePrivateDirectory(fresh, uid: geteuid() &+ 1), "another owner is refused")
    }

    func testFramesRoundTripAndRefuseOversizedLengths() throws {
        var fds: [Int32] = [0, 0]
        XCTAssertEqual(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds), 0)
        defer { close(fds[0]); close(fds[1]) }
        let request = ControlRequest(op: .unlock, secret: .passphrase, secretLength: 7)
        XCTAssertTrue(Frames.write(fds[0], Frames.encode(request)))
        let body = try Frames.readFrame(fds[1], by: Deadline(seconds: 5))
        XCTAssertEqual(try JSONDecoder().decode(ControlRequest.self, from: Data(body)), request)
        XCTAssertFalse(String(decoding: body, as: UTF8.self).contains("secretBytes"))
        XCTAssertTrue(Frames.write(fds[0], [0x7f, 0xff, 0xff, 0xff]))
        XCTAssertThrowsError(try Frames.readFrame(fds[1], by: Deadline(seconds: 5))) {
            guard case Frames.ReadError.tooLarge = $0 else { return XCTFail("\($0)") }
        }
    }

    func testUnixSocketAddressesForPathsAndAbstractNames() throws {
        let path = NSTemporaryDirectory() + "coffer-addr-\(getpid())"
        let abstract = "@coffer-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { unlink(path) }
        for (name, allowed) in [(path, false), (abstract, true)] {
            let receiver = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
            defer { close(receiver) }
            let address = try UnixSocketAddress(name, abstract: allowed)
            XCTAssertEqual(address.withSockaddr { bind(receiver, $0, $1) }, 0, name)
            let sender = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
            defer { close(sender) }
            let message = Array("READY=1".utf8)
            XCTAssertEqual(address.withSockaddr { sendto(sender, message, message.count, 0, $0, $1) }, message.count, name)
            var buffer = [UInt8](repeating: 0, count: 64)
            XCTAssertEqual(recv(receiver, &buffer, buffer.count, Int32(MSG_DONTWAIT)), message.count, name)
            XCTAssertEqual(Array(buffer.prefix(message.count)), message)
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: abstract), "an abstract name makes no file")
        XCTAssertThrowsError(try UnixSocketAddress("/" + String(repeating: "x", count: 107)), "no room for the NUL")
        XCTAssertNoThrow(try UnixSocketAddress("/" + String(repeating: "x", count: 106)))
    }
}

// Tests of the control server on a temp socket, without a mount: status, unlock and
// lock through the real client, the socket's mode, malformed, unknown and oversized
// requests, a second server on a live socket, and stop.
import CofferCrypto
@testable import CofferGate
import CofferVault
import Foundation
import Glibc
import XCTest

final class ControlServerTests: XCTestCase {
    var fixture: GateFixture!
    var server: ControlServer!
    var socketPath: String { fixture.path + ".sock" }

    override func setUpWithError() throws {
        // As in the daemon (MountCommand): a peer that hangs up must not kill the process.
        signal(SIGPIPE, SIG_IGN)
        fixture = try GateFixture()
        server = ControlServer(path: socketPath, owner: geteuid(), gate: fixture.gate)
        try server.start()
    }

    override func tearDown() {
        server.stop()
        unlink(socketPath)
        server = nil
        fixture = nil
    }

    func send(_ op: ControlRequest.Operation, secret text: String? = nil) throws -> ControlResponse {
        let secret = text.map(GateFixture.secret)
        let request = ControlRequest(op: op, secret: secret == nil ? nil : .passphrase, secretLength: secret?.count)
        return try ControlClient.send(request, secret: secret, to: socketPath, timeout: 30)
    }

    /// Sends raw bytes on a new connection, closes its sending side, reads one answer frame.
    func sendRaw(_ bytes: [UInt8]) throws -> ControlResponse {
        let socket = try UnixSocket.connect(to: socketPath)
        let fd = socket.rawValue
        XCTAssertTrue(Frames.write(fd, bytes))
        shutdown(fd, Int32(SHUT_WR))  // nothing more comes: a short request ends here
        let body = try Frames.readFrame(fd, by: Deadline(seconds: 10))
        return try JSONDecoder().decode(ControlResponse.self, from: Data(body))
    }

    func frame(_ json: String) -> [UInt8] {
        let body = Array(json.utf8)
        return withUnsafeBytes(of: UInt32(body.count).bigEndian, Array.init) + body
    }

    func testStatusUnlockLockOverTheSocket() throws {
        var st = stat()
        XCTAssertEqual(lstat(socketPath, &st), 0)
        XCTAssertEqual(st.st_mode & S_IFMT, S_IFSOCK)
        XCTAssertEqual(st.st_mode & 0o777, 0o600, "owner-only socket")

        let status = try send(.status)
        XCTAssertTrue(status.ok)
        XCTAssertEqual(status.status?.state, "locked")
        XCTAssertEqual(status.status?.mountpoint, "/mnt/test")
        XCTAssertEqual(status.status?.pid, getpid())

        let wrong = try send(.unlock, secret: "nope")
        XCTAssertEqual(wrong.error, ControlError.wrongPassphrase)
        XCTAssertFalse(fixture.fs.isUnlocked)
        Thread.sleep(forTimeInterval: 1.1)
        let unlocked = try send(.unlock, secret: fixture.passphrase)
        XCTAssertTrue(unlocked.ok, "\(unlocked)")
        XCTAssertEqual(unlocked.status?.state, "unlocked")
        XCTAssertTrue(fixture.fs.isUnlocked)
        XCTAssertFalse(String(describing: unlocked).contains(fixture.passphrase), "the secret is never echoed")

        let locked = try send(.lock)
        XCTAssertTrue(locked.ok)
        XCTAssertEqual(locked.status?.state, "locked")
        XCTAssertFalse(fixture.fs.isUnlocked)
    }

    /// A keyed slot's slot key (what a TPM unseals) opens the view over the socket with
    /// the slot's id; a wrong one is answered wrong-slot-key and not charged to the
    /// throttle (32 random bytes are not guessed: it is a slot copied from elsewhere);
    /// a slot key without an id is malformed, and nothing of it is echoed.
    func testASlotKeyUnlocksItsSlotOverTheSocket() throws {
        let vault = try Vault.open(at: fixture.path)
        let master = try vault.unlock(passphrase: GateFixture.secret(fixture.passphrase))
        let slotKey = SecureBytes.random(count: SlotFile.slotKeySize)
        let slot = try vault.addKeyedSlot(kind: SlotFile.keyringKind, id: Vault.newSlotID(), label: "keyring", master: master,
                                          slotKey: slotKey)
        func send(_ key: SecureBytes, slot id: String?) throws -> ControlResponse {
            try ControlClient.send(ControlRequest(op: .unlock, secret: .slotKey, secretLength: key.count, slot: id),
                                   secret: key, to: socketPath, timeout: 30)
        }
        XCTAssertEqual(try send(slotKey, slot: nil).error, ControlError.malformed, "a slot key needs its slot's id")
        XCTAssertEqual(try send(slotKey, slot: "not-an-id").error, ControlError.malformed)
        let wrong = try send(SecureBytes.random(count: SlotFile.slotKeySize), slot: slot.id)
        XCTAssertEqual(wrong.error, ControlError.wrongSlotKey)
        XCTAssertEqual(wrong.retryAfter ?? 0, 0, "a slot key that opens nothing (another vault's slot) is charged to the throttle")
        XCTAssertFalse(fixture.fs.isUnlocked)
        let unlocked = try send(slotKey, slot: slot.id)
        XCTAssertTrue(unlocked.ok, "\(unlocked)")
        XCTAssertTrue(fixture.fs.isUnlocked)
        XCTAssertEqual(fixture.derivations.value, 0, "a slot key runs no Argon2id")
    }

    func testBadRequestsGetAnErrorAndTheServerGoesOn() throws {
        XCTAssertEqual(try sendRaw(frame("not json")).error, ControlError.malformed)
        XCTAssertEqual(try sendRaw(frame(#"{"version": 99, "op": "status"}"#)).error, ControlError.unsupportedVersion)
        XCTAssertEqual(try sendRaw(frame(#"{"version": 1, "op": "format-disk"}"#)).error, ControlError.unknownOperation)
        XCTAssertEqual(try sendRaw(frame(#"{"version": 1, "op": "unlock"}"#)).error, ControlError.malformed,
                       "an unlock without a secret length")
        XCTAssertEqual(try sendRaw([0x7f, 0xff, 0xff, 0xff]).error, ControlError.tooLarge)
        let truncated = try sendRaw(frame(#"{"version": 1, "op": "unlock", "secret": "passphrase", "secretLength": 50}"#) + [1, 2])
        XCTAssertEqual(truncated.error, ControlError.timeout, "a secret shorter than announced")
        XCTAssertFalse(fixture.fs.isUnlocked)
        XCTAssertEqual(fixture.derivations.value, 0, "no malformed request reached the key derivation")
        XCTAssertTrue(try send(.status).ok, "still serving")
    }

    func testASecondServerOnALiveSocketIsRefusedAndStopRemovesIt() throws {
        let second = ControlServer(path: socketPath, owner: geteuid(), gate: fixture.gate)
        XCTAssertThrowsError(try second.start()) {
            guard case ControlServer.StartError.inUse = $0 else { return XCTFail("\($0)") }
        }
        XCTAssertTrue(try send(.status).ok, "the first server still answers")
        server.stop()
        XCTAssertFalse(FileManager.default.fileExists(atPath: socketPath), "stop removes the socket")
        XCTAssertThrowsError(try send(.status)) {
            guard case ControlClient.Failure.noDaemon = $0 else { return XCTFail("\($0)") }
        }
    }

    func testAStaleSocketIsReplaced() throws {
        server.stop()
        // A socket file whose daemon is gone: bound, then its listener closed.
        try UnixSocket.listen(at: socketPath).close()
        server = ControlServer(path: socketPath, owner: geteuid(), gate: fixture.gate)
        XCTAssertNoThrow(try server.start())
        XCTAssertTrue(try send(.status).ok)
    }
}

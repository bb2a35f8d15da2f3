// Tests of the gate's state machine on a vault in a temp dir, without a mount: the
// order of a lock (invalidate, wipe, invalidate) seen by a recording cache double,
// unlock, the throttle, shutdown and a wiped vault.
import CofferCrypto
import CofferFileSystem
@testable import CofferGate
import CofferVault
import Foundation
import Glibc
import Synchronization
import XCTest

/// A vault in a fresh temp dir, its plaintext view and a gate on it.
final class GateFixture: Sendable {
    let path: String
    let fs: PlainFileSystem
    let gate: Gate
    let recoveryKey: SecureBytes
    let passphrase = "correct horse"
    /// Key derivations the gate ran.
    let derivations = Counter()

    final class Counter: Sendable {
        private let count = Mutex(0)
        func add() { count.withLock { $0 += 1 } }
        var value: Int { count.withLock { $0 } }
    }

    /// `whileDeriving` runs inside each key derivation (a slow Argon2id, as it were).
    init(idleLock: Int64? = nil, hooks: PlainFileSystem.Hooks = .init(),
         whileDeriving: @escaping @Sendable () -> Void = {}) throws {
        var template = Array("/tmp/coffer-gate-XXXXXX".utf8CString)
        path = String(cString: mkdtemp(&template)!)
        let (vault, recovery) = try Vault.create(at: path, passphrase: Self.secret(passphrase), kdf: .floor)
        recoveryKey = recovery
        fs = try PlainFileSystem(vault: vault, hooks: hooks)
        let counter = derivations
        gate = Gate(fs: fs, mountpoint: "/mnt/test", idleLock: idleLock,
                    derive: { counter.add(); whileDeriving(); return try Vault.deriveInProcess($0, $1, $2) })
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }

    static func secret(_ text: String) -> SecureBytes {
        let bytes = Array(text.utf8)
        let s = SecureBytes(count: bytes.count)
        s.withUnsafeMutableBytes { $0.copyBytes(from: bytes) }
        return s
    }

    func unlock(_ text: String? = nil) -> ControlResponse {
        gate.unlock(secret: Self.secret(text ?? passphrase), kind: .passphrase, peer: 0)
    }
}

final class GateStateTests: XCTestCase {
    /// What the kernel-cache double saw, with whether the keys were there at the time.
    final class CacheRecorder: Sendable {
        enum Event: Equatable, Sendable {
            case node(UInt64, keysPresent: Bool)
            case entry(UInt64, String, keysPresent: Bool)
        }
        private let recorded = Mutex<[Event]>([])
        var events: [Event] { recorded.withLock { $0 } }
        /// The file system whose keys are checked, once it exists.
        let fs = Mutex<PlainFileSystem?>(nil)

        /// The file system's invalidation hooks, recording.
        var hooks: PlainFileSystem.Hooks {
            PlainFileSystem.Hooks(
                invalidateNode: { [self] id in
                    let present = fs.withLock { $0 }?.isUnlocked ?? false
                    recorded.withLock { $0.append(.node(id, keysPresent: present)) }
                },
                invalidateEntry: { [self] parent, name in
                    let present = fs.withLock { $0 }?.isUnlocked ?? false
                    let text = String(decoding: name, as: UTF8.self)
                    recorded.withLock { $0.append(.entry(parent, text, keysPresent: present)) }
                })
        }
    }

    let me = PlainFileSystem.Caller(uid: geteuid(), gid: getegid())
    /// The root's node ID, as the kernel names it (FUSE_ROOT_ID).
    let rootID: UInt64 = 1

    func testLockInvalidatesThenWipesThenInvalidatesAgain() throws {
        let recorder = CacheRecorder()
        let f = try GateFixture(hooks: recorder.hooks)
        recorder.fs.withLock { $0 = f.fs }
        XCTAssertTrue(f.unlock().ok)
        let (file, handle) = try f.fs.create(parent: rootID, name: Array("a".utf8), mode: 0o600,
                                             flags: O_RDWR, caller: me)
        f.fs.release(handle)
        XCTAssertThrowsError(try f.fs.lookup(parent: rootID, name: Array("absent".utf8)))
        XCTAssertTrue(recorder.events.isEmpty, "nothing is invalidated before the lock")

        f.gate.lock(reason: .command, detail: "test")
        let events = recorder.events
        let presence = events.map { event -> Bool in
            switch event {
            case .node(_, let present), .entry(_, _, let present): return present
            }
        }
        // Invalidate (keys present), wipe, invalidate (keys gone): one switch from true to false.
        guard let wipe = presence.firstIndex(of: false) else { return XCTFail("no invalidation after the wipe: \(events)") }
        XCTAssertGreaterThan(wipe, 0, "invalidation before the wipe: \(events)")
        XCTAssertFalse(presence[wipe...].contains(true), "nothing is invalidated with keys after the wipe: \(events)")
        let before = events[..<wipe], after = events[wipe...]
        for node in [file.node, rootID] {
            XCTAssertTrue(before.contains(.node(node, keysPresent: true)), "node \(node) before the wipe: \(events)")
            XCTAssertTrue(after.contains(.node(node, keysPresent: false)), "node \(node) after the wipe: \(events)")
        }
        XCTAssertFalse(before.contains { if case .entry = $0 { return true } else { return false } },
                       "names are dropped only once the keys are gone")
        let names = after.compactMap { event -> String? in
            if case .entry(rootID, let name, false) = event { return name } else { return nil }
        }
        XCTAssertEqual(Set(names), ["a", "absent"], "found and absent names alike")
        XCTAssertFalse(f.fs.isUnlocked)
        XCTAssertEqual(f.gate.status().state, "locked")

        // A second lock finds nothing to do: no invalidation, no wipe.
        f.gate.lock(reason: .command, detail: "again")
        XCTAssertEqual(recorder.events.count, events.count)
        // At shutdown (the session is gone), a lock still wipes and invalidates nothing.
        XCTAssertTrue(f.unlock().ok)
        f.gate.shutDown()
        XCTAssertFalse(f.fs.isUnlocked)
        XCTAssertEqual(recorder.events.count, events.count)
    }

    func testUnlockThrottlesWrongPassphrasesAndSkipsDerivationWhenUnlocked() throws {
        let f = try GateFixture()
        let wrong = f.unlock("wrong")
        XCTAssertFalse(wrong.ok)
        XCTAssertEqual(wrong.error, ControlError.wrongPassphrase)
        XCTAssertEqual(wrong.retryAfter ?? 0, 1, accuracy: 0.2)
        XCTAssertEqual(f.derivations.value, 1)

        let early = f.unlock()
        XCTAssertEqual(early.error, ControlError.throttled, "even the right passphrase waits")
        XCTAssertEqual(f.derivations.value, 1, "a throttled attempt derives nothing")
        XCTAssertEqual(f.gate.status().failedAttempts, 1)
        XCTAssertFalse(f.fs.isUnlocked)

        Thread.sleep(forTimeInterval: 1.1)
        let right = f.unlock()
        XCTAssertTrue(right.ok, "\(right)")
        XCTAssertEqual(right.status?.state, "unlocked")
        XCTAssertEqual(right.status?.failedAttempts, 0, "success resets the throttle")
        XCTAssertTrue(f.fs.isUnlocked)
        XCTAssertEqual(f.derivations.value, 2)

        XCTAssertEqual(f.unlock("anything").message, "already unlocked")
        XCTAssertEqual(f.derivations.value, 2, "unlocking an unlocked gate derives nothing")
    }

    func testRecoveryKeyUnlocksAndAMalformedOneCounts() throws {
        let f = try GateFixture()
        let malformed = f.gate.unlock(secret: GateFixture.secret("not-a-key"), kind: .recoveryKey, peer: 0)
        XCTAssertEqual(malformed.error, ControlError.wrongRecoveryKey)
        XCTAssertEqual(f.gate.status().failedAttempts, 1)
        Thread.sleep(forTimeInterval: 1.1)
        let ok = f.gate.unlock(secret: RecoveryKey.format(f.recoveryKey), kind: .recoveryKey, peer: 0)
        XCTAssertTrue(ok.ok, "\(ok)")
        XCTAssertEqual(f.derivations.value, 0, "a recovery key runs no Argon2id")
    }

    func testShutDownLocksForGood() throws {
        let f = try GateFixture()
        XCTAssertTrue(f.unlock().ok)
        f.gate.shutDown()
        XCTAssertFalse(f.fs.isUnlocked)
        let refused = f.unlock()
        XCTAssertEqual(refused.error, ControlError.failed)
        XCTAssertFalse(f.fs.isUnlocked)
        XCTAssertEqual(f.derivations.value, 1)
    }

    func testAVaultWithoutItsConfigIsWiped() throws {
        let f = try GateFixture()
        XCTAssertEqual(unlink(f.path + "/" + VaultConfig.fileName), 0)
        let response = f.unlock()
        XCTAssertEqual(response.error, ControlError.wiped)
        XCTAssertTrue(f.gate.status().wiped)
        XCTAssertEqual(f.unlock().error, ControlError.wiped, "and stays wiped")
    }

    /// While an unlock derives its key, `status` answers, and a lock waits its turn
    /// (and then locks: it came after the unlock).
    func testStatusDoesNotWaitForAnUnlockInProgress() throws {
        let deriving = DispatchSemaphore(value: 0), finish = DispatchSemaphore(value: 0)
        let f = try GateFixture(whileDeriving: { deriving.signal(); finish.wait() })
        let unlocked = DispatchSemaphore(value: 0), locked = DispatchSemaphore(value: 0)
        Thread.detachNewThread { XCTAssertTrue(f.unlock().ok); unlocked.signal() }
        XCTAssertEqual(deriving.wait(timeout: .now() + 30), .success)
        Thread.detachNewThread { f.gate.lock(reason: .command, detail: "test"); locked.signal() }

        let answered = DispatchSemaphore(value: 0)
        Thread.detachNewThread { XCTAssertEqual(f.gate.status().state, "locked"); answered.signal() }
        XCTAssertEqual(answered.wait(timeout: .now() + 30), .success, "status waited for the unlock's derivation")
        XCTAssertEqual(locked.wait(timeout: .now() + 0.2), .timedOut, "the lock waits for the unlock in progress")

        finish.signal()
        XCTAssertEqual(unlocked.wait(timeout: .now() + 30), .success)
        XCTAssertEqual(locked.wait(timeout: .now() + 30), .success)
        XCTAssertFalse(f.fs.isUnlocked, "the lock came after the unlock")
    }

    func testIdleLockOnlyWhenIdleLongEnough() throws {
        let f = try GateFixture(idleLock: 60)
        XCTAssertTrue(f.unlock().ok)
        f.gate.lock(reason: .idle, detail: "test", ifIdleFor: 3600)
        XCTAssertTrue(f.fs.isUnlocked, "not idle for an hour")
        f.gate.lock(reason: .idle, detail: "test", ifIdleFor: 0)
        XCTAssertFalse(f.fs.isUnlocked)
        XCTAssertEqual(f.gate.status().idleLockSeconds, 60)
    }
}

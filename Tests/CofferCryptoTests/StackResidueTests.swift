// Tests that sealing or opening with a secret leaves no copy of it in the dead stack
// frames of the calls that did it. Each runs on a thread whose stack is memory the test
// owns, read whole once the thread has ended. Known and not yet tested here: libsodium's
// AES-256-GCM open of a file's blocks with a key prepared for the one call leaves the
// file key 12.9 KiB below such a thread's top (zeroing 16 KiB below withBlockKey removed
// it, but then a lock left names in io_uring threads' stacks: not understood yet).
import CofferCrypto
import Foundation
import Glibc
import XCTest

final class StackResidueTests: XCTestCase {
    override func setUpWithError() throws {
        // A sanitizer's build lays out (or fakes) stack frames of its own.
        if let sanitizer = ProcessInfo.processInfo.environment["COFFER_SANITIZER"] {
            throw XCTSkip("the \(sanitizer) sanitizer's build lays its stack frames out differently")
        }
    }

    /// A name encrypted and decrypted (BLAKE2b over the padded name for its synthetic IV,
    /// XChaCha20 over it): libsodium's BLAKE2b loads the message into locals it does not
    /// wipe. The memory scan after a lock found a listed name in a worker thread's stack.
    func testNamesEncryptedAndDecryptedLeaveNoCopyOnTheStack() throws {
        let cipher = NameCipher(macKey: SecureBytes.random(count: 32), streamKey: SecureBytes.random(count: 32))
        let name = Array("a name nobody may see after the lock.txt".utf8), iv = Sodium.randomArray(count: NameCipher.ivSize)
        let encrypted = try cipher.encrypt(name, dirIV: iv)
        XCTAssertEqual(try residue(of: name) { _ = try cipher.encrypt(name, dirIV: iv) }, [], "encrypting")
        XCTAssertEqual(try residue(of: name) {
            var plain = try cipher.decrypt(encrypted, dirIV: iv)
            plain.withUnsafeMutableBytes { $0.initializeMemory(as: UInt8.self, repeating: 0) }
        }, [], "decrypting")
    }

    /// A key record's plaintext (version ‖ file ID ‖ key: 49 bytes) sealed and opened
    /// under K_metadata, as DropRecord and FileKeyWrap do.
    func testSealingAndOpeningUnderASealedBoxLeaveNoCopyOnTheStack() throws {
        let secret = Sodium.randomArray(count: 49), needle = Array(secret[17...])
        let box = SealedBox(key: SecureBytes.random(count: 32))
        let sealed = try secret.withUnsafeBytes { try box.sealDeterministically($0, associatedData: [1, 2]) }
        XCTAssertEqual(try residue(of: needle) {
            _ = try secret.withUnsafeBytes { try box.sealDeterministically($0, associatedData: [1, 2]) }
        }, [], "sealing")
        XCTAssertEqual(try residue(of: needle) { try box.open(sealed, associatedData: [1, 2], what: "a test").wipe() }, [], "opening")
    }

    /// A record sealed to the drop key and opened with it (crypto_box_seal_open).
    func testOpeningADropRecordLeavesNoCopyOnTheStack() throws {
        let secret = Sodium.randomArray(count: 49)
        let keys = DropKeys(secret: SecureBytes.random(count: 32))
        let sealed = secret.withUnsafeBytes { DropKeys.seal($0, to: keys.publicKey) }
        XCTAssertEqual(try residue(of: Array(secret[17...])) { try keys.open(sealed, what: "a test").wipe() }, [])
    }

    /// The search finds a copy where one was left: these tests can fail.
    func testTheSearchFindsACopyLeftOnTheStack() throws {
        let secret = Sodium.randomArray(count: 32)
        XCTAssertNotEqual(try residue(of: secret) {
            withUnsafeTemporaryAllocation(byteCount: 64, alignment: 8) { below in secret.withUnsafeBytes { below.copyMemory(from: $0) } }
        }, [])
    }

    /// Where `needle` is in the stack of a thread that ran `body` and ended: bytes below
    /// the top of its stack, for each copy.
    private func residue(of needle: [UInt8], after body: @escaping () throws -> Void) throws -> [Int] {
        let size = 1 << 20
        let stack = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 4096)
        defer { stack.deallocate() }
        stack.initializeMemory(as: UInt8.self, repeating: 0, count: size)
        final class Run {
            let body: () throws -> Void
            var error: Error?
            init(_ body: @escaping () throws -> Void) { self.body = body }
        }
        let run = Run(body)
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        defer { pthread_attr_destroy(&attributes) }
        XCTAssertEqual(pthread_attr_setstack(&attributes, stack, size), 0)
        var thread = pthread_t()
        XCTAssertEqual(pthread_create(&thread, &attributes, { context in
            let run = Unmanaged<Run>.fromOpaque(context!).takeRetainedValue()
            do { try run.body() } catch { run.error = error }
            return nil
        }, Unmanaged.passRetained(run).toOpaque()), 0)
        pthread_join(thread, nil)
        if let error = run.error { throw error }
        let bytes = UnsafeRawBufferPointer(start: stack, count: size)
        return (0...(size - needle.count)).filter { at in bytes[at] == needle[0] && bytes[at..<(at + needle.count)].elementsEqual(needle) }
            .map { size - $0 }
    }
}

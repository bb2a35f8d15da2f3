// Tests of the TPM layer (CofferTPM over the CTPM2 shim) against swtpm on loopback: a key
// sealed with and without a PCR policy, a PCR that changes, a TPM's identity, another
// TPM's blobs, and no TPM at all.
import CofferCrypto
@testable import CofferTPM
import Foundation
import TestSupport
import XCTest

final class TPM2Tests: XCTestCase {
    var dir: TempDirectory!

    override func setUp() { dir = TempDirectory() }
    override func tearDown() { dir = nil }

    /// A software TPM (a machine of its own for each `name`), ended by this test's teardown.
    func softwareTPM(_ name: String) throws -> SoftwareTPM {
        let tpm = try SoftwareTPM(stateDirectory: dir.path + "/" + name)
        addTeardownBlock { tpm.stop() }
        return tpm
    }

    func testASealedKeyUnsealsOnlyWhileItsPCRsHold() throws {
        let software = try softwareTPM("tpm")
        let tpm = try TPM2(tcti: software.tcti)
        let key = SecureBytes.random(count: 32)
        let bound = try tpm.seal(key, pcrs: [0, 7])
        let unbound = try tpm.seal(key, pcrs: [])
        XCTAssertEqual(bytes(try tpm.unseal(bound, pcrs: [0, 7], size: 32)), bytes(key))
        XCTAssertEqual(bytes(try tpm.unseal(unbound, pcrs: [], size: 32)), bytes(key))
        XCTAssertThrowsError(try tpm.unseal(bound, pcrs: [0], size: 32), "the policy names PCRs 0 and 7") {
            XCTAssertEqual($0 as? TPM2Error, .policyMismatch)
        }

        try software.extendPCR(7)
        XCTAssertThrowsError(try tpm.unseal(bound, pcrs: [0, 7], size: 32)) { XCTAssertEqual($0 as? TPM2Error, .policyMismatch) }
        XCTAssertEqual(bytes(try tpm.unseal(unbound, pcrs: [], size: 32)), bytes(key), "a key sealed without PCRs does not care")
        // Sealed after the change, to the PCRs as they are now: it opens again.
        XCTAssertEqual(bytes(try tpm.unseal(try tpm.seal(key, pcrs: [7]), pcrs: [7], size: 32)), bytes(key))
    }

    func testATPMHasOneIdentityAndRefusesAnotherTPMsBlobs() throws {
        let laptop = try softwareTPM("laptop"), desktop = try softwareTPM("desktop")
        let first = try TPM2(tcti: laptop.tcti)
        let identity = try first.machineIdentity()
        XCTAssertTrue(identity.hasPrefix("000b") && identity.count == 68, identity)
        XCTAssertEqual(try TPM2(tcti: laptop.tcti).machineIdentity(), identity, "the storage key is made the same every time")
        let other = try TPM2(tcti: desktop.tcti)
        XCTAssertNotEqual(try other.machineIdentity(), identity)

        let key = SecureBytes.random(count: 32)
        let sealed = try first.seal(key, pcrs: [])
        XCTAssertThrowsError(try other.unseal(sealed, pcrs: [], size: 32)) { XCTAssertEqual($0 as? TPM2Error, .notThisTPM) }
        var damaged = sealed
        damaged.privateBlob[damaged.privateBlob.count - 1] ^= 1
        XCTAssertThrowsError(try first.unseal(damaged, pcrs: [], size: 32)) { XCTAssertEqual($0 as? TPM2Error, .notThisTPM) }
        XCTAssertEqual(bytes(try first.unseal(sealed, pcrs: [], size: 32)), bytes(key))
    }

    func testNoTPMIsUnavailable() throws {
        let gone = try softwareTPM("gone")
        let tcti = gone.tcti
        gone.stop()
        XCTAssertThrowsError(try TPM2(tcti: tcti)) {
            guard case TPM2Error.unavailable(let why) = $0 else { return XCTFail("\($0)") }
            XCTAssertTrue(why.contains("no TPM 2.0 answers"), why)
        }
    }
}

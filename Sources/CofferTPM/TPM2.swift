// TPM2 seals a slot key to this machine's TPM (optionally to PCR values) and unseals it,
// through the CTPM2 shim (libtss2, loaded at first use). Only the coffer command uses it;
// the vault and the daemon never do.
import CTPM2
import CofferCrypto
import Foundation

/// Why the TPM could not do what was asked.
public enum TPM2Error: Error, Equatable, CustomStringConvertible {
    /// No TPM to talk to: libtss2 missing, no device, or the TCTI string names nothing.
    case unavailable(String)
    /// The sealed key's PCR policy does not hold: those PCRs changed since it was sealed.
    case policyMismatch
    /// This TPM refuses the blobs: they were sealed by another TPM (or are damaged).
    case notThisTPM
    /// Any other failure, with the TSS2 response code.
    case failed(String)

    public var description: String {
        switch self {
        case .unavailable(let why): return why
        case .policyMismatch: return "the PCRs the key is sealed to changed since it was sealed"
        case .notThisTPM: return "this TPM cannot load the sealed key (another machine's TPM sealed it)"
        case .failed(let why): return why
        }
    }
}

/// The two marshalled halves of a sealed object (TPM2B_PUBLIC, TPM2B_PRIVATE): opaque
/// to everyone but the TPM that made them.
public struct SealedObject: Equatable, Sendable {
    public var publicBlob: [UInt8]
    public var privateBlob: [UInt8]

    public init(publicBlob: [UInt8], privateBlob: [UInt8]) {
        self.publicBlob = publicBlob
        self.privateBlob = privateBlob
    }
}

/// An open TPM, its storage primary key made (from the owner hierarchy's standard
/// template: the same key every time on this TPM, nothing stored in it).
public final class TPM2 {
    /// The TCTI used when `COFFER_TPM2_TCTI` is unset: the kernel's resource manager.
    public static let defaultTCTI = "device:/dev/tpmrm0"
    /// The largest sealed blob accepted, in bytes (a TPM2B_PUBLIC of a keyedhash object
    /// with a policy is about 80, a TPM2B_PRIVATE about 130).
    public static let maxBlobSize = 1024

    private let handle: OpaquePointer
    /// The TCTI configuration this TPM was opened with.
    public let tcti: String

    /// The TCTI configuration to use: `COFFER_TPM2_TCTI` (e.g. `swtpm:port=2321`, for
    /// tests with a software TPM) or `defaultTCTI`.
    public static var configuredTCTI: String {
        ProcessInfo.processInfo.environment["COFFER_TPM2_TCTI"].flatMap { $0.isEmpty ? nil : $0 } ?? defaultTCTI
    }

    /// Opens the TPM at `tcti` and makes its storage primary key.
    public init(tcti: String = TPM2.configuredTCTI) throws {
        var pointer: OpaquePointer?
        var rc: UInt32 = 0
        switch outcome(coffer_tpm2_open(tcti, &pointer, &rc)) {
        case COFFER_TPM2_OK: break
        case COFFER_TPM2_NO_LIBRARY:
            throw TPM2Error.unavailable("libtss2 is not installed (Debian: libtss2-esys-3.0.2-0, libtss2-tctildr0, libtss2-tcti-device0)")
        case COFFER_TPM2_NO_DEVICE:
            throw TPM2Error.unavailable("no TPM 2.0 answers at \(tcti) (TSS2 code 0x\(String(rc, radix: 16)))")
        default:
            throw TPM2Error.failed(
                "the TPM at \(tcti) did not make its storage primary key (TSS2 code 0x\(String(rc, radix: 16)); an owner password set?)")
        }
        handle = pointer!
        self.tcti = tcti
    }

    deinit { coffer_tpm2_close(handle) }

    /// This TPM's identity: the TPM2 Name of its storage primary key (the name
    /// algorithm, sha256, and the SHA-256 of its public area), in hex. Per TPM, and new
    /// after the TPM is cleared.
    public func machineIdentity() throws -> String {
        var name = [UInt8](repeating: 0, count: 128)
        var length = 0
        guard outcome(coffer_tpm2_primary_name(handle, &name, name.count, &length)) == COFFER_TPM2_OK else {
            throw TPM2Error.failed("the TPM did not give its primary key's name")
        }
        return name.prefix(length).map { String(format: "%02x", $0) }.joined()
    }

    /// Seals `secret` to this TPM, and to the current values of `pcrs` (sha256 bank) if any.
    public func seal(_ secret: SecureBytes, pcrs: [Int]) throws -> SealedObject {
        var publicBlob = [UInt8](repeating: 0, count: TPM2.maxBlobSize), privateBlob = publicBlob
        var publicLength = 0, privateLength = 0
        var rc: UInt32 = 0
        let indexes = pcrs.map { UInt8(clamping: $0) }
        let result = secret.withUnsafeBytes { bytes in
            outcome(coffer_tpm2_seal(handle, bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), bytes.count, indexes, indexes.count,
                             &publicBlob, publicBlob.count, &publicLength, &privateBlob, privateBlob.count, &privateLength, &rc))
        }
        guard result == COFFER_TPM2_OK else {
            throw TPM2Error.failed("the TPM did not seal the key (TSS2 code 0x\(String(rc, radix: 16)))")
        }
        return SealedObject(publicBlob: Array(publicBlob.prefix(publicLength)), privateBlob: Array(privateBlob.prefix(privateLength)))
    }

    /// Unseals the secret of `object` (`pcrs`: those of its policy), `size` bytes, into
    /// secure memory.
    public func unseal(_ object: SealedObject, pcrs: [Int], size: Int) throws -> SecureBytes {
        let secret = SecureBytes(count: size)
        var length = 0
        var rc: UInt32 = 0
        let indexes = pcrs.map { UInt8(clamping: $0) }
        let result = secret.withUnsafeMutableBytes { bytes in
            outcome(coffer_tpm2_unseal(handle, object.publicBlob, object.publicBlob.count, object.privateBlob, object.privateBlob.count,
                               indexes, indexes.count, bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), bytes.count,
                               &length, &rc))
        }
        guard result == COFFER_TPM2_OK, length == size else {
            secret.wipe()
            switch result {
            case COFFER_TPM2_POLICY_FAIL: throw TPM2Error.policyMismatch
            case COFFER_TPM2_NOT_LOADABLE, COFFER_TPM2_BAD_INPUT: throw TPM2Error.notThisTPM
            default: throw TPM2Error.failed("the TPM did not unseal the key (TSS2 code 0x\(String(rc, radix: 16)))")
            }
        }
        return secret
    }
}

/// The shim's answer as its enum.
private func outcome(_ result: Int32) -> coffer_tpm2_result { coffer_tpm2_result(UInt32(bitPattern: result)) }

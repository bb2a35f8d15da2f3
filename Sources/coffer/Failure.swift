// Failure turns every error a command can meet into one stderr line and an exit status.
import ArgumentParser
import CofferCrypto
import CofferGate
import CofferKeyring
import CofferSystem
import CofferTPM
import CofferVault
import Glibc

func report(_ error: Error) -> ExitStatus {
    let (status, message) = classify(error)
    FileHandleStandardError.write("coffer: \(message)\n")
    return status
}

func classify(_ error: Error) -> (ExitStatus, String) {
    switch error {
    case let failure as CommandFailure:
        return (failure.status, failure.message)
    case let error as VaultError:
        let status: ExitStatus
        switch error {
        case .notAVault, .interruptedInit, .notAReverseSource: status = .notAVault
        case .alreadyMounted: status = .alreadyMounted
        case .notADirectory, .pathTooLong: status = .notADirectory
        case .journalDamaged: status = .stateDirectoryUnusable
        case .directoryNotEmpty, .reverseConfigExists: status = .notEmpty
        case .configMalformed, .configDamaged, .missingKeySlot: status = .configDamaged
        case .unsupportedFormat, .unsupportedParameter: status = .unsupported
        case .kdfParametersRefused: status = .kdfRefused
        case .cipherUnavailable: status = .cipherUnavailable
        case .wrongPassphrase: status = .wrongPassphrase
        case .wrongRecoveryKey: status = .wrongRecoveryKey
        case .wrongSlotKey: status = .wrongSlotKey
        case .lastWayIn: status = .lastWayIn
        case .slotNotFound: status = .slotNotFound
        case .slotLabelTaken: status = .slotLabelTaken
        case .slotAmbiguous: status = .slotAmbiguous
        case .invalidSlotLabel: status = .usage
        case .fileHeaderDamaged, .fileTruncated, .placeMismatch, .blockDamaged, .nameDamaged, .longNameDamaged,
             .symlinkSidecarDamaged, .directoryIVDamaged, .directoryIVMisplaced, .replacedByOtherWriter, .nameTooLong,
             .invalidName, .tooLong, .metadataDamaged, .dropRefused:
            status = .failure
        }
        return (status, error.description)
    case let error as TPM2Error:
        switch error {
        case .policyMismatch: return (.tpm2PolicyMismatch, "TPM2: \(error)")
        case .notThisTPM: return (.noTPM2Slot, "TPM2: \(error)")
        case .unavailable, .failed: return (.tpm2Unavailable, "TPM2: \(error)")
        }
    case let error as KeyringError:
        return (error == .notFound ? .noKeyringSlot : .keyringUnavailable, "\(error)")
    case let error as CryptoError:
        switch error {
        case .malformedRecoveryKey: return (.wrongRecoveryKey, error.description)
        case .blockAuthenticationFailed, .blockTooShort, .nameAuthenticationFailed, .sealedAuthenticationFailed, .kdfFailed, .malformed,
             .keyRetired:
            return (.failure, error.description)
        }
    case let error as Errno:
        return (.failure, error.description)
    case let error as SocketPath.Failure:
        return (.socketUnavailable, error.description)
    default:
        return (.failure, "\(error)")
    }
}

/// Runs a command body; any error becomes one line on stderr and its exit status.
func runReportingFailures(_ body: () throws -> Void) throws {
    // A peer that goes away must give EPIPE, not kill the process.
    signal(SIGPIPE, SIG_IGN)
    do {
        try body()
    } catch let exit as ExitCode {
        throw exit
    } catch {
        throw ExitCode(report(error).rawValue)
    }
}

/// Unbuffered writes to stderr (fd 2).
enum FileHandleStandardError {
    static func write(_ text: String) {
        var text = text
        text.withUTF8 { buffer in _ = Glibc.write(2, buffer.baseAddress, buffer.count) }
    }
}

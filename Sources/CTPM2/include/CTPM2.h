// CTPM2 seals and unseals a 32-byte slot key with a TPM 2.0 through libtss2 (ESAPI),
// loaded with dlopen at first use so that coffer runs on a machine without libtss2.
#ifndef COFFER_CTPM2_H
#define COFFER_CTPM2_H

#include <stddef.h>
#include <stdint.h>

/// What a call came to; `coffer_tpm2_*` return one of these.
enum coffer_tpm2_result {
    COFFER_TPM2_OK = 0,
    /// libtss2 (libtss2-esys.so.0, libtss2-tctildr.so.0, libtss2-mu.so.0) is not installed.
    COFFER_TPM2_NO_LIBRARY = 1,
    /// The TCTI could not be opened (no /dev/tpmrm0, no TPM simulator at the address).
    COFFER_TPM2_NO_DEVICE = 2,
    /// The sealed object's PCR policy does not match the PCRs now.
    COFFER_TPM2_POLICY_FAIL = 3,
    /// The TPM refused the blobs: they were sealed by another TPM (or damaged).
    COFFER_TPM2_NOT_LOADABLE = 4,
    /// Any other failure; `rc` holds the TSS2 response code.
    COFFER_TPM2_FAILED = 5,
    /// A buffer given was too small, or a blob does not parse.
    COFFER_TPM2_BAD_INPUT = 6,
};

/// An open TPM with this machine's storage primary key loaded.
typedef struct coffer_tpm2 coffer_tpm2;

/// Opens the TPM through the TCTI configuration `tcti` (e.g. "device:/dev/tpmrm0",
/// "swtpm:port=2321") and creates the storage primary key of the owner hierarchy from
/// the standard ECC P-256 template (deterministic: nothing is stored in the TPM).
int coffer_tpm2_open(const char *tcti, coffer_tpm2 **out, uint32_t *rc);

/// Flushes the primary key and closes the TPM.
void coffer_tpm2_close(coffer_tpm2 *tpm);

/// The TPM2 Name of the primary key (nameAlg ‖ SHA-256 of its public area): the same
/// on every open of one TPM, different on every other TPM (and after a TPM clear).
int coffer_tpm2_primary_name(coffer_tpm2 *tpm, uint8_t *name, size_t capacity, size_t *length);

/// Seals `secret` (at most 128 bytes) in a keyedhash object under the primary key, with a
/// PolicyPCR over `pcrs` (indexes 0–23, sha256 bank) when `pcr_count` > 0. Writes the
/// marshalled TPM2B_PUBLIC and TPM2B_PRIVATE.
int coffer_tpm2_seal(coffer_tpm2 *tpm, const uint8_t *secret, size_t secret_length,
                     const uint8_t *pcrs, size_t pcr_count,
                     uint8_t *public_blob, size_t public_capacity, size_t *public_length,
                     uint8_t *private_blob, size_t private_capacity, size_t *private_length, uint32_t *rc);

/// Loads the sealed object and unseals it into `secret` (satisfying its PCR policy over
/// `pcrs` when `pcr_count` > 0).
int coffer_tpm2_unseal(coffer_tpm2 *tpm, const uint8_t *public_blob, size_t public_length,
                       const uint8_t *private_blob, size_t private_length,
                       const uint8_t *pcrs, size_t pcr_count,
                       uint8_t *secret, size_t capacity, size_t *secret_length, uint32_t *rc);

#endif

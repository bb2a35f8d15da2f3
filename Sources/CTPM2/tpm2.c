// CTPM2 seals and unseals a slot key with the TPM through libtss2's ESAPI, which it loads
// with dlopen at first use (coffer runs without libtss2; only TPM slots need it). The
// layouts come from libtss2's own headers (libtss2-dev at build time).
//
// The sealed object has an empty auth value: what protects it is that only this TPM can
// load it (its private part is wrapped by this TPM's storage primary key, whose seed never
// leaves the TPM) and, when PCRs are given, the PolicyPCR policy, which lets the TPM unseal
// only while those PCRs hold the values they had at seal time. An auth value would be a
// PIN, which this slot kind is meant to do without. Both the secret sent to the TPM at
// seal time and the one it returns at unseal travel encrypted (a session salted with the
// primary key, AES-128-CFB parameter encryption), not in the clear on the TPM's bus.
#define _GNU_SOURCE
#include "CTPM2.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <tss2/tss2_esys.h>
#include <tss2/tss2_mu.h>
#include <tss2/tss2_tctildr.h>

/// The functions of libtss2 used here, resolved once.
static struct {
    int loaded;
    TSS2_RC (*tctildr_initialize)(const char *, TSS2_TCTI_CONTEXT **);
    void (*tctildr_finalize)(TSS2_TCTI_CONTEXT **);
    TSS2_RC (*initialize)(ESYS_CONTEXT **, TSS2_TCTI_CONTEXT *, TSS2_ABI_VERSION *);
    void (*finalize)(ESYS_CONTEXT **);
    TSS2_RC (*create_primary)(ESYS_CONTEXT *, ESYS_TR, ESYS_TR, ESYS_TR, ESYS_TR, const TPM2B_SENSITIVE_CREATE *,
                              const TPM2B_PUBLIC *, const TPM2B_DATA *, const TPML_PCR_SELECTION *, ESYS_TR *,
                              TPM2B_PUBLIC **, TPM2B_CREATION_DATA **, TPM2B_DIGEST **, TPMT_TK_CREATION **);
    TSS2_RC (*create)(ESYS_CONTEXT *, ESYS_TR, ESYS_TR, ESYS_TR, ESYS_TR, const TPM2B_SENSITIVE_CREATE *,
                      const TPM2B_PUBLIC *, const TPM2B_DATA *, const TPML_PCR_SELECTION *, TPM2B_PRIVATE **,
                      TPM2B_PUBLIC **, TPM2B_CREATION_DATA **, TPM2B_DIGEST **, TPMT_TK_CREATION **);
    TSS2_RC (*load)(ESYS_CONTEXT *, ESYS_TR, ESYS_TR, ESYS_TR, ESYS_TR, const TPM2B_PRIVATE *, const TPM2B_PUBLIC *, ESYS_TR *);
    TSS2_RC (*unseal)(ESYS_CONTEXT *, ESYS_TR, ESYS_TR, ESYS_TR, ESYS_TR, TPM2B_SENSITIVE_DATA **);
    TSS2_RC (*start_auth_session)(ESYS_CONTEXT *, ESYS_TR, ESYS_TR, ESYS_TR, ESYS_TR, ESYS_TR, const TPM2B_NONCE *,
                                  TPM2_SE, const TPMT_SYM_DEF *, TPMI_ALG_HASH, ESYS_TR *);
    TSS2_RC (*session_set_attributes)(ESYS_CONTEXT *, ESYS_TR, TPMA_SESSION, TPMA_SESSION);
    TSS2_RC (*policy_pcr)(ESYS_CONTEXT *, ESYS_TR, ESYS_TR, ESYS_TR, ESYS_TR, const TPM2B_DIGEST *, const TPML_PCR_SELECTION *);
    TSS2_RC (*policy_get_digest)(ESYS_CONTEXT *, ESYS_TR, ESYS_TR, ESYS_TR, ESYS_TR, TPM2B_DIGEST **);
    TSS2_RC (*flush_context)(ESYS_CONTEXT *, ESYS_TR);
    TSS2_RC (*get_name)(ESYS_CONTEXT *, ESYS_TR, TPM2B_NAME **);
    void (*free)(void *);
    TSS2_RC (*public_marshal)(const TPM2B_PUBLIC *, uint8_t[], size_t, size_t *);
    TSS2_RC (*public_unmarshal)(const uint8_t[], size_t, size_t *, TPM2B_PUBLIC *);
    TSS2_RC (*private_marshal)(const TPM2B_PRIVATE *, uint8_t[], size_t, size_t *);
    TSS2_RC (*private_unmarshal)(const uint8_t[], size_t, size_t *, TPM2B_PRIVATE *);
} tss;

static pthread_once_t tss_once = PTHREAD_ONCE_INIT;

#define RESOLVE(handle, field, name) ok = ok && (*(void **)&tss.field = dlsym(handle, name)) != NULL

static void load_tss(void) {
    // libtss2 logs its errors to stderr unless told otherwise; coffer reports them itself
    // (a slot of another machine is skipped quietly). A TSS2_LOG the user set is kept.
    setenv("TSS2_LOG", "all+NONE", 0);
    void *ldr = dlopen("libtss2-tctildr.so.0", RTLD_NOW | RTLD_LOCAL);
    void *esys = dlopen("libtss2-esys.so.0", RTLD_NOW | RTLD_LOCAL);
    void *mu = dlopen("libtss2-mu.so.0", RTLD_NOW | RTLD_LOCAL);
    if (ldr == NULL || esys == NULL || mu == NULL) return;
    int ok = 1;
    RESOLVE(ldr, tctildr_initialize, "Tss2_TctiLdr_Initialize");
    RESOLVE(ldr, tctildr_finalize, "Tss2_TctiLdr_Finalize");
    RESOLVE(esys, initialize, "Esys_Initialize");
    RESOLVE(esys, finalize, "Esys_Finalize");
    RESOLVE(esys, create_primary, "Esys_CreatePrimary");
    RESOLVE(esys, create, "Esys_Create");
    RESOLVE(esys, load, "Esys_Load");
    RESOLVE(esys, unseal, "Esys_Unseal");
    RESOLVE(esys, start_auth_session, "Esys_StartAuthSession");
    RESOLVE(esys, session_set_attributes, "Esys_TRSess_SetAttributes");
    RESOLVE(esys, policy_pcr, "Esys_PolicyPCR");
    RESOLVE(esys, policy_get_digest, "Esys_PolicyGetDigest");
    RESOLVE(esys, flush_context, "Esys_FlushContext");
    RESOLVE(esys, get_name, "Esys_TR_GetName");
    RESOLVE(esys, free, "Esys_Free");
    RESOLVE(mu, public_marshal, "Tss2_MU_TPM2B_PUBLIC_Marshal");
    RESOLVE(mu, public_unmarshal, "Tss2_MU_TPM2B_PUBLIC_Unmarshal");
    RESOLVE(mu, private_marshal, "Tss2_MU_TPM2B_PRIVATE_Marshal");
    RESOLVE(mu, private_unmarshal, "Tss2_MU_TPM2B_PRIVATE_Unmarshal");
    tss.loaded = ok;
}

struct coffer_tpm2 {
    TSS2_TCTI_CONTEXT *tcti;
    ESYS_CONTEXT *esys;
    ESYS_TR primary;
};

/// AES-128-CFB, for parameter encryption and the primary key's symmetric part.
static const TPMT_SYM_DEF aes128cfb = {
    .algorithm = TPM2_ALG_AES, .keyBits = {.aes = 128}, .mode = {.aes = TPM2_ALG_CFB}};

/// Whether `rc` is the TPM's TPM_RC_POLICY_FAIL (a format-one code, with any session,
/// handle or parameter number): the policy session's digest is not the object's policy.
static int is_policy_fail(TSS2_RC rc) {
    return (rc & TSS2_RC_LAYER_MASK) == TSS2_TPM_RC_LAYER && (rc & TPM2_RC_FMT1) != 0
        && (rc & 0x3F) == (TPM2_RC_POLICY_FAIL & 0x3F);
}

int coffer_tpm2_open(const char *tcti, coffer_tpm2 **out, uint32_t *rc) {
    *rc = 0;
    pthread_once(&tss_once, load_tss);
    if (!tss.loaded) return COFFER_TPM2_NO_LIBRARY;
    coffer_tpm2 *tpm = calloc(1, sizeof *tpm);
    if (tpm == NULL) return COFFER_TPM2_FAILED;
    tpm->primary = ESYS_TR_NONE;
    if ((*rc = tss.tctildr_initialize(tcti, &tpm->tcti)) != TSS2_RC_SUCCESS) {
        free(tpm);
        return COFFER_TPM2_NO_DEVICE;
    }
    if ((*rc = tss.initialize(&tpm->esys, tpm->tcti, NULL)) != TSS2_RC_SUCCESS) {
        tss.tctildr_finalize(&tpm->tcti);
        free(tpm);
        return COFFER_TPM2_NO_DEVICE;
    }
    // The storage root key template of the TCG's provisioning guidance (ECC NIST P-256,
    // AES-128-CFB, unique of 32 zero bytes each for x and y): the TPM derives the same
    // key from its owner seed every time, so nothing needs to be persisted in the TPM.
    TPM2B_PUBLIC template = {.publicArea = {
        .type = TPM2_ALG_ECC,
        .nameAlg = TPM2_ALG_SHA256,
        .objectAttributes = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT | TPMA_OBJECT_SENSITIVEDATAORIGIN
            | TPMA_OBJECT_USERWITHAUTH | TPMA_OBJECT_NODA | TPMA_OBJECT_RESTRICTED | TPMA_OBJECT_DECRYPT,
        .parameters = {.eccDetail = {
            .symmetric = {.algorithm = TPM2_ALG_AES, .keyBits = {.aes = 128}, .mode = {.aes = TPM2_ALG_CFB}},
            .scheme = {.scheme = TPM2_ALG_NULL},
            .curveID = TPM2_ECC_NIST_P256,
            .kdf = {.scheme = TPM2_ALG_NULL}}},
        .unique = {.ecc = {.x = {.size = 32}, .y = {.size = 32}}}}};
    TPM2B_SENSITIVE_CREATE empty = {0};
    TPM2B_DATA outside = {0};
    TPML_PCR_SELECTION none = {0};
    *rc = tss.create_primary(tpm->esys, ESYS_TR_RH_OWNER, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE, &empty,
                             &template, &outside, &none, &tpm->primary, NULL, NULL, NULL, NULL);
    if (*rc != TSS2_RC_SUCCESS) {
        coffer_tpm2_close(tpm);
        return COFFER_TPM2_FAILED;
    }
    *out = tpm;
    return COFFER_TPM2_OK;
}

void coffer_tpm2_close(coffer_tpm2 *tpm) {
    if (tpm == NULL) return;
    if (tpm->primary != ESYS_TR_NONE) tss.flush_context(tpm->esys, tpm->primary);
    tss.finalize(&tpm->esys);
    tss.tctildr_finalize(&tpm->tcti);
    free(tpm);
}

int coffer_tpm2_primary_name(coffer_tpm2 *tpm, uint8_t *name, size_t capacity, size_t *length) {
    TPM2B_NAME *got = NULL;
    if (tss.get_name(tpm->esys, tpm->primary, &got) != TSS2_RC_SUCCESS) return COFFER_TPM2_FAILED;
    int result = COFFER_TPM2_BAD_INPUT;
    if (got->size <= capacity) {
        memcpy(name, got->name, got->size);
        *length = got->size;
        result = COFFER_TPM2_OK;
    }
    tss.free(got);
    return result;
}

/// The sha256-bank selection of `pcrs`; 0 if an index is out of range.
static int pcr_selection(const uint8_t *pcrs, size_t count, TPML_PCR_SELECTION *selection) {
    memset(selection, 0, sizeof *selection);
    selection->count = 1;
    selection->pcrSelections[0].hash = TPM2_ALG_SHA256;
    selection->pcrSelections[0].sizeofSelect = 3;
    for (size_t i = 0; i < count; i++) {
        if (pcrs[i] > 23) return 0;
        selection->pcrSelections[0].pcrSelect[pcrs[i] / 8] |= (uint8_t)(1u << (pcrs[i] % 8));
    }
    return 1;
}

/// A session salted with the primary key that encrypts the first command parameter and
/// the first response parameter (`type`: HMAC, or POLICY for the PCR policy).
static TSS2_RC start_session(coffer_tpm2 *tpm, TPM2_SE type, TPMA_SESSION attributes, ESYS_TR *session) {
    TSS2_RC rc = tss.start_auth_session(tpm->esys, tpm->primary, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE,
                                        NULL, type, &aes128cfb, TPM2_ALG_SHA256, session);
    if (rc != TSS2_RC_SUCCESS) return rc;
    rc = tss.session_set_attributes(tpm->esys, *session, attributes, 0xff);
    if (rc != TSS2_RC_SUCCESS) tss.flush_context(tpm->esys, *session);
    return rc;
}

int coffer_tpm2_seal(coffer_tpm2 *tpm, const uint8_t *secret, size_t secret_length,
                     const uint8_t *pcrs, size_t pcr_count,
                     uint8_t *public_blob, size_t public_capacity, size_t *public_length,
                     uint8_t *private_blob, size_t private_capacity, size_t *private_length, uint32_t *rc) {
    *rc = 0;
    TPML_PCR_SELECTION selection;
    if (secret_length > sizeof(((TPM2B_SENSITIVE_DATA *)0)->buffer) || !pcr_selection(pcrs, pcr_count, &selection)) {
        return COFFER_TPM2_BAD_INPUT;
    }
    TPM2B_PUBLIC template = {.publicArea = {
        .type = TPM2_ALG_KEYEDHASH,
        .nameAlg = TPM2_ALG_SHA256,
        // No userWithAuth with a policy: then the policy is the only way to use the object.
        .objectAttributes = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT | TPMA_OBJECT_NODA
            | (pcr_count == 0 ? TPMA_OBJECT_USERWITHAUTH : 0),
        .parameters = {.keyedHashDetail = {.scheme = {.scheme = TPM2_ALG_NULL}}}}};
    if (pcr_count > 0) {
        // The policy's digest over the PCRs as they are now, from a trial session.
        ESYS_TR trial = ESYS_TR_NONE;
        TPM2B_DIGEST now = {0}, *digest = NULL;
        *rc = tss.start_auth_session(tpm->esys, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE,
                                     NULL, TPM2_SE_TRIAL, &(TPMT_SYM_DEF){.algorithm = TPM2_ALG_NULL},
                                     TPM2_ALG_SHA256, &trial);
        if (*rc == TSS2_RC_SUCCESS) {
            *rc = tss.policy_pcr(tpm->esys, trial, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, &now, &selection);
            if (*rc == TSS2_RC_SUCCESS)
                *rc = tss.policy_get_digest(tpm->esys, trial, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, &digest);
            tss.flush_context(tpm->esys, trial);
        }
        if (*rc != TSS2_RC_SUCCESS) return COFFER_TPM2_FAILED;
        template.publicArea.authPolicy = *digest;
        tss.free(digest);
    }
    TPM2B_SENSITIVE_CREATE sensitive = {0};
    sensitive.sensitive.data.size = (UINT16)secret_length;
    memcpy(sensitive.sensitive.data.buffer, secret, secret_length);
    TPM2B_DATA outside = {0};
    TPML_PCR_SELECTION none = {0};
    TPM2B_PRIVATE *out_private = NULL;
    TPM2B_PUBLIC *out_public = NULL;
    ESYS_TR encrypt = ESYS_TR_NONE;
    *rc = start_session(tpm, TPM2_SE_HMAC, TPMA_SESSION_DECRYPT | TPMA_SESSION_CONTINUESESSION, &encrypt);
    if (*rc == TSS2_RC_SUCCESS) {
        *rc = tss.create(tpm->esys, tpm->primary, ESYS_TR_PASSWORD, encrypt, ESYS_TR_NONE, &sensitive, &template,
                         &outside, &none, &out_private, &out_public, NULL, NULL, NULL);
        tss.flush_context(tpm->esys, encrypt);
    }
    explicit_bzero(&sensitive, sizeof sensitive);
    if (*rc != TSS2_RC_SUCCESS) return COFFER_TPM2_FAILED;
    size_t public_offset = 0, private_offset = 0;
    int result = COFFER_TPM2_OK;
    if (tss.public_marshal(out_public, public_blob, public_capacity, &public_offset) != TSS2_RC_SUCCESS
        || tss.private_marshal(out_private, private_blob, private_capacity, &private_offset) != TSS2_RC_SUCCESS) {
        result = COFFER_TPM2_BAD_INPUT;
    }
    *public_length = public_offset;
    *private_length = private_offset;
    tss.free(out_public);
    tss.free(out_private);
    return result;
}

int coffer_tpm2_unseal(coffer_tpm2 *tpm, const uint8_t *public_blob, size_t public_length,
                       const uint8_t *private_blob, size_t private_length,
                       const uint8_t *pcrs, size_t pcr_count,
                       uint8_t *secret, size_t capacity, size_t *secret_length, uint32_t *rc) {
    *rc = 0;
    TPM2B_PUBLIC in_public = {0};
    TPM2B_PRIVATE in_private = {0};
    TPML_PCR_SELECTION selection;
    size_t offset = 0, private_offset = 0;
    if (tss.public_unmarshal(public_blob, public_length, &offset, &in_public) != TSS2_RC_SUCCESS || offset != public_length
        || tss.private_unmarshal(private_blob, private_length, &private_offset, &in_private) != TSS2_RC_SUCCESS
        || private_offset != private_length || !pcr_selection(pcrs, pcr_count, &selection)) {
        return COFFER_TPM2_BAD_INPUT;
    }
    ESYS_TR object = ESYS_TR_NONE;
    *rc = tss.load(tpm->esys, tpm->primary, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE, &in_private, &in_public, &object);
    if (*rc != TSS2_RC_SUCCESS) {
        // The TPM refuses a private part that its own primary key did not wrap.
        return (*rc & TSS2_RC_LAYER_MASK) == TSS2_TPM_RC_LAYER ? COFFER_TPM2_NOT_LOADABLE : COFFER_TPM2_FAILED;
    }
    ESYS_TR session = ESYS_TR_NONE;
    TPM2B_SENSITIVE_DATA *out = NULL;
    if (pcr_count > 0) {
        *rc = start_session(tpm, TPM2_SE_POLICY, TPMA_SESSION_ENCRYPT | TPMA_SESSION_CONTINUESESSION, &session);
        if (*rc == TSS2_RC_SUCCESS) {
            TPM2B_DIGEST now = {0};
            *rc = tss.policy_pcr(tpm->esys, session, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, &now, &selection);
            if (*rc == TSS2_RC_SUCCESS)
                *rc = tss.unseal(tpm->esys, object, session, ESYS_TR_NONE, ESYS_TR_NONE, &out);
            tss.flush_context(tpm->esys, session);
        }
    } else {
        *rc = start_session(tpm, TPM2_SE_HMAC, TPMA_SESSION_ENCRYPT | TPMA_SESSION_CONTINUESESSION, &session);
        if (*rc == TSS2_RC_SUCCESS) {
            *rc = tss.unseal(tpm->esys, object, ESYS_TR_PASSWORD, session, ESYS_TR_NONE, &out);
            tss.flush_context(tpm->esys, session);
        }
    }
    tss.flush_context(tpm->esys, object);
    if (*rc != TSS2_RC_SUCCESS) return is_policy_fail(*rc) ? COFFER_TPM2_POLICY_FAIL : COFFER_TPM2_FAILED;
    int result = COFFER_TPM2_BAD_INPUT;
    if (out->size <= capacity) {
        memcpy(secret, out->buffer, out->size);
        *secret_length = out->size;
        result = COFFER_TPM2_OK;
    }
    explicit_bzero(out, sizeof *out);
    tss.free(out);
    return result;
}

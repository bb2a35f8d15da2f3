// CIPSecMB gives Swift the AES-256-GCM calls of Intel's Multi-Buffer Crypto library
// (ipsec-mb, Debian's libipsec-mb1), loaded at run time with dlopen: coffer builds and
// runs where the library is missing (then libsodium seals every block). The key data and
// the per-call context are the caller's memory (sodium_malloc'ed, in CofferCrypto); this
// shim never allocates, copies or keeps a key. Nothing else belongs here.
#ifndef COFFER_CIPSECMB_H
#define COFFER_CIPSECMB_H

#include <stddef.h>
#include <stdint.h>

/// Loads libIPSec_MB.so.1 and picks its fastest code for this CPU (init_mb_mgr_auto).
/// Returns 0, or -1 with `*why` set to a static sentence saying why ipsec-mb cannot be
/// used (not built in, library missing, another version than the header's, no AES-NI).
/// Call once, before any other function here.
int cipsecmb_load(const char **why);

/// The library's version ("1.3.0") and the code it chose ("avx512", "avx2", "avx", "sse");
/// valid after a successful load.
const char *cipsecmb_version(void);
const char *cipsecmb_arch(void);

/// sizeof and alignment of `struct gcm_key_data` (round keys and hash keys) and sizeof
/// `struct gcm_context_data` (one call's state), from the library's header.
size_t cipsecmb_key_data_size(void);
size_t cipsecmb_key_data_alignment(void);
size_t cipsecmb_context_size(void);

/// Expands the 32-byte `key` into `key_data` (aes_gcm_pre_256).
void cipsecmb_prepare(const uint8_t *key, void *key_data);

/// AES-256-GCM with a 12-byte IV and a 16-byte tag, in one call: `out` gets `length`
/// bytes, `tag` the tag (computed when opening, for the caller to compare).
void cipsecmb_seal(const void *key_data, void *context, uint8_t *out, const uint8_t *in, uint64_t length,
                   const uint8_t *iv, const uint8_t *ad, uint64_t ad_length, uint8_t *tag);
void cipsecmb_open(const void *key_data, void *context, uint8_t *out, const uint8_t *in, uint64_t length,
                   const uint8_t *iv, const uint8_t *ad, uint64_t ad_length, uint8_t *tag);

#endif

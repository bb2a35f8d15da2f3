// CIPSecMB.c loads ipsec-mb with dlopen and calls its AES-256-GCM code through the
// function pointers of one IMB_MGR (see include/CIPSecMB.h). The structures come from
// the library's own header (libipsec-mb-dev); built without it, or off x86-64, every
// load fails with a reason and coffer uses libsodium.
#include "CIPSecMB.h"

#if defined(__x86_64__) && __has_include(<intel-ipsec-mb.h>)
// The header declares gcm_key_data 64-byte aligned only under LINUX.
#define LINUX 1
#include <dlfcn.h>
#include <intel-ipsec-mb.h>

static IMB_MGR *manager;
static const char *arch_name = "none";

int cipsecmb_load(const char **why) {
    // RTLD_LOCAL: its symbols stay out of the process's namespace.
    void *library = dlopen("libIPSec_MB.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        *why = "libIPSec_MB.so.1 is not installed (Debian: apt-get install libipsec-mb1)";
        return -1;
    }
    unsigned (*get_version)(void) = (unsigned (*)(void))dlsym(library, "imb_get_version");
    IMB_MGR *(*alloc)(uint64_t) = (IMB_MGR *(*)(uint64_t))dlsym(library, "alloc_mb_mgr");
    void (*init_auto)(IMB_MGR *, IMB_ARCH *) = (void (*)(IMB_MGR *, IMB_ARCH *))dlsym(library, "init_mb_mgr_auto");
    if (get_version == NULL || alloc == NULL || init_auto == NULL) {
        *why = "libIPSec_MB.so.1 lacks imb_get_version, alloc_mb_mgr or init_mb_mgr_auto";
        return -1;
    }
    // IMB_MGR's layout (where the function pointers are) is fixed per minor version:
    // the library must be the one whose header coffer was built with.
    if ((get_version() >> 8) != (IMB_VERSION_NUM >> 8)) {
        *why = "libIPSec_MB.so.1 is another version than the " IMB_VERSION_STR " coffer was built with (rebuild coffer)";
        return -1;
    }
    IMB_MGR *mgr = alloc(0);
    if (mgr == NULL) {
        *why = "alloc_mb_mgr failed";
        return -1;
    }
    IMB_ARCH arch = IMB_ARCH_NONE;
    init_auto(mgr, &arch);
    switch (arch) {
    case IMB_ARCH_SSE: arch_name = "sse"; break;
    case IMB_ARCH_AVX: arch_name = "avx"; break;
    case IMB_ARCH_AVX2: arch_name = "avx2"; break;
    case IMB_ARCH_AVX512: arch_name = "avx512"; break;
    default:
        // IMB_ARCH_NOAESNI: ipsec-mb's table-based AES, slower than libsodium's and not
        // constant-time.
        *why = "ipsec-mb found no AES-NI on this CPU";
        return -1;
    }
    if (mgr->gcm256_pre == NULL || mgr->gcm256_enc == NULL || mgr->gcm256_dec == NULL) {
        *why = "ipsec-mb has no AES-256-GCM code for this CPU";
        return -1;
    }
    manager = mgr;
    return 0;
}

const char *cipsecmb_version(void) { return IMB_VERSION_STR; }
const char *cipsecmb_arch(void) { return arch_name; }
size_t cipsecmb_key_data_size(void) { return sizeof(struct gcm_key_data); }
size_t cipsecmb_key_data_alignment(void) { return _Alignof(struct gcm_key_data); }
size_t cipsecmb_context_size(void) { return sizeof(struct gcm_context_data); }

void cipsecmb_prepare(const uint8_t *key, void *key_data) {
    // Without a successful load there is no code to call: a caller's bug, stop here.
    if (manager == NULL) __builtin_trap();
    IMB_AES256_GCM_PRE(manager, key, (struct gcm_key_data *)key_data);
}

void cipsecmb_seal(const void *key_data, void *context, uint8_t *out, const uint8_t *in, uint64_t length,
                   const uint8_t *iv, const uint8_t *ad, uint64_t ad_length, uint8_t *tag) {
    IMB_AES256_GCM_ENC(manager, (const struct gcm_key_data *)key_data, (struct gcm_context_data *)context,
                       out, in, length, iv, ad, ad_length, tag, 16);
}

void cipsecmb_open(const void *key_data, void *context, uint8_t *out, const uint8_t *in, uint64_t length,
                   const uint8_t *iv, const uint8_t *ad, uint64_t ad_length, uint8_t *tag) {
    IMB_AES256_GCM_DEC(manager, (const struct gcm_key_data *)key_data, (struct gcm_context_data *)context,
                       out, in, length, iv, ad, ad_length, tag, 16);
}

#else

int cipsecmb_load(const char **why) {
#if defined(__x86_64__)
    *why = "coffer was built without ipsec-mb's header (Debian: libipsec-mb-dev)";
#else
    *why = "ipsec-mb runs on x86-64 only";
#endif
    return -1;
}
const char *cipsecmb_version(void) { return "none"; }
const char *cipsecmb_arch(void) { return "none"; }
size_t cipsecmb_key_data_size(void) { return 0; }
size_t cipsecmb_key_data_alignment(void) { return 1; }
size_t cipsecmb_context_size(void) { return 0; }
void cipsecmb_prepare(const uint8_t *key, void *key_data) { __builtin_trap(); }
void cipsecmb_seal(const void *key_data, void *context, uint8_t *out, const uint8_t *in, uint64_t length,
                   const uint8_t *iv, const uint8_t *ad, uint64_t ad_length, uint8_t *tag) { __builtin_trap(); }
void cipsecmb_open(const void *key_data, void *context, uint8_t *out, const uint8_t *in, uint64_t length,
                   const uint8_t *iv, const uint8_t *ad, uint64_t ad_length, uint8_t *tag) { __builtin_trap(); }

#endif

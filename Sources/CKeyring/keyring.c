// CKeyring keeps slot keys in the Secret Service through libsecret, loaded with dlopen at
// first use. libsecret's headers need GLib's include paths, which a SwiftPM C target
// cannot take from pkg-config without linking the libraries too; so the few types used
// here are declared below, each as its header has it (libsecret 0.20, ABI libsecret-1.so.0,
// stable since 2013; GLib 2.x). Only the layout of SecretSchema and GError matters.
#define _GNU_SOURCE
#include "CKeyring.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

// <glib/gerror.h>: struct _GError.
typedef struct { uint32_t domain; int code; char *message; } GError;
typedef struct GHashTable GHashTable;
typedef struct SecretService SecretService;
typedef struct SecretCollection SecretCollection;
typedef struct SecretValue SecretValue;
// <libsecret/secret-schema.h>: SecretSchemaAttribute, SecretSchema.
typedef struct { const char *name; int type; } SecretSchemaAttribute;
typedef struct {
    const char *name;
    int flags;
    SecretSchemaAttribute attributes[32];
    int reserved;
    void *reserved1, *reserved2, *reserved3, *reserved4, *reserved5, *reserved6, *reserved7;
} SecretSchema;
enum { SECRET_SCHEMA_NONE = 0, SECRET_SCHEMA_ATTRIBUTE_STRING = 0 };
// <libsecret/secret-service.h>, <libsecret/secret-collection.h>.
enum { SECRET_SERVICE_OPEN_SESSION = 1 << 1, SECRET_COLLECTION_NONE = 0 };

/// The item schema of a coffer slot key: which vault (its config's checksum) and which
/// slot (its id).
static const SecretSchema schema = {
    .name = "io.github.coffer.SlotKey",
    .flags = SECRET_SCHEMA_NONE,
    .attributes = {{"vault", SECRET_SCHEMA_ATTRIBUTE_STRING}, {"slot", SECRET_SCHEMA_ATTRIBUTE_STRING}, {NULL, 0}},
};

static struct {
    int loaded;
    unsigned (*str_hash)(const void *);
    int (*str_equal)(const void *, const void *);
    GHashTable *(*hash_table_new)(unsigned (*)(const void *), int (*)(const void *, const void *));
    void (*hash_table_insert)(GHashTable *, void *, void *);
    void (*hash_table_unref)(GHashTable *);
    void (*error_free)(GError *);
    void (*object_unref)(void *);
    SecretService *(*service_get_sync)(int, void *, GError **);
    SecretCollection *(*collection_for_alias_sync)(SecretService *, const char *, int, void *, GError **);
    int (*collection_get_locked)(SecretCollection *);
    int (*storev_binary_sync)(const SecretSchema *, GHashTable *, const char *, const char *, SecretValue *, void *, GError **);
    SecretValue *(*lookupv_binary_sync)(const SecretSchema *, GHashTable *, void *, GError **);
    int (*clearv_sync)(const SecretSchema *, GHashTable *, void *, GError **);
    SecretValue *(*value_new)(const char *, long, const char *);
    const char *(*value_get)(SecretValue *, size_t *);
    void (*value_unref)(void *);
} lib;

static pthread_once_t lib_once = PTHREAD_ONCE_INIT;

#define RESOLVE(field, name) ok = ok && (*(void **)&lib.field = dlsym(handle, name)) != NULL

static void load_libsecret(void) {
    // libsecret brings GLib, GObject and GIO with it; dlsym on its handle finds theirs.
    void *handle = dlopen("libsecret-1.so.0", RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) return;
    int ok = 1;
    RESOLVE(str_hash, "g_str_hash");
    RESOLVE(str_equal, "g_str_equal");
    RESOLVE(hash_table_new, "g_hash_table_new");
    RESOLVE(hash_table_insert, "g_hash_table_insert");
    RESOLVE(hash_table_unref, "g_hash_table_unref");
    RESOLVE(error_free, "g_error_free");
    RESOLVE(object_unref, "g_object_unref");
    RESOLVE(service_get_sync, "secret_service_get_sync");
    RESOLVE(collection_for_alias_sync, "secret_collection_for_alias_sync");
    RESOLVE(collection_get_locked, "secret_collection_get_locked");
    RESOLVE(storev_binary_sync, "secret_password_storev_binary_sync");
    RESOLVE(lookupv_binary_sync, "secret_password_lookupv_binary_sync");
    RESOLVE(clearv_sync, "secret_password_clearv_sync");
    RESOLVE(value_new, "secret_value_new");
    RESOLVE(value_get, "secret_value_get");
    RESOLVE(value_unref, "secret_value_unref");
    lib.loaded = ok;
}

/// Copies `error`'s message (or `fallback`) into `message`, frees the error, returns `result`.
static int fail(int result, GError *error, const char *fallback, char *message, size_t capacity) {
    if (capacity > 0) snprintf(message, capacity, "%s", error != NULL && error->message != NULL ? error->message : fallback);
    if (error != NULL) lib.error_free(error);
    return result;
}

/// Loads libsecret and checks that a Secret Service answers, with a default collection
/// that is unlocked: libsecret alone would answer "no item" for a locked or absent one.
static int ready(char *message, size_t capacity) {
    pthread_once(&lib_once, load_libsecret);
    if (!lib.loaded) return fail(COFFER_KEYRING_NO_LIBRARY, NULL, "libsecret-1.so.0 is not installed", message, capacity);
    GError *error = NULL;
    SecretService *service = lib.service_get_sync(SECRET_SERVICE_OPEN_SESSION, NULL, &error);
    if (service == NULL) return fail(COFFER_KEYRING_UNAVAILABLE, error, "no Secret Service", message, capacity);
    SecretCollection *collection = lib.collection_for_alias_sync(service, "default", SECRET_COLLECTION_NONE, NULL, &error);
    lib.object_unref(service);
    if (collection == NULL) {
        return fail(COFFER_KEYRING_UNAVAILABLE, error, "the Secret Service has no default keyring", message, capacity);
    }
    int locked = lib.collection_get_locked(collection);
    lib.object_unref(collection);
    if (locked) return fail(COFFER_KEYRING_LOCKED, NULL, "the default keyring is locked", message, capacity);
    return COFFER_KEYRING_OK;
}

static GHashTable *attributes(const char *vault, const char *slot) {
    GHashTable *table = lib.hash_table_new(lib.str_hash, lib.str_equal);
    lib.hash_table_insert(table, "vault", (void *)vault);
    lib.hash_table_insert(table, "slot", (void *)slot);
    return table;
}

int coffer_keyring_store(const char *vault, const char *slot, const char *label,
                         const uint8_t *secret, size_t length, char *message, size_t message_capacity) {
    int state = ready(message, message_capacity);
    if (state != COFFER_KEYRING_OK) return state;
    // secret_value_new copies the bytes into libsecret's own locked memory, zeroed when freed.
    SecretValue *value = lib.value_new((const char *)secret, (long)length, "application/octet-stream");
    GHashTable *table = attributes(vault, slot);
    GError *error = NULL;
    int stored = lib.storev_binary_sync(&schema, table, "default", label, value, NULL, &error);
    lib.hash_table_unref(table);
    lib.value_unref(value);
    return stored ? COFFER_KEYRING_OK : fail(COFFER_KEYRING_FAILED, error, "the keyring did not store the item", message, message_capacity);
}

int coffer_keyring_lookup(const char *vault, const char *slot, uint8_t *secret, size_t capacity, size_t *length,
                          char *message, size_t message_capacity) {
    int state = ready(message, message_capacity);
    if (state != COFFER_KEYRING_OK) return state;
    GHashTable *table = attributes(vault, slot);
    GError *error = NULL;
    SecretValue *value = lib.lookupv_binary_sync(&schema, table, NULL, &error);
    lib.hash_table_unref(table);
    if (value == NULL) {
        return error != NULL ? fail(COFFER_KEYRING_FAILED, error, "", message, message_capacity) : COFFER_KEYRING_NOT_FOUND;
    }
    size_t size = 0;
    char *bytes = (char *)lib.value_get(value, &size);
    int result = COFFER_KEYRING_FAILED;
    if (size <= capacity) {
        memcpy(secret, bytes, size);
        *length = size;
        result = COFFER_KEYRING_OK;
    }
    // This is the last reference: its bytes are zeroed here rather than trusted to the free.
    explicit_bzero(bytes, size);
    lib.value_unref(value);
    if (result != COFFER_KEYRING_OK) snprintf(message, message_capacity, "the keyring item holds %zu bytes, not a slot key", size);
    return result;
}

int coffer_keyring_clear(const char *vault, const char *slot, char *message, size_t message_capacity) {
    int state = ready(message, message_capacity);
    if (state != COFFER_KEYRING_OK) return state;
    GHashTable *table = attributes(vault, slot);
    GError *error = NULL;
    int cleared = lib.clearv_sync(&schema, table, NULL, &error);
    lib.hash_table_unref(table);
    if (error != NULL) return fail(COFFER_KEYRING_FAILED, error, "", message, message_capacity);
    return cleared ? COFFER_KEYRING_OK : COFFER_KEYRING_NOT_FOUND;
}

// CKeyring keeps a slot key in the user's desktop keyring (the Secret Service) through
// libsecret, loaded with dlopen at first use so that coffer runs without libsecret and
// no process but the `coffer` command that asks for it ever loads it (nor GLib).
#ifndef COFFER_CKEYRING_H
#define COFFER_CKEYRING_H

#include <stddef.h>
#include <stdint.h>

/// What a call came to; `coffer_keyring_*` return one of these.
enum coffer_keyring_result {
    COFFER_KEYRING_OK = 0,
    /// libsecret-1.so.0 is not installed.
    COFFER_KEYRING_NO_LIBRARY = 1,
    /// No Secret Service answers on the session bus (or there is no session bus), or it
    /// has no default collection; `message` says which.
    COFFER_KEYRING_UNAVAILABLE = 2,
    /// The default collection is locked (the desktop session has not unlocked it).
    COFFER_KEYRING_LOCKED = 3,
    /// No item has those attributes.
    COFFER_KEYRING_NOT_FOUND = 4,
    /// Any other failure; `message` says what.
    COFFER_KEYRING_FAILED = 5,
};

/// Stores `secret` in the default collection as the item of schema
/// io.github.coffer.SlotKey with attributes vault=`vault`, slot=`slot`, labelled `label`
/// (an item with the same attributes is replaced).
int coffer_keyring_store(const char *vault, const char *slot, const char *label,
                         const uint8_t *secret, size_t length, char *message, size_t message_capacity);

/// Looks the item of vault=`vault`, slot=`slot` up and copies its secret into `secret`.
int coffer_keyring_lookup(const char *vault, const char *slot, uint8_t *secret, size_t capacity, size_t *length,
                          char *message, size_t message_capacity);

/// Deletes the item of vault=`vault`, slot=`slot` (NOT_FOUND if there was none).
int coffer_keyring_clear(const char *vault, const char *slot, char *message, size_t message_capacity);

#endif

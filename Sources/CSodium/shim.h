// The libsodium headers, for Swift, and two helpers Swift cannot write.
#include <sodium.h>

/// Zeroes the 4 KiB of stack below the caller, where the frames of the libsodium calls
/// it just made lay: libsodium 1.0.18's blake2b_final leaves its output in a local
/// buffer it does not wipe, so a key derived by BLAKE2b stays in a dead stack frame
/// until something else is called that deep (the memory scan after a lock found one).
/// Not inlined, so that its frame is where those calls' frames were.
__attribute__((noinline)) static void coffer_scrub_stack(void) {
    unsigned char below[4096];
    sodium_memzero(below, sizeof below);
}

/// The same for `bytes` bytes of stack (a variable-length array: its frame is that deep),
/// for calls whose frames lie deeper: ContentCipher's block calls (libsodium's
/// AES-256-GCM open leaves the file key in them).
__attribute__((noinline)) static void coffer_scrub_stack_bytes(size_t bytes) {
    unsigned char below[bytes];
    sodium_memzero(below, bytes);
}

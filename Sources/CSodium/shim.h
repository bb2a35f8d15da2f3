// The libsodium headers, for Swift, and one helper Swift cannot write.
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

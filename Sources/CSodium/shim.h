// The libsodium headers, for Swift. Nothing else belongs here.
#include <sodium.h>

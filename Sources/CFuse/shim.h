// The libfuse3 low-level API, for Swift, and the kernel's FUSE wire structures (for
// the INIT flags libfuse 3.14 cannot ask for, and the requests and replies a ring entry
// carries; see SessionIO.swift and UringTransport.swift).
// Nothing else belongs here.
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <linux/fuse.h>

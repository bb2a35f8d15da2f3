// The libfuse3 low-level API, for Swift. Nothing else belongs here.
#define FUSE_USE_VERSION 35
#include <fuse_lowlevel.h>

// CLinux gives Swift the Linux calls and constants that glibc declares only under
// _GNU_SOURCE, which Swift's Glibc module is built without (renameat2, fallocate,
// syncfs, pipe2, malloc_trim, O_PATH, RENAME_*, struct ucred…), and the xattr calls,
// which it leaves out. CLinux.c is compiled with _GNU_SOURCE against the real headers,
// so every prototype and value below is checked by the C compiler, not copied by hand.
// It also gives the wait-status macros (WEXITSTATUS, WTERMSIG) as functions: Swift
// imports no function-like macro.
//
// This header itself must not define _GNU_SOURCE: a glibc header seen with it defines
// some structures differently (fd_set) from the same header in Swift's Glibc module,
// and Clang refuses the two definitions. Hence functions and constants with a
// `clinux_` prefix, defined in CLinux.c, instead of the macros themselves.
// uring.c adds the one Linux facility Swift cannot reach at all: io_uring (raw system
// calls, and ordered loads and stores of the ring's shared words).
// Nothing else belongs here.
#ifndef COFFER_CLINUX_H
#define COFFER_CLINUX_H

#include <pthread.h>
#include <spawn.h>
#include <stddef.h>
#include <sys/types.h>

// MARK: Constants, each the glibc macro of the same name without the prefix.

/// open(2): a descriptor that only names a file (no read or write access).
extern const int clinux_O_PATH;
/// *at(2): operate on the descriptor itself when the path is empty.
extern const int clinux_AT_EMPTY_PATH;
/// renameat2(2) flags.
extern const unsigned int clinux_RENAME_NOREPLACE;
extern const unsigned int clinux_RENAME_EXCHANGE;
/// fallocate(2): reserve blocks without changing the file's size.
extern const int clinux_FALLOC_FL_KEEP_SIZE;
/// utimensat(2): special tv_nsec values.
extern const long clinux_UTIME_NOW;
extern const long clinux_UTIME_OMIT;
/// setxattr(2) flags.
extern const int clinux_XATTR_CREATE;
extern const int clinux_XATTR_REPLACE;
/// posix_spawnattr_setflags: the child starts a new session (setsid).
extern const short clinux_POSIX_SPAWN_SETSID;

// MARK: Calls; each returns what the call of the same name returns and sets errno.

int clinux_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags);
int clinux_fallocate(int fd, int mode, off_t offset, off_t length);
int clinux_syncfs(int fd);
/// openat2(2) of `path` below `dirfd` with O_CLOEXEC, following no symlink in any component
/// and never leaving `dirfd` (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS): -1 and errno otherwise.
int clinux_open_beneath(int dirfd, const char *path, int flags);
/// sync_file_range(fd, 0, 0, WAIT_BEFORE | WRITE | WAIT_AFTER): the file's dirty pages are
/// written to the disk (no metadata, no cache flush) before this returns.
int clinux_write_out(int fd);
/// sync_file_range(fd, offset, length, WRITE): writeback of the range's dirty pages is
/// started (not waited for).
int clinux_start_write_out(int fd, off_t offset, off_t length);
/// pipe2(2): fds[0] is the read end, fds[1] the write end.
int clinux_pipe2(int fds[2], int flags);
int clinux_malloc_trim(size_t pad);

int clinux_setxattr(const char *path, const char *name, const void *value, size_t size, int flags);
ssize_t clinux_getxattr(const char *path, const char *name, void *value, size_t size);
ssize_t clinux_listxattr(const char *path, char *list, size_t size);
int clinux_removexattr(const char *path, const char *name);
/// fsetxattr(2)/fgetxattr(2): on an open (not O_PATH) descriptor, without a path walk.
int clinux_fsetxattr(int fd, const char *name, const void *value, size_t size, int flags);
ssize_t clinux_fgetxattr(int fd, const char *name, void *value, size_t size);

/// prctl(PR_SET_DUMPABLE, dumpable): prctl is variadic, which Swift cannot call.
int clinux_set_dumpable(int dumpable);

/// prctl(PR_SET_PDEATHSIG, signal): the signal the calling process gets when the thread
/// that started it ends.
int clinux_set_parent_death_signal(int signal);

/// prctl(PR_SET_NAME, name): the calling thread's name in the kernel (at most 15 bytes
/// are kept).
int clinux_set_thread_name(const char *name);

/// sched_setaffinity(2) of the calling thread to CPU `cpu` alone (CPU_SET is a macro).
/// 0, or -1 with errno set (EINVAL: the CPU is offline or outside this process's set).
int clinux_bind_thread_to_cpu(int cpu);

/// getsockopt(SO_PEERCRED): the process, user and group of a Unix socket's peer.
int clinux_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid);

/// pthread_rwlockattr_setkind_np(PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP): a
/// waiting writer goes before readers that arrive after it.
int clinux_rwlockattr_prefer_writers(pthread_rwlockattr_t *attributes);

/// WEXITSTATUS and WTERMSIG of a status from waitpid(2).
int clinux_exit_status(int status);
int clinux_term_signal(int status);

/// posix_spawn_file_actions_addclosefrom_np (glibc 2.34): the child closes every
/// descriptor from `lowest` up.
int clinux_spawn_file_actions_addclosefrom(posix_spawn_file_actions_t *actions, int lowest);

// MARK: fanotify: changes other processes make in watched directories.

/// One event of a watched directory, as `clinux_fanotify_next` parses it. `name` points
/// into the buffer that was read; `key`, which the caller points to a buffer of
/// `clinux_DIRECTORY_KEY_MAX` bytes, receives the directory's identity in the form
/// `clinux_directory_key` gives (`key_length` 0 for an event without one, such as a
/// queue overflow).
struct clinux_directory_event {
    unsigned long long mask;
    /// The process that made the change: this process's ID for its own changes, 0 for
    /// another process's when this process is unprivileged, else that process's ID.
    int pid;
    unsigned char *key;
    int key_length;
    /// NUL-terminated; empty when the event has no name.
    const char *name;
};

/// FAN_* bits of `clinux_directory_event.mask` that coffer tells apart.
extern const unsigned long long clinux_FAN_Q_OVERFLOW;
extern const unsigned long long clinux_FAN_CLOSE_WRITE;
extern const unsigned long long clinux_FAN_ATTRIB;
extern const unsigned long long clinux_FAN_ONDIR;
/// Longest key `clinux_directory_key` writes.
extern const int clinux_DIRECTORY_KEY_MAX;

/// fanotify_init(2) for directory-entry and child-modification events reported with the
/// directory's file handle and the entry's name (FAN_REPORT_DFID_NAME), non-blocking,
/// close-on-exec. Works unprivileged (Linux 5.13 on). Returns the group's descriptor.
int clinux_fanotify_init(void);
/// fanotify_mark(2) of directory `dirfd` (any descriptor of it, O_PATH too): add (1) or
/// remove (0) the watch for entries created, removed, moved in or out, entries closed
/// after writing, and entries with changed attributes.
int clinux_fanotify_watch(int group, int dirfd, int add);
/// The identity of directory `fd` as fanotify reports it: the file system ID (statfs)
/// followed by the file handle's type and bytes (name_to_handle_at). Writes at most
/// `capacity` bytes to `key`; returns the length, or -1 with errno set.
int clinux_directory_key(int fd, unsigned char *key, int capacity);
/// Parses the event at `*offset` of the `length` bytes read into `buffer`, advances
/// `*offset` past it and returns 1; returns 0 when no complete event is left.
int clinux_fanotify_next(const void *buffer, size_t length, size_t *offset, struct clinux_directory_event *event);

// MARK: io_uring, for FUSE's ring commands (uring.c)

#include <stdint.h>
#include <sys/uio.h>

/// FUSE over io_uring's structures and commands, as include/uapi/linux/fuse.h has them
/// since Linux 6.14, under the same names with the `clinux_` prefix (Debian 12's
/// <linux/fuse.h> predates them). uring.c checks their sizes against the kernel's.
#define CLINUX_FUSE_URING_IN_OUT_HEADER_SZ 128
#define CLINUX_FUSE_URING_OP_IN_OUT_SZ 128

/// The entry's own part of its header buffer (struct fuse_uring_ent_in_out).
struct clinux_fuse_uring_ent_in_out {
    uint64_t flags;
    /// The commit ID to give back with the reply to the request in the entry.
    uint64_t commit_id;
    /// The bytes of the request's payload, and of the reply's.
    uint32_t payload_sz;
    uint32_t padding;
    uint64_t reserved;
};

/// An entry's header buffer (struct fuse_uring_req_header): the request's header (struct
/// fuse_in_header) or the reply's (struct fuse_out_header), the operation's own header
/// (struct fuse_read_in…), and the entry's part.
struct clinux_fuse_uring_req_header {
    char in_out[CLINUX_FUSE_URING_IN_OUT_HEADER_SZ];
    char op_in[CLINUX_FUSE_URING_OP_IN_OUT_SZ];
    struct clinux_fuse_uring_ent_in_out ring_ent_in_out;
};

/// The commands to a FUSE ring entry (enum fuse_uring_cmd).
enum clinux_fuse_uring_cmd {
    CLINUX_FUSE_IO_URING_CMD_INVALID = 0,
    /// Register the entry's buffers and fetch a request.
    CLINUX_FUSE_IO_URING_CMD_REGISTER = 1,
    /// Commit the reply in the entry and fetch the next request.
    CLINUX_FUSE_IO_URING_CMD_COMMIT_AND_FETCH = 2,
};

/// A command's arguments, in a 128-byte submission entry's command area (struct
/// fuse_uring_cmd_req).
struct clinux_fuse_uring_cmd_req {
    uint64_t flags;
    /// The entry to commit (COMMIT_AND_FETCH).
    uint64_t commit_id;
    /// The queue the entry belongs to.
    uint16_t qid;
    uint8_t padding[6];
};

/// One io_uring with 128-byte submission entries (FUSE's ring commands need them) and
/// twice as many completion slots. One thread submits to it, and the kernel completes
/// its work only inside that thread's waiting `clinux_uring_enter`.
typedef struct clinux_uring clinux_uring;
/// A ring of `entries` submission slots, disabled, or NULL with errno set.
clinux_uring *clinux_uring_create(unsigned entries);
/// Enables the ring for the calling thread, the only one to submit to it. 0 or -errno.
int clinux_uring_enable(clinux_uring *ring);
void clinux_uring_destroy(clinux_uring *ring);
/// Queues FUSE ring command `command` (REGISTER `buffers`, two iovecs: header and
/// payload; COMMIT_AND_FETCH the reply of `commit_id`) for queue
/// `queue` of /dev/fuse descriptor `fuse_fd`. 0, or -EBUSY when the ring is full.
int clinux_uring_fuse_command(clinux_uring *ring, int fuse_fd, unsigned command, uint16_t queue, uint64_t commit_id,
                              const struct iovec *buffers, uint64_t user_data);
/// Queues a one-shot wait for `fd` to become readable. 0, or -EBUSY.
int clinux_uring_poll_input(clinux_uring *ring, int fd, uint64_t user_data);
/// Submits what is queued and, if `wait`, waits for that many completions (and runs the
/// kernel's pending work for the ring); retries EINTR. The number submitted, or -errno.
int clinux_uring_enter(clinux_uring *ring, unsigned wait);
/// Takes the next completion: 1 with its user data and result, 0 if there is none.
int clinux_uring_next_completion(clinux_uring *ring, uint64_t *user_data, int32_t *result);
/// Submits what is queued and runs the kernel's pending work for the ring without
/// waiting: 1 if a completion is there to take, 0 if not, or -errno.
int clinux_uring_collect(clinux_uring *ring);
/// How many queued entries the kernel has not taken yet (0 once all are submitted).
unsigned clinux_uring_unsubmitted(const clinux_uring *ring);
/// eventfd(0, EFD_CLOEXEC): what wakes a ring's thread (a poll on it completes).
int clinux_eventfd(void);

#endif

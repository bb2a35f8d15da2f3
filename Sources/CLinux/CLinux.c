// CLinux.c defines the shim's constants and calls against glibc's real, _GNU_SOURCE
// declarations (see include/CLinux.h).
#define _GNU_SOURCE 1
#include "CLinux.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <linux/openat2.h>
#include <sys/fanotify.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <sys/statfs.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

const int clinux_O_PATH = O_PATH;
const int clinux_AT_EMPTY_PATH = AT_EMPTY_PATH;
const unsigned int clinux_RENAME_NOREPLACE = RENAME_NOREPLACE;
const unsigned int clinux_RENAME_EXCHANGE = RENAME_EXCHANGE;
const int clinux_FALLOC_FL_KEEP_SIZE = FALLOC_FL_KEEP_SIZE;
const long clinux_UTIME_NOW = UTIME_NOW;
const long clinux_UTIME_OMIT = UTIME_OMIT;
const int clinux_XATTR_CREATE = XATTR_CREATE;
const int clinux_XATTR_REPLACE = XATTR_REPLACE;
const short clinux_POSIX_SPAWN_SETSID = POSIX_SPAWN_SETSID;

int clinux_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags) {
    return renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
}

int clinux_fallocate(int fd, int mode, off_t offset, off_t length) { return fallocate(fd, mode, offset, length); }

int clinux_syncfs(int fd) { return syncfs(fd); }

int clinux_open_beneath(int dirfd, const char *path, int flags) {
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = (unsigned long long)(flags | O_CLOEXEC);
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    return (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
}

int clinux_write_out(int fd) {
    return sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
}

int clinux_start_write_out(int fd, off_t offset, off_t length) {
    return sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE);
}

int clinux_pipe2(int fds[2], int flags) { return pipe2(fds, flags); }

int clinux_malloc_trim(size_t pad) { return malloc_trim(pad); }

int clinux_setxattr(const char *path, const char *name, const void *value, size_t size, int flags) {
    return setxattr(path, name, value, size, flags);
}

ssize_t clinux_getxattr(const char *path, const char *name, void *value, size_t size) {
    return getxattr(path, name, value, size);
}

ssize_t clinux_listxattr(const char *path, char *list, size_t size) { return listxattr(path, list, size); }

int clinux_removexattr(const char *path, const char *name) { return removexattr(path, name); }

int clinux_fsetxattr(int fd, const char *name, const void *value, size_t size, int flags) {
    return fsetxattr(fd, name, value, size, flags);
}

ssize_t clinux_fgetxattr(int fd, const char *name, void *value, size_t size) { return fgetxattr(fd, name, value, size); }

int clinux_set_dumpable(int dumpable) { return prctl(PR_SET_DUMPABLE, (unsigned long)dumpable, 0UL, 0UL, 0UL); }

int clinux_set_parent_death_signal(int signal) { return prctl(PR_SET_PDEATHSIG, (unsigned long)signal, 0UL, 0UL, 0UL); }

int clinux_set_thread_name(const char *name) { return prctl(PR_SET_NAME, (unsigned long)name, 0UL, 0UL, 0UL); }

int clinux_bind_thread_to_cpu(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return sched_setaffinity(0, sizeof set, &set);
}

int clinux_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid) {
    struct ucred credentials;
    socklen_t length = sizeof credentials;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) return -1;
    *pid = credentials.pid;
    *uid = credentials.uid;
    *gid = credentials.gid;
    return 0;
}

int clinux_rwlockattr_prefer_writers(pthread_rwlockattr_t *attributes) {
    return pthread_rwlockattr_setkind_np(attributes, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
}

int clinux_spawn_file_actions_addclosefrom(posix_spawn_file_actions_t *actions, int lowest) {
    return posix_spawn_file_actions_addclosefrom_np(actions, lowest);
}

int clinux_exit_status(int status) { return WEXITSTATUS(status); }

int clinux_term_signal(int status) { return WTERMSIG(status); }

const unsigned long long clinux_FAN_Q_OVERFLOW = FAN_Q_OVERFLOW;
const unsigned long long clinux_FAN_CLOSE_WRITE = FAN_CLOSE_WRITE;
const unsigned long long clinux_FAN_ATTRIB = FAN_ATTRIB;
const unsigned long long clinux_FAN_ONDIR = FAN_ONDIR;
const int clinux_DIRECTORY_KEY_MAX = sizeof(__kernel_fsid_t) + sizeof(int) + MAX_HANDLE_SZ;

int clinux_fanotify_init(void) {
    return fanotify_init(FAN_CLASS_NOTIF | FAN_REPORT_DFID_NAME | FAN_CLOEXEC | FAN_NONBLOCK, O_RDONLY | O_CLOEXEC);
}

int clinux_fanotify_watch(int group, int dirfd, int add) {
    // FAN_CLOSE_WRITE rather than FAN_MODIFY: one event per writer's close instead of
    // one per write (the daemon's own writes would cost an event each).
    const unsigned long long mask = FAN_CREATE | FAN_DELETE | FAN_MOVED_FROM | FAN_MOVED_TO | FAN_CLOSE_WRITE | FAN_ATTRIB
        | FAN_ONDIR | FAN_EVENT_ON_CHILD;
    char path[32];
    snprintf(path, sizeof path, "/proc/self/fd/%d", dirfd);
    return fanotify_mark(group, add ? FAN_MARK_ADD : FAN_MARK_REMOVE, mask, AT_FDCWD, path);
}

int clinux_directory_key(int fd, unsigned char *key, int capacity) {
    struct statfs fs;
    if (fstatfs(fd, &fs) != 0) return -1;
    struct { struct file_handle handle; unsigned char bytes[MAX_HANDLE_SZ]; } h;
    h.handle.handle_bytes = MAX_HANDLE_SZ;
    int mount_id;
    if (name_to_handle_at(fd, "", &h.handle, &mount_id, AT_EMPTY_PATH) != 0) return -1;
    int length = (int)(sizeof fs.f_fsid + sizeof h.handle.handle_type + h.handle.handle_bytes);
    if (length > capacity) { errno = ENOSPC; return -1; }
    memcpy(key, &fs.f_fsid, sizeof fs.f_fsid);
    memcpy(key + sizeof fs.f_fsid, &h.handle.handle_type, sizeof h.handle.handle_type);
    memcpy(key + sizeof fs.f_fsid + sizeof h.handle.handle_type, h.handle.f_handle, h.handle.handle_bytes);
    return length;
}

int clinux_fanotify_next(const void *buffer, size_t length, size_t *offset, struct clinux_directory_event *event) {
    if (*offset >= length) return 0;
    const struct fanotify_event_metadata *m = (const void *)((const char *)buffer + *offset);
    size_t left = length - *offset;
    if (!FAN_EVENT_OK(m, left)) return 0;
    *offset += m->event_len;
    event->mask = m->mask;
    event->pid = m->pid;
    event->key_length = 0;
    event->name = "";
    // Info records follow the metadata; the one that names the directory and entry.
    size_t at = m->metadata_len;
    while (at + sizeof(struct fanotify_event_info_header) <= m->event_len) {
        const struct fanotify_event_info_fid *info = (const void *)((const char *)m + at);
        if (info->hdr.len == 0 || at + info->hdr.len > m->event_len) break;
        if (info->hdr.info_type == FAN_EVENT_INFO_TYPE_DFID_NAME || info->hdr.info_type == FAN_EVENT_INFO_TYPE_DFID) {
            const struct file_handle *h = (const void *)info->handle;
            // The key as clinux_directory_key writes it: fsid, handle type, handle bytes.
            if (h->handle_bytes <= MAX_HANDLE_SZ) {
                unsigned char *key = event->key;
                memcpy(key, &info->fsid, sizeof info->fsid);
                memcpy(key + sizeof info->fsid, &h->handle_type, sizeof h->handle_type);
                memcpy(key + sizeof info->fsid + sizeof h->handle_type, h->f_handle, h->handle_bytes);
                event->key_length = (int)(sizeof info->fsid + sizeof h->handle_type + h->handle_bytes);
            }
            if (info->hdr.info_type == FAN_EVENT_INFO_TYPE_DFID_NAME) event->name = (const char *)h->f_handle + h->handle_bytes;
        }
        at += info->hdr.len;
    }
    return 1;
}

// CLinux.c defines the shim's constants and calls against glibc's real, _GNU_SOURCE
// declarations (see include/CLinux.h).
#define _GNU_SOURCE 1
#include "CLinux.h"

#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <sys/prctl.h>
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

int clinux_set_dumpable(int dumpable) { return prctl(PR_SET_DUMPABLE, (unsigned long)dumpable, 0UL, 0UL, 0UL); }

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

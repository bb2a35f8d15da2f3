// uring.c: a minimal io_uring for FUSE's ring commands, built on <linux/io_uring.h>
// and on the FUSE ring structures CLinux.h declares as the kernel's header has them.
// Swift cannot make the calls (syscall(2) is variadic) nor order the ring's shared head
// and tail words (acquire loads, release stores); this file does both and nothing more:
// one submitter per ring, 128-byte submission entries.
//
// A ring is made disabled, by whichever thread, and enabled by the one thread that will
// submit to it (SINGLE_ISSUER). Its completions' work runs only inside that thread's
// io_uring_enter with GETEVENTS (DEFER_TASKRUN): for FUSE, the kernel writes a request
// into an entry's buffers only then, never while the thread runs user code.
#define _GNU_SOURCE 1
#include "CLinux.h"

#include <errno.h>
#include <linux/io_uring.h>
#include <poll.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

struct clinux_uring {
    int fd;
    unsigned *sq_head, *sq_tail, *sq_array, sq_mask, sq_entries;
    unsigned *cq_head, *cq_tail, cq_mask;
    struct io_uring_cqe *cqes;
    unsigned char *sqes;
    void *sq_map, *cq_map;
    size_t sq_map_size, cq_map_size, sqes_size;
    unsigned local_tail, unsubmitted;
};

// The sizes include/uapi/linux/fuse.h gives these structures (Linux 6.14): a copy that
// drifted from the kernel's fails here, not in a mount.
_Static_assert(sizeof(struct clinux_fuse_uring_ent_in_out) == 32, "struct fuse_uring_ent_in_out");
_Static_assert(sizeof(struct clinux_fuse_uring_req_header) == 288, "struct fuse_uring_req_header");
_Static_assert(sizeof(struct clinux_fuse_uring_cmd_req) == 24, "struct fuse_uring_cmd_req");
_Static_assert(offsetof(struct io_uring_sqe, cmd) + sizeof(struct clinux_fuse_uring_cmd_req) <= 2 * sizeof(struct io_uring_sqe),
               "a FUSE command fits a 128-byte submission entry's command area");

clinux_uring *clinux_uring_create(unsigned entries) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_SQE128 | IORING_SETUP_CQSIZE | IORING_SETUP_R_DISABLED | IORING_SETUP_SINGLE_ISSUER
              | IORING_SETUP_DEFER_TASKRUN;
    p.cq_entries = 2 * entries;
    int fd = (int)syscall(__NR_io_uring_setup, entries, &p);
    if (fd < 0) return NULL;
    clinux_uring *ring = calloc(1, sizeof *ring);
    if (!ring) { close(fd); errno = ENOMEM; return NULL; }
    ring->fd = fd;
    ring->sq_map_size = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    ring->cq_map_size = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        if (ring->cq_map_size > ring->sq_map_size) ring->sq_map_size = ring->cq_map_size;
        ring->cq_map_size = ring->sq_map_size;
    }
    ring->sq_map = mmap(NULL, ring->sq_map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
    if (ring->sq_map == MAP_FAILED) goto fail;
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        ring->cq_map = ring->sq_map;
    } else {
        ring->cq_map = mmap(NULL, ring->cq_map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_CQ_RING);
        if (ring->cq_map == MAP_FAILED) { ring->cq_map = NULL; goto fail; }
    }
    ring->sqes_size = p.sq_entries * 2 * sizeof(struct io_uring_sqe);
    ring->sqes = mmap(NULL, ring->sqes_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
    if (ring->sqes == MAP_FAILED) { ring->sqes = NULL; goto fail; }
    unsigned char *sq = ring->sq_map, *cq = ring->cq_map;
    ring->sq_head = (unsigned *)(sq + p.sq_off.head);
    ring->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    ring->sq_mask = *(unsigned *)(sq + p.sq_off.ring_mask);
    ring->sq_entries = p.sq_entries;
    ring->sq_array = (unsigned *)(sq + p.sq_off.array);
    ring->cq_head = (unsigned *)(cq + p.cq_off.head);
    ring->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    ring->cq_mask = *(unsigned *)(cq + p.cq_off.ring_mask);
    ring->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    ring->local_tail = *ring->sq_tail;
    return ring;
fail:
    {
        int saved = errno;
        clinux_uring_destroy(ring);
        errno = saved;
        return NULL;
    }
}

int clinux_uring_enable(clinux_uring *ring) {
    return syscall(__NR_io_uring_register, ring->fd, IORING_REGISTER_ENABLE_RINGS, NULL, 0) < 0 ? -errno : 0;
}

void clinux_uring_destroy(clinux_uring *ring) {
    if (!ring) return;
    if (ring->sqes) munmap(ring->sqes, ring->sqes_size);
    if (ring->cq_map && ring->cq_map != ring->sq_map) munmap(ring->cq_map, ring->cq_map_size);
    if (ring->sq_map && ring->sq_map != MAP_FAILED) munmap(ring->sq_map, ring->sq_map_size);
    close(ring->fd);
    free(ring);
}

/// A zeroed 128-byte entry at the tail, published at once; NULL if the ring is full.
static struct io_uring_sqe *next_sqe(clinux_uring *ring) {
    unsigned head = __atomic_load_n(ring->sq_head, __ATOMIC_ACQUIRE);
    if (ring->local_tail - head >= ring->sq_entries) return NULL;
    unsigned index = ring->local_tail & ring->sq_mask;
    struct io_uring_sqe *sqe = (struct io_uring_sqe *)(ring->sqes + index * 2 * sizeof(struct io_uring_sqe));
    memset(sqe, 0, 2 * sizeof(struct io_uring_sqe));
    ring->sq_array[index] = index;
    return sqe;
}

static void publish(clinux_uring *ring) {
    ring->local_tail++;
    ring->unsubmitted++;
    __atomic_store_n(ring->sq_tail, ring->local_tail, __ATOMIC_RELEASE);
}

int clinux_uring_fuse_command(clinux_uring *ring, int fuse_fd, unsigned command, uint16_t queue, uint64_t commit_id,
                              const struct iovec *buffers, uint64_t user_data) {
    struct io_uring_sqe *sqe = next_sqe(ring);
    if (!sqe) return -EBUSY;
    sqe->opcode = IORING_OP_URING_CMD;
    sqe->fd = fuse_fd;
    sqe->cmd_op = command;
    if (buffers) {
        sqe->addr = (uint64_t)(uintptr_t)buffers;
        sqe->len = 2;
    }
    sqe->user_data = user_data;
    struct clinux_fuse_uring_cmd_req *request = (struct clinux_fuse_uring_cmd_req *)sqe->cmd;
    request->commit_id = commit_id;
    request->qid = queue;
    publish(ring);
    return 0;
}

int clinux_uring_poll_input(clinux_uring *ring, int fd, uint64_t user_data) {
    struct io_uring_sqe *sqe = next_sqe(ring);
    if (!sqe) return -EBUSY;
    sqe->opcode = IORING_OP_POLL_ADD;
    sqe->fd = fd;
    sqe->poll32_events = POLLIN;
    sqe->user_data = user_data;
    publish(ring);
    return 0;
}

int clinux_uring_enter(clinux_uring *ring, unsigned wait) {
    for (;;) {
        int n = (int)syscall(__NR_io_uring_enter, ring->fd, ring->unsubmitted, wait, wait ? IORING_ENTER_GETEVENTS : 0,
                             NULL, 0);
        if (n >= 0) {
            ring->unsubmitted -= (unsigned)n;
            return n;
        }
        if (errno != EINTR) return -errno;
    }
}

int clinux_uring_next_completion(clinux_uring *ring, uint64_t *user_data, int32_t *result) {
    unsigned head = *ring->cq_head;
    if (head == __atomic_load_n(ring->cq_tail, __ATOMIC_ACQUIRE)) return 0;
    struct io_uring_cqe *cqe = &ring->cqes[head & ring->cq_mask];
    *user_data = cqe->user_data;
    *result = cqe->res;
    __atomic_store_n(ring->cq_head, head + 1, __ATOMIC_RELEASE);
    return 1;
}

unsigned clinux_uring_unsubmitted(const clinux_uring *ring) { return ring->unsubmitted; }

int clinux_eventfd(void) { return eventfd(0, EFD_CLOEXEC); }

int clinux_uring_collect(clinux_uring *ring) {
    int n = (int)syscall(__NR_io_uring_enter, ring->fd, ring->unsubmitted, 0, IORING_ENTER_GETEVENTS, NULL, 0);
    if (n < 0) return errno == EINTR ? 0 : -errno;
    ring->unsubmitted -= (unsigned)n;
    return *ring->cq_head != __atomic_load_n(ring->cq_tail, __ATOMIC_ACQUIRE);
}

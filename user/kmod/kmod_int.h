/* SPDX-License-Identifier: MIT */
/* The client's private parts, shared by the files of user/kmod/. */
#ifndef KVMEM_KMOD_INT_H
#define KVMEM_KMOD_INT_H

#include <pthread.h>

#include "kvmem/kmod.h"

struct io_uring;

/* Claimed pages and their reads (kmod_fill.c): ids in claim order, each
 * read's result; [0, sub) submitted, done of them reaped. */
struct kmod_batch {
	uint64_t *ids;
	int *res;
	size_t n, cap, sub, done;
};

struct kvmem_kmod {
	int fd;
	int fd_lock;		/* the workspace's writer's lock, or -1 */
	char dev[64];
	uint32_t page_bytes, page_stride, n_layers;
	uint64_t page_max;
	const struct kvmem_pt_header *table;
	size_t table_len;
	unsigned char *window;
	size_t window_len;
	/* Userspace fills (kmod_fill.c): the pages file opened O_DIRECT (-1:
	 * none, the module reads), the window mapped writable for the reads
	 * (the window itself, or a second mapping of a read-only one), and
	 * the ring, made at the first fill and used under ring_lock. */
	int fd_direct;
	unsigned char *fill_window;
	pthread_mutex_t ring_lock;
	struct io_uring *ring;
	struct kmod_batch pending;	/* kvmem_kmod_fill_start's, not yet handed back */
};

/* k owns fd (the workspace's writer's lock) from now on and closes it
 * last, in kvmem_kmod_close. */
void kmod_keep_lock(kvmem_kmod *k, int fd);

/* Open what kvmem_kmod_fill needs, from the caller's pages descriptor
 * (reopened O_DIRECT): nothing when the file system refuses O_DIRECT,
 * and kvmem_kmod_fill then says -ENOTSUP. kmod_fill_close undoes it. */
void kmod_fill_setup(kvmem_kmod *k, int pages_fd, int rdonly);
void kmod_fill_close(kvmem_kmod *k);
/* Before a page of the window is handed out: end the started fills. */
void kmod_fill_drain(kvmem_kmod *k);
/* Hand back claimed pages whose fill failed (FILLED with FAILED): each is
 * dropped and counted as a read error; status[i] = -EIO (may be NULL). */
int kmod_filled_failed(kvmem_kmod *k, const uint64_t *pages, size_t n, int32_t *status);

#endif

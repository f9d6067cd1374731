// SPDX-License-Identifier: MIT
/*
 * The io_uring under the pager: one ring, a fixed set of request records,
 * fixed (registered) buffers where the memory is registered, plain reads and
 * writes otherwise. Completions are handed back through a callback; nothing
 * here knows about pages.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pager/pager_int.h"

static _Atomic unsigned fault_nth[5];

void kvmem_pager_fault_inject(enum kvmem_fault kind, unsigned nth)
{
	if (kind >= KVMEM_FAULT_READ && kind <= KVMEM_FAULT_SYNC)
		atomic_store(&fault_nth[kind], nth);
}

/* 1 when this completion of `kind` is the one chosen to fail. */
int fault_fire(int kind)
{
	unsigned n = atomic_load(&fault_nth[kind]);

	while (n) {
		if (atomic_compare_exchange_weak(&fault_nth[kind], &n, n - 1))
			return n == 1;
	}
	return 0;
}

int io_init_reqs(struct kvmem_io *io, unsigned depth)
{
	memset(io, 0, sizeof(*io));
	io->depth = depth;
	io->reqs = calloc(depth, sizeof(*io->reqs));
	if (!io->reqs)
		return kvmem_error(ENOMEM, "io_uring: out of memory");
	for (unsigned i = 0; i < depth; i++)
		io_req_put(io, &io->reqs[i]);
	return 0;
}

int io_init(struct kvmem_io *io, unsigned depth)
{
	int rc;

	if (io_init_reqs(io, depth) < 0)
		return kvmem_fail();
	rc = io_uring_queue_init(depth, &io->ring, 0);
	if (rc < 0) {
		free(io->reqs);
		io->reqs = NULL;
		return kvmem_error(-rc, "io_uring: cannot set up a ring of %u entries: %s", depth,
				 strerror(-rc));
	}
	io->has_ring = 1;
	return 0;
}

void io_exit(struct kvmem_io *io)
{
	if (!io->reqs)
		return;
	if (io->fixed)
		io_uring_unregister_buffers(&io->ring);
	if (io->has_ring)
		io_uring_queue_exit(&io->ring);
	free(io->reqs);
	io->reqs = NULL;
}

void io_register(struct kvmem_io *io, void *const *bases, const size_t *lens, unsigned n)
{
	/* One iovec may cover at most 1 GiB. */
	const size_t max = 1ul << 30;
	int rc;

	io->n_iov = 0;
	for (unsigned i = 0; i < n; i++) {
		for (size_t off = 0; off < lens[i]; off += max) {
			if (io->n_iov == sizeof(io->iov) / sizeof(io->iov[0]))
				goto too_many;
			io->iov[io->n_iov].iov_base = (uint8_t *)bases[i] + off;
			io->iov[io->n_iov].iov_len = lens[i] - off < max ? lens[i] - off : max;
			io->n_iov++;
		}
	}
	rc = io_uring_register_buffers(&io->ring, io->iov, io->n_iov);
	if (rc == 0) {
		io->fixed = 1;
		return;
	}
	fprintf(stderr, "kvmem: io_uring refused to register %u buffers (%s); "
			"using unregistered buffers\n", io->n_iov, strerror(-rc));
	io->n_iov = 0;
	return;
too_many:
	fprintf(stderr, "kvmem: host pool too large to register with io_uring; "
			"using unregistered buffers\n");
	io->n_iov = 0;
}

struct io_req *io_req_get(struct kvmem_io *io)
{
	struct io_req *r = io->free_reqs;

	if (r) {
		io->free_reqs = r->next;
		memset(r, 0, sizeof(*r));
	}
	return r;
}

void io_req_put(struct kvmem_io *io, struct io_req *r)
{
	r->next = io->free_reqs;
	io->free_reqs = r;
}

/* Index of the registered buffer holding [buf, buf + len), or -1. */
static int fixed_index(const struct kvmem_io *io, const void *buf, size_t len)
{
	const uint8_t *b = buf;

	if (!io->fixed)
		return -1;
	for (unsigned i = 0; i < io->n_iov; i++) {
		const uint8_t *base = io->iov[i].iov_base;

		if (b >= base && b + len <= base + io->iov[i].iov_len)
			return (int)i;
	}
	return -1;
}

int io_queue(struct kvmem_io *io, int fd, struct io_req *r)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
	int idx;

	if (!sqe) {
		io_uring_submit(&io->ring);
		sqe = io_uring_get_sqe(&io->ring);
		if (!sqe)
			return kvmem_error(EINVAL, "io_uring: submission queue full");
	}
	idx = fixed_index(io, r->buf, r->len);
	if (r->kind == IO_READ) {
		if (idx >= 0)
			io_uring_prep_read_fixed(sqe, fd, r->buf, r->len, r->off, idx);
		else
			io_uring_prep_read(sqe, fd, r->buf, r->len, r->off);
	} else {
		if (idx >= 0)
			io_uring_prep_write_fixed(sqe, fd, r->buf, r->len, r->off, idx);
		else
			io_uring_prep_write(sqe, fd, r->buf, r->len, r->off);
	}
	io_uring_sqe_set_data(sqe, r);
	r->t_submit = kvmem_now_ns();
	io->inflight++;
	return 0;
}

int io_reap(struct kvmem_io *io, unsigned wait, void (*done)(void *arg, struct io_req *r),
	    void *arg)
{
	struct io_uring_cqe *cqe;
	int n = 0, rc;

	if (wait > io->inflight)
		wait = io->inflight;
	do
		rc = wait ? io_uring_submit_and_wait(&io->ring, wait) : io_uring_submit(&io->ring);
	while (rc == -EINTR);
	if (rc < 0 && rc != -EBUSY && rc != -EAGAIN)
		return kvmem_error(-rc, "io_uring: submit failed: %s", strerror(-rc));
	while (io_uring_peek_cqe(&io->ring, &cqe) == 0) {
		struct io_req *r = io_uring_cqe_get_data(cqe);

		r->res = cqe->res;
		io_uring_cqe_seen(&io->ring, cqe);
		io->inflight--;
		if (fault_fire(r->kind))
			r->res = -EIO;
		else if (fault_fire(KVMEM_FAULT_DIRECT))
			r->res = -EINVAL;
		r->done = 1;
		done(arg, r);
		n++;
	}
	return n;
}

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
	int rc;

	io->n_iov = io->n_reg = 0;
	for (unsigned i = 0; i < n; i++) {
		if (io->n_reg == IO_REGIONS)
			goto too_many;
		io->reg[io->n_reg++] = (struct io_region){ bases[i], lens[i], io->n_iov };
		for (size_t off = 0; off < lens[i]; off += IO_PIECE) {
			if (io->n_iov == IO_PIECES)
				goto too_many;
			io->iov[io->n_iov].iov_base = (uint8_t *)bases[i] + off;
			io->iov[io->n_iov].iov_len = lens[i] - off < IO_PIECE ? lens[i] - off : IO_PIECE;
			io->state[io->n_iov++] = 0;
		}
	}
	/*
	 * Pinning is what registration costs: the pages are faulted in and
	 * held, 288 MiB for the default pool and stage-out buffer, 1.8 s on
	 * the loaded 2-core build machine (9.7 s once) for a run that wrote
	 * 64 tokens. A sparse table costs nothing; each piece is pinned when
	 * an I/O first lands in it (fixed_index).
	 */
	if (io_uring_register_buffers_sparse(&io->ring, io->n_iov) == 0) {
		io->fixed = io->sparse = 1;
		return;
	}
	rc = io_uring_register_buffers(&io->ring, io->iov, io->n_iov);
	if (rc == 0) {
		io->fixed = 1;
		memset(io->state, 1, io->n_iov);
		return;
	}
	fprintf(stderr, "kvmem: io_uring refused to register %u buffers (%s); "
			"using unregistered buffers\n", io->n_iov, strerror(-rc));
	io->n_iov = io->n_reg = 0;
	return;
too_many:
	fprintf(stderr, "kvmem: host pool too large to register with io_uring; "
			"using unregistered buffers\n");
	io->n_iov = io->n_reg = 0;
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

/* Index of the registered piece holding [buf, buf + len), or -1; a piece
 * not registered yet is registered now (a refusal: plain I/O there). */
static int fixed_index(struct kvmem_io *io, const void *buf, size_t len)
{
	const uint8_t *b = buf;

	if (!io->fixed)
		return -1;
	for (unsigned r = 0; r < io->n_reg; r++) {
		unsigned i;
		const uint8_t *base;

		if (b < io->reg[r].base || b + len > io->reg[r].base + io->reg[r].len)
			continue;
		i = io->reg[r].first + (unsigned)((size_t)(b - io->reg[r].base) / IO_PIECE);
		base = io->iov[i].iov_base;
		if (b + len > base + io->iov[i].iov_len)
			return -1;	/* across two pieces */
		if (!io->state[i]) {
			int rc = io_uring_register_buffers_update_tag(&io->ring, i, &io->iov[i], NULL, 1);

			io->state[i] = rc == 1 ? 1 : -1;
			if (rc != 1 && !io->warned) {
				io->warned = 1;
				fprintf(stderr, "kvmem: io_uring refused to register %zu bytes (%s); "
						"using unregistered buffers there\n",
					io->iov[i].iov_len, strerror(rc < 0 ? -rc : EINVAL));
			}
		}
		return io->state[i] == 1 ? (int)i : -1;
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

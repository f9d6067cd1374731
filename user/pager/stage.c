// SPDX-License-Identifier: MIT
/*
 * Stage-out: a full block's pages are copied into one extent of a bounded,
 * registered in-flight buffer and written with one request at the block's
 * place in the pages stream (a directory: one O_DIRECT write; RADOS: one
 * write per object the extent spans); the caller goes on at once. Only when
 * every extent of the buffer is still in flight does an append wait
 * (backpressure, counted). A failed write keeps the extent in memory, so the
 * session goes on; commits are refused from then on.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "pager/pager_int.h"
#include "pager/probes.h"
#include "util/fs.h"

const uint8_t *stage_find(const kvmem_pager *p, uint64_t block)
{
	for (uint32_t i = 0; i < p->n_stage; i++)
		if (p->stage[i].busy && p->stage[i].block == block)
			return p->stage_buf + (size_t)i * p->extent_bytes;
	return block < p->orphan_cap ? p->orphan[block] : NULL;
}

/* Keep the extent (and the index record, when the index file did not get
 * it) in memory after a write failed. */
static void orphan_keep(kvmem_pager *p, uint64_t block, const uint8_t *ext, const void *index)
{
	void *copy = malloc(p->extent_bytes);

	/* Without memory the block's pages are lost to this session; fetch
	 * then fails on them with a clear message. */
	if (copy) {
		memcpy(copy, ext, p->extent_bytes);
		p->orphan[block] = copy;
	}
	if (index && p->g.index_bytes) {
		copy = malloc(p->g.index_bytes);
		if (copy)
			memcpy(copy, index, p->g.index_bytes);
		p->orphan_ix[block] = copy;
	}
}

/* Why a write to a regular file stopped short of `end`: the process's file
 * size limit (RLIMIT_FSIZE: -EFBIG, as write(2) would say on the next
 * call), else the space ran out. */
static int short_write_cause(uint64_t end)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    end > (uint64_t)rl.rlim_cur)
		return EFBIG;
	return ENOSPC;
}

void stage_done(kvmem_pager *p, struct io_req *r)
{
	struct stage_slot *ss = &p->stage[r->slot];
	uint64_t block = r->first_page, ns = kvmem_now_ns() - r->t_submit;
	size_t L = p->g.n_layers;

	if (r->res == (int)r->len) {
		for (size_t l = 0; l < L; l++) {
			struct kvmem_pte *e = &p->pt[block * L + l];

			e->tiers |= KVMEM_TIER_NVME;
			e->flags &= ~KVMEM_PTE_DIRTY;
		}
		p->st.blocks_out++;
		p->st.bytes_out += r->len;
		p->st.write_ns += ns;
		PROBE_STAGE_OUT(block, r->len, ns);
		PROBE_TIER_MOVE(block * L, 0, KVMEM_TIER_NVME, r->len, ns);
	} else {
		int err = r->res < 0 ? -r->res : short_write_cause(r->off + r->len);

		PROBE_IO_ERROR(block * L, -err);
		pager_fail_write(p, err, "%s/pages: writing block %" PRIu64 " (%zu bytes at offset %"
				 PRIu64 ") failed: %s%s", p->dir, block, r->len, r->off,
				 ws_strerror(p->ws, err), r->res < 0 ? "" : " (short write)");
		orphan_keep(p, block, r->buf, NULL);
	}
	ss->busy = 0;
	p->stage_busy--;
}

int stage_drain(kvmem_pager *p)
{
	while (p->stage_busy)
		if (pager_reap(p, 1) < 0)
			return kvmem_fail();
	return 0;
}

static int free_stage_slot(kvmem_pager *p, uint64_t block)
{
	uint64_t t0 = 0;

	pager_reap(p, 0);
	if (p->stage_busy == p->n_stage) {
		t0 = kvmem_now_ns();
		p->st.backpressure_waits++;
		while (p->stage_busy == p->n_stage)
			if (pager_reap(p, 1) < 0)
				return kvmem_fail();
		t0 = kvmem_now_ns() - t0;	/* one figure for the counter and the probe */
		p->st.backpressure_ns += t0;
		PROBE_BACKPRESSURE(block, t0);
	}
	for (uint32_t i = 0; i < p->n_stage; i++)
		if (!p->stage[i].busy)
			return (int)i;
	return kvmem_error(EIO, "%s: stage-out buffer accounting is wrong", p->dir);
}

/* Copies of a block's pages spread over the OpenMP threads from this many
 * bytes on (a block of Qwen3-8B is 4.7 MB; one thread copies 8 GB/s on the
 * H200's host, sixteen 37). Each page is one thread's, so nothing depends
 * on the split. */
#define PAR_BYTES ((size_t)1 << 20)

/* Put the new block's pages in the host pool, as far as room allows: the
 * slots taken and the page table set on this thread, the bytes copied on
 * the OpenMP threads (nothing reads the slots before this returns). */
static void keep_in_pool(kvmem_pager *p, uint64_t block, const uint8_t *ext)
{
	size_t L = p->g.n_layers, n = 0;
	uint32_t *slot = malloc(L * sizeof(*slot));

	if (!slot)
		return;	/* the pool is a cache: the block is on its way to NVMe */
	for (; n < L; n++) {
		uint64_t pg = block * L + n;

		if (pool_insert_slot(p, pg, &slot[n]) < 0)
			break;
		p->pt[pg].last_step = p->step;
	}
	#pragma omp parallel for schedule(static) if (n * p->page_bytes >= PAR_BYTES)
	for (size_t l = 0; l < n; l++)
		memcpy(kvmem_hostpool_slot(p->pool, slot[l]), ext + l * p->page_stride, p->page_bytes);
	free(slot);
}

int kvmem_pager_append_block(kvmem_pager *p, uint64_t block, const void *const *layers,
			   const void *index)
{
	size_t L = p->g.n_layers, ib = p->g.index_bytes;
	uint64_t *sums;
	uint8_t *ext;
	struct ws_store *ws = p->ws;
	struct io_req *r;
	int slot, rc;

	if (p->rdonly)
		return kvmem_error(EINVAL, "%s: opened read-only", p->dir);
	if (block != p->n_blocks)
		return kvmem_error(EINVAL, "%s: append of block %" PRIu64 " but the next block is %" PRIu64,
				 p->dir, block, p->n_blocks);
	if (ib && !index)
		return kvmem_error(EINVAL, "%s: block %" PRIu64 " appended without its index record", p->dir,
				 block);
	if (store_begin_write(p) < 0 || store_grow(p, block + 1) < 0)
		return kvmem_fail();
	slot = free_stage_slot(p, block);
	if (slot < 0)
		return kvmem_fail();
	ext = p->stage_buf + (size_t)slot * p->extent_bytes;
	sums = p->sums + block * (L + 1);
	#pragma omp parallel for schedule(static) if (L * p->page_bytes >= PAR_BYTES)
	for (size_t l = 0; l < L; l++) {
		uint8_t *dst = ext + l * p->page_stride;

		memcpy(dst, layers[l], p->page_bytes);
		memset(dst + p->page_bytes, 0, p->page_stride - p->page_bytes);
		sums[l] = XXH3_64bits(dst, p->page_bytes);
	}
	sums[L] = XXH3_64bits(ib ? index : "", ib);
	XXH3_64bits_update(p->sums_hash, sums, (L + 1) * 8);
	p->n_blocks++;
	for (size_t l = 0; l < L; l++)
		p->pt[block * L + l].flags |= KVMEM_PTE_DIRTY;

	if (!p->write_failed && ib && (rc = ws->ops->write(ws, WS_INDEX, index, ib, block * ib)) < 0)
		pager_fail_write(p, -rc, "%s/index: cannot append the record of block %" PRIu64 ": %s",
				 p->dir, block, ws_strerror(ws, -rc));
	if (!p->write_failed &&
	    (rc = ws->ops->write(ws, WS_SUMS, sums, (L + 1) * 8, block * p->sums_rec)) < 0)
		pager_fail_write(p, -rc, "%s/sums: cannot append the checksums of block %" PRIu64 ": %s",
				 p->dir, block, ws_strerror(ws, -rc));
	if (p->write_failed) {
		orphan_keep(p, block, ext, index);
	} else {
		r = pager_req(p);
		if (!r)
			return kvmem_fail();
		r->kind = IO_WRITE;
		r->purpose = PUR_OUT;
		r->first_page = block;
		r->n_pages = L;
		r->slot = slot;
		r->buf = ext;
		r->len = p->extent_bytes;
		r->off = block * p->extent_bytes;
		/* Room ahead of the writes (a directory allocates the file). */
		if (ws->ops->reserve && ws->ops->reserve(ws, r->off + r->len, p->extent_bytes,
							 (uint64_t)p->n_stage * p->extent_bytes) < 0)
			pager_fail_write(p, kvmem_last_errno(), "%s", kvmem_last_error());
		p->stage[slot].busy = 1;
		p->stage[slot].block = block;
		p->stage_busy++;
		if (ws->ops->submit(ws, &p->io, r) < 0) {
			p->stage[slot].busy = 0;
			p->stage_busy--;
			io_req_put(&p->io, r);
			pager_fail_write(p, EIO, "%s/pages: cannot queue the write of block %" PRIu64,
					 p->dir, block);
			orphan_keep(p, block, ext, NULL);
		} else {
			pager_reap(p, 0);	/* submit now: the write runs during prefill */
		}
	}
	if (!(p->flags & KVMEM_PAGER_NO_KEEP))
		keep_in_pool(p, block, ext);	/* intact until a later append reuses it */
	return 0;
}

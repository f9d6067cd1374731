// SPDX-License-Identifier: MIT
/*
 * Stage-out: a full block's pages are copied into one extent of a bounded,
 * registered in-flight buffer and written with one O_DIRECT request at the
 * block's place in the pages file; the caller goes on at once. Only when
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
				 strerror(err), r->res < 0 ? "" : " (short write)");
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

/*
 * Allocate the pages file ahead of the writes. Writes into allocated blocks
 * inside the file size let ext4 run several O_DIRECT writes at once (shared
 * inode lock, no punt to a worker); writes that extend the file go one at
 * a time. Best effort: a file system that refuses is written as it is.
 */
static void prealloc(kvmem_pager *p, uint64_t end)
{
	uint64_t chunk = p->prealloc_end / 4;

	if (p->no_prealloc || end <= p->prealloc_end)
		return;
	/* Large steps: ext4's fallocate waits for every direct I/O in flight. */
	if (chunk < (64u << 20))
		chunk = 64u << 20;
	if (chunk < 16 * p->extent_bytes)
		chunk = 16 * p->extent_bytes;
	if (chunk > (1u << 30))
		chunk = 1u << 30;
	/* At least the stage-out buffer's reach: every write it can hold in
	 * flight lands in allocated blocks, and a prefill that fills it is not
	 * stopped by a fallocate waiting for those writes again and again (a
	 * 2.4 GB buffer grown a quarter at a time: about a dozen waits for the
	 * disk in a 16K-token prefill at Qwen3-8B). */
	if (chunk < (uint64_t)p->n_stage * p->extent_bytes)
		chunk = (uint64_t)p->n_stage * p->extent_bytes;
	chunk = round_up(chunk, p->extent_bytes);
	if (fallocate(p->fd_pages, 0, p->prealloc_end, end + chunk - p->prealloc_end) == 0) {
		p->prealloc_end = end + chunk;
		return;
	}
	/* A failed fallocate may keep what it got before running out (ext4
	 * does), which would take the space the tail and the manifest need:
	 * give it back. Every write in flight ends at or before prealloc_end. */
	if (ftruncate(p->fd_pages, p->prealloc_end) < 0)
		pager_fail_write(p, errno, "%s/pages: cannot give back a failed allocation: %s",
				 p->dir, strerror(errno));
	p->no_prealloc = 1;
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
	struct io_req *r;
	int slot;

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

	if (!p->write_failed && ib && kvmem_write_all(p->fd_index, index, ib, (int64_t)(block * ib)) < 0)
		pager_fail_write(p, errno, "%s/index: cannot append the record of block %" PRIu64 ": %s",
				 p->dir, block, strerror(errno));
	if (!p->write_failed && kvmem_write_all(p->fd_sums, sums, (L + 1) * 8, (int64_t)(block * p->sums_rec)) < 0)
		pager_fail_write(p, errno, "%s/sums: cannot append the checksums of block %" PRIu64 ": %s",
				 p->dir, block, strerror(errno));
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
		prealloc(p, r->off + r->len);
		p->stage[slot].busy = 1;
		p->stage[slot].block = block;
		p->stage_busy++;
		if (io_queue(&p->io, p->fd_pages, r) < 0) {
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

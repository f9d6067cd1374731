// SPDX-License-Identifier: MIT
/*
 * Stage-out: a full block's pages are copied into one extent of a bounded,
 * registered in-flight buffer and written with one request at the block's
 * place in the pages stream (a directory: one O_DIRECT write; RADOS: one
 * write per object the extent spans); the caller goes on at once. Only when
 * every extent of the buffer is still in flight does an append wait
 * (backpressure, counted). A failed write keeps the extent in memory, so the
 * session goes on; commits are refused from then on.
 *
 * A block whose pages were made in host pool slots (kvmem_pager_block_memory:
 * the session's page source writes a forward pass's rows straight there) is
 * not copied at all: its pages join the pool where they are, pinned until
 * written, and are written from there, one request per run of consecutive
 * slots. A failed write leaves them pinned in the pool, the only copy.
 *
 * No write waits for a request record: writes queue here and start as
 * records free up (a quarter of them are kept for reads), so an append runs
 * ahead of the disk as far as the stage-out buffer or the pool holds its
 * pages. Before, a prefill at Qwen3-8B (4.7 MB blocks, 64 records) waited
 * for the disk once 300 MB were in flight, whatever the buffer's size.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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
	void *copy = ext ? malloc(p->extent_bytes) : NULL;

	/* Without memory the block's pages are lost to this session; fetch
	 * then fails on them with a clear message. (Pages written from the
	 * pool come without ext: they stay pinned there.) */
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
	p->writes_inflight--;
}

void pool_out_done(kvmem_pager *p, struct io_req *r)
{
	size_t L = p->g.n_layers;
	uint64_t block = r->first_page / L;
	int i;

	p->writes_inflight--;
	for (i = 0; i < p->n_pout && p->pout[i].block != block; i++)
		;
	if (r->res == (int)r->len) {
		for (uint32_t k = 0; k < r->n_pages; k++) {
			struct kvmem_pte *e = &p->pt[r->first_page + k];

			e->tiers |= KVMEM_TIER_NVME;
			e->flags &= ~KVMEM_PTE_DIRTY;
			if (p->slot_pin[r->slot + k])
				p->slot_pin[r->slot + k]--;
		}
		p->st.bytes_out += r->len;
	} else {
		int err = r->res < 0 ? -r->res : short_write_cause(r->off + r->len);

		/* The pages stay pinned in the pool: nothing else holds them. */
		PROBE_IO_ERROR(r->first_page, -err);
		pager_fail_write(p, err, "%s/pages: writing block %" PRIu64 " (%zu bytes at offset %"
				 PRIu64 ") failed: %s%s", p->dir, block, r->len, r->off,
				 ws_strerror(p->ws, err), r->res < 0 ? "" : " (short write)");
		if (i < p->n_pout)
			p->pout[i].t0 = 0;	/* not counted as written */
	}
	if (i < p->n_pout && !--p->pout[i].left) {
		uint64_t ns = kvmem_now_ns() - p->pout[i].t0;

		if (p->pout[i].t0) {
			p->st.blocks_out++;
			p->st.write_ns += ns;
			PROBE_STAGE_OUT(block, p->extent_bytes, ns);
			PROBE_TIER_MOVE(block * L, 0, KVMEM_TIER_NVME, p->extent_bytes, ns);
		}
		p->pout[i] = p->pout[--p->n_pout];
	}
}

int stage_drain(kvmem_pager *p)
{
	while (p->stage_busy || p->n_pout || p->ow_n)
		if (pager_reap(p, 1) < 0)
			return kvmem_fail();
	return 0;
}

/* ---- writes waiting for a request record ---------------------------------- */
static int ow_push(kvmem_pager *p, const struct out_wait *w)
{
	if (p->ow_n == p->ow_cap) {
		size_t cap = p->ow_cap ? 2 * p->ow_cap : 64;
		struct out_wait *n = malloc(cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		/* Unrolled from the ring's head. */
		for (size_t i = 0; i < p->ow_n; i++)
			n[i] = p->ow[(p->ow_head + i) % p->ow_cap];
		free(p->ow);
		p->ow = n;
		p->ow_cap = cap;
		p->ow_head = 0;
	}
	p->ow[(p->ow_head + p->ow_n++) % p->ow_cap] = *w;
	return 0;
}

static void reserve(kvmem_pager *p, uint64_t end);

/* A write that could not be queued: its block is kept in memory. */
static void out_refused(kvmem_pager *p, const struct out_wait *w)
{
	if (w->purpose == PUR_OUT) {
		p->stage[w->slot].busy = 0;
		p->stage_busy--;
		pager_fail_write(p, EIO, "%s/pages: cannot queue the write of block %" PRIu64,
				 p->dir, w->first_page);
		orphan_keep(p, w->first_page, w->buf, NULL);
		return;
	}
	/* Pool pages stay pinned: the pool holds the only copy. */
	pager_fail_write(p, EIO, "%s/pages: cannot queue the write of page %" PRIu64, p->dir,
			 w->first_page);
	for (int i = 0; i < p->n_pout; i++)
		if (p->pout[i].block == w->first_page / p->g.n_layers) {
			if (!--p->pout[i].left)
				p->pout[i] = p->pout[--p->n_pout];
			break;
		}
}

int out_pump(kvmem_pager *p)
{
	/* Reads keep a quarter of the records: a fetch never waits behind a
	 * prefill's writes for one. */
	unsigned max = p->io.depth - p->io.depth / 4;
	int queued = 0;

	while (p->ow_n && p->writes_inflight < (max ? max : 1)) {
		struct out_wait w = p->ow[p->ow_head];
		struct io_req *r = io_req_get(&p->io);

		if (!r)
			break;
		p->ow_head = (p->ow_head + 1) % p->ow_cap;
		p->ow_n--;
		r->kind = IO_WRITE;
		r->purpose = w.purpose;
		r->first_page = w.first_page;
		r->n_pages = w.n_pages;
		r->slot = w.slot;
		r->buf = w.buf;
		r->len = w.len;
		r->off = w.off;
		if (p->ws->ops->submit(p->ws, &p->io, r) < 0) {
			io_req_put(&p->io, r);
			out_refused(p, &w);
			continue;
		}
		p->writes_inflight++;
		queued = 1;
	}
	return queued;
}

static int out_queue(kvmem_pager *p, const struct out_wait *w)
{
	reserve(p, w->off + w->len);
	if (ow_push(p, w) < 0) {
		out_refused(p, w);
		return -1;
	}
	pager_reap(p, 0);	/* submit now: the write runs during prefill */
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

/* Room for the pages stream ahead of the writes (a directory allocates
 * the file: Documentation/pager.md), at least as far as writes can be in
 * flight: the stage-out buffer's extents, or this pager's share of the
 * pool for blocks written from the pool (a pool shared by N pagers: 1/N of
 * it, so N open conversations do not each reserve the whole pool on disk). */
static void reserve(kvmem_pager *p, uint64_t end)
{
	struct ws_store *ws = p->ws;
	uint64_t reach = (uint64_t)p->n_stage * p->extent_bytes,
		 pool = (uint64_t)kvmem_hostpool_slots(p->pool) * p->page_stride /
			kvmem_hostpool_users(p->pool);

	if (reach < pool)
		reach = pool;
	if (ws->ops->reserve && ws->ops->reserve(ws, end, p->extent_bytes, reach) < 0)
		pager_fail_write(p, kvmem_last_errno(), "%s", kvmem_last_error());
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

/* ---- blocks made in pool slots ------------------------------------------- */
static int resv_find(const kvmem_pager *p, uint64_t block)
{
	for (int i = 0; i < p->n_resv; i++)
		if (p->resv[i].block == block)
			return i;
	return -1;
}

void resv_drop(kvmem_pager *p, int i)
{
	struct pool_resv *r = &p->resv[i];

	for (size_t l = 0; l < p->g.n_layers; l++)
		pager_slots_give(p, r->slot[l], 1);
	free(r->slot);
	*r = p->resv[--p->n_resv];
}

static int block_memory(kvmem_pager *p, uint64_t block, void **layers)
{
	size_t L = p->g.n_layers;
	uint32_t *sl, got = 0;
	int i = resv_find(p, block), tries = 0, rc;

	if (p->rdonly || (p->flags & KVMEM_PAGER_NO_KEEP))
		return kvmem_error(ENOTSUP, "%s: pages made in the host pool need a writer that keeps "
				   "them there", p->dir);
	if (block < p->n_blocks)
		return kvmem_error(EINVAL, "%s: block %" PRIu64 " is appended already", p->dir, block);
	/* Blocks being made take at most half the pool: the rest stays for
	 * the pages a session reads (a pool of a few pages keeps working;
	 * the source makes its blocks in memory of its own then). */
	if (i < 0 && (uint64_t)(p->n_resv + 1) * L > kvmem_hostpool_slots(p->pool) / 2)
		return kvmem_error(ENOBUFS, "%s: blocks being made would take more than half the "
				   "host pool (%u slots)", p->dir, kvmem_hostpool_slots(p->pool));
	if (i < 0) {
		if (p->n_resv == p->cap_resv) {
			int cap = p->cap_resv ? 2 * p->cap_resv : 16;
			struct pool_resv *n = realloc(p->resv, cap * sizeof(*n));

			if (!n)
				return kvmem_error(ENOMEM, "%s: out of memory", p->dir);
			p->resv = n;
			p->cap_resv = cap;
		}
		sl = malloc(L * sizeof(*sl));
		if (!sl)
			return kvmem_error(ENOMEM, "%s: out of memory", p->dir);
		while (got < L) {
			uint32_t first, n;

			if (make_room(p, (uint32_t)(L - got)) < 0) {
				uint64_t t0;

				/* Pages being written hold their slots: wait for
				 * one write, as a full stage-out buffer would. */
				if (!p->n_pout && !p->ow_n) {
					/* Other pagers of a shared pool busy
					 * in calls: ask them again. */
					if (!p->shared || ++tries > ROOM_TRIES)
						break;
					room_pause();
					continue;
				}
				t0 = kvmem_now_ns();
				p->st.backpressure_waits++;
				rc = pager_reap(p, 1);
				/* One figure for the counter and the probe
				 * (kvmemlat sums the probe's). */
				t0 = kvmem_now_ns() - t0;
				p->st.backpressure_ns += t0;
				PROBE_BACKPRESSURE(block, t0);
				if (rc < 0)
					break;
				continue;
			}
			n = pager_slots_take(p, (uint32_t)(L - got), &first);
			for (uint32_t k = 0; k < n; k++) {
				sl[got + k] = first + k;
				p->slot_page[first + k] = UINT64_MAX;	/* not a page yet: never a victim */
				p->slot_pin[first + k] = 0;
			}
			got += n;
		}
		if (got < L) {
			for (uint32_t k = 0; k < got; k++)
				pager_slots_give(p, sl[k], 1);
			free(sl);
			return kvmem_error(ENOBUFS, "%s: no room in the host pool for block %" PRIu64
					   "'s %zu pages", p->dir, block, L);
		}
		i = p->n_resv++;
		p->resv[i] = (struct pool_resv){ .block = block, .slot = sl };
	}
	for (size_t l = 0; l < L; l++)
		layers[l] = kvmem_hostpool_slot(p->pool, p->resv[i].slot[l]);
	return 0;
}

int kvmem_pager_block_memory(kvmem_pager *p, uint64_t block, void **layers)
{
	int rc;

	pager_lock(p);
	rc = block_memory(p, block, layers);
	pager_unlock(p);
	return rc;
}

/* Pages from layer l0 on in consecutive slots: one write (at most 1 GiB). */
static size_t run_len(const kvmem_pager *p, const uint32_t *sl, size_t l0)
{
	size_t k = 1;

	while (l0 + k < p->g.n_layers && sl[l0 + k] == sl[l0] + k &&
	       (k + 1) * p->page_stride <= ((size_t)1 << 30))
		k++;
	return k;
}

static uint32_t run_count(const kvmem_pager *p, const uint32_t *sl)
{
	uint32_t n = 0;

	for (size_t l0 = 0; l0 < p->g.n_layers; l0 += run_len(p, sl, l0))
		n++;
	return n;
}

/* Block `block`'s index record and checksums, appended beside its pages
 * (either path of append_block); a failure marks the pager's writes failed. */
static void write_records(kvmem_pager *p, uint64_t block, const void *index,
			  const uint64_t *sums)
{
	size_t L = p->g.n_layers, ib = p->g.index_bytes;
	struct ws_store *ws = p->ws;
	int rc;

	if (!p->write_failed && ib && (rc = ws->ops->write(ws, WS_INDEX, index, ib, block * ib)) < 0)
		pager_fail_write(p, -rc, "%s/index: cannot append the record of block %" PRIu64 ": %s",
				 p->dir, block, ws_strerror(ws, -rc));
	if (!p->write_failed &&
	    (rc = ws->ops->write(ws, WS_SUMS, sums, (L + 1) * 8, block * p->sums_rec)) < 0)
		pager_fail_write(p, -rc, "%s/sums: cannot append the checksums of block %" PRIu64 ": %s",
				 p->dir, block, ws_strerror(ws, -rc));
}

/* Block `block`'s pages are in its pool slots (resv i): checksums, then
 * they join the pool pinned and are written from there. */
static int append_in_pool(kvmem_pager *p, uint64_t block, int i, const void *index)
{
	size_t L = p->g.n_layers, ib = p->g.index_bytes, pad = p->page_stride - p->page_bytes;
	uint32_t *sl = p->resv[i].slot;
	uint64_t *sums = p->sums + block * (L + 1);
	struct pool_out *po;

	if (p->n_pout == p->cap_pout) {
		int cap = p->cap_pout ? 2 * p->cap_pout : 64;
		struct pool_out *n = realloc(p->pout, cap * sizeof(*n));

		if (!n)
			return kvmem_error(ENOMEM, "%s: out of memory", p->dir);
		p->pout = n;
		p->cap_pout = cap;
	}
	#pragma omp parallel for schedule(static) if (L * p->page_bytes >= PAR_BYTES)
	for (size_t l = 0; l < L; l++) {
		uint8_t *pg = kvmem_hostpool_slot(p->pool, sl[l]);

		memset(pg + p->page_bytes, 0, pad);
		sums[l] = XXH3_64bits(pg, p->page_bytes);
	}
	sums[L] = XXH3_64bits(ib ? index : "", ib);
	XXH3_64bits_update(p->sums_hash, sums, (L + 1) * 8);
	p->n_blocks++;
	for (size_t l = 0; l < L; l++) {
		uint64_t pg = block * L + l;
		struct kvmem_pte *e = &p->pt[pg];

		e->flags |= KVMEM_PTE_DIRTY;
		e->tiers |= KVMEM_TIER_HOST;
		e->host_slot = sl[l];
		e->last_step = p->step;
		p->slot_page[sl[l]] = pg;
		p->slot_pin[sl[l]] = 1;		/* until written */
		p->repl->insert(p->repl_st, sl[l], pg, p->step);
		PROBE_TIER_MOVE(pg, 0, KVMEM_TIER_HOST, p->page_bytes, 0);
	}
	/* The slots are the pages' now; the list goes with the writes. */
	p->resv[i] = p->resv[--p->n_resv];

	write_records(p, block, index, sums);
	if (p->write_failed) {
		/* Pinned for good, as a failed write leaves them; the index
		 * record is kept in memory. */
		orphan_keep(p, block, NULL, index);
		free(sl);
		return 0;
	}
	/* The writes are counted before the first is queued: queueing reaps,
	 * and a count reaching 0 early would end the block's record while
	 * its later runs still go out (a block in scattered slots). */
	po = &p->pout[p->n_pout++];
	*po = (struct pool_out){ .block = block, .t0 = kvmem_now_ns(), .left = run_count(p, sl) };
	for (size_t l0 = 0; l0 < L;) {
		size_t k = run_len(p, sl, l0);
		struct out_wait w = { .purpose = PUR_POOL_OUT, .first_page = block * L + l0,
				      .n_pages = (uint32_t)k, .slot = sl[l0],
				      .buf = kvmem_hostpool_slot(p->pool, sl[l0]),
				      .len = k * p->page_stride,
				      .off = block * p->extent_bytes + l0 * p->page_stride };

		out_queue(p, &w);
		l0 += k;
	}
	free(sl);
	return 0;
}

static int append_block(kvmem_pager *p, uint64_t block, const void *const *layers,
			const void *index)
{
	size_t L = p->g.n_layers, ib = p->g.index_bytes;
	uint64_t *sums;
	uint8_t *ext;
	int slot, i;

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
	if ((i = resv_find(p, block)) >= 0) {
		size_t l = 0;

		while (l < L && layers[l] == kvmem_hostpool_slot(p->pool, p->resv[i].slot[l]))
			l++;
		if (l == L)
			return append_in_pool(p, block, i, index);
		resv_drop(p, i);	/* other memory: copied below, the slots go back */
	}
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

	write_records(p, block, index, sums);
	if (p->write_failed) {
		orphan_keep(p, block, ext, index);
	} else {
		struct out_wait w = { .purpose = PUR_OUT, .first_page = block, .n_pages = (uint32_t)L,
				      .slot = (uint32_t)slot, .buf = ext, .len = p->extent_bytes,
				      .off = block * p->extent_bytes };

		p->stage[slot].busy = 1;
		p->stage[slot].block = block;
		p->stage_busy++;
		out_queue(p, &w);
	}
	if (!(p->flags & KVMEM_PAGER_NO_KEEP))
		keep_in_pool(p, block, ext);	/* intact until a later append reuses it */
	return 0;
}

int kvmem_pager_append_block(kvmem_pager *p, uint64_t block, const void *const *layers,
			   const void *index)
{
	int rc;

	pager_lock(p);
	rc = append_block(p, block, layers, index);
	pager_unlock(p);
	return rc;
}

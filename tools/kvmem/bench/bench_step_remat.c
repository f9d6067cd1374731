// SPDX-License-Identifier: MIT
/*
 * kvmem bench step, phases ceilings, remat and coldin: the backend's
 * ceilings, pages placed from host memory into view slots, and a workspace
 * read cold from NVMe into view slots over an O_DIRECT sequential read of
 * the same file; also the view's own prefill and plain decode, the peers of
 * the step and decode phases.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench_step.h"

/* ---- phases ---------------------------------------------------------------- */
int ph_ceilings(struct ctx *x)
{
	if (!x->b->ops->ceilings)
		return kvmem_error(ENOTSUP, "the %s backend cannot measure its ceilings", x->b->ops->name);
	if (x->b->ops->ceilings(x->b->ctx, &x->ce) < 0)
		return -1;
	printf("ceilings: GEMM %.0f TFLOP/s, device copy %.0f GB/s (read + written), pinned host -> "
	       "device %.1f GB/s, device -> host %.1f GB/s (one 1 GiB copy each)\n",
	       x->ce.matmul_tflops, x->ce.copy_gbps, x->ce.h2d_gbps, x->ce.d2h_gbps);
	return 0;
}

static int set(struct ctx *x, const char *k, const char *v)
{
	if (!x->b->ops->set)
		return kvmem_error(ENOTSUP, "the %s backend has no settings", x->b->ops->name);
	return x->b->ops->set(x->b->ctx, k, v);
}

/* Place every item in calls of BATCH; seconds. */
static double place_all(struct ctx *x, kvmem_view *v, kvmem_place *it, int64_t n)
{
	double t0 = cli_now_s();

	for (int64_t i = 0; i < n; i += BATCH)
		if (x->b->ops->place(x->b->ctx, v, it + i, n - i < BATCH ? (int)(n - i) : BATCH) < 0)
			return -1;
	return cli_now_s() - t0;
}

/* order[0..n) = 0..n-1 in the order seed shuffles them (Fisher-Yates). */
static void shuffled_blocks(int64_t *order, int64_t n, uint64_t seed)
{
	uint64_t r = seed | 1;

	for (int64_t i = 0; i < n; i++)
		order[i] = i;
	for (int64_t i = n - 1; i > 0; i--) {
		int64_t j = (int64_t)(xs(&r) % (uint64_t)(i + 1)), t = order[i];

		order[i] = order[j];
		order[j] = t;
	}
}

int ph_remat(struct ctx *x)
{
	const int L = x->geo.cfg.n_layers;
	const int64_t nb = x->o.remat / BLOCK, np = nb * L;
	const size_t bytes = (size_t)np * x->page_bytes;
	char *arena = NULL;
	kvmem_place *it = NULL;
	kvmem_view *v = NULL;
	int64_t *order = NULL;
	int reg = 0, rc = -1;
	static const char *methods[] = { "gather", "batch", "pack" };
	double best[3] = { 0 }, peak = x->ce.h2d_gbps;

	if (posix_memalign((void **)&arena, 2u << 20, bytes) || !(it = calloc(np, sizeof(*it))) ||
	    !(order = malloc(sizeof(*order) * nb))) {
		kvmem_error(ENOMEM, "out of memory for %zu bytes of pages", bytes);
		goto out;
	}
	fill_bf16(arena, bytes, x->o.seed);
	/* Blocks to slots in a shuffled order: the pages are scattered over
	 * the arena as entering blocks are over a host pool. */
	shuffled_blocks(order, nb, x->o.seed);
	for (int l = 0, k = 0; l < L; l++)
		for (int64_t i = 0; i < nb; i++, k++) {
			int64_t b = order[i];
			char *pg = arena + (size_t)(b * L + l) * x->page_bytes;

			it[k] = (kvmem_place){ .block = b, .layer = l, .u0 = 0, .n = BLOCK, .stride = BLOCK,
					       .slot = i * BLOCK,
					       .page = { .k = pg, .v = pg + x->half,
							 .dtype = KVMEM_DTYPE_BF16,
							 .mem = KVMEM_MEM_HOST } };
		}
	if (x->b->ops->view_create(x->b->ctx, &v) < 0 || x->b->ops->reserve(x->b->ctx, v, nb * BLOCK) < 0)
		goto out;
	if (x->b->ops->host_register && x->b->ops->host_register(x->b->ctx, arena, bytes) == 0)
		reg = 1;
	printf("\nrematerialisation: %" PRId64 " pages of %zu KiB (%.2f GB, %" PRId64 " tokens x %d "
	       "layers, bf16) placed in calls of %d pages, shuffled blocks; pages in %s host memory\n",
	       np, x->page_bytes >> 10, bytes / 1e9, nb * BLOCK, L, BATCH, reg ? "registered" :
	       "unregistered (host_register refused)");
	if (!x->b->ops->set) {
		double t = place_all(x, v, it, np);

		if (t < 0 || (t = place_all(x, v, it, np)) < 0)
			goto out;
		printf("  %7.1f GB/s (the %s backend's place)\n", gbps(bytes, t), x->b->ops->name);
		rc = 0;
		goto out;
	}
	if (set(x, "pool", "0") < 0)
		goto out;
	for (int m = 0; m < 3; m++) {
		if (set(x, "place", methods[m]) < 0 || place_all(x, v, it, m == 2 ? BATCH : np) < 0)
			goto out;	/* warm-up */
		for (int r = 0; r < (m == 2 ? 1 : 3); r++) {
			double t = place_all(x, v, it, np);

			if (t < 0)
				goto out;
			if (!best[m] || gbps(bytes, t) > best[m])
				best[m] = gbps(bytes, t);
		}
		printf("  %-7s %7.1f GB/s  %.2f of the pinned copy peak (%.1f GB/s)%s\n", methods[m],
		       best[m], best[m] / peak, peak,
		       m == 0 ? "  [one kernel reads the pages over PCIe]" :
		       m == 1 ? "  [cudaMemcpyBatchAsync of merged runs, then the kernel]" :
				"  [the first version: CPU packs bf16, two uploads, scatter]");
		fflush(stdout);
	}
	{
		const char *keep = best[1] > best[0] ? "batch" : "gather";

		printf("  kept: %s (the faster here)\n", keep);
		if (set(x, "place", keep) < 0)
			goto out;
	}
	/* Unregistered memory: staged into pinned memory first. */
	if (reg) {
		double t = 0, bst = 0;

		x->b->ops->host_unregister(x->b->ctx, arena);
		reg = 0;
		for (int r = 0; r < 2; r++)
			if ((t = place_all(x, v, it, np)) < 0)
				goto out;
			else if (gbps(bytes, t) > bst)
				bst = gbps(bytes, t);
		printf("  %-7s %7.1f GB/s  %.2f of the peak  [pages in unregistered memory: copied "
		       "to pinned staging, then the kernel]\n", "staged", bst, bst / peak);
		if (x->b->ops->host_register(x->b->ctx, arena, bytes) == 0)
			reg = 1;
	}
	/* The device page pool: a second visit of the same pages. */
	{
		char pool[32];
		kvmem_place_stats a, d;
		double t;

		snprintf(pool, sizeof(pool), "%zu", bytes + (bytes >> 4));
		if (reg && set(x, "pool", pool) == 0 && place_all(x, v, it, np) >= 0) {
			/* The kernel at HBM speed, by its block size (the same
			 * bits): a page from the pool has K and V read, K, V and
			 * raw K written (2.5 times its bytes at the device copy
			 * rate, which counts bytes read plus written); the
			 * fastest is kept for the rest of the run. */
			static const char *threads[] = { "256", "512", "768", "1024" };
			double best_t = 0;
			int keep = 0;

			for (int k = 0; k < 4; k++) {
				double bt = 0;

				if (set(x, "gather_threads", threads[k]) < 0)
					break;
				for (int r = 0; r < 3; r++) {
					place_now(x, &a);
					if ((t = place_all(x, v, it, np)) < 0)
						goto out;
					place_delta(x, &a, &d);
					if (!bt || t < bt)
						bt = t;
				}
				printf("  %-7s %7.1f GB/s  %.1f x the pinned copy peak, %.2f of the device "
				       "copy rate%s  [the device page pool: %" PRIu64 " of %" PRIu64
				       " pages from HBM; gather blocks of %s threads]\n", "pool",
				       gbps(bytes, bt), gbps(bytes, bt) / peak,
				       x->ce.copy_gbps > 0 ? 2.5 * gbps(bytes, bt) / x->ce.copy_gbps : 0.0,
				       x->ce.copy_gbps > 0 && 2.5 * gbps(bytes, bt) < x->ce.copy_gbps ?
				       " (slower)" : "", d.pool_hits, d.items, threads[k]);
				if (!best_t || bt < best_t) {
					best_t = bt;
					keep = k;
				}
			}
			if (best_t > 0) {
				printf("  kept: gather blocks of %s threads (the fastest here)\n",
				       threads[keep]);
				set(x, "gather_threads", threads[keep]);
			}
		}
		/* Later phases get the pool a user gets (before, the step
		 * phase after this one ran with none). */
		set(x, "pool", "default");
	}
	rc = 0;
out:
	if (reg)
		x->b->ops->host_unregister(x->b->ctx, arena);
	if (v)
		x->b->ops->view_destroy(x->b->ctx, v);
	free(arena);
	free(it);
	free(order);
	return rc;
}

/* ---- --kv-dtype both: rematerialisation, fp8 against bf16 ------------------ */
/*
 * The same tokens' pages in bf16 (x's backend) and in fp8 (y's, fp8 views),
 * in registered host memory, placed as a session's step places the blocks
 * that enter its view: a block's layers one after another, 1,024 pages a
 * call, each page's first time on the GPU. Two ways a dtype:
 *   pool    the device page pool as the backend keeps it by default (bf16:
 *           the gather reads each page over PCIe and fills the pool on its
 *           way; fp8: whole pages copied into the pool by one batched copy
 *           a call, then the gather from HBM): the session's way;
 *   kernel  no pool: the gather alone reads the pages over PCIe.
 * A pass first places a warm-up set of other blocks into the same slots
 * (the pool is made and half filled outside the time), then times the
 * measured set, every place() waited for (place_sync: a pass ends with its
 * last kernel; bf16's reads of host pages are waited for anyway). The
 * dtypes alternate, three passes each way; the fastest pass is kept.
 */
struct remat_set {
	char *arena;
	size_t bytes;
	kvmem_place *it;	/* the warm-up set's items, then the measured set's */
	int64_t np;		/* items a set */
	kvmem_view *v;
	int reg;
	double best[2];		/* pool, kernel: the fastest pass, seconds */
	uint64_t hits[2];	/* pages the measured set found in the pool (none: its first time) */
	uint64_t held[2];	/* pages in the pool after the pass (0: no pool was made) */
};

static void remat_set_free(struct ctx *c, struct remat_set *s)
{
	if (s->reg)
		c->b->ops->host_unregister(c->b->ctx, s->arena);
	if (s->v)
		c->b->ops->view_destroy(c->b->ctx, s->v);
	free(s->arena);
	free(s->it);
	memset(s, 0, sizeof(*s));
}

/* 2 * nb blocks of c's pages (dtype c->o.kv_dtype) at order's blocks, the
 * items block-major, slots 0..nb * BLOCK - 1 for each set. */
static int remat_set_make(struct ctx *c, int64_t nb, const int64_t *order, struct remat_set *s)
{
	const int L = c->geo.cfg.n_layers;
	const uint32_t dt = c->o.kv_dtype == KVMEM_DTYPE_FP8 ? KVMEM_DTYPE_FP8 : KVMEM_DTYPE_BF16;

	memset(s, 0, sizeof(*s));
	s->np = nb * L;
	s->bytes = (size_t)(2 * nb) * L * c->page_bytes;
	if (posix_memalign((void **)&s->arena, 2u << 20, s->bytes) ||
	    !(s->it = calloc((size_t)(2 * s->np), sizeof(*s->it)))) {
		free(s->arena);
		s->arena = NULL;
		return kvmem_error(ENOMEM, "out of memory for %zu bytes of %s pages", s->bytes,
				   kvmem_dtype_name(dt));
	}
	fill_bf16(s->arena, s->bytes, c->o.seed);
	if (dt == KVMEM_DTYPE_FP8)
		fp8_valid(s->arena, s->bytes);
	for (int64_t i = 0, k = 0; i < 2 * nb; i++)
		for (int l = 0; l < L; l++, k++) {
			kvmem_place *it = &s->it[k];

			*it = (kvmem_place){ .block = order[i], .layer = l, .u0 = 0, .n = BLOCK,
					     .stride = BLOCK, .slot = (i % nb) * BLOCK };
			kvmem_page_at(&it->page, s->arena + (size_t)(order[i] * L + l) * c->page_bytes,
				      dt, c->geo.cfg.n_kv_heads, BLOCK, c->geo.cfg.head_dim);
		}
	if (c->b->ops->view_create(c->b->ctx, &s->v) < 0 ||
	    c->b->ops->reserve(c->b->ctx, s->v, nb * BLOCK) < 0)
		return -1;
	if (c->b->ops->host_register && c->b->ops->host_register(c->b->ctx, s->arena, s->bytes) == 0)
		s->reg = 1;
	return 0;
}

/* One pass of way w (0: the pool, 1: the kernel alone) over c's set. */
static int remat_pass(struct ctx *c, struct remat_set *s, int w)
{
	kvmem_place_stats a, d;
	double t;

	if (c->b->ops->set && (set(c, "pool", w ? "0" : "default") < 0 ||
			       set(c, "place_sync", "1") < 0))
		return -1;
	if (place_all(c, s->v, s->it, s->np) < 0)	/* the warm-up set */
		return -1;
	place_now(c, &a);
	if ((t = place_all(c, s->v, s->it + s->np, s->np)) < 0)
		return -1;
	place_delta(c, &a, &d);	/* its pool_pages: the pool's pages now */
	if (!s->best[w] || t < s->best[w]) {
		s->best[w] = t;
		s->hits[w] = d.pool_hits;
		s->held[w] = d.pool_pages;
	}
	return 0;
}

int ph_remat_both(struct ctx *x, struct ctx *y)
{
	const int64_t nb = x->o.remat / BLOCK;
	struct ctx *cs[2] = { x, y };
	struct remat_set sets[2] = { 0 };
	int64_t *order = malloc(sizeof(*order) * (size_t)(2 * nb));
	const int ways = x->b->ops->set && y->b->ops->set ? 2 : 1;
	const double peak = x->ce.h2d_gbps, tokens = (double)(nb * BLOCK);
	int rc = -1;

	if (!order)
		return kvmem_error(ENOMEM, "out of memory");
	/* the blocks shuffled: scattered over the arena as entering blocks
	 * are over a host pool (the same order for both dtypes) */
	shuffled_blocks(order, 2 * nb, x->o.seed);
	for (int d = 0; d < 2; d++)
		if (remat_set_make(cs[d], nb, order, &sets[d]) < 0)
			goto out;
	printf("\nrematerialisation, fp8 against bf16: %" PRId64 " tokens x %d layers (pages of "
	       "%zu / %zu bytes: %.1f / %.1f MB) placed a block's layers at a time in calls of %d "
	       "pages, shuffled blocks, each page placed for the first time; pages in %shost "
	       "memory\n", nb * BLOCK, x->geo.cfg.n_layers, x->page_bytes, y->page_bytes,
	       (double)sets[0].np * x->page_bytes / 1e6, (double)sets[1].np * y->page_bytes / 1e6,
	       BATCH, !x->b->ops->host_register ? "" : sets[0].reg && sets[1].reg ?
	       "registered " : "unregistered (host_register refused) ");
	for (int r = 0; r < 3; r++)
		for (int w = 0; w < ways; w++)
			for (int d = 0; d < 2; d++)
				if (remat_pass(cs[d], &sets[d], w) < 0)
					goto out;
	for (int w = 0; w < ways; w++) {
		for (int d = 0; d < 2; d++) {
			const double t = sets[d].best[w];
			const double gb = (double)sets[d].np * cs[d]->page_bytes / t / 1e9;

			printf("  %-4s %-6s %7.1f GB/s  %6.0fK tokens/s", d ? "fp8" : "bf16",
			       ways == 1 ? "place" : w ? "kernel" : "pool", gb, tokens / t / 1e3);
			if (peak > 0)
				printf("  %.2f of the pinned copy peak (%.1f GB/s)", gb / peak, peak);
			printf("  [%s; %" PRIu64 " of %" PRId64 " pages from the pool, %" PRIu64
			       " held after]\n", ways == 1 ? "the backend's place" :
			       w ? "no pool: the gather reads the pages over PCIe" :
			       !sets[d].held[w] ? "NO POOL COULD BE MADE: the kernel's way" :
			       d ? "whole pages copied into the pool, then the gather from HBM" :
				   "the gather reads the pages over PCIe and fills the pool",
			       sets[d].hits[w], sets[d].np, sets[d].held[w]);
		}
		printf("  fp8 / bf16 tokens/s, %s: %.2f (target >= 1.9; the pages' bytes allow %.2f)\n",
		       ways == 1 ? "place" : w ? "the kernel alone" : "the session's way (pool)",
		       sets[0].best[w] / sets[1].best[w], (double)x->page_bytes / y->page_bytes);
	}
	rc = 0;
out:
	for (int d = 0; d < 2; d++) {
		if (cs[d]->b->ops->set) {	/* later phases as a user gets them */
			set(cs[d], "pool", "default");
			set(cs[d], "place_sync", "default");
		}
		remat_set_free(cs[d], &sets[d]);
	}
	free(order);
	return rc;
}

/* ---- O_DIRECT sequential read (the peer of cold page-in) ------------------- */
/* An O_DIRECT sequential read of path's first size bytes in requests of
 * req bytes, qd in flight: bytes per second, or -1. */
double seq_read(const char *path, uint64_t size, size_t req, int qd)
{
	struct io_uring ring;
	struct io_uring_cqe *cqe;
	uint8_t *buf = NULL;
	uint64_t off = 0, done = 0;
	int fd = open(path, O_RDONLY | O_DIRECT), inflight = 0;
	double t0;

	if (fd < 0)
		return -1;
	if (posix_memalign((void **)&buf, 2u << 20, req * qd) ||
	    io_uring_queue_init(qd * 2, &ring, 0) < 0) {
		free(buf);
		close(fd);
		return -1;
	}
	/* As the pager's pool: huge pages where the system gives them (fewer
	 * to pin per request), touched first (no page faults in the reads). */
	madvise(buf, req * qd, MADV_HUGEPAGE);
	memset(buf, 0, req * qd);
	size -= size % req;
	t0 = cli_now_s();
	while (done < size) {
		while (inflight < qd && off < size) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);

			io_uring_prep_read(sqe, fd, buf + (size_t)(off / req % qd) * req, req, off);
			off += req;
			inflight++;
		}
		if (io_uring_submit_and_wait(&ring, 1) < 0 || io_uring_wait_cqe(&ring, &cqe) < 0 ||
		    cqe->res != (int)req)
			break;
		io_uring_cqe_seen(&ring, cqe);
		inflight--;
		done += req;
	}
	t0 = cli_now_s() - t0;
	io_uring_queue_exit(&ring);
	free(buf);
	close(fd);
	return done == size ? size / t0 : -1;
}

/* A fresh pool's memory touched before the clock starts, as registering
 * it (cuda) does and as a long-lived pool is: the reads then pay no page
 * faults. */
static void touch(void *base, size_t len)
{
#ifdef MADV_POPULATE_WRITE
	if (madvise(base, len, MADV_POPULATE_WRITE) == 0)
		return;
#endif
	memset(base, 0, len);
}

/* One cold pass: a fresh pager (an empty host pool) over the workspace in
 * dir, everything prefetched, then fetched and placed BATCH pages at a
 * time as a step does; with v NULL only fetched and released (the pager
 * alone). Its seconds, those in place() calls in *place_s, or -1. */
static double coldin_once(struct ctx *x, const char *dir, int64_t np, kvmem_view *v,
			  kvmem_pager_opts *po, int *registered, double *place_s)
{
	const int L = x->geo.cfg.n_layers, H = x->geo.cfg.n_kv_heads, D = x->geo.cfg.head_dim;
	kvmem_page_geom g;
	kvmem_pager *p = NULL;
	uint64_t *ids = NULL;
	const void **data = NULL;
	kvmem_place *it = NULL;
	void *base = NULL;
	size_t len = 0;
	double t0, t = -1, tp = 0;
	int reg = 0;

	geom_of(x, &x->geo, &g);
	if (kvmem_pager_open(dir, &g, po, &p) < 0)
		goto out;
	kvmem_pager_region(p, &base, &len);
	if (v && x->b->ops->host_register && x->b->ops->host_register(x->b->ctx, base, len) == 0)
		reg = 1;
	else if (base && len)
		touch(base, len);
	if (v)
		*registered = reg;
	if (!(ids = malloc(sizeof(*ids) * np)) || !(data = malloc(sizeof(*data) * BATCH)) ||
	    !(it = calloc(BATCH, sizeof(*it)))) {
		kvmem_error(ENOMEM, "out of memory");
		goto out;
	}
	for (int64_t i = 0; i < np; i++)
		ids[i] = (uint64_t)i;
	t0 = cli_now_s();
	/* As a step does: the selection known, everything asked ahead, then
	 * placed batch by batch as the pages land. */
	kvmem_pager_prefetch(p, ids, (size_t)np);
	for (int64_t i = 0; i < np; i += BATCH) {
		int n = np - i < BATCH ? (int)(np - i) : BATCH, rc = 0;
		double t1;

		if (kvmem_pager_fetch(p, ids + i, n, data) < 0)
			goto out;
		for (int k = 0; v && k < n; k++) {
			int64_t id = i + k, b = id / L;

			it[k] = (kvmem_place){ .block = b, .layer = (int)(id % L), .u0 = 0, .n = BLOCK,
					       .stride = BLOCK, .slot = b * BLOCK };
			kvmem_page_at(&it[k].page, data[k], x->o.kv_dtype, H, BLOCK, D);
		}
		t1 = cli_now_s();
		if (v)
			rc = x->b->ops->place(x->b->ctx, v, it, n);
		tp += cli_now_s() - t1;
		kvmem_pager_release(p, ids + i, n);
		if (rc < 0)
			goto out;
	}
	t = cli_now_s() - t0;
	*place_s = tp;
out:
	if (reg)
		x->b->ops->host_unregister(x->b->ctx, base);
	if (p)
		kvmem_pager_close(p);
	free(ids);
	free(data);
	free(it);
	return t;
}

#define COLDIN_REPS 3

/* One dtype of the coldin phase: its workspace, view and figures. */
struct coldin_arm {
	struct ctx *x;
	const char *dt;			/* "bf16", "fp8" */
	char dir[4200], path[4300];
	int64_t np;
	size_t stride;
	double bytes, made;		/* page bytes a pass reads (strides); writing them */
	kvmem_pager_opts po;
	kvmem_view *v;
	kvmem_place_stats a;
	int reg;
	double seq[COLDIN_REPS], seqp[COLDIN_REPS], pin[COLDIN_REPS], alone[COLDIN_REPS];
	double place_s[COLDIN_REPS];
	double tps, alone_tps, ceil;	/* medians: tokens/s, tokens/s, bytes/s */
};

static int arm_open(struct coldin_arm *c, struct ctx *x, int64_t nb)
{
	kvmem_page_geom g;

	c->x = x;
	c->dt = kvmem_dtype_name(x->o.kv_dtype);
	c->np = nb * x->geo.cfg.n_layers;
	snprintf(c->dir, sizeof(c->dir), "%s/coldin-%s", x->o.dir, c->dt);
	/* from the same parts, not from c->dir: gcc's -Wrestrict cannot tell
	 * two members of one struct apart */
	snprintf(c->path, sizeof(c->path), "%s/coldin-%s/pages", x->o.dir, c->dt);
	if (make_workspace(x, &x->geo, c->dir, nb * BLOCK, &c->made) < 0)
		return -1;
	geom_of(x, &x->geo, &g);
	c->stride = kvmem_page_stride(&g);
	c->bytes = (double)c->np * c->stride;
	kvmem_pager_opts_default(&c->po);
	c->po.host_cap = (uint64_t)c->np * c->stride + (64ull << 20);
	if (x->o.read_size)
		c->po.max_read = (uint32_t)x->o.read_size;
	if (x->o.queue_depth)
		c->po.queue_depth = (uint32_t)x->o.queue_depth;
	if (x->b->ops->view_create(x->b->ctx, &c->v) < 0)
		return -1;
	return x->b->ops->reserve(x->b->ctx, c->v, nb * BLOCK);
}

static void arm_close(struct coldin_arm *c)
{
	if (c->v)
		c->x->b->ops->view_destroy(c->x->b->ctx, c->v);
	c->v = NULL;
	if (c->x && !c->x->o.keep)
		rm_rf(c->dir);
}

/* Pass r of arm c: the two sequential reads of its file, the page-in into
 * its view, the pager alone. */
static int arm_pass(struct coldin_arm *c, int r, int64_t tokens)
{
	const uint64_t size = (uint64_t)c->np * c->stride;
	double unused;

	c->seq[r] = seq_read(c->path, size, 1u << 20, 32);
	c->seqp[r] = seq_read(c->path, size, c->po.max_read,
			      c->po.queue_depth < 64 ? (int)c->po.queue_depth : 64);
	if ((c->pin[r] = coldin_once(c->x, c->dir, c->np, c->v, &c->po, &c->reg,
				     &c->place_s[r])) < 0 ||
	    (c->alone[r] = coldin_once(c->x, c->dir, c->np, NULL, &c->po, &c->reg, &unused)) < 0)
		return -1;
	printf("  pass %d, %-4s: sequential read %.2f GB/s (1 MiB) / %.2f GB/s (the pager's "
	       "requests); page-in %.2f GB/s, %.0f tokens/s (place() %.0f of %.0f ms); pager "
	       "alone %.2f GB/s, %.0f tokens/s\n", r + 1, c->dt,
	       c->seq[r] > 0 ? c->seq[r] / 1e9 : 0, c->seqp[r] > 0 ? c->seqp[r] / 1e9 : 0,
	       gbps(c->bytes, c->pin[r]), tokens / c->pin[r], c->place_s[r] * 1e3, c->pin[r] * 1e3,
	       gbps(c->bytes, c->alone[r]), tokens / c->alone[r]);
	fflush(stdout);
	return 0;
}

static void arm_summary(struct coldin_arm *c, int64_t tokens)
{
	const double per_tok = c->bytes / (double)tokens;	/* bytes a token, all layers */
	double m1 = median(c->seq, COLDIN_REPS), m2 = median(c->seqp, COLDIN_REPS);
	double mp = median(c->pin, COLDIN_REPS), ma = median(c->alone, COLDIN_REPS);
	double all = 0, pl = 0;
	kvmem_place_stats d;

	c->ceil = m1 > m2 ? m1 : m2;
	c->tps = tokens / mp;
	c->alone_tps = tokens / ma;
	for (int r = 0; r < COLDIN_REPS; r++)
		all += c->pin[r], pl += c->place_s[r];
	printf("  %s: median page-in %.2f GB/s = %.0f tokens/s; best median sequential read %.2f "
	       "GB/s = %.0f tokens/s at %.0f bytes a token; ratio %.2f\n", c->dt,
	       gbps(c->bytes, mp), c->tps, c->ceil / 1e9, c->ceil / per_tok, per_tok,
	       c->ceil > 0 ? c->bytes / mp / c->ceil : 0);
	printf("  %*s  pager alone (fetch and release, no place) %.2f GB/s = %.0f tokens/s, ratio "
	       "%.2f; place() calls %.0f ms of the %.0f ms of %d passes\n", (int)strlen(c->dt), "",
	       gbps(c->bytes, ma), c->alone_tps, c->ceil > 0 ? c->bytes / ma / c->ceil : 0,
	       pl * 1e3, all * 1e3, COLDIN_REPS);
	if (c->x->b->ops->place_stats) {
		place_delta(c->x, &c->a, &d);
		printf("  %*s  (the backend's place stats: %.0f ms in %" PRIu64 " calls)\n",
		       (int)strlen(c->dt), "", d.ns / 1e6, d.calls);
	}
}

/*
 * The phase over n arms (dtypes) of nb blocks each, the same tokens: each
 * pass runs every arm in turn, so a virtual disk's drift falls on all of
 * them alike. With two, fp8 against bf16.
 */
static int coldin_run(struct ctx **xs, int n, int64_t nb)
{
	const int L = xs[0]->geo.cfg.n_layers;
	const int64_t tokens = nb * BLOCK;
	struct coldin_arm c[2];
	char buf[64];
	int rc = -1;

	memset(c, 0, sizeof(c));
	for (int i = 0; i < n; i++)
		if (arm_open(&c[i], xs[i], nb) < 0)
			goto out;
	printf("\ncold page-in, NVMe -> view slots: %" PRId64 " tokens (%" PRId64 " blocks x %d "
	       "layers) read through the pager (O_DIRECT reads of up to %u KiB, %u entries, the "
	       "host pool touched before the clock, then the backend's place), alternated %d "
	       "times with O_DIRECT sequential reads of the same file in 1 MiB requests 32 deep "
	       "and in the pager's (a virtual disk's rate drifts between runs; the ceiling is the "
	       "better median)%s; then the pager alone (no place)\n", tokens, nb, L,
	       c[0].po.max_read >> 10, c[0].po.queue_depth, COLDIN_REPS,
	       n > 1 ? ", each pass every dtype in turn" : "");
	for (int i = 0; i < n; i++)
		printf("  %s: %" PRId64 " pages of %zu bytes on a %zu-byte stride, %.2f GB "
		       "(workspace written in %.1f s)\n", c[i].dt, c[i].np, c[i].x->page_bytes,
		       c[i].stride, c[i].bytes / 1e9, c[i].made);
	for (int i = 0; i < n; i++)
		place_now(c[i].x, &c[i].a);
	for (int r = 0; r < COLDIN_REPS; r++)
		for (int i = 0; i < n; i++)
			if (arm_pass(&c[i], r, tokens) < 0)
				goto out;
	for (int i = 0; i < n; i++) {
		arm_summary(&c[i], tokens);
		printf("  %*s  host pool %s\n", (int)strlen(c[i].dt), "", c[i].reg ?
		       "registered: the backend reads it where it is" :
		       "not registered: the backend copies from it");
	}
	if (n == 2) {
		double r = c[1].tps / c[0].tps, ra = c[1].alone_tps / c[0].alone_tps;

		printf("  %s / %s tokens/s = %.2f, %s (target >= 1.9: %s); pager alone %.2f; the "
		       "pages' strides on disk give %.2f\n", c[1].dt, c[0].dt, r,
		       vs(buf, sizeof(buf), 1 / c[0].tps, 1 / c[1].tps),
		       r >= 1.9 ? "met" : "missed", ra, (double)c[0].stride / c[1].stride);
	}
	rc = 0;
out:
	for (int i = 0; i < n; i++)
		arm_close(&c[i]);
	return rc;
}

int ph_coldin(struct ctx *x)
{
	int64_t nb = (int64_t)(x->o.coldin / ((uint64_t)x->geo.cfg.n_layers * x->page_bytes));

	return coldin_run(&x, 1, nb < 1 ? 1 : nb);
}

/* --kv-dtype both: the tokens of --coldin bytes of bf16 pages, in each. */
int ph_coldin_both(struct ctx *bf16, struct ctx *fp8)
{
	struct ctx *xs[2] = { bf16, fp8 };
	int64_t nb = (int64_t)(bf16->o.coldin / ((uint64_t)bf16->geo.cfg.n_layers *
						  bf16->page_bytes));

	return coldin_run(xs, 2, nb < 1 ? 1 : nb);
}

/* The best of three, after one to warm up (a decode graph made): the view
 * emptied, the question's tokens in one forward, one decoded token. A step
 * does this and more (it reads the view's KV and places what enters), so
 * no KV format makes a step faster than this. */
static double floor_step(struct ctx *x, float *logits)
{
	kvmem_sampler greedy = { 0 };
	uint64_t rng = kvmem_rng_seed(x->o.seed + 7);
	int32_t q[128], tok;
	kvmem_view *e = NULL;
	double best = -1;
	int rc = 0;

	random_ids(q, x->o.question, x->geo.cfg.vocab, x->o.seed * 1000 + 999);
	if (x->b->ops->view_create(x->b->ctx, &e) < 0)
		return -1;
	if (x->b->ops->reserve(x->b->ctx, e, x->o.question + 1) < 0)
		rc = -1;
	for (int rep = 0; rep < 4 && !rc; rep++) {
		double t0, t;

		t0 = cli_now_s();
		if (x->b->ops->set_length(x->b->ctx, e, 0) < 0 ||
		    x->b->ops->forward(x->b->ctx, e, q, x->o.question, logits, 0, NULL) < 0) {
			rc = -1;
			break;
		}
		tok = kvmem_sample(logits, x->geo.cfg.vocab, &greedy, &rng);
		if (x->b->ops->forward(x->b->ctx, e, &tok, 1, logits, 0, NULL) < 0) {
			rc = -1;
			break;
		}
		t = cli_now_s() - t0;
		if (rep)
			best = best < 0 || t < best ? t : best;
	}
	x->b->ops->view_destroy(x->b->ctx, e);
	return rc ? -1 : best;
}

/* The view's own prefill and plain decode, once: the step's and decode's
 * peers; then the step's floor. */
int peers(struct ctx *x)
{
	float *logits = malloc(sizeof(float) * x->geo.cfg.vocab);
	uint64_t rng = kvmem_rng_seed(x->o.seed);
	kvmem_sampler greedy = { 0 };
	double t0;
	int rc = -1;

	if (!logits)
		return kvmem_error(ENOMEM, "out of memory");
	if ((!x->peer && x->b->ops->view_create(x->b->ctx, &x->peer) < 0) ||
	    (x->prefill_view_s = prefill_view(x, x->peer, x->o.view, 4096, logits)) < 0)
		goto out;
	for (int k = 0; k < 4; k++) {	/* first-use costs (a decode graph) stay out */
		int32_t tok = kvmem_sample(logits, x->geo.cfg.vocab, &greedy, &rng);

		if (x->b->ops->forward(x->b->ctx, x->peer, &tok, 1, logits, 0, NULL) < 0)
			goto out;
	}
	t0 = cli_now_s();
	for (int k = 0; k < x->o.decode; k++) {
		int32_t tok = kvmem_sample(logits, x->geo.cfg.vocab, &greedy, &rng);

		if (x->b->ops->forward(x->b->ctx, x->peer, &tok, 1, logits, 0, NULL) < 0)
			goto out;
	}
	x->plain_decode_tps = x->o.decode / (cli_now_s() - t0);
	if ((x->floor_step_s = floor_step(x, logits)) < 0)
		goto out;
	printf("\npeers: prefilling %" PRId64 " tokens from scratch (chunks of 4096) %.3f s; plain "
	       "decode after them %.1f tokens/s; the step's floor (the question's %d tokens and "
	       "one more over an empty view: no KV read) %.1f ms\n", x->o.view, x->prefill_view_s,
	       x->plain_decode_tps, x->o.question, x->floor_step_s * 1e3);
	rc = 0;
out:
	free(logits);
	return rc;
}

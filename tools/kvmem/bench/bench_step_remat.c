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
	for (int64_t i = 0; i < nb; i++)
		order[i] = i;
	{
		uint64_t r = x->o.seed | 1;

		for (int64_t i = nb - 1; i > 0; i--) {
			int64_t j = (int64_t)(xs(&r) % (uint64_t)(i + 1)), t = order[i];

			order[i] = order[j];
			order[j] = t;
		}
	}
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

/* ---- O_DIRECT sequential read (the peer of cold page-in) ------------------- */
/* An O_DIRECT sequential read of path's first size bytes in requests of
 * req bytes, qd in flight: bytes per second, or -1. */
double seq_read(const char *path, uint64_t size, size_t req, int qd)
{
	struct io_uring ring;
	struct io_uring_cqe *cqe;
	uint8_t *buf;
	uint64_t off = 0, done = 0;
	int fd = open(path, O_RDONLY | O_DIRECT), inflight = 0;
	double t0;

	if (fd < 0)
		return -1;
	if (posix_memalign((void **)&buf, 4096, req * qd) || io_uring_queue_init(qd * 2, &ring, 0) < 0) {
		close(fd);
		return -1;
	}
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

/* One cold pass: a fresh pager (an empty host pool) over the workspace in
 * dir, everything prefetched, then fetched and placed BATCH pages at a
 * time as a step does. Its seconds, or -1. */
static double coldin_once(struct ctx *x, const char *dir, int64_t np, kvmem_view *v,
			  kvmem_pager_opts *po, int *registered)
{
	const int L = x->geo.cfg.n_layers;
	kvmem_page_geom g;
	kvmem_pager *p = NULL;
	uint64_t *ids = NULL;
	const void **data = NULL;
	kvmem_place *it = NULL;
	void *base = NULL;
	size_t len = 0;
	double t0, t = -1;
	int reg = 0;

	geom_of(x, &x->geo, &g);
	if (kvmem_pager_open(dir, &g, po, &p) < 0)
		goto out;
	kvmem_pager_region(p, &base, &len);
	if (x->b->ops->host_register && x->b->ops->host_register(x->b->ctx, base, len) == 0)
		reg = 1;
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
		int n = np - i < BATCH ? (int)(np - i) : BATCH, rc;

		if (kvmem_pager_fetch(p, ids + i, n, data) < 0)
			goto out;
		for (int k = 0; k < n; k++) {
			int64_t id = i + k, b = id / L;

			it[k] = (kvmem_place){ .block = b, .layer = (int)(id % L), .u0 = 0, .n = BLOCK,
					       .stride = BLOCK, .slot = b * BLOCK,
					       .page = { .k = data[k], .v = (const char *)data[k] + x->half,
							 .dtype = KVMEM_DTYPE_BF16,
							 .mem = KVMEM_MEM_HOST } };
		}
		rc = x->b->ops->place(x->b->ctx, v, it, n);
		kvmem_pager_release(p, ids + i, n);
		if (rc < 0)
			goto out;
	}
	t = cli_now_s() - t0;
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

int ph_coldin(struct ctx *x)
{
	const int L = x->geo.cfg.n_layers;
	int64_t nb = (int64_t)(x->o.coldin / ((uint64_t)L * x->page_bytes)), np;
	char dir[4200], path[4300];
	kvmem_page_geom g;
	kvmem_pager_opts po;
	kvmem_view *v = NULL;
	kvmem_place_stats a, d;
	size_t stride;
	double made, seq[COLDIN_REPS], seqp[COLDIN_REPS], pin[COLDIN_REPS], bytes;
	int reg = 0, rc = -1;

	if (nb < 1)
		nb = 1;
	np = nb * L;
	snprintf(dir, sizeof(dir), "%s/coldin", x->o.dir);
	if (make_workspace(x, &x->geo, dir, nb * BLOCK, &made) < 0)
		return -1;
	geom_of(x, &x->geo, &g);
	stride = kvmem_page_stride(&g);
	bytes = (double)np * stride;
	kvmem_pager_opts_default(&po);
	po.host_cap = (uint64_t)np * stride + (64ull << 20);
	if (x->o.read_size)
		po.max_read = (uint32_t)x->o.read_size;
	if (x->o.queue_depth)
		po.queue_depth = (uint32_t)x->o.queue_depth;
	if (x->b->ops->view_create(x->b->ctx, &v) < 0 || x->b->ops->reserve(x->b->ctx, v, nb * BLOCK) < 0)
		goto out;
	snprintf(path, sizeof(path), "%s/pages", dir);
	printf("\ncold page-in, NVMe -> view slots: %" PRId64 " pages (%.2f GB, workspace written in "
	       "%.1f s) through the pager (O_DIRECT reads of up to %u KiB, %u entries, then the "
	       "backend's place), alternated %d times with O_DIRECT sequential reads of the same "
	       "file in 1 MiB requests 32 deep and in the pager's (a virtual disk's rate drifts "
	       "between runs; the ceiling is the better median)\n", np,
	       bytes / 1e9, made, po.max_read >> 10, po.queue_depth, COLDIN_REPS);
	place_now(x, &a);
	for (int r = 0; r < COLDIN_REPS; r++) {
		seq[r] = seq_read(path, (uint64_t)np * stride, 1u << 20, 32);
		seqp[r] = seq_read(path, (uint64_t)np * stride, po.max_read,
				   po.queue_depth < 64 ? (int)po.queue_depth : 64);
		if ((pin[r] = coldin_once(x, dir, np, v, &po, &reg)) < 0)
			goto out;
		printf("  pass %d: sequential read %.2f GB/s (1 MiB) / %.2f GB/s (the pager's requests), "
		       "page-in %.2f GB/s (host pool %s)\n", r + 1, seq[r] > 0 ? seq[r] / 1e9 : 0,
		       seqp[r] > 0 ? seqp[r] / 1e9 : 0, gbps(bytes, pin[r]),
		       reg ? "registered: the gather reads it" : "not registered: a staging copy");
	}
	place_delta(x, &a, &d);
	{
		double m1 = median(seq, COLDIN_REPS), m2 = median(seqp, COLDIN_REPS);
		double ms = m1 > m2 ? m1 : m2, mp = median(pin, COLDIN_REPS), all = 0;

		for (int r = 0; r < COLDIN_REPS; r++)
			all += pin[r];

		printf("  median page-in %.2f GB/s   best median sequential read %.2f GB/s   ratio %.2f\n"
		       "  (place() %.0f ms of the %.0f ms of %d passes, %" PRIu64 " calls)\n",
		       gbps(bytes, mp), ms > 0 ? ms / 1e9 : 0, ms > 0 ? bytes / mp / ms : 0,
		       d.ns / 1e6, all * 1e3, COLDIN_REPS, d.calls);
	}
	rc = 0;
out:
	if (v)
		x->b->ops->view_destroy(x->b->ctx, v);
	if (!x->o.keep)
		rm_rf(dir);
	return rc;
}

/* The view's own prefill and plain decode, once: the step's and decode's
 * peers. */
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
	printf("\npeers: prefilling %" PRId64 " tokens from scratch (chunks of 4096) %.3f s; plain "
	       "decode after them %.1f tokens/s\n", x->o.view, x->prefill_view_s,
	       x->plain_decode_tps);
	rc = 0;
out:
	free(logits);
	return rc;
}

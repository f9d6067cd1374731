// SPDX-License-Identifier: MIT
/*
 * kvmem bench step, phases stageout, memory and fits: prefill through a
 * session over a workspace, over host memory and plain; the device memory
 * held at each workspace size of --memory; the largest view a card of a
 * given size fits.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_step.h"

/* Prefill n tokens through a session over a new workspace in dir (NULL:
 * host memory); seconds of the appends (and of the commit, for a
 * workspace). The workspace's pages live in pool (shared, sized to hold
 * them: the appends never wait for the disk, the commit does). */
static int stage_run(struct ctx *x, const int32_t *ids, int64_t n, const char *dir,
		     kvmem_pager_pool *pool, double *t_app, double *t_commit, kvmem_session_stats *st,
		     kvmem_pager_stats *ps)
{
	kvmem_workspace_opts wo = { .block = BLOCK, .pool = pool,
				    .dtype = x->o.kv_dtype == KVMEM_DTYPE_FP8 ? KVMEM_DTYPE_FP8 :
										KVMEM_DTYPE_BF16 };
	kvmem_session_opts so;
	kvmem_workspace *w = NULL;
	kvmem_session *s = NULL;
	double t0;
	int rc = -1;

	*t_commit = 0;
	kvmem_session_opts_default(&so);
	so.block = BLOCK;
	so.budget = x->o.view;
	so.chunk = x->o.chunk;
	if (dir) {
		rm_rf(dir);
		if (kvmem_workspace_open(dir, &x->geo, &wo, &w) < 0)
			return -1;
		so.source = kvmem_workspace_source(w);
	}
	if (!(s = kvmem_session_create(x->b, &so)))
		goto out;
	t0 = cli_now_s();
	if (kvmem_session_append(s, ids, n, 0) < 0)
		goto out;
	*t_app = cli_now_s() - t0;
	kvmem_session_get_stats(s, st);
	memset(ps, 0, sizeof(*ps));
	if (w) {
		kvmem_pager_stats_get(kvmem_workspace_pager(w), ps);	/* before the commit */
		t0 = cli_now_s();
		if (kvmem_workspace_commit(w, s) < 0)
			goto out;
		*t_commit = cli_now_s() - t0;
	}
	rc = 0;
out:
	kvmem_session_free(s);
	if (w)
		kvmem_workspace_close(w);
	return rc;
}

/* Where a session's prefill spent what its forward passes did not take
 * (kvmem_session_stats), and the writer thread's share of index and
 * pages; first: the process's first session (the warm-up), which pinned
 * its rows' buffers anew. */
static void stage_split(const kvmem_session_stats *st, double total,
			const kvmem_session_stats *first)
{
	const double wait = (st->writer_wait_ns - st->last_wait_ns) / 1e9,
		     own = (st->own_ns - (st->writer_wait_ns - st->last_wait_ns) -
			    st->writer_start_ns) / 1e9;
	const double known = (st->forward_ns + st->store_ns + st->own_ns + st->begin_ns +
			      st->reserve_ns + st->last_wait_ns) / 1e9;

	printf("  split of the session over the workspace (%.3f s): forwards %.3f s (%" PRId64
	       " of %" PRId64 " wrote their pages into the pool themselves, %" PRId64 " made "
	       "their index summaries); before each "
	       "forward (view room, pages asked) %.3f s; the view reserved for the append %.3f s; "
	       "after each forward: waiting for the writer %.3f s, starting the writer %.3f s, "
	       "the hand-off %.3f s; rows in line %.3f s; the last job's wait %.3f s; not "
	       "accounted %.3f s\n", total, st->forward_ns / 1e9, st->page_forwards,
	       st->forwards, st->index_forwards, st->begin_ns / 1e9, st->reserve_ns / 1e9, wait,
	       st->writer_start_ns / 1e9, own, st->store_ns / 1e9, st->last_wait_ns / 1e9,
	       total - known);
	printf("  the writer thread's %.3f s: the index %.3f s, the pages (checksums, writes "
	       "queued) %.3f s; starting it in the process's first session (buffers pinned "
	       "anew) %.3f s\n", st->writer_ns / 1e9, st->writer_index_ns / 1e9,
	       st->writer_pages_ns / 1e9, first->writer_start_ns / 1e9);
}

int ph_stageout(struct ctx *x)
{
	const int64_t n = x->o.prefill;
	const double pages = (double)(n / BLOCK) * x->geo.cfg.n_layers * x->page_bytes;
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
	float *logits = malloc(sizeof(float) * x->geo.cfg.vocab);
	kvmem_view *v = NULL;
	kvmem_pager_pool *pool = NULL;
	void *pbase = NULL;
	size_t plen = 0;
	double t_pin = 0;
	int pinned = 0;
	kvmem_page_geom g;
	char dir[4200];
	double plain, mem, cold, warm, c_cold, commit, dummy, rows = 0, c_rows, hidx = 0, c_hidx;
	kvmem_session_stats s0, sm, sc, sw, sr, sh;
	kvmem_pager_stats pm, pc, pw, pr, ph;
	const char *pr_env = getenv("KVMEM_PAGE_ROWS");
	const int pages_on = !(pr_env && !strcmp(pr_env, "0"));
	int rc = -1;

	if (!ids || !logits) {
		kvmem_error(ENOMEM, "out of memory");
		goto out;
	}
	random_ids(ids, n, x->geo.cfg.vocab, x->o.seed + 99);
	snprintf(dir, sizeof(dir), "%s/stageout", x->o.dir);
	geom_of(x, &x->geo, &g);
	/* Room for every page of the prefill and the blocks a chunk keeps
	 * open: the pages are made in the pool and written from there. */
	if (kvmem_pager_pool_create(&g, (uint64_t)((n + 2 * x->o.chunk) / BLOCK + 2) *
				    x->geo.cfg.n_layers * kvmem_page_stride(&g), -1, &pool) < 0)
		goto out;
	/* Pinned on the backend once, as a server pins its shared pool: each
	 * session's own registration of it is then a count (cuda_page.c), and
	 * a GPU writes a chunk's pages straight into its slots (session.c's
	 * ask_pages; KVMEM_PAGE_ROWS=0 for the rows copied on the host). */
	kvmem_pager_pool_region(pool, &pbase, &plen);
	t_pin = cli_now_s();
	pinned = x->b->ops->host_register && pbase &&
		 x->b->ops->host_register(x->b->ctx, pbase, plen) == 0;
	t_pin = cli_now_s() - t_pin;
	if (x->b->ops->view_create(x->b->ctx, &v) < 0 ||
	    prefill_view(x, v, x->o.chunk, x->o.chunk, logits) < 0 ||	/* warm-up */
	    (plain = prefill_view(x, v, n, x->o.chunk, logits)) < 0)
		goto out;
	x->b->ops->view_destroy(x->b->ctx, v);
	v = NULL;
	/* Twice over a workspace: first into the fresh pool (its memory
	 * faulted in as pages arrive: the first prefill of a process), then
	 * into a new workspace on the same pool (a server's conversations, a
	 * session's later appends). */
	if (stage_run(x, ids, x->o.chunk, NULL, NULL, &dummy, &commit, &s0, &pm) < 0 ||	/* warm-up */
	    stage_run(x, ids, n, NULL, NULL, &mem, &commit, &sm, &pm) < 0 ||
	    stage_run(x, ids, n, dir, pool, &cold, &c_cold, &sc, &pc) < 0 ||
	    stage_run(x, ids, n, dir, pool, &warm, &commit, &sw, &pw) < 0)
		goto out;
	/* The peer in the same run: the same again with the rows copied into
	 * the pages on the host (round two's path), when the backend wrote
	 * them itself above. */
	if (pages_on && x->b->ops->page_rows) {
		setenv("KVMEM_PAGE_ROWS", "0", 1);
		rc = stage_run(x, ids, n, dir, pool, &rows, &c_rows, &sr, &pr);
		unsetenv("KVMEM_PAGE_ROWS");
		if (rc < 0)
			goto out;
		rc = -1;
	}
	/* And with the index summed on the host from raw K (KVMEM_DEVICE_INDEX
	 * =0), when the backend made it above. */
	if (x->b->ops->index_rows) {
		setenv("KVMEM_DEVICE_INDEX", "0", 1);
		rc = stage_run(x, ids, n, dir, pool, &hidx, &c_hidx, &sh, &ph);
		unsetenv("KVMEM_DEVICE_INDEX");
		if (rc < 0)
			goto out;
		rc = -1;
	}
	/* The figure is the session over the workspace against the plain
	 * forward pass: what a user waits for when a long tool output is
	 * appended, against the engine alone. */
	printf("\nstage-out under prefill: %" PRId64 " tokens in chunks of %d (%.2f GB of %s "
	       "pages, made in a host pool that holds them)\n  plain forward, no outputs      %.3f s\n"
	       "  session over host memory       %.3f s (+%.1f%% over plain: raw K/V and queries to "
	       "the host, the index)\n  session over the workspace, the pool's first use %.3f s "
	       "(then the commit %.3f s)\n  session over the workspace, the pool used before %.3f s "
	       "(+%.1f%% over plain, %+.1f%% over host memory: the store)\n  then the commit "
	       "(durable)     %.3f s (%.2f GB/s of pages from the first append)\n  plain / session "
	       "over the workspace: %.3f (%.3f with the commit); first use of the pool %.3f (%.3f)\n"
	       "  the session's forward passes took %.3f s of its %.3f s (rows in line %.3f s; "
	       "its own work after each forward %.3f s, waiting for the writer included; the "
	       "rest, before each forward and at the append's ends, %.3f s)\n",
	       n, x->o.chunk, pages / 1e9, x->o.kv_dtype == KVMEM_DTYPE_FP8 ? "fp8" : "bf16", plain,
	       mem, 100 * (mem / plain - 1), cold, c_cold, warm,
	       100 * (warm / plain - 1), 100 * (warm / mem - 1), commit, pages / (warm + commit) / 1e9,
	       plain / warm, plain / (warm + commit), plain / cold, plain / (cold + c_cold),
	       sw.forward_ns / 1e9, warm, sw.store_ns / 1e9, sw.own_ns / 1e9,
	       warm - (sw.forward_ns + sw.store_ns + sw.own_ns) / 1e9);
	stage_split(&sw, warm, &s0);
	printf("  writer thread: over host memory %.3f s busy, waited for %.3f s; over the "
	       "workspace %.3f s busy, waited for %.3f s (first use of the pool: %.3f s busy); "
	       "stage-out: %" PRIu64 " of %" PRId64 " blocks written by the end of the appends, "
	       "%" PRIu64 " appends waited %.3f s for room\n",
	       sm.writer_ns / 1e9, sm.writer_wait_ns / 1e9, sw.writer_ns / 1e9,
	       sw.writer_wait_ns / 1e9, sc.writer_ns / 1e9, pw.blocks_out, n / BLOCK,
	       pw.backpressure_waits, pw.backpressure_ns / 1e9);
	printf("  the pool (%.2f GB) %s on the backend once, before the runs: %.3f s; "
	       "pages %s\n", plen / 1e9, pinned ? "pinned" : "not pinned", t_pin,
	       !pages_on ? "made from rows on the host (KVMEM_PAGE_ROWS=0)" :
	       x->b->ops->page_rows ? "written by the backend into the pool (page_rows)" :
	       "made from rows on the host (the backend writes no pages)");
	if (rows > 0)
		printf("  peer: the same with pages made from rows on the host (KVMEM_PAGE_ROWS=0) "
		       "%.3f s, plain / it %.3f; writer thread %.3f s busy, waited for %.3f s "
		       "(with pages from the backend: %.3f s busy)\n", rows, plain / rows,
		       sr.writer_ns / 1e9, sr.writer_wait_ns / 1e9, sw.writer_ns / 1e9);
	if (hidx > 0) {
		printf("  peer: the same with the index summed on the host from raw K "
		       "(KVMEM_DEVICE_INDEX=0) %.3f s, plain / it %.3f; writer thread %.3f s busy "
		       "(the index %.3f s), waited for %.3f s (the last job %.3f s)\n", hidx,
		       plain / hidx, sh.writer_ns / 1e9, sh.writer_index_ns / 1e9,
		       sh.writer_wait_ns / 1e9, sh.last_wait_ns / 1e9);
		stage_split(&sh, hidx, &s0);
	}
	rc = 0;
out:
	if (v)
		x->b->ops->view_destroy(x->b->ctx, v);
	if (pinned)
		x->b->ops->host_unregister(x->b->ctx, pbase);
	if (kvmem_pager_pool_free(pool) < 0)
		rc = -1;
	if (!x->o.keep)
		rm_rf(dir);
	free(ids);
	free(logits);
	return rc;
}

int ph_memory(struct ctx *x)
{
	kvmem_model m = x->geo;
	kvmem_backend *b = NULL, *saved = x->b;
	char dir[4200], buf[64];
	uint64_t used[MAX_LIST] = { 0 };
	/* The index's device copy: 64 MiB unless asked (--index-mem). */
	const uint64_t index_mem = x->o.index_mem ? x->o.index_mem : 64ull << 20;
	int rc = -1;

	m.cfg.n_layers = x->o.mem_layers;
	snprintf(m.dir, sizeof(m.dir), "%.64s, %d layers", x->geo.dir, x->o.mem_layers);
	if (kvmem_backend_open(x->b->ops->name, &m,
			       &(kvmem_backend_opts){ .max_chunk = 4096, .mem_cap = x->o.gpu_mem,
						      .page_pool = 2ull << 30,
						      .index_mem = index_mem }, &b) < 0)
		return -1;
	x->b = b;
	snprintf(dir, sizeof(dir), "%s/memory", x->o.dir);
	printf("\ndevice memory against the workspace (%d layers of the same width, view %" PRId64
	       " tokens, device page pool 2 GiB, the index's device copy at most %s):\n",
	       m.cfg.n_layers, x->o.view,
	       cli_fmt_bytes(buf, sizeof(buf), (double)index_mem));
	for (int i = 0; i < x->o.n_memory; i++) {
		int64_t tok = x->o.memory[i] / BLOCK * BLOCK;
		uint64_t pages = (uint64_t)(tok / BLOCK) * m.cfg.n_layers * x->page_bytes;
		struct step_result r;
		double made;

		if (make_workspace(x, &m, dir, tok, &made) < 0 ||
		    run_tier(x, &m, dir, tok, 1ull << 30, 1, 0, 1, &r) < 0)
			goto out;
		used[i] = r.mem_used;
		printf("  %9" PRId64 " tokens (%.1f GB of pages, written in %.0f s): device %s; "
		       "index %.3f GB on the host, %.3f GB on the device; selection (scoring %s, "
		       "and the plan) %.1f ms; a step %.1f ms (host pool 1 GiB: entering pages from "
		       "NVMe)\n", tok, pages / 1e9, made,
		       cli_fmt_bytes(buf, sizeof(buf), (double)used[i]), r.index_host / 1e9,
		       r.index_dev / 1e9, scored_where(&r), r.select_only_s * 1e3, r.step_s[0] * 1e3);
		fflush(stdout);
		if (!x->o.keep)
			rm_rf(dir);
	}
	if (x->o.n_memory > 1 && used[0])
		printf("  growth %" PRId64 " -> %" PRId64 " tokens: %+.2f%%\n", x->o.memory[0],
		       x->o.memory[x->o.n_memory - 1],
		       100.0 * ((double)used[x->o.n_memory - 1] / used[0] - 1));
	rc = 0;
out:
	x->b = saved;
	kvmem_backend_close(b);
	return rc;
}

/* The largest view a backend with chunks of 512 can reserve under the
 * cap: what fits on a card of that size. */
int ph_fits(struct ctx *x)
{
	kvmem_backend *b = NULL;
	kvmem_view *v = NULL;
	int64_t lo = 0, hi = 1 << 22;
	char buf[3][64];
	int rc = -1;

	if (!x->o.gpu_mem)
		return kvmem_error(EINVAL, "the fits phase needs --gpu-mem");
	if (kvmem_backend_open(x->b->ops->name, &x->geo,
			       &(kvmem_backend_opts){ .max_chunk = 512, .mem_cap = x->o.gpu_mem,
						      .kv_dtype = x->o.kv_dtype == KVMEM_DTYPE_FP8 ?
								  KVMEM_DTYPE_FP8 : 0 }, &b) < 0)
		return -1;
	/* Binary search in steps of 1024 slots; a refused reserve takes
	 * nothing. */
	while (hi - lo > 1024) {
		int64_t mid = (lo + hi) / 2 / 1024 * 1024;

		if (b->ops->view_create(b->ctx, &v) < 0)
			goto out;
		if (b->ops->reserve(b->ctx, v, mid) == 0)
			lo = mid;
		else
			hi = mid;
		b->ops->view_destroy(b->ctx, v);
		v = NULL;
	}
	printf("\nunder a cap of %s (chunks of 512): the backend holds %s (weights and the "
	       "forward pass's scratch); a view of up to %" PRId64 " slots fits (%s), i.e. a "
	       "budget of about %" PRId64 " tokens with the default reserve of budget/8; the "
	       "device page pool takes half of what the cap then leaves\n",
	       cli_fmt_bytes(buf[0], sizeof(buf[0]), (double)x->o.gpu_mem),
	       cli_fmt_bytes(buf[1], sizeof(buf[1]), (double)(b->ops->mem_used ?
							      b->ops->mem_used(b->ctx) : 0)),
	       lo, cli_fmt_bytes(buf[2], sizeof(buf[2]), (double)lo * x->geo.cfg.n_layers *
			 x->page_bytes / BLOCK), lo * 8 / 9 / 1024 * 1024);
	x->fits_slots = lo;
	rc = 0;
out:
	kvmem_backend_close(b);
	return rc;
}

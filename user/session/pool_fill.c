// SPDX-License-Identifier: MIT
/*
 * The device page pool filled ahead of the steps that will read it.
 *
 * An agent's step enters the pages of blocks anywhere in the history: at
 * Qwen3-8B a new subject enters about 1400 blocks of a 64K view (6.6 GB),
 * 120 ms over PCIe at 55 GB/s, but 2-3 ms from device memory. A backend
 * with a page pool (pool_fill) keeps the pages placed into a view; this
 * gives it the rest, best first: after a session's first view is laid out
 * (adopt), the blocks outside the view in the order of that selection's
 * scores, as far as the pool's free slots go. Only pages already in host
 * memory that never change again (the source's resident op) are taken:
 * nothing is read from NVMe for it, and a block still filling is never
 * kept. Nothing is evicted for them (pool_fill takes free slots only).
 *
 * It changes where a page is read from, never its bits: the pool holds
 * the page's own bf16 bytes (on cuda with KVMEM_CUDA_FP8_POOL=1, an fp8
 * page's bytes and scales), and a place() reads them as it would read the
 * page (test_ws_session's pool_fill_equal, on a backend with a pool).
 * KVMEM_POOL_FILL=0 turns it off (a measurement's peer).
 */
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "session/session_int.h"

/* Pages got, copied and put at a time (128 MiB of Qwen3-8B pages). */
#define FILL_BATCH 1024

struct ranked {
	float score;
	int64_t block;
};

static int by_score(const void *a, const void *b)
{
	const struct ranked *x = a, *y = b;

	if (x->score != y->score)
		return x->score > y->score ? -1 : 1;
	return x->block < y->block ? -1 : x->block > y->block;
}

/* Put the batch's pages back. */
static void put_all(kvmem_session *s, const kvmem_place *it, int n)
{
	for (int i = 0; i < n; i++)
		s->src->ops->put(s->src->ctx, it[i].block, it[i].layer);
}

int ws_pool_fill(kvmem_session *s)
{
	const int64_t nb = kvmem_blocks_count(&s->blocks), B = s->blocks.block;
	const int64_t full = s->sel_tokens / B;	/* blocks whole at the selection */
	const kvmem_plan *p = &s->plan;
	const char *env = getenv("KVMEM_POOL_FILL");
	struct ranked *r = NULL;
	kvmem_place *items = NULL;
	uint8_t *in = NULL;
	int64_t m = 0;
	int n = 0, rc = 0, full_pool = 0;

	if ((env && env[0] == '0') || !s->be->ops->pool_fill || !s->reg_base ||
	    !s->src->ops->resident || !s->scores || nb <= 0 || nb > INT32_MAX)
		return 0;
	r = malloc((size_t)nb * sizeof(*r));
	in = calloc((size_t)nb, 1);
	items = malloc(FILL_BATCH * sizeof(*items));
	if (!r || !in || !items) {
		rc = kvmem_error(ENOMEM, "session: out of memory ranking %lld blocks for the device "
				 "page pool", (long long)nb);
		goto out;
	}
	/* The view's blocks are in the pool already (their place() kept
	 * them); the rest by their best score over the sets. */
	for (int set = 0; set < p->n_sets; set++)
		for (int i = 0; i < p->n_view; i++)
			if (p->blocks[(size_t)set * p->n_view + i] < nb)
				in[p->blocks[(size_t)set * p->n_view + i]] = 1;
	for (int64_t b = 0; b < nb && b < full; b++) {
		float best = s->scores[b];

		if (in[b])
			continue;
		for (int set = 1; set < s->n_sets; set++)
			if (s->scores[(size_t)set * nb + b] > best)
				best = s->scores[(size_t)set * nb + b];
		r[m++] = (struct ranked){ .score = best, .block = b };
	}
	qsort(r, (size_t)m, sizeof(*r), by_score);
	for (int64_t i = 0; i < m && !full_pool; i++)
		for (int l = 0; l < s->cfg.n_layers && !full_pool; l++) {
			const int64_t b = r[i].block;
			kvmem_page pg;

			if (s->be->ops->page_cached &&
			    s->be->ops->page_cached(s->be->ctx, s->reg_base, s->owner, b, l, NULL) == 1)
				continue;
			if (s->src->ops->resident(s->src->ctx, b, l) != 1)
				continue;
			if (s->src->ops->get(s->src->ctx, b, l, &pg))
				continue;	/* only ahead of use: a page it cannot get is left */
			items[n] = (kvmem_place){ .block = b, .owner = s->owner, .layer = l, .u0 = 0,
						  .n = (int)B, .stride = (int)B, .slot = 0, .page = pg };
			if (++n < FILL_BATCH)
				continue;
			rc = s->be->ops->pool_fill(s->be->ctx, items, n);
			put_all(s, items, n);
			if (rc < 0)
				goto out;
			full_pool = rc < n;
			n = 0;
		}
	if (n) {
		rc = s->be->ops->pool_fill(s->be->ctx, items, n);
		put_all(s, items, n);
	}
out:
	free(r);
	free(in);
	free(items);
	return rc < 0 ? kvmem_error_prefix("session: filling the device page pool") : 0;
}

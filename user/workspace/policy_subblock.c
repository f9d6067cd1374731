// SPDX-License-Identifier: MIT
/*
 * subblock: Mean-K at a quarter-block grain, against dilution. A block whose
 * relevant keys fill a quarter of it has that signal averaged away in its
 * Mean-K; with four means its estimated mass is the sum of its sub-blocks'
 *   n_s exp(s q.mu_s),
 * a tighter Jensen bound of the real mass. Queries and the combination over
 * KV heads and layers are as in meank; one block set for all layers.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "workspace/score.h"

struct sub_arg {
	const kvmem_select_ctx *c;
	const float *q;		/* [L * H][D] group queries */
	float scale, full;
};

/* Pair p = layer * H + KV head; item i = sub-block i % 4 of block i / 4. */
static void sub_logits(const void *arg, int p, int64_t i0, int64_t i1, float *z)
{
	const struct sub_arg *a = arg;
	const kvmem_select_ctx *c = a->c;
	const int d = c->head_dim;

	ws_dots(z, a->q + (size_t)p * d, kvmem_index_sub(c->index, p / c->n_kv_heads,
						       p % c->n_kv_heads, 0, 0) + (size_t)i0 * d,
		i1 - i0, d);
	for (int64_t i = i0; i < i1; i++) {
		int64_t b = i / KVMEM_SUBBLOCKS;
		float w = b == c->n_blocks - 1 ?
			ws_log_len(kvmem_index_sub_len(c->index, b, (int)(i % KVMEM_SUBBLOCKS))) : a->full;

		/* A sub-block not yet begun has no mean: no weight. */
		z[i - i0] = w == -INFINITY ? -INFINITY : z[i - i0] * a->scale + w;
	}
}

static int subblock_score(const kvmem_select_ctx *c, float *scores)
{
	const int pairs = c->n_layers * c->n_kv_heads;
	struct sub_arg a = { .c = c, .scale = ws_scale(c),
			     .full = logf((float)c->index->sub_len) };
	float *q;
	int rc;

	if (!(c->index->sums & KVMEM_SUM_SUBBLOCK))
		return kvmem_error(EINVAL, "subblock: the index keeps no sub-block means");
	q = malloc(sizeof(float) * pairs * c->head_dim);
	if (!q)
		return kvmem_error(ENOMEM, "subblock: out of memory");
	for (int p = 0; p < pairs; p++)
		ws_group_query(c, p / c->n_kv_heads, p % c->n_kv_heads, q + (size_t)p * c->head_dim);
	a.q = q;
	memset(scores, 0, sizeof(float) * c->n_blocks);
	rc = ws_mass(scores, c->n_blocks * KVMEM_SUBBLOCKS, KVMEM_SUBBLOCKS, pairs, NULL, sub_logits, &a);
	free(q);
	return rc;
}

const kvmem_policy_ops kvmem_policy_subblock = {
	.name = "subblock",
	.what = "Mean-K of each quarter block, summed masses (against dilution)",
	.needs = KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK,
	.per_layer = 0,
	.score = subblock_score,
};

// SPDX-License-Identifier: MIT
/*
 * meank (default): score = query . Mean-K per KV head.
 *
 * For each (layer l, KV head g) the query is the mean of the raw queries of
 * g's query heads over the step's last tokens: logits are linear in q, so
 * the mean of the per-head, per-token logits q.mu equals the logit of the
 * mean query, and scoring costs one dot per (block, layer, KV head). Each
 * block then gets its estimated share of that head's attention,
 *   n_b exp(s q.mu_b) / sum_c n_c exp(s q.mu_c)   (s = 1/sqrt(head_dim)),
 * (n_b exp(s q.mu_b) is the Jensen lower bound of the block's true
 * unnormalised mass) and shares add up over KV heads and layers: one block
 * set for all layers.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "workspace/score.h"

struct meank_arg {
	const kvmem_select_ctx *c;
	const float *q;		/* [L * H][D] group queries */
	float scale, full, last;	/* last: log length of the newest block */
};

/* Pair p = layer * H + KV head: z = s q.mu + log n over blocks i0..i1-1. */
static void meank_logits(const void *arg, int p, int64_t i0, int64_t i1, float *z)
{
	const struct meank_arg *a = arg;
	const kvmem_select_ctx *c = a->c;
	const int d = c->head_dim;

	ws_dots(z, a->q + (size_t)p * d, kvmem_index_meank(c->index, p / c->n_kv_heads,
							 p % c->n_kv_heads, i0), i1 - i0, d);
	for (int64_t i = i0; i < i1; i++)
		z[i - i0] = z[i - i0] * a->scale + (i == c->n_blocks - 1 ? a->last : a->full);
}

static int meank_score(const kvmem_select_ctx *c, float *scores)
{
	const int pairs = c->n_layers * c->n_kv_heads;
	struct meank_arg a = {
		.c = c, .scale = ws_scale(c), .full = logf((float)c->block),
		.last = ws_log_len(kvmem_index_block_len(c->index, c->n_blocks - 1)),
	};
	float *q = malloc(sizeof(float) * pairs * c->head_dim);
	int rc;

	if (!q)
		return kvmem_error(ENOMEM, "meank: out of memory");
	for (int p = 0; p < pairs; p++)
		ws_group_query(c, p / c->n_kv_heads, p % c->n_kv_heads, q + (size_t)p * c->head_dim);
	a.q = q;
	memset(scores, 0, sizeof(float) * c->n_blocks);
	rc = ws_mass(scores, c->n_blocks, 1, pairs, NULL, meank_logits, &a);
	free(q);
	return rc;
}

const kvmem_policy_ops kvmem_policy_meank = {
	.name = "meank",
	.what = "query . Mean-K per KV head, estimated attention mass over heads and layers (default)",
	.needs = KVMEM_SUM_MEANK,
	.per_layer = 0,
	.score = meank_score,
};

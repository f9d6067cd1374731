// SPDX-License-Identifier: MIT
/*
 * quest: an upper bound of the attention logit from per-dimension min/max of
 * raw K (after Quest, Tang et al. 2024). For a query q and a block whose keys
 * lie in the box [min, max], q.k <= sum_d max(q_d min_d, q_d max_d).
 *
 * The bound is not linear in q, so it is taken per query head and per query
 * token (not for the group mean); each (head, token) turns its bounds into
 * estimated masses n_b exp(s u_b) / sum, and these add up over heads and
 * tokens within a layer: one block set per layer.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "workspace/score.h"

static float bound(const float *q, const float *lo, const float *hi, int d)
{
	float u = 0;

	for (int i = 0; i < d; i++) {
		float a = q[i] * lo[i], b = q[i] * hi[i];

		u += a > b ? a : b;
	}
	return u;
}

struct quest_arg {
	const kvmem_select_ctx *c;
	float scale, full, last;
};

/* Pair p = (layer * n_heads + head) * n_q + token. */
static void quest_logits(const void *arg, int p, int64_t i0, int64_t i1, float *z)
{
	const struct quest_arg *a = arg;
	const kvmem_select_ctx *c = a->c;
	const int d = c->head_dim, t = p % c->n_q, h = p / c->n_q % c->n_heads;
	const int l = p / c->n_q / c->n_heads, g = h / (c->n_heads / c->n_kv_heads);
	const float *q = c->q + (((size_t)l * c->n_q + t) * c->n_heads + h) * d;
	const float *lo = kvmem_index_min(c->index, l, g, 0), *hi = kvmem_index_max(c->index, l, g, 0);

	for (int64_t b = i0; b < i1; b++)
		z[b - i0] = bound(q, lo + (size_t)b * d, hi + (size_t)b * d, d) * a->scale +
			    (b == c->n_blocks - 1 ? a->last : a->full);
}

static int quest_score(const kvmem_select_ctx *c, float *scores)
{
	const int pairs = c->n_layers * c->n_heads * c->n_q;
	struct quest_arg a = {
		.c = c, .scale = ws_scale(c), .full = logf((float)c->block),
		.last = ws_log_len(kvmem_index_block_len(c->index, c->n_blocks - 1)),
	};
	int *row;
	int rc;

	if (!(c->index->sums & KVMEM_SUM_MINMAX))
		return kvmem_error(EINVAL, "quest: the index keeps no per-dimension min/max");
	row = malloc(sizeof(int) * (pairs ? pairs : 1));
	if (!row)
		return kvmem_error(ENOMEM, "quest: out of memory");
	for (int p = 0; p < pairs; p++)
		row[p] = p / c->n_q / c->n_heads;
	memset(scores, 0, sizeof(float) * c->n_layers * c->n_blocks);
	rc = ws_mass(scores, c->n_blocks, 1, pairs, row, quest_logits, &a);
	free(row);
	return rc;
}

const kvmem_policy_ops kvmem_policy_quest = {
	.name = "quest",
	.what = "upper bound of q.k from per-dimension min/max, one block set per layer",
	.needs = KVMEM_SUM_MEANK | KVMEM_SUM_MINMAX,
	.per_layer = 1,
	.score = quest_score,
};

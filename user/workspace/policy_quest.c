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

static int quest_score(const kvm_select_ctx *c, float *scores)
{
	const kvm_index *ix = c->index;
	const int64_t n = c->n_blocks;
	const int d = c->head_dim, group = c->n_heads / c->n_kv_heads;
	const float s = ws_scale(c), full = logf((float)c->block);
	float *z;

	if (!(ix->sums & KVM_SUM_MINMAX))
		return kvm_error("quest: the index keeps no per-dimension min/max");
	z = malloc((size_t)(n ? n : 1) * sizeof(float));
	if (!z)
		return kvm_error("quest: out of memory for %lld blocks", (long long)n);
	for (int64_t i = 0; i < n * c->n_layers; i++)
		scores[i] = 0;
	for (int l = 0; l < c->n_layers; l++)
		for (int h = 0; h < c->n_heads; h++)
			for (int t = 0; t < c->n_q; t++) {
				const float *q = c->q + (((size_t)l * c->n_q + t) * c->n_heads + h) * d;
				const int g = h / group;
				const float *lo = kvm_index_min(ix, l, g, 0);
				const float *hi = kvm_index_max(ix, l, g, 0);

#pragma omp parallel for schedule(static) if (n > 4096)
				for (int64_t b = 0; b < n; b++)
					z[b] = bound(q, lo + (size_t)b * d, hi + (size_t)b * d, d) * s +
					       (b == n - 1 ? ws_log_len(kvm_index_block_len(ix, b)) : full);
				ws_add_mass(scores + (size_t)l * n, z, n, 1);
			}
	free(z);
	return 0;
}

const kvm_policy_ops kvm_policy_quest = {
	.name = "quest",
	.what = "upper bound of q.k from per-dimension min/max, one block set per layer",
	.needs = KVM_SUM_MEANK | KVM_SUM_MINMAX,
	.per_layer = 1,
	.score = quest_score,
};

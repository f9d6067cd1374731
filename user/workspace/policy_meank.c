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

#include "kvmem/kvmem.h"
#include "workspace/score.h"

static int meank_score(const kvm_select_ctx *c, float *scores)
{
	const kvm_index *ix = c->index;
	const int64_t n = c->n_blocks;
	const float s = ws_scale(c);
	float *z = malloc((size_t)(n ? n : 1) * sizeof(float));
	float *q = malloc((size_t)c->head_dim * sizeof(float));

	if (!z || !q) {
		free(z);
		free(q);
		return kvm_error("meank: out of memory for %lld blocks", (long long)n);
	}
	for (int64_t b = 0; b < n; b++)
		scores[b] = 0;
	for (int l = 0; l < c->n_layers; l++)
		for (int g = 0; g < c->n_kv_heads; g++) {
			ws_group_query(c, l, g, q);
			ws_dots(z, q, kvm_index_meank(ix, l, g, 0), n, c->head_dim);
			for (int64_t b = 0; b < n; b++)
				z[b] = z[b] * s + (b == n - 1 ? ws_log_len(kvm_index_block_len(ix, b))
							     : logf((float)c->block));
			ws_add_mass(scores, z, n, 1);
		}
	free(z);
	free(q);
	return 0;
}

const kvm_policy_ops kvm_policy_meank = {
	.name = "meank",
	.what = "query . Mean-K per KV head, estimated attention mass over heads and layers (default)",
	.needs = KVM_SUM_MEANK,
	.per_layer = 0,
	.score = meank_score,
};

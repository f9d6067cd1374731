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

#include "kvmem/kvmem.h"
#include "workspace/score.h"

static int subblock_score(const kvm_select_ctx *c, float *scores)
{
	const kvm_index *ix = c->index;
	const int64_t n = c->n_blocks, items = n * KVM_SUBBLOCKS;
	const float s = ws_scale(c), full = logf((float)ix->sub_len);
	float *z = malloc((size_t)(items ? items : 1) * sizeof(float));
	float *q = malloc((size_t)c->head_dim * sizeof(float));

	if (!z || !q) {
		free(z);
		free(q);
		return kvm_error("subblock: out of memory for %lld blocks", (long long)n);
	}
	if (!(ix->sums & KVM_SUM_SUBBLOCK)) {
		free(z);
		free(q);
		return kvm_error("subblock: the index keeps no sub-block means");
	}
	for (int64_t b = 0; b < n; b++)
		scores[b] = 0;
	for (int l = 0; l < c->n_layers; l++)
		for (int g = 0; g < c->n_kv_heads; g++) {
			ws_group_query(c, l, g, q);
			ws_dots(z, q, kvm_index_sub(ix, l, g, 0, 0), items, c->head_dim);
			for (int64_t i = 0; i < items; i++) {
				int64_t b = i / KVM_SUBBLOCKS;

				float w = b == n - 1 ? ws_log_len(kvm_index_sub_len(ix, b,
						(int)(i % KVM_SUBBLOCKS))) : full;

				/* A sub-block not yet begun has no mean: no weight. */
				z[i] = w == -INFINITY ? -INFINITY : z[i] * s + w;
			}
			ws_add_mass(scores, z, items, KVM_SUBBLOCKS);
		}
	free(z);
	free(q);
	return 0;
}

const kvm_policy_ops kvm_policy_subblock = {
	.name = "subblock",
	.what = "Mean-K of each quarter block, summed masses (against dilution)",
	.needs = KVM_SUM_MEANK | KVM_SUM_SUBBLOCK,
	.per_layer = 0,
	.score = subblock_score,
};

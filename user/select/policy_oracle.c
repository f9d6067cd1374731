// SPDX-License-Identifier: MIT
/*
 * oracle: every key scored on its own, no summary. For every layer, query
 * head and query token, the query (distance-averaged like every shipped
 * policy: kvmem_rope_mean) against every earlier key of the history, a softmax
 * over all of them, the probabilities summed per block; masses add up over
 * heads, tokens and layers: one block set for all layers.
 *
 * It reads every K page of every layer, a full attention pass over the
 * history per selection: a reference for what the summaries lose, for
 * evaluation only. (Scoring at the keys' true workspace positions would be
 * no reference at all: past the model's trained window those rotations
 * mean nothing to it.)
 */
#include <stdlib.h>

#include "kvmem/kvmem.h"
#include "select/score.h"

static int oracle_score(const kvmem_select_ctx *c, float *scores)
{
	int64_t *all = malloc(sizeof(int64_t) * (c->n_blocks ? c->n_blocks : 1));
	double *mass = calloc(c->n_blocks ? c->n_blocks : 1, sizeof(double));
	int rc = 0;

	if (!all || !mass) {
		rc = kvmem_error(ENOMEM, "oracle: out of memory for %lld blocks", (long long)c->n_blocks);
		goto out;
	}
	for (int64_t b = 0; b < c->n_blocks; b++)
		all[b] = b;
	if (ws_token_mass(c, all, c->n_blocks, mass)) {
		rc = kvmem_error_prefix("oracle");
		goto out;
	}
	for (int64_t b = 0; b < c->n_blocks; b++)
		scores[b] = (float)mass[b];
out:
	free(all);
	free(mass);
	return rc;
}

const kvmem_policy_ops kvmem_policy_oracle = {
	.name = "oracle",
	.what = "every key scored on its own from the real K pages (evaluation only: reads every page)",
	.needs = KVMEM_SUM_MEANK | KVMEM_NEED_KEYS,
	.per_layer = 0,
	.score = oracle_score,
};

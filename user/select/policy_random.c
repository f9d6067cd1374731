// SPDX-License-Identifier: MIT
/*
 * random: a control. Every block draws a uniform score from a generator
 * seeded by the session seed and the selection count, so a run repeats
 * exactly for a seed and each selection draws afresh.
 */
#include "select/score.h"

static int random_score(const kvmem_select_ctx *c, float *scores)
{
	uint64_t rng = kvmem_rng_seed(c->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(c->step + 1)));

	for (int64_t b = 0; b < c->n_blocks; b++)
		scores[b] = (float)kvmem_rng_uniform(&rng);
	return 0;
}

const kvmem_policy_ops kvmem_policy_random = {
	.name = "random",
	.what = "uniformly random blocks (a control)",
	.needs = KVMEM_SUM_MEANK,
	.per_layer = 0,
	.score = random_score,
};

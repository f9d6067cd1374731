// SPDX-License-Identifier: MIT
/*
 * recency: a sliding window. The later the block, the higher its score, so
 * the planner fills the budget left after sink, pins and recent with the
 * newest blocks: StreamingLLM's sink + window, with pins kept.
 */
#include "select/score.h"

static int recency_score(const kvmem_select_ctx *c, float *scores)
{
	for (int64_t b = 0; b < c->n_blocks; b++)
		scores[b] = (float)b;
	return 0;
}

const kvmem_policy_ops kvmem_policy_recency = {
	.name = "recency",
	.what = "sliding window: the newest blocks (with sink and pins)",
	.needs = KVMEM_SUM_MEANK,
	.per_layer = 0,
	.score = recency_score,
};

// SPDX-License-Identifier: MIT
/*
 * subblock_neighbour: subblock's ranking (Mean-K of each quarter block,
 * the masses summed), each of its top budget / B blocks bringing the block
 * before it and the block after it right behind it, as meank_neighbour
 * does for meank's (policy_meank_neighbour.c says why: a fact line cut by
 * a block boundary is in view only when all its blocks are). No page
 * read: subblock's summaries and cost.
 */
#include "kvmem/kvmem.h"
#include "select/score.h"

extern const kvmem_policy_ops kvmem_policy_subblock;

static int subblock_neighbour_score(const kvmem_select_ctx *c, float *scores)
{
	return ws_score_with_neighbours(&kvmem_policy_subblock, c, scores, 1, "subblock_neighbour");
}

const kvmem_policy_ops kvmem_policy_subblock_neighbour = {
	.name = "subblock_neighbour",
	.what = "subblock, and each block it ranks into the budget brings its two neighbours (no page read)",
	.needs = KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK,
	.per_layer = 0,
	.score = subblock_neighbour_score,
};

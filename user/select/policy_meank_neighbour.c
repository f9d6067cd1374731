// SPDX-License-Identifier: MIT
/*
 * meank_neighbour: meank's ranking, each of the top budget / B blocks
 * bringing the block before it and the block after it right behind it
 * (ws_expand_neighbours), as neighbour does for refine's and lexical for
 * BM25's; those in the top already too, as lexical (a budget that holds
 * most of the history would otherwise push a raised block's neighbour out).
 *
 * Why: a fact line is 10-30 tokens, so a block boundary cuts most lines at
 * 16-token blocks (40 of 63 needle lines of a training corpus, recall.md),
 * and a line is in view only when all its blocks are. Mean-K ranks the block
 * that holds the line's key words; the other block's mean is the
 * neighbouring lines' as much as this one's, and ranks far lower. Bringing
 * the neighbours costs budget (the top third of the ranking fills it) and
 * reads no page: the same summaries as meank, the same time.
 */
#include "kvmem/kvmem.h"
#include "select/score.h"

extern const kvmem_policy_ops kvmem_policy_meank;

static int meank_neighbour_score(const kvmem_select_ctx *c, float *scores)
{
	return ws_score_with_neighbours(&kvmem_policy_meank, c, scores, 1, "meank_neighbour");
}

const kvmem_policy_ops kvmem_policy_meank_neighbour = {
	.name = "meank_neighbour",
	.what = "meank, and each block it ranks into the budget brings its two neighbours (no page read)",
	.needs = KVMEM_SUM_MEANK,
	.per_layer = 0,
	.score = meank_neighbour_score,
};

// SPDX-License-Identifier: MIT
/*
 * neighbour: refine's ranking, and every block it ranks into the budget
 * brings the blocks on either side of it.
 *
 * A fact is one line of 8-10 tokens; a block boundary may cut it, and a
 * view holding half of it is often useless (Documentation/recall.md: the
 * value's block ranks first, the key's does not; the line's newline sits in
 * the next block). Keeping the tokens around the important ones is what
 * SnapKV's pooling does at token grain (Li et al. 2024, "SnapKV: LLM Knows
 * What You are Looking for Before Generation": the attention votes are
 * pooled over a small window before the top tokens are kept, so the
 * neighbours of a selected token stay with it); here at block grain: each
 * of the top budget / B blocks by refine's scores has its predecessor and
 * its successor ranked right after it (unless they rank higher already),
 * so the budget holds fewer places, each with its context.
 *
 * Only where a line crosses the boundary would do, if the policy could see
 * lines: it sees keys and summaries, not tokens. A test on the quarter-
 * block means (bring the predecessor when the first quarter holds most of
 * the block's estimated mass, the successor for the last) was measured
 * with the lab and brought fewer needles into view than bringing both
 * always (recall.md, "Levers"): the look-alike lines around a needle
 * spread the mass over the block.
 */
#include "kvmem/kvmem.h"
#include "select/score.h"

extern const kvmem_policy_ops kvmem_policy_refine;

static int neighbour_score(const kvmem_select_ctx *c, float *scores)
{
	return ws_score_with_neighbours(&kvmem_policy_refine, c, scores, 0, "neighbour");
}

const kvmem_policy_ops kvmem_policy_neighbour = {
	.name = "neighbour",
	.what = "refine, and each block it ranks into the budget brings its two neighbours (after SnapKV's pooling)",
	.needs = KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK | KVMEM_NEED_KEYS,
	.per_layer = 0,
	.score = neighbour_score,
};

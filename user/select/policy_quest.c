// SPDX-License-Identifier: MIT
/*
 * quest: an upper bound of the attention logit from per-dimension min/max of
 * raw K (after Quest, Tang et al. 2024). For a query q and a block whose keys
 * lie in the box [min, max], q.k <= sum_d max(q_d min_d, q_d max_d).
 *
 * The bound is not linear in q, so it is taken per query head and per query
 * token (not for the group mean); each (head, token) turns its bounds into
 * estimated masses n_b exp(s u_b) / sum, and these add up over heads and
 * tokens within a layer: one block set per layer (kvmem_score_quest in
 * kernels/cpu/score.c).
 */
#include "kvmem/kvmem.h"
#include "select/score.h"

static int quest_score(const kvmem_select_ctx *c, float *scores)
{
	kvmem_score_geom g;

	if (!(c->index->sums & KVMEM_SUM_MINMAX))
		return kvmem_error(EINVAL, "quest: the index keeps no per-dimension min/max");
	ws_score_geom(c, &g);
	return kvmem_score_quest(scores, c->index->kmin, c->index->kmax, c->q, c->n_q, &g);
}

const kvmem_policy_ops kvmem_policy_quest = {
	.name = "quest",
	.what = "upper bound of q.k from per-dimension min/max, one block set per layer",
	.needs = KVMEM_SUM_MEANK | KVMEM_SUM_MINMAX,
	.per_layer = 1,
	.score = quest_score,
};

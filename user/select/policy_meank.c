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
 * set for all layers. The arithmetic is kvmem_score_meank (kernels/cpu/
 * score.c, the twin of the GPU scorer), on the backend's device when the
 * session has one (ws_device_score).
 */
#include <errno.h>
#include <stdlib.h>

#include "kvmem/kvmem.h"
#include "select/score.h"

static int meank_score(const kvmem_select_ctx *c, float *scores)
{
	kvmem_score_geom g;
	float *gq = ws_group_queries(c);
	int rc;

	if (!gq)
		return kvmem_error_prefix("meank");
	ws_score_geom(c, &g);
	rc = ws_device_score(c, "meank", gq, &g, scores);
	if (rc == -ENOTSUP)
		rc = kvmem_score_meank(scores, c->index->meank, gq, &g);
	free(gq);
	return rc;
}

const kvmem_policy_ops kvmem_policy_meank = {
	.name = "meank",
	.what = "query . Mean-K per KV head, estimated attention mass over heads and layers (default)",
	.needs = KVMEM_SUM_MEANK,
	.per_layer = 0,
	.score = meank_score,
};

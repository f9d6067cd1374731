// SPDX-License-Identifier: MIT
/*
 * subblock: Mean-K at a quarter-block grain, against dilution. A block whose
 * relevant keys fill a quarter of it has that signal averaged away in its
 * Mean-K; with four means its estimated mass is the sum of its sub-blocks'
 *   n_s exp(s q.mu_s),
 * a tighter Jensen bound of the real mass. Queries and the combination over
 * KV heads and layers are as in meank; one block set for all layers.
 */
#include <errno.h>
#include <stdlib.h>

#include "kvmem/kvmem.h"
#include "select/score.h"

static int subblock_score(const kvmem_select_ctx *c, float *scores)
{
	kvmem_score_geom g;
	float *gq;
	int rc;

	if (!(c->index->sums & KVMEM_SUM_SUBBLOCK))
		return kvmem_error(EINVAL, "subblock: the index keeps no sub-block means");
	if (!(gq = ws_group_queries(c)))
		return kvmem_error_prefix("subblock");
	ws_score_geom(c, &g);
	rc = ws_device_score(c, "subblock", gq, &g, scores);
	if (rc == -ENOTSUP)
		rc = kvmem_score_subblock(scores, c->index->sub, gq, &g);
	free(gq);
	return rc;
}

const kvmem_policy_ops kvmem_policy_subblock = {
	.name = "subblock",
	.what = "Mean-K of each quarter block, summed masses (against dilution)",
	.needs = KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK,
	.per_layer = 0,
	.score = subblock_score,
};

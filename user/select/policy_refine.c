// SPDX-License-Identifier: MIT
/*
 * refine: subblock's scores pick a shortlist, the real keys decide.
 *
 * Mean-K summaries are cheap but blur a block: one matching key among 31
 * others is averaged away, and look-alike lines score as well as the fact.
 * refine takes the REFINE_FACTOR x budget best blocks by subblock's score
 * (a shortlist the needle is likely in even when it is not in the top
 * budget), reads their K pages and scores every key on its own
 * (ws_token_mass, as oracle does over the whole history). Shortlisted
 * blocks rank by that exact mass, above every other block; the rest keep
 * subblock's order below them.
 *
 * Cost per selection: the K half of REFINE_FACTOR x budget tokens of pages
 * in every layer, besides the index scan; with no budget it is subblock.
 */
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "select/score.h"

#define REFINE_FACTOR 4

extern const kvmem_policy_ops kvmem_policy_subblock;

static int by_block(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

static int refine_score(const kvmem_select_ctx *c, float *scores)
{
	const int64_t nb = c->n_blocks;
	int64_t m = c->budget > 0 ? REFINE_FACTOR * ((c->budget + c->block - 1) / c->block) : 0;
	int64_t *list = NULL;
	double *mass = NULL, total = 0;
	int rc;

	if ((rc = kvmem_policy_subblock.score(c, scores)) || m == 0)
		return rc;	/* no budget: any order keeps everything */
	m = m < nb ? m : nb;
	list = malloc(sizeof(*list) * nb);
	mass = calloc(m, sizeof(*mass));
	if (!list || !mass) {
		rc = kvmem_error(ENOMEM, "refine: out of memory for %lld blocks", (long long)nb);
		goto out;
	}
	for (int64_t b = 0; b < nb; b++)
		list[b] = b;
	kvmem_top_k_select(list, nb, m, scores);			/* as the planner ranks */
	qsort(list, m, sizeof(*list), by_block);	/* pages in order */
	if (ws_token_mass(c, list, m, mass)) {
		rc = kvmem_error_prefix("refine");
		goto out;
	}
	/* subblock's scores add up to layers x KV heads: squeeze them below
	 * 1 and lift the shortlist above it. */
	for (int64_t b = 0; b < nb; b++)
		total += scores[b];
	for (int64_t b = 0; b < nb; b++)
		scores[b] = (float)(scores[b] / (total + 1.0));
	for (int64_t i = 0; i < m; i++)
		scores[list[i]] = (float)(1.0 + mass[i]);
out:
	free(list);
	free(mass);
	return rc;
}

const kvmem_policy_ops kvmem_policy_refine = {
	.name = "refine",
	.what = "subblock shortlist of 4x the budget, then every key of it scored from the K pages",
	.needs = KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK | KVMEM_NEED_KEYS,
	.per_layer = 0,
	.score = refine_score,
};

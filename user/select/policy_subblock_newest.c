// SPDX-License-Identifier: MIT
/*
 * subblock_newest: subblock_neighbour's ranking, then the blocks of every
 * older occurrence of the question's ending ranked down (lexical's
 * supersede rule, ws_lexical_superseded): `? api.conf db.port =` keeps the
 * newest `api.conf db.port = ...` line in the view and leaves the older
 * printings out when the budget is tight.
 *
 * Why: with the recall model c36 at 64x, half of subblock_neighbour's
 * wrong answers were the older printing of the asked key, both printings
 * in view (recall.md, "Holding full context at 1x"). The summaries find the
 * key's lines; which of them is the state is a fact of the text (an agent's
 * newest printing of a file is its state), not of the keys' means. Reads
 * no page; one pass over the token ids besides subblock's scoring.
 */
#include <errno.h>
#include <stdlib.h>

#include "kvmem/kvmem.h"
#include "select/lexical.h"
#include "select/score.h"

extern const kvmem_policy_ops kvmem_policy_subblock_neighbour;

/* An older occurrence's block keeps this share of its score: below the
 * budget's cut at any ratio where the view is tight, and still ordered
 * among themselves. */
#define SUPERSEDED 1e-3f

static int subblock_newest_score(const kvmem_select_ctx *c, float *scores)
{
	const int64_t nb = c->n_blocks;
	uint8_t *old = malloc((size_t)(nb ? nb : 1));
	int64_t rc;

	if (!old)
		return kvmem_error(ENOMEM, "subblock_newest: out of memory for %lld blocks",
				   (long long)nb);
	rc = kvmem_policy_subblock_neighbour.score(c, scores);
	if (!rc)
		rc = ws_lexical_superseded(c, old);
	for (int64_t b = 0; rc > 0 && b < nb; b++)
		if (old[b])
			scores[b] *= SUPERSEDED;
	free(old);
	return rc < 0 ? (int)rc : 0;
}

const kvmem_policy_ops kvmem_policy_subblock_newest = {
	.name = "subblock_newest",
	.what = "subblock_neighbour, the blocks of the question's older occurrences ranked down (no page read)",
	.needs = KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK | KVMEM_NEED_TEXT,
	.per_layer = 0,
	.score = subblock_newest_score,
};

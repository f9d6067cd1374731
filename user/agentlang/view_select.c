// SPDX-License-Identifier: MIT
/*
 * Views chosen by a selection policy at corpus time, with no model.
 *
 * A policy that reads only the history's token ids (lexical) chooses the
 * same blocks whatever model runs, so the corpus generator can run it and
 * train the model on the views inference will show it: the look-alikes and
 * older printings the policy brings, at the share it brings them. What is
 * built here is what kvmem_session_select_ahead builds (user/session/
 * select_ahead.c, view.c): a select context over the history's ids with
 * the question's ids as the text still to come, the policy's scores, and
 * the planner with the session's default sink and recent shares.
 *
 * Policies that score the model's keys (meank, neighbour, refine) cannot
 * run here: their views change as the model trains (recall.md, the plan's
 * step 2).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "agentlang/agentlang.h"
#include "select/select.h"

#define VIEW_BLOCK 32

/* Plan one question's view (pp) and mark its tokens in keep. */
static int plan_one(const agentlang_transcript *ws, const kvmem_policy_ops *pol,
		    const kvmem_blocks *r, const agentlang_question *q,
		    const kvmem_plan_params *pp, float *scores, uint8_t *keep)
{
	const int64_t nb = kvmem_blocks_count(r), N = ws->n_ids, budget = pp->budget;
	kvmem_plan p = { 0 };
	/* As ws_select_text fills it for a select-ahead: no index, keys or
	 * queries (the policy reads none of them), the question as the text. */
	kvmem_select_ctx c = {
		.n_tokens = N,
		.n_blocks = nb,
		.block = VIEW_BLOCK,
		.span = budget,
		.budget = budget,
		.tokens = ws->ids,
		.text = q->ids,
		.n_text = q->n_ids,
	};

	if (pol->score(&c, scores) || kvmem_plan_build(&p, r, scores, 1, NULL, pp))
		return kvmem_error_prefix("agentlang: view by %s", pol->name);
	for (int i = 0; i < p.n_view; i++) {
		int64_t a = kvmem_block_start(r, p.blocks[i]), e = a + VIEW_BLOCK < N ? a + VIEW_BLOCK : N;

		memset(keep + a, 1, (size_t)(e - a));
	}
	kvmem_plan_free(&p);
	return 0;
}

int agentlang_view_policy_check(const char *policy)
{
	const kvmem_policy_ops *pol = kvmem_policy_find(policy ? policy : "");
	const unsigned text_only = KVMEM_SUM_MEANK | KVMEM_NEED_TEXT;

	if (!pol)
		return kvmem_error_prefix("agentlang: view policy");
	if (!(pol->needs & KVMEM_NEED_TEXT) || (pol->needs & ~text_only) || pol->per_layer)
		return kvmem_error(EINVAL, "agentlang: view policy %s scores the model's keys: "
				   "it cannot choose views at corpus time (no model there)", pol->name);
	return 0;
}

int64_t agentlang_view_select(const agentlang_transcript *ws, const int *asked, int n_asked,
			      int64_t budget, const char *policy, uint8_t *keep)
{
	const kvmem_policy_ops *pol;
	kvmem_blocks r;
	float *scores;
	int64_t count = 0, each, shared, sink, recent;
	int rc = agentlang_view_policy_check(policy);

	if (rc)
		return rc;
	pol = kvmem_policy_find(policy);
	if (n_asked < 1 || budget < VIEW_BLOCK)
		return kvmem_error(EINVAL, "agentlang: a view for %d questions in %lld tokens",
				   n_asked, (long long)budget);
	for (int i = 0; i < n_asked; i++)
		if (asked[i] < 0 || asked[i] >= ws->n_q)
			return kvmem_error(EINVAL, "agentlang: question %d of a workspace of %d",
					   asked[i], ws->n_q);
	if (kvmem_blocks_init(&r, VIEW_BLOCK))
		return kvmem_fail();
	r.n_tokens = ws->n_ids;
	scores = malloc(sizeof(*scores) * (size_t)(kvmem_blocks_count(&r) + 1));
	if (!scores) {
		kvmem_blocks_free(&r);
		return kvmem_error(ENOMEM, "agentlang: out of memory for block scores");
	}
	/* The session's defaults for sink and recent (session.c). Every
	 * question's plan holds the same sink and recent blocks (and the
	 * newest); the rest of the budget is shared evenly, so the union fits
	 * the budget. One question: the whole budget, as at inference. */
	sink = budget / 100 > 1 ? budget / 100 : 1;
	recent = budget / 12 > 1 ? budget / 12 : 1;
	shared = ((sink + VIEW_BLOCK - 1) / VIEW_BLOCK + (recent + VIEW_BLOCK - 1) / VIEW_BLOCK + 1) *
		 VIEW_BLOCK;
	each = n_asked == 1 || shared >= budget ? budget
						 : shared + (budget - shared) / n_asked / VIEW_BLOCK * VIEW_BLOCK;
	/* The estimate of the shared part can be a block or two too large
	 * (the recent tokens need not end a block): then the union passes the
	 * budget, and each share shrinks by a block until it fits. */
	for (;;) {
		const kvmem_plan_params pp = { each, sink, recent, KVMEM_LAYOUT_COMPACT };

		memset(keep, 0, (size_t)ws->n_ids);
		count = 0;
		for (int i = 0; i < n_asked && !rc; i++)
			rc = plan_one(ws, pol, &r, &ws->q[asked[i]], &pp, scores, keep);
		for (int64_t i = 0; !rc && i < ws->n_ids; i++)
			count += keep[i];
		if (rc || count <= budget)
			break;
		if (each - VIEW_BLOCK < VIEW_BLOCK) {
			rc = kvmem_error(EINVAL, "agentlang: %d questions' views do not fit %lld tokens",
					 n_asked, (long long)budget);
			break;
		}
		each -= VIEW_BLOCK;
	}
	free(scores);
	kvmem_blocks_free(&r);
	return rc ? rc : count;
}

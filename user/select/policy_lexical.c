// SPDX-License-Identifier: MIT
/*
 * lexical: the blocks whose tokens match the step's query text, by BM25
 * over unigram and bigram terms (lexical.h), older occurrences of the
 * question's ending ranked down, each of the best bringing its two
 * neighbours.
 *
 * A workspace keeps its token ids beside its pages, and an agent's
 * question usually repeats the words of the fact it asks about (in
 * agentlang, `? api.conf db.port =` is the start of the fact line
 * `api.conf db.port = 5432`). Retrieval by those words finds the line
 * where the model's attention, summarised per block, ranks look-alikes
 * above it (Documentation/recall.md): the same text retrieval a RAG
 * pipeline would run, but over the blocks whose KV the session already
 * holds, so nothing is prefilled again.
 *
 * The match sits at the start of a fact, its answer right after it: a
 * block boundary that cuts the line leaves the value in the next block,
 * or the file name in the one before. So each of the top budget / B
 * blocks by BM25 has its predecessor and successor ranked right after it
 * (as neighbour does for refine's ranking), those among the top budget / B
 * already too: when the budget holds most of the history, a top block's
 * neighbour low in the top would otherwise be pushed out by the raised
 * ones (seen at 1x: the `$ set` of a needle line left out). Blocks no term
 * matches score 0 and the planner's tie rule fills the rest of the budget
 * with the newest of them.
 *
 * The newest occurrence supersedes the older ones (ws_lexical_superseded):
 * when the question's ending (`api.conf db.port =`, three tokens or more)
 * occurs several times in the history, the blocks of all but the newest
 * occurrence score a tenth of their BM25. An agent's workspace re-reads
 * files and re-sets values: the newest printing is the state (in
 * agentlang by construction), and the older ones in view are what the
 * model then answers with instead (recall.md: at 16x, 86.7% -> 96.7%
 * and 95.0% on two seeds).
 * Where older occurrences matter as much (a log of independent events
 * that share a phrase), this rule ranks them lower.
 *
 * Measured against hybrids (recall.md, 2026-12-02): a lexical shortlist
 * re-ranked by exact key scores (refine's second stage) and reciprocal
 * rank fusion with refine brought the needle into view less often;
 * lexical's best places then refine's order answered less: the attention
 * ranking adds the look-alikes lexical matching leaves out.
 *
 * Needs no summary beyond Mean-K and reads no page: one pass over the
 * token ids. Where the question does not repeat the fact's words (a
 * paraphrase) it finds nothing the text does not say.
 */
#include <errno.h>
#include <stdlib.h>

#include "kvmem/kvmem.h"
#include "select/lexical.h"
#include "select/score.h"

/* A superseded block's BM25 is scaled by this: it ranks below the blocks
 * that match about as well without being superseded, above those that
 * barely match, and comes in when the budget has room. */
#define SUPERSEDED 0.1

static int lexical_score(const kvmem_select_ctx *c, float *scores)
{
	const int64_t nb = c->n_blocks;
	int64_t k = c->budget > 0 ? (c->budget + c->block - 1) / c->block : 0, matched = 0;
	double *bm = malloc(sizeof(*bm) * (size_t)(nb ? nb : 1));
	uint8_t *old = malloc((size_t)(nb ? nb : 1));
	int64_t rc;

	if (!bm || !old) {
		free(bm);
		free(old);
		return kvmem_error(ENOMEM, "lexical: out of memory for %lld blocks", (long long)nb);
	}
	rc = ws_lexical(c, bm);
	if (!rc)
		rc = ws_lexical_superseded(c, old);
	for (int64_t b = 0; rc >= 0 && b < nb; b++) {
		scores[b] = (float)(old[b] ? SUPERSEDED * bm[b] : bm[b]);
		matched += bm[b] > 0;
	}
	free(bm);
	free(old);
	if (rc < 0)
		return (int)rc;
	/* Only matched blocks bring neighbours: the rest are the newest
	 * blocks by the tie rule, whole already. */
	k = k < matched ? k : matched;
	if (ws_expand_neighbours(scores, nb, k, 1))
		return kvmem_error_prefix("lexical");
	return 0;
}

const kvmem_policy_ops kvmem_policy_lexical = {
	.name = "lexical",
	.what = "BM25 of the query text's tokens and token pairs over blocks (no keys read), the best blocks bring their neighbours",
	.needs = KVMEM_SUM_MEANK | KVMEM_NEED_TEXT,
	.per_layer = 0,
	.score = lexical_score,
};

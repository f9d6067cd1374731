// SPDX-License-Identifier: MIT
/*
 * Neighbour expansion (score.h: ws_expand_neighbours) of any ranking
 * (neighbour expands refine's, meank_neighbour meank's, subblock_neighbour
 * subblock's, lexical BM25's): each of the top k blocks has the block
 * before it and the block after it ranked right behind it, so a line that
 * a block boundary cuts comes whole. After SnapKV's pooling (Li et al.
 * 2024), at block grain.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "kvmem/kvmem.h"
#include "select/score.h"

int ws_expand_neighbours(float *scores, int64_t nb, int64_t k, int raise_top)
{
	int64_t *top;
	float *raised;
	uint8_t *in;
	int rc = 0;

	if (k <= 0 || nb < 2)
		return 0;
	k = k < nb ? k : nb;
	top = malloc((size_t)nb * sizeof(*top));
	raised = malloc((size_t)nb * sizeof(*raised));
	in = calloc((size_t)nb, 1);
	if (!top || !raised || !in) {
		rc = kvmem_error(ENOMEM, "out of memory for %lld blocks", (long long)nb);
		goto out;
	}
	for (int64_t b = 0; b < nb; b++)
		top[b] = b, raised[b] = scores[b];
	kvmem_top_k_select(top, nb, k, scores);
	for (int64_t i = 0; i < k; i++)
		in[top[i]] = 1;
	for (int64_t i = 0; i < k; i++) {
		int64_t b = top[i];
		float below = nextafterf(scores[b], -INFINITY);

		if (b > 0 && (raise_top || !in[b - 1]) && raised[b - 1] < below)
			raised[b - 1] = below;
		if (b + 1 < nb && (raise_top || !in[b + 1]) && raised[b + 1] < below)
			raised[b + 1] = below;
	}
	for (int64_t b = 0; b < nb; b++)
		scores[b] = raised[b];
out:
	free(top);
	free(raised);
	free(in);
	return rc;
}

int ws_score_with_neighbours(const kvmem_policy_ops *base, const kvmem_select_ctx *c,
			     float *scores, int raise_top, const char *name)
{
	int64_t k = c->budget > 0 ? (c->budget + c->block - 1) / c->block : 0;
	int rc;

	if ((rc = base->score(c, scores)) || !k)
		return rc;
	if (ws_expand_neighbours(scores, c->n_blocks, k, raise_top))
		return kvmem_error_prefix(name);
	return 0;
}

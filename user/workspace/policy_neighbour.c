// SPDX-License-Identifier: MIT
/*
 * neighbour: refine's ranking, and a selected block brings the neighbour a
 * line likely spills into.
 *
 * A fact is one line of 8-10 tokens; a block boundary may cut it, and a
 * view holding half of it is often useless (Documentation/recall.md: the
 * value's block ranks first, the key's does not). Keeping the tokens around
 * the important ones is what SnapKV's pooling does at token grain (Li et
 * al. 2024, "SnapKV: LLM Knows What You are Looking for Before
 * Generation": attention votes are max-pooled over a small window so the
 * neighbours of a selected token stay with it); here at block grain, and
 * only where the evidence says the line crosses the boundary, so the
 * budget is not halved for blocks whose line sits inside them.
 *
 * The evidence is in the quarter-block means: for each block among the top
 * budget / B by refine's scores, the share of its estimated mass (the
 * distance-averaged group query against each quarter, a softmax over the
 * four weighted by their lengths, averaged over layers and KV heads) that
 * its first quarter holds. Above NEIGHBOUR_SHARE the matching tokens open
 * the block, so the line began in the block before: that block is ranked
 * right after it. Likewise the last quarter and the block after. The rest
 * of the ranking is refine's.
 */
#include <math.h>
#include <stdlib.h>

#include "kvmem/kvmem.h"
#include "workspace/score.h"

#define NEIGHBOUR_SHARE 0.4

extern const kvmem_policy_ops kvmem_policy_refine;

/* The shares of block b's first and last quarter, mean over (layer, KV head). */
static void edge_shares(const kvmem_select_ctx *c, const float *gq, int64_t b, double *head,
			double *tail)
{
	const kvmem_index *ix = c->index;
	const double scale = 1.0 / sqrt((double)c->head_dim);
	double h = 0, t = 0;
	int last = KVMEM_SUBBLOCKS - 1, pairs = 0;

	for (int s = KVMEM_SUBBLOCKS - 1; s > 0 && !kvmem_index_sub_len(ix, b, s); s--)
		last = s - 1;
	for (int l = 0; l < c->n_layers; l++)
		for (int g = 0; g < c->n_kv_heads; g++) {
			const float *q = gq + ((size_t)l * c->n_kv_heads + g) * c->head_dim;
			double z[KVMEM_SUBBLOCKS], m = -INFINITY, sum = 0;

			for (int s = 0; s <= last; s++) {
				const float *mu = kvmem_index_sub(ix, l, g, b, s);
				double dot = 0;

				for (int d = 0; d < c->head_dim; d++)
					dot += (double)q[d] * mu[d];
				z[s] = dot * scale + log((double)kvmem_index_sub_len(ix, b, s));
				m = z[s] > m ? z[s] : m;
			}
			for (int s = 0; s <= last; s++)
				sum += z[s] = exp(z[s] - m);
			h += z[0] / sum;
			t += z[last] / sum;
			pairs++;
		}
	*head = pairs ? h / pairs : 0;
	*tail = pairs ? t / pairs : 0;
}

static int neighbour_score(const kvmem_select_ctx *c, float *scores)
{
	const int64_t nb = c->n_blocks;
	int64_t k = c->budget > 0 ? (c->budget + c->block - 1) / c->block : 0, *top = NULL;
	float *gq = NULL, *raised = NULL;
	uint8_t *in = NULL;
	int rc;

	if ((rc = kvmem_policy_refine.score(c, scores)) || !k || nb < 2)
		return rc;
	k = k < nb ? k : nb;
	top = malloc((size_t)nb * sizeof(*top));
	raised = malloc((size_t)nb * sizeof(*raised));
	in = calloc((size_t)nb, 1);
	if (!top || !raised || !in || !(gq = ws_group_queries(c))) {
		rc = kvmem_error(ENOMEM, "neighbour: out of memory for %lld blocks", (long long)nb);
		goto out;
	}
	for (int64_t b = 0; b < nb; b++)
		top[b] = b, raised[b] = scores[b];
	ws_top_k(top, nb, k, scores);
	for (int64_t i = 0; i < k; i++)
		in[top[i]] = 1;
	for (int64_t i = 0; i < k; i++) {
		int64_t b = top[i];
		double head, tail;
		float below = nextafterf(scores[b], -INFINITY);

		edge_shares(c, gq, b, &head, &tail);
		if (head > NEIGHBOUR_SHARE && b > 0 && !in[b - 1] && raised[b - 1] < below)
			raised[b - 1] = below;
		if (tail > NEIGHBOUR_SHARE && b + 1 < nb && !in[b + 1] && raised[b + 1] < below)
			raised[b + 1] = below;
	}
	for (int64_t b = 0; b < nb; b++)
		scores[b] = raised[b];
out:
	free(top);
	free(raised);
	free(in);
	free(gq);
	return rc;
}

const kvmem_policy_ops kvmem_policy_neighbour = {
	.name = "neighbour",
	.what = "refine, and a selected block brings the neighbour its line spills into (after SnapKV's pooling)",
	.needs = KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK | KVMEM_NEED_KEYS,
	.per_layer = 0,
	.score = neighbour_score,
};

// SPDX-License-Identifier: MIT
/*
 * infllm: blocks scored by representative tokens, one block set per layer,
 * after InfLLM (Xiao et al. 2024, "InfLLM: Training-Free Long-Context
 * Extrapolation for LLMs with an Efficient Context Memory";
 * github.com/thunlp/InfLLM, inf_llm/attention/context_manager.py).
 *
 * InfLLM keeps, per attention layer, a memory of blocks; each block is
 * represented by the mean of its repr_topk (4 in the published configs)
 * representative keys, and a block's relevance is the dot product of the
 * step's mean query with that representative key, averaged over heads; the
 * top blocks are loaded per layer. That structure is kept here: per layer,
 * per KV head, the block's representative key is the mean of INFLLM_REPR of
 * its keys, the score the group query (distance-averaged, as every kvmem
 * policy) against it, averaged over KV heads, no softmax.
 *
 * One deviation, because a workspace keeps raw K and V but no past queries:
 * InfLLM picks a block's representatives once, as the tokens that received
 * the most attention from the local window's queries when the block was
 * encoded. Here they are picked at each selection, as the INFLLM_REPR keys
 * the step's group query ranks highest (so the score is the mean of the
 * block's top INFLLM_REPR logits). That needs the keys, so it runs over a
 * shortlist of REFINE_FACTOR x budget blocks by layer l's quarter-block
 * estimate (as refine_layer), whose K pages of layer l are read; the rest
 * rank below, in that estimate's order.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "select/score.h"

#define INFLLM_REPR 4
#define REFINE_FACTOR 4

/* Mean of the r largest of v[0..n). */
static double top_mean(double *v, int n, int r)
{
	double s = 0;

	r = r < n ? r : n;
	for (int i = 0; i < r; i++) {
		int best = i;

		for (int j = i + 1; j < n; j++)
			best = v[j] > v[best] ? j : best;
		double t = v[i];

		v[i] = v[best];
		v[best] = t;
		s += v[i];
	}
	return r ? s / r : 0;
}

/* Block b's InfLLM score in layer l: mean over KV heads of the mean of its
 * INFLLM_REPR best logits against the group query. */
static int block_score(const kvmem_select_ctx *c, int l, int64_t b, const float *gq, float *buf,
		       double *dots, double *out)
{
	const int d = c->head_dim, B = c->block, len = kvmem_index_block_len(c->index, b);
	kvmem_page pg;
	double sum = 0;
	int rc = 0;

	if (c->keys->ops->get(c->keys->ctx, b, l, &pg))
		return kvmem_error_prefix("infllm: reading block %lld, layer %d", (long long)b, l);
	for (int h = 0; h < c->n_kv_heads && !rc; h++) {
		const float *q = gq + ((size_t)l * c->n_kv_heads + h) * d;

		if ((rc = kvmem_page_copy_f32(&pg, 0, (size_t)h * B * d, (size_t)len * d, buf)))
			break;
		for (int t = 0; t < len; t++) {
			double s = 0;

			for (int i = 0; i < d; i++)
				s += (double)q[i] * buf[(size_t)t * d + i];
			dots[t] = s;
		}
		sum += top_mean(dots, len, INFLLM_REPR);
	}
	c->keys->ops->put(c->keys->ctx, b, l);
	if (rc)
		return kvmem_error_prefix("infllm: reading block %lld, layer %d", (long long)b, l);
	*out = sum / c->n_kv_heads / sqrt((double)d);
	return 0;
}

static int infllm_score(const kvmem_select_ctx *c, float *scores)
{
	const int64_t nb = c->n_blocks, H = c->n_kv_heads, D = c->head_dim;
	int64_t m = c->budget > 0 ? REFINE_FACTOR * ((c->budget + c->block - 1) / c->block) : 0;
	kvmem_score_geom g;
	int64_t *list = NULL;
	float *gq, *buf = NULL;
	double *dots = NULL, *val = NULL;
	int rc = 0;

	if (!(c->index->sums & KVMEM_SUM_SUBBLOCK))
		return kvmem_error(EINVAL, "infllm: the index keeps no sub-block means");
	if (!(gq = ws_group_queries(c)))
		return kvmem_error_prefix("infllm");
	ws_score_geom(c, &g);
	g.n_layers = 1;
	m = m < nb ? m : nb;
	list = malloc((size_t)nb * sizeof(*list));
	buf = malloc((size_t)c->block * D * sizeof(float));
	dots = malloc((size_t)c->block * sizeof(double));
	val = malloc((size_t)(m ? m : 1) * sizeof(double));
	if (!list || !buf || !dots || !val) {
		rc = kvmem_error(ENOMEM, "infllm: out of memory for %lld blocks", (long long)nb);
		goto out;
	}
	for (int l = 0; l < c->n_layers && !rc; l++) {
		float *row = scores + (size_t)l * nb;
		double total = 0, lo = INFINITY;

		rc = kvmem_score_subblock(row, c->index->sub + (size_t)l * H * c->index->cap_blocks *
					  KVMEM_SUBBLOCKS * D, gq + (size_t)l * H * D, &g);
		if (rc || !m || !c->keys || c->n_q <= 0)
			continue;
		for (int64_t b = 0; b < nb; b++)
			list[b] = b;
		kvmem_top_k_select(list, nb, m, row);
		for (int64_t i = 0; i < m && !rc; i++) {
			rc = block_score(c, l, list[i], gq, buf, dots, &val[i]);
			lo = val[i] < lo ? val[i] : lo;
		}
		if (rc)
			break;
		/* The shortlist above the rest: the rest below 1, it from 2 up. */
		for (int64_t b = 0; b < nb; b++)
			total += row[b];
		for (int64_t b = 0; b < nb; b++)
			row[b] = (float)(row[b] / (total + 1.0));
		for (int64_t i = 0; i < m; i++)
			row[list[i]] = (float)(2.0 + val[i] - lo);
	}
out:
	free(gq);
	free(list);
	free(buf);
	free(dots);
	free(val);
	return rc;
}

const kvmem_policy_ops kvmem_policy_infllm = {
	.name = "infllm",
	.what = "InfLLM's representative keys (mean of a block's 4 best), per layer, over a shortlist",
	.needs = KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK | KVMEM_NEED_KEYS,
	.per_layer = 1,
	.score = infllm_score,
};

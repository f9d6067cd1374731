// SPDX-License-Identifier: MIT
/*
 * Selection scores under the split (tp.h): each rank holds the index rows
 * of its KV heads only and scores them with the host scorer
 * (kernels/cpu/score.c, the twin of the device's); a block's meank or
 * subblock score is a sum over (layer, KV head) pairs of that pair's
 * softmax shares, so the ranks' partial scores summed (a sum all-reduce)
 * give the whole model's score. Each pair's softmax is the same
 * arithmetic in a shard as in the whole; only the order of the sum over
 * pairs changes (by rank, then by layer and head within a rank), so the
 * scores agree to fp32 rounding and the selection is the same wherever no
 * two blocks' scores are that close.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_bf16.h"
#include "kvmem/kvmem.h"
#include "tp/tp.h"

void kvmem_tp_index_shard(float *dst, const float *src, const kvmem_tp_rank *r, int n_layers,
			  int n_kv_heads, size_t run)
{
	for (int l = 0; l < n_layers; l++)
		memcpy(dst + (size_t)l * r->n_kv_heads * run,
		       src + ((size_t)l * n_kv_heads + r->kv_head0) * run,
		       sizeof(float) * r->n_kv_heads * run);
}

int kvmem_tp_score(float *scores, const char *scorer, const float *index, const float *gq,
		   const kvmem_score_geom *g, const kvmem_config *c, int n_ranks)
{
	const int sub = !strcmp(scorer, "subblock");
	const size_t per = sub ? KVMEM_SUBBLOCKS : 1;
	const size_t run = (size_t)g->cap_blocks * per * g->head_dim;
	float *shard = NULL, *q = NULL, *part = NULL;
	int rc = 0;

	if (!sub && strcmp(scorer, "meank"))
		return kvmem_error(EINVAL, "tensor parallel scores: scorer '%s'; meank or subblock",
				   scorer);
	if (g->index_dtype != KVMEM_DTYPE_F32 || g->n_kv_heads != c->n_kv_heads ||
	    g->n_heads != c->n_heads || g->n_layers != c->n_layers)
		return kvmem_error(EINVAL, "tensor parallel scores: the geometry is not the model's "
				   "fp32 index");
	if (kvmem_tp_check(c, n_ranks))
		return kvmem_fail();
	shard = malloc(sizeof(float) * run * g->n_layers * (g->n_kv_heads / n_ranks));
	q = malloc(sizeof(float) * g->head_dim * g->n_layers * (g->n_kv_heads / n_ranks));
	part = malloc(sizeof(float) * (g->n_blocks ? g->n_blocks : 1));
	if (!shard || !q || !part) {
		rc = kvmem_error(ENOMEM, "tensor parallel scores: out of memory");
		goto out;
	}
	for (int i = 0; i < n_ranks; i++) {
		kvmem_tp_rank r;
		kvmem_score_geom rg = *g;

		kvmem_tp_plan(c, n_ranks, i, &r);
		kvmem_tp_index_shard(shard, index, &r, g->n_layers, g->n_kv_heads, run);
		kvmem_tp_index_shard(q, gq, &r, g->n_layers, g->n_kv_heads, g->head_dim);
		rg.n_kv_heads = r.n_kv_heads;
		rg.n_heads = r.n_heads;
		rc = sub ? kvmem_score_subblock(i ? part : scores, shard, q, &rg)
			 : kvmem_score_meank(i ? part : scores, shard, q, &rg);
		if (rc)
			goto out;
		/* The all-reduce: rank order, into rank 0's scores. */
		for (int64_t b = 0; i && b < g->n_blocks; b++)
			scores[b] += part[b];
	}
out:
	free(shard);
	free(q);
	free(part);
	return rc;
}

// SPDX-License-Identifier: MIT
/*
 * refine_layer: refine with one block set per layer (per-layer selection).
 *
 * refine sums every layer's attention shares into one ranking, so every
 * layer sees the same blocks. Methods that select per layer let each layer
 * keep what its own heads attend to: Quest (Tang et al. 2024) and InfLLM
 * (Xiao et al. 2024, one context memory per attention layer) both do. Here,
 * for each layer l: subblock's estimate from layer l's heads alone picks a
 * shortlist of REFINE_FACTOR x budget blocks, the K pages of layer l of
 * those blocks are read and every key scored on its own (kvmem_token_mass,
 * as refine does, for this layer's query heads), and the shortlist ranks by
 * that mass above the rest, which keep layer l's subblock order. Each layer
 * still holds the same number of tokens (the planner's rule).
 *
 * Cost: the K pages refine reads (REFINE_FACTOR x budget tokens per layer),
 * but each layer reads its own shortlist, and the view's blocks differ per
 * layer (a global policy fetches a block's pages as one extent).
 */
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "select/score.h"

#define REFINE_FACTOR 4

static int by_block(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

struct lbuf {
	float *keys, *hq;
	int32_t *len;
	int64_t *list;
	double *mass;
};

/* Layer l's masses of the n listed blocks (ascending), from their pages. */
static int layer_mass(const kvmem_select_ctx *c, int l, int64_t n, struct lbuf *t,
		      const kvmem_score_geom *g)
{
	const int d = c->head_dim, B = c->block;

	for (int64_t i = 0; i < n; i++) {
		kvmem_page pg;
		int rc = 0;

		t->len[i] = kvmem_index_block_len(c->index, t->list[i]);
		if (c->keys->ops->get(c->keys->ctx, t->list[i], l, &pg))
			return kvmem_error_prefix("refine_layer: reading block %lld, layer %d",
						  (long long)t->list[i], l);
		for (int h = 0; h < c->n_kv_heads && !rc; h++) {
			float *dst = t->keys + ((size_t)h * n * B + (size_t)i * B) * d;

			rc = kvmem_page_copy_f32(&pg, 0, (size_t)h * B * d, (size_t)t->len[i] * d, dst);
			memset(dst + (size_t)t->len[i] * d, 0, (size_t)(B - t->len[i]) * d * sizeof(float));
		}
		c->keys->ops->put(c->keys->ctx, t->list[i], l);
		if (rc)
			return kvmem_error_prefix("refine_layer: reading block %lld, layer %d",
						  (long long)t->list[i], l);
	}
	kvmem_head_queries(t->hq, c->q, l, c->n_q, c->n_heads, d, c->rope_theta, c->span);
	memset(t->mass, 0, (size_t)n * sizeof(double));
	return kvmem_token_mass(t->mass, t->keys, t->len, t->list, n, t->hq, c->q_pos, c->n_q, g);
}

static int refine_layer_score(const kvmem_select_ctx *c, float *scores)
{
	const int64_t nb = c->n_blocks, H = c->n_kv_heads, D = c->head_dim;
	int64_t m = c->budget > 0 ? REFINE_FACTOR * ((c->budget + c->block - 1) / c->block) : 0;
	kvmem_score_geom g, g1;
	struct lbuf t = { 0 };
	float *gq;
	int rc = 0;

	if (!(c->index->sums & KVMEM_SUM_SUBBLOCK))
		return kvmem_error(EINVAL, "refine_layer: the index keeps no sub-block means");
	if (!(gq = ws_group_queries(c)))
		return kvmem_error_prefix("refine_layer");
	ws_score_geom(c, &g);
	g1 = g;
	g1.n_layers = 1;
	m = m < nb ? m : nb;
	t.list = malloc((size_t)nb * sizeof(*t.list));
	t.mass = malloc((size_t)(m ? m : 1) * sizeof(*t.mass));
	t.len = malloc((size_t)(m ? m : 1) * sizeof(*t.len));
	t.keys = malloc((size_t)H * (m ? m : 1) * c->block * D * sizeof(float));
	t.hq = malloc((size_t)c->n_heads * (c->n_q ? c->n_q : 1) * D * sizeof(float));
	if (!t.list || !t.mass || !t.len || !t.keys || !t.hq) {
		rc = kvmem_error(ENOMEM, "refine_layer: out of memory for %lld blocks", (long long)nb);
		goto out;
	}
	for (int l = 0; l < c->n_layers && !rc; l++) {
		float *row = scores + (size_t)l * nb;
		double total = 0;

		/* Layer l's subblock estimate: the index and group queries of
		 * this layer alone (layer-major layouts). */
		rc = kvmem_score_subblock(row, c->index->sub + (size_t)l * H * c->index->cap_blocks *
					  KVMEM_SUBBLOCKS * D, gq + (size_t)l * H * D, &g1);
		if (rc || !m || !c->keys || c->n_q <= 0)
			continue;
		for (int64_t b = 0; b < nb; b++)
			t.list[b] = b;
		kvmem_top_k_select(t.list, nb, m, row);
		qsort(t.list, m, sizeof(*t.list), by_block);
		if ((rc = layer_mass(c, l, m, &t, &g)))
			break;
		for (int64_t b = 0; b < nb; b++)
			total += row[b];
		for (int64_t b = 0; b < nb; b++)
			row[b] = (float)(row[b] / (total + 1.0));
		for (int64_t i = 0; i < m; i++)
			row[t.list[i]] = (float)(1.0 + t.mass[i]);
	}
out:
	free(gq);
	free(t.list);
	free(t.mass);
	free(t.len);
	free(t.keys);
	free(t.hq);
	return rc;
}

const kvmem_policy_ops kvmem_policy_refine_layer = {
	.name = "refine_layer",
	.what = "refine per layer: each layer's own shortlist and key scores, one block set per layer",
	.needs = KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK | KVMEM_NEED_KEYS,
	.per_layer = 1,
	.score = refine_layer_score,
};

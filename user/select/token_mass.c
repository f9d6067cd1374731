// SPDX-License-Identifier: MIT
/*
 * Per-token scoring from the real keys (score.h: ws_token_mass), shared by
 * refine (over a shortlist) and oracle (over every block).
 *
 * A summary (Mean-K, sub-block means, min/max) blurs a block into one or a
 * few vectors; here every key is scored on its own, so a single matching
 * token is not averaged away among its block's other tokens. The price is
 * reading the K pages of every scored block in every layer. Each layer's
 * softmax over the gathered keys is kvmem_token_mass (kernels/cpu/score.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "select/score.h"

struct tm_buf {
	float *keys;		/* [n_kv_heads][n * B][D], unused slots zero */
	int32_t *len;		/* [n] tokens in each listed block */
	float *q;		/* [n_heads * n_q][D] distance-averaged queries */
};

/* The listed blocks' raw keys of layer l, head-major. */
static int gather(const kvmem_select_ctx *c, const int64_t *blocks, int64_t n, int l,
		  struct tm_buf *t)
{
	const int d = c->head_dim, B = c->block;

	for (int64_t i = 0; i < n; i++) {
		kvmem_page pg;
		int rc = 0;

		t->len[i] = kvmem_index_block_len(c->index, blocks[i]);
		if (c->keys->ops->get(c->keys->ctx, blocks[i], l, &pg))
			return kvmem_error_prefix("reading the keys of block %lld, layer %d",
						  (long long)blocks[i], l);
		for (int h = 0; h < c->n_kv_heads && !rc; h++) {
			float *dst = t->keys + ((size_t)h * n * B + (size_t)i * B) * d;

			rc = kvmem_page_copy_f32(&pg, 0, (size_t)h * B * d, (size_t)t->len[i] * d, dst);
			memset(dst + (size_t)t->len[i] * d, 0,
			       (size_t)(B - t->len[i]) * d * sizeof(float));
		}
		c->keys->ops->put(c->keys->ctx, blocks[i], l);
		if (rc)
			return kvmem_error_prefix("reading the keys of block %lld, layer %d",
						  (long long)blocks[i], l);
	}
	return 0;
}

int ws_token_mass(const kvmem_select_ctx *c, const int64_t *blocks, int64_t n, double *mass)
{
	const int d = c->head_dim, B = c->block, pairs = c->n_heads * c->n_q;
	struct tm_buf t = { 0 };
	kvmem_score_geom g;
	int rc = 0;

	if (n <= 0 || pairs <= 0)
		return 0;
	if (!c->keys)
		return kvmem_error(EINVAL, "no page source to read the real keys from");
	ws_score_geom(c, &g);
	t.keys = malloc((size_t)c->n_kv_heads * n * B * d * sizeof(float));
	t.len = malloc((size_t)n * sizeof(int32_t));
	t.q = malloc((size_t)pairs * d * sizeof(float));
	if (!t.keys || !t.len || !t.q) {
		rc = kvmem_error(ENOMEM, "out of memory scoring the keys of %lld blocks", (long long)n);
		goto out;
	}
	for (int l = 0; l < c->n_layers && !rc; l++) {
		if ((rc = gather(c, blocks, n, l, &t)))
			break;
		kvmem_head_queries(t.q, c->q, l, c->n_q, c->n_heads, d, c->rope_theta, c->span);
		rc = kvmem_token_mass(mass, t.keys, t.len, blocks, n, t.q, c->q_pos, c->n_q, &g);
	}
out:
	free(t.keys);
	free(t.len);
	free(t.q);
	return rc;
}

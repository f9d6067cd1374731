// SPDX-License-Identifier: MIT
/*
 * Per-token scoring from the real keys (score.h: ws_token_mass), shared by
 * refine (over a shortlist) and oracle (over every block).
 *
 * A summary (Mean-K, sub-block means, min/max) blurs a block into one or a
 * few vectors; here every key is scored on its own, so a single matching
 * token is not averaged away among its block's other tokens. The price is
 * reading the K pages of every scored block in every layer.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "workspace/score.h"

struct tm_buf {
	float *keys;		/* [n_kv_heads][n * B][D], unused slots zero */
	int32_t *len;		/* [n] tokens in each listed block */
	float *q;		/* [n_heads * n_q][D] distance-averaged queries */
	double *part;		/* [n_heads * n_q][n] one layer's shares */
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

/*
 * Pair p (query head p / n_q, query token p % n_q) of layer l: softmax over
 * the listed keys the query may see (causal: not past its own position),
 * shares per block into part[p][..]. z: n * B floats of scratch.
 */
static void pair_shares(const kvmem_select_ctx *c, const int64_t *blocks, int64_t n,
			const struct tm_buf *t, int p, float *z)
{
	const int d = c->head_dim, B = c->block, group = c->n_heads / c->n_kv_heads;
	const int h = p / c->n_q, tok = p % c->n_q;
	const int64_t qpos = c->q_pos[tok], slots = n * B;
	const float s = ws_scale(c);
	double *part = t->part + (size_t)p * n, tot = 0;
	float mx = -INFINITY;

	ws_dots(z, t->q + (size_t)p * d, t->keys + (size_t)(h / group) * slots * d, slots, d);
	for (int64_t i = 0; i < n; i++)
		for (int j = 0; j < B; j++) {
			float *zj = z + i * B + j;

			*zj = j < t->len[i] && blocks[i] * B + j <= qpos ? *zj * s : -INFINITY;
			mx = *zj > mx ? *zj : mx;
		}
	for (int64_t i = 0; i < n; i++) {
		part[i] = 0;
		if (mx == -INFINITY)	/* sees none of them: adds nothing */
			continue;
		for (int j = 0; j < B; j++)
			part[i] += exp((double)z[i * B + j] - mx);
		tot += part[i];
	}
	for (int64_t i = 0; i < n && tot > 0; i++)
		part[i] /= tot;
}

int ws_token_mass(const kvmem_select_ctx *c, const int64_t *blocks, int64_t n, double *mass)
{
	const int d = c->head_dim, B = c->block, pairs = c->n_heads * c->n_q;
	struct tm_buf t = { 0 };
	int rc = 0, oom = 0;

	if (n <= 0 || pairs <= 0)
		return 0;
	if (!c->keys)
		return kvmem_error(EINVAL, "no page source to read the real keys from");
	t.keys = malloc((size_t)c->n_kv_heads * n * B * d * sizeof(float));
	t.len = malloc((size_t)n * sizeof(int32_t));
	t.q = malloc((size_t)pairs * d * sizeof(float));
	t.part = malloc((size_t)pairs * n * sizeof(double));
	if (!t.keys || !t.len || !t.q || !t.part) {
		rc = kvmem_error(ENOMEM, "out of memory scoring the keys of %lld blocks", (long long)n);
		goto out;
	}
	for (int l = 0; l < c->n_layers && !rc; l++) {
		if ((rc = gather(c, blocks, n, l, &t)))
			break;
		for (int p = 0; p < pairs; p++) {
			memcpy(t.q + (size_t)p * d,
			       c->q + (((size_t)l * c->n_q + p % c->n_q) * c->n_heads + p / c->n_q) * d,
			       d * sizeof(float));
			ws_rope_mean(c, t.q + (size_t)p * d);
		}
		/* One thread per pair, sums in a fixed order afterwards: the
		 * same bits for any thread count. */
#pragma omp parallel reduction(| : oom) if ((int64_t)n * B * pairs > 65536)
		{
			float *z = malloc((size_t)n * B * sizeof(float));

#pragma omp for schedule(static)
			for (int p = 0; p < pairs; p++)
				if (z)
					pair_shares(c, blocks, n, &t, p, z);
			oom |= !z;
			free(z);
		}
		if (oom) {
			rc = kvmem_error(ENOMEM, "out of memory scoring the keys of %lld blocks", (long long)n);
			break;
		}
		for (int p = 0; p < pairs; p++)
			for (int64_t i = 0; i < n; i++)
				mass[i] += t.part[(size_t)p * n + i];
	}
out:
	free(t.keys);
	free(t.len);
	free(t.q);
	free(t.part);
	return rc;
}

// SPDX-License-Identifier: MIT
/*
 * oracle: the exact attention mass each block would get in full-context
 * attention, from the real keys. For every layer, query head and query
 * token, the query (rotated at its workspace position) attends over every
 * history key (rotated at its own position, causally); the softmax
 * probabilities of a block's tokens add up to its mass, and masses add up
 * over heads, tokens and layers: one block set for all layers.
 *
 * It reads every page of every layer, so it costs a full attention pass
 * over the history: an upper reference for the other policies, for
 * evaluation only.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "workspace/score.h"

/* Rotated keys of layer l, [H][N][D], gathered from the page source. */
static int gather_keys(const kvm_select_ctx *c, int l, float *keys, int32_t *pos)
{
	const int d = c->head_dim, B = c->block;

	for (int64_t b = 0; b < c->n_blocks; b++) {
		const float *k, *v;
		int len = kvm_index_block_len(c->index, b);

		if (c->keys->ops->get(c->keys->ctx, b, l, &k, &v))
			return kvm_error_prefix("oracle");
		for (int h = 0; h < c->n_kv_heads; h++)
			memcpy(keys + ((size_t)h * c->n_tokens + b * B) * d,
			       k + (size_t)h * B * d, (size_t)len * d * sizeof(float));
		c->keys->ops->put(c->keys->ctx, b, l);
	}
	for (int h = 0; h < c->n_kv_heads; h++)
		kvm_rope(keys + (size_t)h * c->n_tokens * d, pos, (int)c->n_tokens, 1, d,
			 c->rope_theta);
	return 0;
}

static int oracle_score(const kvm_select_ctx *c, float *scores)
{
	const int64_t N = c->n_tokens;
	const int d = c->head_dim, group = c->n_heads / c->n_kv_heads;
	const float s = ws_scale(c);
	float *keys, *logit, *q;
	double *mass;
	int32_t *pos, qp;
	int rc = 0;

	if (!c->keys)
		return kvm_error("oracle: no page source to read the real keys from");
	if (N > INT32_MAX)
		return kvm_error("oracle: %lld tokens is too many", (long long)N);
	keys = malloc((size_t)c->n_kv_heads * (N ? N : 1) * d * sizeof(float));
	logit = malloc((size_t)(N ? N : 1) * sizeof(float));
	q = malloc((size_t)d * sizeof(float));
	mass = calloc((size_t)(c->n_blocks ? c->n_blocks : 1), sizeof(double));
	pos = malloc((size_t)(N ? N : 1) * sizeof(int32_t));
	if (!keys || !logit || !q || !mass || !pos) {
		rc = kvm_error("oracle: out of memory for %lld tokens", (long long)N);
		goto out;
	}
	for (int64_t p = 0; p < N; p++)
		pos[p] = (int32_t)p;
	for (int l = 0; l < c->n_layers && !rc; l++) {
		if ((rc = gather_keys(c, l, keys, pos)))
			break;
		for (int t = 0; t < c->n_q; t++) {
			int64_t see = c->q_pos[t] + 1 < N ? c->q_pos[t] + 1 : N;

			qp = (int32_t)c->q_pos[t];
			for (int h = 0; h < c->n_heads; h++) {
				const float *kh = keys + (size_t)(h / group) * N * d;
				float mx = -INFINITY;
				double z = 0;

				memcpy(q, c->q + (((size_t)l * c->n_q + t) * c->n_heads + h) * d,
				       d * sizeof(float));
				kvm_rope(q, &qp, 1, 1, d, c->rope_theta);
				for (int64_t p = 0; p < see; p++) {
					float acc = 0;

					for (int i = 0; i < d; i++)
						acc += q[i] * kh[(size_t)p * d + i];
					logit[p] = acc * s;
					mx = logit[p] > mx ? logit[p] : mx;
				}
				for (int64_t p = 0; p < see; p++)
					z += exp((double)logit[p] - mx);
				for (int64_t p = 0; p < see; p++)
					mass[p / c->block] += exp((double)logit[p] - mx) / z;
			}
		}
	}
	for (int64_t b = 0; b < c->n_blocks; b++)
		scores[b] = (float)mass[b];
out:
	free(keys);
	free(logit);
	free(q);
	free(mass);
	free(pos);
	return rc;
}

const kvm_policy_ops kvm_policy_oracle = {
	.name = "oracle",
	.what = "exact full-attention mass from the real keys (evaluation only: reads every page)",
	.needs = KVM_SUM_MEANK | KVM_NEED_KEYS,
	.per_layer = 0,
	.score = oracle_score,
};

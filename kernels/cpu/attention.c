// SPDX-License-Identifier: MIT
/*
 * Causal GQA attention over a head-major KV view (CPU reference).
 *
 * Each (query, head) pair is computed start to end by one thread, in a
 * fixed order over keys and over head_dim, so the result depends only on
 * the inputs: not on the thread count, not on kv_stride, not on which other
 * queries share the call. Work is ordered KV head first so that a thread's
 * consecutive items read the same K/V run while it is in cache.
 *
 * Scores, exponentials and the weighted sum of V are fp32; the softmax
 * denominator is summed in double (cheap, and it keeps long views precise).
 * A query that sees no key gets a zero output. If the score buffer cannot
 * be allocated the scores are computed twice instead: same bits, no crash.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kernels.h"

/* Dot product in a fixed order: eight running sums, then a fixed tree. */
static float dot(const float *a, const float *b, int n)
{
	float acc[8] = { 0 };
	int d = 0;

	for (; d + 8 <= n; d += 8)
		for (int k = 0; k < 8; k++)
			acc[k] += a[d + k] * b[d + k];
	float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
		  ((acc[4] + acc[5]) + (acc[6] + acc[7]));
	for (; d < n; d++)
		s += a[d] * b[d];
	return s;
}

static void attend_one(float *out, const float *qv, int32_t qp, const float *kh,
		       const float *vh, const int32_t *kv_pos, int n_kv, int head_dim,
		       float scale, float *scores)
{
	float max = -INFINITY;
	int seen = 0;

	for (int j = 0; j < n_kv; j++) {
		if (kv_pos[j] > qp)
			continue;
		float s = dot(qv, kh + (size_t)j * head_dim, head_dim) * scale;

		if (scores)
			scores[j] = s;
		if (s > max)
			max = s;
		seen = 1;
	}
	memset(out, 0, sizeof(float) * head_dim);
	if (!seen)
		return;

	double sum = 0.0;

	for (int j = 0; j < n_kv; j++) {
		if (kv_pos[j] > qp)
			continue;
		const float *vj = vh + (size_t)j * head_dim;
		float s = scores ? scores[j]
				 : dot(qv, kh + (size_t)j * head_dim, head_dim) * scale;
		float p = expf(s - max);

		sum += p;
		for (int d = 0; d < head_dim; d++)
			out[d] += p * vj[d];
	}
	float inv = (float)(1.0 / sum);

	for (int d = 0; d < head_dim; d++)
		out[d] *= inv;
}

void kvm_attention(float *out, const float *q, const int32_t *q_pos, int n_q,
		   const float *k, const float *v, const int32_t *kv_pos, int n_kv,
		   size_t kv_stride, int n_heads, int n_kv_heads, int head_dim, float scale)
{
	if (n_q <= 0 || n_heads <= 0)
		return;
	int group = n_heads / n_kv_heads;
	long items = (long)n_kv_heads * n_q * group;

	#pragma omp parallel if (items > 1 && n_kv > 16)
	{
		float *scores = malloc(sizeof(float) * (n_kv > 0 ? n_kv : 1));

		#pragma omp for schedule(static)
		for (long w = 0; w < items; w++) {
			int g = (int)(w / ((long)n_q * group));
			long r = w % ((long)n_q * group);
			int i = (int)(r / group);
			int h = g * group + (int)(r % group);
			size_t qo = ((size_t)i * n_heads + h) * head_dim;
			const float *kh = k + (size_t)g * kv_stride * head_dim;
			const float *vh = v + (size_t)g * kv_stride * head_dim;

			attend_one(out + qo, q + qo, q_pos[i], kh, vh, kv_pos, n_kv, head_dim,
				   scale, scores);
		}
		free(scores);
	}
}

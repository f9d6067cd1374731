// SPDX-License-Identifier: MIT
/* Helpers shared by the selection policies: dots, group queries, masses. */
#include <math.h>
#include <string.h>

#include "workspace/score.h"

#define MASS_CHUNK 4096	/* partial sums per fixed chunk: thread-count independent */

/*
 * Sixteen running sums in a fixed order: the compiler vectorises this to
 * the widest unit the clone targets, and without FMA contraction (ISO C
 * mode) every clone gives the same bits.
 */
__attribute__((target_clones("avx512f", "avx2", "default")))
void ws_dots(float *out, const float *q, const float *m, int64_t n, int d)
{
#pragma omp parallel for schedule(static) if (n * d > (1 << 16))
	for (int64_t i = 0; i < n; i++) {
		const float *row = m + (size_t)i * d;
		float acc[16] = { 0 }, s = 0;
		int j = 0;

		for (; j + 16 <= d; j += 16)
			for (int u = 0; u < 16; u++)
				acc[u] += q[j + u] * row[j + u];
		for (; j < d; j++)
			acc[j & 15] += q[j] * row[j];
		for (int u = 0; u < 16; u++)
			s += acc[u];
		out[i] = s;
	}
}

void ws_group_query(const kvm_select_ctx *c, int l, int g, float *out)
{
	const int group = c->n_heads / c->n_kv_heads, d = c->head_dim;
	float inv = 1.0f / (float)(group * (c->n_q > 0 ? c->n_q : 1));

	memset(out, 0, d * sizeof(float));
	for (int t = 0; t < c->n_q; t++)
		for (int h = g * group; h < (g + 1) * group; h++) {
			const float *q = c->q + (((size_t)l * c->n_q + t) * c->n_heads + h) * d;

			for (int i = 0; i < d; i++)
				out[i] += q[i];
		}
	for (int i = 0; i < d; i++)
		out[i] *= inv;
}

void ws_add_mass(float *scores, float *z, int64_t n, int per)
{
	int64_t n_chunks = (n + MASS_CHUNK - 1) / MASS_CHUNK;
	float mx = -INFINITY;
	double total = 0;

	if (n <= 0)
		return;
#pragma omp parallel for reduction(max : mx) schedule(static) if (n > (1 << 15))
	for (int64_t i = 0; i < n; i++)
		if (z[i] > mx)
			mx = z[i];
	if (mx == -INFINITY)
		return;
	/* Partial sums per fixed chunk, added in chunk order. */
	{
		double part[64];
		int64_t c0 = 0;

		while (c0 < n_chunks) {
			int64_t c1 = c0 + 64 < n_chunks ? c0 + 64 : n_chunks;

#pragma omp parallel for schedule(static) if (n > (1 << 15))
			for (int64_t c = c0; c < c1; c++) {
				int64_t a = c * MASS_CHUNK, b = a + MASS_CHUNK < n ? a + MASS_CHUNK : n;
				double s = 0;

				for (int64_t i = a; i < b; i++) {
					z[i] = expf(z[i] - mx);
					s += z[i];
				}
				part[c - c0] = s;
			}
			for (int64_t c = c0; c < c1; c++)
				total += part[c - c0];
			c0 = c1;
		}
	}
	{
		float inv = (float)(1.0 / total);
		int64_t nb = n / per;

#pragma omp parallel for schedule(static) if (n > (1 << 15))
		for (int64_t b = 0; b < nb; b++) {
			float s = 0;

			for (int j = 0; j < per; j++)
				s += z[b * per + j];
			scores[b] += s * inv;
		}
	}
}

float ws_scale(const kvm_select_ctx *c)
{
	return 1.0f / sqrtf((float)c->head_dim);
}

float ws_log_len(int len)
{
	return len > 0 ? logf((float)len) : -INFINITY;
}

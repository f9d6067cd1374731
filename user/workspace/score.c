// SPDX-License-Identifier: MIT
/* Helpers shared by the selection policies: dots, group queries, masses. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "workspace/score.h"

#define MASS_CHUNK 4096		/* items per work unit: a multiple of KVMEM_SUBBLOCKS */
#define MASS_SCRATCH (16u << 20)	/* logits kept at once, in floats (64 MiB) */

typedef float v16 __attribute__((vector_size(64)));

/* q[j..j+15] * row[j..j+15], elementwise (no vector-returning function:
 * that would change the ABI between clones). */
#define MUL16(out, q, row) do {				\
		v16 x_, y_;				\
		memcpy(&x_, (q), sizeof(v16));		\
		memcpy(&y_, (row), sizeof(v16));	\
		(out) = x_ * y_;			\
	} while (0)

/*
 * Four chains of sixteen running sums (GCC vector extensions: registers on
 * AVX-512, pairs or quads of narrower ones elsewhere), folded in a fixed
 * tree. Every operation is elementwise and there is no FMA contraction in
 * ISO C mode, so every clone gives the same bits.
 */
__attribute__((target_clones("avx512f", "avx2", "default")))
void ws_dots(float *out, const float *q, const float *m, int64_t n, int d)
{
	for (int64_t i = 0; i < n; i++) {
		const float *row = m + (size_t)i * d;
		v16 a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 }, a, p0, p1, p2, p3;
		float s[16];
		int j = 0;

		for (; j + 64 <= d; j += 64) {
			MUL16(p0, q + j, row + j);
			MUL16(p1, q + j + 16, row + j + 16);
			MUL16(p2, q + j + 32, row + j + 32);
			MUL16(p3, q + j + 48, row + j + 48);
			a0 += p0;
			a1 += p1;
			a2 += p2;
			a3 += p3;
		}
		a = (a0 + a1) + (a2 + a3);
		for (; j + 16 <= d; j += 16) {
			MUL16(p0, q + j, row + j);
			a += p0;
		}
		memcpy(s, &a, sizeof(s));
		for (; j < d; j++)
			s[j & 15] += q[j] * row[j];
		for (int u = 0; u < 8; u++)
			s[u] += s[u + 8];
		out[i] = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
	}
}

void ws_group_query(const kvmem_select_ctx *c, int l, int g, float *out)
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
	ws_rope_mean(c, out);
}

/* sum_{t<n} cos(w t) and sin(w t) in closed form (a geometric sum). */
static void rope_sums(double w, double n, double *cs, double *sn)
{
	double h = sin(w / 2);

	if (fabs(h) < 1e-12) {	/* no turn at all within the span */
		*cs = n;
		*sn = 0;
		return;
	}
	*cs = sin(n * w / 2) / h * cos((n - 1) * w / 2);
	*sn = sin(n * w / 2) / h * sin((n - 1) * w / 2);
}

void ws_rope_mean(const kvmem_select_ctx *c, float *x)
{
	const int d = c->head_dim, half = d / 2;
	const double n = (double)c->span;

	if (c->span <= 0)
		return;
	for (int i = 0; i < half; i++) {
		double C, S, a = x[i], b = x[i + half];

		/* The same frequencies as kernels/cpu/rope.c. */
		rope_sums(pow(c->rope_theta, -2.0 * i / d), n, &C, &S);
		C /= n;
		S /= n;
		/* R(-t) on the pair (u, v) of k: (u cos + v sin, v cos - u sin);
		 * so q . R(-t) k = (a cos - b sin) u + (b cos + a sin) v. */
		x[i] = (float)(C * a - S * b);
		x[i + half] = (float)(C * b + S * a);
	}
}

/*
 * Pairs are done a group at a time (as many as MASS_SCRATCH logits hold),
 * each group in one parallel region with three phases over fixed chunks:
 * logits and per-chunk maxima; exp and per-chunk sums (in double); the
 * per-block shares added to the scores, pairs in order. Between phases the
 * group's maxima and totals are reduced in chunk order by one thread.
 */
int ws_mass(float *scores, int64_t n_items, int per, int n_pairs, const int *row,
	    ws_logit_fn fn, const void *arg)
{
	const int64_t n_chunks = (n_items + MASS_CHUNK - 1) / MASS_CHUNK, nb = n_items / per;
	int64_t g_max = n_items ? (int64_t)MASS_SCRATCH / n_items : n_pairs;
	int G = g_max < 1 ? 1 : (g_max > n_pairs ? n_pairs : (int)g_max);
	float *z, *cmax, *mx, *inv;
	double *csum;

	if (n_items <= 0 || n_pairs <= 0)
		return 0;
	z = malloc(sizeof(float) * G * n_items);
	cmax = malloc(sizeof(float) * G * n_chunks);
	csum = malloc(sizeof(double) * G * n_chunks);
	mx = malloc(sizeof(float) * G);
	inv = malloc(sizeof(float) * G);
	if (!z || !cmax || !csum || !mx || !inv) {
		free(z);
		free(cmax);
		free(csum);
		free(mx);
		free(inv);
		return kvmem_error(ENOMEM, "workspace: out of memory scoring %lld items", (long long)n_items);
	}
	for (int g0 = 0; g0 < n_pairs; g0 += G) {
		const int gn = n_pairs - g0 < G ? n_pairs - g0 : G;

#pragma omp parallel if (n_items * gn > 16384)
		{
#pragma omp for schedule(static)
			for (int64_t c = 0; c < n_chunks; c++) {
				int64_t a = c * MASS_CHUNK, b = a + MASS_CHUNK < n_items ? a + MASS_CHUNK : n_items;

				for (int j = 0; j < gn; j++) {
					float *zj = z + (size_t)j * n_items, m = -INFINITY;

					fn(arg, g0 + j, a, b, zj + a);
					for (int64_t i = a; i < b; i++)
						m = zj[i] > m ? zj[i] : m;
					cmax[(size_t)j * n_chunks + c] = m;
				}
			}
#pragma omp single
			for (int j = 0; j < gn; j++) {
				mx[j] = -INFINITY;
				for (int64_t c = 0; c < n_chunks; c++)
					mx[j] = cmax[(size_t)j * n_chunks + c] > mx[j] ?
						cmax[(size_t)j * n_chunks + c] : mx[j];
			}
#pragma omp for schedule(static)
			for (int64_t c = 0; c < n_chunks; c++) {
				int64_t a = c * MASS_CHUNK, b = a + MASS_CHUNK < n_items ? a + MASS_CHUNK : n_items;

				for (int j = 0; j < gn; j++) {
					float *zj = z + (size_t)j * n_items;
					double s = 0;

					for (int64_t i = a; i < b; i++) {
						/* A pair with no weight anywhere adds nothing. */
						zj[i] = mx[j] == -INFINITY ? 0 : expf(zj[i] - mx[j]);
						s += zj[i];
					}
					csum[(size_t)j * n_chunks + c] = s;
				}
			}
#pragma omp single
			for (int j = 0; j < gn; j++) {
				double total = 0;

				for (int64_t c = 0; c < n_chunks; c++)
					total += csum[(size_t)j * n_chunks + c];
				inv[j] = total > 0 ? (float)(1.0 / total) : 0;
			}
#pragma omp for schedule(static)
			for (int64_t c = 0; c < n_chunks; c++) {
				int64_t a = c * MASS_CHUNK / per;
				int64_t b = (c + 1) * MASS_CHUNK / per < nb ? (c + 1) * MASS_CHUNK / per : nb;

				for (int64_t blk = a; blk < b; blk++)
					for (int j = 0; j < gn; j++) {
						const float *zj = z + (size_t)j * n_items + blk * per;
						float s = 0;

						for (int k = 0; k < per; k++)
							s += zj[k];
						scores[(size_t)(row ? row[g0 + j] : 0) * nb + blk] += s * inv[j];
					}
			}
		}
	}
	free(z);
	free(cmax);
	free(csum);
	free(mx);
	free(inv);
	return 0;
}

float ws_scale(const kvmem_select_ctx *c)
{
	return 1.0f / sqrtf((float)c->head_dim);
}

float ws_log_len(int len)
{
	return len > 0 ? logf((float)len) : -INFINITY;
}

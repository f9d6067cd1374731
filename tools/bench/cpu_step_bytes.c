// SPDX-License-Identifier: MIT
/*
 * Where the cpu backend's batched decode step stands against this machine's
 * caches (issue #26's CPU row: 8 conversations / one): the step's bytes
 * read again and again by two threads from a buffer of the step's size (the
 * last-level cache's rate) and of several times it (memory's), then the
 * embedded model's products alone (6 layers of q|k|v 256 -> 768, o 512 ->
 * 256, gate|up 256 -> 1536, down 768 -> 256, bf16 weights in panels, through
 * the kernels' pool as the engine runs them) at 1 and 8 rows, with 1, 2 and 4
 * copies of the weights used in turn: one copy is the lone step's working
 * set, two are about the batched step's (its views are as large as its
 * weights); then one copy row-major (kvmem_matmul_bf16w: the same bits,
 * blocks transposed in registers as it goes); then the step's attention
 * alone, 8 views of 140 and of 320 keys in each of 6 layers, as the engine
 * calls kvmem_attention_batch; last the step's kernels alone (products and
 * attention, the engine's order) at 1 row over one view and at 8 rows over
 * 8 views: the 8 / 1 ratio they allow the CPU row.
 *
 *   make && gcc -std=c11 -O2 -Iinclude -I. -o /tmp/cpu_step_bytes \
 *       tools/bench/cpu_step_bytes.c build/libkvmem.a \
 *       $(pkg-config --libs liburing numa libxxhash libpcre2-8 jansson) \
 *       -lopenblas -lunistring -lm -lpthread -fopenmp && /tmp/cpu_step_bytes
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <omp.h>

#include "kernels/kernels.h"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The fastest of 200 reads of mb megabytes by two threads: GB/s. */
__attribute__((target("avx512f"))) static double reread(double mb)
{
	const size_t n = (size_t)(mb * 1e6 / 4) & ~(size_t)127;
	float *a = aligned_alloc(64, n * 4), sink = 0;
	double best = 1e9;

	if (!a)
		return 0;
	for (size_t i = 0; i < n; i++)
		a[i] = (float)(i % 1024);
	for (int r = 0; r < 200; r++) {
		const double t0 = now_s();

		#pragma omp parallel num_threads(2) reduction(+ : sink)
		{
			const size_t h = n / 2, lo = omp_get_thread_num() ? h : 0;
			__m512 s0 = _mm512_setzero_ps(), s1 = s0;

			for (size_t i = lo; i < lo + h; i += 32) {
				s0 = _mm512_add_ps(s0, _mm512_load_ps(a + i));
				s1 = _mm512_add_ps(s1, _mm512_load_ps(a + i + 16));
			}
			sink += _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
		}
		const double t = now_s() - t0;

		best = t < best ? t : best;
	}
	free(a);
	return sink == -1 ? 0 : (double)n * 4 / best / 1e9;
}

static const int shape[4][2] = { { 256, 768 }, { 512, 256 }, { 256, 1536 }, { 768, 256 } };

/* One layer's weight of shape p, bf16 values near 1, packed in panels as
 * the engine packs them (kvmem_matmul_panels) or row-major. */
static uint16_t *weight(int p, int packed)
{
	const size_t m = (size_t)shape[p][0] * shape[p][1];
	uint16_t *a = malloc(2 * m), *w;

	for (size_t i = 0; i < m; i++)
		a[i] = (uint16_t)(0x3f80 + i % 64);
	if (!packed)
		return a;
	w = malloc(2 * kvmem_panels_count(shape[p][0], shape[p][1]));
	kvmem_panels_pack(w, a, shape[p][0], shape[p][1]);
	free(a);
	return w;
}

/* The products of a step at n rows over `sets` copies of the weights in
 * turn, packed in panels as the engine packs them (kvmem_matmul_panels) or
 * row-major (kvmem_matmul_bf16w, which gives the same bits): the fastest
 * step and the mean (ms). */
static void products(int n, int sets, int packed, double *best, double *mean)
{
	uint16_t *w[4][6][4];
	float *x = malloc(sizeof(float) * n * 1536), *y = malloc(sizeof(float) * n * 1536);
	double sum = 0;
	const int reps = 400;

	for (int i = 0; i < n * 1536; i++)
		x[i] = (float)(i % 97) * 0.01f;
	for (int s = 0; s < sets; s++)
		for (int l = 0; l < 6; l++)
			for (int p = 0; p < 4; p++)
				w[s][l][p] = weight(p, packed);
	*best = 1e9;
	for (int r = 0; r < reps; r++) {
		const double t0 = now_s();

		for (int l = 0; l < 6; l++)
			for (int p = 0; p < 4; p++)
				if (packed)
					kvmem_matmul_panels(y, x, w[r % sets][l][p], n, shape[p][0],
							    shape[p][1]);
				else
					kvmem_matmul_bf16w(y, x, w[r % sets][l][p], n, shape[p][0],
							   shape[p][1]);
		const double t = now_s() - t0;

		*best = t < *best ? t : *best;
		sum += t;
	}
	*mean = sum / reps * 1e3;
	*best *= 1e3;
	for (int s = 0; s < sets; s++)
		for (int l = 0; l < 6; l++)
			for (int p = 0; p < 4; p++)
				free(w[s][l][p]);
	free(x);
	free(y);
}

/* The step's kernels alone, in the engine's order (a layer: q|k|v, the
 * attention, o, gate|up, down; bf16 panels, one copy of the weights), or
 * with products 0 its attention alone (the embedded model's 2 KV heads of
 * 64, 8 query heads, one query a view, through kvmem_attention_batch as the
 * engine calls it): one row over one view of n_kv keys, or 8 rows over 8
 * views. What is left of a batched step beside them (norms, rope, the rows
 * into the views, the sessions' own parts, the pool's waits) is what keeps
 * the CPU row under the ratio the kernels allow: 8 x (one row) / (8 rows). */
static void kernels(int n, int n_kv, int products, double *best, double *mean)
{
	enum { L = 6, H = 8, HK = 2, D = 64, CAP = 1024 };
	uint16_t *w[L][4];
	float *kv[L][8][2], *x = malloc(sizeof(float) * 8 * 1536), *y = malloc(sizeof(float) * 8 * 1536);
	float *q = malloc(sizeof(float) * 8 * H * D), *out = malloc(sizeof(float) * 8 * H * D);
	int32_t *pos = malloc(sizeof(int32_t) * CAP), qp[8];
	kvmem_att_seq seqs[8];
	double sum = 0;
	const int reps = 300;

	for (int i = 0; i < CAP; i++)
		pos[i] = i;
	for (int i = 0; i < 8 * 1536; i++)
		x[i] = (float)(i % 97) * 0.01f;
	for (int i = 0; i < 8 * H * D; i++)
		q[i] = (float)(i % 11) * 0.05f;
	for (int l = 0; l < L; l++) {
		for (int p = 0; p < 4; p++)
			w[l][p] = products ? weight(p, 1) : NULL;
		for (int v = 0; v < n; v++)
			for (int t = 0; t < 2; t++) {
				kv[l][v][t] = malloc(sizeof(float) * HK * CAP * D);
				for (size_t i = 0; i < (size_t)HK * CAP * D; i++)
					kv[l][v][t][i] = (float)((i * 7 + v) % 13) * 0.1f - 0.6f;
			}
	}
	*best = 1e9;
	for (int r = 0; r < reps; r++) {
		const double t0 = now_s();

		for (int l = 0; l < L; l++) {
			if (products)
				kvmem_matmul_panels(y, x, w[l][0], n, shape[0][0], shape[0][1]);
			for (int v = 0; v < n; v++) {
				qp[v] = n_kv - 1;
				seqs[v] = (kvmem_att_seq){ .q0 = v, .n_q = 1, .q_pos = &qp[v],
							   .k = kv[l][v][0], .v = kv[l][v][1],
							   .kv_pos = pos, .n_kv = n_kv, .kv_stride = CAP };
			}
			kvmem_attention_batch(out, q, seqs, n, H, HK, D, 0.125f);
			for (int p = 1; p < 4 && products; p++)
				kvmem_matmul_panels(y, x, w[l][p], n, shape[p][0], shape[p][1]);
		}
		const double t = now_s() - t0;

		*best = t < *best ? t : *best;
		sum += t;
	}
	*best *= 1e3;
	*mean = sum / reps * 1e3;
	for (int l = 0; l < L; l++) {
		for (int p = 0; p < 4; p++)
			free(w[l][p]);
		for (int v = 0; v < n; v++)
			for (int t = 0; t < 2; t++)
				free(kv[l][v][t]);
	}
	free(x);
	free(y);
	free(q);
	free(out);
	free(pos);
}

int main(void)
{
	double mb = 0, flops1 = 0;

	for (int p = 0; p < 4; p++) {
		mb += 6.0 * shape[p][0] * shape[p][1] * 2 / 1e6;
		flops1 += 6.0 * shape[p][0] * shape[p][1] * 2;
	}
	omp_set_num_threads(2);
	printf("cpu_step_bytes: %d threads; the step's weights %.1f MB (bf16)\n",
	       omp_get_max_threads(), mb);
	for (double s = mb; s <= 8 * mb; s *= 2)
		printf("  %5.1f MB read again and again: %6.1f GB/s\n", s, reread(s));
	for (int n = 1; n <= 8; n += 7)
		for (int sets = 1; sets <= 8; sets *= 2) {
			double best, mean;
			const int packed = sets <= 4;	/* 8: one copy, row-major */
			const int copies = packed ? sets : 1;

			products(n, copies, packed, &best, &mean);
			printf("  products at %d row%s, %d cop%s of the weights in turn (%.1f MB)%s: "
			       "fastest %.3f ms (%.0f GFLOP/s), mean %.3f ms\n", n, n > 1 ? "s" : "",
			       copies, copies > 1 ? "ies" : "y", copies * mb,
			       packed ? "" : ", row-major", best, flops1 * n / best / 1e6, mean);
		}
	for (int n_kv = 140; n_kv <= 320; n_kv += 180) {
		double best, mean;

		kernels(8, n_kv, 0, &best, &mean);
		printf("  attention, 8 views of %d keys, 6 layers: fastest %.3f ms, mean %.3f ms\n",
		       n_kv, best, mean);
	}
	for (int n_kv = 200; n_kv <= 600; n_kv += 100) {
		double b1, m1, b8, m8;

		kernels(1, n_kv, 1, &b1, &m1);
		kernels(8, n_kv, 1, &b8, &m8);
		printf("  the step's kernels alone, views of %d keys: 1 row %.3f ms (mean %.3f), 8 rows "
		       "%.3f ms (mean %.3f): 8 / 1 at most %.2fx (means %.2fx)\n", n_kv, b1, m1, b8, m8,
		       8 * b1 / b8, 8 * m1 / m8);
	}
	return 0;
}

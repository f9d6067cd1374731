// SPDX-License-Identifier: MIT
/*
 * Issue #26's CPU row: the products of one decode step of the embedded
 * model (6 layers: q|k|v, o, gate|up, down; bf16 weights, 11.0 MB) at 1 row
 * (one conversation) and 8 rows (a batched step), through the kernels'
 * pool on two threads as the engine runs them, in the library's two forms:
 * kvmem_matmul_bf16w over w[out][in] as stored (a lane a row of x) and
 * kvmem_matmul_panels over the weights packed once into panels of 32
 * columns (a lane a column; the engine's form since 2026-12-07). First it
 * checks the two against each other and a scalar fmaf chain (same bits).
 *
 * Measured first (commit dcd2177) with the panels kernel here and the
 * engine's matmul of then (lanes along in, a tree at the end): 0.60-0.65
 * of its time at 1 row and at 8 (Documentation/benchmarks.md, "The cpu
 * matmul in panels of columns").
 *
 *   make && gcc -std=c11 -O2 -Iinclude -I. -o /tmp/cpu_panels \
 *       tools/bench/cpu_panels.c build/libkvmem.a \
 *       $(pkg-config --libs liburing numa libxxhash libpcre2-8 jansson) \
 *       -lopenblas -lunistring -lm -lpthread -fopenmp && /tmp/cpu_panels
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>

#include "kernels/kernels.h"

enum { PANEL = 32 };

static const int shape[4][2] = { { 256, 768 }, { 512, 256 }, { 256, 1536 }, { 768, 256 } };

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float bf16_f32(uint16_t b)
{
	union { uint32_t u; float f; } v = { (uint32_t)b << 16 };

	return v.f;
}

/* A packed copy of w[out][in] (NULL if no memory). */
static uint16_t *pack(const uint16_t *w, int in, int out)
{
	uint16_t *p = malloc(2 * kvmem_panels_words(in, out));

	if (p)
		kvmem_panels_pack(p, w, in, out);
	return p;
}

/* Both forms against a scalar fmaf chain, random bf16 weights and rows,
 * 1..8 rows, a width that leaves a partial panel: mismatches. */
static int check(void)
{
	const int in = 256, out = 100, n = 8;
	uint16_t *w = malloc(2 * (size_t)in * out), *pw;
	float *x = malloc(sizeof(float) * n * in), *y = malloc(sizeof(float) * n * out);
	int bad = 0;

	srand(1);
	for (int i = 0; i < in * out; i++)
		w[i] = (uint16_t)((0x3c00 + rand() % 0x800) | (rand() & 1 ? 0x8000 : 0));
	for (int i = 0; i < n * in; i++)
		x[i] = (float)rand() / RAND_MAX - 0.5f;
	pw = pack(w, in, out);
	for (int rows = 1; pw && rows <= n; rows++) {
		float *z = malloc(sizeof(float) * n * out);

		kvmem_matmul_panels(y, x, pw, rows, in, out);
		if (z)
			kvmem_matmul_bf16w(z, x, w, rows, in, out);
		bad += !z || memcmp(y, z, sizeof(float) * rows * out) != 0;
		free(z);
		for (int r = 0; r < rows; r++)
			for (int c = 0; c < out; c++) {
				float a = 0;

				for (int k = 0; k < in; k++)
					a = __builtin_fmaf(x[r * in + k], bf16_f32(w[c * in + k]), a);
				bad += memcmp(&a, &y[r * out + c], sizeof(a)) != 0;
			}
	}
	free(w);
	free(pw);
	free(x);
	free(y);
	return pw ? bad : -1;
}

/* A step's 24 products at n rows, 400 times: fastest and mean, ms. */
static void products(int n, int packed, double *best, double *mean)
{
	uint16_t *w[6][4];
	float *x = malloc(sizeof(float) * n * 1536), *y = malloc(sizeof(float) * n * 1536);
	double sum = 0;
	const int reps = 400;

	for (int i = 0; i < n * 1536; i++)
		x[i] = (float)(i % 97) * 0.01f;
	for (int l = 0; l < 6; l++)
		for (int p = 0; p < 4; p++) {
			const size_t m = (size_t)shape[p][0] * shape[p][1];
			uint16_t *a = malloc(2 * m);

			for (size_t i = 0; i < m; i++)	/* bf16 values near 1 */
				a[i] = (uint16_t)(0x3f80 + i % 64);
			w[l][p] = packed ? pack(a, shape[p][0], shape[p][1]) : a;
			if (packed)
				free(a);
		}
	*best = 1e9;
	for (int r = 0; r < reps; r++) {
		const double t0 = now_s();

		for (int l = 0; l < 6; l++)
			for (int p = 0; p < 4; p++)
				if (packed)
					kvmem_matmul_panels(y, x, w[l][p], n, shape[p][0], shape[p][1]);
				else
					kvmem_matmul_bf16w(y, x, w[l][p], n, shape[p][0], shape[p][1]);
		const double t = now_s() - t0;

		*best = t < *best ? t : *best;
		sum += t;
	}
	*mean = sum / reps * 1e3;
	*best *= 1e3;
	for (int l = 0; l < 6; l++)
		for (int p = 0; p < 4; p++)
			free(w[l][p]);
	free(x);
	free(y);
}

int main(void)
{
	double flops1 = 0;

	for (int p = 0; p < 4; p++)
		flops1 += 6.0 * shape[p][0] * shape[p][1] * 2;
	omp_set_num_threads(2);
	printf("cpu_panels: %d threads, matmul %s; the two forms against each other and a scalar "
	       "fmaf chain at 1..8 rows: %d mismatches\n", omp_get_max_threads(), kvmem_matmul_isa(), check());
	for (int round = 0; round < 2; round++)
		for (int n = 1; n <= 8; n += 7) {
			double b0, m0, b1, m1;

			products(n, 0, &b0, &m0);
			products(n, 1, &b1, &m1);
			printf("  %d row%s: row-major %.3f ms (%.0f GFLOP/s), mean %.3f | panels %.3f ms "
			       "(%.0f GFLOP/s), mean %.3f | panels / row-major %.2f (means %.2f)\n", n,
			       n > 1 ? "s" : " ", b0, flops1 * n / b0 / 1e6, m0, b1,
			       flops1 * n / b1 / 1e6, m1, b1 / b0, m1 / m0);
		}
	return 0;
}

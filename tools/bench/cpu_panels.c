// SPDX-License-Identifier: MIT
/*
 * Issue #26's CPU row: the products of one decode step of the embedded
 * model (6 layers: q|k|v, o, gate|up, down; bf16 weights, 11.0 MB) at 1 row
 * (one conversation) and 8 rows (a batched step), by the engine's matmul
 * (kvmem_matmul_bf16w: w[out][in], lanes along in, a tree over the lanes
 * at the end) beside a form measured here and not in the engine: the
 * weights packed once into panels of 32 columns, one 64-byte line a step
 * of in, so that a lane is an output column and a tile of 8 rows x 32
 * columns keeps 16 sums in registers with no reduction at its end.
 *
 * The packed form's element is one chain of fused multiply-adds over in,
 * in order: other bits than the engine's (checked here against a scalar
 * fmaf chain at 1..8 rows: a row's bits do not depend on the tile, so
 * batch invariance would hold). Both forms run through the kernels' pool
 * on two threads, as the engine runs them. What it says: the form is
 * quicker at 1 and at 8 rows alike, so it would speed the lone step and
 * the batch and lower the 8 / 1 ratio (Documentation/benchmarks.md, "A
 * matmul in panels of columns, measured and not built").
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

#pragma GCC optimize("O3")
#define LOOP _Pragma("GCC unroll 16") for
#define T512 __attribute__((target("avx512f,avx512bw,fma"), always_inline)) static inline

enum { PANEL = 32, CHUNK = 4 /* panels a pool item takes */ };

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

/* w[out][in] into panels of 32 columns, a step of in at a time. The words
 * of a step are placed so that unpacking them with zeros (vpunpcklwd and
 * vpunpckhwd, which work within each 128-bit block) gives columns 0-15 and
 * 16-31 as fp32 in order: column c < 16 sits at block c / 4, word c % 4;
 * column 16 + c at block c / 4, word 4 + c % 4. Missing columns are zeros. */
static uint16_t *pack(const uint16_t *w, int in, int out)
{
	const int np = (out + PANEL - 1) / PANEL;
	uint16_t *p = aligned_alloc(64, (size_t)np * in * PANEL * 2);

	if (!p)
		return NULL;
	for (int q = 0; q < np; q++)
		for (int k = 0; k < in; k++) {
			uint16_t *d = p + ((size_t)q * in + k) * PANEL;

			for (int c = 0; c < PANEL; c++) {
				const int col = q * PANEL + c, lo = c % 16;

				d[(lo / 4) * 8 + (c / 16) * 4 + lo % 4] =
					col < out ? w[(size_t)col * in + k] : 0;
			}
		}
	return p;
}

/* MR rows x NP panels: y[r][c] = the chain fma(x[r][k], w[k][c], .) over k. */
T512 void tile(float *y, int ldy, const float *x, const uint16_t *pw, int in, int ncol,
	       const int MR, const int NP)
{
	__m512 acc[8][4][2];
	const __m512i z = _mm512_setzero_si512();

	LOOP (int r = 0; r < MR; r++)
		LOOP (int p = 0; p < NP; p++)
			acc[r][p][0] = acc[r][p][1] = _mm512_setzero_ps();
	for (int k = 0; k < in; k++) {
		__m512 lo[4], hi[4];

		LOOP (int p = 0; p < NP; p++) {
			const __m512i v = _mm512_load_si512(pw + ((size_t)p * in + k) * PANEL);

			lo[p] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, v));
			hi[p] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, v));
		}
		LOOP (int r = 0; r < MR; r++) {
			const __m512 xb = _mm512_set1_ps(x[(size_t)r * in + k]);

			LOOP (int p = 0; p < NP; p++) {
				acc[r][p][0] = _mm512_fmadd_ps(xb, lo[p], acc[r][p][0]);
				acc[r][p][1] = _mm512_fmadd_ps(xb, hi[p], acc[r][p][1]);
			}
		}
	}
	LOOP (int r = 0; r < MR; r++)
		LOOP (int p = 0; p < NP; p++) {
			float t[PANEL], *o = y + (size_t)r * ldy + p * PANEL;
			const int left = ncol - p * PANEL;

			_mm512_storeu_ps(t, acc[r][p][0]);
			_mm512_storeu_ps(t + 16, acc[r][p][1]);
			memcpy(o, t, sizeof(float) * (size_t)(left < PANEL ? left : PANEL));
		}
}

struct job {
	float *y;
	const float *x;
	const uint16_t *pw;
	int n, in, out;
};

/* CHUNK panels for every row: 8 rows a tile, fewer rows one at a time over
 * up to 4 panels (a lone row's 8 chains hide the multiply-add's latency). */
__attribute__((target("avx512f,avx512bw,fma")))
static void run_chunk(void *arg, int chunk)
{
	const struct job *j = arg;
	const int np = (j->out + PANEL - 1) / PANEL;
	const int p0 = chunk * CHUNK, p1 = p0 + CHUNK < np ? p0 + CHUNK : np;

	for (int r0 = 0; r0 < j->n; r0 += 8) {
		const int mr = j->n - r0 < 8 ? j->n - r0 : 8;

		for (int p = p0; p < p1;) {
			const uint16_t *pw = j->pw + (size_t)p * j->in * PANEL;
			float *y = j->y + (size_t)r0 * j->out + p * PANEL;
			const float *x = j->x + (size_t)r0 * j->in;
			const int ncol = j->out - p * PANEL, wide = p + 4 <= p1;

			if (mr == 8) {
				tile(y, j->out, x, pw, j->in, ncol, 8, 1);
				p++;
				continue;
			}
			for (int r = 0; r < mr; r++)
				if (wide)
					tile(y + (size_t)r * j->out, j->out, x + (size_t)r * j->in, pw,
					     j->in, ncol, 1, 4);
				else
					tile(y + (size_t)r * j->out, j->out, x + (size_t)r * j->in, pw,
					     j->in, ncol, 1, 1);
			p += wide ? 4 : 1;
		}
	}
}

static void matmul_panels(float *y, const float *x, const uint16_t *pw, int n, int in, int out)
{
	struct job j = { y, x, pw, n, in, out };
	const int np = (out + PANEL - 1) / PANEL;

	kvmem_pool_run((np + CHUNK - 1) / CHUNK, run_chunk, &j);
}

/* The packed form against a scalar fmaf chain, random bf16 weights and
 * rows, 1..8 rows, a width that leaves a partial panel: mismatches. */
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
		matmul_panels(y, x, pw, rows, in, out);
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
					matmul_panels(y, x, w[l][p], n, shape[p][0], shape[p][1]);
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

	__builtin_cpu_init();
	if (!__builtin_cpu_supports("avx512bw")) {
		fprintf(stderr, "cpu_panels: this CPU has no AVX-512 BW; the packed form needs it\n");
		return 1;
	}
	for (int p = 0; p < 4; p++)
		flops1 += 6.0 * shape[p][0] * shape[p][1] * 2;
	omp_set_num_threads(2);
	printf("cpu_panels: %d threads, matmul %s; the packed form against a scalar fmaf chain at "
	       "1..8 rows: %d mismatches\n", omp_get_max_threads(), kvmem_matmul_isa(), check());
	for (int round = 0; round < 2; round++)
		for (int n = 1; n <= 8; n += 7) {
			double b0, m0, b1, m1;

			products(n, 0, &b0, &m0);
			products(n, 1, &b1, &m1);
			printf("  %d row%s: engine %.3f ms (%.0f GFLOP/s), mean %.3f | panels %.3f ms "
			       "(%.0f GFLOP/s), mean %.3f | panels / engine %.2f (means %.2f)\n", n,
			       n > 1 ? "s" : " ", b0, flops1 * n / b0 / 1e6, m0, b1,
			       flops1 * n / b1 / 1e6, m1, b1 / b0, m1 / m0);
		}
	return 0;
}

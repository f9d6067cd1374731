// SPDX-License-Identifier: MIT
/*
 * The engine's products over its own bf16 weights, packed once into panels
 * of 32 output columns: panel q holds, for k = 0 .. in - 1 in turn, the 32
 * weights w[32 q + c][k] (64 bytes, a cache line), so a lane is a column
 * and a tile of 8 rows x 32 columns keeps its 16 vectors of sums in
 * registers for the whole of in, with no reduction across lanes at its
 * end. Each element is the chain matmul.c defines (fused multiply-adds
 * over in, in order): kvmem_matmul_panels has kvmem_matmul_bf16w's bits
 * over the same weights in under half its time (it transposes as it goes),
 * and took 0.60-0.65 of the time of the matmul before it (lanes along in,
 * a tree at the end) at one row and at eight on the build machine
 * (tools/bench/cpu_panels.c at dcd2177; issue #26).
 *
 * Within a step the words are placed for the unpack that widens them:
 * vpunpcklwd / vpunpckhwd with zeros work within each 128-bit block, so
 * column c < 16 sits at block c / 4, word c % 4, and column 16 + c at
 * block c / 4, word 4 + c % 4; then the low unpack of the 64 bytes is
 * columns 0-15 as fp32, in order, the high one 16-31 (AVX2 takes each
 * 32-byte half: columns 0-7 and 16-23, then 8-15 and 24-31). Columns past
 * out are zeros.
 *
 * Weights that are not bf16 values (an fp32 checkpoint's) pack as fp32
 * panels the same way, 128 bytes a step with the columns in order, for the
 * same chains (kvmem_matmul_panels_f32): a row-major product would
 * transpose them at every call.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/matmul.h"
#include "kernels/kernels.h"

#pragma GCC optimize("O3")

enum { PANEL = 32, CHUNK = 4 /* panels a thread's item takes */ };

#define LOOP _Pragma("GCC unroll 16") for

/* Where column c (0..31) of a panel's step sits among its 32 words. */
static int word_of(int c)
{
	const int lo = c % 16;

	return (lo / 4) * 8 + (c / 16) * 4 + lo % 4;
}

static int panels_of(int out)
{
	return (out + PANEL - 1) / PANEL;
}

size_t kvmem_panels_count(int in, int out)
{
	return in > 0 && out > 0 ? (size_t)panels_of(out) * in * PANEL : 0;
}

/* w[out][in] (bf16 when b16, else fp32) into panels at dst. */
static void pack(void *dst, const void *w, int b16, int in, int out)
{
	for (int q = 0; q < panels_of(out); q++)
		for (int k = 0; k < in; k++)
			for (int c = 0; c < PANEL; c++) {
				const int col = q * PANEL + c;
				const size_t from = (size_t)col * in + k;
				const size_t to = ((size_t)q * in + k) * PANEL + (size_t)(b16 ? word_of(c) : c);

				if (b16)
					((uint16_t *)dst)[to] = col < out ? ((const uint16_t *)w)[from] : 0;
				else
					((float *)dst)[to] = col < out ? ((const float *)w)[from] : 0.0f;
			}
}

void kvmem_panels_pack(uint16_t *dst, const uint16_t *w, int in, int out)
{
	pack(dst, w, 1, in, out);
}

void kvmem_panels_pack_f32(float *dst, const float *w, int in, int out)
{
	pack(dst, w, 0, in, out);
}

/* The MR x 32 NP sums, the columns up to ncol, into y. */
static void store_sums(float *y, int ldy, const float *t, int MR, int NP, int ncol)
{
	for (int r = 0; r < MR; r++)
		for (int p = 0; p < NP; p++) {
			const int left = ncol - p * PANEL;

			if (left > 0)
				memcpy(y + (size_t)r * ldy + p * PANEL, t + (r * NP + p) * PANEL,
				       sizeof(float) * (size_t)(left < PANEL ? left : PANEL));
		}
}

/* ---- AVX-512 ------------------------------------------------------------ */
#define T512 __attribute__((target("avx512f,avx512bw,fma"), always_inline)) static inline

/* MR rows x NP panels (MR * NP * 2 sums in registers; 8 x 1 for a batch,
 * 1 x 4 for one row, whose 8 chains hide the multiply-add's latency). */
T512 void tile512(float *y, int ldy, const float *x, int ldx, const void *pw, int in, int ncol,
		  const int MR, const int NP, const int B16)
{
	__m512 acc[8][4][2];
	const __m512i z = _mm512_setzero_si512();
	float t[8 * 4 * PANEL];

	LOOP (int r = 0; r < MR; r++)
		LOOP (int p = 0; p < NP; p++)
			acc[r][p][0] = acc[r][p][1] = _mm512_setzero_ps();
	for (int k = 0; k < in; k++) {
		__m512 lo[4], hi[4];

		LOOP (int p = 0; p < NP; p++) {
			const size_t at = ((size_t)p * in + k) * PANEL;

			if (B16) {
				const __m512i v = _mm512_loadu_si512((const uint16_t *)pw + at);

				lo[p] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, v));
				hi[p] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, v));
			} else {
				lo[p] = _mm512_loadu_ps((const float *)pw + at);
				hi[p] = _mm512_loadu_ps((const float *)pw + at + 16);
			}
		}
		LOOP (int r = 0; r < MR; r++) {
			const __m512 xb = _mm512_set1_ps(x[(size_t)r * ldx + k]);

			LOOP (int p = 0; p < NP; p++) {
				acc[r][p][0] = _mm512_fmadd_ps(xb, lo[p], acc[r][p][0]);
				acc[r][p][1] = _mm512_fmadd_ps(xb, hi[p], acc[r][p][1]);
			}
		}
	}
	LOOP (int r = 0; r < MR; r++)
		LOOP (int p = 0; p < NP; p++) {
			_mm512_storeu_ps(t + (r * NP + p) * PANEL, acc[r][p][0]);
			_mm512_storeu_ps(t + (r * NP + p) * PANEL + 16, acc[r][p][1]);
		}
	store_sums(y, ldy, t, MR, NP, ncol);
}

/* Panels q0..q1 for every row: eight rows a tile, the rest one by one
 * over up to four panels. */
T512 void panels512_t(float *y, const float *x, const void *pw, int n, int in, int out, int q0,
		      int q1, const int B16)
{
	const size_t esz = B16 ? 2 : 4;
	int r = 0;

	for (; r + 8 <= n; r += 8)
		for (int q = q0; q < q1; q++)
			tile512(y + (size_t)r * out + q * PANEL, out, x + (size_t)r * in, in,
				(const char *)pw + (size_t)q * in * PANEL * esz, in, out - q * PANEL,
				8, 1, B16);
	for (; r < n; r++)
		for (int q = q0; q < q1;) {
			float *yr = y + (size_t)r * out + q * PANEL;
			const float *xr = x + (size_t)r * in;
			const void *pq = (const char *)pw + (size_t)q * in * PANEL * esz;

			if (q + 4 <= q1) {
				tile512(yr, out, xr, in, pq, in, out - q * PANEL, 1, 4, B16);
				q += 4;
			} else {
				tile512(yr, out, xr, in, pq, in, out - q * PANEL, 1, 1, B16);
				q++;
			}
		}
}

__attribute__((target("avx512f,avx512bw,fma")))
static void panels512(float *y, const float *x, const void *pw, int b16, int n, int in, int out,
		      int q0, int q1)
{
	if (b16)
		panels512_t(y, x, pw, n, in, out, q0, q1, 1);
	else
		panels512_t(y, x, pw, n, in, out, q0, q1, 0);
}

/* ---- AVX2 + FMA --------------------------------------------------------- */
#define T256 __attribute__((target("avx2,fma"), always_inline)) static inline

/* MR rows x one panel: four vectors of 8 columns a row. */
T256 void tile256(float *y, int ldy, const float *x, int ldx, const void *pw, int in, int ncol,
		  const int MR, const int B16)
{
	__m256 acc[2][4];
	const __m256i z = _mm256_setzero_si256();
	float t[2 * PANEL];

	LOOP (int r = 0; r < MR; r++)
		LOOP (int j = 0; j < 4; j++)
			acc[r][j] = _mm256_setzero_ps();
	for (int k = 0; k < in; k++) {
		__m256 wv[4];	/* columns 0-7, 8-15, 16-23, 24-31 */

		if (B16) {
			const uint16_t *pk = (const uint16_t *)pw + (size_t)k * PANEL;
			const __m256i h0 = _mm256_loadu_si256((const __m256i *)pk);
			const __m256i h1 = _mm256_loadu_si256((const __m256i *)(pk + 16));

			wv[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, h0));
			wv[1] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, h1));
			wv[2] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, h0));
			wv[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, h1));
		} else {
			LOOP (int j = 0; j < 4; j++)
				wv[j] = _mm256_loadu_ps((const float *)pw + (size_t)k * PANEL + 8 * j);
		}

		LOOP (int r = 0; r < MR; r++) {
			const __m256 xb = _mm256_set1_ps(x[(size_t)r * ldx + k]);

			LOOP (int j = 0; j < 4; j++)
				acc[r][j] = _mm256_fmadd_ps(xb, wv[j], acc[r][j]);
		}
	}
	LOOP (int r = 0; r < MR; r++)
		LOOP (int j = 0; j < 4; j++)
			_mm256_storeu_ps(t + r * PANEL + 8 * j, acc[r][j]);
	store_sums(y, ldy, t, MR, 1, ncol);
}

T256 void panels256_t(float *y, const float *x, const void *pw, int n, int in, int out, int q0,
		      int q1, const int B16)
{
	for (int q = q0; q < q1; q++) {
		const void *pq = (const char *)pw + (size_t)q * in * PANEL * (B16 ? 2 : 4);
		int r = 0;

		for (; r + 2 <= n; r += 2)
			tile256(y + (size_t)r * out + q * PANEL, out, x + (size_t)r * in, in, pq, in,
				out - q * PANEL, 2, B16);
		if (r < n)
			tile256(y + (size_t)r * out + q * PANEL, out, x + (size_t)r * in, in, pq, in,
				out - q * PANEL, 1, B16);
	}
}

__attribute__((target("avx2,fma")))
static void panels256(float *y, const float *x, const void *pw, int b16, int n, int in, int out,
		      int q0, int q1)
{
	if (b16)
		panels256_t(y, x, pw, n, in, out, q0, q1, 1);
	else
		panels256_t(y, x, pw, n, in, out, q0, q1, 0);
}

/* ---- plain C: the chain, read through the panel's stride ---------------- */
static void panels_c(float *y, const float *x, const void *pw, int b16, int n, int in, int out,
		     int q0, int q1)
{
	for (int q = q0; q < q1; q++)
		for (int c = 0; c < PANEL && q * PANEL + c < out; c++) {
			const size_t at = (size_t)q * in * PANEL + (size_t)(b16 ? word_of(c) : c);

			for (int r = 0; r < n; r++)
				y[(size_t)r * out + q * PANEL + c] = kvmem_matmul_chain(
					x + (size_t)r * in, (const char *)pw + at * (b16 ? 2 : 4), b16,
					PANEL, in);
		}
}

struct panels_job {
	float *y;
	const float *x;
	const void *pw;
	int b16, n, in, out, level;
};

static void panels_chunk(void *arg, int chunk)
{
	const struct panels_job *a = arg;
	const int q0 = chunk * CHUNK, np = panels_of(a->out), q1 = q0 + CHUNK < np ? q0 + CHUNK : np;

	if (a->level == 16)
		panels512(a->y, a->x, a->pw, a->b16, a->n, a->in, a->out, q0, q1);
	else if (a->level == 8)
		panels256(a->y, a->x, a->pw, a->b16, a->n, a->in, a->out, q0, q1);
	else
		panels_c(a->y, a->x, a->pw, a->b16, a->n, a->in, a->out, q0, q1);
}

static void matmul_panels(float *y, const float *x, const void *p, int b16, int n, int in, int out)
{
	struct panels_job a = { y, x, p, b16, n, in, out, 0 };

	if (kvmem_matmul_empty(y, n, in, out))
		return;
	a.level = kvmem_matmul_level();
	kvmem_matmul_threads((long)n * in * out, (panels_of(out) + CHUNK - 1) / CHUNK, panels_chunk,
			     &a);
}

void kvmem_matmul_panels(float *y, const float *x, const uint16_t *p, int n, int in, int out)
{
	matmul_panels(y, x, p, 1, n, in, out);
}

void kvmem_matmul_panels_f32(float *y, const float *x, const float *p, int n, int in, int out)
{
	matmul_panels(y, x, p, 0, n, in, out);
}

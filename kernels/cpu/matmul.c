// SPDX-License-Identifier: MIT
/*
 * The engine's matmul, y[n][out] = x[n][in] · w[out][in]^T, with every
 * row's arithmetic independent of the batch: a row of y has the same bits
 * whether it is computed alone (one session's decode step), among the
 * rows of a prefill chunk, or beside other sessions' rows in a batched
 * forward (user/engine/engine.c). That is what batch invariance needs and
 * what a BLAS GEMM does not promise (OpenBLAS picks kernels, blockings and
 * a GEMV by the shape, so a row's sums may be grouped differently at
 * another n).
 *
 * One output element is always the same sequence of operations: V lanes
 * of running sums over in (lane j takes k = j, j + V, ...; fused
 * multiply-adds, in order of k; the last partial vector's missing lanes
 * are zeros), then a fixed tree over the lanes. Tiles of MR rows x NC
 * columns (two shapes for AVX2, chosen by the row count) only decide
 * which elements share a loaded vector, never how an element is summed,
 * so the tile shape, the row blocking, the thread that owns a column
 * and the thread count change no bit. Threads split the output columns
 * (OpenMP, static; the kernels' pool for mid-sized products, in chunks
 * of POOL_COLS); a weight tile is read once for all the rows of a row
 * block, which is where batching saves time: decode reads every weight
 * once per step for all its sessions.
 *
 * V depends on the instruction set, chosen once per process: 16 (AVX-512),
 * 8 (AVX2 with FMA), 8 (plain C: multiply, then add). So bits differ
 * between machines, never between calls of one process.
 *
 * kvmem_matmul_bf16w takes the weights as bf16 and widens each vector in
 * registers before the same multiply-adds: a bf16 value widened is exact, so
 * its bits are kvmem_matmul's over the fp32 copy of the same weights, for
 * half the bytes read. Decode reads every weight once a step, so the bytes
 * are its time (the embedded model's 22.8 MB as fp32, 11.4 as bf16). Every
 * tile below takes the weights' element type as a constant (B16), so each
 * form is compiled twice, once per type.
 */
#include <errno.h>
#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/bits.h"
#include "kernels/kernels.h"

#pragma GCC optimize("O3")

enum { ISA_C = 0, ISA_AVX2, ISA_AVX512 };
static const char *const isa_names[] = { "c", "avx2", "avx512" };
static int isa_chosen = -1;
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

/* Rows per block: the block's x rows stay in L2 while every column tile
 * of the thread passes over them. */
#define ROW_BLOCK 64
/* Below POOL_MACS multiply-adds one thread is quicker than waking
 * another; from it (a lone decode step's gate|up, 1 x 256 x 1536 for the
 * embedded model, and a batched step's products, 8 rows x 256 x 768 to
 * 8 x 256 x 1536) the kernels' pool runs the columns, whose caller does
 * not wait for a worker to wake; from THREADED_MACS (prefill chunks)
 * OpenMP. The batched step's gate|up at 8 rows, 3.1M, ran 5-15 % slower
 * on OpenMP than in the pool here (issue #26). */
#define THREADED_MACS (1L << 23)
#define POOL_MACS (1L << 18)
/* Columns a pool chunk takes (a multiple of every tile width: 3, 4, 6). */
#define POOL_COLS 24

#define LOOP _Pragma("GCC unroll 16") for

/* ---- AVX-512: 16 lanes, tiles of 4 rows x 6 columns ------------------- */
#define T512 __attribute__((target("avx512f,fma"), always_inline)) static inline

/* Weight element at index i of w (fp32, or bf16 when B16), as bytes. */
#define W_AT(w, i, B16) ((const char *)(w) + (size_t)(i) * ((B16) ? 2 : 4))

/* 16 weights from w at index i, widened from bf16 when B16. */
T512 __m512 wload16(const void *w, size_t i, const int B16)
{
	if (!B16)
		return _mm512_loadu_ps((const float *)w + i);
	return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
		_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i))), 16));
}

/* The last n < 16 weights from index i, zeros after them. */
T512 __m512 wtail16(const void *w, size_t i, int n, const int B16)
{
	if (!B16)
		return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), (const float *)w + i);
	uint16_t t[16] = { 0 };

	memcpy(t, (const uint16_t *)w + i, sizeof(uint16_t) * (size_t)n);
	return wload16(t, 0, 1);
}

T512 float hsum16(__m512 v)
{
	__m256 a = _mm256_add_ps(_mm512_castps512_ps256(v),
				 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
	__m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));

	b = _mm_add_ps(b, _mm_movehl_ps(b, b));
	b = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
	return _mm_cvtss_f32(b);
}

/* Two vectors' halves summed, u's in lanes 0-7, v's in 8-15 (a block is
 * 128 bits; the imm picks blocks of u, u, v, v). */
#define HALVES(u, v, lo, hi) _mm512_add_ps(_mm512_shuffle_f32x4(u, v, lo), \
					   _mm512_shuffle_f32x4(u, v, hi))
#define PAIRS(u, v, lo, hi) _mm512_add_ps(_mm512_shuffle_ps(u, v, lo), _mm512_shuffle_ps(u, v, hi))

/*
 * A 4 x 6 tile's 24 sums stored with hsum16's bits, reduced side by side:
 * hsum16 adds lanes i and i + 8, then i and i + 4, then i and i + 2, then 0
 * and 1; here each level does that for several sums in one add (their
 * lanes moved beside each other first), so the adds and their operands are
 * the same, in about 40 % of the instructions. At 256 inputs each sum is 16
 * multiply-adds, and hsum16 took 9 instructions more (a 58-row product:
 * 4.43 -> 4.17 ms, issue #26). Columns 0-3 (16 sums, j = 4 c + r) end with row r's
 * four in block r; columns 4-5 (8 sums) with row r's two at the start of
 * block r.
 */
T512 void store4x6(float *y, int ldy, __m512 acc[4][6])
{
	__m512 a[8], b[4], c[2], f;

	for (int j = 0; j < 8; j++)	/* lanes i + i + 8 */
		a[j] = HALVES(acc[(2 * j) % 4][(2 * j) / 4], acc[(2 * j + 1) % 4][(2 * j + 1) / 4],
			      0x44, 0xEE);
	for (int j = 0; j < 4; j++)	/* i + i + 4 */
		b[j] = HALVES(a[2 * j], a[2 * j + 1], 0x88, 0xDD);
	for (int j = 0; j < 2; j++)	/* i + i + 2 */
		c[j] = PAIRS(b[2 * j], b[2 * j + 1], 0x44, 0xEE);
	f = PAIRS(c[0], c[1], 0x88, 0xDD);	/* 0 + 1 */
	_mm_storeu_ps(y, _mm512_extractf32x4_ps(f, 0));
	_mm_storeu_ps(y + (size_t)ldy, _mm512_extractf32x4_ps(f, 1));
	_mm_storeu_ps(y + (size_t)2 * ldy, _mm512_extractf32x4_ps(f, 2));
	_mm_storeu_ps(y + (size_t)3 * ldy, _mm512_extractf32x4_ps(f, 3));

	/* columns 4 and 5: sums j = 4 (c - 4) + r */
	for (int j = 0; j < 4; j++)
		a[j] = HALVES(acc[(2 * j) % 4][4 + (2 * j) / 4],
			      acc[(2 * j + 1) % 4][4 + (2 * j + 1) / 4], 0x44, 0xEE);
	for (int j = 0; j < 2; j++)
		b[j] = HALVES(a[2 * j], a[2 * j + 1], 0x88, 0xDD);
	c[0] = PAIRS(b[0], b[1], 0x44, 0xEE);
	f = PAIRS(c[0], c[0], 0x88, 0xDD);
	_mm_storel_pi((__m64 *)(y + 4), _mm512_extractf32x4_ps(f, 0));
	_mm_storel_pi((__m64 *)(y + (size_t)ldy + 4), _mm512_extractf32x4_ps(f, 1));
	_mm_storel_pi((__m64 *)(y + (size_t)2 * ldy + 4), _mm512_extractf32x4_ps(f, 2));
	_mm_storel_pi((__m64 *)(y + (size_t)3 * ldy + 4), _mm512_extractf32x4_ps(f, 3));
}

T512 void tile16(float *y, int ldy, const float *x, const void *w, int in, const int MR,
		 const int NC, const void *pf, const int B16)
{
	__m512 acc[4][6], xv[4];
	int k = 0;

	LOOP (int r = 0; r < MR; r++)
		LOOP (int c = 0; c < NC; c++)
			acc[r][c] = _mm512_setzero_ps();
	for (; k + 16 <= in; k += 16) {
		LOOP (int r = 0; r < MR; r++)
			xv[r] = _mm512_loadu_ps(x + (size_t)r * in + k);
		LOOP (int c = 0; c < NC; c++) {
			__m512 wv = wload16(w, (size_t)c * in + k, B16);

			if (pf)
				_mm_prefetch(W_AT(pf, (size_t)c * in + k, B16), _MM_HINT_T0);
			LOOP (int r = 0; r < MR; r++)
				acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
		}
	}
	if (k < in) {
		__mmask16 m = (__mmask16)((1u << (in - k)) - 1);

		LOOP (int r = 0; r < MR; r++)
			xv[r] = _mm512_maskz_loadu_ps(m, x + (size_t)r * in + k);
		LOOP (int c = 0; c < NC; c++) {
			__m512 wv = wtail16(w, (size_t)c * in + k, in - k, B16);

			LOOP (int r = 0; r < MR; r++)
				acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
		}
	}
	if (MR == 4 && NC == 6) {
		store4x6(y, ldy, acc);
		return;
	}
	LOOP (int r = 0; r < MR; r++)
		LOOP (int c = 0; c < NC; c++)
			y[(size_t)r * ldy + c] = hsum16(acc[r][c]);
}

T512 void cols16_t(float *y, const float *x, const void *w, int n, int in, int out, int c0,
		  int c1, const int B16)
{
	for (int r0 = 0; r0 < n; r0 += ROW_BLOCK) {
		int r1 = n - r0 < ROW_BLOCK ? n : r0 + ROW_BLOCK, c = c0;

		for (; c + 6 <= c1; c += 6) {
			/* The first row group reads the weight tile from memory:
			 * it asks for the lines of the tile after next meanwhile
			 * (decode streams every weight once a step; the
			 * multiply-adds then overlap the reads). */
			const void *next = c + 18 <= c1 ? W_AT(w, (size_t)(c + 12) * in, B16) : NULL;
			const void *wc = W_AT(w, (size_t)c * in, B16);
			int r = r0;

			for (; r + 4 <= r1; r += 4, next = NULL)
				tile16(y + (size_t)r * out + c, out, x + (size_t)r * in, wc, in, 4, 6,
				       next, B16);
			for (; r < r1; r++, next = NULL)
				tile16(y + (size_t)r * out + c, out, x + (size_t)r * in, wc, in, 1, 6,
				       next, B16);
		}
		for (; c < c1; c++) {
			const void *wc = W_AT(w, (size_t)c * in, B16);
			int r = r0;

			for (; r + 4 <= r1; r += 4)
				tile16(y + (size_t)r * out + c, out, x + (size_t)r * in, wc, in, 4, 1,
				       NULL, B16);
			for (; r < r1; r++)
				tile16(y + (size_t)r * out + c, out, x + (size_t)r * in, wc, in, 1, 1,
				       NULL, B16);
		}
	}
}

__attribute__((target("avx512f,fma")))
static void cols16(float *y, const float *x, const void *w, int n, int in, int out, int c0,
		   int c1, int b16)
{
	if (b16)
		cols16_t(y, x, w, n, in, out, c0, c1, 1);
	else
		cols16_t(y, x, w, n, in, out, c0, c1, 0);
}

/* ---- AVX2 + FMA: 8 lanes ------------------------------------------------
 * Two tile shapes, one arithmetic per element. Three or more rows (a
 * batched decode step, a prefill chunk) take tiles of 4 rows x 3 columns
 * with the weights in registers (12 sums + 3 + 1 = all 16 registers); one
 * or two rows take tiles of 1-2 rows x 4 columns, whose x rows sit in
 * registers and which keep more sums in flight than 1-2 x 3 would. */
#define T256 __attribute__((target("avx2,fma"), always_inline)) static inline

/* Tiles of 4 x 3 ask for the weights this many tiles ahead, at every step
 * of 8. The embedded model's decode step at 8 rows, 1 thread (its
 * matmuls, 22.8 MB of weights from memory): 1.42-1.45 ms at four,
 * 1.45-1.75 at two, 2.6-2.7 asking for none; asking once a line (every
 * other step) was 1-3 % quicker with the weights in L2 and up to 40 %
 * slower from memory. */
#define AHEAD_R4 4

/* in - k lanes of ones, then zeros: masked loads read nothing past the row. */
static const int32_t lane_ones[16] = { -1, -1, -1, -1, -1, -1, -1, -1 };

/* 8 weights from w at index i, widened from bf16 when B16. */
T256 __m256 wload8(const void *w, size_t i, const int B16)
{
	if (!B16)
		return _mm256_loadu_ps((const float *)w + i);
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
		_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i))), 16));
}

/* The last n < 8 weights from index i (lanes m), zeros after them. */
T256 __m256 wtail8(const void *w, size_t i, int n, __m256i m, const int B16)
{
	if (!B16)
		return _mm256_maskload_ps((const float *)w + i, m);
	uint16_t t[8] = { 0 };

	memcpy(t, (const uint16_t *)w + i, sizeof(uint16_t) * (size_t)n);
	return wload8(t, 0, 1);
}

T256 float hsum8(__m256 v)
{
	__m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	b = _mm_add_ps(b, _mm_movehl_ps(b, b));
	b = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
	return _mm_cvtss_f32(b);
}

/* x rows in registers, each weight vector loaded once for them (MR <= 2). */
T256 void tile8(float *y, int ldy, const float *x, const void *w, int in, const int MR,
		const int NC, const void *pf, const int B16)
{
	__m256 acc[2][4], xv[2];
	int k = 0;

	LOOP (int r = 0; r < MR; r++)
		LOOP (int c = 0; c < NC; c++)
			acc[r][c] = _mm256_setzero_ps();
	for (; k + 8 <= in; k += 8) {
		LOOP (int r = 0; r < MR; r++)
			xv[r] = _mm256_loadu_ps(x + (size_t)r * in + k);
		LOOP (int c = 0; c < NC; c++) {
			__m256 wv = wload8(w, (size_t)c * in + k, B16);

			/* One line per two steps of 8; asking twice costs little. */
			if (pf)
				_mm_prefetch(W_AT(pf, (size_t)c * in + k, B16), _MM_HINT_T0);
			LOOP (int r = 0; r < MR; r++)
				acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
		}
	}
	if (k < in) {
		__m256i m = _mm256_loadu_si256((const __m256i *)(lane_ones + 8 - (in - k)));

		LOOP (int r = 0; r < MR; r++)
			xv[r] = _mm256_maskload_ps(x + (size_t)r * in + k, m);
		LOOP (int c = 0; c < NC; c++) {
			__m256 wv = wtail8(w, (size_t)c * in + k, in - k, m, B16);

			LOOP (int r = 0; r < MR; r++)
				acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
		}
	}
	LOOP (int r = 0; r < MR; r++)
		LOOP (int c = 0; c < NC; c++)
			y[(size_t)r * ldy + c] = hsum8(acc[r][c]);
}

/* Weight vectors in registers, the rows' vectors streaming past (MR <= 4,
 * NC <= 3): per step of 8, 3 + 4 loads feed 12 FMAs in 12 chains, where
 * the 3 + 3 + 2 rows of tile8 fed the 2-row pass's 8 FMAs with 6 loads
 * and left its 8 chains no slack on the FMA's latency. */
T256 void tile8w(float *y, int ldy, const float *x, const void *w, int in, const int MR,
		 const int NC, const void *pf, const int B16)
{
	__m256 acc[4][3], wv[3];
	int k = 0;

	LOOP (int r = 0; r < MR; r++)
		LOOP (int c = 0; c < NC; c++)
			acc[r][c] = _mm256_setzero_ps();
	for (; k + 8 <= in; k += 8) {
		LOOP (int c = 0; c < NC; c++) {
			wv[c] = wload8(w, (size_t)c * in + k, B16);
			if (pf)
				_mm_prefetch(W_AT(pf, (size_t)c * in + k, B16), _MM_HINT_T0);
		}
		LOOP (int r = 0; r < MR; r++) {
			__m256 xv = _mm256_loadu_ps(x + (size_t)r * in + k);

			LOOP (int c = 0; c < NC; c++)
				acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
		}
	}
	if (k < in) {
		__m256i m = _mm256_loadu_si256((const __m256i *)(lane_ones + 8 - (in - k)));

		LOOP (int c = 0; c < NC; c++)
			wv[c] = wtail8(w, (size_t)c * in + k, in - k, m, B16);
		LOOP (int r = 0; r < MR; r++) {
			__m256 xv = _mm256_maskload_ps(x + (size_t)r * in + k, m);

			LOOP (int c = 0; c < NC; c++)
				acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
		}
	}
	LOOP (int r = 0; r < MR; r++)
		LOOP (int c = 0; c < NC; c++)
			y[(size_t)r * ldy + c] = hsum8(acc[r][c]);
}

/* Rows r0..r1 (one or two) against columns c0..c1 in tiles of 4 columns. */
T256 void cols8_few(float *y, const float *x, const void *w, int in, int out, int r0, int r1,
		    int c0, int c1, const int B16)
{
	float *yr = y + (size_t)r0 * out;
	const float *xr = x + (size_t)r0 * in;
	int c = c0;

	for (; c + 4 <= c1; c += 4) {
		/* As cols16: the tile after next is asked for meanwhile. */
		const void *next = c + 12 <= c1 ? W_AT(w, (size_t)(c + 8) * in, B16) : NULL;
		const void *wc = W_AT(w, (size_t)c * in, B16);

		if (r1 - r0 == 2)
			tile8(yr + c, out, xr, wc, in, 2, 4, next, B16);
		else
			tile8(yr + c, out, xr, wc, in, 1, 4, next, B16);
	}
	for (; c < c1; c++)
		for (int r = 0; r < r1 - r0; r++)
			tile8(yr + (size_t)r * out + c, out, xr + (size_t)r * in,
			      W_AT(w, (size_t)c * in, B16), in, 1, 1, NULL, B16);
}

/* Rows r .. r + left (0 < left < 4) against one tile of NC columns. */
T256 void rest8w(float *y, int ldy, const float *x, const void *w, int in, int left,
		 const int NC, const void *pf, const int B16)
{
	if (left == 3)
		tile8w(y, ldy, x, w, in, 3, NC, pf, B16);
	else if (left == 2)
		tile8w(y, ldy, x, w, in, 2, NC, pf, B16);
	else
		tile8w(y, ldy, x, w, in, 1, NC, pf, B16);
}

/* Three or more rows against columns c0..c1 in tiles of 4 x 3. */
T256 void cols8_rows(float *y, const float *x, const void *w, int in, int out, int r0, int r1,
		     int c0, int c1, const int B16)
{
	int c = c0;

	for (; c + 3 <= c1; c += 3) {
		/* The first row group reads the weight tile from memory and asks
		 * for the tile AHEAD_R4 on meanwhile. */
		const void *next = c + 3 * (AHEAD_R4 + 1) <= c1
					   ? W_AT(w, (size_t)(c + 3 * AHEAD_R4) * in, B16) : NULL;
		const void *wc = W_AT(w, (size_t)c * in, B16);
		int r = r0;

		for (; r + 4 <= r1; r += 4, next = NULL)
			tile8w(y + (size_t)r * out + c, out, x + (size_t)r * in, wc, in, 4, 3, next,
			       B16);
		if (r < r1)
			rest8w(y + (size_t)r * out + c, out, x + (size_t)r * in, wc, in, r1 - r, 3,
			       next, B16);
	}
	for (; c < c1; c++) {
		const void *wc = W_AT(w, (size_t)c * in, B16);
		int r = r0;

		for (; r + 4 <= r1; r += 4)
			tile8w(y + (size_t)r * out + c, out, x + (size_t)r * in, wc, in, 4, 1, NULL,
			       B16);
		if (r < r1)
			rest8w(y + (size_t)r * out + c, out, x + (size_t)r * in, wc, in, r1 - r, 1,
			       NULL, B16);
	}
}

T256 void cols8_t(float *y, const float *x, const void *w, int n, int in, int out, int c0,
		  int c1, const int B16)
{
	for (int r0 = 0; r0 < n; r0 += ROW_BLOCK) {
		int r1 = n - r0 < ROW_BLOCK ? n : r0 + ROW_BLOCK;

		if (r1 - r0 >= 3)
			cols8_rows(y, x, w, in, out, r0, r1, c0, c1, B16);
		else
			cols8_few(y, x, w, in, out, r0, r1, c0, c1, B16);
	}
}

__attribute__((target("avx2,fma")))
static void cols8(float *y, const float *x, const void *w, int n, int in, int out, int c0, int c1,
		  int b16)
{
	if (b16)
		cols8_t(y, x, w, n, in, out, c0, c1, 1);
	else
		cols8_t(y, x, w, n, in, out, c0, c1, 0);
}

/* ---- plain C: 8 running sums (multiply, then add), the same tree ------- */
static float dot8(const float *restrict a, const float *restrict b, int n)
{
	float acc[8] = { 0 };
	int k = 0;

	for (; k + 8 <= n; k += 8)
		for (int j = 0; j < 8; j++)
			acc[j] += a[k + j] * b[k + j];
	for (int j = 0; k + j < n; j++)	/* the missing lanes add nothing */
		acc[j] += a[k + j] * b[k + j];
	return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* dot8 with b as bf16, widened one by one: the same products and sums. */
static float dot8_bf16(const float *restrict a, const uint16_t *restrict b, int n)
{
	float acc[8] = { 0 };
	int k = 0;

	for (; k + 8 <= n; k += 8)
		for (int j = 0; j < 8; j++)
			acc[j] += a[k + j] * bits_f32((uint32_t)b[k + j] << 16);
	for (int j = 0; k + j < n; j++)
		acc[j] += a[k + j] * bits_f32((uint32_t)b[k + j] << 16);
	return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

static void cols_c(float *y, const float *x, const void *w, int n, int in, int out, int c0,
		   int c1, int b16)
{
	for (int r0 = 0; r0 < n; r0 += ROW_BLOCK) {
		int r1 = n - r0 < ROW_BLOCK ? n : r0 + ROW_BLOCK;

		for (int c = c0; c < c1; c++)
			for (int r = r0; r < r1; r++)
				y[(size_t)r * out + c] =
					b16 ? dot8_bf16(x + (size_t)r * in,
							(const uint16_t *)w + (size_t)c * in, in)
					    : dot8(x + (size_t)r * in, (const float *)w + (size_t)c * in,
						   in);
	}
}

/* ---- dispatch --------------------------------------------------------- */
static int supported(int isa)
{
	__builtin_cpu_init();
	switch (isa) {
	case ISA_AVX512:
		return __builtin_cpu_supports("avx512f");
	case ISA_AVX2:
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	default:
		return 1;
	}
}

/* Make isa the chosen one: 0, -ENOTSUP (the CPU lacks it) or -EINVAL (no
 * such name). Never calls pthread_once: choose() runs inside it. */
static int pick(const char *isa)
{
	for (int i = 0; i < 3; i++)
		if (isa && !strcmp(isa, isa_names[i])) {
			if (!supported(i))
				return -ENOTSUP;
			isa_chosen = i;
			return 0;
		}
	return -EINVAL;
}

/* The best the CPU has, then $KVMEM_MATMUL's if it names one it has (the
 * cpu backend refuses a name that does not: user/backend/cpu.c). */
static void choose(void)
{
	const char *e = getenv("KVMEM_MATMUL");

	isa_chosen = supported(ISA_AVX512) ? ISA_AVX512 : supported(ISA_AVX2) ? ISA_AVX2 : ISA_C;
	if (e && *e)
		pick(e);
}

int kvmem_matmul_use(const char *isa)
{
	pthread_once(&isa_once, choose);
	return pick(isa);
}

const char *kvmem_matmul_isa(void)
{
	pthread_once(&isa_once, choose);
	return isa_names[isa_chosen];
}

static void cols_isa(int isa, float *y, const float *x, const void *w, int b16, int n, int in,
		     int out, int c0, int c1)
{
	if (isa == ISA_AVX512)
		cols16(y, x, w, n, in, out, c0, c1, b16);
	else if (isa == ISA_AVX2)
		cols8(y, x, w, n, in, out, c0, c1, b16);
	else
		cols_c(y, x, w, n, in, out, c0, c1, b16);
}

struct pool_mm {
	float *y;
	const float *x;
	const void *w;
	int b16, n, in, out, isa;
};

static void pool_cols(void *arg, int chunk)
{
	const struct pool_mm *a = arg;
	int c0 = chunk * POOL_COLS, c1 = c0 + POOL_COLS < a->out ? c0 + POOL_COLS : a->out;

	cols_isa(a->isa, a->y, a->x, a->w, a->b16, a->n, a->in, a->out, c0, c1);
}

static void matmul(float *y, const float *x, const void *w, int b16, int n, int in, int out)
{
	int isa, step;
	long macs = (long)n * in * out;

	if (n <= 0 || out <= 0)
		return;
	if (in <= 0) {
		memset(y, 0, sizeof(float) * (size_t)n * out);
		return;
	}
	pthread_once(&isa_once, choose);
	isa = isa_chosen;
	/* Threads own whole column tiles: the split follows the tile width
	 * (AVX2's is 3 from three rows on, else 4). */
	step = isa == ISA_AVX512 ? 6 : isa == ISA_AVX2 ? (n >= 3 ? 3 : 4) : 1;
	if (macs >= POOL_MACS && macs < THREADED_MACS) {
		struct pool_mm a = { y, x, w, b16, n, in, out, isa };

		kvmem_pool_run((out + POOL_COLS - 1) / POOL_COLS, pool_cols, &a);
		return;
	}
	#pragma omp parallel if (macs >= THREADED_MACS)
	{
		int nt = omp_get_num_threads(), t = omp_get_thread_num();
		int tiles = (out + step - 1) / step;
		int c0 = (int)((long)tiles * t / nt) * step, c1 = (int)((long)tiles * (t + 1) / nt) * step;

		c1 = c1 < out ? c1 : out;
		if (c0 < c1)
			cols_isa(isa, y, x, w, b16, n, in, out, c0, c1);
	}
}

void kvmem_matmul(float *y, const float *x, const float *w, int n, int in, int out)
{
	matmul(y, x, w, 0, n, in, out);
}

void kvmem_matmul_bf16w(float *y, const float *x, const uint16_t *w, int n, int in, int out)
{
	matmul(y, x, w, 1, n, in, out);
}

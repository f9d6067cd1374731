// SPDX-License-Identifier: MIT
/*
 * The engine's matmul, y[n][out] = x[n][in] · w[out][in]^T, with every
 * element's arithmetic fixed: one chain of fused multiply-adds over in, in
 * order,
 *
 *	s = 0; for k = 0 .. in - 1: s = fma(x[r][k], w[c][k], s); y[r][c] = s
 *
 * so a row of y has the same bits whether it is computed alone (one
 * session's decode step), among the rows of a prefill chunk or beside
 * other sessions' rows in a batched forward (user/engine/engine.c), on any
 * thread count and at every instruction set: AVX-512 and AVX2 hold 16 or 8
 * of the chains in a vector's lanes, plain C calls fmaf. A BLAS GEMM
 * promises none of that (OpenBLAS picks kernels, blockings and a GEMV by
 * the shape, so a row's sums are grouped differently at another n).
 *
 * Here the weights are w[out][in] as they are stored, fp32 or bf16
 * (kvmem_matmul_bf16w widens each in a register: exact, so its bits are
 * kvmem_matmul's over the fp32 copy of the same weights). A lane is an
 * output column: blocks of 16 (AVX2: 8) columns x 16 (8) steps of in are
 * transposed in registers and each row of x is broadcast against them. The
 * engine's own weights go through kernels/cpu/matmul_panels.c instead,
 * packed once so that no transpose is needed, which is quicker and gives
 * these bits.
 *
 * Threads split the output columns (OpenMP, static; the kernels' pool for
 * mid-sized products, in chunks of POOL_COLS); a column's weights are read
 * once for all the rows of a tile, which is where batching saves time:
 * decode reads every weight once per step for all its sessions.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/bits.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/kernels.h"

#pragma GCC optimize("O3")

static int isa_chosen = -1;	/* a KVMEM_ISA_ level (isa.h) */
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

/* Below POOL_MACS multiply-adds one thread is quicker than waking
 * another; from it (every product of a lone decode step of the embedded
 * model, 1 x 256 x 256 and up, and a batched step's, 8 rows x 256 x 768
 * to 8 x 256 x 1536) the kernels' pool runs the columns, whose caller does
 * not wait for a worker to wake; from THREADED_MACS (prefill chunks)
 * OpenMP. The batched step's gate|up at 8 rows, 3.1M, ran 5-15 % slower
 * on OpenMP than in the pool here; a lone step with its one-row products
 * from 2^16 on the pool (2^18 before) ran 1.2-1.3x as fast (issue #26). */
#define THREADED_MACS (1L << 23)
#define POOL_MACS (1L << 16)
/* Columns a pool chunk takes (a multiple of every tile width). */
#define POOL_COLS 64


/* A weight, widened from bf16 when B16 (exact). */
static inline float wat(const void *w, size_t i, const int B16)
{
	return B16 ? bits_f32((uint32_t)((const uint16_t *)w)[i] << 16) : ((const float *)w)[i];
}

/* ---- AVX-512: a lane a column, 16 columns a vector ----------------------
 * A block of 16 columns x 16 steps of k is loaded as 16 rows of w (one a
 * column) and transposed in registers, so that vector kk holds the 16
 * columns' weights at k0 + kk; then each row's chains take the block's 16
 * steps in order. A tile is MR rows x NG groups of 16 columns (MR * NG
 * chains, 8 at most: 8 x 1 for a batch, 1 x 4 for one row). */
#define T512 __attribute__((target("avx512f,avx512bw,fma"), always_inline)) static inline

/* 16 weights of one column from k, `left` of them (< 16: zeros after). */
T512 __m512 wrow16(const void *w, size_t i, int left, const int B16)
{
	if (left >= 16) {
		if (!B16)
			return _mm512_loadu_ps((const float *)w + i);
		return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
			_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i))), 16));
	}
	if (!B16)
		return _mm512_maskz_loadu_ps((__mmask16)((1u << left) - 1), (const float *)w + i);
	uint16_t t[16] = { 0 };

	memcpy(t, (const uint16_t *)w + i, sizeof(uint16_t) * (size_t)left);
	return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
		_mm256_loadu_si256((const __m256i *)t)), 16));
}

/* r[j] = row j of a 16 x 16 block; after: r[kk] = column kk. */
T512 void transpose16(__m512 r[16])
{
	__m512 t[16];

	for (int i = 0; i < 8; i++) {
		t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
		t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
	}
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < 2; j++) {
			__m512d a = _mm512_castps_pd(t[4 * i + j]), b = _mm512_castps_pd(t[4 * i + j + 2]);

			r[4 * i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
			r[4 * i + 2 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
		}
	/* r[4 i + m] now holds, in each 128-bit block b, rows 4 i .. 4 i + 3
	 * at k = 4 b + m: gather the blocks of four such registers. */
	for (int i = 0; i < 2; i++)
		for (int m = 0; m < 4; m++) {
			t[8 * i + m] = _mm512_shuffle_f32x4(r[8 * i + m], r[8 * i + 4 + m], 0x88);
			t[8 * i + 4 + m] = _mm512_shuffle_f32x4(r[8 * i + m], r[8 * i + 4 + m], 0xdd);
		}
	for (int m = 0; m < 4; m++)	/* k = 4 h + m and 8 + 4 h + m */
		for (int h = 0; h < 2; h++) {
			r[4 * h + m] = _mm512_shuffle_f32x4(t[4 * h + m], t[8 + 4 * h + m], 0x88);
			r[8 + 4 * h + m] = _mm512_shuffle_f32x4(t[4 * h + m], t[8 + 4 * h + m], 0xdd);
		}
}

T512 void tile512(float *y, int ldy, const float *x, int in, const void *w, int ncol, const int MR,
		  const int NG, const int B16)
{
	__m512 acc[8][4];

	for (int r = 0; r < MR; r++)
		for (int g = 0; g < NG; g++)
			acc[r][g] = _mm512_setzero_ps();
	for (int k0 = 0; k0 < in; k0 += 16) {
		const int left = in - k0;

		for (int g = 0; g < NG; g++) {
			__m512 t[16];

			for (int j = 0; j < 16; j++)
				t[j] = 16 * g + j < ncol
					       ? wrow16(w, (size_t)(16 * g + j) * in + k0, left, B16)
					       : _mm512_setzero_ps();
			transpose16(t);
			for (int kk = 0; kk < 16 && kk < left; kk++)
				for (int r = 0; r < MR; r++)
					acc[r][g] = _mm512_fmadd_ps(
						_mm512_set1_ps(x[(size_t)r * in + k0 + kk]), t[kk],
						acc[r][g]);
		}
	}
	for (int r = 0; r < MR; r++)
		for (int g = 0; g < NG; g++) {
			float t[16];
			const int nc = ncol - 16 * g;

			if (nc <= 0)
				continue;
			_mm512_storeu_ps(t, acc[r][g]);
			memcpy(y + (size_t)r * ldy + 16 * g, t, sizeof(float) * (nc < 16 ? nc : 16));
		}
}

T512 void cols512_t(float *y, const float *x, const void *w, int n, int in, int out, int c0, int c1,
		    const int B16)
{
	const size_t esz = B16 ? 2 : 4;
	int r = 0;

	for (; r + 8 <= n; r += 8)
		for (int c = c0; c < c1; c += 16)
			tile512(y + (size_t)r * out + c, out, x + (size_t)r * in, in,
				(const char *)w + (size_t)c * in * esz, c1 - c, 8, 1, B16);
	for (; r < n; r++)
		for (int c = c0; c < c1; c += 64)
			tile512(y + (size_t)r * out + c, out, x + (size_t)r * in, in,
				(const char *)w + (size_t)c * in * esz, c1 - c, 1, 4, B16);
}

__attribute__((target("avx512f,avx512bw,fma")))
static void cols512(float *y, const float *x, const void *w, int b16, int n, int in, int out, int c0,
		    int c1)
{
	if (b16)
		cols512_t(y, x, w, n, in, out, c0, c1, 1);
	else
		cols512_t(y, x, w, n, in, out, c0, c1, 0);
}

/* ---- AVX2 + FMA: a lane a column, 8 columns a vector -------------------
 * The same with blocks of 8 x 8 and tiles of MR rows x NG groups of 8
 * columns (4 x 1 for a batch, 1 x 4 for one row: 16 registers in all). */
#define T256 __attribute__((target("avx2,fma"), always_inline)) static inline

static const int32_t lane_ones[16] = { -1, -1, -1, -1, -1, -1, -1, -1 };

/* 8 weights of one column from k, `left` of them (< 8: zeros after). */
T256 __m256 wrow8(const void *w, size_t i, int left, const int B16)
{
	if (left >= 8) {
		if (!B16)
			return _mm256_loadu_ps((const float *)w + i);
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
			_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i))), 16));
	}
	if (!B16)
		return _mm256_maskload_ps((const float *)w + i,
					  _mm256_loadu_si256((const __m256i *)(lane_ones + 8 - left)));
	uint16_t t[8] = { 0 };

	memcpy(t, (const uint16_t *)w + i, sizeof(uint16_t) * (size_t)left);
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
		_mm_loadu_si128((const __m128i *)t)), 16));
}

T256 void transpose8(__m256 r[8])
{
	__m256 t[8], u[8];

	for (int i = 0; i < 4; i++) {
		t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
		t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
	}
	for (int i = 0; i < 2; i++) {
		u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
		u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
		u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
		u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
	}
	for (int m = 0; m < 4; m++) {
		r[m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x20);
		r[4 + m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x31);
	}
}

T256 void tile256(float *y, int ldy, const float *x, int in, const void *w, int ncol, const int MR,
		  const int NG, const int B16)
{
	__m256 acc[4][4];

	for (int r = 0; r < MR; r++)
		for (int g = 0; g < NG; g++)
			acc[r][g] = _mm256_setzero_ps();
	for (int k0 = 0; k0 < in; k0 += 8) {
		const int left = in - k0;

		for (int g = 0; g < NG; g++) {
			__m256 t[8];

			for (int j = 0; j < 8; j++)
				t[j] = 8 * g + j < ncol
					       ? wrow8(w, (size_t)(8 * g + j) * in + k0, left, B16)
					       : _mm256_setzero_ps();
			transpose8(t);
			for (int kk = 0; kk < 8 && kk < left; kk++)
				for (int r = 0; r < MR; r++)
					acc[r][g] = _mm256_fmadd_ps(
						_mm256_set1_ps(x[(size_t)r * in + k0 + kk]), t[kk],
						acc[r][g]);
		}
	}
	for (int r = 0; r < MR; r++)
		for (int g = 0; g < NG; g++) {
			float t[8];
			const int nc = ncol - 8 * g;

			if (nc <= 0)
				continue;
			_mm256_storeu_ps(t, acc[r][g]);
			memcpy(y + (size_t)r * ldy + 8 * g, t, sizeof(float) * (nc < 8 ? nc : 8));
		}
}

T256 void cols256_t(float *y, const float *x, const void *w, int n, int in, int out, int c0, int c1,
		    const int B16)
{
	const size_t esz = B16 ? 2 : 4;
	int r = 0;

	for (; r + 4 <= n; r += 4)
		for (int c = c0; c < c1; c += 8)
			tile256(y + (size_t)r * out + c, out, x + (size_t)r * in, in,
				(const char *)w + (size_t)c * in * esz, c1 - c, 4, 1, B16);
	for (; r < n; r++)
		for (int c = c0; c < c1; c += 32)
			tile256(y + (size_t)r * out + c, out, x + (size_t)r * in, in,
				(const char *)w + (size_t)c * in * esz, c1 - c, 1, 4, B16);
}

__attribute__((target("avx2,fma")))
static void cols256(float *y, const float *x, const void *w, int b16, int n, int in, int out, int c0,
		    int c1)
{
	if (b16)
		cols256_t(y, x, w, n, in, out, c0, c1, 1);
	else
		cols256_t(y, x, w, n, in, out, c0, c1, 0);
}

/* ---- plain C: the same chain, fmaf ------------------------------------- */
float kvmem_matmul_chain(const float *x, const void *w, int b16, size_t stride, int in)
{
	float s = 0.0f;

	for (int k = 0; k < in; k++)
		s = fmaf(x[k], wat(w, (size_t)k * stride, b16), s);
	return s;
}

static void cols_c(float *y, const float *x, const void *w, int b16, int n, int in, int out,
		   int c0, int c1)
{
	for (int c = c0; c < c1; c++)
		for (int r = 0; r < n; r++)
			y[(size_t)r * out + c] = kvmem_matmul_chain(x + (size_t)r * in,
				(const char *)w + (size_t)c * in * (b16 ? 2 : 4), b16, 1, in);
}

/* ---- dispatch --------------------------------------------------------- */
static int supported(int isa)
{
	__builtin_cpu_init();
	switch (isa) {
	case KVMEM_ISA_AVX512:
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
	case KVMEM_ISA_AVX2:
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	default:
		return 1;
	}
}

/* The best the CPU has, then $KVMEM_MATMUL's if it names one it has. */
static void choose(void)
{
	isa_chosen = kvmem_isa_best(supported, "KVMEM_MATMUL");
}

int kvmem_matmul_use(const char *isa)
{
	pthread_once(&isa_once, choose);
	return kvmem_isa_pick(supported, isa, &isa_chosen);
}

const char *kvmem_matmul_isa(void)
{
	pthread_once(&isa_once, choose);
	return kvmem_isa_names[isa_chosen];
}

int kvmem_matmul_level(void)
{
	pthread_once(&isa_once, choose);
	return isa_chosen == KVMEM_ISA_AVX512 ? 16 : isa_chosen == KVMEM_ISA_AVX2 ? 8 : 1;
}

bool kvmem_matmul_empty(float *y, int n, int in, int out)
{
	if (n <= 0 || out <= 0)
		return true;
	if (in <= 0)
		memset(y, 0, sizeof(float) * (size_t)n * out);
	return in <= 0;
}

void kvmem_matmul_threads(long macs, int items, kvmem_pool_fn fn, void *arg)
{
	if (items <= 0)
		return;
	if (items > 1 && macs >= POOL_MACS && macs < THREADED_MACS) {
		kvmem_pool_run(items, fn, arg);
		return;
	}
	#pragma omp parallel for schedule(static) if (items > 1 && macs >= THREADED_MACS)
	for (int i = 0; i < items; i++)
		fn(arg, i);
}

struct rm_job {
	float *y;
	const float *x;
	const void *w;
	int b16, n, in, out, isa;
};

static void rm_chunk(void *arg, int chunk)
{
	const struct rm_job *a = arg;
	const int c0 = chunk * POOL_COLS, c1 = c0 + POOL_COLS < a->out ? c0 + POOL_COLS : a->out;

	if (a->isa == KVMEM_ISA_AVX512)
		cols512(a->y, a->x, a->w, a->b16, a->n, a->in, a->out, c0, c1);
	else if (a->isa == KVMEM_ISA_AVX2)
		cols256(a->y, a->x, a->w, a->b16, a->n, a->in, a->out, c0, c1);
	else
		cols_c(a->y, a->x, a->w, a->b16, a->n, a->in, a->out, c0, c1);
}

static void matmul(float *y, const float *x, const void *w, int b16, int n, int in, int out)
{
	struct rm_job a = { y, x, w, b16, n, in, out, KVMEM_ISA_C };

	if (kvmem_matmul_empty(y, n, in, out))
		return;
	pthread_once(&isa_once, choose);
	a.isa = isa_chosen;
	kvmem_matmul_threads((long)n * in * out, (out + POOL_COLS - 1) / POOL_COLS, rm_chunk, &a);
}

void kvmem_matmul(float *y, const float *x, const float *w, int n, int in, int out)
{
	matmul(y, x, w, 0, n, in, out);
}

void kvmem_matmul_bf16w(float *y, const float *x, const uint16_t *w, int n, int in, int out)
{
	matmul(y, x, w, 1, n, in, out);
}

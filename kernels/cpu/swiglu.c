// SPDX-License-Identifier: MIT
/*
 * SwiGLU, out = silu(gate) * up with silu(g) = g / (1 + e^-g), sixteen or
 * eight elements at a time.
 *
 * libm's expf is a call per element: a 58-token prompt of the embedded
 * model took 0.9 ms of its 8.3 ms prefill in this loop, a batched decode
 * step of 8 sessions 0.12 of its 2.3 ms (issue #26). Here e^x is a few
 * float operations that vectorise: x = k ln2 + r with k = round(x log2 e)
 * (ln 2 in two parts, so r is exact to a few ulp), a degree-7 Taylor
 * polynomial for e^r on |r| <= ln2/2 (truncation 5e-9 relative) and 2^k
 * from the exponent bits. Its error is within 2 ulp of e^x; silu's within
 * 4e-6 relative of the exact value (tests/unit/test_kernels.c).
 *
 * Every width does the same IEEE operations in the same order (fused
 * multiply-adds, round to nearest even, one division, one product), so an
 * element's bits depend on its gate and up values only: not on n, not on
 * its place in a vector or the tail, not on the instruction set. A row
 * decoded alone or in a batch gets the same bits.
 */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

/* e^x for x clamped to [EXP_LO, EXP_HI]: k stays in [-126, 127], 2^k a
 * normal float. silu needs no more: e^-g past either end only turns
 * 1 + e^-g into 1 or into a number g's division makes 0 to 1e-35. */
#define EXP_LO (-87.0f)
#define EXP_HI 88.0f
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f		/* 355/512: k * LN2_HI is exact */
#define LN2_LO (-2.12194440e-4f)	/* ln 2 - LN2_HI */
/* 1/j! for j = 7 .. 2 */
#define C7 1.98412698e-4f
#define C6 1.38888889e-3f
#define C5 8.33333333e-3f
#define C4 4.16666667e-2f
#define C3 1.66666667e-1f
#define C2 0.5f

/* ---- one element: the reference every width matches bit for bit ----- */
static float exp_one(float x)
{
	float k, r, p;
	uint32_t bits;
	float scale;

	x = fminf(fmaxf(x, EXP_LO), EXP_HI);
	k = nearbyintf(x * LOG2E);
	r = fmaf(-k, LN2_HI, x);
	r = fmaf(-k, LN2_LO, r);
	p = fmaf(C7, r, C6);
	p = fmaf(p, r, C5);
	p = fmaf(p, r, C4);
	p = fmaf(p, r, C3);
	p = fmaf(p, r, C2);
	p = fmaf(p, r, 1.0f);
	p = fmaf(p, r, 1.0f);
	bits = (uint32_t)((int32_t)k + 127) << 23;
	memcpy(&scale, &bits, sizeof(scale));
	return p * scale;
}

static void swiglu_c(float *out, const float *gate, const float *up, size_t i, size_t n)
{
	for (; i < n; i++) {
		float g = gate[i];

		out[i] = g / (1.0f + exp_one(-g)) * up[i];
	}
}

/* ---- AVX-512: 16 lanes ------------------------------------------------ */
/* -x as C's unary minus: the sign bit flipped (0 - x would make -0 of +0). */
__attribute__((target("avx512f"), always_inline)) static inline __m512 neg512(__m512 x)
{
	return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x),
						    _mm512_set1_epi32(INT32_MIN)));
}

__attribute__((target("avx512f")))
static void swiglu_512(float *out, const float *gate, const float *up, size_t n)
{
	const __m512 lo = _mm512_set1_ps(EXP_LO), hi = _mm512_set1_ps(EXP_HI);
	const __m512 one = _mm512_set1_ps(1.0f);
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m512 g = _mm512_loadu_ps(gate + i);
		/* max(x, lo) gives lo for a NaN x, as fmaxf does */
		__m512 x = _mm512_min_ps(_mm512_max_ps(neg512(g), lo), hi);
		__m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
						_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		__m512 nk = neg512(k);
		__m512 r = _mm512_fmadd_ps(nk, _mm512_set1_ps(LN2_HI), x);
		__m512 p;
		__m512i e;

		r = _mm512_fmadd_ps(nk, _mm512_set1_ps(LN2_LO), r);
		p = _mm512_fmadd_ps(_mm512_set1_ps(C7), r, _mm512_set1_ps(C6));
		p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C5));
		p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C4));
		p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C3));
		p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C2));
		p = _mm512_fmadd_ps(p, r, one);
		p = _mm512_fmadd_ps(p, r, one);
		e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)),
				      23);
		p = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
		_mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, p)),
							_mm512_loadu_ps(up + i)));
	}
	swiglu_c(out, gate, up, i, n);
}

/* ---- AVX2 + FMA: 8 lanes ---------------------------------------------- */
__attribute__((target("avx2"), always_inline)) static inline __m256 neg256(__m256 x)
{
	return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));
}

__attribute__((target("avx2,fma")))
static void swiglu_256(float *out, const float *gate, const float *up, size_t n)
{
	const __m256 lo = _mm256_set1_ps(EXP_LO), hi = _mm256_set1_ps(EXP_HI);
	const __m256 one = _mm256_set1_ps(1.0f);
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256 g = _mm256_loadu_ps(gate + i);
		__m256 x = _mm256_min_ps(_mm256_max_ps(neg256(g), lo), hi);
		__m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
					   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		__m256 nk = neg256(k);
		__m256 r = _mm256_fmadd_ps(nk, _mm256_set1_ps(LN2_HI), x);
		__m256 p;
		__m256i e;

		r = _mm256_fmadd_ps(nk, _mm256_set1_ps(LN2_LO), r);
		p = _mm256_fmadd_ps(_mm256_set1_ps(C7), r, _mm256_set1_ps(C6));
		p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C5));
		p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C4));
		p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C3));
		p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C2));
		p = _mm256_fmadd_ps(p, r, one);
		p = _mm256_fmadd_ps(p, r, one);
		e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)),
				      23);
		p = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
		_mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, p)),
							_mm256_loadu_ps(up + i)));
	}
	swiglu_c(out, gate, up, i, n);
}

/* ---- dispatch --------------------------------------------------------- */
enum { W_C, W_256, W_512 };
static int width;
static pthread_once_t width_once = PTHREAD_ONCE_INIT;

static void choose(void)
{
	__builtin_cpu_init();
	width = __builtin_cpu_supports("avx512f") ? W_512
		: __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? W_256 : W_C;
}

void kvmem_swiglu(float *out, const float *gate, const float *up, size_t n)
{
	pthread_once(&width_once, choose);
	if (width == W_512)
		swiglu_512(out, gate, up, n);
	else if (width == W_256)
		swiglu_256(out, gate, up, n);
	else
		swiglu_c(out, gate, up, 0, n);
}


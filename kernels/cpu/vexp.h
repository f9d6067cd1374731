/* SPDX-License-Identifier: MIT */
/*
 * e^x at three widths with the same bits (kernels/cpu only): x = k ln2 + r
 * with k = round(x log2 e) (ln 2 in two parts, so r is exact to a few
 * ulp), a degree-7 Taylor polynomial for e^r on |r| <= ln2/2 (truncation
 * 5e-9 relative) and 2^k from the exponent bits; x clamped to [-87, 88]
 * first, so k stays in [-126, 127] and 2^k is a normal float. Within 2 ulp
 * of e^x there (0.92 ulp at worst over every 97th float of the range). A
 * NaN gives a NaN (a corrupt key must show in attention's output, not vanish
 * into the clamp: test_fp8's twins). Every width does the same IEEE
 * operations in the same order (fused multiply-adds, round to nearest
 * even), so a value's bits do not depend on the instruction set or on its
 * place in a vector: the scalar form is the reference (kvmem_expf,
 * kernels.h).
 *
 * libm's expf is a call per element: SwiGLU over a 58-token prompt of the
 * embedded model spent 0.9 ms of its 8.3 ms prefill in it (issue #26).
 */
#ifndef KVMEM_KERNELS_CPU_VEXP_H
#define KVMEM_KERNELS_CPU_VEXP_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cpu/bits.h"

#define VEXP_LO (-87.0f)
#define VEXP_HI 88.0f
#define VEXP_LOG2E 1.44269504088896341f
#define VEXP_LN2_HI 0.693359375f	/* 355/512: k * VEXP_LN2_HI is exact */
#define VEXP_LN2_LO (-2.12194440e-4f)	/* ln 2 - VEXP_LN2_HI */
/* 1/j! for j = 7 .. 2 */
#define VEXP_C7 1.98412698e-4f
#define VEXP_C6 1.38888889e-3f
#define VEXP_C5 8.33333333e-3f
#define VEXP_C4 4.16666667e-2f
#define VEXP_C3 1.66666667e-1f
#define VEXP_C2 0.5f

static inline float vexp1(float x)
{
	float k, r, p;

	if (x != x)
		return x;
	x = fminf(fmaxf(x, VEXP_LO), VEXP_HI);
	k = nearbyintf(x * VEXP_LOG2E);
	r = fmaf(-k, VEXP_LN2_HI, x);
	r = fmaf(-k, VEXP_LN2_LO, r);
	p = fmaf(VEXP_C7, r, VEXP_C6);
	p = fmaf(p, r, VEXP_C5);
	p = fmaf(p, r, VEXP_C4);
	p = fmaf(p, r, VEXP_C3);
	p = fmaf(p, r, VEXP_C2);
	p = fmaf(p, r, 1.0f);
	p = fmaf(p, r, 1.0f);
	return p * bits_f32((uint32_t)((int32_t)k + 127) << 23);	/* times 2^k */
}

/* -x as C's unary minus: the sign bit flipped (0 - x would make -0 of +0). */
__attribute__((target("avx512f"), always_inline)) static inline __m512 vexp_neg16(__m512 x)
{
	return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x),
						    _mm512_set1_epi32(INT32_MIN)));
}

__attribute__((target("avx512f"), always_inline)) static inline __m512 vexp16(__m512 x)
{
	/* max(lo, x) and min(hi, x) give a NaN x back: NaN in, NaN out */
	x = _mm512_min_ps(_mm512_set1_ps(VEXP_HI), _mm512_max_ps(_mm512_set1_ps(VEXP_LO), x));
	__m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(VEXP_LOG2E)),
					_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 nk = vexp_neg16(k);
	__m512 r = _mm512_fmadd_ps(nk, _mm512_set1_ps(VEXP_LN2_HI), x);
	__m512 p, one = _mm512_set1_ps(1.0f);
	__m512i e;

	r = _mm512_fmadd_ps(nk, _mm512_set1_ps(VEXP_LN2_LO), r);
	p = _mm512_fmadd_ps(_mm512_set1_ps(VEXP_C7), r, _mm512_set1_ps(VEXP_C6));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEXP_C5));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEXP_C4));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEXP_C3));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEXP_C2));
	p = _mm512_fmadd_ps(p, r, one);
	p = _mm512_fmadd_ps(p, r, one);
	e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
	return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

__attribute__((target("avx2,fma"), always_inline)) static inline __m256 vexp_neg8(__m256 x)
{
	return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));
}

__attribute__((target("avx2,fma"), always_inline)) static inline __m256 vexp8(__m256 x)
{
	x = _mm256_min_ps(_mm256_set1_ps(VEXP_HI), _mm256_max_ps(_mm256_set1_ps(VEXP_LO), x));
	__m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(VEXP_LOG2E)),
				   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 nk = vexp_neg8(k);
	__m256 r = _mm256_fmadd_ps(nk, _mm256_set1_ps(VEXP_LN2_HI), x);
	__m256 p, one = _mm256_set1_ps(1.0f);
	__m256i e;

	r = _mm256_fmadd_ps(nk, _mm256_set1_ps(VEXP_LN2_LO), r);
	p = _mm256_fmadd_ps(_mm256_set1_ps(VEXP_C7), r, _mm256_set1_ps(VEXP_C6));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEXP_C5));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEXP_C4));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEXP_C3));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEXP_C2));
	p = _mm256_fmadd_ps(p, r, one);
	p = _mm256_fmadd_ps(p, r, one);
	e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
	return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* Which width the CPU runs: 16, 8 (AVX2 with FMA) or 1. */
int vexp_width(void);

#endif

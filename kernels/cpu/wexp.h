/* SPDX-License-Identifier: MIT */
/*
 * A draw's weights e^x, x = (logit - top) / T <= 0, in double, at three
 * widths with the same bits (kernels/cpu/sample.c only): x = k ln2 + r with
 * k = round(x log2 e) (ln 2 in two parts, fdlibm's, so k ln2_hi is exact),
 * a degree-13 Taylor polynomial for e^r on |r| <= ln2/2 (truncation 4e-18
 * relative), then 2^k in two exact steps, 2^(k+64) from the exponent bits
 * and 2^-64, so that a result under the normal range rounds once, as a
 * subnormal. x below WEXP_LO (e^x under half the least subnormal) or NaN
 * gives 0. Within 2 ulp of e^x (test_kernels: test_sample_weight). Every
 * width does the same IEEE operations in the same order (fused multiply-
 * adds, round to nearest even), so a weight's bits depend on x only: the
 * scalar form is the reference (kvmem_sample_weight, kernels.h).
 *
 * libm's exp is a call per element: a draw at a temperature over Qwen3's
 * 151,936 logits spent ~2 ms in it on the H100 host's cores (issue #26).
 */
#ifndef KVMEM_KERNELS_CPU_WEXP_H
#define KVMEM_KERNELS_CPU_WEXP_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define WEXP_LO (-745.2)
#define WEXP_LOG2E 1.4426950408889634
#define WEXP_LN2_HI 6.93147180369123816490e-01	/* 0x3fe62e42fee00000 */
#define WEXP_LN2_LO 1.90821492927058770002e-10	/* ln 2 - WEXP_LN2_HI */
#define WEXP_BIAS 1087	/* 1023 + 64 */
#define WEXP_C13 1.6059043836821613e-10	/* 1/13!, Horner's start */
/* Then 1/j! for j = 12 .. 2, and 1, 1: p = p r + c for each c in turn. */
static const double wexp_c[13] = {
	2.08767569878681e-09, 2.505210838544172e-08, 2.755731922398589e-07,
	2.7557319223985893e-06, 2.48015873015873e-05, 0.0001984126984126984,
	0.001388888888888889, 0.008333333333333333, 0.041666666666666664,
	0.16666666666666666, 0.5, 1.0, 1.0,
};

static inline double wexp1(double x)
{
	double k, r, p, s;
	uint64_t e;

	if (!(x >= WEXP_LO))
		return 0.0;
	k = nearbyint(x * WEXP_LOG2E);
	r = fma(-k, WEXP_LN2_HI, x);
	r = fma(-k, WEXP_LN2_LO, r);
	p = WEXP_C13;
	for (int j = 0; j < 13; j++)
		p = fma(p, r, wexp_c[j]);
	e = (uint64_t)((int64_t)k + WEXP_BIAS) << 52;
	memcpy(&s, &e, sizeof(s));
	return p * s * 0x1p-64;	/* (p 2^(k+64)) 2^-64 */
}

/* The same, 4 at a time (AVX2 and FMA). */
__attribute__((target("avx2,fma"))) static inline __m256d wexp4(__m256d x)
{
	const __m256d ok = _mm256_cmp_pd(x, _mm256_set1_pd(WEXP_LO), _CMP_GE_OQ);
	const __m256d k = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(WEXP_LOG2E)),
					  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256d r = _mm256_fnmadd_pd(k, _mm256_set1_pd(WEXP_LN2_HI), x), p;
	__m256i e;

	r = _mm256_fnmadd_pd(k, _mm256_set1_pd(WEXP_LN2_LO), r);
	p = _mm256_set1_pd(WEXP_C13);
	for (int j = 0; j < 13; j++)
		p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(wexp_c[j]));
	/* k is whole and in range where ok: its int32 is exact (elsewhere the
	 * lane is masked to 0 below) */
	e = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(_mm256_and_pd(k, ok)));
	e = _mm256_slli_epi64(_mm256_add_epi64(e, _mm256_set1_epi64x(WEXP_BIAS)), 52);
	p = _mm256_mul_pd(_mm256_mul_pd(p, _mm256_castsi256_pd(e)), _mm256_set1_pd(0x1p-64));
	return _mm256_and_pd(p, ok);
}

/* The same, 8 at a time (AVX-512 F and DQ). */
__attribute__((target("avx512f,avx512dq"))) static inline __m512d wexp8(__m512d x)
{
	const __mmask8 ok = _mm512_cmp_pd_mask(x, _mm512_set1_pd(WEXP_LO), _CMP_GE_OQ);
	const __m512d k = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(WEXP_LOG2E)),
					       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512d r = _mm512_fnmadd_pd(k, _mm512_set1_pd(WEXP_LN2_HI), x), p;
	__m512i e;

	r = _mm512_fnmadd_pd(k, _mm512_set1_pd(WEXP_LN2_LO), r);
	p = _mm512_set1_pd(WEXP_C13);
	for (int j = 0; j < 13; j++)
		p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(wexp_c[j]));
	e = _mm512_maskz_cvtpd_epi64(ok, k);
	e = _mm512_slli_epi64(_mm512_add_epi64(e, _mm512_set1_epi64(WEXP_BIAS)), 52);
	p = _mm512_mul_pd(_mm512_mul_pd(p, _mm512_castsi512_pd(e)), _mm512_set1_pd(0x1p-64));
	return _mm512_maskz_mov_pd(ok, p);
}

#endif

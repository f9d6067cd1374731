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
 * scalar form is the reference (kvmem_sample_weight, kernels.h), defined
 * once for the CPU and the GPU in kernels/draw_fixed.h.
 *
 * libm's exp is a call per element: a draw at a temperature over Qwen3's
 * 151,936 logits spent ~2 ms in it on the H100 host's cores (issue #26).
 */
#ifndef KVMEM_KERNELS_CPU_WEXP_H
#define KVMEM_KERNELS_CPU_WEXP_H

#include <immintrin.h>
#include <stdint.h>

#include "kernels/draw_fixed.h"	/* the constants and the scalar form */

static const double wexp_c[13] = { WEXP_COEFFS };

static inline double wexp1(double x)
{
	return kvmem_draw_exp(x);
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

// SPDX-License-Identifier: MIT
/*
 * e4m3 <-> fp32 and the per-row power-of-two scales (kernels/kernels_fp8.h).
 * Plain arithmetic on exact values: every product by 2^k below is exact
 * (the scales keep the operands far from fp32's under- and overflow); the
 * encoding and the scales work on the floats' bits (SSE2 lanes in a row),
 * rounding to nearest even as the default rounding mode does.
 */
#include <errno.h>
#include <math.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "kernels/kernels.h"
#include "kernels/kernels_fp8.h"
#include "kernels/cpu/bits.h"
#include "kvmem/kvmem.h"

float kvmem_e4m3_to_f32(uint8_t q)
{
	const int e = (q >> 3) & 15, m = q & 7;
	float a;

	if (e == 15 && m == 7)
		return NAN;	/* one NaN, as the device decodes it */
	a = e ? ldexpf((float)(8 + m), e - 10) : ldexpf((float)m, -9);
	return (q & 0x80) ? -a : a;
}

float kvmem_fp8_row_scale(const float *x, int n)
{
	uint32_t top = 0;	/* the largest finite magnitude's bits: they order as it does */
	float f;
	int k, e, i = 0;

#ifdef __SSE2__
	__m128i t4 = _mm_setzero_si128();
	uint32_t lane[4];

	for (; i + 4 <= n; i += 4) {
		__m128i a = _mm_and_si128(_mm_castps_si128(_mm_loadu_ps(x + i)),
					  _mm_set1_epi32(0x7fffffff));
		/* below 2^31: signed compares; a NaN or infinity counts as 0 */
		a = _mm_and_si128(a, _mm_cmplt_epi32(a, _mm_set1_epi32(0x7f800000)));
		const __m128i gt = _mm_cmpgt_epi32(a, t4);

		t4 = _mm_or_si128(_mm_and_si128(gt, a), _mm_andnot_si128(gt, t4));
	}
	_mm_storeu_si128((__m128i *)lane, t4);
	for (int j = 0; j < 4; j++)
		top = lane[j] > top ? lane[j] : top;
#endif
	for (; i < n; i++) {
		const uint32_t a = f32_bits(x[i]) & 0x7fffffffu;

		top = a < 0x7f800000u && a > top ? a : top;
	}
	if (!top)
		return 1.0f;
	/* amax = f * 2^k, f in [0.5, 1); amax <= 448 * 2^e = 0.875 * 2^(e + 9).
	 * A normal's k and f > 0.875 are its exponent field and mantissa. */
	if (top >= 0x00800000u) {
		k = (int)(top >> 23) - 126;
		e = k - 9 + ((top & 0x7fffffu) > 0x600000u);
	} else {
		f = frexpf(bits_f32(top), &k);	/* a subnormal */
		e = k - 9 + (f > 0.875f);
	}
	e = e < -126 ? -126 : e > 120 ? 120 : e;
	return bits_f32((uint32_t)(e + 127) << 23);	/* 2^e, a normal */
}

/*
 * Encoding, on the float's bits, four lanes at a time in a row (SSE2,
 * every x86-64). Pages of fp8 are written from a forward's rows by
 * kvmem_fp8_quant_row: 2.4M values for a 32-token question at Qwen3-8B,
 * which the frexpf of each value (the form before 2026-12-04) made 3.4 ms
 * of the H200 host's warm step (benchmarks.md, "The warm step from the
 * append on the H200"). With a = |x| as bits:
 *  - a NaN (a > 0x7f800000): 0x7f; a >= 448 (0x43e00000), infinity too: 0x7e;
 *  - a normal in e4m3 (a >= 2^-6, 0x3c800000): the exponent and top three
 *    mantissa bits, rounded to nearest even by adding 0x7ffff and the kept
 *    lowest bit, then rebiased from 127 to 7 (minus 120 << 3);
 *  - below: m 2^-9, m = a 2^9 rounded to nearest even by adding 2^23
 *    (exact: a 2^9 < 8), as rintf does in the default rounding mode;
 * then the sign. Every one of the 2^32 floats gives the frexpf form's code,
 * lanes and scalar alike (test_fp8 with KVMEM_TEST_EXHAUSTIVE=1; a stride
 * of them in every run, beside the nearest even code and the lanes against
 * the scalar). One value (a row's tail, kvmem_f32_to_e4m3):
 */
static inline uint8_t e4m3_bits(float x)
{
	const uint32_t u = f32_bits(x), a = u & 0x7fffffffu;
	uint32_t code;

	if (a > 0x7f800000u)
		return KVMEM_E4M3_NAN;
	if (a >= 0x43e00000u)
		code = 0x7e;
	else if (a >= 0x3c800000u)
		code = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
	else
		code = f32_bits(bits_f32(a) * 512.0f + 8388608.0f) - 0x4b000000u;
	return (uint8_t)(code | ((u >> 24) & 0x80u));
}

uint8_t kvmem_f32_to_e4m3(float x)
{
	return e4m3_bits(x);
}

#ifdef __SSE2__
/* Four values' codes, each in its lane's low byte. */
static inline __m128i e4m3_x4(__m128 x)
{
	const __m128i u = _mm_castps_si128(x);
	const __m128i a = _mm_and_si128(u, _mm_set1_epi32(0x7fffffff));
	const __m128i sign = _mm_and_si128(_mm_srli_epi32(u, 24), _mm_set1_epi32(0x80));
	const __m128i lsb = _mm_and_si128(_mm_srli_epi32(a, 20), _mm_set1_epi32(1));
	const __m128i norm = _mm_sub_epi32(
		_mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(a, _mm_set1_epi32(0x7ffff)), lsb), 20),
		_mm_set1_epi32(120 << 3));
	const __m128 t = _mm_add_ps(_mm_mul_ps(_mm_castsi128_ps(a), _mm_set1_ps(512.0f)),
				    _mm_set1_ps(8388608.0f));
	const __m128i sub = _mm_sub_epi32(_mm_castps_si128(t), _mm_set1_epi32(0x4b000000));
	/* a is below 2^31: the signed compares order it */
	const __m128i is_sub = _mm_cmplt_epi32(a, _mm_set1_epi32(0x3c800000));
	const __m128i big = _mm_cmpgt_epi32(a, _mm_set1_epi32(0x43dfffff));
	const __m128i nan = _mm_cmpgt_epi32(a, _mm_set1_epi32(0x7f800000));
	__m128i code = _mm_or_si128(_mm_and_si128(is_sub, sub), _mm_andnot_si128(is_sub, norm));

	code = _mm_or_si128(_mm_and_si128(big, _mm_set1_epi32(0x7e)), _mm_andnot_si128(big, code));
	code = _mm_or_si128(code, sign);
	return _mm_or_si128(_mm_and_si128(nan, _mm_set1_epi32(KVMEM_E4M3_NAN)),
			    _mm_andnot_si128(nan, code));
}
#endif

void kvmem_fp8_quant_row(uint8_t *q, float *scale, const float *x, int n)
{
	const float s = kvmem_fp8_row_scale(x, n);
	/* 1 / s, exact: s = 2^e with e in [-126, 120], so 2^-e by its bits */
	const float inv = bits_f32(0x7f000000u - f32_bits(s));
	int i = 0;

#ifdef __SSE2__
	const __m128 vi = _mm_set1_ps(inv);

	for (; i + 16 <= n; i += 16) {
		const __m128i c0 = e4m3_x4(_mm_mul_ps(_mm_loadu_ps(x + i), vi));
		const __m128i c1 = e4m3_x4(_mm_mul_ps(_mm_loadu_ps(x + i + 4), vi));
		const __m128i c2 = e4m3_x4(_mm_mul_ps(_mm_loadu_ps(x + i + 8), vi));
		const __m128i c3 = e4m3_x4(_mm_mul_ps(_mm_loadu_ps(x + i + 12), vi));

		/* codes 0..255: the saturating packs keep them */
		_mm_storeu_si128((__m128i *)(q + i),
				 _mm_packus_epi16(_mm_packs_epi32(c0, c1), _mm_packs_epi32(c2, c3)));
	}
#endif
	for (; i < n; i++)
		q[i] = e4m3_bits(x[i] * inv);
	*scale = s;
}

void kvmem_fp8_dequant_row(float *x, const uint8_t *q, float scale, int n)
{
	for (int i = 0; i < n; i++)
		x[i] = kvmem_e4m3_to_f32(q[i]) * scale;
}

void kvmem_fp8_roundtrip_rows(float *x, size_t rows, int n)
{
	for (size_t r = 0; r < rows; r++) {
		float *row = x + r * (size_t)n;
		const float s = kvmem_fp8_row_scale(row, n), inv = 1.0f / s;

		for (int i = 0; i < n; i++)
			row[i] = kvmem_e4m3_to_f32(kvmem_f32_to_e4m3(row[i] * inv)) * s;
	}
}

int kvmem_fp8_quant_rows(uint8_t *q, float *scale, const void *x, int x_dtype, size_t rows,
			 int n)
{
	float wide[1024];

	if ((x_dtype != KVMEM_DTYPE_F32 && x_dtype != KVMEM_DTYPE_BF16) || n <= 0 ||
	    (x_dtype == KVMEM_DTYPE_BF16 && n > 1024))
		return kvmem_error(EINVAL, "fp8 quantise: rows of %d values of dtype %d", n, x_dtype);
	for (size_t r = 0; r < rows; r++) {
		const float *row = (const float *)x + r * n;

		if (x_dtype == KVMEM_DTYPE_BF16) {
			kvmem_bf16_to_f32_n(wide, (const uint16_t *)x + r * n, (size_t)n);
			row = wide;
		}
		kvmem_fp8_quant_row(q + r * n, &scale[r], row, n);
	}
	return 0;
}

void kvmem_fp8_dequant_rows_bf16(uint16_t *out, const uint8_t *q, const float *scale,
				 size_t rows, int n)
{
	for (size_t r = 0; r < rows; r++)
		for (int i = 0; i < n; i++)
			out[r * n + i] = kvmem_f32_to_bf16(kvmem_e4m3_to_f32(q[r * n + i]) * scale[r]);
}

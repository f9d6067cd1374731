// SPDX-License-Identifier: MIT
/*
 * e4m3 <-> fp32 and the per-row power-of-two scales (kernels/kernels_fp8.h).
 * Plain arithmetic on exact values: every product by 2^k below is exact
 * (the scales keep the operands far from fp32's under- and overflow), and
 * rintf rounds to nearest even in the default rounding mode.
 */
#include <errno.h>
#include <math.h>

#include "kernels/kernels.h"
#include "kernels/kernels_fp8.h"
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

uint8_t kvmem_f32_to_e4m3(float x)
{
	const uint8_t sign = signbit(x) ? 0x80 : 0;
	float a = fabsf(x), f;
	int k;

	if (isnan(x))			/* one NaN, as the GPU's cvt gives */
		return KVMEM_E4M3_NAN;
	if (a >= KVMEM_E4M3_MAX)		/* saturate, infinity too */
		return sign | 0x7e;
	if (a < 0x1p-6f)			/* subnormal: m * 2^-9, m = 8 is 2^-6 */
		return sign | (uint8_t)rintf(a * 0x1p9f);
	f = frexpf(a, &k);			/* a = f * 2^k, f in [0.5, 1) */
	/* Mantissa steps of 2^(k-4); 16 steps is the next binade's first
	 * value, whose code follows on. Never past 0x7e: a < 448. */
	return sign | (uint8_t)(((k + 6) << 3) + (int)rintf(f * 16.0f) - 8);
}

float kvmem_fp8_row_scale(const float *x, int n)
{
	float amax = 0.0f, f;
	int k, e;

	for (int i = 0; i < n; i++)
		if (isfinite(x[i]) && fabsf(x[i]) > amax)
			amax = fabsf(x[i]);
	if (amax == 0.0f)
		return 1.0f;
	/* amax = f * 2^k; amax <= 448 * 2^e = 0.875 * 2^(e + 9). */
	f = frexpf(amax, &k);
	e = k - 9 + (f > 0.875f);
	e = e < -126 ? -126 : e > 120 ? 120 : e;
	return ldexpf(1.0f, e);
}

void kvmem_fp8_quant_row(uint8_t *q, float *scale, const float *x, int n)
{
	const float s = kvmem_fp8_row_scale(x, n), inv = 1.0f / s;	/* exact: s = 2^e */

	for (int i = 0; i < n; i++)
		q[i] = kvmem_f32_to_e4m3(x[i] * inv);
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

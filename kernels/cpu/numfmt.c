// SPDX-License-Identifier: MIT
/*
 * bf16 and fp16 <-> fp32 conversions (bit manipulation, no hardware
 * instructions assumed), both rounding to nearest even.
 */

#include "kernels/kernels.h"
#include "kernels/cpu/bits.h"

float kvmem_bf16_to_f32(uint16_t h)
{
	return bits_f32((uint32_t)h << 16);
}

uint16_t kvmem_f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);

	/* NaN: keep the sign and a quiet payload bit so it stays a NaN. */
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040u);
	/* Round to nearest even: add 0x7fff plus the lowest kept bit. */
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

float kvmem_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t man = h & 0x3ffu;

	if (exp == 0x1f)		/* inf or NaN */
		return bits_f32(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {
		if (man == 0)
			return bits_f32(sign);
		/* Subnormal: value = man * 2^-24, exact in fp32. */
		float v = (float)man * 0x1p-24f;

		return bits_f32(sign | f32_bits(v));
	}
	return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t kvmem_f32_to_f16(float f)
{
	uint32_t u = f32_bits(f);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t abs = u & 0x7fffffffu;

	if (abs > 0x7f800000u)			/* NaN: quiet, keep top payload */
		return sign | 0x7e00u | (uint16_t)((abs >> 13) & 0x3ffu);
	if (abs >= 0x477ff000u)			/* rounds to >= 65520: inf */
		return sign | 0x7c00u;
	if (abs < 0x38800000u) {		/* below 2^-14: subnormal or zero */
		/* value * 2^24 rounded to an integer mantissa, ties to even. */
		uint32_t exp = abs >> 23;
		if (exp < 102)			/* < 2^-25: rounds to zero */
			return sign;
		uint32_t man = (abs & 0x7fffffu) | 0x800000u;
		uint32_t shift = 126 - exp;	/* 14..24 */
		uint32_t half = 1u << (shift - 1);
		uint32_t r = man >> shift;
		uint32_t rest = man & ((1u << shift) - 1);

		if (rest > half || (rest == half && (r & 1u)))
			r++;
		return sign | (uint16_t)r;
	}
	/* Normal: rebias the exponent, round the 13 dropped bits to even. */
	abs += 0xfffu + ((abs >> 13) & 1u);
	return sign | (uint16_t)((abs - (112u << 23)) >> 13);
}

static inline uint16_t bf16_select(uint32_t u)
{
	uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
	uint32_t q = (u >> 16) | 0x0040u;

	return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

void kvmem_f32_to_bf16_n(uint16_t *restrict dst, const float *restrict src, size_t n)
{
	size_t i = 0;

	/* kvmem_f32_to_bf16 with the NaN case as a select, not a branch, in
	 * groups of 16: a fixed trip count that -O2's cheap cost model
	 * vectorises (an open-ended loop it leaves scalar). */
	for (; i + 16 <= n; i += 16)
		for (int j = 0; j < 16; j++)
			dst[i + j] = bf16_select(f32_bits(src[i + j]));
	for (; i < n; i++)
		dst[i] = bf16_select(f32_bits(src[i]));
}

void kvmem_bf16_to_f32_n(float *restrict dst, const uint16_t *restrict src, size_t n)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16)	/* groups of 16: vectorised, as above */
		for (int j = 0; j < 16; j++)
			dst[i + j] = bits_f32((uint32_t)src[i + j] << 16);
	for (; i < n; i++)
		dst[i] = kvmem_bf16_to_f32(src[i]);
}

void kvmem_f16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = kvmem_f16_to_f32(src[i]);
}

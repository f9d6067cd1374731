/* SPDX-License-Identifier: MIT */
/*
 * e4m3 on the device, bit for bit kernels/cpu/fp8.c (kernels/kernels_fp8.h):
 * decoding by the format's fields (exact), or two at a time by Hopper's
 * cvt.rn.f16x2.e4m3x2 (exact too: every e4m3 value is an fp16 one), which
 * the hot loops use; encoding with cvt.rn.satfinite (nearest even,
 * saturating at 448, NaN to 0x7f), scales as powers of two from the row's
 * largest finite magnitude. A NaN code dequantised to bf16 is 0x7fc0, the
 * twin's (the device's arithmetic would make 0x7fff of it).
 */
#ifndef KVMEM_CUDA_FP8_CUH
#define KVMEM_CUDA_FP8_CUH

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "cuda_int.h"

__device__ __forceinline__ float e4m3_to_f32(uint8_t q)
{
	const int e = (q >> 3) & 15, m = q & 7;
	float a;

	if (e == 15 && m == 7)
		return __uint_as_float(0x7fc00000u);
	/* (8 + m) 2^(e - 10), or m 2^-9: products by exact powers of two */
	a = e ? (float)(8 + m) * __uint_as_float((uint32_t)(e + 117) << 23)
	      : (float)m * __uint_as_float(118u << 23);
	return (q & 0x80) ? -a : a;
}

/* Two e4m3 bytes (the low one first) as floats. */
__device__ __forceinline__ void e4m3x2_to_f32(uint16_t two, float *lo, float *hi)
{
	const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);

	*lo = __half2float(__ushort_as_half(r.x));
	*hi = __half2float(__ushort_as_half(r.y));
}

/* bf16 of q * s, the twin's bits (a NaN code: 0x7fc0). */
__device__ __forceinline__ uint16_t e4m3_bf16(uint8_t q, float x, float s)
{
	return (q & 0x7f) == 0x7f ? (uint16_t)0x7fc0 : f2bf(x * s);
}

/* 1 when one of w's four e4m3 bytes is a NaN code (its low 7 bits all set). */
__device__ __forceinline__ int e4m3x4_nan(uint32_t w)
{
	return ((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u ? 1 : 0;
}

/* Four e4m3 bytes as four f16 (two words, the low byte's value in each
 * word's low half): cvt alone, exact (a NaN code gives an f16 NaN). The
 * f16-K form of decode attention v5 (fp8_f16k) uses it as it is. */
__device__ __forceinline__ void e4m3x4_f16(uint32_t w, uint32_t *lo, uint32_t *hi)
{
	for (int i = 0; i < 2; i++) {
		const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> (16 * i)),
								 __NV_E4M3);

		*(i ? hi : lo) = (uint32_t)r.x | (uint32_t)r.y << 16;
	}
}

/*
 * Four e4m3 bytes (w, the lowest first) as four bf16 (two words, the low
 * byte's value in each word's low half), unscaled and exact: Hopper's
 * cvt.rn.f16x2.e4m3x2 gives fp16 values that are all normal or zero
 * (e4m3's smallest, 2^-9, is above fp16's 2^-14), so each fp16's exponent
 * and top three mantissa bits, moved down three places, are a bf16 whose
 * exponent is 112 short; one bf16x2 multiply by 2^112 puts it right (zero
 * stays zero). 0 when a byte is a NaN code (its caller decodes the word
 * the slow way, to the twin's 0x7fc0). The decode kernel's inner loop:
 * about two instructions a value where the field decode took ten.
 */
__device__ __forceinline__ int e4m3x4_bf16(uint32_t w, uint32_t *lo, uint32_t *hi)
{
	const __nv_bfloat162 two112 = __halves2bfloat162(__ushort_as_bfloat16(0x7780),
							 __ushort_as_bfloat16(0x7780));
	uint32_t hw[2];

	if (e4m3x4_nan(w))
		return 0;
	e4m3x4_f16(w, &hw[0], &hw[1]);
	for (int i = 0; i < 2; i++) {
		const uint32_t h = hw[i];
		const uint32_t b = ((h >> 3) & 0x0fff0fffu) | (h & 0x80008000u);
		__nv_bfloat162 v = __hmul2(*(const __nv_bfloat162 *)&b, two112);

		*(i ? hi : lo) = *(const uint32_t *)&v;
	}
	return 1;
}

/*
 * The same without the conversion unit (an experiment: fp8_int, off by
 * default): a byte's exponent and mantissa (its low 7 bits) moved up four
 * places and its sign up eight are a bf16 worth the e4m3 value times
 * 2^-120 (a normal's exponent field lands 120 short; a subnormal m 2^-9
 * becomes the bf16 subnormal m 2^-129), and one bf16x2 multiply by 2^120
 * makes it exact, if bf16 arithmetic keeps subnormals (kvmem_gpu_check
 * --fp8 compares the bits). Byte permutes, shifts and logic ops: whether
 * that beats cvt's throughput is what --bench says.
 */
__device__ __forceinline__ int e4m3x4_bf16_int(uint32_t w, uint32_t *lo, uint32_t *hi)
{
	const __nv_bfloat162 two120 = __halves2bfloat162(__ushort_as_bfloat16(0x7b80),
							 __ushort_as_bfloat16(0x7b80));

	if (e4m3x4_nan(w))
		return 0;
	for (int i = 0; i < 2; i++) {
		/* bytes 2i and 2i + 1 in the low bytes of the two halves */
		const uint32_t u = __byte_perm(w, 0, i ? 0x4342 : 0x4140);
		const uint32_t b = ((u << 4) & 0x07f007f0u) | ((u << 8) & 0x80008000u);
		__nv_bfloat162 v = __hmul2(*(const __nv_bfloat162 *)&b, two120);

		*(i ? hi : lo) = *(const uint32_t *)&v;
	}
	return 1;
}

/* Two e4m3 codes of (a, b) as bf16x2, exact. sel (prmt's default mode)
 * puts code 0 in byte 0, its sign replicated in byte 1, code 1 in byte 2,
 * its sign in byte 3: shifted up four, each code's exponent and mantissa
 * sit where a bf16's low exponent bits and top mantissa bits do and its
 * sign byte covers bit 15 (31); the mask keeps those. The exponent lands
 * 120 short: one multiply by 2^120 puts it right (subnormals too). */
template <unsigned SEL> __device__ __forceinline__ uint32_t e4m3_pair_bf16(uint32_t a, uint32_t b)
{
	const __nv_bfloat162 two120 = __halves2bfloat162(__ushort_as_bfloat16(0x7b80),
							 __ushort_as_bfloat16(0x7b80));
	uint32_t u;

	asm("prmt.b32 %0, %1, %2, %3;" : "=r"(u) : "r"(a), "r"(b), "n"(SEL));
	u = (u * 16u) & 0x87f087f0u;	/* a multiply: the integer pipe has the permutes */
	const __nv_bfloat162 v = __hmul2(*(const __nv_bfloat162 *)&u, two120);

	return *(const uint32_t *)&v;
}
/* prmt selectors: source bytes lo and hi (0-7: a's bytes, then b's), each
 * followed by its sign; bytes 0, 1 / 2, 3 of one word; byte j of two. */
#define E4_SEL(lo, hi) ((lo) | (8u | (lo)) << 4 | (hi) << 8 | (8u | (hi)) << 12)
#define E4_LO E4_SEL(0u, 1u)
#define E4_HI E4_SEL(2u, 3u)
#define E4_J(j) E4_SEL((j), 4u + (j))

/* acc's bit 7 of a byte set when a byte of w0 or w1 is a NaN code (0x7f,
 * 0xff); the other bits are noise. */
__device__ __forceinline__ uint32_t e4m3_nan_acc(uint32_t acc, uint32_t w0, uint32_t w1)
{
	return acc | ((w0 & 0x7f7f7f7fu) + 0x01010101u) | ((w1 & 0x7f7f7f7fu) + 0x01010101u);
}

/* Two floats as e4m3 codes (lo in the low byte): one cvt for both, the
 * bits of f32_to_e4m3 on each (a NaN made 0x7f whatever its sign). */
__device__ __forceinline__ uint16_t f32x2_to_e4m3x2(float lo, float hi)
{
	uint16_t r = (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE,
							__NV_E4M3);

	if (isnan(lo))
		r = (uint16_t)((r & 0xff00u) | 0x7fu);
	if (isnan(hi))
		r = (uint16_t)((r & 0x00ffu) | 0x7f00u);
	return r;
}

__device__ __forceinline__ uint8_t f32_to_e4m3(float x)
{
	/* NaN: one code whatever its sign, as the twin gives */
	if (isnan(x))
		return 0x7f;
	return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

/* The power of two that brings amax (finite, >= 0) into (224, 448]. */
__device__ __forceinline__ float fp8_scale_of(float amax)
{
	int k, e;

	if (amax == 0.0f)
		return 1.0f;
	/* amax = f 2^k, f in [0.5, 1) */
	const float f = frexpf(amax, &k);

	e = k - 9 + (f > 0.875f);
	e = e < -126 ? -126 : e > 120 ? 120 : e;
	return __uint_as_float((uint32_t)(e + 127) << 23);
}

/* The scale of a row of n bf16 values that a warp holds (lane i reads
 * x[i], x[i + 32], ...): the row's largest finite magnitude over the
 * warp, as kvmem_fp8_row_scale finds it; every lane gets it. */
__device__ __forceinline__ float fp8_warp_row_scale(const uint16_t *x, int n, int lane)
{
	float amax = 0.0f;

	for (int i = lane; i < n; i += 32) {
		const float a = fabsf(bf2f(x[i]));

		if (isfinite(a) && a > amax)
			amax = a;
	}
	for (int o = 16; o; o >>= 1)
		amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
	return fp8_scale_of(amax);
}

#endif

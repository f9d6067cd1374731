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

#endif

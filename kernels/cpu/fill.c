// SPDX-License-Identifier: MIT
/*
 * Filling bf16 arrays: constants (norm weights), and reproducible random
 * values for models that exist only as a geometry (the benchmarks' Qwen3-8B
 * made on the GPU, no 16 GB file). Twins of kernels/cuda/fill.cu.
 */
#include "kernels/kernels_bf16.h"

/* Element i's value: splitmix64(seed + i)'s top 24 bits as u in [0, 1),
 * then (2u - 1) * (sqrt(3) * scale), in fp32 with one rounding per step, so
 * the GPU (which does the same steps with _rn intrinsics) gets the same
 * bits. Uniform on [-sqrt(3) s, sqrt(3) s): variance s^2. */
static float value(uint64_t seed, size_t i, float scale)
{
	uint64_t z = kvmem_mix64(seed + KVMEM_GOLDEN_GAMMA * (uint64_t)(i + 1));
	float u, a;

	u = (float)(z >> 40) * 0x1p-24f;
	a = 1.7320508f * scale;
	return (u + u - 1.0f) * a;
}

void kvmem_random_bf16(uint16_t *dst, size_t n, uint64_t seed, float scale)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = kvmem_f32_to_bf16(value(seed, i, scale));
}

void kvmem_fill_bf16(uint16_t *dst, size_t n, float v)
{
	uint16_t h = kvmem_f32_to_bf16(v);

	for (size_t i = 0; i < n; i++)
		dst[i] = h;
}

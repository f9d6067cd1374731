// SPDX-License-Identifier: MIT
/*
 * Filling bf16 arrays on the GPU: constants and reproducible random values
 * (kernels/cpu/fill.c is the twin and says the formula). Each element is a
 * pure function of (seed, index), so the result does not depend on the grid.
 */
#include "cuda_int.h"

__global__ void random_kernel(uint16_t *dst, size_t n, uint64_t seed, float scale)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
		float u, a;

		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		z ^= z >> 31;
		u = __fmul_rn((float)(z >> 40), 0x1p-24f);
		a = __fmul_rn(1.7320508f, scale);
		dst[i] = f2bf(__fmul_rn(__fsub_rn(__fadd_rn(u, u), 1.0f), a));
	}
}

__global__ void fill_kernel(uint16_t *dst, size_t n, uint16_t h)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		dst[i] = h;
}

static unsigned grid_for(const kvmem_cuda_ctx *c, size_t n)
{
	size_t g = (n + 255) / 256, cap = (size_t)c->sms * 32;

	return (unsigned)(g < 1 ? 1 : g > cap ? cap : g);
}

extern "C" int kvmem_cuda_random_bf16(kvmem_cuda_ctx *c, uint16_t *dst, size_t n, uint64_t seed,
				      float scale)
{
	if (!n)
		return 0;
	random_kernel<<<grid_for(c, n), 256, 0, c->stream>>>(dst, n, seed, scale);
	return kvmem_cuda_launched("random fill");
}

extern "C" int kvmem_cuda_fill_bf16(kvmem_cuda_ctx *c, uint16_t *dst, size_t n, float v)
{
	if (!n)
		return 0;
	fill_kernel<<<grid_for(c, n), 256, 0, c->stream>>>(dst, n, kvmem_f32_to_bf16(v));
	return kvmem_cuda_launched("fill");
}

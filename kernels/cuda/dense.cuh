/* SPDX-License-Identifier: MIT */
/*
 * dense.cu's RMSNorm of one fp32 row by one block and its SwiGLU of one
 * element, shared with the fused kernels of a decode step (gemv.cu: norm +
 * GEMV, GEMV + SwiGLU), so fused and unfused give the same bits: the fused
 * GEMV's input is exactly what kvmem_cuda_rmsnorm_bf16 would have written,
 * its SwiGLU exactly kvmem_cuda_swiglu_bf16's.
 */
#ifndef KVMEM_CUDA_DENSE_CUH
#define KVMEM_CUDA_DENSE_CUH

#include "cuda_int.h"

#define RMS_THREADS 256		/* the block both kernels run the norm with */

__device__ __forceinline__ double rms_warp_sum(double v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/*
 * r = 1 / sqrt(mean(x^2) + eps) of x[0..dim), rounded to fp32 as the twin
 * does, returned to every thread. Thread t sums x[t], x[t + 256], ... in
 * double with explicit round-to-nearest products and sums (no FMA: the
 * bits do not depend on what the compiler contracts where this is
 * inlined), then a fixed shuffle tree per warp, then warp 0 adds the eight
 * warps' partials by the same tree. Every thread of a RMS_THREADS block
 * must call it (two __syncthreads inside).
 */
__device__ __forceinline__ float rms_block(const float *x, int dim, float eps)
{
	__shared__ double part[RMS_THREADS / 32];
	__shared__ float r_sh;
	double ss = 0.0;

	for (int d = threadIdx.x; d < dim; d += RMS_THREADS) {
		const double v = x[d];

		ss = __dadd_rn(ss, __dmul_rn(v, v));
	}
	ss = rms_warp_sum(ss);
	if ((threadIdx.x & 31) == 0)
		part[threadIdx.x >> 5] = ss;
	__syncthreads();
	if (threadIdx.x < 32) {
		double v = threadIdx.x < RMS_THREADS / 32 ? part[threadIdx.x] : 0.0;

		v = rms_warp_sum(v);
		if (threadIdx.x == 0)
			r_sh = (float)(1.0 / sqrt(v / dim + (double)eps));
	}
	__syncthreads();
	return r_sh;
}

/* One element of the normalised row: bf16((x * r) * w), two fp32 products. */
__device__ __forceinline__ uint16_t rms_apply(float x, float r, uint16_t w)
{
	return f2bf(__fmul_rn(__fmul_rn(x, r), bf2f(w)));
}

/* bf16(silu(g) * u) of two bf16 values, in fp32 with expf, as the twin. */
__device__ __forceinline__ uint16_t swiglu_one(uint16_t g16, uint16_t u16)
{
	const float g = bf2f(g16), u = bf2f(u16);

	return f2bf(__fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u));
}

#endif

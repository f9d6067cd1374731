/* SPDX-License-Identifier: MIT */
/*
 * Block-wide helpers for selection on the GPU (sample.cu, score.cu): an
 * exclusive scan and a radix select of the k-th largest rank key, each run
 * by every thread of one block.
 */
#ifndef KVMEM_CUDA_SELECT_CUH
#define KVMEM_CUDA_SELECT_CUH

#include "cuda_int.h"

/* Exclusive prefix sum of v over the block (thread order); *total gets the
 * sum. Every thread must call it; it synchronises the block. */
template <typename T> __device__ T block_exclusive_scan(T v, T *total)
{
	__shared__ T warp_tot[32];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	T x = v;

	for (int o = 1; o < 32; o <<= 1) {
		T y = __shfl_up_sync(0xffffffffu, x, o);

		if (lane >= o)
			x += y;
	}
	__syncthreads();	/* warp_tot may still be read by a previous call */
	if (lane == 31)
		warp_tot[warp] = x;
	__syncthreads();
	if (warp == 0) {
		T w = lane < nw ? warp_tot[lane] : (T)0;

		for (int o = 1; o < 32; o <<= 1) {
			T y = __shfl_up_sync(0xffffffffu, w, o);

			if (lane >= o)
				w += y;
		}
		if (lane < nw)
			warp_tot[lane] = w;	/* inclusive over warps */
	}
	__syncthreads();
	if (total)
		*total = warp_tot[nw - 1];
	return x - v + (warp > 0 ? warp_tot[warp - 1] : (T)0);
}

/*
 * The k-th largest (1 <= k <= n) of the rank keys key(i), i < n, by four
 * 8-bit radix passes with a shared histogram. Returns the key T; *need gets
 * how many of the elements equal to T are among the k largest (>= 1); the
 * elements above T number k - *need. KeyFn: uint32_t (int64_t i).
 */
template <typename KeyFn>
__device__ uint32_t block_radix_select(KeyFn key, int64_t n, int64_t k, int64_t *need)
{
	__shared__ unsigned int hist[256];
	__shared__ uint32_t s_prefix;
	__shared__ long long s_k;
	uint32_t prefix = 0, mask = 0;
	long long kk = k;

	for (int shift = 24; shift >= 0; shift -= 8) {
		for (int b = threadIdx.x; b < 256; b += blockDim.x)
			hist[b] = 0;
		__syncthreads();
		for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
			uint32_t x = key(i);

			if ((x & mask) == prefix)
				atomicAdd(&hist[(x >> shift) & 255u], 1u);
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			long long cum = 0;

			for (int b = 255; b >= 0; b--) {
				if (cum + hist[b] >= kk) {
					s_prefix = prefix | ((uint32_t)b << shift);
					s_k = kk - cum;
					break;
				}
				cum += hist[b];
			}
		}
		__syncthreads();
		prefix = s_prefix;
		kk = s_k;
		mask |= 255u << shift;
		__syncthreads();
	}
	*need = kk;
	return prefix;
}

#endif

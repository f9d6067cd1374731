/* SPDX-License-Identifier: MIT */
/*
 * The tensor-core pieces the attention kernels share (attention.cu's flash
 * and decode kernels, attention_fp8.cu's decode over fp8 in registers):
 * cp.async, mma.sync m16n8k16 and ldmatrix wrappers, the bf16 pair pack,
 * and the decode split rule the kernels and the host both follow.
 */
#ifndef KVMEM_KERNELS_CUDA_ATTENTION_MMA_CUH
#define KVMEM_KERNELS_CUDA_ATTENTION_MMA_CUH

#include "cuda_int.h"

/* The most splits a combine takes (combine_kernel, the decode kernels'
 * folded combine): the split targets are capped at it. */
#define COMBINE_MAX 128

/* The decode split rule, shared by the kernels and the host: tiles of bn
 * keys, at most `target` splits, each a whole number of tiles and at
 * least min_per of them (but for the last, which is shorter). Depends on
 * the key count, the target and min_per only, never on a batch. */
__host__ __device__ __forceinline__ void decode_split(int n_kv, int bn, int target, int min_per,
						      int *kps, int *splits)
{
	const int tiles = (n_kv + bn - 1) / bn;
	const int want = (tiles + target - 1) / target;
	const int per = tiles ? (want > min_per ? want : min_per) : 1;

	*kps = per * bn;
	*splits = tiles ? (tiles + per - 1) / per : 0;
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid)
{
	unsigned s = (unsigned)__cvta_generic_to_shared(smem);
	int n = valid ? 16 : 0;	/* 0: write zeros, read nothing */

	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}

__device__ __forceinline__ void cp_async_commit(void)
{
	asm volatile("cp.async.commit_group;\n" ::);
}

template <int N> __device__ __forceinline__ void cp_async_wait(void)
{
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* d += a . b, one m16n8k16 tile: bf16 in, fp32 accumulate. */
__device__ __forceinline__ void mma16816(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The same with f16 in (v5 over fp8 with KVMEM_CUDA_FP8_F16K: Q and the
 * e4m3 keys, both exact in f16). */
__device__ __forceinline__ void mma16816_h(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two fp32 as bf16x2, lo in the low half (the lower column of a fragment):
 * one cvt.rn.bf16x2.f32, the bits of f2bf for every value but NaN (P and
 * the outputs are never NaN for finite inputs). */
__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi)
{
	__nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);

	return *(uint32_t *)&h;
}

__device__ __forceinline__ void ldsm_x4_u(uint32_t *r, uint32_t s)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(s));
}

__device__ __forceinline__ void ldsm_x4_tu(uint32_t *r, uint32_t s)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(s));
}

#endif

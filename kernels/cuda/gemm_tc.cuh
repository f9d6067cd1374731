/* SPDX-License-Identifier: MIT */
/*
 * The tensor-core GEMM for few rows: what its two kernels share (gemm_tc.cu,
 * a block's warps splitting the input; gemm_tcc.cu, a cluster's blocks
 * splitting it with the rows in shared memory). Both sum a row in the same
 * order, so they give the same bits (see gemm_tc.cu's head for why a row's
 * sum never depends on n).
 */
#ifndef KVMEM_CUDA_GEMM_TC_CUH
#define KVMEM_CUDA_GEMM_TC_CUH

#include "cuda_int.h"

#define TC_WARPS 8		/* warps per block */
#define TC_U 4			/* 32-element blocks of loads in flight per lane */
#define TC_U1 4			/* the same for one x tile and one weight tile (a lone row) */
/* Warps (gemm_tc.cu) or a cluster's blocks (gemm_tcc.cu) splitting a tile's input. */
#define TC_MAX_KS 8
/* Blocks per multiprocessor the split aims for. 8 (2 before 2026-12-02)
 * gives every Qwen3-8B layer shape the most split, ks 8: measured shape by
 * shape (kvmem_gpu_check --gemm-tc-shapes, H200), ks 8 was the fastest or
 * within 2% at 1 and 16 rows, and gate|up (ks 2 by the old target) went
 * from 2907 to 3202 GB/s at 16 rows and 3102 to 3304 alone. */
#define TC_BLOCKS_PER_SM 8
#define TC_ROWS 64		/* x rows per pass: 8 tiles of 8 */

__device__ __forceinline__ void mma_bf16(float *d, uint32_t a0, uint32_t a1, uint32_t a2,
					 uint32_t a3, uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void tc_store(void *y, int mode, size_t at, float v)
{
	if (mode == KVMEM_GEMM_BF16)
		((uint16_t *)y)[at] = f2bf(v);
	else if (mode == KVMEM_GEMM_F32)
		((float *)y)[at] = v;
	else
		((float *)y)[at] = __fadd_rn(((float *)y)[at], v);
}

/* The split of a shape (ks warps or blocks share a tile's input): gemm_tc.cu. */
int kvmem_cuda_gemm_tc_splits(const kvmem_cuda_ctx *c, int in, int out);

#endif

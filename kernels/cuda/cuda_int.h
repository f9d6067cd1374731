/* SPDX-License-Identifier: MIT */
/*
 * Private to kernels/cuda: the context, error mapping, bf16 helpers shared by
 * the kernels. C++ (CUDA) only.
 */
#ifndef KVMEM_CUDA_INT_H
#define KVMEM_CUDA_INT_H

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/kernels_cuda.h"
#include "kvmem/kvmem.h"

/* lt_load.cu: load cuBLASLt (dlopen) once; NULL, or why it cannot be. */
const char *kvmem_cuda_lt_load(void);

#define KVMEM_GEMM_CACHE 48	/* GEMM shapes whose algorithm is kept */
/* Decode's fused ops on (1) or off (0) when KVMEM_CUDA_FUSE is not set:
 * off until measured on the GPU (tests/gpu/decode_fuse.sh). */
#define KVMEM_CUDA_FUSE_DEFAULT 1	/* measured: decode 1.09x at 4K, 1.06x at 32K */
/* The tensor-core GEMM for decode's rows (gemm_tc.cu) when KVMEM_CUDA_GEMM_TC
 * is not set: off until measured on the GPU (tests/gpu/batch26h.sh). */
#define KVMEM_CUDA_GEMM_TC_DEFAULT 0
/* The rows whose algorithm every GEMM of 2+ rows takes (gemm.cu) when
 * KVMEM_CUDA_GEMM_PIN is not set; 0: each n its own. */
#define KVMEM_CUDA_GEMM_PIN_DEFAULT 0

struct gemm_plan {
	int n, in, out, mode, align, pinned;	/* key; n == 0: empty slot */
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t a, b, c;
	cublasLtMatmulAlgo_t algo;
	int has_algo;
};

struct kvmem_cuda_ctx {
	int device, sms;
	char name[256];
	cudaStream_t stream;
	cublasLtHandle_t lt;
	void *lt_ws;		/* cuBLASLt workspace */
	size_t lt_ws_bytes;
	void *scratch;		/* ops' temporary device memory */
	size_t scratch_bytes;
	uint64_t scratch_gen;	/* bumped when scratch moves (a graph must be re-captured) */
	int no_gemv;		/* kvmem_cuda_tune "gemv" off: n == 1 through cuBLASLt */
	int gemv_split;		/* "gemv_split" on: gemv.cu's split-K kernel (KVMEM_CUDA_GEMV_SPLIT) */
	int gemv_ks;		/* "gemv_ks": its split forced (1, 2, 4, 8); 0: by shape */
	int fuse;		/* "fuse": decode's fused norm + GEMV (+ SwiGLU) (KVMEM_CUDA_FUSE) */
	int gemm_tc;		/* "gemm_tc": decode's GEMMs (1..n rows) on gemm_tc.cu (KVMEM_CUDA_GEMM_TC) */
	int gemm_tc_ks;		/* "gemm_tc_ks": its split forced (1, 2, 4, 8); 0: by shape */
	int gemm_tc_mt;		/* "gemm_tc_mt": its weight tiles a warp forced (1, 2); 0: by n */
	int gemm_tc_u;		/* "gemm_tc_u": its loads in flight for a lone row (4, 8); 0: 4 */
	int gemm_tc_xpre;	/* "gemm_tc_xpre": x's loads issued with the weights'
				 * at 2+ rows: 0 by rows (9-32), 1 always, 2 never
				 * (KVMEM_CUDA_GEMM_TC_XPRE) */
	int slow_scores;	/* kvmem_cuda_tune "fast_scores" off: the 2-byte-load scorer */
	int att_prefill, att_decode;	/* the main path's attention versions (attention.cu;
					 * KVMEM_CUDA_PREFILL / KVMEM_CUDA_DECODE override) */
	unsigned *att_cnt;	/* decode attention v5's per-KV-head counters (device, zero) */
	int dec_min_tiles;	/* v5's least stages a split (KVMEM_CUDA_DEC_MIN_TILES, 1..64;
				 * attention.cu's DEC_MIN_TILES when unset) */
	int fp8_f16k;		/* v5 over fp8: Q K^T on the f16 MMA (on; KVMEM_CUDA_FP8_F16K=0:
				 * off; attention.cu's dec_body) */
	int fp8_int;		/* v5 over fp8: e4m3 -> bf16 by integer ops (on;
				 * KVMEM_CUDA_FP8_INT=0: off; fp8.cuh's e4m3x4_bf16_int) */
	int fp8_reg;		/* v5 over fp8 in registers, no K/V tiles (on;
				 * KVMEM_CUDA_FP8_REG=0: off; attention_fp8.cu) */
	int fp8_reg_blocks;	/* its blocks a multiprocessor and split target: 2 or 3
				 * (KVMEM_CUDA_FP8_REG_BLOCKS; 2 when unset) */
	int fp8_gather_cvt;	/* the fp8 view gather's e4m3 decode and encode by
				 * cvt, two values an instruction (on;
				 * KVMEM_CUDA_FP8_GATHER_CVT=0: off; fp8_view.cu) */
	int gemm_pin;		/* "gemm_pin": GEMMs of 2 .. gemm_pin rows all take the
				 * algorithm cuBLASLt picks for gemm_pin rows, split-K
				 * off, so a row's bits do not depend on how many rows
				 * are beside it (KVMEM_CUDA_GEMM_PIN; 0: picked for
				 * each n) ... */
	int combine_block;	/* "combine_block" on: the flash attention's split combine
				 * a block a row, as before 2026-12-06 (the same bits;
				 * comparisons), else a warp a row */
	int gemm_pin_all;	/* ... and, while "gemm_pin_all" is on, GEMMs of any
				 * rows (a batched prefill's, cuda_fwd_prefill.c) */
	struct gemm_plan plans[KVMEM_GEMM_CACHE];
	int next_plan;		/* round-robin replacement */
};

/* A kept GEMM plan's cuBLASLt objects freed, the slot emptied (gemm.cu). */
void kvmem_cuda_gemm_plan_free(struct gemm_plan *g);
/* -EIO (or -ENOMEM) with "<what>: <CUDA's message>". */
int kvmem_cuda_err(cudaError_t e, const char *what);
/* The last launch's error, as kvmem_cuda_err (0 when it was accepted). */
int kvmem_cuda_launched(const char *what);
/* gemv.cu: the one-row GEMM (n == 1, in % 8 == 0, x and w 16-byte
 * aligned; kvmem_cuda_gemm_bf16 checks), by the kernel the context picks. */
int kvmem_cuda_gemv_bf16(kvmem_cuda_ctx *c, void *y, int mode, const uint16_t *x,
			 const uint16_t *w, int in, int out);
/* Whether `ks` is a split the split GEMV takes (0: by shape). */
int kvmem_cuda_gemv_check_ks(int ks);
/* gemm_tc.cu: whether `ks` is a split the tensor-core GEMM takes. */
int kvmem_cuda_gemm_tc_check_ks(int ks);
/* gemm_tc.cu: a lone decode step's fused norm + GEMM (+ SwiGLU) on it, for
 * gemv.cu's fused entries when "gemm_tc" is on (one row, in % 8 == 0, w
 * and the row 16-byte aligned, in * 2 bytes of shared memory): the bits of
 * rmsnorm then kvmem_cuda_gemm_tc_bf16 (then swiglu). */
int kvmem_cuda_tc_norm_gemm_bf16(kvmem_cuda_ctx *c, void *y, int mode, const float *x,
				 const uint16_t *norm_w, float eps, const uint16_t *w, int in,
				 int out);
int kvmem_cuda_tc_norm_gemm_swiglu_bf16(kvmem_cuda_ctx *c, uint16_t *act, const float *x,
					const uint16_t *norm_w, float eps, const uint16_t *w,
					int in, int inter);
/* Scratch of at least `bytes` (grows outside a capture only). */
int kvmem_cuda_scratch(kvmem_cuda_ctx *c, size_t bytes, void **p);
/* Per-device kernel attributes of the attention, set when a context is
 * made (never inside a stream capture). */
extern "C" int kvmem_cuda_attention_setup(kvmem_cuda_ctx *c);

static inline size_t kvmem_align_up(size_t x, size_t a)
{
	return (x + a - 1) / a * a;
}

/* ---- device helpers ------------------------------------------------------ */
#ifdef __CUDACC__
__device__ __forceinline__ float bf2f(uint16_t h)
{
	return __uint_as_float((uint32_t)h << 16);
}

/* fp32 -> bf16, nearest even, NaN kept quiet: bit for bit kvmem_f32_to_bf16. */
__device__ __forceinline__ uint16_t f2bf(float f)
{
	uint32_t u = __float_as_uint(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

/* double -> bf16 rounded once (see kernels/cpu/bf16_ops.c: f64_to_bf16). */
__device__ __forceinline__ uint16_t d2bf(double x)
{
	float f = __double2float_rn(x);
	uint32_t u = __float_as_uint(f);

	if ((u & 0xffffu) == 0x8000u && (double)f != x && isfinite(f))
		u += (fabs(x) > fabs((double)f)) ? 1 : -1;
	return f2bf(__uint_as_float(u));
}

/* Order-preserving key of a float for "higher is better" selection: NaN
 * ranks as -inf, -0 as +0 (they compare equal in C), larger key = larger
 * value. */
__device__ __forceinline__ uint32_t rank_key(float f)
{
	uint32_t u = __float_as_uint(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)	/* NaN */
		u = 0xff800000u;
	if ((u & 0x7fffffffu) == 0)		/* -0 */
		u = 0;
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t k)
{
	return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
#endif

#endif

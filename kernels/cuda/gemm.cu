// SPDX-License-Identifier: MIT
/*
 * GEMM through cuBLASLt (twin: kvmem_gemm_bf16 in kernels/cpu/bf16_ops.c).
 *
 * y[n][out] = x[n][in] . w[out][in]^T, row-major. cuBLASLt is column-major:
 * read as such, w is an in x out matrix and x an in x n matrix, so
 * y^T (out x n, ld out) = op(W) X with op = transpose: the "TN" form, the
 * layout Hopper's kernels prefer. Inputs bf16, compute CUBLAS_COMPUTE_32F
 * (fp32 accumulation, no reduced-precision reductions), output bf16 or fp32,
 * beta = 1 for KVMEM_GEMM_F32_ADD (the residual add fused into the GEMM).
 *
 * Why cuBLASLt rather than our own: it is the measured ceiling on this GPU
 * (about 790 TFLOP/s bf16, FIELD-NOTES), picks wgmma kernels per shape, and
 * is captured into CUDA graphs like any kernel. The algorithm for a shape is
 * chosen once (heuristic, first answer) and kept in the context, keyed by
 * shape, mode and the pointers' alignment.
 *
 * One row (n == 1, a decode step) is a matrix-vector product that only
 * streams the weights: there our own kernel (gemv_kernel) reads them with
 * 16-byte loads, two rows per warp, several loads in flight per lane, and
 * beats cuBLASLt's choice for the small shapes (Documentation/
 * benchmarks.md). KVMEM_CUDA_GEMV=0 in the environment (read when a
 * context is made) or kvmem_cuda_tune(c, "gemv", 0) sends n == 1 to
 * cuBLASLt too.
 */
#include <string.h>

#include "cuda_int.h"

static int lt_fail(cublasStatus_t s, const char *what)
{
	return kvmem_error(s == CUBLAS_STATUS_NOT_SUPPORTED ? ENOTSUP : EIO,
			   "cuBLASLt: %s: status %d", what, (int)s);
}

/* Largest power of two (<= 256) dividing every pointer's address. */
static int ptr_align(const void *a, const void *b, const void *y)
{
	uintptr_t u = (uintptr_t)a | (uintptr_t)b | (uintptr_t)y | 256;

	return (int)(u & -u);
}

static void plan_free(struct gemm_plan *g)
{
	if (!g->n)
		return;
	cublasLtMatrixLayoutDestroy(g->a);
	cublasLtMatrixLayoutDestroy(g->b);
	cublasLtMatrixLayoutDestroy(g->c);
	cublasLtMatmulDescDestroy(g->desc);
	memset(g, 0, sizeof(*g));
}

static int plan_make(kvmem_cuda_ctx *c, struct gemm_plan *g, int n, int in, int out, int mode,
		     int align)
{
	cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
	cudaDataType_t yt = mode == KVMEM_GEMM_BF16 ? CUDA_R_16BF : CUDA_R_32F;
	cublasLtMatmulPreference_t pref = NULL;
	cublasLtMatmulHeuristicResult_t res;
	uint32_t al = (uint32_t)align;
	int found = 0;
	cublasStatus_t s;

	memset(g, 0, sizeof(*g));
	if ((s = cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
	    (s = cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta))) ||
	    (s = cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb))) ||
	    (s = cublasLtMatrixLayoutCreate(&g->a, CUDA_R_16BF, in, out, in)) ||
	    (s = cublasLtMatrixLayoutCreate(&g->b, CUDA_R_16BF, in, n, in)) ||
	    (s = cublasLtMatrixLayoutCreate(&g->c, yt, out, n, out)))
		goto fail;
	if ((s = cublasLtMatmulPreferenceCreate(&pref)) ||
	    (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
						      &c->lt_ws_bytes, sizeof(c->lt_ws_bytes))) ||
	    (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
						      &al, sizeof(al))) ||
	    (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
						      &al, sizeof(al))) ||
	    (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
						      &al, sizeof(al))) ||
	    (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
						      &al, sizeof(al))))
		goto fail;
	s = cublasLtMatmulAlgoGetHeuristic(c->lt, g->desc, g->a, g->b, g->c, g->c, pref, 1, &res, &found);
	cublasLtMatmulPreferenceDestroy(pref);
	pref = NULL;
	if (s)
		goto fail;
	if (found < 1) {
		s = CUBLAS_STATUS_NOT_SUPPORTED;
		goto fail;
	}
	g->algo = res.algo;
	g->has_algo = 1;
	g->n = n;
	g->in = in;
	g->out = out;
	g->mode = mode;
	g->align = align;
	return 0;
fail:
	if (pref)
		cublasLtMatmulPreferenceDestroy(pref);
	if (g->a)
		cublasLtMatrixLayoutDestroy(g->a);
	if (g->b)
		cublasLtMatrixLayoutDestroy(g->b);
	if (g->c)
		cublasLtMatrixLayoutDestroy(g->c);
	if (g->desc)
		cublasLtMatmulDescDestroy(g->desc);
	memset(g, 0, sizeof(*g));
	return lt_fail(s, "no algorithm for this shape");
}

/*
 * y[o] (mode) x . w[o]: a warp per GEMV_ROWS rows, each lane summing 8
 * products per 16-byte chunk in fp32 (chunks lane, lane + 32, ... in
 * order), then a fixed shuffle tree: the bits depend only on the shape.
 * in % 8 == 0 and 16-byte aligned x, w (checked by the caller).
 */
#define GEMV_ROWS 2
#define GEMV_WARPS 8
#define GEMV_UNROLL 4

__device__ __forceinline__ float dot8(uint4 a, uint4 b, float acc)
{
	const uint32_t x[4] = { a.x, a.y, a.z, a.w }, y[4] = { b.x, b.y, b.z, b.w };

#pragma unroll
	for (int i = 0; i < 4; i++) {
		acc = fmaf(__uint_as_float(x[i] << 16), __uint_as_float(y[i] << 16), acc);
		acc = fmaf(__uint_as_float(x[i] & 0xffff0000u), __uint_as_float(y[i] & 0xffff0000u), acc);
	}
	return acc;
}

__global__ void __launch_bounds__(32 * GEMV_WARPS)
gemv_kernel(void *y, int mode, const uint16_t *x, const uint16_t *w, int in, int out)
{
	const int lane = threadIdx.x & 31;
	const int o0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * GEMV_ROWS;
	const int chunks = in / 8;
	const uint4 *xv = (const uint4 *)x;
	const uint4 *wr[GEMV_ROWS];
	float acc[GEMV_ROWS];

	if (o0 >= out)
		return;
#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++) {
		wr[r] = (const uint4 *)(w + (size_t)min(o0 + r, out - 1) * in);
		acc[r] = 0.0f;
	}
	int c = lane;

	for (; c + 32 * (GEMV_UNROLL - 1) < chunks; c += 32 * GEMV_UNROLL) {
		uint4 wv[GEMV_ROWS][GEMV_UNROLL], xx[GEMV_UNROLL];

#pragma unroll
		for (int u = 0; u < GEMV_UNROLL; u++) {
#pragma unroll
			for (int r = 0; r < GEMV_ROWS; r++)
				wv[r][u] = __ldcs(wr[r] + c + 32 * u);	/* streamed once */
			xx[u] = __ldg(xv + c + 32 * u);
		}
#pragma unroll
		for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
			for (int r = 0; r < GEMV_ROWS; r++)
				acc[r] = dot8(wv[r][u], xx[u], acc[r]);
	}
	for (; c < chunks; c += 32) {
		const uint4 xx = __ldg(xv + c);

#pragma unroll
		for (int r = 0; r < GEMV_ROWS; r++)
			acc[r] = dot8(__ldcs(wr[r] + c), xx, acc[r]);
	}
#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
		for (int o = 16; o > 0; o >>= 1)
			acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
	if (lane < GEMV_ROWS && o0 + lane < out) {
		float v = acc[0];

#pragma unroll
		for (int r = 1; r < GEMV_ROWS; r++)
			if (lane == r)
				v = acc[r];
		if (mode == KVMEM_GEMM_BF16)
			((uint16_t *)y)[o0 + lane] = f2bf(v);
		else if (mode == KVMEM_GEMM_F32)
			((float *)y)[o0 + lane] = v;
		else
			((float *)y)[o0 + lane] = __fadd_rn(((float *)y)[o0 + lane], v);
	}
}

extern "C" int kvmem_cuda_gemm_bf16(kvmem_cuda_ctx *c, void *y, int mode, const uint16_t *x,
				    const uint16_t *w, int n, int in, int out)
{
	const float one = 1.0f, zero = 0.0f;
	int align = ptr_align(x, w, y);
	struct gemm_plan *g = NULL;
	cublasStatus_t s;

	if (n < 0 || in <= 0 || out <= 0 || mode < KVMEM_GEMM_BF16 || mode > KVMEM_GEMM_F32_ADD)
		return kvmem_error(EINVAL, "gemm: bad shape %d x %d -> %d or mode %d", n, in, out, mode);
	if (!n)
		return 0;
	if (n == 1 && in % 8 == 0 && ptr_align(x, w, w) >= 16 && !c->no_gemv) {
		const int per_block = GEMV_WARPS * GEMV_ROWS;

		gemv_kernel<<<(out + per_block - 1) / per_block, 32 * GEMV_WARPS, 0, c->stream>>>(
			y, mode, x, w, in, out);
		return kvmem_cuda_launched("gemv");
	}
	for (int i = 0; i < KVMEM_GEMM_CACHE && !g; i++) {
		struct gemm_plan *p = &c->plans[i];

		if (p->n == n && p->in == in && p->out == out && p->mode == mode && p->align == align)
			g = p;
	}
	if (!g) {
		g = &c->plans[c->next_plan];
		c->next_plan = (c->next_plan + 1) % KVMEM_GEMM_CACHE;
		plan_free(g);
		if (plan_make(c, g, n, in, out, mode, align))
			return kvmem_error_prefix("gemm %d x %d -> %d (mode %d)", n, in, out, mode);
	}
	s = cublasLtMatmul(c->lt, g->desc, &one, w, g->a, x, g->b,
			   mode == KVMEM_GEMM_F32_ADD ? &one : &zero, y, g->c, y, g->c, &g->algo,
			   c->lt_ws, c->lt_ws_bytes, c->stream);
	if (s)
		return lt_fail(s, "matmul");
	return 0;
}

extern "C" int kvmem_cuda_logits_bf16(kvmem_cuda_ctx *c, float *logits, const float *x,
				      const uint16_t *norm_w, const uint16_t *lm_head,
				      uint16_t *tmp, int n, int hidden, int vocab, float eps)
{
	int rc = kvmem_cuda_rmsnorm_bf16(c, tmp, x, norm_w, n, hidden, eps);

	return rc ? rc : kvmem_cuda_gemm_bf16(c, logits, KVMEM_GEMM_F32, tmp, lm_head, n, hidden,
					      vocab);
}

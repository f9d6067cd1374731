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
 * streams the weights: there our own kernels (gemv.cu) read them with
 * 16-byte loads, two rows per warp, several loads in flight per lane, and
 * beat cuBLASLt's choice for the small shapes (Documentation/
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

void kvmem_cuda_gemm_plan_free(struct gemm_plan *g)
{
	if (!g->n)
		return;
	cublasLtMatrixLayoutDestroy(g->a);
	cublasLtMatrixLayoutDestroy(g->b);
	cublasLtMatrixLayoutDestroy(g->c);
	cublasLtMatmulDescDestroy(g->desc);
	memset(g, 0, sizeof(*g));
}

/*
 * Batch invariance for GEMMs of many rows (c->gemm_pin): cuBLASLt picks its
 * kernel by the shape, n included, so a prefill chunk's row summed alone and
 * the same row among other conversations' chunks in one GEMM could differ.
 * Pinned, every n in 2..gemm_pin of a shape (and every n while gemm_pin_all
 * is on: a batched prefill's GEMM) takes the algorithm picked for gemm_pin
 * rows, with split-K off and no reduction scheme: then an output element
 * is one tile's sum over the input in the kernel's own order, whichever
 * rows share its tile (kvmem_gpu_check --gemm-pin holds a row's bits to
 * the same row among others). Chunks past gemm_pin rows keep cuBLASLt's
 * pick for their n (they are compute-bound alone: batching them gains
 * nothing, and the pinned algorithm is 15% slower at 1024 rows).
 */
static cublasStatus_t pinned_algo(kvmem_cuda_ctx *c, struct gemm_plan *g,
				  cublasLtMatmulPreference_t pref, int in, int out, cudaDataType_t yt,
				  cublasLtMatmulAlgo_t *algo)
{
	cublasLtMatrixLayout_t b = NULL, y = NULL;
	cublasLtMatmulHeuristicResult_t res;
	cublasLtMatmulHeuristicResult_t check;
	const uint32_t one = 1, none = CUBLASLT_REDUCTION_SCHEME_NONE;
	int found = 0;
	cublasStatus_t s;

	if ((s = cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, in, c->gemm_pin, in)) ||
	    (s = cublasLtMatrixLayoutCreate(&y, yt, out, c->gemm_pin, out)))
		goto out;
	s = cublasLtMatmulAlgoGetHeuristic(c->lt, g->desc, g->a, b, y, y, pref, 1, &res, &found);
	if (s)
		goto out;
	if (found < 1) {
		s = CUBLAS_STATUS_NOT_SUPPORTED;
		goto out;
	}
	*algo = res.algo;
	if ((s = cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one,
						      sizeof(one))) ||
	    (s = cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
						      &none, sizeof(none))))
		goto out;
	/* ... and it must take this n. */
	s = cublasLtMatmulAlgoCheck(c->lt, g->desc, g->a, g->b, g->c, g->c, algo, &check);
	if (!s && check.workspaceSize > c->lt_ws_bytes)
		s = CUBLAS_STATUS_NOT_SUPPORTED;
out:
	if (b)
		cublasLtMatrixLayoutDestroy(b);
	if (y)
		cublasLtMatrixLayoutDestroy(y);
	return s;
}

static int plan_make(kvmem_cuda_ctx *c, struct gemm_plan *g, int n, int in, int out, int mode,
		     int align, int pinned)
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
	if (pinned) {
		s = pinned_algo(c, g, pref, in, out, yt, &res.algo);
		found = !s;
	} else {
		s = cublasLtMatmulAlgoGetHeuristic(c->lt, g->desc, g->a, g->b, g->c, g->c, pref, 1,
						   &res, &found);
	}
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
	g->pinned = pinned;
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

extern "C" int kvmem_cuda_gemm_bf16(kvmem_cuda_ctx *c, void *y, int mode, const uint16_t *x,
				    const uint16_t *w, int n, int in, int out)
{
	const float one = 1.0f, zero = 0.0f;
	int align = ptr_align(x, w, y);
	const int pinned = c->gemm_pin && n >= 2 && (n <= c->gemm_pin || c->gemm_pin_all);
	struct gemm_plan *g = NULL;
	cublasStatus_t s;

	if (n < 0 || in <= 0 || out <= 0 || mode < KVMEM_GEMM_BF16 || mode > KVMEM_GEMM_F32_ADD)
		return kvmem_error(EINVAL, "gemm: bad shape %d x %d -> %d or mode %d", n, in, out, mode);
	if (!n)
		return 0;
	if (n == 1 && in % 8 == 0 && ptr_align(x, w, w) >= 16 && !c->no_gemv)
		return kvmem_cuda_gemv_bf16(c, y, mode, x, w, in, out);
	for (int i = 0; i < KVMEM_GEMM_CACHE && !g; i++) {
		struct gemm_plan *p = &c->plans[i];

		if (p->n == n && p->in == in && p->out == out && p->mode == mode && p->align == align &&
		    p->pinned == pinned)
			g = p;
	}
	if (!g) {
		g = &c->plans[c->next_plan];
		c->next_plan = (c->next_plan + 1) % KVMEM_GEMM_CACHE;
		kvmem_cuda_gemm_plan_free(g);
		if (plan_make(c, g, n, in, out, mode, align, pinned))
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

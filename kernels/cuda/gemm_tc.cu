// SPDX-License-Identifier: MIT
/*
 * A tensor-core GEMM for few rows (decode: 1 row alone, up to 64 and more
 * in a batched step; twin: kvmem_gemm_bf16 within a tolerance, since the
 * order of the sums inside an mma is the hardware's): y[m] (mode) x[m] .
 * w^T for m < n, bf16 in, fp32 sums. Its point is batch invariance with
 * tensor cores: row m gets the same bits whatever n is and wherever the
 * row sits in the batch, so the lone decode step (n == 1) and a batched
 * one give a conversation the same logits. Why each row's sum cannot
 * depend on n here:
 *
 *  - mma.sync m16n8k16 with A = 16 weight rows (outputs) and B = 8 rows of
 *    x (the batch): an output element of the tile is the dot of one weight
 *    row and one x row plus its accumulator, and no other column of the
 *    tile enters it; rows past n are zeros in registers, never loaded.
 *  - The input is cut into 32-element blocks; a lane's 16-byte chunk of a
 *    weight row (8 elements) and its chunk of the x row hold the same k,
 *    laid into the fragments' k slots by one fixed permutation (below), so
 *    the sum's order is fixed by the shape alone.
 *  - Split-K over the ks warps of a block that share a tile: ks comes from
 *    the shape and the SM count (tc_splits), never from n; warp j sums its
 *    blocks in order from zero, and the partials are added in the order
 *    j = 0 .. ks - 1, as the GEMV does.
 *  - More than 64 rows: the same tile code on each next 64 rows.
 *
 * A warp owns MT tiles of 16 outputs (1 for a lone row, whose launch
 * wants many warps; 2 for wide outputs at 9-32 rows, so each x fragment
 * serves two weight tiles: see the launch); 8 warps a block; each lane
 * keeps TC_U / MT blocks of each tile's weight loads in flight (16-byte
 * __ldcs: read once), so one row (the lone decode) still streams the
 * weights; with 64 rows the weight tile is applied to 8 x tiles per load,
 * on tensor cores (gemv.cu's rows kernel did that with CUDA-core fp32
 * multiply-adds and was bound by them). At 9-32 rows the x fragments of
 * those blocks are loaded with the weights (tc_group's XPRE: 2837 -> 3103
 * GB/s of weights at 16 rows on the H200). MT, U, XPRE and the x tiles
 * change which lane holds a sum, or when, not its order.
 *
 * Fragment layout (PTX ISA, mma.m16n8k16 .bf16, lane = 4 g + t):
 *   A: reg0 = A[g][2t, 2t+1], reg1 = A[g+8][2t, 2t+1], reg2 = A[g][2t+8,
 *      2t+9], reg3 = A[g+8][2t+8, 2t+9];
 *   B: reg0 = B[2t, 2t+1][g], reg1 = B[2t+8, 2t+9][g];
 *   C: c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1].
 * Lane (g, t) loads weight rows g and g + 8 and x row g at k = base + 8t
 * .. + 7 (one uint4 each): words 0, 1 feed the block's first mma (logical
 * k 2t, 2t+1 <- k + 0, 1; 2t+8, 2t+9 <- k + 2, 3), words 2, 3 its second.
 * The same lane t holds the same k in A and in B, so the permutation is
 * one and the same on both sides.
 */
#include <limits.h>

#include "dense.cuh"

#define TC_WARPS 8		/* warps per block */
#define TC_U 4			/* 32-element blocks of loads in flight per lane */
#define TC_U1 4			/* the same for one x tile and one weight tile (a lone row) */
#define TC_MAX_KS 8		/* warps splitting one tile's input */
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

/*
 * U blocks of the input from block b against NT tiles of x rows: the
 * weights' 16-byte loads (streamed once), then each block's two mma steps
 * until hi. Without XPRE a block's x fragments are loaded in the mma loop,
 * after the branch at hi, so each block's x loads wait until the block
 * before has been used (the SASS shows it): U trips to the L2 in turn.
 * XPRE issues every x fragment of the U blocks with the weights' loads, at
 * U NT 4 more registers. Neither changes a sum: block b's two mma steps
 * are applied in the order of b.
 */
template <int NT, int MT, int U, bool X_SMEM, bool XPRE>
__device__ __forceinline__ void tc_group(float (*acc)[NT][4], const uint16_t *const *wr,
					 const uint16_t *const *xr, int in, int t, int b, int hi)
{
	const uint4 zero = make_uint4(0, 0, 0, 0);
	uint4 va[MT][U], vb[MT][U];
	uint4 xp[XPRE ? U : 1][NT];

#pragma unroll
	for (int u = 0; u < U; u++) {
		const int k = (b + u) * 32 + 8 * t;
		const bool in_k = b + u < hi && k < in;

#pragma unroll
		for (int m = 0; m < MT; m++) {	/* streamed once */
			va[m][u] = in_k ? __ldcs((const uint4 *)(wr[2 * m] + k)) : zero;
			vb[m][u] = in_k ? __ldcs((const uint4 *)(wr[2 * m + 1] + k)) : zero;
		}
		if (XPRE)	/* every x fragment of the U blocks in flight too */
#pragma unroll
			for (int i = 0; i < NT; i++)
				xp[XPRE ? u : 0][i] = in_k && xr[i] ? __ldg((const uint4 *)(xr[i] + k))
								    : zero;
	}
#pragma unroll
	for (int u = 0; u < U; u++) {
		const int k = (b + u) * 32 + 8 * t;

		if (b + u >= hi)	/* uniform over the warp */
			break;
#pragma unroll
		for (int i = 0; i < NT; i++) {
			const uint4 xv = XPRE ? xp[XPRE ? u : 0][i]
					 : !xr[i] || k >= in ? zero
					 : X_SMEM ? *(const uint4 *)(xr[i] + k)
						  : __ldg((const uint4 *)(xr[i] + k));

#pragma unroll
			for (int m = 0; m < MT; m++) {
				mma_bf16(acc[m][i], va[m][u].x, vb[m][u].x, va[m][u].y, vb[m][u].y,
					 xv.x, xv.y);
				mma_bf16(acc[m][i], va[m][u].z, vb[m][u].z, va[m][u].w, vb[m][u].w,
					 xv.z, xv.w);
			}
		}
	}
}

/*
 * NT tiles of 8 x rows (rows b0 .. b0 + 8 NT - 1 of n) against the warp's
 * MT tiles of 16 weight rows (tile m: rows at wr[2m] for A rows 0-7 and
 * wr[2m + 1] for 8-15, this lane's g) over 32-element blocks [lo, hi):
 * acc[m][i][0..3] as C above. MT tiles share each x fragment (half the x
 * loads at MT 2); U blocks in flight per tile (TC_U / MT, or "gemm_tc_u"
 * for a lone row) set the bytes in flight per warp. Neither changes a sum:
 * block b's two mma steps are applied in order b = lo .. hi - 1 whatever
 * MT, NT, U and XPRE are.
 */
template <int NT, int MT, int U, bool X_SMEM, bool XPRE>
__device__ __forceinline__ void tc_sum(float (*acc)[NT][4], const uint16_t *const *wr,
				       const uint16_t *x, int in, int n, int b0, int lane, int lo,
				       int hi)
{
	const int g = lane >> 2, t = lane & 3;
	const uint16_t *xr[NT];

#pragma unroll
	for (int i = 0; i < NT; i++) {
		const int r = b0 + 8 * i + g;

		xr[i] = r < n ? x + (size_t)r * in : NULL;	/* past n: zeros */
#pragma unroll
		for (int m = 0; m < MT; m++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				acc[m][i][e] = 0.0f;
	}
	for (int b = lo; b < hi; b += U)
		tc_group<NT, MT, U, X_SMEM, XPRE>(acc, wr, xr, in, t, b, hi);
}

/*
 * Block: groups = TC_WARPS / ks warp groups of MT tiles (16 MT outputs);
 * warp (gw, j) = (warp / ks, warp % ks) takes group blockIdx.x * groups +
 * gw over blocks [lo, hi) of the input. Rows past `out` read row out - 1
 * and are not stored.
 *
 * The fused forms of a lone decode step (n == 1, MT 1; the arithmetic of
 * each sum is the same code, so the bits are the unfused ops'):
 *   NORM:   x is the fp32 residual row; the block first computes its
 *           RMSNorm (dense.cuh: kvmem_cuda_rmsnorm_bf16's sum and rounding)
 *           into shared memory and reads its input there.
 *   SWIGLU: w is [gate; up], 2 * out rows; a tile is 8 gate rows q0.. (A
 *           rows 0-7) and the same 8 up rows (A rows 8-15), so a lane holds
 *           gate and up of one output: y[q] = bf16(silu(g) * u) of their
 *           bf16-rounded sums, exactly swiglu_kernel on the unfused gu. ks
 *           is the unfused GEMM's (2 * out rows).
 */
template <int NT, int MT, int U, bool NORM, bool SWIGLU, bool XPRE = false>
__global__ void __launch_bounds__(32 * TC_WARPS)
gemm_tc_kernel(void *y, int mode, const void *x, const uint16_t *norm_w, float eps,
	       const uint16_t *w, int in, int out, int ks, int n)
{
	static_assert(MT == 1 || (!NORM && !SWIGLU), "the fused forms take one tile");
	__shared__ float part[TC_WARPS][NT][4][32];
	extern __shared__ uint4 tc_h[];	/* NORM: the normalised row, [in] bf16 */
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int groups = TC_WARPS / ks, gw = warp / ks, j = warp % ks;
	const int tile = blockIdx.x * groups + gw, g = lane >> 2, t = lane & 3;
	const int o0 = tile * (SWIGLU ? 8 : 16 * MT);
	const int blocks = (in + 31) / 32, per = (blocks + ks - 1) / ks;
	const int lo = min(j * per, blocks), hi = min(lo + per, blocks);
	const uint16_t *xb = NORM ? (const uint16_t *)tc_h : (const uint16_t *)x;
	const uint16_t *wr[2 * MT];

	if (SWIGLU) {
		wr[0] = w + (size_t)min(o0 + g, out - 1) * in;
		wr[1] = w + (size_t)(out + min(o0 + g, out - 1)) * in;
	} else {
#pragma unroll
		for (int m = 0; m < MT; m++) {
			wr[2 * m] = w + (size_t)min(o0 + 16 * m + g, out - 1) * in;
			wr[2 * m + 1] = w + (size_t)min(o0 + 16 * m + 8 + g, out - 1) * in;
		}
	}
	if (NORM) {
		const float *xf = (const float *)x;
		uint16_t *h = (uint16_t *)tc_h;

		/* The first weights into the L2 while the norm is computed. */
#pragma unroll
		for (int u = 0; u < U; u++)
			if (lo + u < hi && (lo + u) * 32 + 8 * t < in) {
				asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[0] + (lo + u) * 32 + 8 * t));
				asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[1] + (lo + u) * 32 + 8 * t));
			}
		const float rs = rms_block(xf, in, eps);

		for (int d = threadIdx.x; d < in; d += RMS_THREADS)
			h[d] = rms_apply(xf[d], rs, norm_w[d]);
		__syncthreads();
	}
	for (int b0 = 0; b0 < n; b0 += 8 * NT) {
		float acc[MT][NT][4];

		tc_sum<NT, MT, U, NORM, XPRE>(acc, wr, xb, in, n, b0, lane, lo, hi);
		if (ks > 1) {	/* uniform over the launch */
#pragma unroll
			for (int m = 0; m < MT; m++) {
				if (j)
#pragma unroll
					for (int i = 0; i < NT; i++)
#pragma unroll
						for (int e = 0; e < 4; e++)
							part[warp][i][e][lane] = acc[m][i][e];
				__syncthreads();
				if (!j)
					for (int jj = 1; jj < ks; jj++)	/* in order: fixed bits */
#pragma unroll
						for (int i = 0; i < NT; i++)
#pragma unroll
							for (int e = 0; e < 4; e++)
								acc[m][i][e] += part[warp + jj][i][e][lane];
				__syncthreads();	/* read before it is written again */
			}
		}
		if (j || o0 >= out)
			continue;
		if (SWIGLU) {	/* c0, c1: gate of x rows 2t, 2t + 1; c2, c3: their up */
#pragma unroll
			for (int i = 0; i < NT; i++)
#pragma unroll
				for (int e = 0; e < 2; e++) {
					const int q = o0 + g, r = b0 + 8 * i + 2 * t + e;

					if (q < out && r < n)
						((uint16_t *)y)[(size_t)r * out + q] =
							swiglu_one(f2bf(acc[0][i][e]), f2bf(acc[0][i][2 + e]));
				}
		} else {
#pragma unroll
			for (int m = 0; m < MT; m++)
#pragma unroll
				for (int i = 0; i < NT; i++)
#pragma unroll
					for (int e = 0; e < 4; e++) {
						const int o = o0 + 16 * m + g + 8 * (e >> 1);
						const int r = b0 + 8 * i + 2 * t + (e & 1);

						if (o < out && r < n)
							tc_store(y, mode, (size_t)r * out + o, acc[m][i][e]);
					}
		}
	}
}

/* The split for a shape: the smallest power of two giving at least
 * TC_BLOCKS_PER_SM blocks per multiprocessor while each warp keeps
 * 2 TC_U blocks of the input; never a function of the rows. */
static int tc_splits(const kvmem_cuda_ctx *c, int in, int out)
{
	const int tiles = (out + 15) / 16, blocks = (in + 31) / 32;
	const int target = TC_BLOCKS_PER_SM * c->sms;
	int ks = 1;

	if (c->gemm_tc_ks)
		return c->gemm_tc_ks;
	while (ks < TC_MAX_KS) {
		const int per = TC_WARPS / ks;

		if ((tiles + per - 1) / per >= target || blocks / (2 * ks) < 2 * TC_U)
			break;
		ks *= 2;
	}
	return ks;
}

/* Blocks in flight per lane for a lone row: "gemm_tc_u" (4 or 8), else
 * TC_U1. The one-row layer ran at 0.81x the GEMV's weight rate with 4
 * (2026-12-02, H200: 2970 against 3674 GB/s), with fewer bytes in flight
 * per multiprocessor than the GEMV keeps (its blocks are smaller); 8
 * doubles them per warp but takes 116 registers (two blocks a
 * multiprocessor, not three): measured side by side before either is the
 * default. The sums do not change with it. */
static int tc_u1(const kvmem_cuda_ctx *c)
{
	return c->gemm_tc_u ? c->gemm_tc_u : TC_U1;
}

int kvmem_cuda_gemm_tc_check_ks(int ks)
{
	return ks == 0 || ks == 1 || ks == 2 || ks == 4 || ks == TC_MAX_KS;
}

/* Whether x's loads go early: "gemm_tc_xpre" 1 always, 2 never, 0 (the
 * default) at 9-32 rows, where it measured faster (2026-12-04, H200, a
 * layer's four GEMMs: 16 rows 0.1357 -> 0.1248 ms, 32 rows 0.1695 ->
 * 0.1621; at 64 rows, U 1, 0.2335 -> 0.2466: benchmarks.md). Never a
 * sum's order. */
static int tc_xpre(const kvmem_cuda_ctx *c, int nt)
{
	return c->gemm_tc_xpre == 1 ? nt > 1 : c->gemm_tc_xpre == 2 ? 0 : nt == 2 || nt == 4;
}

/* The kernel for a launch's tiles and loads in flight: U 4 blocks at one
 * weight tile a warp, 2 at two; with x's loads early (XP, 2+ rows) fewer
 * where their registers would cost a block an SM (at 8 x tiles a block's
 * x fragments are 32 registers). */
template <bool XP>
static void tc_launch(kvmem_cuda_ctx *c, int nt, int mt, int grid, void *y, int mode,
		      const uint16_t *x, const uint16_t *w, int in, int out, int ks, int n)
{
#define TC_LAUNCH(NT_, MT_, U_, XP_)                                                            \
	gemm_tc_kernel<NT_, MT_, U_, false, false, XP_><<<grid, 32 * TC_WARPS, 0, c->stream>>>(  \
		y, mode, x, NULL, 0.0f, w, in, out, ks, n)
	if (mt == 1) {
		if (nt == 1 && tc_u1(c) == 8)	/* one row: nothing to load early */
			TC_LAUNCH(1, 1, 8, false);
		else if (nt == 1)
			TC_LAUNCH(1, 1, 4, false);
		else if (nt == 2)
			TC_LAUNCH(2, 1, 4, XP);
		else if (nt == 4)
			TC_LAUNCH(4, 1, XP ? 2 : 4, XP);
		else
			TC_LAUNCH(8, 1, XP ? 1 : 4, XP);
	} else {
		if (nt == 1)
			TC_LAUNCH(1, 2, 2, false);
		else if (nt == 2)
			TC_LAUNCH(2, 2, 2, XP);
		else if (nt == 4)
			TC_LAUNCH(4, 2, XP ? 1 : 2, XP);
		else
			TC_LAUNCH(8, 2, XP ? 1 : 2, XP);
	}
#undef TC_LAUNCH
}

int kvmem_cuda_gemm_tc_bf16(kvmem_cuda_ctx *c, void *y, int mode, const uint16_t *x,
			    const uint16_t *w, int n, int in, int out)
{
	if (n < 0 || in <= 0 || out <= 0 || mode < KVMEM_GEMM_BF16 || mode > KVMEM_GEMM_F32_ADD)
		return kvmem_error(EINVAL, "gemm tc: bad shape %d x %d -> %d or mode %d", n, in, out,
				   mode);
	if (in % 8 || ((uintptr_t)x & 15) || ((uintptr_t)w & 15))
		return kvmem_error(ENOTSUP, "gemm tc: %d inputs (not a multiple of 8) or x, w not "
				   "16-byte aligned", in);
	if (!n)
		return 0;
	const int ks = tc_splits(c, in, out), per = TC_WARPS / ks;
	const int nt = n > 32 ? 8 : n > 16 ? 4 : n > 8 ? 2 : 1;
	/* Two weight tiles a warp (each x fragment serves both) where that
	 * measured faster: wide outputs (gate|up) at 9-32 rows, 3202 against
	 * 2997 GB/s at 16; elsewhere one, whose launch has twice the warps
	 * (o and down at 16 rows 7-9% faster, gate|up at 64 8%;
	 * kvmem_gpu_check --gemm-tc-shapes, 2026-12-02). Never a sum's order. */
	const int mt = c->gemm_tc_mt ? c->gemm_tc_mt : nt > 1 && nt <= 4 && out >= 16384 ? 2 : 1;
	const int tiles = (out + 16 * mt - 1) / (16 * mt), grid = (tiles + per - 1) / per;

	if (tc_xpre(c, nt))
		tc_launch<true>(c, nt, mt, grid, y, mode, x, w, in, out, ks, n);
	else
		tc_launch<false>(c, nt, mt, grid, y, mode, x, w, in, out, ks, n);
	return kvmem_cuda_launched("gemm tc");
}

/* ---- the fused ops of a lone decode step (gemv.cu's entries call these) -- */

static_assert(32 * TC_WARPS == RMS_THREADS, "the fused norm runs on the GEMM's block");

int kvmem_cuda_tc_norm_gemm_bf16(kvmem_cuda_ctx *c, void *y, int mode, const float *x,
				 const uint16_t *norm_w, float eps, const uint16_t *w, int in,
				 int out)
{
	const int ks = tc_splits(c, in, out), per = TC_WARPS / ks;
	const int tiles = (out + 15) / 16, grid = (tiles + per - 1) / per;

	if (tc_u1(c) == 8)
		gemm_tc_kernel<1, 1, 8, true, false><<<grid, 32 * TC_WARPS, in * 2, c->stream>>>(
			y, mode, x, norm_w, eps, w, in, out, ks, 1);
	else
		gemm_tc_kernel<1, 1, 4, true, false><<<grid, 32 * TC_WARPS, in * 2, c->stream>>>(
			y, mode, x, norm_w, eps, w, in, out, ks, 1);
	return kvmem_cuda_launched("rmsnorm + gemm tc");
}

int kvmem_cuda_tc_norm_gemm_swiglu_bf16(kvmem_cuda_ctx *c, uint16_t *act, const float *x,
					const uint16_t *norm_w, float eps, const uint16_t *w,
					int in, int inter)
{
	/* The split of the unfused GEMM's shape (2 * inter rows). */
	const int ks = tc_splits(c, in, 2 * inter), per = TC_WARPS / ks;
	const int tiles = (inter + 7) / 8, grid = (tiles + per - 1) / per;

	if (tc_u1(c) == 8)
		gemm_tc_kernel<1, 1, 8, true, true><<<grid, 32 * TC_WARPS, in * 2, c->stream>>>(
			act, KVMEM_GEMM_BF16, x, norm_w, eps, w, in, inter, ks, 1);
	else
		gemm_tc_kernel<1, 1, 4, true, true><<<grid, 32 * TC_WARPS, in * 2, c->stream>>>(
			act, KVMEM_GEMM_BF16, x, norm_w, eps, w, in, inter, ks, 1);
	return kvmem_cuda_launched("rmsnorm + gemm tc + swiglu");
}

// SPDX-License-Identifier: MIT
/*
 * One-row GEMMs (n == 1, a decode step; twin: kvmem_gemm_bf16): y[o] (mode)
 * x . w[o], a matrix-vector product that only streams the weights, so its
 * ceiling is the HBM read rate. kvmem_cuda_gemm_bf16 (gemm.cu) sends n == 1
 * here when in % 8 == 0 and x, w are 16-byte aligned. Two kernels:
 *
 * gemv_kernel (the first, "gemv_split" off): a warp per GEMV_ROWS rows over
 * the whole input, 8 warps a block. At Qwen3-8B's small shapes (4096 and
 * 6144 outputs) that is 256-384 blocks, two or three per multiprocessor, and
 * each warp walks its rows in 4 (12 for down's 12288 inputs) dependent
 * rounds of loads: too few bytes in flight early and a long serial tail, so
 * o_proj ran at 0.45 and qkv at 0.65 of the copy rate (benchmarks.md).
 *
 * gemv_split_kernel ("gemv_split" on): the same warp work, but the input is
 * split over the `ks` warps of a block that share the same rows (split-K
 * inside the block): warp j of a row group sums chunks [lo_j, hi_j), and the
 * group's partials are added in shared memory in the order j = 0 .. ks - 1
 * by one thread per row. ks (1, 2, 4 or 8) is the smallest power of two
 * that gives at least GEMV_BLOCKS_PER_SM blocks per multiprocessor, as long
 * as each warp keeps a full round of GEMV_UNROLL loads per lane; so o_proj
 * and down get ks 4, qkv 2, gate|up and lm_head 1 (at 132 SMs). No second
 * kernel, no scratch and no atomics: the bits depend only on the shape and
 * the SM count (ks), and with ks 1 they equal gemv_kernel's (the same
 * per-lane order and shuffle tree).
 *
 * Both: 16-byte loads (__ldcs for the weights, read once; __ldg for x, which
 * every warp reads), fp32 products and sums per lane in chunk order, then a
 * fixed shuffle tree. kvmem_cuda_tune(c, "gemv_split", on) or
 * KVMEM_CUDA_GEMV_SPLIT=0/1 (read when a context is made) picks the kernel;
 * kvmem_cuda_tune(c, "gemv_ks", k) forces ks = k (0: the rule above), for
 * measurements (tests/gpu/gemv_sweep.sh).
 */
#include <limits.h>

#include "dense.cuh"

#define GEMV_ROWS 2		/* rows per warp */
#define GEMV_WARPS 8		/* warps per block */
#define GEMV_UNROLL 4		/* 16-byte chunks in flight per lane and row */
#define GEMV_MAX_KS 8		/* warps splitting one row group's input */
#define GEMV_BLOCKS_PER_SM 4	/* resident blocks the split aims for (__launch_bounds__) */

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

__device__ __forceinline__ void gemv_store(void *y, int mode, int o, float v)
{
	if (mode == KVMEM_GEMM_BF16)
		((uint16_t *)y)[o] = f2bf(v);
	else if (mode == KVMEM_GEMM_F32)
		((float *)y)[o] = v;
	else
		((float *)y)[o] = __fadd_rn(((float *)y)[o], v);
}

/*
 * A lane's part of GEMV_ROWS rows (row r at w0 + roff[r] chunks): the sums
 * of its 16-byte chunks c, c + 32, ... < hi in order (rounds of
 * GEMV_UNROLL loads per row in flight, then one at a time), then the fixed
 * shuffle tree, after which every lane holds the rows' sums. Both kernels
 * run exactly this, so their bits agree. X_SMEM: x is in shared memory
 * (the fused norm's row), else read through __ldg (every warp reads it).
 */
template <bool X_SMEM>
__device__ __forceinline__ void gemv_rows(float *acc, const uint4 *w0, const int *roff,
					  const uint4 *xv, int c, int hi)
{
#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
		acc[r] = 0.0f;
	for (; c + 32 * (GEMV_UNROLL - 1) < hi; c += 32 * GEMV_UNROLL) {
		uint4 wv[GEMV_ROWS][GEMV_UNROLL], xx[GEMV_UNROLL];

#pragma unroll
		for (int u = 0; u < GEMV_UNROLL; u++) {
#pragma unroll
			for (int r = 0; r < GEMV_ROWS; r++)
				wv[r][u] = __ldcs(w0 + roff[r] + c + 32 * u);	/* streamed once */
			xx[u] = X_SMEM ? xv[c + 32 * u] : __ldg(xv + c + 32 * u);
		}
#pragma unroll
		for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
			for (int r = 0; r < GEMV_ROWS; r++)
				acc[r] = dot8(wv[r][u], xx[u], acc[r]);
	}
	for (; c < hi; c += 32) {
		const uint4 xx = X_SMEM ? xv[c] : __ldg(xv + c);

#pragma unroll
		for (int r = 0; r < GEMV_ROWS; r++)
			acc[r] = dot8(__ldcs(w0 + roff[r] + c), xx, acc[r]);
	}
#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
		for (int o = 16; o > 0; o >>= 1)
			acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
}

/* Lane r < GEMV_ROWS stores row o0 + r's sum (rows past `out` are not). */
__device__ __forceinline__ void gemv_put(void *y, int mode, int lane, int o0, int out,
					 const float *acc)
{
	if (lane < GEMV_ROWS && o0 + lane < out) {
		float v = acc[0];

#pragma unroll
		for (int r = 1; r < GEMV_ROWS; r++)
			if (lane == r)
				v = acc[r];
		gemv_store(y, mode, o0 + lane, v);
	}
}

/* y[o] (mode) x . w[o]: a warp per GEMV_ROWS rows over the whole input. */
__global__ void __launch_bounds__(32 * GEMV_WARPS)
gemv_kernel(void *y, int mode, const uint16_t *x, const uint16_t *w, int in, int out)
{
	const int lane = threadIdx.x & 31;
	const int o0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * GEMV_ROWS;
	const int chunks = in / 8;
	const uint4 *w0 = (const uint4 *)(w + (size_t)min(o0, out - 1) * in);
	int roff[GEMV_ROWS];
	float acc[GEMV_ROWS];

	if (o0 >= out)
		return;
#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
		roff[r] = (min(o0 + r, out - 1) - o0) * chunks;
	gemv_rows<false>(acc, w0, roff, (const uint4 *)x, lane, chunks);
	gemv_put(y, mode, lane, o0, out, acc);
}

/*
 * The split version: block b, warp (g, j) = (warp / ks, warp % ks) takes
 * rows o0 = (b * (GEMV_WARPS / ks) + g) * GEMV_ROWS .. + GEMV_ROWS - 1 over
 * chunks [lo, hi): the input's chunks cut into ks pieces of a multiple of
 * 32 chunks (each warp load is 512 contiguous bytes). A lane sums its
 * chunks lo + lane, + 32, ... < hi in order (rounds of GEMV_UNROLL, then
 * one at a time), as gemv_kernel does over the whole row when ks is 1.
 * Every thread stays to the __syncthreads (rows past `out` read row
 * out - 1 and are not written).
 *
 * The fused forms of a decode step (template arguments; the arithmetic of
 * each row's sum is the same code whatever they are, so the bits are too):
 *   NORM:   x is the fp32 residual row; the block first computes its
 *           RMSNorm with norm_w (norm.cuh: the sum and rounding of
 *           kvmem_cuda_rmsnorm_bf16) into shared memory and reads its input
 *           from there. The first round of each row's weights is
 *           prefetched into the L2 before, so the HBM stream starts while
 *           the norm is computed.
 *   SWIGLU: w is [gate; up], 2 * out rows; group q takes gate row q and up
 *           row out + q (its two GEMV_ROWS) and writes
 *           y[q] = bf16(silu(g) * u) of their bf16-rounded sums, exactly
 *           swiglu_kernel on the unfused gu.
 */
template <bool NORM, bool SWIGLU>
__global__ void __launch_bounds__(32 * GEMV_WARPS, GEMV_BLOCKS_PER_SM)
gemv_split_kernel(void *y, int mode, const void *x, const uint16_t *norm_w, float eps,
		  const uint16_t *w, int in, int out, int ks)
{
	__shared__ float part[GEMV_WARPS][GEMV_ROWS];
	extern __shared__ uint4 gemv_h[];	/* NORM: the normalised row, [in] bf16 */
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int groups = GEMV_WARPS / ks, g = warp / ks, j = warp % ks;
	const int q = blockIdx.x * groups + g, o0 = q * GEMV_ROWS;
	const int chunks = in / 8;
	const int per = ((chunks + ks - 1) / ks + 31) & ~31;
	const int lo = min(j * per, chunks), hi = min(lo + per, chunks);
	const uint4 *xv = NORM ? gemv_h : (const uint4 *)x;
	/* Row o0 + r at w0 + roff[r] chunks (rows past the end: the last row):
	 * one pointer and small offsets keep the kernel within 64 registers,
	 * four blocks per multiprocessor. */
	int row[GEMV_ROWS], roff[GEMV_ROWS];
	float acc[GEMV_ROWS];

#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
		row[r] = SWIGLU ? min(q, out - 1) + r * out : min(o0 + r, out - 1);
	const uint4 *w0 = (const uint4 *)(w + (size_t)row[0] * in);

#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
		roff[r] = (row[r] - row[0]) * chunks;
	const int c = lo + lane;

	if (NORM) {
		const float *xf = (const float *)x;
		uint16_t *h = (uint16_t *)gemv_h;

#pragma unroll
		for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
			for (int r = 0; r < GEMV_ROWS; r++)
				if (c + 32 * u < hi)
					asm volatile("prefetch.global.L2 [%0];" ::"l"(w0 + roff[r] + c + 32 * u));
		const float rs = rms_block(xf, in, eps);

		for (int d = threadIdx.x; d < in; d += RMS_THREADS)
			h[d] = rms_apply(xf[d], rs, norm_w[d]);
		__syncthreads();
	}
	gemv_rows<NORM>(acc, w0, roff, xv, c, hi);
	if (ks == 1) {		/* uniform over the launch */
		if (SWIGLU) {	/* every lane holds both sums after the tree */
			if (lane == 0 && q < out)
				((uint16_t *)y)[q] = swiglu_one(f2bf(acc[0]), f2bf(acc[1]));
		} else {
			gemv_put(y, mode, lane, o0, out, acc);
		}
		return;
	}
	if (lane == 0)
#pragma unroll
		for (int r = 0; r < GEMV_ROWS; r++)
			part[warp][r] = acc[r];
	__syncthreads();
	if (SWIGLU) {
		if (threadIdx.x < groups) {
			const int gg = threadIdx.x, qq = blockIdx.x * groups + gg;
			float v[GEMV_ROWS];

#pragma unroll
			for (int r = 0; r < GEMV_ROWS; r++) {
				v[r] = part[gg * ks][r];
				for (int jj = 1; jj < ks; jj++)	/* in order, as below */
					v[r] += part[gg * ks + jj][r];
			}
			if (qq < out)
				((uint16_t *)y)[qq] = swiglu_one(f2bf(v[0]), f2bf(v[1]));
		}
	} else if (threadIdx.x < groups * GEMV_ROWS) {
		const int gg = threadIdx.x / GEMV_ROWS, r = threadIdx.x % GEMV_ROWS;
		const int o = (blockIdx.x * groups + gg) * GEMV_ROWS + r;
		float v = part[gg * ks][r];

		for (int jj = 1; jj < ks; jj++)	/* in order: fixed bits */
			v += part[gg * ks + jj][r];
		if (o < out)
			gemv_store(y, mode, o, v);
	}
}

/* The split for a shape: c->gemv_ks when set, else the rule above. */
static int gemv_splits(const kvmem_cuda_ctx *c, int in, int out)
{
	const int chunks = in / 8, target = GEMV_BLOCKS_PER_SM * c->sms;
	int ks = 1;

	if (c->gemv_ks)
		return c->gemv_ks;
	while (ks < GEMV_MAX_KS) {
		const int rows = GEMV_WARPS / ks * GEMV_ROWS;

		if ((out + rows - 1) / rows >= target || chunks / (2 * ks) < 32 * GEMV_UNROLL)
			break;
		ks *= 2;
	}
	return ks;
}

int kvmem_cuda_gemv_bf16(kvmem_cuda_ctx *c, void *y, int mode, const uint16_t *x,
			 const uint16_t *w, int in, int out)
{
	if (c->gemm_tc)	/* the batched step's GEMM, so a row alone gets its bits */
		return kvmem_cuda_gemm_tc_bf16(c, y, mode, x, w, 1, in, out);
	if (!c->gemv_split) {
		const int per_block = GEMV_WARPS * GEMV_ROWS;

		gemv_kernel<<<(out + per_block - 1) / per_block, 32 * GEMV_WARPS, 0, c->stream>>>(
			y, mode, x, w, in, out);
		return kvmem_cuda_launched("gemv");
	}
	const int ks = gemv_splits(c, in, out), rows = GEMV_WARPS / ks * GEMV_ROWS;

	gemv_split_kernel<false, false><<<(out + rows - 1) / rows, 32 * GEMV_WARPS, 0, c->stream>>>(
		y, mode, x, NULL, 0.0f, w, in, out, ks);
	return kvmem_cuda_launched("gemv (split)");
}

int kvmem_cuda_gemv_check_ks(int ks)
{
	return ks == 0 || ks == 1 || ks == 2 || ks == 4 || ks == GEMV_MAX_KS;
}

/* ---- the fused ops of a decode step ----------------------------------------- */

#define GEMV_H_MAX (48 << 10)	/* the normalised row in shared memory: bytes at most */
#define GEMV_TC_H_MAX (40 << 10)	/* the same beside gemm_tc.cu's own shared memory */

static_assert(32 * GEMV_WARPS == RMS_THREADS, "the fused norm runs on the GEMV's block");
static_assert(GEMV_ROWS == 2, "the fused SwiGLU pairs a gate row with an up row");

/*
 * Whether a call takes the fused kernel: "fuse" on, one row, and the
 * one-row GEMM that the unfused ops would run being the split kernel
 * (kvmem_cuda_gemm_bf16's conditions on in and the alignment of its input
 * h and of w, "gemv" and "gemv_split" on), so that fused and unfused give
 * the same bits; the row fits the shared memory; `rows` weight rows of in
 * / 8 chunks keep the kernel's chunk offsets within an int.
 */
static int fused_ok(const kvmem_cuda_ctx *c, int n, int in, int rows, const uint16_t *w,
		    const uint16_t *h)
{
	return c->fuse && n == 1 && !c->no_gemv && (c->gemm_tc || c->gemv_split) && in % 8 == 0 &&
	       !((uintptr_t)w & 15) && !((uintptr_t)h & 15) &&
	       (size_t)in * 2 <= (c->gemm_tc ? GEMV_TC_H_MAX : GEMV_H_MAX) &&
	       (size_t)rows * (in / 8) <= INT_MAX;
}

int kvmem_cuda_norm_gemv_bf16(kvmem_cuda_ctx *c, void *y, int mode, const float *x,
			      const uint16_t *norm_w, float eps, const uint16_t *w, uint16_t *h,
			      int n, int in, int out)
{
	int rc;

	if (n < 0 || in <= 0 || out <= 0 || mode < KVMEM_GEMM_BF16 || mode > KVMEM_GEMM_F32_ADD)
		return kvmem_error(EINVAL, "rmsnorm + gemv: bad shape %d x %d -> %d or mode %d", n,
				   in, out, mode);
	if (!n)
		return 0;
	if (!fused_ok(c, n, in, out, w, h)) {
		if ((rc = kvmem_cuda_rmsnorm_bf16(c, h, x, norm_w, n, in, eps)))
			return rc;
		return kvmem_cuda_gemm_bf16(c, y, mode, h, w, n, in, out);
	}
	if (c->gemm_tc)	/* the unfused ops would run gemm_tc.cu */
		return kvmem_cuda_tc_norm_gemm_bf16(c, y, mode, x, norm_w, eps, w, in, out);
	const int ks = gemv_splits(c, in, out), rows = GEMV_WARPS / ks * GEMV_ROWS;

	gemv_split_kernel<true, false><<<(out + rows - 1) / rows, 32 * GEMV_WARPS, in * 2,
					 c->stream>>>(y, mode, x, norm_w, eps, w, in, out, ks);
	return kvmem_cuda_launched("rmsnorm + gemv");
}

int kvmem_cuda_norm_gemv_swiglu_bf16(kvmem_cuda_ctx *c, uint16_t *act, const float *x,
				     const uint16_t *norm_w, float eps, const uint16_t *w,
				     uint16_t *h, uint16_t *gu, int n, int in, int inter)
{
	int rc;

	if (n < 0 || in <= 0 || inter <= 0 || inter > INT_MAX / 2)
		return kvmem_error(EINVAL, "rmsnorm + gemv + swiglu: bad shape %d x %d -> 2 x %d", n,
				   in, inter);
	if (!n)
		return 0;
	if (!fused_ok(c, n, in, 2 * inter, w, h)) {
		if ((rc = kvmem_cuda_rmsnorm_bf16(c, h, x, norm_w, n, in, eps)) ||
		    (rc = kvmem_cuda_gemm_bf16(c, gu, KVMEM_GEMM_BF16, h, w, n, in, 2 * inter)))
			return rc;
		return kvmem_cuda_swiglu_bf16(c, act, gu, gu + inter, n, inter, 2 * inter);
	}
	if (c->gemm_tc)	/* the unfused ops would run gemm_tc.cu */
		return kvmem_cuda_tc_norm_gemm_swiglu_bf16(c, act, x, norm_w, eps, w, in, inter);
	/* The split of the unfused GEMM's shape (2 * inter rows), one gate
	 * and one up row per warp group. */
	const int ks = gemv_splits(c, in, 2 * inter), groups = GEMV_WARPS / ks;

	gemv_split_kernel<true, true><<<(inter + groups - 1) / groups, 32 * GEMV_WARPS, in * 2,
					c->stream>>>(act, KVMEM_GEMM_BF16, x, norm_w, eps, w, in,
						     inter, ks);
	return kvmem_cuda_launched("rmsnorm + gemv + swiglu");
}

/* ---- many rows, each with a one-row call's bits -------------------------------- */

/*
 * A batched decode step's GEMMs (one row per conversation): y[b] (mode)
 * x[b] . w^T for b < n, where row b gets exactly the bits of the one-row
 * GEMV on x[b] alone (gemv_split_kernel at the same ks, or gemv_kernel
 * when the split is off, which equals ks 1): every lane sums its chunks
 * lo + lane, + 32, ... in order with dot8, the same shuffle tree, the ks
 * warps' partials added in order. The rounds of loads in flight do not
 * change a lane's order, so this kernel loads one chunk per row at a time
 * and applies it to NB rows of x: a weight chunk is read from memory once
 * per NB rows, and the block's weight rows again for each next NB rows
 * (from the L2 mostly: the block walks its row groups back to back).
 * CUDA cores, fp32: the price of the same bits as the lone decode (tensor
 * cores sum in another order), Documentation/benchmarks.md (#26).
 */
/* A chunk's 8 bf16 as fp32, in dot8's order: element 2t of word t (its
 * low half), then 2t + 1 (its high half). */
__device__ __forceinline__ void unpack8(float *f, uint4 a)
{
	const uint32_t x[4] = { a.x, a.y, a.z, a.w };

#pragma unroll
	for (int i = 0; i < 4; i++) {
		f[2 * i] = __uint_as_float(x[i] << 16);
		f[2 * i + 1] = __uint_as_float(x[i] & 0xffff0000u);
	}
}

/* dot8 on widened chunks: the same fmaf sequence, so the same bits. */
__device__ __forceinline__ float dot8f(const float *w, const float *x, float acc)
{
#pragma unroll
	for (int i = 0; i < 8; i++)
		acc = fmaf(w[i], x[i], acc);
	return acc;
}

template <int NB>
__global__ void __launch_bounds__(32 * GEMV_WARPS)
gemv_rows_kernel(void *y, int mode, const uint16_t *x, const uint16_t *w, int in, int out, int ks,
		 int n)
{
	__shared__ float part[GEMV_WARPS][NB][GEMV_ROWS];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int groups = GEMV_WARPS / ks, g = warp / ks, j = warp % ks;
	const int o0 = (blockIdx.x * groups + g) * GEMV_ROWS;
	const int chunks = in / 8;
	const int per = ((chunks + ks - 1) / ks + 31) & ~31;
	const int lo = min(j * per, chunks), hi = min(lo + per, chunks);
	const int row0 = min(o0, out - 1);
	const uint4 *w0 = (const uint4 *)(w + (size_t)row0 * in);
	const uint4 *xv = (const uint4 *)x;
	int roff[GEMV_ROWS];

#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
		roff[r] = (min(o0 + r, out - 1) - row0) * chunks;
	for (int b0 = 0; b0 < n; b0 += NB) {
		float acc[NB][GEMV_ROWS];
		const uint4 *xb[NB];

#pragma unroll
		for (int bb = 0; bb < NB; bb++) {
			xb[bb] = xv + (size_t)min(b0 + bb, n - 1) * chunks;	/* past n: row n - 1, not stored */
#pragma unroll
			for (int r = 0; r < GEMV_ROWS; r++)
				acc[bb][r] = 0.0f;
		}
#pragma unroll 2
		for (int c = lo + lane; c < hi; c += 32) {
			float wf[GEMV_ROWS][8];

			/* Widened once per chunk and row, not once per x row:
			 * dot8's fused multiply-adds in dot8's order (dot8f). */
#pragma unroll
			for (int r = 0; r < GEMV_ROWS; r++)
				unpack8(wf[r], __ldg(w0 + roff[r] + c));
#pragma unroll
			for (int bb = 0; bb < NB; bb++) {
				float xf[8];

				unpack8(xf, __ldg(xb[bb] + c));
#pragma unroll
				for (int r = 0; r < GEMV_ROWS; r++)
					acc[bb][r] = dot8f(wf[r], xf, acc[bb][r]);
			}
		}
#pragma unroll
		for (int bb = 0; bb < NB; bb++)
#pragma unroll
			for (int r = 0; r < GEMV_ROWS; r++)
				for (int o = 16; o > 0; o >>= 1)
					acc[bb][r] += __shfl_xor_sync(0xffffffffu, acc[bb][r], o);
		if (ks == 1) {	/* uniform over the launch */
#pragma unroll
			for (int bb = 0; bb < NB; bb++)
				if (b0 + bb < n)
					gemv_put(mode == KVMEM_GEMM_BF16
							 ? (void *)((uint16_t *)y + (size_t)(b0 + bb) * out)
							 : (void *)((float *)y + (size_t)(b0 + bb) * out),
						 mode, lane, o0, out, acc[bb]);
			continue;
		}
		if (lane == 0)
#pragma unroll
			for (int bb = 0; bb < NB; bb++)
#pragma unroll
				for (int r = 0; r < GEMV_ROWS; r++)
					part[warp][bb][r] = acc[bb][r];
		__syncthreads();
		if (threadIdx.x < groups * GEMV_ROWS) {
			const int gg = threadIdx.x / GEMV_ROWS, r = threadIdx.x % GEMV_ROWS;
			const int o = (blockIdx.x * groups + gg) * GEMV_ROWS + r;

			for (int bb = 0; bb < NB && b0 + bb < n; bb++) {
				float v = part[gg * ks][bb][r];

				for (int jj = 1; jj < ks; jj++)	/* in order: gemv_split_kernel's bits */
					v += part[gg * ks + jj][bb][r];
				if (o < out)
					gemv_store(mode == KVMEM_GEMM_BF16
							   ? (void *)((uint16_t *)y + (size_t)(b0 + bb) * out)
							   : (void *)((float *)y + (size_t)(b0 + bb) * out),
						   mode, o, v);
			}
		}
		__syncthreads();	/* part is read before the next rows overwrite it */
	}
}

int kvmem_cuda_gemv_rows_bf16(kvmem_cuda_ctx *c, void *y, int mode, const uint16_t *x,
			      const uint16_t *w, int n, int in, int out)
{
	if (n < 0 || in <= 0 || out <= 0 || mode < KVMEM_GEMM_BF16 || mode > KVMEM_GEMM_F32_ADD)
		return kvmem_error(EINVAL, "gemv rows: bad shape %d x %d -> %d or mode %d", n, in,
				   out, mode);
	/* The one-row GEMM this must equal is the GEMV only under these
	 * conditions (kvmem_cuda_gemm_bf16). */
	if (c->no_gemv || in % 8 || ((uintptr_t)x & 15) || ((uintptr_t)w & 15))
		return kvmem_error(ENOTSUP, "gemv rows: %d inputs, or the GEMV is off or the "
				   "buffers are not 16-byte aligned: a lone row would not take the "
				   "GEMV", in);
	if (!n)
		return 0;
	if (c->gemm_tc)	/* what the lone row runs too (kvmem_cuda_gemv_bf16) */
		return kvmem_cuda_gemm_tc_bf16(c, y, mode, x, w, n, in, out);
	if (n == 1)	/* the lone row's own GEMV (more loads in flight) */
		return kvmem_cuda_gemv_bf16(c, y, mode, x, w, in, out);
	const int ks = c->gemv_split ? gemv_splits(c, in, out) : 1;
	const int rows = GEMV_WARPS / ks * GEMV_ROWS, blocks = (out + rows - 1) / rows;

	if (n <= 2)
		gemv_rows_kernel<2><<<blocks, 32 * GEMV_WARPS, 0, c->stream>>>(y, mode, x, w, in, out, ks, n);
	else if (n <= 4)
		gemv_rows_kernel<4><<<blocks, 32 * GEMV_WARPS, 0, c->stream>>>(y, mode, x, w, in, out, ks, n);
	else
		gemv_rows_kernel<8><<<blocks, 32 * GEMV_WARPS, 0, c->stream>>>(y, mode, x, w, in, out, ks, n);
	return kvmem_cuda_launched("gemv rows");
}

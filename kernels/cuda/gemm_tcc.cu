// SPDX-License-Identifier: MIT
/*
 * The tensor-core GEMM for few rows with the rows in shared memory: the
 * bits of gemm_tc.cu's kernel (so a batched decode step's rows still get
 * the lone step's bits), fewer bytes through the L2.
 *
 * Why: gemm_tc.cu's block is one 16-output weight tile whose input ks warps
 * split; every warp reads its slice of all n rows of x for every tile, from
 * the L2 (a layer's x at 64 rows, 512 KB, does not stay in an SM's L1). At
 * 64 rows that is 4 bytes of x for each byte of weights, at 16 rows 1; the
 * eighth session's profile had the 64-row GEMMs at 1677 GB/s of weights and
 * the 16-row ones at 2836, against 3.4-3.9 TB/s for the lone GEMV.
 *
 * Here the split runs across the blocks of a thread-block cluster (Hopper):
 * block j of a cluster of ks sums the same input blocks [lo, hi) that warp
 * j of gemm_tc.cu's block sums, for 8 weight tiles at once (a warp each),
 * with its slice of the rows staged once in shared memory (cp.async, two
 * chunks in flight) and shared by the 8 warps: x's traffic falls to an
 * eighth. The ks partial sums meet in block 0 through distributed shared
 * memory and are added in the order j = 0 .. ks - 1 from block 0's own, as
 * gemm_tc.cu adds its warps' partials: the same mma steps in the same
 * order on the same operands, the same adds after, so the same bits
 * (kvmem_gpu_check --gemm-tc compares the two byte for byte).
 *
 * One weight tile a warp (MT 1) and TC_U input blocks of its loads in
 * flight, as gemm_tc.cu at 9-64 rows; x rows past n are zeros in registers,
 * never read, and more than 64 rows run the same code on each next 64.
 */
#include <cooperative_groups.h>

#include "gemm_tc.cuh"

namespace cg = cooperative_groups;

#define TCC_CHUNK 4		/* 32-element input blocks a staged chunk of x holds */
/* A staged row: the chunk and 32 elements of padding, so that the 8 lanes of
 * a 16-byte load phase (rows g, g + 1 at the same 4 offsets) hit distinct
 * banks (row stride 320 bytes: 80 words, 16 mod 32). */
#define TCC_LD (TCC_CHUNK * 32 + 32)

/* Shared memory for NT tiles of 8 rows: two staged chunks of 8 NT rows, the
 * partials ([TC_WARPS][NT][4][32] floats) over them once the sums are done. */
static constexpr size_t tcc_smem(int nt)
{
	return (size_t)2 * 8 * nt * TCC_LD * 2 > (size_t)TC_WARPS * nt * 4 * 32 * 4
		       ? (size_t)2 * 8 * nt * TCC_LD * 2
		       : (size_t)TC_WARPS * nt * 4 * 32 * 4;
}

/* Rows [b0, b0 + 8 NT) (those under n) of x's input blocks [cb, ce) into sx
 * ([8 NT][TCC_LD] bf16), 16 bytes a thread at a time; what is not loaded is
 * never read (the sums take zeros for rows past n and k past in). */
template <int NT>
__device__ __forceinline__ void tcc_stage(uint16_t *sx, const uint16_t *x, int in, int n, int b0,
					  int cb, int ce)
{
	const int per_row = (ce - cb) * 4;	/* 16-byte pieces */

	for (int p = threadIdx.x; p < 8 * NT * per_row; p += 32 * TC_WARPS) {
		const int r = p / per_row, k = cb * 32 + (p % per_row) * 8;

		if (b0 + r < n && k < in) {
			const unsigned s = (unsigned)__cvta_generic_to_shared(sx + r * TCC_LD + (k - cb * 32));

			asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s),
				     "l"(x + (size_t)(b0 + r) * in + k));
		}
	}
	asm volatile("cp.async.commit_group;\n" ::);
}

template <int NT>
__global__ void __launch_bounds__(32 * TC_WARPS)
gemm_tcc_kernel(void *y, int mode, const uint16_t *x, const uint16_t *w, int in, int out, int ks,
		int n)
{
	extern __shared__ __align__(16) uint16_t tcc_x[];	/* [2][8 NT][TCC_LD]; then the partials */
	float (*part)[NT][4][32] = (float (*)[NT][4][32])tcc_x;
	cg::cluster_group cluster = cg::this_cluster();
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
	const int j = (int)cluster.block_rank();	/* its input slice */
	const int o0 = ((blockIdx.x / ks) * TC_WARPS + warp) * 16;
	const int blocks = (in + 31) / 32, per = (blocks + ks - 1) / ks;
	const int lo = min(j * per, blocks), hi = min(lo + per, blocks);
	const uint16_t *wr0 = w + (size_t)min(o0 + g, out - 1) * in;
	const uint16_t *wr1 = w + (size_t)min(o0 + 8 + g, out - 1) * in;
	const uint4 zero = make_uint4(0, 0, 0, 0);

	for (int b0 = 0; b0 < n; b0 += 8 * NT) {
		float acc[NT][4];
		const int nch = (hi - lo + TCC_CHUNK - 1) / TCC_CHUNK;

#pragma unroll
		for (int i = 0; i < NT; i++)
			acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
		if (nch > 0)
			tcc_stage<NT>(tcc_x, x, in, n, b0, lo, min(lo + TCC_CHUNK, hi));
		for (int ci = 0; ci < nch; ci++) {
			const int cb = lo + ci * TCC_CHUNK, ce = min(cb + TCC_CHUNK, hi);
			const uint16_t *sx = tcc_x + (size_t)(ci & 1) * 8 * NT * TCC_LD;
			uint4 va[TCC_CHUNK], vb[TCC_CHUNK];

			/* This chunk's weights first (streamed once), then the
			 * next chunk of x on its way while this one is used. */
#pragma unroll
			for (int u = 0; u < TCC_CHUNK; u++) {
				const int k = (cb + u) * 32 + 8 * t;
				const bool in_k = cb + u < ce && k < in;

				va[u] = in_k ? __ldcs((const uint4 *)(wr0 + k)) : zero;
				vb[u] = in_k ? __ldcs((const uint4 *)(wr1 + k)) : zero;
			}
			if (ci + 1 < nch) {
				tcc_stage<NT>(tcc_x + (size_t)((ci + 1) & 1) * 8 * NT * TCC_LD, x, in, n,
					      b0, ce, min(ce + TCC_CHUNK, hi));
				asm volatile("cp.async.wait_group 1;\n" ::);
			} else {
				asm volatile("cp.async.wait_group 0;\n" ::);
			}
			__syncthreads();	/* chunk ci is in, for every warp */
#pragma unroll
			for (int u = 0; u < TCC_CHUNK; u++) {
				const int k = (cb + u) * 32 + 8 * t;

				if (cb + u >= ce)	/* uniform over the block */
					break;
#pragma unroll
				for (int i = 0; i < NT; i++) {
					const int r = 8 * i + g;
					const uint4 xv = b0 + r >= n || k >= in
								 ? zero
								 : *(const uint4 *)(sx + r * TCC_LD +
										    (k - cb * 32));

					mma_bf16(acc[i], va[u].x, vb[u].x, va[u].y, vb[u].y, xv.x, xv.y);
					mma_bf16(acc[i], va[u].z, vb[u].z, va[u].w, vb[u].w, xv.z, xv.w);
				}
			}
			__syncthreads();	/* read before chunk ci + 2 lands in its place */
		}
		if (ks > 1) {	/* uniform over the launch */
#pragma unroll
			for (int i = 0; i < NT; i++)
#pragma unroll
				for (int e = 0; e < 4; e++)
					part[warp][i][e][lane] = acc[i][e];
			cluster.sync();	/* every block's partials are written */
			if (!j)
				for (int jj = 1; jj < ks; jj++) {	/* in order: fixed bits */
					float (*pj)[NT][4][32] = cluster.map_shared_rank(part, jj);

#pragma unroll
					for (int i = 0; i < NT; i++)
#pragma unroll
						for (int e = 0; e < 4; e++)
							acc[i][e] += pj[warp][i][e][lane];
				}
			cluster.sync();	/* read before a block leaves or stages again */
		}
		if (j || o0 >= out)
			continue;
#pragma unroll
		for (int i = 0; i < NT; i++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int o = o0 + g + 8 * (e >> 1);
				const int r = b0 + 8 * i + 2 * t + (e & 1);

				if (o < out && r < n)
					tc_store(y, mode, (size_t)r * out + o, acc[i][e]);
			}
	}
}

template <int NT>
static int tcc_launch(kvmem_cuda_ctx *c, void *y, int mode, const uint16_t *x, const uint16_t *w,
		      int n, int in, int out, int ks)
{
	const int groups = ((out + 15) / 16 + TC_WARPS - 1) / TC_WARPS;
	cudaLaunchConfig_t cfg = {};
	cudaLaunchAttribute at[1];

	static_assert(tcc_smem(8) <= 48 * 1024, "gemm tcc: over the default shared memory");
	cfg.gridDim = dim3(groups * ks);
	cfg.blockDim = dim3(32 * TC_WARPS);
	cfg.dynamicSmemBytes = tcc_smem(NT);
	cfg.stream = c->stream;
	at[0].id = cudaLaunchAttributeClusterDimension;
	at[0].val.clusterDim.x = ks;
	at[0].val.clusterDim.y = 1;
	at[0].val.clusterDim.z = 1;
	cfg.attrs = at;
	cfg.numAttrs = 1;
	return kvmem_cuda_err(cudaLaunchKernelEx(&cfg, gemm_tcc_kernel<NT>, y, mode, x, w, in, out,
						 ks, n),
			      "gemm tcc: launch");
}

int kvmem_cuda_gemm_tcc_bf16(kvmem_cuda_ctx *c, void *y, int mode, const uint16_t *x,
			     const uint16_t *w, int n, int in, int out)
{
	if (n < 0 || in <= 0 || out <= 0 || mode < KVMEM_GEMM_BF16 || mode > KVMEM_GEMM_F32_ADD)
		return kvmem_error(EINVAL, "gemm tcc: bad shape %d x %d -> %d or mode %d", n, in,
				   out, mode);
	if (in % 8 || ((uintptr_t)x & 15) || ((uintptr_t)w & 15))
		return kvmem_error(ENOTSUP, "gemm tcc: %d inputs (not a multiple of 8) or x, w not "
				   "16-byte aligned", in);
	if (!n)
		return 0;
	const int ks = kvmem_cuda_gemm_tc_splits(c, in, out);
	const int nt = n > 32 ? 8 : n > 16 ? 4 : n > 8 ? 2 : 1;

	if (nt == 1)
		return tcc_launch<1>(c, y, mode, x, w, n, in, out, ks);
	if (nt == 2)
		return tcc_launch<2>(c, y, mode, x, w, n, in, out, ks);
	if (nt == 4)
		return tcc_launch<4>(c, y, mode, x, w, n, in, out, ks);
	return tcc_launch<8>(c, y, mode, x, w, n, in, out, ks);
}

// SPDX-License-Identifier: MIT
/*
 * Decode attention over an fp8 view, the register form (the cuda
 * context's fp8_reg, on by default; KVMEM_CUDA_FP8_REG=0: attention.cu's
 * tile form, dec8_kernel). decode5() in attention.cu launches it.
 *
 * dec8_kernel's blocks, splits, warps' keys and combine, for up to 8 rows
 * (queries x group), without K/V in shared memory: each lane loads the
 * raw bytes its own mma fragments need straight from global memory into
 * registers (the warp's next 16-key tile in flight while this one is
 * used) and turns them into bf16 there: a byte permute that also copies
 * each byte's sign into the byte above it, a multiply by 16, a mask and a
 * bf16x2 multiply by 2^120 for a pair of values (exact, subnormals too:
 * see e4m3x4_bf16_int). The keys are the mma's 16 rows, the 8 query rows its
 * columns, so no mma works on rows of zeros:
 *  - S^T = K Q^T: lane (g, t)'s A fragment of k-step kk holds keys g and
 *    g + 8 at dims HD/4 t + 4 kk .. + 3 (word kk of the lane's quarter of
 *    each row), its Q^T fragment the same dims of query row g: one
 *    permutation of the summed index on both sides;
 *  - P^T moves from the S^T layout (lane: keys g, g + 8 of rows 2t, 2t + 1)
 *    to the B layout of O^T += V^T P^T (lane: rows g of keys 2t, 2t + 1,
 *    2t + 8, 2t + 9) by four shuffles of packed bf16 pairs;
 *  - O^T's m-tile mt holds dims HD/8 g + mt (rows g) and HD/8 g + HD/16 +
 *    mt (rows g + 8), so lane g reads V[key][HD/8 g .. + HD/8 - 1] (one
 *    load a key) and owns those HD/8 dims of query rows 2t and 2t + 1.
 * Not v5's bits by construction (the sums run in another order; every
 * case of kvmem_gpu_check --fp8, which allows two bf16 ulps against v5
 * over the rows dequantised, gave them on the H200); a conversation's
 * paged and full-context decode use the same kernel. H200, one layer of 8
 * KV heads: 36.1 / 98.4 us at 32K / 128K keys, the bf16 view's v5 47.5 /
 * 144.9, the tile form 62.8 / 200.5 (benchmarks.md). A
 * NaN code in any key a warp reads makes the block's partial NaN (v5: the
 * rows or dims the NaN reaches). Shared memory: the merge only.
 * MINB: blocks a multiprocessor holds (registers), as its split target.
 */
#include <limits.h>

#include "attention_dec.cuh"
#include "fp8.cuh"

template <int HD> struct dec8r_tile {
	uint32_t k[2][HD / 16];	/* keys g, g + 8: the lane's HD/4 bytes of each */
	uint32_t v[4][HD / 32];	/* keys 2t, 2t + 1, 2t + 8, 2t + 9: its HD/8 bytes */
	float ks[2], vs[2];	/* keys g, g + 8: their row scales */
	int kp[2];		/* and positions (kv_pos) */
};

/* n bytes (16 or 8) at p into w, zeros when !ok; L2 only (read once a step). */
template <int N> __device__ __forceinline__ void dec8r_ld(uint32_t *w, const unsigned char *p, bool ok)
{
	if (N == 16) {
		const uint4 u = ok ? __ldcg((const uint4 *)p) : make_uint4(0, 0, 0, 0);

		w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
	} else {
		const uint2 u = ok ? __ldcg((const uint2 *)p) : make_uint2(0, 0);

		w[0] = u.x, w[1] = u.y;
	}
}

/* One m-tile of O^T += V^T P^T: V^T's A fragment from byte SEL picks of
 * the words of keys 2t, 2t + 1 (rows g: word c0; rows g + 8: word c1) and
 * of keys 2t + 8, 2t + 9. */
template <unsigned SEL, int W>
__device__ __forceinline__ void dec8r_pv(float *acc, const uint32_t (*v)[W], int c0, int c1,
					 uint32_t pb0, uint32_t pb1)
{
	const uint32_t va[4] = { e4m3_pair_bf16<SEL>(v[0][c0], v[1][c0]),
				 e4m3_pair_bf16<SEL>(v[0][c1], v[1][c1]),
				 e4m3_pair_bf16<SEL>(v[2][c0], v[3][c0]),
				 e4m3_pair_bf16<SEL>(v[2][c1], v[3][c1]) };

	mma16816(acc, va, pb0, pb1);
}

/* Split `split` of KV head kvh (the lone kernel's blockIdx.x and .y; the
 * batched one's too, blockIdx.z picking the sequence). */
template <int HD>
__device__ __forceinline__ void dec8r_body(const dec_args &a, const int kvh, const int split)
{
	constexpr int KQ = HD / 4, VQ = HD / 8, KW = HD / 16, MT = HD / 16;
	extern __shared__ __align__(16) unsigned char smem_raw[];
	float *mo = (float *)smem_raw;	/* the merge (dec_finish) */
	float *mm = mo + DEC_WARPS * 16 * HD, *ml = mm + DEC_WARPS * 16;
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
	const int G = a.group, R = a.n_q * G;	/* <= 8 */
	const int n_kv = max(0, a.n_kv_dev ? min(*a.n_kv_dev, a.n_kv) : a.n_kv);
	int kps, splits;

	decode_split(n_kv, DEC_BN, a.target, a.min_tiles, &kps, &splits);
	if (splits < 1)
		splits = 1;	/* no keys: one block writes the zeros */
	if (split >= splits)
		return;

	int qmax = INT_MIN, qmin = INT_MAX;

	for (int i = 0; i < a.n_q; i++) {
		const int p = a.q_pos[i];

		qmax = max(qmax, p);
		qmin = min(qmin, p);
	}
	/* this lane's score columns: query rows 2t, 2t + 1 */
	const int qp0 = 2 * t < R ? a.q_pos[2 * t / G] : INT_MIN;
	const int qp1 = 2 * t + 1 < R ? a.q_pos[(2 * t + 1) / G] : INT_MIN;
	const int ks = split * kps;
	int ke = min(n_kv, ks + kps);

	if (!a.kv_pos)
		ke = min(ke, qmax == INT_MAX ? qmax : qmax + 1);
	const int n_tiles = ke > ks ? (ke - ks + 15) / 16 : 0;	/* of 16 keys */
	const unsigned char *k8 = (const unsigned char *)a.k + (size_t)kvh * a.kv_stride * HD;
	const unsigned char *v8 = (const unsigned char *)a.v + (size_t)kvh * a.kv_stride * HD;
	const float *ksh = a.ks + (size_t)kvh * a.kv_stride;
	const float *vsh = a.vs + (size_t)kvh * a.kv_stride;

	/* Q^T's B fragments: query row g (zero past R), dims KQ t + 4 kk + 0, 1
	 * (reg 0) and + 2, 3 (reg 1) in k-step kk. */
	uint32_t qf[KW][2];
	{
		uint32_t w[KQ / 2];

		if (g < R) {
			const uint16_t *qr = a.q + ((size_t)(g / G) * a.n_heads + kvh * G + g % G) * HD +
					     KQ * t;
#pragma unroll
			for (int c = 0; c < KQ / 8; c++) {
				const uint4 u = *(const uint4 *)(qr + 8 * c);

				w[4 * c] = u.x, w[4 * c + 1] = u.y, w[4 * c + 2] = u.z, w[4 * c + 3] = u.w;
			}
		} else {
#pragma unroll
			for (int c = 0; c < KQ / 2; c++)
				w[c] = 0;
		}
#pragma unroll
		for (int kk = 0; kk < KW; kk++) {
			qf[kk][0] = w[2 * kk];
			qf[kk][1] = w[2 * kk + 1];
		}
	}

	auto load = [&](dec8r_tile<HD> &T, int i) {
		const int j0 = ks + i * 16;

#pragma unroll
		for (int h = 0; h < 2; h++) {
			const int j = j0 + 8 * h + g;
			const bool ok = j < ke;

#pragma unroll
			for (int c = 0; c < KQ / 16; c++)
				dec8r_ld<16>(T.k[h] + 4 * c, k8 + (size_t)j * HD + KQ * t + 16 * c, ok);
			T.ks[h] = ok ? __ldcg(ksh + j) : 0.0f;
			T.vs[h] = ok ? __ldcg(vsh + j) : 0.0f;
			T.kp[h] = a.kv_pos && ok ? __ldcg(a.kv_pos + j) : j;
		}
#pragma unroll
		for (int r = 0; r < 4; r++) {
			const int j = j0 + (r >> 1) * 8 + 2 * t + (r & 1);

			dec8r_ld<VQ>(T.v[r], v8 + (size_t)j * HD + VQ * g, j < ke);
		}
	};

	float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;	/* rows 2t, 2t + 1 */
	float o[MT][4];
	uint32_t nan = 0;
	/* P^T's sources: lanes (2t + e, g / 2) hold keys 2t + e (and + 8) of row g */
	const int src0 = 4 * (2 * t) + (g >> 1), src1 = src0 + 4;
	const bool odd = g & 1;

#pragma unroll
	for (int mt = 0; mt < MT; mt++)
		o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;

	auto tile = [&](const dec8r_tile<HD> &T, int i) {
		const int j0 = ks + i * 16;
		float s[4] = { 0.0f, 0.0f, 0.0f, 0.0f };	/* rows 2t, 2t + 1 of key g; of key g + 8 */

		/* S^T = K Q^T over the tile's 16 keys */
#pragma unroll
		for (int kk = 0; kk < KW; kk++) {
			const uint32_t w0 = T.k[0][kk], w1 = T.k[1][kk];
			const uint32_t ka[4] = { e4m3_pair_bf16<E4_LO>(w0, 0), e4m3_pair_bf16<E4_LO>(w1, 0),
						 e4m3_pair_bf16<E4_HI>(w0, 0), e4m3_pair_bf16<E4_HI>(w1, 0) };

			nan = e4m3_nan_acc(nan, w0, w1);
			mma16816(s, ka, qf[kk][0], qf[kk][1]);
		}

		/* K's row scales (powers of two), the scale, the mask */
		const bool full = !a.kv_pos && j0 + 16 <= ke && j0 + 15 <= qmin;
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const float f = T.ks[h] * a.scale_log2;
			float x0 = s[2 * h] * f, x1 = s[2 * h + 1] * f;

			if (!full) {
				const int j = j0 + 8 * h + g, kp = T.kp[h];
				const bool ok = j < ke;

				if (!ok || kp > qp0)
					x0 = -INFINITY;
				if (!ok || kp > qp1)
					x1 = -INFINITY;
			}
			s[2 * h] = x0;
			s[2 * h + 1] = x1;
		}

		/* online softmax of rows 2t, 2t + 1: a column's 16 keys are on
		 * the 8 lanes of this t */
		float mx0 = fmaxf(s[0], s[2]), mx1 = fmaxf(s[1], s[3]);

#pragma unroll
		for (int x = 4; x < 32; x <<= 1) {
			mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
			mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
		}
		const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
		const float b0 = mn0 == -INFINITY ? 0.0f : mn0, b1 = mn1 == -INFINITY ? 0.0f : mn1;
		const float al0 = exp2f(m0 - b0), al1 = exp2f(m1 - b1);

		s[0] = exp2f(s[0] - b0);
		s[1] = exp2f(s[1] - b1);
		s[2] = exp2f(s[2] - b0);
		s[3] = exp2f(s[3] - b1);
		l0 = l0 * al0 + (s[0] + s[2]);
		l1 = l1 * al1 + (s[1] + s[3]);
		m0 = mn0;
		m1 = mn1;
		/* the same alphas on the lanes of a t; 1 (a max that held) changes nothing */
		if (__any_sync(0xffffffffu, al0 != 1.0f || al1 != 1.0f))
#pragma unroll
			for (int mt = 0; mt < MT; mt++) {
				o[mt][0] *= al0;
				o[mt][1] *= al1;
				o[mt][2] *= al0;
				o[mt][3] *= al1;
			}

		/* P (V's row scales on it, rounded to bf16) into P^T's B layout */
		const uint32_t pk0 = pack_bf2(s[0] * T.vs[0], s[1] * T.vs[0]);	/* key g */
		const uint32_t pk1 = pack_bf2(s[2] * T.vs[1], s[3] * T.vs[1]);	/* key g + 8 */
		const uint32_t x0 = __shfl_sync(0xffffffffu, pk0, src0);	/* key 2t */
		const uint32_t x1 = __shfl_sync(0xffffffffu, pk0, src1);	/* key 2t + 1 */
		const uint32_t y0 = __shfl_sync(0xffffffffu, pk1, src0);	/* key 2t + 8 */
		const uint32_t y1 = __shfl_sync(0xffffffffu, pk1, src1);	/* key 2t + 9 */
		const uint32_t pb0 = __byte_perm(x0, x1, odd ? 0x7632 : 0x5410);
		const uint32_t pb1 = __byte_perm(y0, y1, odd ? 0x7632 : 0x5410);

		/* O^T += V^T P^T: m-tile mt's rows g, g + 8 are dims VQ g + mt and
		 * VQ g + MT + mt, byte mt and MT + mt of the lane's V bytes */
#pragma unroll
		for (int r = 0; r < 4; r += 2)
#pragma unroll
			for (int c = 0; c < VQ / 4; c++)
				nan = e4m3_nan_acc(nan, T.v[r][c], T.v[r + 1][c]);
#pragma unroll
		for (int q = 0; q < MT; q += 4) {	/* m-tiles q + j: byte j of words q/4, (MT+q)/4 */
			const int c0 = q >> 2, c1 = (MT + q) >> 2;

			dec8r_pv<E4_J(0)>(o[q], T.v, c0, c1, pb0, pb1);
			dec8r_pv<E4_J(1)>(o[q + 1], T.v, c0, c1, pb0, pb1);
			dec8r_pv<E4_J(2)>(o[q + 2], T.v, c0, c1, pb0, pb1);
			dec8r_pv<E4_J(3)>(o[q + 3], T.v, c0, c1, pb0, pb1);
		}
	};

	/* Two tiles' registers in turn: the next tile's loads in flight while
	 * this one is used. */
	dec8r_tile<HD> ta, tb;

	if (warp < n_tiles)
		load(ta, warp);
	for (int i = warp; i < n_tiles; i += 2 * DEC_WARPS) {
		if (i + DEC_WARPS < n_tiles)
			load(tb, i + DEC_WARPS);
		tile(ta, i);
		if (i + DEC_WARPS >= n_tiles)
			break;
		if (i + 2 * DEC_WARPS < n_tiles)
			load(ta, i + 2 * DEC_WARPS);
		tile(tb, i + DEC_WARPS);
	}

	/* A NaN code read: this warp's rows NaN, so the block's partial is. */
	if (__any_sync(0xffffffffu, (nan & 0x80808080u) != 0)) {
		l0 = l1 = __int_as_float(0x7fc00000);
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
			o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = l0;
	}
#pragma unroll
	for (int x = 4; x < 32; x <<= 1) {
		l0 += __shfl_xor_sync(0xffffffffu, l0, x);
		l1 += __shfl_xor_sync(0xffffffffu, l1, x);
	}
	/* The warp's state, v5's merge layout: rows 2t + e, the lane's dims
	 * VQ g .. + VQ - 1 (o[mt][e]: + mt; o[mt][2 + e]: + MT + mt). */
#pragma unroll
	for (int e = 0; e < 2; e++) {
		float *row = mo + (warp * 16 + 2 * t + e) * HD + VQ * g;

#pragma unroll
		for (int c = 0; c < MT / 4; c++) {
			*(float4 *)(row + 4 * c) = make_float4(o[4 * c][e], o[4 * c + 1][e],
							       o[4 * c + 2][e], o[4 * c + 3][e]);
			*(float4 *)(row + MT + 4 * c) = make_float4(o[4 * c][2 + e], o[4 * c + 1][2 + e],
								    o[4 * c + 2][2 + e],
								    o[4 * c + 3][2 + e]);
		}
	}
	if (g == 0) {
		mm[warp * 16 + 2 * t] = m0;
		mm[warp * 16 + 2 * t + 1] = m1;
		ml[warp * 16 + 2 * t] = l0;
		ml[warp * 16 + 2 * t + 1] = l1;
	}
	__syncthreads();
	dec_finish<HD>(a, kvh, split, splits, mo);
}

template <int HD, int MINB>
__global__ void __launch_bounds__(32 * DEC_WARPS, MINB) dec8r_kernel(const dec_args a)
{
	dec8r_body<HD>(a, blockIdx.y, blockIdx.x);
}

/* Many sequences' views in one launch (kvmem_cuda_att_dec_batch): each
 * block's sequence by blockIdx.z, split as the lone call splits it, so its
 * bits are the lone kernel's. */
template <int HD, int MINB>
__global__ void __launch_bounds__(32 * DEC_WARPS, MINB) dec8r_batch_kernel(const dec_args base,
									   const dec_seq *seqs)
{
	dec8r_body<HD>(dec_seq_args(base, seqs[blockIdx.z]), blockIdx.y, blockIdx.x);
}

/* A kernel's shared memory limit for its merge area. */
template <int HD> static int dec8r_smem(const void *kernel)
{
	return kvmem_cuda_dec_smem(kernel, (int)dec_cfg<HD>::MERGE_BYTES,
				   "attention v5 (fp8, registers): shared memory");
}

template <int HD> static int dec8r_attr_hd(void)
{
	int rc;

	if ((rc = dec8r_smem<HD>((const void *)dec8r_kernel<HD, 2>)) ||
	    (rc = dec8r_smem<HD>((const void *)dec8r_kernel<HD, 3>)) ||
	    (rc = dec8r_smem<HD>((const void *)dec8r_batch_kernel<HD, 2>)))
		return rc;
	return dec8r_smem<HD>((const void *)dec8r_batch_kernel<HD, 3>);
}

/* Once per device with v5's (attention.cu's dec_attr). */
int kvmem_cuda_dec8r_attr(int head_dim)
{
	return head_dim == 128 ? dec8r_attr_hd<128>() : dec8r_attr_hd<64>();
}

void kvmem_cuda_dec8r_launch(kvmem_cuda_ctx *c, const dec_args &a, int grid, int head_dim,
			     int minb)
{
	const dim3 gr(grid, a.n_kv_heads);
	const int th = dec_cfg<128>::THREADS;

	if (head_dim == 128 && minb == 3)
		dec8r_kernel<128, 3><<<gr, th, dec_cfg<128>::MERGE_BYTES, c->stream>>>(a);
	else if (head_dim == 128)
		dec8r_kernel<128, 2><<<gr, th, dec_cfg<128>::MERGE_BYTES, c->stream>>>(a);
	else if (minb == 3)
		dec8r_kernel<64, 3><<<gr, th, dec_cfg<64>::MERGE_BYTES, c->stream>>>(a);
	else
		dec8r_kernel<64, 2><<<gr, th, dec_cfg<64>::MERGE_BYTES, c->stream>>>(a);
}

void kvmem_cuda_dec8r_batch_launch(kvmem_cuda_ctx *c, const dec_args &base, const dec_seq *seqs,
				   int grid, int n_seqs, int head_dim, int minb)
{
	const dim3 gr(grid, base.n_kv_heads, n_seqs);
	const int th = dec_cfg<128>::THREADS;

	if (head_dim == 128 && minb == 3)
		dec8r_batch_kernel<128, 3><<<gr, th, dec_cfg<128>::MERGE_BYTES, c->stream>>>(base,
											      seqs);
	else if (head_dim == 128)
		dec8r_batch_kernel<128, 2><<<gr, th, dec_cfg<128>::MERGE_BYTES, c->stream>>>(base,
											      seqs);
	else if (minb == 3)
		dec8r_batch_kernel<64, 3><<<gr, th, dec_cfg<64>::MERGE_BYTES, c->stream>>>(base, seqs);
	else
		dec8r_batch_kernel<64, 2><<<gr, th, dec_cfg<64>::MERGE_BYTES, c->stream>>>(base, seqs);
}

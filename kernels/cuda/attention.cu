// SPDX-License-Identifier: MIT
/*
 * Causal GQA attention over a bf16 view (twin: kvmem_attention_bf16 in
 * kernels/cpu/bf16_ops.c, which widens and runs kvmem_attention):
 *
 *   for query i, head h (KV head g = h / group):
 *     s_j = scale * q_i . k_j  for keys j with kv_pos[j] <= q_pos[i]
 *     out = sum_j softmax(s)_j v_j
 *
 * Versions, kept side by side (kvmem_cuda_attention_bf16_v):
 *
 * 1  one warp per (query, head), 32 keys per step (a lane per key), online
 *    softmax in fp32, V accumulated lane-per-dimension. Plain loads, no
 *    shared K/V: the simple reference, slow on long views.
 *
 * 2  the flash kernel (the main path's decode). A block owns a tile of 16 * WM rows,
 *    where a row is one (query token, query head of KV head g): the group's
 *    heads are packed into the rows, so every K/V tile (64 keys) read from
 *    the view serves all of them. K/V tiles stream through shared memory with
 *    cp.async, double-buffered; S = Q K^T and O += P V run on the tensor
 *    cores (mma.sync m16n8k16, bf16 in, fp32 accumulate; B fragments by
 *    ldmatrix, .trans for V); the online softmax keeps a running max and sum
 *    per row in fp32 (exp2 with log2(e) folded into the scale) and P is
 *    rounded to bf16 for the P V product. With kv_pos NULL (slot = position)
 *    tiles past the block's last query position are skipped (the causal
 *    half of a prefill), and fully visible tiles skip the mask.
 *    WM = 4 (64 rows) for prefill chunks, WM = 1 (16 rows) when the rows
 *    are few (decode: 1 token x group heads). When rows x KV heads would
 *    not fill the GPU, the key range is split over blocks (split-K): each
 *    writes an unnormalised partial (o, max, sum) and a second kernel
 *    combines the splits in order. The split count depends only on the
 *    shapes and the number of multiprocessors, so results are repeatable.
 *    Decode always splits, at keys-per-split fixed by the key count and the
 *    SM count alone, and may take the key count from device memory (a CUDA
 *    graph replays one launch as the view grows): see flash().
 *
 * 3  the same kernel with other tiles: 128 rows (8 warps) for prefill, and
 *    32-key tiles for decode (see flash()).
 *
 * 4  (the main path's prefill where v6 does not run) the same kernel with
 *    two 16-row m-tiles per warp: 128 rows in 4 warps, Q fragments read
 *    from shared memory by ldmatrix at each step, so each K / V fragment
 *    loaded from shared memory feeds four MMAs instead of two (v2 is bound
 *    by shared-memory traffic: ncu saw ldmatrix the largest stall).
 *    Shared-memory addresses are computed once per thread and P goes to
 *    bf16 by one cvt per pair.
 *    255 registers, 72 bytes spilled (104 before the fp8 scales joined
 *    flash_args), 2 blocks (8 warps) per SM, its key splits sized to
 *    that. Over an fp8 view (kvmem_cuda_attention_fp8) the same kernel
 *    reads e4m3 tiles (attention_flash.cuh's F8 form).
 *
 * 5  a decode kernel (rows <= 16; other shapes run as v4): four warps per
 *    (split, KV head) over a three-stage cp.async ring of 64-key stages,
 *    each warp 16 keys of a stage for all the group's rows, the warps
 *    merged in the block and the splits combined by the last block of each
 *    KV head to finish, in split order (one launch, no combine kernel): see
 *    dec_kernel(). Over an fp8 view: the tile form here (dec8_kernel) or
 *    the register form, attention_fp8.cu (the default up to 8 rows); the
 *    pieces they share are in attention_dec.cuh and attention_mma.cuh.
 *
 * 6  (the main path's prefill on sm_90) the flash kernel on wgmma, a
 *    producer warpgroup feeding two consumer warpgroups through an mbarrier
 *    ring, softmax overlapped with the MMAs: attention_wgmma.cu.
 *    Other devices and shapes (head_dim 64, kv_pos given, decode) run as
 *    v4; the main path takes v4 where v6's row tiles would not fill the GPU.
 */
#include <limits.h>
#include <string.h>

#include "cuda_int.h"
#include "attention_dec.cuh"
#include "attention_flash.cuh"
#include "attention_warp.cuh"
#include "fp8.cuh"
#include "kernels/kernels_cuda_batch.h"

/* ---- version 1 ------------------------------------------------------------ */
#define V1_MAX_HD WARP_ATT_MAX_HD

__global__ void attn_v1_kernel(uint16_t *out, const uint16_t *q, const int32_t *q_pos,
			       const uint16_t *k, const uint16_t *v, const int32_t *kv_pos, int n_kv,
			       long long kv_stride, int n_heads, int group, int hd, float scale)
{
	__shared__ float qs[V1_MAX_HD];
	const int i = blockIdx.x, h = blockIdx.y, lane = threadIdx.x, g = h / group;
	const int per = hd / 32, qp = q_pos[i];
	const uint16_t *kh = k + (size_t)g * kv_stride * hd, *vh = v + (size_t)g * kv_stride * hd;
	float o[V1_MAX_HD / 32], m = -INFINITY, l = 0.0f;

	for (int d = lane; d < hd; d += 32)
		qs[d] = bf2f(q[((size_t)i * n_heads + h) * hd + d]);
	for (int c = 0; c < V1_MAX_HD / 32; c++)
		o[c] = 0.0f;
	__syncwarp();
	warp_attend(qs, kh, vh, kv_pos, qp, 0, n_kv, hd, scale, lane, o, &m, &l);
	const float inv = l > 0.0f ? 1.0f / l : 0.0f;

	for (int c = 0; c < per; c++)
		out[((size_t)i * n_heads + h) * hd + lane + 32 * c] = f2bf(o[c] * inv);
}

/* ---- versions 2-4: the flash kernel (attention_flash.cuh) ----------------- */

/*
 * A combine's split weights for row r of KV head kvh, by one warp: lane
 * keeps w[i] = 2^(m_s - M) of split s = lane + 32 i (0 past the splits or
 * for a split with no keys), M the largest running max of the splits;
 * returns L = the sum of w_s l_s, lanes over their splits in order, then a
 * fixed shuffle tree (every lane the same L: an addition's operands
 * commute). The block combine and the warp combine below share it, so
 * their bits are one.
 */
__device__ __forceinline__ float combine_weights(const float *pm, const float *pl, int splits,
						 int n_kv_heads, int kvh, int R, int r, int lane,
						 float w[COMBINE_MAX / 32])
{
	float M = -INFINITY, L = 0.0f;

#pragma unroll
	for (int i = 0; i < COMBINE_MAX / 32; i++) {
		const int s = lane + 32 * i;

		w[i] = s < splits ? pm[((size_t)s * n_kv_heads + kvh) * R + r] : -INFINITY;
		M = fmaxf(M, w[i]);
	}
	for (int o = 16; o > 0; o >>= 1)
		M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
#pragma unroll
	for (int i = 0; i < COMBINE_MAX / 32; i++) {
		const int s = lane + 32 * i;
		const float ws = w[i] == -INFINITY ? 0.0f : exp2f(w[i] - M);

		w[i] = ws;
		if (ws != 0.0f)
			L = __fadd_rn(L, __fmul_rn(ws, pl[((size_t)s * n_kv_heads + kvh) * R + r]));
	}
	for (int o = 16; o > 0; o >>= 1)
		L = __fadd_rn(L, __shfl_xor_sync(0xffffffffu, L, o));
	return L;
}

/*
 * Combine split-K partials: row blockIdx.x of KV head blockIdx.y. Warp 0
 * finds the largest running max M of the splits and each split's weight
 * 2^(m_s - M), and sums l_s times those weights (lanes over splits, then a
 * fixed shuffle tree); then 4 groups of head_dim threads each sum the
 * weighted partial outputs of every fourth split (4 loads in flight per
 * thread), and the groups' sums are added in a fixed order. Every order is
 * fixed by the split index: the same partials give the same bits. With
 * target > 0 the split count follows from the key count (*n_kv_dev when
 * set, capped at n_kv) by decode_split(), as in the kernel.
 */
template <int HD>
__global__ void __launch_bounds__(4 * HD)
combine_kernel(uint16_t *out, const float *po, const float *pm, const float *pl,
	       const int *n_kv_dev, int n_kv, int bn, int target, int splits, int R, int n_kv_heads,
	       int n_heads, int G)
{
	__shared__ float w[COMBINE_MAX];
	__shared__ float red[3][HD];
	__shared__ float s_inv;
	const int r = blockIdx.x, kvh = blockIdx.y, tid = threadIdx.x;

	if (target) {
		int kps;

		decode_split(n_kv_dev ? min(*n_kv_dev, n_kv) : n_kv, bn, target, 1, &kps, &splits);
	}
	if (tid < 32) {
		float ws[COMBINE_MAX / 32];
		const float L = combine_weights(pm, pl, splits, n_kv_heads, kvh, R, r, tid, ws);

#pragma unroll
		for (int i = 0; i < COMBINE_MAX / 32; i++)
			w[tid + 32 * i] = ws[i];
		if (tid == 0)
			s_inv = L > 0.0f ? 1.0f / L : 0.0f;
	}
	__syncthreads();
	const int g = tid / HD, d = tid % HD;
	float acc = 0.0f;

	for (int s0 = g; s0 < splits; s0 += 16) {
		float x[4];

#pragma unroll
		for (int j = 0; j < 4; j++) {
			const int s = s0 + 4 * j;

			x[j] = s < splits ? po[(((size_t)s * n_kv_heads + kvh) * R + r) * HD + d] : 0.0f;
		}
#pragma unroll
		for (int j = 0; j < 4; j++)
			if (s0 + 4 * j < splits)
				acc = __fadd_rn(acc, __fmul_rn(w[s0 + 4 * j], x[j]));
	}
	if (g)
		red[g - 1][d] = acc;
	__syncthreads();
	if (!g) {
		const float sum = __fadd_rn(__fadd_rn(acc, red[0][d]), __fadd_rn(red[1][d], red[2][d]));

		out[((size_t)(r / G) * n_heads + kvh * G + r % G) * HD + d] = f2bf(__fmul_rn(sum, s_inv));
	}
}

/*
 * ---- version 5: the decode kernel ----------------------------------------
 *
 * Decode only (rows = queries x group <= 16). One block of DEC_WARPS warps
 * per (split, KV head); the split's keys stream through a DEC_STAGES-deep
 * cp.async ring of DEC_BN-key stages (K and V, 16-byte copies issued by all
 * 128 threads, two stages in flight while the third is used), and each warp
 * takes its own 16 keys of every stage against all 16 rows (the group's
 * heads share each K/V read): S = Q K^T and O += P V by mma.sync as in the
 * flash kernel, fp32 online softmax, P rounded to bf16. The warps' states
 * are merged in warp order through shared memory, so a block writes one
 * partial (o, max, sum). The combine is folded in: each block bumps its KV
 * head's counter after its partial is visible, and the block that brings it
 * to the split count (whichever it is) combines every split in split order
 * (weights 2^(m_s - M), sums over splits in index order: the same bits
 * whichever block arrives last), then sets the counter back to 0 for the
 * next launch. One split writes the output directly. Two blocks per SM
 * (107 KB of shared memory each at head_dim 128); the split target is two
 * blocks per SM over the KV heads, the split rule decode_split()'s.
 *
 * fp8 K/V (F8, the cuda backend's fp8 views: e4m3 rows with an fp32 scale
 * each, kernels/cuda/fp8_view.cu): the ring holds the stages' raw bytes and
 * scales (16-byte cp.async of 16 keys' dims, half a bf16 row's traffic),
 * each warp loading its own 16 keys of a stage and turning them into its
 * rows of one bf16 K/V tile, unscaled (e4m3x4_bf16: exact, two
 * instructions a value), with warp barriers only (block barriers between
 * stages: 0.65 of bf16's speed at 32K keys; these: 0.67); the row scales,
 * powers of two, go on the scores (K's) and on P before its rounding
 * (V's), which gives the products of the tile dequantised with them: a
 * decode over an fp8 view has the bits of this kernel over the view
 * dequantised to bf16 (kvmem_cuda_fp8_view_bf16). (The first form scaled
 * and rounded every value in the tile: 2.7x bf16's time at 32K keys.) 91 KB of shared memory
 * at head_dim 128: still two blocks per SM.
 */
/* One block's work: split `split` of KV head kvh of the sequence in a.
 * Shared by the one-sequence kernel (dec_kernel) and the batched one
 * (dec_batch_kernel, a sequence per blockIdx.z), so a sequence gets the
 * same bits from either. */
template <int HD, int F8 = 0>
__device__ __forceinline__ void dec_body(const dec_args &a, const int kvh, const int split)
{
	typedef dec_cfg<HD> C;
	extern __shared__ __align__(16) unsigned char smem_raw[];
	uint16_t *sQ = (uint16_t *)smem_raw;
	/* [STAGES][K, V][BN][LD]; fp8: one [K, V][BN][LD] tile */
	uint16_t *sKV = (uint16_t *)(smem_raw + C::Q_BYTES);
	/* fp8: [STAGES] of (K bytes, V bytes [BN][HD], K scales, V scales [BN]) */
	unsigned char *sRaw = smem_raw + C::Q_BYTES + C::STAGE_BYTES;
	int *sP = (int *)(smem_raw + C::Q_BYTES +
			  (F8 ? C::KV8_BYTES : DEC_STAGES * C::STAGE_BYTES));	/* [STAGES][BN] */

	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, t4 = lane & 3;
	const int G = a.group, R = a.n_q * G;
	const int n_kv = max(0, a.n_kv_dev ? min(*a.n_kv_dev, a.n_kv) : a.n_kv);
	int kps, splits;

	decode_split(n_kv, DEC_BN, a.target, a.min_tiles, &kps, &splits);
	if (splits < 1)
		splits = 1;	/* no keys: one block writes the zeros */
	if (split >= splits)
		return;	/* the whole block: a graph's grid has the most splits */

	int qmax = INT_MIN, qmin = INT_MAX;

	for (int t = 0; t < a.n_q; t++) {
		const int p = a.q_pos[t];

		qmax = max(qmax, p);
		qmin = min(qmin, p);
	}
	const int r_lo = gq, r_hi = gq + 8;
	const int qp_lo = r_lo < R ? a.q_pos[r_lo / G] : INT_MIN;
	const int qp_hi = r_hi < R ? a.q_pos[r_hi / G] : INT_MIN;
	const int ks = split * kps;
	int ke = min(n_kv, ks + kps);

	if (!a.kv_pos)
		ke = min(ke, qmax == INT_MAX ? qmax : qmax + 1);
	const int n_tiles = ke > ks ? (ke - ks + DEC_BN - 1) / DEC_BN : 0;
	const uint16_t *kh = a.k + (size_t)kvh * a.kv_stride * HD;
	const uint16_t *vh = a.v + (size_t)kvh * a.kv_stride * HD;

	/* Q (rows past R zero) joins the first stage's group. */
	if (n_tiles > 0)
		for (int c = tid; c < 16 * C::CH; c += C::THREADS) {
			const int r = c / C::CH, cc = c % C::CH;
			const bool ok = r < R;
			const uint16_t *src = ok ? a.q + ((size_t)(r / G) * a.n_heads + kvh * G + r % G) * HD +
						      cc * 8 : a.q;

			cp_async16(sQ + r * C::LD + cc * 8, src, ok);
		}
	auto load_stage = [&](int i, int st) {
		const int j0 = ks + i * DEC_BN;
		uint16_t *dk = sKV + (size_t)st * 2 * DEC_BN * C::LD, *dv = dk + DEC_BN * C::LD;

		if (F8) {
			const unsigned char *k8 = (const unsigned char *)a.k + (size_t)kvh * a.kv_stride * HD;
			const unsigned char *v8 = (const unsigned char *)a.v + (size_t)kvh * a.kv_stride * HD;
			const float *ksh = a.ks + (size_t)kvh * a.kv_stride;
			const float *vsh = a.vs + (size_t)kvh * a.kv_stride;
			unsigned char *rk = sRaw + (size_t)st * C::RAW_STAGE, *rv = rk + DEC_BN * HD;
			float *rks = (float *)(rv + DEC_BN * HD), *rvs = rks + DEC_BN;

			/* Each warp loads its own 16 keys (the only ones it reads):
			 * no block barrier between the stages. */
#pragma unroll
			for (int c = lane; c < 16 * (HD / 16); c += 32) {
				const int r = warp * 16 + c / (HD / 16), cc = c % (HD / 16);
				const bool ok = j0 + r < ke;
				const size_t off = (size_t)(j0 + r) * HD + cc * 16;

				cp_async16(rk + r * HD + cc * 16, ok ? k8 + off : (const void *)a.k, ok);
				cp_async16(rv + r * HD + cc * 16, ok ? v8 + off : (const void *)a.v, ok);
			}
			{
				const int r = warp * 16 + (lane & 15);
				const bool ok = j0 + r < ke;

				if (lane < 16)
					cp_async4(rks + r, ok ? ksh + j0 + r : a.ks, ok);
				else
					cp_async4(rvs + r, ok ? vsh + j0 + r : a.vs, ok);
				if (a.kv_pos && lane < 16)
					cp_async4(sP + st * DEC_BN + r, ok ? a.kv_pos + j0 + r : a.kv_pos, ok);
			}
			return;
		} else
#pragma unroll 4
		for (int c = tid; c < DEC_BN * C::CH; c += C::THREADS) {
			const int r = c / C::CH, cc = c % C::CH;
			const bool ok = j0 + r < ke;
			const size_t off = (size_t)(j0 + r) * HD + cc * 8;

			cp_async16(dk + r * C::LD + cc * 8, ok ? kh + off : a.k, ok);
			cp_async16(dv + r * C::LD + cc * 8, ok ? vh + off : a.v, ok);
		}
		if (a.kv_pos)
			for (int r = tid; r < DEC_BN; r += C::THREADS)
				cp_async4(sP + st * DEC_BN + r, j0 + r < ke ? a.kv_pos + j0 + r : a.kv_pos,
					  j0 + r < ke);
	};
#pragma unroll
	for (int s = 0; s < DEC_STAGES - 1; s++) {
		if (s < n_tiles)
			load_stage(s, s);
		cp_async_commit();	/* possibly empty: keeps the group count uniform */
	}

	/* ldmatrix lane addresses of this warp's 16 keys in stage 0 (see
	 * flash_kernel: K as the B of Q K^T, V transposed as the B of P V). */
	const int mi = lane >> 3, rr8 = lane & 7;
	const uint32_t kvA = (uint32_t)__cvta_generic_to_shared(sKV) + warp * 16 * C::LD * 2;
	const uint32_t kA = kvA + (((mi >> 1) * 8 + rr8) * C::LD + (mi & 1) * 8) * 2;
	const uint32_t vA = kvA + DEC_BN * C::LD * 2 + (((mi & 1) * 8 + rr8) * C::LD + (mi >> 1) * 8) * 2;

	float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
	float o[HD / 8][4];
	uint32_t qf[HD / 16][4];
	/* fp8 with a.f16k: the block's Q K^T on the f16 MMA, decided once Q
	 * has landed (every Q value exact in f16; else the bf16 path). */
	bool kh16 = false;

#pragma unroll
	for (int dt = 0; dt < HD / 8; dt++)
		o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

	for (int i = 0; i < n_tiles; i++) {
		const int st = i % DEC_STAGES, j0 = ks + i * DEC_BN;
		const uint32_t soff = F8 ? 0u : (uint32_t)(st * C::STAGE_BYTES);

		cp_async_wait<DEC_STAGES - 2>();	/* stage i (and Q) have landed */
		/* ... for every thread; stage i - 1 is free. fp8: a warp's own
		 * keys, so its own lanes (the block once, for Q). */
		if (!F8 || i == 0)
			__syncthreads();
		else
			__syncwarp();
		if (i + DEC_STAGES - 1 < n_tiles)
			load_stage(i + DEC_STAGES - 1, (i + DEC_STAGES - 1) % DEC_STAGES);
		cp_async_commit();
		if (F8 && i == 0 && a.f16k) {
			/* Q (landed, the block barrier above) converts to f16
			 * exactly when every value is in f16's range and its
			 * bits fit: then the f16 products are the bf16 ones. */
			int exact = 1;

			for (int c = tid; c < 16 * HD; c += C::THREADS) {
				const float x = __bfloat162float(
					__ushort_as_bfloat16(sQ[(c / HD) * C::LD + c % HD]));

				exact &= __half2float(__float2half_rn(x)) == x;
			}
			kh16 = __syncthreads_and(exact);
		}
		if (F8) {
			/* Stage i's bytes of the warp's 16 keys into its rows of the
			 * tile as bf16, unscaled (exact: e4m3x4_bf16), 8 values a
			 * lane and round; the rows' scales are applied to the scores
			 * and to P below (the warp last read these rows before the
			 * barrier above; its ring slot is refilled only after the
			 * next). */
			const unsigned char *rk = sRaw + (size_t)st * C::RAW_STAGE, *rv = rk + DEC_BN * HD;

#pragma unroll 4
			for (int c = lane; c < 2 * 16 * (HD / 8); c += 32) {
				const int isv = c >= 16 * (HD / 8), cc = c % (16 * (HD / 8));
				const int r = warp * 16 + cc / (HD / 8), c8 = cc % (HD / 8);
				const uint2 u = *(const uint2 *)((isv ? rv : rk) + r * HD + c8 * 8);
				uint4 o;

				if (!isv && kh16) {
					/* K as f16 (NaN scores either way) */
					e4m3x4_f16(u.x, &o.x, &o.y);
					e4m3x4_f16(u.y, &o.z, &o.w);
				} else if (a.fp8_int ? !e4m3x4_bf16_int(u.x, &o.x, &o.y) ||
							 !e4m3x4_bf16_int(u.y, &o.z, &o.w)
						    : !e4m3x4_bf16(u.x, &o.x, &o.y) ||
							 !e4m3x4_bf16(u.y, &o.z, &o.w)) {
					const uint32_t w[2] = { u.x, u.y };	/* a NaN code: the twin's bits */
					uint16_t h[8];

#pragma unroll
					for (int j = 0; j < 8; j++) {
						const uint8_t q = (uint8_t)(w[j / 4] >> (8 * (j % 4)));

						h[j] = e4m3_bf16(q, e4m3_to_f32(q), 1.0f);
					}
					o = make_uint4(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16,
						       h[4] | (uint32_t)h[5] << 16, h[6] | (uint32_t)h[7] << 16);
				}
				*(uint4 *)(sKV + (size_t)isv * DEC_BN * C::LD + r * C::LD + c8 * 8) = o;
			}
			__syncwarp();
		}
		if (i == 0) {
#pragma unroll
			for (int kk = 0; kk < HD / 16; kk++) {
				const uint16_t *b = sQ + gq * C::LD + kk * 16 + 2 * t4;

				qf[kk][0] = *(const uint32_t *)b;
				qf[kk][1] = *(const uint32_t *)(b + 8 * C::LD);
				qf[kk][2] = *(const uint32_t *)(b + 8);
				qf[kk][3] = *(const uint32_t *)(b + 8 * C::LD + 8);
				if (kh16)
#pragma unroll
					for (int e = 0; e < 4; e++) {
						const float2 x = __bfloat1622float2(
							*(const __nv_bfloat162 *)&qf[kk][e]);
						const __half2 h = __floats2half2_rn(x.x, x.y);

						qf[kk][e] = *(const uint32_t *)&h;
					}
			}
		}

		/* S = Q K^T: 16 rows x the warp's 16 keys. */
		float s[2][4];
#pragma unroll
		for (int nt = 0; nt < 2; nt++)
			s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
		for (int kk = 0; kk < HD / 16; kk++) {
			uint32_t b[4];

			ldsm_x4_u(b, kA + soff + kk * 16 * 2);
			if (F8 && kh16) {
				mma16816_h(s[0], qf[kk], b[0], b[1]);
				mma16816_h(s[1], qf[kk], b[2], b[3]);
			} else {
				mma16816(s[0], qf[kk], b[0], b[1]);
				mma16816(s[1], qf[kk], b[2], b[3]);
			}
		}

		/* fp8: this stage's row scales (K's on the scores, V's on P): a
		 * power of two each, so Q (K8 s)^T = (Q K8^T) s and bf16(p s) V8 =
		 * bf16(p) (V8 s), the bits of the tile dequantised with them. */
		const float *rks = (const float *)(sRaw + (size_t)st * C::RAW_STAGE + 2 * DEC_BN * HD);
		const float *rvs = rks + DEC_BN;

		/* Scale (log2 units) and mask. */
		const bool full = !a.kv_pos && j0 + DEC_BN <= ke && j0 + DEC_BN - 1 <= qmin;
#pragma unroll
		for (int nt = 0; nt < 2; nt++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				const float kscale = F8 ? rks[warp * 16 + nt * 8 + 2 * t4 + e] : 1.0f;
				float x_lo = (F8 ? s[nt][e] * kscale : s[nt][e]) * a.scale_log2;
				float x_hi = (F8 ? s[nt][2 + e] * kscale : s[nt][2 + e]) * a.scale_log2;

				if (!full) {
					const int jl = warp * 16 + nt * 8 + 2 * t4 + e, j = j0 + jl;
					const int kp = a.kv_pos ? sP[st * DEC_BN + jl] : j;
					const bool ok = j < ke;

					if (!ok || kp > qp_lo)
						x_lo = -INFINITY;
					if (!ok || kp > qp_hi)
						x_hi = -INFINITY;
				}
				s[nt][e] = x_lo;
				s[nt][2 + e] = x_hi;
			}

		/* Online softmax: rows gq (lo) and gq + 8 (hi); a quad shares a row. */
		{
			float mx_lo = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
			float mx_hi = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));

			mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
			mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
			mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
			mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
			const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
			/* A row that has seen nothing yet subtracts 0: every p is 0. */
			const float b_lo = mn_lo == -INFINITY ? 0.0f : mn_lo;
			const float b_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;
			const float al_lo = exp2f(m_lo - b_lo), al_hi = exp2f(m_hi - b_hi);
			float rs_lo = 0.0f, rs_hi = 0.0f;

#pragma unroll
			for (int nt = 0; nt < 2; nt++) {
				s[nt][0] = exp2f(s[nt][0] - b_lo);
				s[nt][1] = exp2f(s[nt][1] - b_lo);
				s[nt][2] = exp2f(s[nt][2] - b_hi);
				s[nt][3] = exp2f(s[nt][3] - b_hi);
				rs_lo += s[nt][0] + s[nt][1];
				rs_hi += s[nt][2] + s[nt][3];
			}
			l_lo = l_lo * al_lo + rs_lo;
			l_hi = l_hi * al_hi + rs_hi;
			m_lo = mn_lo;
			m_hi = mn_hi;
#pragma unroll
			for (int dt = 0; dt < HD / 8; dt++) {
				o[dt][0] *= al_lo;
				o[dt][1] *= al_lo;
				o[dt][2] *= al_hi;
				o[dt][3] *= al_hi;
			}
		}

		/* O += P V over the warp's 16 keys: P from the S registers, V by
		 * ldmatrix.trans. */
		{
			uint32_t pa[4];

			if (F8)
#pragma unroll
				for (int nt = 0; nt < 2; nt++)
#pragma unroll
					for (int e = 0; e < 2; e++) {
						const float vscale = rvs[warp * 16 + nt * 8 + 2 * t4 + e];

						s[nt][e] *= vscale;
						s[nt][2 + e] *= vscale;
					}
			pa[0] = pack_bf2(s[0][0], s[0][1]);
			pa[1] = pack_bf2(s[0][2], s[0][3]);
			pa[2] = pack_bf2(s[1][0], s[1][1]);
			pa[3] = pack_bf2(s[1][2], s[1][3]);
#pragma unroll
			for (int dp = 0; dp < HD / 16; dp++) {
				uint32_t b[4];

				ldsm_x4_tu(b, vA + soff + dp * 16 * 2);
				mma16816(o[2 * dp], pa, b[0], b[1]);
				mma16816(o[2 * dp + 1], pa, b[2], b[3]);
			}
		}
	}
	cp_async_wait<0>();
	__syncthreads();	/* the stages become the merge area */

	float *mo = (float *)(smem_raw + C::Q_BYTES);	/* [WARPS][16][HD] */
	float *mm = mo + DEC_WARPS * 16 * HD;	/* [WARPS][16] */
	float *ml = mm + DEC_WARPS * 16;	/* [WARPS][16] */

	l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
	l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
	l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
	l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
#pragma unroll
	for (int dt = 0; dt < HD / 8; dt++) {
		*(float2 *)(mo + (warp * 16 + r_lo) * HD + dt * 8 + 2 * t4) = make_float2(o[dt][0], o[dt][1]);
		*(float2 *)(mo + (warp * 16 + r_hi) * HD + dt * 8 + 2 * t4) = make_float2(o[dt][2], o[dt][3]);
	}
	if (t4 == 0) {
		mm[warp * 16 + r_lo] = m_lo;
		mm[warp * 16 + r_hi] = m_hi;
		ml[warp * 16 + r_lo] = l_lo;
		ml[warp * 16 + r_hi] = l_hi;
	}
	__syncthreads();
	dec_finish<HD>(a, kvh, split, splits, mo);
}

template <int HD>
__global__ void __launch_bounds__(32 * DEC_WARPS, 2) dec_kernel(const dec_args a)
{
	dec_body<HD>(a, blockIdx.y, blockIdx.x);
}

template <int HD>
__global__ void __launch_bounds__(32 * DEC_WARPS, 2) dec8_kernel(const dec_args a)
{
	dec_body<HD, 1>(a, blockIdx.y, blockIdx.x);
}

/* The batched form (kvmem_cuda_att_dec_batch; dec_seq in attention_dec.cuh). */
template <int HD>
__global__ void __launch_bounds__(32 * DEC_WARPS, 2) dec_batch_kernel(const dec_args base,
								      const dec_seq *seqs)
{
	const dec_args a = dec_seq_args(base, seqs[blockIdx.z]);

	dec_body<HD>(a, blockIdx.y, blockIdx.x);
}

/* Raise the kernel's dynamic shared memory limit, once per device. Done
 * for every configuration when a context is made (kvmem_cuda_attention_
 * setup), so that no launch inside a stream capture has to. */
template <int HD, int WM, int BN, int MT, int F8 = 0> static int flash_attr(kvmem_cuda_ctx *c)
{
	typedef flash_cfg<HD, WM, BN, MT> C;
	static int attr_set[64];

	if (c->device < 64 && attr_set[c->device])
		return 0;
	if (int rc = kvmem_cuda_err(cudaFuncSetAttribute(flash_kernel<HD, WM, BN, MT, F8>,
							 cudaFuncAttributeMaxDynamicSharedMemorySize,
							 (int)(F8 ? C::SMEM8 : C::SMEM)),
				    "attention: shared memory"))
		return rc;
	if (c->device < 64)
		attr_set[c->device] = 1;
	return 0;
}

/* (attention_dec.cuh) Two blocks of 107 KB an SM at head_dim 128 for v5. */
int kvmem_cuda_dec_smem(const void *kernel, int bytes, const char *what)
{
	if (int rc = kvmem_cuda_err(cudaFuncSetAttribute(kernel,
							 cudaFuncAttributeMaxDynamicSharedMemorySize,
							 bytes), what))
		return rc;
	return kvmem_cuda_err(cudaFuncSetAttribute(kernel,
						   cudaFuncAttributePreferredSharedMemoryCarveout,
						   (int)cudaSharedmemCarveoutMaxShared), what);
}

/* The same for the decode kernels (v5: bf16, batched, fp8's tile form
 * here and its register form in attention_fp8.cu), once per device. */
template <int HD> static int dec_attr(kvmem_cuda_ctx *c)
{
	static int attr_set[64];
	int rc;

	if (c->device < 64 && attr_set[c->device])
		return 0;
	if ((rc = kvmem_cuda_dec_smem((const void *)dec_kernel<HD>, (int)dec_cfg<HD>::SMEM,
				      "attention v5: shared memory")) ||
	    (rc = kvmem_cuda_dec_smem((const void *)dec_batch_kernel<HD>, (int)dec_cfg<HD>::SMEM,
				      "attention v5, batched: shared memory")) ||
	    (rc = kvmem_cuda_dec_smem((const void *)dec8_kernel<HD>, (int)dec_cfg<HD>::SMEM8,
				      "attention v5 (fp8): shared memory")) ||
	    (rc = kvmem_cuda_dec8r_attr(HD)))
		return rc;
	if (c->device < 64)
		attr_set[c->device] = 1;
	return 0;
}

/* Version 6 (attention_wgmma.cu, sm_90a): 0 done or -errno; 1 when the
 * device or the shape is not its own (the caller runs v4). Its setup is
 * called with the others'. */
extern "C" int kvmem_cuda_attention_v6(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
				       const int32_t *q_pos, int n_q, const uint16_t *k,
				       const uint16_t *v, const int32_t *kv_pos, int n_kv,
				       size_t kv_stride, int n_heads, int n_kv_heads, int head_dim,
				       float scale);
extern "C" int kvmem_cuda_attention_v6_setup(kvmem_cuda_ctx *c);
extern "C" int kvmem_cuda_attention_v6_fills(const kvmem_cuda_ctx *c, int n_q, int n_heads,
					     int n_kv_heads);
extern "C" int kvmem_cuda_attention_v6_takes(const kvmem_cuda_ctx *c, int head_dim);

/* Also the decode kernel's per-KV-head counters (zero; each launch leaves
 * them zero), the context's own: two contexts' streams never share them. */
extern "C" int kvmem_cuda_attention_setup(kvmem_cuda_ctx *c)
{
	int rc;

	if ((rc = flash_attr<128, 1, 32, 1>(c)) || (rc = flash_attr<128, 1, 64, 1>(c)) ||
	    (rc = flash_attr<128, 4, 64, 1>(c)) || (rc = flash_attr<128, 8, 64, 1>(c)) ||
	    (rc = flash_attr<128, 4, 64, 2>(c)) || (rc = flash_attr<64, 1, 32, 1>(c)) ||
	    (rc = flash_attr<64, 1, 64, 1>(c)) || (rc = flash_attr<64, 4, 64, 1>(c)) ||
	    (rc = flash_attr<64, 8, 64, 1>(c)) || (rc = flash_attr<64, 4, 64, 2>(c)) ||
	    (rc = flash_attr<128, 4, 64, 2, 1>(c)) || (rc = flash_attr<64, 4, 64, 2, 1>(c)) ||
	    (rc = dec_attr<128>(c)) || (rc = dec_attr<64>(c)) ||
	    (rc = kvmem_cuda_attention_v6_setup(c)))
		return rc;
	if (!c->att_cnt) {
		void *p = NULL;

		if ((rc = kvmem_cuda_err(cudaMalloc(&p, DEC_CNT * sizeof(unsigned)),
					 "attention v5: counters")))
			return rc;
		c->att_cnt = (unsigned *)p;	/* freed with the context */
		if ((rc = kvmem_cuda_err(cudaMemsetAsync(p, 0, DEC_CNT * sizeof(unsigned), c->stream),
					 "attention v5: counters")))
			return rc;
	}
	return 0;
}

/*
 * The same combine, a warp a row (COMBINE_WARPS rows a block): the block
 * form above gives each of the R x KV-head rows a block of 4 head_dim
 * threads, most of them idle at a prefill chunk's 2-4 splits, and ncu put
 * it at 1.5 ms of a 256-token chunk's 10.4 ms at the 8B geometry, twice
 * the attention it finishes (issue #26: a short prompt's first token).
 * Here each lane keeps head_dim / 32 of the row's outputs and does for
 * each of them what the block's threads do, in the same orders: M the
 * largest running max; L summed over lane s % 32 then the same shuffle
 * tree; an output's four partial sums over splits s = g, g + 4, g + 8, ...
 * in order, then (acc0 + acc1) + (acc2 + acc3). So the bits are the block
 * form's (kvmem_gpu_check --attn-prefill compares them, "combine_block").
 */
#define COMBINE_WARPS 8

template <int HD>
__global__ void __launch_bounds__(32 * COMBINE_WARPS)
combine_rows_kernel(uint16_t *out, const float *po, const float *pm, const float *pl,
		    const int *n_kv_dev, int n_kv, int bn, int target, int splits, int R,
		    int n_kv_heads, int n_heads, int G)
{
	constexpr int PER = HD / 32;	/* outputs a lane */
	const int lane = threadIdx.x & 31;
	const long long row = (long long)blockIdx.x * COMBINE_WARPS + (threadIdx.x >> 5);
	float w[COMBINE_MAX / 32], L, inv;

	if (row >= (long long)R * n_kv_heads)
		return;
	const int r = (int)(row % R), kvh = (int)(row / R);

	if (target) {
		int kps;

		decode_split(n_kv_dev ? min(*n_kv_dev, n_kv) : n_kv, bn, target, 1, &kps, &splits);
	}
	L = combine_weights(pm, pl, splits, n_kv_heads, kvh, R, r, lane, w);
	inv = L > 0.0f ? 1.0f / L : 0.0f;	/* every lane holds the same L */

	float acc[4][PER];

#pragma unroll
	for (int g = 0; g < 4; g++)
#pragma unroll
		for (int e = 0; e < PER; e++)
			acc[g][e] = 0.0f;
	for (int s = 0; s < splits; s++) {
		/* split s's weight, from lane s % 32's register s / 32 */
		float ws = 0.0f;

#pragma unroll
		for (int i = 0; i < COMBINE_MAX / 32; i++) {
			const float x = __shfl_sync(0xffffffffu, w[i], s & 31);

			if (i == (s >> 5))
				ws = x;
		}
		const float *src = po + (((size_t)s * n_kv_heads + kvh) * R + r) * HD + lane * PER;
#pragma unroll
		for (int e = 0; e < PER; e++)
			acc[s & 3][e] = __fadd_rn(acc[s & 3][e], __fmul_rn(ws, src[e]));
	}
#pragma unroll
	for (int e = 0; e < PER; e++) {
		const float sum = __fadd_rn(__fadd_rn(acc[0][e], acc[1][e]),
					    __fadd_rn(acc[2][e], acc[3][e]));

		out[((size_t)(r / G) * n_heads + kvh * G + r % G) * HD + lane * PER + e] =
			f2bf(__fmul_rn(sum, inv));
	}
}

template <int HD, int WM, int BN, int MT, int F8 = 0>
static int flash_launch(kvmem_cuda_ctx *c, const flash_args &a, int grid_z, int splits)
{
	typedef flash_cfg<HD, WM, BN, MT> C;
	const int R = a.n_q * a.group, mt = (R + C::ROWS - 1) / C::ROWS;
	int rc;

	if ((rc = flash_attr<HD, WM, BN, MT, F8>(c)))
		return rc;
	flash_kernel<HD, WM, BN, MT, F8><<<dim3(mt, a.n_kv_heads, grid_z), C::THREADS,
					   F8 ? C::SMEM8 : C::SMEM, c->stream>>>(a);
	if ((rc = kvmem_cuda_launched("attention")))
		return rc;
	if (a.part_o && c->combine_block) {
		combine_kernel<HD><<<dim3(R, a.n_kv_heads), 4 * HD, 0, c->stream>>>(
			a.out, a.part_o, a.part_m, a.part_l, a.n_kv_dev, a.n_kv, BN, a.split_target,
			splits, R, a.n_kv_heads, a.n_heads, a.group);
		return kvmem_cuda_launched("attention: combining splits");
	}
	if (a.part_o) {
		const long long rows = (long long)R * a.n_kv_heads;

		combine_rows_kernel<HD><<<(unsigned)((rows + COMBINE_WARPS - 1) / COMBINE_WARPS),
					  32 * COMBINE_WARPS, 0, c->stream>>>(
			a.out, a.part_o, a.part_m, a.part_l, a.n_kv_dev, a.n_kv, BN, a.split_target,
			splits, R, a.n_kv_heads, a.n_heads, a.group);
		return kvmem_cuda_launched("attention: combining splits");
	}
	return 0;
}

/*
 * Tile shapes per version: v2 64-row tiles (4 warps) for prefill, 16 rows
 * (1 warp) for decode, 64-key tiles; v3 128-row tiles (8 warps: each K/V
 * tile serves twice the rows, half the L2 traffic) and, for decode, 32-key
 * tiles (half the shared memory: more blocks per multiprocessor); v4
 * 128-row prefill tiles of 4 warps with two m-tiles each (decode as v2).
 * `per_sm` sets the split-K target for prefill chunks (as measured for v2
 * and v3) and the decode split target. v4 targets two blocks an SM, what
 * its 255 registers let reside, and no more (splits rounded down): with
 * one (as v3, until 2026-12-04) a warm step's question (32 tokens x 4
 * heads = one row tile a KV head, 8 KV heads) ran 136 blocks of 4 warps,
 * ncu saw 6% occupancy and 26% of the issue slots busy; with 33 splits
 * it ran 1.37x faster (Documentation/benchmarks.md, "Prefill attention
 * over fp8").
 *
 * Decode (rows <= 16) always splits the keys by decode_split() with a
 * target of enough blocks to fill the GPU (from the SM count and the KV
 * heads: never from the key count or the view's capacity) and always
 * combines, with the key count from the host or, for a CUDA graph, from
 * device memory (n_kv_dev; the grid then has `target` splits and the ones
 * past the key count return at once). Both give the same bits.
 */
/* The decode split target: enough one-warp blocks (one 16-row tile per KV
 * head) to fill the GPU, blocks per SM by tile size (shared memory). */
static int decode_target(const kvmem_cuda_ctx *c, int bn, int n_kv_heads)
{
	const long long want = (long long)c->sms * (bn == 32 ? 5 : 3);
	long long t = (want + n_kv_heads - 1) / n_kv_heads;

	return (int)(t < 1 ? 1 : (t > COMBINE_MAX ? COMBINE_MAX : t));
}

static int flash(kvmem_cuda_ctx *c, flash_args a, int head_dim, int version, const int *n_kv_dev)
{
	const int R = a.n_q * a.group, few = R <= 16;
	const int wm = few ? 1 : (version == 3 ? 8 : 4), bn = few && version == 3 ? 32 : 64;
	const int mtw = !few && version == 4 ? 2 : 1;	/* m-tiles per warp */
	const int rows = 16 * wm * mtw;
	const int per_sm = few ? (bn == 32 ? 5 : 3) : (wm == 8 ? 1 : 2);
	const long long blocks0 = (long long)((R + rows - 1) / rows) * a.n_kv_heads;
	const int tiles = (a.n_kv + bn - 1) / bn;
	const long long target = (long long)c->sms * per_sm;
	int splits = 1, grid_z, alloc;

	a.n_kv_dev = n_kv_dev;
	a.split_target = 0;
	if (few) {
		a.split_target = decode_target(c, bn, a.n_kv_heads);
		decode_split(a.n_kv, bn, a.split_target, 1, &a.keys_per_split, &splits);
		grid_z = n_kv_dev ? a.split_target : (splits > 0 ? splits : 1);
		alloc = a.split_target;
	} else {
		if (blocks0 < target && tiles > 1) {
			/* v4: the splits one wave of two blocks an SM holds (one
			 * more starts a second wave: 512 tokens at 8 KV heads, 128
			 * row tiles, ran 1.33x slower in 3 splits than in 2) */
			long long want = mtw == 2 ? target / blocks0 : (target + blocks0 - 1) / blocks0;
			int most = tiles / 2 > 1 ? tiles / 2 : 1;	/* >= 2 tiles per split */

			splits = (int)(want < most ? want : most);
			if (splits > COMBINE_MAX)
				splits = COMBINE_MAX;
		}
		if (splits > 1) {
			int per = (tiles + splits - 1) / splits;

			splits = (tiles + per - 1) / per;
			a.keys_per_split = per * bn;
		} else {
			a.keys_per_split = tiles * bn > 0 ? tiles * bn : bn;
		}
		grid_z = alloc = splits;
	}
	if (few || splits > 1) {
		size_t rows_all = (size_t)alloc * a.n_kv_heads * R, bytes;
		void *p;

		bytes = rows_all * head_dim * sizeof(float) + 2 * kvmem_align_up(rows_all * sizeof(float), 256);
		if (kvmem_cuda_scratch(c, bytes, &p))
			return kvmem_error_prefix("attention");
		a.part_o = (float *)p;
		a.part_m = (float *)((char *)p + rows_all * head_dim * sizeof(float));
		a.part_l = (float *)((char *)a.part_m + kvmem_align_up(rows_all * sizeof(float), 256));
	} else {
		a.part_o = a.part_m = a.part_l = NULL;
	}
	if (a.ks)	/* fp8 (kvmem_cuda_attention_fp8): v4's tiles only */
		return head_dim == 128 ? flash_launch<128, 4, 64, 2, 1>(c, a, grid_z, splits)
				       : flash_launch<64, 4, 64, 2, 1>(c, a, grid_z, splits);
	if (head_dim == 128) {
		if (wm == 1)
			return bn == 32 ? flash_launch<128, 1, 32, 1>(c, a, grid_z, splits)
					: flash_launch<128, 1, 64, 1>(c, a, grid_z, splits);
		if (mtw == 2)
			return flash_launch<128, 4, 64, 2>(c, a, grid_z, splits);
		return wm == 8 ? flash_launch<128, 8, 64, 1>(c, a, grid_z, splits)
			       : flash_launch<128, 4, 64, 1>(c, a, grid_z, splits);
	}
	if (wm == 1)
		return bn == 32 ? flash_launch<64, 1, 32, 1>(c, a, grid_z, splits)
				: flash_launch<64, 1, 64, 1>(c, a, grid_z, splits);
	if (mtw == 2)
		return flash_launch<64, 4, 64, 2>(c, a, grid_z, splits);
	return wm == 8 ? flash_launch<64, 8, 64, 1>(c, a, grid_z, splits)
		       : flash_launch<64, 4, 64, 1>(c, a, grid_z, splits);
}

/* The split's least stages: KVMEM_CUDA_DEC_MIN_TILES, else DEC_MIN_TILES. */
static int dec_min_tiles(const kvmem_cuda_ctx *c)
{
	return c->dec_min_tiles > 0 ? c->dec_min_tiles : DEC_MIN_TILES;
}

/* A decode kernel's split target: `blocks` blocks per SM over the KV
 * heads, at most COMBINE_MAX. */
static int sm_target(const kvmem_cuda_ctx *c, int blocks, int n_kv_heads)
{
	const long long want = (long long)c->sms * blocks;
	long long t = (want + n_kv_heads - 1) / n_kv_heads;

	return (int)(t < 1 ? 1 : (t > COMBINE_MAX ? COMBINE_MAX : t));
}

/* v5's: two blocks per SM. */
static int dec_target(const kvmem_cuda_ctx *c, int n_kv_heads)
{
	return sm_target(c, 2, n_kv_heads);
}

/* Whether v5 reads fp8 K/V of `rows` rows a KV head (queries x group) in
 * the register form (attention_fp8.cu): on (fp8_reg) and up to 8 rows;
 * else the tile form. The lone decode's rule, and so the batched one's. */
static bool dec8r_takes(const kvmem_cuda_ctx *c, int rows)
{
	return c->fp8_reg && rows <= 8;
}

/* The register form's over fp8 (attention_fp8.cu): fp8_reg_blocks, 2 or 3
 * (ctx.cu keeps it so; 2 by default: then v5's). */
static int dec8r_target(const kvmem_cuda_ctx *c, int n_kv_heads)
{
	return sm_target(c, c->fp8_reg_blocks, n_kv_heads);
}

/*
 * Version 5 (decode shapes only): the keys split by decode_split() at the
 * target above, one launch, the combine in the last block of each KV head.
 * With n_kv_dev (a CUDA graph) the grid has `target` splits and those past
 * the key count return at once; without it, the splits the key count
 * needs. Scratch: the partials of `target` splits.
 */
static int decode5(kvmem_cuda_ctx *c, const flash_args &f, int head_dim, const int *n_kv_dev,
		   const float *ks = NULL, const float *vs = NULL)
{
	const int R = f.n_q * f.group;
	dec_args a;
	int kps, splits, grid, rc;
	size_t rows_all, bytes;
	void *p;

	if (f.n_kv_heads > DEC_CNT)
		return kvmem_error(ENOTSUP, "attention v5: %d KV heads (at most %d)", f.n_kv_heads,
				   DEC_CNT);
	if (!c->att_cnt)
		return kvmem_error(EINVAL, "attention v5: the context has no counters");
	memset(&a, 0, sizeof(a));
	a.out = f.out;
	a.q = f.q;
	a.k = f.k;
	a.v = f.v;
	a.ks = ks;	/* set: fp8 K/V (dec8_kernel) */
	a.vs = vs;
	a.f16k = ks && c->fp8_f16k;
	a.fp8_int = ks && c->fp8_int;
	a.q_pos = f.q_pos;
	a.kv_pos = f.kv_pos;
	a.n_kv_dev = n_kv_dev;
	a.n_q = f.n_q;
	a.n_kv = f.n_kv;
	a.n_heads = f.n_heads;
	a.n_kv_heads = f.n_kv_heads;
	a.group = f.group;
	a.kv_stride = f.kv_stride;
	a.scale_log2 = f.scale_log2;
	a.cnt = c->att_cnt;
	a.target = dec_target(c, f.n_kv_heads);
	/* fp8 in registers (up to 8 rows): its own blocks per SM, the target */
	const bool reg = ks && dec8r_takes(c, R);

	if (reg)
		a.target = dec8r_target(c, f.n_kv_heads);
	a.min_tiles = dec_min_tiles(c);
	decode_split(f.n_kv, DEC_BN, a.target, a.min_tiles, &kps, &splits);
	grid = n_kv_dev ? a.target : (splits > 0 ? splits : 1);
	rows_all = (size_t)a.target * f.n_kv_heads * R;
	bytes = rows_all * head_dim * sizeof(float) + 2 * kvmem_align_up(rows_all * sizeof(float), 256);
	if (kvmem_cuda_scratch(c, bytes, &p))
		return kvmem_error_prefix("attention v5");
	a.part_o = (float *)p;
	a.part_m = (float *)((char *)p + rows_all * head_dim * sizeof(float));
	a.part_l = (float *)((char *)a.part_m + kvmem_align_up(rows_all * sizeof(float), 256));
	if (reg) {
		if ((rc = head_dim == 128 ? dec_attr<128>(c) : dec_attr<64>(c)))
			return rc;
		kvmem_cuda_dec8r_launch(c, a, grid, head_dim, c->fp8_reg_blocks);
	} else if (ks && head_dim == 128) {
		if ((rc = dec_attr<128>(c)))
			return rc;
		dec8_kernel<128><<<dim3(grid, f.n_kv_heads), dec_cfg<128>::THREADS, dec_cfg<128>::SMEM8,
				   c->stream>>>(a);
	} else if (ks) {
		if ((rc = dec_attr<64>(c)))
			return rc;
		dec8_kernel<64><<<dim3(grid, f.n_kv_heads), dec_cfg<64>::THREADS, dec_cfg<64>::SMEM8,
				  c->stream>>>(a);
	} else if (head_dim == 128) {
		if ((rc = dec_attr<128>(c)))
			return rc;
		dec_kernel<128><<<dim3(grid, f.n_kv_heads), dec_cfg<128>::THREADS, dec_cfg<128>::SMEM,
				  c->stream>>>(a);
	} else {
		if ((rc = dec_attr<64>(c)))
			return rc;
		dec_kernel<64><<<dim3(grid, f.n_kv_heads), dec_cfg<64>::THREADS, dec_cfg<64>::SMEM,
				 c->stream>>>(a);
	}
	return kvmem_cuda_launched("attention v5");
}

/*
 * Version 5 over many sequences in one launch (attention_batch.cu calls it
 * for the sequences whose rows n_q * group fit one 16-row tile; the cuda
 * backend's batched forward over fp8 views calls it directly): grid (most
 * splits, KV heads, sequences), each sequence split as decode5 splits it
 * alone (decode_split at its target: its own key count and the SM count,
 * never the batch), with its own partials and counters; so each gets
 * decode5's bits. fp8 sequences (k_scale set: all or none) take the
 * register form, as decode5 gives them (-ENOTSUP where it would not: the
 * form off, or more than 8 rows). Sequences go DEC_CNT / n_kv_heads to a
 * launch (the counters). seqs: host array; its device copy and the
 * partials take the context's scratch.
 */
extern "C" int kvmem_cuda_att_dec_batch(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
					const kvmem_cuda_att_seq *const *seqs, int n, int n_heads,
					int n_kv_heads, int head_dim, float scale)
{
	const int G = n_heads / n_kv_heads, per_launch = DEC_CNT / n_kv_heads;
	const bool fp8 = n > 0 && seqs[0]->k_scale;
	const int target = fp8 ? dec8r_target(c, n_kv_heads) : dec_target(c, n_kv_heads);
	dec_seq *h = NULL;
	dec_args base;
	int rc = 0;

	if (head_dim != 64 && head_dim != 128)
		return kvmem_error(ENOTSUP, "attention v5, batched: head_dim %d (64 or 128)", head_dim);
	if (n_kv_heads > DEC_CNT || !c->att_cnt)
		return kvmem_error(ENOTSUP, "attention v5, batched: %d KV heads or no counters",
				   n_kv_heads);
	for (int i = 0; i < n; i++) {
		if (!seqs[i]->k_scale != !fp8 || !seqs[i]->k_scale != !seqs[i]->v_scale)
			return kvmem_error(EINVAL, "attention v5, batched: sequence %d %s scales "
					   "(fp8 and bf16 views in one call)", i,
					   seqs[i]->k_scale ? "has" : "lacks");
		if (fp8 && !dec8r_takes(c, seqs[i]->n_q * G))
			return kvmem_error(ENOTSUP, "attention v5, batched: fp8 takes the register "
					   "form only (on: %d; rows %d, at most 8)", c->fp8_reg,
					   seqs[i]->n_q * G);
	}
	if ((rc = head_dim == 128 ? dec_attr<128>(c) : dec_attr<64>(c)))
		return rc;
	if (!(h = (dec_seq *)malloc(sizeof(*h) * (size_t)(n < per_launch ? n : per_launch))))
		return kvmem_error(ENOMEM, "attention v5, batched: %d sequences", n);
	memset(&base, 0, sizeof(base));
	base.n_heads = n_heads;
	base.n_kv_heads = n_kv_heads;
	base.group = G;
	base.target = target;
	base.min_tiles = dec_min_tiles(c);
	base.f16k = fp8 && c->fp8_f16k;	/* as decode5 sets them */
	base.fp8_int = fp8 && c->fp8_int;
	base.scale_log2 = scale * 1.4426950408889634f;
	for (int s0 = 0; s0 < n && !rc; s0 += per_launch) {
		const int m = n - s0 < per_launch ? n - s0 : per_launch;
		const size_t meta = kvmem_align_up(sizeof(*h) * (size_t)m, 256);
		size_t bytes = meta;
		int grid = 1;
		char *scr;

		for (int i = 0; i < m; i++) {
			const size_t rows = (size_t)target * n_kv_heads * seqs[s0 + i]->n_q * G;

			bytes += kvmem_align_up(rows * (head_dim + 2) * sizeof(float), 256);
		}
		if ((rc = kvmem_cuda_scratch(c, bytes, (void **)&scr)))
			break;
		bytes = meta;
		for (int i = 0; i < m; i++) {
			const kvmem_cuda_att_seq *x = seqs[s0 + i];
			const size_t rows = (size_t)target * n_kv_heads * x->n_q * G;
			int kps, splits;

			decode_split(x->n_kv, DEC_BN, target, base.min_tiles, &kps, &splits);
			grid = splits > grid ? splits : grid;
			h[i].out = out + (size_t)x->q0 * n_heads * head_dim;
			h[i].q = q + (size_t)x->q0 * n_heads * head_dim;
			h[i].k = x->k;
			h[i].v = x->v;
			h[i].ks = x->k_scale;
			h[i].vs = x->v_scale;
			h[i].q_pos = x->q_pos;
			h[i].kv_pos = x->kv_pos;
			h[i].n_q = x->n_q;
			h[i].n_kv = x->n_kv;
			h[i].kv_stride = x->kv_stride;
			h[i].part_o = (float *)(scr + bytes);
			h[i].part_m = h[i].part_o + rows * head_dim;
			h[i].part_l = h[i].part_m + rows;
			h[i].cnt = c->att_cnt + (size_t)i * n_kv_heads;
			bytes += kvmem_align_up(rows * (head_dim + 2) * sizeof(float), 256);
		}
		/* Pageable source: staged before the call returns; ordered on the
		 * stream after the work that used the scratch before. */
		if ((rc = kvmem_cuda_err(cudaMemcpyAsync(scr, h, sizeof(*h) * (size_t)m,
							 cudaMemcpyHostToDevice, c->stream),
					 "attention v5, batched: sequences")))
			break;
		if (fp8)
			kvmem_cuda_dec8r_batch_launch(c, base, (const dec_seq *)scr, grid, m, head_dim,
						      c->fp8_reg_blocks);
		else if (head_dim == 128)
			dec_batch_kernel<128><<<dim3(grid, n_kv_heads, m), dec_cfg<128>::THREADS,
						dec_cfg<128>::SMEM, c->stream>>>(base, (const dec_seq *)scr);
		else
			dec_batch_kernel<64><<<dim3(grid, n_kv_heads, m), dec_cfg<64>::THREADS,
					       dec_cfg<64>::SMEM, c->stream>>>(base, (const dec_seq *)scr);
		rc = kvmem_cuda_launched("attention v5, batched");
	}
	free(h);
	return rc;
}

/* The flash arguments after the shape checks (versions 2 and 3). */
static int flash_args_for(flash_args *a, int version, uint16_t *out, const uint16_t *q,
			  const int32_t *q_pos, int n_q, const uint16_t *k, const uint16_t *v,
			  const int32_t *kv_pos, int n_kv, size_t kv_stride, int n_heads,
			  int n_kv_heads, int head_dim, float scale)
{
	if (version < 2 || version > 5)
		return kvmem_error(EINVAL, "attention: no version %d (1 to 5)", version);
	if (head_dim != 64 && head_dim != 128)
		return kvmem_error(ENOTSUP, "attention: head_dim %d (the flash kernel takes 64 or 128)",
				   head_dim);
	memset(a, 0, sizeof(*a));
	a->out = out;
	a->q = q;
	a->k = k;
	a->v = v;
	a->q_pos = q_pos;
	a->kv_pos = kv_pos;
	a->n_q = n_q;
	a->n_kv = n_kv;
	a->n_heads = n_heads;
	a->n_kv_heads = n_kv_heads;
	a->group = n_heads / n_kv_heads;
	a->kv_stride = (long long)kv_stride;
	a->scale_log2 = scale * 1.4426950408889634f;
	return 0;
}

static int is_decode(int n_q, int n_heads, int n_kv_heads);

static int bad_shape(int n_q, int n_kv, size_t kv_stride, int n_heads, int n_kv_heads,
		     int head_dim)
{
	if (n_q < 0 || n_kv < 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads ||
	    head_dim <= 0 || kv_stride < (size_t)n_kv)
		return kvmem_error(EINVAL, "attention: bad shape (%d queries, %d keys of stride %zu, "
				   "%d/%d heads, head_dim %d)", n_q, n_kv, kv_stride, n_heads,
				   n_kv_heads, head_dim);
	return 0;
}

extern "C" int kvmem_cuda_attention_bf16_v(kvmem_cuda_ctx *c, int version, uint16_t *out,
					   const uint16_t *q, const int32_t *q_pos, int n_q,
					   const uint16_t *k, const uint16_t *v,
					   const int32_t *kv_pos, int n_kv, size_t kv_stride,
					   int n_heads, int n_kv_heads, int head_dim, float scale)
{
	flash_args a;
	int rc;

	if ((rc = bad_shape(n_q, n_kv, kv_stride, n_heads, n_kv_heads, head_dim)))
		return rc;
	if (!n_q)
		return 0;
	if (version == 1) {
		if (head_dim % 32 || head_dim > V1_MAX_HD)
			return kvmem_error(ENOTSUP, "attention v1: head_dim %d (multiples of 32 to %d)",
					   head_dim, V1_MAX_HD);
		attn_v1_kernel<<<dim3(n_q, n_heads), 32, 0, c->stream>>>(
			out, q, q_pos, k, v, kv_pos, n_kv, (long long)kv_stride, n_heads,
			n_heads / n_kv_heads, head_dim, scale);
		return kvmem_cuda_launched("attention v1");
	}
	if (version == 5 && !is_decode(n_q, n_heads, n_kv_heads))
		version = 4;	/* v5 is a decode kernel: other shapes as v4 */
	if (version == 6) {	/* wgmma prefill (attention_wgmma.cu); 1: not taken, v4 */
		rc = kvmem_cuda_attention_v6(c, out, q, q_pos, n_q, k, v, kv_pos, n_kv, kv_stride,
					     n_heads, n_kv_heads, head_dim, scale);
		if (rc <= 0)
			return rc;
		version = 4;
	}
	if ((rc = flash_args_for(&a, version, out, q, q_pos, n_q, k, v, kv_pos, n_kv, kv_stride,
				 n_heads, n_kv_heads, head_dim, scale)))
		return rc;
	if (version == 5)
		return decode5(c, a, head_dim, NULL);
	return flash(c, a, head_dim, version, NULL);
}

/*
 * The main path's versions. Decode (rows <= 16) takes one version whatever
 * the key count, so that a CUDA graph of a decode step (whose key count is
 * only known on the device) runs the very kernels of a plain call:
 * MAIN_DECODE. Prefill chunks take MAIN_PREFILL. KVMEM_CUDA_DECODE (2, 3,
 * 5) and KVMEM_CUDA_PREFILL (2, 3, 4, 6), read when a context is made, override
 * them for comparisons. Measured on the H200: Documentation/benchmarks.md,
 * "CUDA kernels". Decode v5 (one launch, combine folded in): a token's
 * attention over 36 layers 0.440 / 1.493 / 4.958 ms at 4K / 32K / 128K keys
 * against v2's 0.481 / 1.579 / 8.715 (tests/gpu/attn_decode.sh, H200).
 */
#define MAIN_DECODE 5
/* bench engine 32K prefill on the H200: v6 25.7k tok/s (75% of GEMM), v4
 * 18.0k (53%) in the same run; v2 12.2k (2026-11-30). v6 runs on sm_90
 * only, head_dim 128, when its row tiles fill the GPU: v4 otherwise
 * (kvmem_cuda_attention_bf16). */
#define MAIN_PREFILL 6

static int is_decode(int n_q, int n_heads, int n_kv_heads)
{
	return n_kv_heads > 0 && (long long)n_q * (n_heads / n_kv_heads) <= 16;
}

static int main_decode(const kvmem_cuda_ctx *c)
{
	return c->att_decode ? c->att_decode : MAIN_DECODE;
}

static int main_prefill(const kvmem_cuda_ctx *c)
{
	return c->att_prefill ? c->att_prefill : MAIN_PREFILL;
}

extern "C" int kvmem_cuda_attention_bf16(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
					 const int32_t *q_pos, int n_q, const uint16_t *k,
					 const uint16_t *v, const int32_t *kv_pos, int n_kv,
					 size_t kv_stride, int n_heads, int n_kv_heads, int head_dim,
					 float scale)
{
	int ver = is_decode(n_q, n_heads, n_kv_heads) ? main_decode(c) : main_prefill(c);

	if (ver == 6 && !kvmem_cuda_attention_v6_fills(c, n_q, n_heads, n_kv_heads))
		ver = 4;	/* short chunks: v4 splits the keys, v6 does not */

	return kvmem_cuda_attention_bf16_v(c, ver, out, q, q_pos, n_q, k, v, kv_pos, n_kv,
					   kv_stride, n_heads, n_kv_heads, head_dim, scale);
}

extern "C" size_t kvmem_cuda_attention_scratch(const kvmem_cuda_ctx *c, int n_q, int n_heads,
					     int n_kv_heads, int head_dim)
{
	size_t rows;

	if (!is_decode(n_q, n_heads, n_kv_heads) || head_dim <= 0)
		return 0;
	/* The most any decode version takes (v3's 32-key tiles split the most),
	 * so that a change of version (KVMEM_CUDA_DECODE, a check) needs no
	 * more than was reserved. */
	int t = decode_target(c, 32, n_kv_heads);

	if (decode_target(c, 64, n_kv_heads) > t)
		t = decode_target(c, 64, n_kv_heads);
	if (dec_target(c, n_kv_heads) > t)
		t = dec_target(c, n_kv_heads);
	if (dec8r_target(c, n_kv_heads) > t)	/* fp8 in registers at 3 blocks an SM */
		t = dec8r_target(c, n_kv_heads);
	rows = (size_t)t * n_kv_heads * n_q * (n_heads / n_kv_heads);
	return rows * head_dim * sizeof(float) + 2 * kvmem_align_up(rows * sizeof(float), 256);
}

extern "C" int kvmem_cuda_attention_decode_bf16(kvmem_cuda_ctx *c, int version, uint16_t *out,
						const uint16_t *q, const int32_t *q_pos, int n_q,
						const uint16_t *k, const uint16_t *v,
						const int32_t *n_kv_dev, int max_kv, size_t kv_stride,
						int n_heads, int n_kv_heads, int head_dim, float scale)
{
	flash_args a;
	int rc;

	if ((rc = bad_shape(n_q, max_kv, kv_stride, n_heads, n_kv_heads, head_dim)))
		return rc;
	if (!is_decode(n_q, n_heads, n_kv_heads) || !n_kv_dev)
		return kvmem_error(EINVAL, "attention decode: %d queries of %d heads per KV head "
				   "(at most 16 rows) and a device key count", n_q,
				   n_heads / n_kv_heads);
	if (!n_q)
		return 0;
	if (!version)
		version = main_decode(c);
	if ((rc = flash_args_for(&a, version, out, q, q_pos, n_q, k, v, NULL, max_kv, kv_stride,
				 n_heads, n_kv_heads, head_dim, scale)))
		return rc;
	if (version == 5)
		return decode5(c, a, head_dim, n_kv_dev);
	return flash(c, a, head_dim, version, n_kv_dev);
}

/* Decode over fp8 K/V (e4m3 rows, k_scale / v_scale per row, kv_stride
 * apart per KV head: an fp8 view's layer) by v5 (dec8_kernel): the bits of
 * kvmem_cuda_attention_decode_bf16 over the same rows dequantised to bf16.
 * -ENOTSUP when the main path's decode is not v5 (KVMEM_CUDA_DECODE): the
 * caller dequantises and takes the bf16 path. */
extern "C" int kvmem_cuda_attention_decode_fp8(kvmem_cuda_ctx *c, uint16_t *out,
					       const uint16_t *q, const int32_t *q_pos, int n_q,
					       const uint8_t *k, const uint8_t *v,
					       const float *k_scale, const float *v_scale,
					       const int32_t *n_kv_dev, int max_kv, size_t kv_stride,
					       int n_heads, int n_kv_heads, int head_dim, float scale)
{
	flash_args a;
	int rc;

	if ((rc = bad_shape(n_q, max_kv, kv_stride, n_heads, n_kv_heads, head_dim)))
		return rc;
	if (!is_decode(n_q, n_heads, n_kv_heads) || !n_kv_dev || !k_scale || !v_scale)
		return kvmem_error(EINVAL, "attention decode (fp8): %d queries of %d heads per KV "
				   "head (at most 16 rows), a device key count and the scales", n_q,
				   n_heads / n_kv_heads);
	if (main_decode(c) != 5)
		return kvmem_error(ENOTSUP, "attention decode (fp8): the main decode is v%d, not v5",
				   main_decode(c));
	if (!n_q)
		return 0;
	if ((rc = flash_args_for(&a, 5, out, q, q_pos, n_q, (const uint16_t *)k,
				 (const uint16_t *)v, NULL, max_kv, kv_stride, n_heads, n_kv_heads,
				 head_dim, scale)))
		return rc;
	return decode5(c, a, head_dim, n_kv_dev, k_scale, v_scale);
}

/* Prefill over fp8 K/V (an fp8 view's layer, as for decode above; slot =
 * position) by v4's flash kernel reading e4m3 tiles: the bits of
 * kvmem_cuda_attention_bf16_v(4) over the same rows dequantised to bf16.
 * Decode shapes (at most 16 rows a KV head, which the main path gives to
 * v5) run too, in v4's 128-row tiles with v4's decode splits: the fp8
 * views take them only where the bf16 scratch has no room. */
extern "C" int kvmem_cuda_attention_fp8(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
					const int32_t *q_pos, int n_q, const uint8_t *k,
					const uint8_t *v, const float *k_scale, const float *v_scale,
					int n_kv, size_t kv_stride, int n_heads, int n_kv_heads,
					int head_dim, float scale)
{
	flash_args a;
	int rc;

	if ((rc = bad_shape(n_q, n_kv, kv_stride, n_heads, n_kv_heads, head_dim)))
		return rc;
	if (!k_scale || !v_scale)
		return kvmem_error(EINVAL, "attention (fp8): no row scales");
	if (!n_q)
		return 0;
	if ((rc = flash_args_for(&a, 4, out, q, q_pos, n_q, (const uint16_t *)k,
				 (const uint16_t *)v, NULL, n_kv, kv_stride, n_heads, n_kv_heads,
				 head_dim, scale)))
		return rc;
	a.ks = k_scale;
	a.vs = v_scale;
	return flash(c, a, head_dim, 4, NULL);
}

/* 1 when the main path's prefill of this shape (kvmem_cuda_attention_bf16)
 * runs v4, whose bits kvmem_cuda_attention_fp8 gives over the rows
 * dequantised; 0 for another version (v6 where its rows fill the GPU, one
 * that KVMEM_CUDA_PREFILL names) and for decode shapes. */
extern "C" int kvmem_cuda_attention_fp8_same(const kvmem_cuda_ctx *c, int n_q, int n_heads,
					     int n_kv_heads, int head_dim)
{
	int ver;

	if (n_kv_heads <= 0 || n_heads % n_kv_heads || is_decode(n_q, n_heads, n_kv_heads) ||
	    (head_dim != 64 && head_dim != 128))
		return 0;
	ver = main_prefill(c);
	if (ver == 6 && (!kvmem_cuda_attention_v6_fills(c, n_q, n_heads, n_kv_heads) ||
			 !kvmem_cuda_attention_v6_takes(c, head_dim)))
		ver = 4;	/* kvmem_cuda_attention_bf16 and v6's own refusal */
	return ver == 4 || ver == 5;
}

/* Whether the main path's decode is v5 (the batched decode's bits are
 * then a lone call's). */
extern "C" int kvmem_cuda_att_decode_is_v5(const kvmem_cuda_ctx *c)
{
	return main_decode(c) == 5;
}

/* Whether a decode of `rows` rows a KV head over fp8 takes the register
 * form (decode5's rule), which the batched fp8 decode runs. */
extern "C" int kvmem_cuda_att_decode_fp8_reg(const kvmem_cuda_ctx *c, int rows)
{
	return main_decode(c) == 5 && rows >= 1 && dec8r_takes(c, rows);
}

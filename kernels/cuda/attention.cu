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
 *    255 registers, 104 bytes spilled, 2 blocks (8 warps) per SM.
 *
 * 5  a decode kernel (rows <= 16; other shapes run as v4): four warps per
 *    (split, KV head) over a three-stage cp.async ring of 64-key stages,
 *    each warp 16 keys of a stage for all the group's rows, the warps
 *    merged in the block and the splits combined by the last block of each
 *    KV head to finish, in split order (one launch, no combine kernel): see
 *    dec_kernel().
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

/* ---- version 2: flash --------------------------------------------------- */
struct flash_args {
	uint16_t *out;
	const uint16_t *q, *k, *v;
	const int32_t *q_pos, *kv_pos;
	int n_q, n_kv, n_heads, n_kv_heads, group;
	long long kv_stride;
	float scale_log2;	/* scale * log2(e) */
	int keys_per_split;
	float *part_o, *part_m, *part_l;	/* split-K partials, or NULL */
	/* Decode (split_target > 0): the key count is *n_kv_dev when set (a
	 * CUDA graph replays the launch as the view grows), else n_kv; the
	 * keys per split follow from it and split_target alone (see
	 * decode_split), never from the grid or the view's capacity. */
	const int *n_kv_dev;
	int split_target;
};

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

/*
 * WM warps, each owning MT m-tiles of 16 rows (ROWS = 16 WM MT rows per
 * block), BN-key tiles. MT = 1 keeps the warp's Q fragments in registers
 * (v2, v3); MT = 2 (v4) reads them from shared memory by ldmatrix at each
 * step instead (registers go to the second m-tile's accumulators), so each
 * K and V fragment read from shared memory feeds two MMAs per m-tile pair:
 * half the shared-memory traffic per MMA, which bounds v2.
 */
template <int HD, int WM, int BN, int MT> struct flash_cfg {
	static constexpr int ROWS = 16 * WM * MT;
	static constexpr int LD = HD + 8;	/* smem row stride (bf16): ldmatrix without bank conflicts */
	static constexpr int THREADS = 32 * WM;
	static constexpr int CH = HD / 8;	/* 16-byte chunks per row */
	static constexpr size_t SMEM = (size_t)(ROWS * LD + 4 * BN * LD) * 2 + 2 * BN * sizeof(int);
};

template <int HD, int WM, int BN, int MT>
__global__ void __launch_bounds__(32 * WM) flash_kernel(const flash_args a)
{
	typedef flash_cfg<HD, WM, BN, MT> C;
	extern __shared__ __align__(16) unsigned char smem_raw[];
	uint16_t *sQ = (uint16_t *)smem_raw;
	uint16_t *sK = sQ + C::ROWS * C::LD;	/* [2][BN][LD] */
	uint16_t *sV = sK + 2 * BN * C::LD;	/* [2][BN][LD] */
	int *sP = (int *)(sV + 2 * BN * C::LD);	/* [2][BN] key positions (kv_pos given) */
	__shared__ int s_qmax, s_qmin;

	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, t4 = lane & 3;
	const int G = a.group, R = a.n_q * G;
	const int mt = gridDim.x - 1 - blockIdx.x;	/* heavy (late) tiles first */
	const int kvh = blockIdx.y, split = blockIdx.z;
	const int n_kv = a.n_kv_dev ? min(*a.n_kv_dev, a.n_kv) : a.n_kv;
	int kps = a.keys_per_split;

	if (a.split_target) {
		int splits;

		decode_split(n_kv, BN, a.split_target, 1, &kps, &splits);
		if (split >= splits)
			return;	/* the whole block: the grid was sized for the most splits */
	}
	const int row0 = mt * C::ROWS;
	int r_lo[MT], r_hi[MT], qp_lo[MT], qp_hi[MT];

#pragma unroll
	for (int m = 0; m < MT; m++) {
		r_lo[m] = row0 + (warp * MT + m) * 16 + gq;
		r_hi[m] = r_lo[m] + 8;
		qp_lo[m] = r_lo[m] < R ? a.q_pos[r_lo[m] / G] : INT_MIN;
		qp_hi[m] = r_hi[m] < R ? a.q_pos[r_hi[m] / G] : INT_MIN;
	}
	if (tid == 0) {
		s_qmax = INT_MIN;
		s_qmin = INT_MAX;
	}
	__syncthreads();
	for (int r = tid; r < C::ROWS; r += C::THREADS)
		if (row0 + r < R) {
			int p = a.q_pos[(row0 + r) / G];

			atomicMax(&s_qmax, p);
			atomicMin(&s_qmin, p);
		}
	__syncthreads();
	const int qmax = s_qmax, qmin = s_qmin;
	const int ks = split * kps;
	int ke = min(n_kv, ks + kps);

	if (!a.kv_pos)
		ke = min(ke, qmax == INT_MAX ? qmax : qmax + 1);
	const int n_tiles = ke > ks ? (ke - ks + BN - 1) / BN : 0;

	/* Q tile and the first K/V tile: group 0. */
	if (n_tiles > 0) {
		for (int c = tid; c < C::ROWS * C::CH; c += C::THREADS) {
			int r = c / C::CH, cc = c % C::CH, rr = row0 + r;
			bool ok = rr < R;
			const uint16_t *src = ok ? a.q + ((size_t)(rr / G) * a.n_heads + kvh * G + rr % G) * HD +
						      cc * 8 : a.q;

			cp_async16(sQ + r * C::LD + cc * 8, src, ok);
		}
	}
	auto load_tile = [&](int i, int buf) {
		const int j0 = ks + i * BN;
		const uint16_t *kb = a.k + ((size_t)kvh * a.kv_stride + j0) * HD;
		const uint16_t *vb = a.v + ((size_t)kvh * a.kv_stride + j0) * HD;

		for (int c = tid; c < BN * C::CH; c += C::THREADS) {
			int r = c / C::CH, cc = c % C::CH;
			bool ok = j0 + r < ke;
			size_t off = (size_t)r * HD + cc * 8;

			cp_async16(sK + (buf * BN + r) * C::LD + cc * 8, ok ? kb + off : a.k, ok);
			cp_async16(sV + (buf * BN + r) * C::LD + cc * 8, ok ? vb + off : a.v, ok);
		}
		if (a.kv_pos)
			for (int r = tid; r < BN; r += C::THREADS)
				sP[buf * BN + r] = j0 + r < ke ? a.kv_pos[j0 + r] : INT_MAX;
	};
	if (n_tiles > 0)
		load_tile(0, 0);
	cp_async_commit();

	/* Per-lane ldmatrix addresses (bytes in shared memory). An x4 load
	 * takes row addresses from lanes 8i..8i+7 for matrix i. K (B of Q K^T,
	 * "col" layout = K rows): matrices (keys 0-7, d 0-7), (0-7, 8-15),
	 * (8-15, 0-7), (8-15, 8-15). V (B of P V, transposed) and Q (A):
	 * (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15). */
	const int mi = lane >> 3, rr8 = lane & 7;
	const uint32_t sQa = (uint32_t)__cvta_generic_to_shared(sQ);
	const uint32_t sKa = (uint32_t)__cvta_generic_to_shared(sK) +
			     (((mi >> 1) * 8 + rr8) * C::LD + (mi & 1) * 8) * 2;
	const uint32_t sVa = (uint32_t)__cvta_generic_to_shared(sV) +
			     (((mi & 1) * 8 + rr8) * C::LD + (mi >> 1) * 8) * 2;
	const uint32_t qA = sQa + ((warp * MT * 16 + (mi & 1) * 8 + rr8) * C::LD + (mi >> 1) * 8) * 2;

	float m_lo[MT], m_hi[MT], l_lo[MT], l_hi[MT];
	float o[MT][HD / 8][4];
	uint32_t qf[MT == 1 ? HD / 16 : 1][4];

#pragma unroll
	for (int m = 0; m < MT; m++) {
		m_lo[m] = m_hi[m] = -INFINITY;
		l_lo[m] = l_hi[m] = 0.0f;
#pragma unroll
		for (int dt = 0; dt < HD / 8; dt++)
			o[m][dt][0] = o[m][dt][1] = o[m][dt][2] = o[m][dt][3] = 0.0f;
	}

	for (int i = 0; i < n_tiles; i++) {
		const int buf = i & 1, j0 = ks + i * BN;
		const uint32_t kbuf = sKa + buf * BN * C::LD * 2, vbuf = sVa + buf * BN * C::LD * 2;

		if (i + 1 < n_tiles)
			load_tile(i + 1, buf ^ 1);
		cp_async_commit();	/* possibly empty: keeps the group count uniform */
		cp_async_wait<1>();	/* tile i (and Q) have landed */
		__syncthreads();
		if (MT == 1 && i == 0) {
#pragma unroll
			for (int kk = 0; kk < HD / 16; kk++) {
				const uint16_t *b = sQ + (warp * 16 + gq) * C::LD + kk * 16 + 2 * t4;

				qf[MT == 1 ? kk : 0][0] = *(const uint32_t *)b;
				qf[MT == 1 ? kk : 0][1] = *(const uint32_t *)(b + 8 * C::LD);
				qf[MT == 1 ? kk : 0][2] = *(const uint32_t *)(b + 8);
				qf[MT == 1 ? kk : 0][3] = *(const uint32_t *)(b + 8 * C::LD + 8);
			}
		}

		/* S = Q K^T: per m-tile 16 rows x BN keys. */
		float s[MT][BN / 8][4];
#pragma unroll
		for (int m = 0; m < MT; m++)
#pragma unroll
			for (int nt = 0; nt < BN / 8; nt++)
				s[m][nt][0] = s[m][nt][1] = s[m][nt][2] = s[m][nt][3] = 0.0f;
#pragma unroll
		for (int kk = 0; kk < HD / 16; kk++) {
			uint32_t qa[MT][4];

#pragma unroll
			for (int m = 0; m < MT; m++) {
				if (MT == 1) {
					qa[m][0] = qf[MT == 1 ? kk : 0][0];
					qa[m][1] = qf[MT == 1 ? kk : 0][1];
					qa[m][2] = qf[MT == 1 ? kk : 0][2];
					qa[m][3] = qf[MT == 1 ? kk : 0][3];
				} else {
					ldsm_x4_u(qa[m], qA + (m * 16 * C::LD + kk * 16) * 2);
				}
			}
#pragma unroll
			for (int np = 0; np < BN / 16; np++) {
				uint32_t b[4];

				ldsm_x4_u(b, kbuf + (np * 16 * C::LD + kk * 16) * 2);
#pragma unroll
				for (int m = 0; m < MT; m++) {
					mma16816(s[m][2 * np], qa[m], b[0], b[1]);
					mma16816(s[m][2 * np + 1], qa[m], b[2], b[3]);
				}
			}
		}

		/* Scale (log2 units) and mask. */
		const bool full = !a.kv_pos && j0 + BN <= ke && j0 + BN - 1 <= qmin;
#pragma unroll
		for (int m = 0; m < MT; m++)
#pragma unroll
			for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
				for (int e = 0; e < 2; e++) {
					float x_lo = s[m][nt][e] * a.scale_log2;
					float x_hi = s[m][nt][2 + e] * a.scale_log2;

					if (!full) {
						const int jl = nt * 8 + 2 * t4 + e, j = j0 + jl;
						const int kp = a.kv_pos ? sP[buf * BN + jl] : j;
						const bool ok = j < ke;

						if (!ok || kp > qp_lo[m])
							x_lo = -INFINITY;
						if (!ok || kp > qp_hi[m])
							x_hi = -INFINITY;
					}
					s[m][nt][e] = x_lo;
					s[m][nt][2 + e] = x_hi;
				}

		/* Online softmax: rows gq (lo) and gq + 8 (hi) of each m-tile;
		 * the 4 threads of a quad share a row. */
#pragma unroll
		for (int m = 0; m < MT; m++) {
			float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
			for (int nt = 0; nt < BN / 8; nt++) {
				mx_lo = fmaxf(mx_lo, fmaxf(s[m][nt][0], s[m][nt][1]));
				mx_hi = fmaxf(mx_hi, fmaxf(s[m][nt][2], s[m][nt][3]));
			}
			mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
			mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
			mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
			mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
			const float mn_lo = fmaxf(m_lo[m], mx_lo), mn_hi = fmaxf(m_hi[m], mx_hi);
			/* A row that has seen nothing yet subtracts 0: every p is 0. */
			const float b_lo = mn_lo == -INFINITY ? 0.0f : mn_lo;
			const float b_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;
			const float al_lo = exp2f(m_lo[m] - b_lo), al_hi = exp2f(m_hi[m] - b_hi);
			float rs_lo = 0.0f, rs_hi = 0.0f;

#pragma unroll
			for (int nt = 0; nt < BN / 8; nt++) {
				s[m][nt][0] = exp2f(s[m][nt][0] - b_lo);
				s[m][nt][1] = exp2f(s[m][nt][1] - b_lo);
				s[m][nt][2] = exp2f(s[m][nt][2] - b_hi);
				s[m][nt][3] = exp2f(s[m][nt][3] - b_hi);
				rs_lo += s[m][nt][0] + s[m][nt][1];
				rs_hi += s[m][nt][2] + s[m][nt][3];
			}
			l_lo[m] = l_lo[m] * al_lo + rs_lo;
			l_hi[m] = l_hi[m] * al_hi + rs_hi;
			m_lo[m] = mn_lo;
			m_hi[m] = mn_hi;
#pragma unroll
			for (int dt = 0; dt < HD / 8; dt++) {
				o[m][dt][0] *= al_lo;
				o[m][dt][1] *= al_lo;
				o[m][dt][2] *= al_hi;
				o[m][dt][3] *= al_hi;
			}
		}

		/* O += P V: P from the S registers (the C layout of two n-tiles is
		 * the A layout of one 16-key step), V by ldmatrix.trans. */
#pragma unroll
		for (int kk = 0; kk < BN / 16; kk++) {
			uint32_t pa[MT][4];

#pragma unroll
			for (int m = 0; m < MT; m++) {
				pa[m][0] = pack_bf2(s[m][2 * kk][0], s[m][2 * kk][1]);
				pa[m][1] = pack_bf2(s[m][2 * kk][2], s[m][2 * kk][3]);
				pa[m][2] = pack_bf2(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
				pa[m][3] = pack_bf2(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
			}
#pragma unroll
			for (int dp = 0; dp < HD / 16; dp++) {
				uint32_t b[4];

				ldsm_x4_tu(b, vbuf + (kk * 16 * C::LD + dp * 16) * 2);
#pragma unroll
				for (int m = 0; m < MT; m++) {
					mma16816(o[m][2 * dp], pa[m], b[0], b[1]);
					mma16816(o[m][2 * dp + 1], pa[m], b[2], b[3]);
				}
			}
		}
		__syncthreads();	/* buf is refilled at iteration i + 1 */
	}
	cp_async_wait<0>();

	const size_t base = ((size_t)split * a.n_kv_heads + kvh) * R;

#pragma unroll
	for (int m = 0; m < MT; m++) {
		float lo = l_lo[m], hi = l_hi[m];

		lo += __shfl_xor_sync(0xffffffffu, lo, 1);
		lo += __shfl_xor_sync(0xffffffffu, lo, 2);
		hi += __shfl_xor_sync(0xffffffffu, hi, 1);
		hi += __shfl_xor_sync(0xffffffffu, hi, 2);
		if (!a.part_o) {
			const float i_lo = lo > 0.0f ? 1.0f / lo : 0.0f;
			const float i_hi = hi > 0.0f ? 1.0f / hi : 0.0f;

			if (r_lo[m] < R) {
				uint16_t *dst = a.out + ((size_t)(r_lo[m] / G) * a.n_heads + kvh * G +
							 r_lo[m] % G) * HD;
#pragma unroll
				for (int dt = 0; dt < HD / 8; dt++)
					*(uint32_t *)(dst + dt * 8 + 2 * t4) =
						pack_bf2(o[m][dt][0] * i_lo, o[m][dt][1] * i_lo);
			}
			if (r_hi[m] < R) {
				uint16_t *dst = a.out + ((size_t)(r_hi[m] / G) * a.n_heads + kvh * G +
							 r_hi[m] % G) * HD;
#pragma unroll
				for (int dt = 0; dt < HD / 8; dt++)
					*(uint32_t *)(dst + dt * 8 + 2 * t4) =
						pack_bf2(o[m][dt][2] * i_hi, o[m][dt][3] * i_hi);
			}
			continue;
		}
		if (r_lo[m] < R) {
			float *po = a.part_o + (base + r_lo[m]) * HD;
#pragma unroll
			for (int dt = 0; dt < HD / 8; dt++)
				*(float2 *)(po + dt * 8 + 2 * t4) = make_float2(o[m][dt][0], o[m][dt][1]);
			if (t4 == 0) {
				a.part_m[base + r_lo[m]] = m_lo[m];
				a.part_l[base + r_lo[m]] = lo;
			}
		}
		if (r_hi[m] < R) {
			float *po = a.part_o + (base + r_hi[m]) * HD;
#pragma unroll
			for (int dt = 0; dt < HD / 8; dt++)
				*(float2 *)(po + dt * 8 + 2 * t4) = make_float2(o[m][dt][2], o[m][dt][3]);
			if (t4 == 0) {
				a.part_m[base + r_hi[m]] = m_hi[m];
				a.part_l[base + r_hi[m]] = hi;
			}
		}
	}
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
#define COMBINE_MAX 128

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
		float m[COMBINE_MAX / 32], M = -INFINITY, L = 0.0f;

#pragma unroll
		for (int i = 0; i < COMBINE_MAX / 32; i++) {
			const int s = tid + 32 * i;

			m[i] = s < splits ? pm[((size_t)s * n_kv_heads + kvh) * R + r] : -INFINITY;
			M = fmaxf(M, m[i]);
		}
		for (int o = 16; o > 0; o >>= 1)
			M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
#pragma unroll
		for (int i = 0; i < COMBINE_MAX / 32; i++) {
			const int s = tid + 32 * i;
			const float ws = m[i] == -INFINITY ? 0.0f : exp2f(m[i] - M);

			w[s] = ws;
			if (ws != 0.0f)
				L = __fadd_rn(L, __fmul_rn(ws, pl[((size_t)s * n_kv_heads + kvh) * R + r]));
		}
		for (int o = 16; o > 0; o >>= 1)
			L = __fadd_rn(L, __shfl_xor_sync(0xffffffffu, L, o));
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
#define DEC_BN 64	/* keys per stage, 16 per warp */
/* Stages a split takes at least. With one (as before 2026-12-02) a batched
 * decode over 64 views of ~500 keys ran 4096 blocks of a single stage each
 * (64 x 8 KV heads x 8 splits): 3.2 ms of a 23 ms step went to their
 * set-up and combine, not to reading keys (tests/gpu/prof26.sh). Four
 * stages a split keep the ring busy and cut those blocks to a quarter; a
 * lone decode changes only below target x 4 stages (8448 keys at 8 KV
 * heads on 132 SMs), where attention is a small part of a step. The rule
 * is the lone decode's too, so a batched item keeps its lone bits.
 * KVMEM_CUDA_DEC_MIN_TILES=N (read when a context is made) sets it for
 * comparisons in the same run: 1 is the rule before. */
#define DEC_MIN_TILES 4
#define DEC_WARPS 4
#define DEC_STAGES 3
#define DEC_CNT 1024	/* KV heads the context's counters cover */

struct dec_args {
	uint16_t *out;
	const uint16_t *q, *k, *v;	/* F8: k and v are e4m3 bytes */
	const float *ks, *vs;		/* F8: their row scales, kv_stride apart per KV head */
	const int32_t *q_pos, *kv_pos;
	const int *n_kv_dev;	/* the key count on the device (capped at n_kv), or NULL */
	int n_q, n_kv, n_heads, n_kv_heads, group, target;
	int min_tiles;		/* the split's least stages (dec_min_tiles) */
	int f16k;		/* F8: scores on the f16 MMA when Q converts exactly (fp8_f16k) */
	int fp8_int;		/* F8: e4m3 -> bf16 by integer ops, not cvt (e4m3x4_bf16_int) */
	long long kv_stride;
	float scale_log2;	/* scale * log2(e) */
	float *part_o, *part_m, *part_l;	/* [target][n_kv_heads][R] (x head_dim) */
	unsigned *cnt;		/* [n_kv_heads] splits done; 0 between launches */
};

template <int HD> struct dec_cfg {
	static constexpr int LD = HD + 8;	/* smem row stride (bf16): ldmatrix without bank conflicts */
	static constexpr int CH = HD / 8;	/* 16-byte chunks per row */
	static constexpr int THREADS = 32 * DEC_WARPS;
	static constexpr size_t Q_BYTES = (size_t)16 * LD * 2;
	static constexpr size_t STAGE_BYTES = (size_t)2 * DEC_BN * LD * 2;	/* K then V */
	static constexpr size_t SMEM = Q_BYTES + DEC_STAGES * STAGE_BYTES + DEC_STAGES * DEC_BN * 4;
	/* After the key loop, over the stages: the warps' o [WARPS][16][HD],
	 * max and sum [WARPS][16], the combine's weights [16][COMBINE_MAX]
	 * and 1 / sum [16] (floats). */
	static constexpr size_t MERGE_BYTES =
		((size_t)DEC_WARPS * 16 * HD + 2 * DEC_WARPS * 16 + 16 * COMBINE_MAX + 16) * 4;
	static_assert(MERGE_BYTES <= DEC_STAGES * STAGE_BYTES, "merge area over the stages");
	/* fp8: one bf16 tile (a stage's size), then the ring of raw stages (K
	 * bytes, V bytes [BN][HD], K scales, V scales [BN]), then the kv_pos
	 * ring; the merge area over the tile and the raw ring. */
	static constexpr size_t RAW_STAGE = (size_t)2 * DEC_BN * HD + (size_t)2 * DEC_BN * 4;
	static constexpr size_t KV8_BYTES = STAGE_BYTES + DEC_STAGES * RAW_STAGE;
	static constexpr size_t SMEM8 = Q_BYTES + KV8_BYTES + DEC_STAGES * DEC_BN * 4;
	static_assert(MERGE_BYTES <= KV8_BYTES, "fp8: merge area over the tile and the ring");
};

__device__ __forceinline__ void cp_async4(void *smem, const void *gmem, bool valid)
{
	unsigned s = (unsigned)__cvta_generic_to_shared(smem);
	int n = valid ? 4 : 0;

	asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}

/* Four fp32 as four bf16 at dst (8-byte aligned). */
__device__ __forceinline__ void store_bf4(uint16_t *dst, float4 x, float f)
{
	uint2 u;

	u.x = pack_bf2(x.x * f, x.y * f);
	u.y = pack_bf2(x.z * f, x.w * f);
	*(uint2 *)dst = u;
}

template <int HD>
__device__ __forceinline__ void dec_finish(const dec_args &a, int kvh, int split, int splits,
					   float *mo);

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

/* The end of a decode block (v5 and the fp8 register form): the warps'
 * states are in shared memory at mo ([WARPS][16][HD] o, then [WARPS][16]
 * max and sum, then the combine's room: dec_cfg's MERGE_BYTES), after a
 * block barrier. Merges them in warp order into the block's partial,
 * and the last split of the KV head to arrive combines every split. */
template <int HD>
__device__ __forceinline__ void dec_finish(const dec_args &a, const int kvh, const int split,
					   const int splits, float *mo)
{
	typedef dec_cfg<HD> C;
	__shared__ int s_last;
	float *mm = mo + DEC_WARPS * 16 * HD;	/* [WARPS][16] */
	float *ml = mm + DEC_WARPS * 16;	/* [WARPS][16] */
	float *sw = ml + DEC_WARPS * 16;	/* [16][COMBINE_MAX] */
	float *sinv = sw + 16 * COMBINE_MAX;	/* [16] */
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
	const int G = a.group, R = a.n_q * G;

	/* The block's partial: the warps' states in warp order, four columns
	 * per thread. */
	const size_t rows_per_split = (size_t)a.n_kv_heads * R;
	const size_t base = ((size_t)split * a.n_kv_heads + kvh) * R;

	for (int e4 = tid; e4 < R * (HD / 4); e4 += C::THREADS) {
		const int r = e4 / (HD / 4), d = (e4 % (HD / 4)) * 4;
		float M = -INFINITY, L = 0.0f;
		float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

#pragma unroll
		for (int w = 0; w < DEC_WARPS; w++)
			M = fmaxf(M, mm[w * 16 + r]);
#pragma unroll
		for (int w = 0; w < DEC_WARPS; w++) {
			const float mw = mm[w * 16 + r];
			const float ws = mw == -INFINITY ? 0.0f : exp2f(mw - M);
			const float4 x = *(const float4 *)(mo + (w * 16 + r) * HD + d);

			L += ws * ml[w * 16 + r];
			acc.x += ws * x.x;
			acc.y += ws * x.y;
			acc.z += ws * x.z;
			acc.w += ws * x.w;
		}
		if (splits == 1) {
			store_bf4(a.out + ((size_t)(r / G) * a.n_heads + kvh * G + r % G) * HD + d, acc,
				  L > 0.0f ? 1.0f / L : 0.0f);
			continue;
		}
		*(float4 *)(a.part_o + (base + r) * HD + d) = acc;
		if (d == 0) {
			a.part_m[base + r] = M;
			a.part_l[base + r] = L;
		}
	}
	if (splits == 1)
		return;

	/* Publish the partial; the last of the head's splits to arrive combines. */
	__threadfence();
	__syncthreads();
	if (tid == 0) {
		const unsigned prev = atomicAdd(a.cnt + kvh, 1u);

		s_last = prev == (unsigned)splits - 1;
	}
	__syncthreads();
	if (!s_last)
		return;
	__threadfence();
	if (tid == 0)
		a.cnt[kvh] = 0;	/* every split has counted: ready for the next launch */

	/* Each row's split weights 2^(m_s - M) and 1 / sum (a warp per row:
	 * lanes over splits, then a fixed shuffle tree). */
	for (int r = warp; r < R; r += DEC_WARPS) {
		float mv[COMBINE_MAX / 32], M = -INFINITY, L = 0.0f;

#pragma unroll
		for (int i = 0; i < COMBINE_MAX / 32; i++) {
			const int s = lane + 32 * i;

			mv[i] = s < splits ? __ldcg(a.part_m + s * rows_per_split + kvh * R + r) : -INFINITY;
			M = fmaxf(M, mv[i]);
		}
		for (int off = 16; off > 0; off >>= 1)
			M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
#pragma unroll
		for (int i = 0; i < COMBINE_MAX / 32; i++) {
			const int s = lane + 32 * i;
			const float ws = mv[i] == -INFINITY ? 0.0f : exp2f(mv[i] - M);

			sw[r * COMBINE_MAX + s] = ws;
			if (ws != 0.0f)
				L += ws * __ldcg(a.part_l + s * rows_per_split + kvh * R + r);
		}
		for (int off = 16; off > 0; off >>= 1)
			L += __shfl_xor_sync(0xffffffffu, L, off);
		if (lane == 0)
			sinv[r] = L > 0.0f ? 1.0f / L : 0.0f;
	}
	__syncthreads();

	/* The weighted sum over the splits in split order, 16 loads in flight. */
	for (int e4 = tid; e4 < R * (HD / 4); e4 += C::THREADS) {
		const int r = e4 / (HD / 4), d = (e4 % (HD / 4)) * 4;
		const float *wr = sw + r * COMBINE_MAX;
		const float4 *src = (const float4 *)(a.part_o + ((size_t)kvh * R + r) * HD + d);
		const size_t step = rows_per_split * HD / 4;	/* float4s from one split to the next */
		float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

		for (int s0 = 0; s0 < splits; s0 += 16) {
			float4 x[16];

#pragma unroll
			for (int j = 0; j < 16; j++)
				x[j] = s0 + j < splits ? __ldcg(src + (size_t)(s0 + j) * step)
						       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
			for (int j = 0; j < 16; j++) {
				const float ws = s0 + j < splits ? wr[s0 + j] : 0.0f;

				acc.x += ws * x[j].x;
				acc.y += ws * x[j].y;
				acc.z += ws * x[j].z;
				acc.w += ws * x[j].w;
			}
		}
		store_bf4(a.out + ((size_t)(r / G) * a.n_heads + kvh * G + r % G) * HD + d, acc, sinv[r]);
	}
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

/*
 * ---- v5 over fp8, the register form (fp8_reg; KVMEM_CUDA_FP8_REG) ------
 *
 * dec8_kernel's blocks, splits, warps' keys and combine, for up to 8 rows
 * (queries x group), without K/V in shared memory: each lane loads the
 * raw bytes its own mma fragments need straight from global memory into
 * registers (the warp's next 16-key tile in flight while this one is
 * used) and turns them into bf16 there: a byte permute that also copies
 * each byte's sign over its neighbour, a shift, a mask and a bf16x2
 * multiply by 2^120 for a pair of values (exact, subnormals too: see
 * e4m3x4_bf16_int). The keys are the mma's 16 rows, the 8 query rows its
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
 * Not v5's bits (the sums run in another order): kvmem_gpu_check --fp8
 * compares it with v5 over the rows dequantised within a tolerance; a
 * conversation's paged and full-context decode use the same kernel. A
 * NaN code in any key a warp reads makes the block's partial NaN (v5: the
 * rows or dims the NaN reaches). Shared memory: the merge only.
 * MINB: blocks a multiprocessor holds (registers), as its split target.
 */
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

/* Two e4m3 codes of (a, b) as bf16x2, exact. sel (prmt's default mode)
 * puts code 0 in byte 0, its sign replicated in byte 1, code 1 in byte 2,
 * its sign in byte 3: shifted up four, each code's exponent and mantissa
 * sit where a bf16's low exponent bits and top mantissa bits do and its
 * sign byte covers bit 15 (31); the mask keeps those. The exponent lands
 * 120 short: one multiply by 2^120 puts it right (subnormals too). */
template <unsigned SEL> __device__ __forceinline__ uint32_t e4m3_pair_bf16(uint32_t a, uint32_t b)
{
	const __nv_bfloat162 two120 = __halves2bfloat162(__ushort_as_bfloat16(0x7b80),
							 __ushort_as_bfloat16(0x7b80));
	uint32_t u;

	asm("prmt.b32 %0, %1, %2, %3;" : "=r"(u) : "r"(a), "r"(b), "n"(SEL));
	u = (u * 16u) & 0x87f087f0u;	/* a multiply: the integer pipe has the permutes */
	const __nv_bfloat162 v = __hmul2(*(const __nv_bfloat162 *)&u, two120);

	return *(const uint32_t *)&v;
}
/* prmt selectors: source bytes lo and hi (0-7: a's bytes, then b's), each
 * followed by its sign; bytes 0, 1 / 2, 3 of one word; byte j of two. */
#define E4_SEL(lo, hi) ((lo) | (8u | (lo)) << 4 | (hi) << 8 | (8u | (hi)) << 12)
#define E4_LO E4_SEL(0u, 1u)
#define E4_HI E4_SEL(2u, 3u)
#define E4_J(j) E4_SEL((j), 4u + (j))

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

/* acc's bit 7 of a byte set when a byte of w0 or w1 is a NaN code (0x7f,
 * 0xff); the other bits are noise. */
__device__ __forceinline__ uint32_t e4m3_nan_acc(uint32_t acc, uint32_t w0, uint32_t w1)
{
	return acc | ((w0 & 0x7f7f7f7fu) + 0x01010101u) | ((w1 & 0x7f7f7f7fu) + 0x01010101u);
}

template <int HD, int MINB>
__global__ void __launch_bounds__(32 * DEC_WARPS, MINB) dec8r_kernel(const dec_args a)
{
	constexpr int KQ = HD / 4, VQ = HD / 8, KW = HD / 16, MT = HD / 16;
	extern __shared__ __align__(16) unsigned char smem_raw[];
	float *mo = (float *)smem_raw;	/* the merge (dec_finish) */
	float *mm = mo + DEC_WARPS * 16 * HD, *ml = mm + DEC_WARPS * 16;
	const int kvh = blockIdx.y, split = blockIdx.x;
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

/*
 * The batched form (kvmem_cuda_att_dec_batch): blockIdx.z picks a
 * sequence, whose own arguments replace the shared ones; each sequence has
 * its own partials and counters, its split count from its own key count
 * (decode_split at the one-sequence target), so its bits are those of
 * dec_kernel on it alone, whatever else is in the launch.
 */
struct dec_seq {
	uint16_t *out;		/* its first query row's output */
	const uint16_t *q, *k, *v;
	const int32_t *q_pos, *kv_pos;
	int n_q, n_kv;
	long long kv_stride;
	float *part_o, *part_m, *part_l;
	unsigned *cnt;
};

template <int HD>
__global__ void __launch_bounds__(32 * DEC_WARPS, 2) dec_batch_kernel(const dec_args base,
								      const dec_seq *seqs)
{
	const dec_seq s = seqs[blockIdx.z];
	dec_args a = base;

	a.out = s.out;
	a.q = s.q;
	a.k = s.k;
	a.v = s.v;
	a.q_pos = s.q_pos;
	a.kv_pos = s.kv_pos;
	a.n_q = s.n_q;
	a.n_kv = s.n_kv;
	a.kv_stride = s.kv_stride;
	a.part_o = s.part_o;
	a.part_m = s.part_m;
	a.part_l = s.part_l;
	a.cnt = s.cnt;
	dec_body<HD>(a, blockIdx.y, blockIdx.x);
}

/* Raise the kernel's dynamic shared memory limit, once per device. Done
 * for every configuration when a context is made (kvmem_cuda_attention_
 * setup), so that no launch inside a stream capture has to. */
template <int HD, int WM, int BN, int MT> static int flash_attr(kvmem_cuda_ctx *c)
{
	typedef flash_cfg<HD, WM, BN, MT> C;
	static int attr_set[64];

	if (c->device < 64 && attr_set[c->device])
		return 0;
	if (int rc = kvmem_cuda_err(cudaFuncSetAttribute(flash_kernel<HD, WM, BN, MT>,
							 cudaFuncAttributeMaxDynamicSharedMemorySize,
							 (int)C::SMEM),
				    "attention: shared memory"))
		return rc;
	if (c->device < 64)
		attr_set[c->device] = 1;
	return 0;
}

/* A decode kernel's dynamic shared memory limit raised to `bytes`, with
 * the most shared memory per SM preferred (two blocks of 107 KB at
 * head_dim 128); `what` names it in an error. */
static int dec_smem(const void *kernel, int bytes, const char *what)
{
	if (int rc = kvmem_cuda_err(cudaFuncSetAttribute(kernel,
							 cudaFuncAttributeMaxDynamicSharedMemorySize,
							 bytes), what))
		return rc;
	return kvmem_cuda_err(cudaFuncSetAttribute(kernel,
						   cudaFuncAttributePreferredSharedMemoryCarveout,
						   (int)cudaSharedmemCarveoutMaxShared), what);
}

/* The same for the decode kernels (v5: bf16, batched, fp8), once per
 * device. */
template <int HD> static int dec_attr(kvmem_cuda_ctx *c)
{
	static int attr_set[64];
	int rc;

	if (c->device < 64 && attr_set[c->device])
		return 0;
	if ((rc = dec_smem((const void *)dec_kernel<HD>, (int)dec_cfg<HD>::SMEM,
			   "attention v5: shared memory")) ||
	    (rc = dec_smem((const void *)dec_batch_kernel<HD>, (int)dec_cfg<HD>::SMEM,
			   "attention v5, batched: shared memory")) ||
	    (rc = dec_smem((const void *)dec8_kernel<HD>, (int)dec_cfg<HD>::SMEM8,
			   "attention v5 (fp8): shared memory")) ||
	    (rc = dec_smem((const void *)dec8r_kernel<HD, 2>, (int)dec_cfg<HD>::MERGE_BYTES,
			   "attention v5 (fp8, registers): shared memory")) ||
	    (rc = dec_smem((const void *)dec8r_kernel<HD, 3>, (int)dec_cfg<HD>::MERGE_BYTES,
			   "attention v5 (fp8, registers): shared memory")))
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

template <int HD, int WM, int BN, int MT>
static int flash_launch(kvmem_cuda_ctx *c, const flash_args &a, int grid_z, int splits)
{
	typedef flash_cfg<HD, WM, BN, MT> C;
	const int R = a.n_q * a.group, mt = (R + C::ROWS - 1) / C::ROWS;
	int rc;

	if ((rc = flash_attr<HD, WM, BN, MT>(c)))
		return rc;
	flash_kernel<HD, WM, BN, MT><<<dim3(mt, a.n_kv_heads, grid_z), C::THREADS, C::SMEM, c->stream>>>(a);
	if ((rc = kvmem_cuda_launched("attention")))
		return rc;
	if (a.part_o) {
		combine_kernel<HD><<<dim3(R, a.n_kv_heads), 4 * HD, 0, c->stream>>>(
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
 * and v3; v4 as v3) and the decode split target.
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
	const int per_sm = few ? (bn == 32 ? 5 : 3) : (wm == 8 || mtw == 2 ? 1 : 2);
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
			long long want = (target + blocks0 - 1) / blocks0;
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

/* The decode kernel's split target: two blocks per SM over the KV heads. */
static int dec_target(const kvmem_cuda_ctx *c, int n_kv_heads)
{
	const long long want = (long long)c->sms * 2;
	long long t = (want + n_kv_heads - 1) / n_kv_heads;

	return (int)(t < 1 ? 1 : (t > COMBINE_MAX ? COMBINE_MAX : t));
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
	const bool reg = ks && c->fp8_reg && R <= 8;
	const int minb = c->fp8_reg_blocks == 3 ? 3 : 2;

	if (reg && minb != 2)
		a.target = (int)std::min<long long>(COMBINE_MAX, ((long long)c->sms * minb +
								 f.n_kv_heads - 1) / f.n_kv_heads);
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
		const dim3 gr(grid, f.n_kv_heads);
		const int th = dec_cfg<128>::THREADS;

		if ((rc = head_dim == 128 ? dec_attr<128>(c) : dec_attr<64>(c)))
			return rc;
		if (head_dim == 128 && minb == 3)
			dec8r_kernel<128, 3><<<gr, th, dec_cfg<128>::MERGE_BYTES, c->stream>>>(a);
		else if (head_dim == 128)
			dec8r_kernel<128, 2><<<gr, th, dec_cfg<128>::MERGE_BYTES, c->stream>>>(a);
		else if (minb == 3)
			dec8r_kernel<64, 3><<<gr, th, dec_cfg<64>::MERGE_BYTES, c->stream>>>(a);
		else
			dec8r_kernel<64, 2><<<gr, th, dec_cfg<64>::MERGE_BYTES, c->stream>>>(a);
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
 * for the sequences whose rows n_q * group fit one 16-row tile): grid
 * (most splits, KV heads, sequences), each sequence split as decode5 splits
 * it alone (decode_split at dec_target: its own key count and the SM count,
 * never the batch), with its own partials and counters; so each gets
 * decode5's bits. Sequences go DEC_CNT / n_kv_heads to a launch (the
 * counters). seqs: host array; its device copy and the partials take the
 * context's scratch.
 */
extern "C" int kvmem_cuda_att_dec_batch(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
					const kvmem_cuda_att_seq *const *seqs, int n, int n_heads,
					int n_kv_heads, int head_dim, float scale)
{
	const int G = n_heads / n_kv_heads, target = dec_target(c, n_kv_heads);
	const int per_launch = DEC_CNT / n_kv_heads;
	dec_seq *h = NULL;
	dec_args base;
	int rc = 0;

	if (head_dim != 64 && head_dim != 128)
		return kvmem_error(ENOTSUP, "attention v5, batched: head_dim %d (64 or 128)", head_dim);
	if (n_kv_heads > DEC_CNT || !c->att_cnt)
		return kvmem_error(ENOTSUP, "attention v5, batched: %d KV heads or no counters",
				   n_kv_heads);
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
		if (head_dim == 128)
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

/* Whether the main path's decode is v5 (the batched decode's bits are
 * then a lone call's). */
extern "C" int kvmem_cuda_att_decode_is_v5(const kvmem_cuda_ctx *c)
{
	return main_decode(c) == 5;
}

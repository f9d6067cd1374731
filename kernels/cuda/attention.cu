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
 * 4  (the main path's prefill) the same kernel with two 16-row m-tiles per
 *    warp: 128 rows in 4 warps, Q fragments read from shared memory by
 *    ldmatrix at each step, so each K / V fragment loaded from shared memory
 *    feeds four MMAs instead of two (v2 is bound by shared-memory traffic:
 *    ncu saw ldmatrix the largest stall). Shared-memory addresses are
 *    computed once per thread and P goes to bf16 by one cvt per pair.
 *    255 registers, 104 bytes spilled, 2 blocks (8 warps) per SM.
 */
#include <limits.h>
#include <string.h>

#include "cuda_int.h"

/* ---- version 1 ------------------------------------------------------------ */
#define V1_MAX_HD 256

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
	for (int j0 = 0; j0 < n_kv; j0 += 32) {
		const int j = j0 + lane;
		float s = -INFINITY, mc, mn, alpha, p, ps;

		if (j < n_kv && (kv_pos ? kv_pos[j] : j) <= qp) {
			const uint16_t *kj = kh + (size_t)j * hd;
			float acc = 0.0f;

			for (int d = 0; d < hd; d++)
				acc += qs[d] * bf2f(kj[d]);
			s = acc * scale;
		}
		mc = s;
		for (int o2 = 16; o2 > 0; o2 >>= 1)
			mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, o2));
		mn = fmaxf(m, mc);
		if (mn == -INFINITY)
			continue;	/* nothing visible yet: uniform over the warp */
		alpha = expf(m - mn);
		p = s == -INFINITY ? 0.0f : expf(s - mn);
		ps = p;
		for (int o2 = 16; o2 > 0; o2 >>= 1)
			ps += __shfl_xor_sync(0xffffffffu, ps, o2);
		l = l * alpha + ps;
		for (int c = 0; c < per; c++)
			o[c] *= alpha;
		for (int jj = 0; jj < 32 && j0 + jj < n_kv; jj++) {
			float pj = __shfl_sync(0xffffffffu, p, jj);

			if (pj == 0.0f)
				continue;
			const uint16_t *vj = vh + (size_t)(j0 + jj) * hd;

			for (int c = 0; c < per; c++)
				o[c] += pj * bf2f(vj[lane + 32 * c]);
		}
		m = mn;
	}
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
 * keys, at most `target` splits, each a whole number of tiles, the last
 * one shorter. Depends on the key count and the target only. */
__host__ __device__ __forceinline__ void decode_split(int n_kv, int bn, int target, int *kps,
						      int *splits)
{
	const int tiles = (n_kv + bn - 1) / bn;
	const int per = tiles ? (tiles + target - 1) / target : 1;

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

		decode_split(n_kv, BN, a.split_target, &kps, &splits);
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

		decode_split(n_kv_dev ? min(*n_kv_dev, n_kv) : n_kv, bn, target, &kps, &splits);
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

extern "C" int kvmem_cuda_attention_setup(kvmem_cuda_ctx *c)
{
	int rc;

	if ((rc = flash_attr<128, 1, 32, 1>(c)) || (rc = flash_attr<128, 1, 64, 1>(c)) ||
	    (rc = flash_attr<128, 4, 64, 1>(c)) || (rc = flash_attr<128, 8, 64, 1>(c)) ||
	    (rc = flash_attr<128, 4, 64, 2>(c)) || (rc = flash_attr<64, 1, 32, 1>(c)) ||
	    (rc = flash_attr<64, 1, 64, 1>(c)) || (rc = flash_attr<64, 4, 64, 1>(c)) ||
	    (rc = flash_attr<64, 8, 64, 1>(c)) || (rc = flash_attr<64, 4, 64, 2>(c)))
		return rc;
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
		decode_split(a.n_kv, bn, a.split_target, &a.keys_per_split, &splits);
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

/* The flash arguments after the shape checks (versions 2 and 3). */
static int flash_args_for(flash_args *a, int version, uint16_t *out, const uint16_t *q,
			  const int32_t *q_pos, int n_q, const uint16_t *k, const uint16_t *v,
			  const int32_t *kv_pos, int n_kv, size_t kv_stride, int n_heads,
			  int n_kv_heads, int head_dim, float scale)
{
	if (version < 2 || version > 4)
		return kvmem_error(EINVAL, "attention: no version %d (1 to 4)", version);
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
	if ((rc = flash_args_for(&a, version, out, q, q_pos, n_q, k, v, kv_pos, n_kv, kv_stride,
				 n_heads, n_kv_heads, head_dim, scale)))
		return rc;
	return flash(c, a, head_dim, version, NULL);
}

/*
 * The main path's versions. Decode (rows <= 16) takes one version whatever
 * the key count, so that a CUDA graph of a decode step (whose key count is
 * only known on the device) runs the very kernels of a plain call:
 * MAIN_DECODE. Prefill chunks take MAIN_PREFILL. KVMEM_CUDA_DECODE (2, 3)
 * and KVMEM_CUDA_PREFILL (2, 3, 4), read when a context is made, override
 * them for comparisons. Measured on the H200: Documentation/benchmarks.md,
 * "CUDA kernels".
 */
#define MAIN_DECODE 2	/* v3's 32-key tiles: the same decode rate (142 / 125 tok/s) */
#define MAIN_PREFILL 4	/* bench engine 32K prefill 15.3k tok/s, v2 12.2k (2026-11-30) */

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

	return kvmem_cuda_attention_bf16_v(c, ver, out, q, q_pos, n_q, k, v, kv_pos, n_kv,
					   kv_stride, n_heads, n_kv_heads, head_dim, scale);
}

extern "C" size_t kvmem_cuda_attention_scratch(const kvmem_cuda_ctx *c, int n_q, int n_heads,
					     int n_kv_heads, int head_dim)
{
	size_t rows;

	if (!is_decode(n_q, n_heads, n_kv_heads) || head_dim <= 0)
		return 0;
	rows = (size_t)decode_target(c, main_decode(c) == 3 ? 32 : 64, n_kv_heads) * n_kv_heads * n_q *
	       (n_heads / n_kv_heads);
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
	return flash(c, a, head_dim, version, n_kv_dev);
}

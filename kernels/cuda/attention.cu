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
 * 2  the flash kernel (main path). A block owns a tile of 16 * WM rows,
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
 *
 * 3  the same kernel with other tiles: 128 rows (8 warps) for prefill, and
 *    32-key tiles for decode (see flash()).
 */
#include <limits.h>

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
};

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

__device__ __forceinline__ void ldsm_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
					const void *p)
{
	unsigned s = (unsigned)__cvta_generic_to_shared(p);

	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
		     : "r"(s));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
					  const void *p)
{
	unsigned s = (unsigned)__cvta_generic_to_shared(p);

	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
		     : "r"(s));
}

/* d += a . b, one m16n8k16 tile: bf16 in, fp32 accumulate. */
__device__ __forceinline__ void mma16816(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two fp32 as bf16x2, lo in the low half (the lower column of a fragment). */
__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi)
{
	return (uint32_t)f2bf(lo) | ((uint32_t)f2bf(hi) << 16);
}

template <int HD, int WM, int BN> struct flash_cfg {
	static constexpr int ROWS = 16 * WM;
	static constexpr int LD = HD + 8;	/* smem row stride (bf16): ldmatrix without bank conflicts */
	static constexpr int THREADS = 32 * WM;
	static constexpr int CH = HD / 8;	/* 16-byte chunks per row */
	static constexpr size_t SMEM = (size_t)(ROWS * LD + 4 * BN * LD) * 2 + 2 * BN * sizeof(int);
};

template <int HD, int WM, int BN>
__global__ void __launch_bounds__(32 * WM) flash_kernel(const flash_args a)
{
	typedef flash_cfg<HD, WM, BN> C;
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
	const int row0 = mt * C::ROWS;
	const int r_lo = row0 + warp * 16 + gq, r_hi = r_lo + 8;
	const int qp_lo = r_lo < R ? a.q_pos[r_lo / G] : INT_MIN;
	const int qp_hi = r_hi < R ? a.q_pos[r_hi / G] : INT_MIN;

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
	const int ks = split * a.keys_per_split;
	int ke = min(a.n_kv, ks + a.keys_per_split);

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

		for (int c = tid; c < BN * C::CH; c += C::THREADS) {
			int r = c / C::CH, cc = c % C::CH, j = j0 + r;
			bool ok = j < ke;
			size_t off = ((size_t)kvh * a.kv_stride + j) * HD + cc * 8;

			cp_async16(sK + (buf * BN + r) * C::LD + cc * 8, ok ? a.k + off : a.k, ok);
			cp_async16(sV + (buf * BN + r) * C::LD + cc * 8, ok ? a.v + off : a.v, ok);
		}
		if (a.kv_pos)
			for (int r = tid; r < BN; r += C::THREADS)
				sP[buf * BN + r] = j0 + r < ke ? a.kv_pos[j0 + r] : INT_MAX;
	};
	if (n_tiles > 0)
		load_tile(0, 0);
	cp_async_commit();

	float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
	float o[HD / 8][4];
	uint32_t qf[HD / 16][4];

#pragma unroll
	for (int dt = 0; dt < HD / 8; dt++)
		o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

	for (int i = 0; i < n_tiles; i++) {
		const int buf = i & 1, j0 = ks + i * BN;

		if (i + 1 < n_tiles)
			load_tile(i + 1, buf ^ 1);
		cp_async_commit();	/* possibly empty: keeps the group count uniform */
		cp_async_wait<1>();	/* tile i (and Q) have landed */
		__syncthreads();
		if (i == 0) {
#pragma unroll
			for (int kk = 0; kk < HD / 16; kk++) {
				const uint16_t *b = sQ + (warp * 16 + gq) * C::LD + kk * 16 + 2 * t4;

				qf[kk][0] = *(const uint32_t *)b;
				qf[kk][1] = *(const uint32_t *)(b + 8 * C::LD);
				qf[kk][2] = *(const uint32_t *)(b + 8);
				qf[kk][3] = *(const uint32_t *)(b + 8 * C::LD + 8);
			}
		}

		/* S = Q K^T: 16 rows x 64 keys per warp, 8 n-tiles of 8 keys. */
		float s[BN / 8][4];
#pragma unroll
		for (int nt = 0; nt < BN / 8; nt++)
			s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
		for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
			for (int np = 0; np < BN / 16; np++) {
				const int mi = lane >> 3, rr = lane & 7;
				uint32_t b0, b1, b2, b3;

				ldsm_x4(b0, b1, b2, b3,
					sK + (buf * BN + np * 16 + (mi >> 1) * 8 + rr) * C::LD + kk * 16 +
						(mi & 1) * 8);
				mma16816(s[2 * np], qf[kk], b0, b1);
				mma16816(s[2 * np + 1], qf[kk], b2, b3);
			}

		/* Scale (log2 units) and mask. */
		const bool full = !a.kv_pos && j0 + BN <= ke && j0 + BN - 1 <= qmin;
#pragma unroll
		for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				float x_lo = s[nt][e] * a.scale_log2, x_hi = s[nt][2 + e] * a.scale_log2;

				if (!full) {
					const int jl = nt * 8 + 2 * t4 + e, j = j0 + jl;
					const int kp = a.kv_pos ? sP[buf * BN + jl] : j;
					const bool ok = j < ke;

					if (!ok || kp > qp_lo)
						x_lo = -INFINITY;
					if (!ok || kp > qp_hi)
						x_hi = -INFINITY;
				}
				s[nt][e] = x_lo;
				s[nt][2 + e] = x_hi;
			}

		/* Online softmax: rows gq (lo) and gq + 8 (hi) of this warp's 16;
		 * the 4 threads of a quad share a row. */
		float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
		for (int nt = 0; nt < BN / 8; nt++) {
			mx_lo = fmaxf(mx_lo, fmaxf(s[nt][0], s[nt][1]));
			mx_hi = fmaxf(mx_hi, fmaxf(s[nt][2], s[nt][3]));
		}
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
		for (int nt = 0; nt < BN / 8; nt++) {
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

		/* O += P V: P from the S registers (the C layout of two n-tiles is
		 * the A layout of one 16-key step), V by ldmatrix.trans. */
#pragma unroll
		for (int kk = 0; kk < BN / 16; kk++) {
			uint32_t pa[4] = {
				pack_bf2(s[2 * kk][0], s[2 * kk][1]),
				pack_bf2(s[2 * kk][2], s[2 * kk][3]),
				pack_bf2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
				pack_bf2(s[2 * kk + 1][2], s[2 * kk + 1][3]),
			};
#pragma unroll
			for (int dp = 0; dp < HD / 16; dp++) {
				const int mi = lane >> 3, rr = lane & 7;
				uint32_t b0, b1, b2, b3;

				ldsm_x4_t(b0, b1, b2, b3,
					  sV + (buf * BN + kk * 16 + (mi & 1) * 8 + rr) * C::LD + dp * 16 +
						  (mi >> 1) * 8);
				mma16816(o[2 * dp], pa, b0, b1);
				mma16816(o[2 * dp + 1], pa, b2, b3);
			}
		}
		__syncthreads();	/* buf is refilled at iteration i + 1 */
	}
	cp_async_wait<0>();

	l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
	l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
	l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
	l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);

	if (!a.part_o) {
		const float i_lo = l_lo > 0.0f ? 1.0f / l_lo : 0.0f;
		const float i_hi = l_hi > 0.0f ? 1.0f / l_hi : 0.0f;

		if (r_lo < R) {
			uint16_t *dst = a.out + ((size_t)(r_lo / G) * a.n_heads + kvh * G + r_lo % G) * HD;
#pragma unroll
			for (int dt = 0; dt < HD / 8; dt++)
				*(uint32_t *)(dst + dt * 8 + 2 * t4) = pack_bf2(o[dt][0] * i_lo, o[dt][1] * i_lo);
		}
		if (r_hi < R) {
			uint16_t *dst = a.out + ((size_t)(r_hi / G) * a.n_heads + kvh * G + r_hi % G) * HD;
#pragma unroll
			for (int dt = 0; dt < HD / 8; dt++)
				*(uint32_t *)(dst + dt * 8 + 2 * t4) = pack_bf2(o[dt][2] * i_hi, o[dt][3] * i_hi);
		}
		return;
	}
	const size_t base = ((size_t)split * a.n_kv_heads + kvh) * R;

	if (r_lo < R) {
		float *po = a.part_o + (base + r_lo) * HD;
#pragma unroll
		for (int dt = 0; dt < HD / 8; dt++)
			*(float2 *)(po + dt * 8 + 2 * t4) = make_float2(o[dt][0], o[dt][1]);
		if (t4 == 0) {
			a.part_m[base + r_lo] = m_lo;
			a.part_l[base + r_lo] = l_lo;
		}
	}
	if (r_hi < R) {
		float *po = a.part_o + (base + r_hi) * HD;
#pragma unroll
		for (int dt = 0; dt < HD / 8; dt++)
			*(float2 *)(po + dt * 8 + 2 * t4) = make_float2(o[dt][2], o[dt][3]);
		if (t4 == 0) {
			a.part_m[base + r_hi] = m_hi;
			a.part_l[base + r_hi] = l_hi;
		}
	}
}

/* Combine split-K partials: row r of KV head blockIdx.y, splits in order. */
__global__ void flash_combine_kernel(uint16_t *out, const float *po, const float *pm,
				     const float *pl, int splits, int R, int n_kv_heads,
				     int n_heads, int G, int hd)
{
	const int r = blockIdx.x, kvh = blockIdx.y;
	float M = -INFINITY, L = 0.0f;

	for (int s = 0; s < splits; s++)
		M = fmaxf(M, pm[((size_t)s * n_kv_heads + kvh) * R + r]);
	for (int s = 0; s < splits; s++) {
		size_t at = ((size_t)s * n_kv_heads + kvh) * R + r;

		if (pm[at] != -INFINITY)
			L += exp2f(pm[at] - M) * pl[at];
	}
	const float inv = L > 0.0f ? 1.0f / L : 0.0f;
	uint16_t *dst = out + ((size_t)(r / G) * n_heads + kvh * G + r % G) * hd;

	for (int d = threadIdx.x; d < hd; d += blockDim.x) {
		float acc = 0.0f;

		for (int s = 0; s < splits; s++) {
			size_t at = ((size_t)s * n_kv_heads + kvh) * R + r;

			if (pm[at] != -INFINITY)
				acc += exp2f(pm[at] - M) * po[at * hd + d];
		}
		dst[d] = f2bf(acc * inv);
	}
}

template <int HD, int WM, int BN>
static int flash_launch(kvmem_cuda_ctx *c, flash_args a, int splits)
{
	typedef flash_cfg<HD, WM, BN> C;
	static int attr_set[64];	/* per device: the dynamic shared memory limit raised */
	const int R = a.n_q * a.group, mt = (R + C::ROWS - 1) / C::ROWS;
	int rc;

	if (c->device < 64 && !attr_set[c->device]) {
		if ((rc = kvmem_cuda_err(cudaFuncSetAttribute(flash_kernel<HD, WM, BN>,
							      cudaFuncAttributeMaxDynamicSharedMemorySize,
							      (int)C::SMEM),
					 "attention: shared memory")))
			return rc;
		attr_set[c->device] = 1;
	}
	flash_kernel<HD, WM, BN><<<dim3(mt, a.n_kv_heads, splits), C::THREADS, C::SMEM, c->stream>>>(a);
	if ((rc = kvmem_cuda_launched("attention")))
		return rc;
	if (splits > 1) {
		flash_combine_kernel<<<dim3(R, a.n_kv_heads), 128, 0, c->stream>>>(
			a.out, a.part_o, a.part_m, a.part_l, splits, R, a.n_kv_heads, a.n_heads, a.group,
			HD);
		return kvmem_cuda_launched("attention: combining splits");
	}
	return 0;
}

/*
 * Tile shapes per version: v2 64-row tiles (4 warps) for prefill, 16 rows
 * (1 warp) for decode, 64-key tiles; v3 128-row tiles (8 warps: each K/V
 * tile serves twice the rows, half the L2 traffic) and, for decode, 32-key
 * tiles (half the shared memory: more blocks per multiprocessor). `per_sm`
 * is how many blocks fit on a multiprocessor (shared memory, registers).
 */
static int flash(kvmem_cuda_ctx *c, flash_args a, int head_dim, int version)
{
	const int R = a.n_q * a.group, few = R <= 16;
	const int wm = few ? 1 : (version == 3 ? 8 : 4), bn = few && version == 3 ? 32 : 64;
	const int rows = 16 * wm, per_sm = few ? (bn == 32 ? 5 : 3) : (wm == 8 ? 1 : 2);
	const long long blocks0 = (long long)((R + rows - 1) / rows) * a.n_kv_heads;
	const int tiles = (a.n_kv + bn - 1) / bn;
	const long long target = (long long)c->sms * per_sm;
	int splits = 1;

	if (blocks0 < target && tiles > 1) {
		long long want = (target + blocks0 - 1) / blocks0;
		int most = tiles / 2 > 1 ? tiles / 2 : 1;	/* >= 2 tiles per split */

		splits = (int)(want < most ? want : most);
		if (splits > 128)
			splits = 128;
	}
	if (splits > 1) {
		int per = (tiles + splits - 1) / splits;
		size_t rows_all, bytes;
		void *p;

		splits = (tiles + per - 1) / per;
		a.keys_per_split = per * bn;
		rows_all = (size_t)splits * a.n_kv_heads * R;
		bytes = rows_all * head_dim * sizeof(float) + 2 * kvmem_align_up(rows_all * sizeof(float), 256);
		if (kvmem_cuda_scratch(c, bytes, &p))
			return kvmem_error_prefix("attention");
		a.part_o = (float *)p;
		a.part_m = (float *)((char *)p + rows_all * head_dim * sizeof(float));
		a.part_l = (float *)((char *)a.part_m + kvmem_align_up(rows_all * sizeof(float), 256));
	} else {
		a.keys_per_split = tiles * bn > 0 ? tiles * bn : bn;
		a.part_o = a.part_m = a.part_l = NULL;
	}
	if (head_dim == 128) {
		if (wm == 1)
			return bn == 32 ? flash_launch<128, 1, 32>(c, a, splits)
					: flash_launch<128, 1, 64>(c, a, splits);
		return wm == 8 ? flash_launch<128, 8, 64>(c, a, splits) : flash_launch<128, 4, 64>(c, a, splits);
	}
	if (wm == 1)
		return bn == 32 ? flash_launch<64, 1, 32>(c, a, splits) : flash_launch<64, 1, 64>(c, a, splits);
	return wm == 8 ? flash_launch<64, 8, 64>(c, a, splits) : flash_launch<64, 4, 64>(c, a, splits);
}

extern "C" int kvmem_cuda_attention_bf16_v(kvmem_cuda_ctx *c, int version, uint16_t *out,
					   const uint16_t *q, const int32_t *q_pos, int n_q,
					   const uint16_t *k, const uint16_t *v,
					   const int32_t *kv_pos, int n_kv, size_t kv_stride,
					   int n_heads, int n_kv_heads, int head_dim, float scale)
{
	flash_args a;

	if (n_q < 0 || n_kv < 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads ||
	    head_dim <= 0 || kv_stride < (size_t)n_kv)
		return kvmem_error(EINVAL, "attention: bad shape (%d queries, %d keys of stride %zu, "
				   "%d/%d heads, head_dim %d)", n_q, n_kv, kv_stride, n_heads,
				   n_kv_heads, head_dim);
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
	if (version != 2 && version != 3)
		return kvmem_error(EINVAL, "attention: no version %d (1, 2, 3)", version);
	if (head_dim != 64 && head_dim != 128)
		return kvmem_error(ENOTSUP, "attention: head_dim %d (the flash kernel takes 64 or 128)",
				   head_dim);
	a.out = out;
	a.q = q;
	a.k = k;
	a.v = v;
	a.q_pos = q_pos;
	a.kv_pos = kv_pos;
	a.n_q = n_q;
	a.n_kv = n_kv;
	a.n_heads = n_heads;
	a.n_kv_heads = n_kv_heads;
	a.group = n_heads / n_kv_heads;
	a.kv_stride = (long long)kv_stride;
	a.scale_log2 = scale * 1.4426950408889634f;
	return flash(c, a, head_dim, version);
}

/*
 * The main path: v2, except decode over long views, where v3's 32-key tiles
 * (more blocks per multiprocessor, more splits) read faster. Measured on the
 * H200 (2026-11-30, Qwen3-8B heads): 1 query over 32768 keys v2 71 us, v3
 * 87 us; over 131072 keys v2 281 us, v3 196 us (0.45 and 0.64 of the copy
 * rate); the switch sits between the two. The choice depends only on the
 * shapes, so equal shapes still give equal bits.
 */
#define LONG_DECODE 65536

extern "C" int kvmem_cuda_attention_bf16(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
					 const int32_t *q_pos, int n_q, const uint16_t *k,
					 const uint16_t *v, const int32_t *kv_pos, int n_kv,
					 size_t kv_stride, int n_heads, int n_kv_heads, int head_dim,
					 float scale)
{
	int few = n_kv_heads > 0 && (long long)n_q * (n_heads / n_kv_heads) <= 16;

	return kvmem_cuda_attention_bf16_v(c, few && n_kv >= LONG_DECODE ? 3 : 2, out, q, q_pos, n_q,
					   k, v, kv_pos, n_kv, kv_stride, n_heads, n_kv_heads,
					   head_dim, scale);
}

/* SPDX-License-Identifier: MIT */
/*
 * The flash kernel of attention versions 2-4 (attention.cu says what each
 * version is and launches it), over a bf16 view or, with F8, an fp8 one
 * (e4m3 K and V rows with an fp32 power-of-two scale each: the prefill
 * chunks of the cuda backend's fp8 views, kvmem_cuda_attention_fp8).
 *
 * F8 streams each 64-key tile's e4m3 bytes and row scales through a
 * two-stage cp.async ring, turns the bytes into bf16 in one shared tile
 * (unscaled: exact, e4m3x4_bf16) and puts the scales where decode v5's
 * tile form puts them: K's on the scores, V's on P before its rounding.
 * Each scale is a power of two, so Q (K8 s)^T = (Q K8^T) s and bf16(p s)
 * V8 = bf16(p) (V8 s): the bits of this kernel over the same rows
 * dequantised to bf16 (kvmem_cuda_fp8_view_bf16), which the fp8 views'
 * prefill read from a one-layer bf16 scratch before (2026-12-04). The
 * shared memory is the bf16 form's (one bf16 tile for two, and the ring's
 * 33 KB): two blocks an SM still.
 */
#ifndef KVMEM_KERNELS_CUDA_ATTENTION_FLASH_CUH
#define KVMEM_KERNELS_CUDA_ATTENTION_FLASH_CUH

#include <limits.h>

#include "attention_dec.cuh"
#include "fp8.cuh"

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
	/* F8: the K and V row scales, [n_kv_heads][kv_stride] */
	const float *ks, *vs;
};

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
	/* F8: one bf16 K and V tile, then two stages of (K bytes, V bytes
	 * [BN][HD], K scales, V scales [BN]) */
	static constexpr size_t RAW_STAGE = (size_t)2 * BN * HD + (size_t)2 * BN * 4;
	static constexpr size_t SMEM8 = (size_t)(ROWS * LD + 2 * BN * LD) * 2 + 2 * RAW_STAGE;
};

template <int HD, int WM, int BN, int MT, int F8 = 0>
__global__ void __launch_bounds__(32 * WM) flash_kernel(const flash_args a)
{
	typedef flash_cfg<HD, WM, BN, MT> C;
	extern __shared__ __align__(16) unsigned char smem_raw[];
	uint16_t *sQ = (uint16_t *)smem_raw;
	uint16_t *sK = sQ + C::ROWS * C::LD;	/* [2][BN][LD]; F8 [1][BN][LD] */
	uint16_t *sV = sK + (F8 ? 1 : 2) * BN * C::LD;	/* the same */
	int *sP = (int *)(sV + 2 * BN * C::LD);	/* [2][BN] key positions (kv_pos given) */
	unsigned char *sRaw = (unsigned char *)(sV + BN * C::LD);	/* F8: [2][RAW_STAGE] */
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

		if (F8) {	/* the tile's e4m3 bytes and scales into stage buf */
			const size_t row0 = (size_t)kvh * a.kv_stride + j0;
			const unsigned char *k8 = (const unsigned char *)a.k + row0 * HD;
			const unsigned char *v8 = (const unsigned char *)a.v + row0 * HD;
			unsigned char *rk = sRaw + (size_t)buf * C::RAW_STAGE, *rv = rk + BN * HD;
			float *rks = (float *)(rv + BN * HD);

			for (int c = tid; c < BN * (HD / 16); c += C::THREADS) {
				const int r = c / (HD / 16);
				const bool ok = j0 + r < ke;
				const size_t off = (size_t)r * HD + (c % (HD / 16)) * 16;

				cp_async16(rk + off, ok ? k8 + off : (const void *)a.k, ok);
				cp_async16(rv + off, ok ? v8 + off : (const void *)a.v, ok);
			}
			for (int r = tid; r < 2 * BN; r += C::THREADS) {
				const int isv = r >= BN, j = r % BN;
				const bool ok = j0 + j < ke;

				cp_async4(rks + r, ok ? (isv ? a.vs : a.ks) + row0 + j : a.ks, ok);
			}
			return;
		}
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
		const uint32_t kbuf = sKa + (F8 ? 0 : buf * BN * C::LD * 2);
		const uint32_t vbuf = sVa + (F8 ? 0 : buf * BN * C::LD * 2);
		/* F8: stage buf's row scales (K's on the scores, V's on P) */
		const float *rks = (const float *)(sRaw + (size_t)buf * C::RAW_STAGE + 2 * BN * HD);
		const float *rvs = rks + BN;

		if (i + 1 < n_tiles)
			load_tile(i + 1, buf ^ 1);
		cp_async_commit();	/* possibly empty: keeps the group count uniform */
		cp_async_wait<1>();	/* tile i (and Q) have landed */
		__syncthreads();
		if (F8) {
			/* Stage buf's bytes into the bf16 tiles, unscaled, in one
			 * pass: byte permutes (e4m3_pair_bf16, exact), the NaN codes
			 * noted on the way; a thread that met one writes its share
			 * again byte by byte (the twin's 0x7fc0). Every thread read
			 * the tiles last before the barrier that ended iteration
			 * i - 1. (Before 2026-12-04 a NaN pass read the tile first
			 * and cvt converted it: 32 tokens over 32K keys 122 us,
			 * now 103-105; 512 over 128K 6324 us, now 4998-5051.) */
			const unsigned char *rk = sRaw + (size_t)buf * C::RAW_STAGE, *rv = rk + BN * HD;
			constexpr int CH = BN * (HD / 8);	/* 8-byte chunks of a tile */
			uint32_t nan = 0;

#pragma unroll
			for (int isv = 0; isv < 2; isv++)	/* K's tile, then V's */
#pragma unroll 8
				for (int c = tid; c < CH; c += C::THREADS) {
					const uint2 u = *(const uint2 *)((isv ? rv : rk) + c * 8);

					nan = e4m3_nan_acc(nan, u.x, u.y);
					*(uint4 *)((isv ? sV : sK) + (c / (HD / 8)) * C::LD + (c % (HD / 8)) * 8) =
						make_uint4(e4m3_pair_bf16<E4_LO>(u.x, 0),
							   e4m3_pair_bf16<E4_HI>(u.x, 0),
							   e4m3_pair_bf16<E4_LO>(u.y, 0),
							   e4m3_pair_bf16<E4_HI>(u.y, 0));
				}
			if (nan & 0x80808080u)
				for (int c = tid; c < 2 * CH; c += C::THREADS) {
					const int isv = c >= CH, cc = c % CH;
					const unsigned char *src = (isv ? rv : rk) + cc * 8;
					uint16_t *dst = (isv ? sV : sK) + (cc / (HD / 8)) * C::LD + (cc % (HD / 8)) * 8;

					for (int j = 0; j < 8; j++)
						dst[j] = e4m3_bf16(src[j], e4m3_to_f32(src[j]), 1.0f);
				}
			__syncthreads();
		}
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
					/* F8: a power of two, S of the rows dequantised */
					const float kscale = F8 ? rks[nt * 8 + 2 * t4 + e] : 1.0f;
					float x_lo = (F8 ? s[m][nt][e] * kscale : s[m][nt][e]) * a.scale_log2;
					float x_hi = (F8 ? s[m][nt][2 + e] * kscale : s[m][nt][2 + e]) *
						     a.scale_log2;

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
		 * the A layout of one 16-key step), V by ldmatrix.trans. F8: P
		 * times V's row scales before its rounding (the sums above
		 * took P as it was). */
		if (F8)
#pragma unroll
			for (int m = 0; m < MT; m++)
#pragma unroll
				for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
					for (int e = 0; e < 2; e++) {
						const float vscale = rvs[nt * 8 + 2 * t4 + e];

						s[m][nt][e] *= vscale;
						s[m][nt][2 + e] *= vscale;
					}
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


#endif

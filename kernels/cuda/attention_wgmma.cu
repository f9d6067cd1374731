// SPDX-License-Identifier: MIT
/*
 * Prefill attention v6: the flash kernel on Hopper's warpgroup MMA (wgmma,
 * sm_90a; this file alone is built for compute_90a / sm_90a, cuda.mk).
 * Same contract as v4 (kernels/cuda/attention.cu; twin kvmem_attention_bf16):
 * bf16 Q [n][H][128] at given positions, the view's K/V [Hkv][stride][128]
 * bf16, keys at slot = position (kv_pos NULL), causal by position, GQA,
 * fp32 softmax and accumulation, P rounded to bf16 for P V, bf16 out.
 * attention.cu calls it for version 6 and runs v4 where it answers 1 (not
 * sm_90, head_dim not 128, explicit key positions, decode shapes); its main
 * path also runs v4 when the row tiles would not fill the GPU (v4 splits
 * the keys there, v6 does not: kvmem_cuda_attention_v6_fills).
 *
 * A block owns 128 rows of one KV head, a row being one (query token,
 * query head of the group) as in v4, and three warpgroups:
 *   - two consumers (warps 4-11), 64 rows each: S = Q K^T by wgmma
 *     m64n128k16 with Q and K in shared memory, the online softmax in
 *     registers (ex2, log2(e) and the scale folded into one FMA), O += P V
 *     by wgmma m64n128k16 with P from registers (bf16) and V from shared
 *     memory read transposed (MN-major: the same bytes as K's layout). As
 *     in FlashAttention-3, step i issues S_i and then P_{i-1} V_{i-1} to
 *     the tensor cores back to back and works out S_i's softmax while the
 *     second runs; and (the main form) the two warpgroups take turns at
 *     issuing (ping-pong on named barriers), so that one's softmax runs
 *     while the other's products hold the tensor cores;
 *   - a producer (warps 0-3) streaming 128-key K and V tiles through a
 *     ring of stages (3 in the main form): one thread issues the copy
 *     engine's tensor loads (TMA, cp.async.bulk.tensor, two 64-column boxes
 *     a tile, zero-filled past the key count); the other forms' 128
 *     threads use cp.async (cp.async.mbarrier.arrive.noinc). Each K and
 *     each V tile completes on its own mbarrier, and is handed back by each
 *     consumer warp on an "empty" mbarrier once its MMAs are done.
 * The forms (v6_forms, host side) and what they measured: Documentation/
 * kernels.md.
 * setmaxnreg gives the producer 40 registers and the consumers 232 (with
 * a single producer warp, 288 threads, ptxas capped the kernel at 168
 * registers and spilled).
 * Shared-memory tiles use the 128-byte swizzle of the wgmma descriptors:
 * a tile of rows x 128 bf16 is two 64-column halves, row r of a half at r *
 * 128 bytes, its 16-byte chunk c at (c ^ (r % 8)) * 16; halves and stages
 * start on 1024-byte boundaries (the copy engine's 128-byte swizzle is the
 * same). Only tiles that reach past a warp's smallest query position (or
 * past the key count) are masked; tiles past the block's last position are
 * never loaded; past a warpgroup's last, they are skipped by it without
 * ping-pong and masked whole with it.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>	/* CUtensorMap (the driver's encoder is looked up, not linked) */
#include <cudaTypedefs.h>

#include "cuda_int.h"

#define V6_HD 128
#define V6_BN 128		/* keys per tile */
#define V6_ROWS 128		/* rows per block: two warpgroups of 64 */
#define V6_THREADS (3 * 128)	/* a producer warpgroup, two consumers */
#define V6_REG_PRODUCER 40	/* setmaxnreg: 128 x 40 + 256 x 232 <= 64K */
#define V6_REG_CONSUMER 232
#define V6_Q_BYTES (V6_ROWS * V6_HD * 2)	/* 32 KB */
#define V6_T_BYTES (V6_BN * V6_HD * 2)	/* one K or V tile: 32 KB */
#define V6_HALF (V6_BN * 128)		/* bytes of a 64-column half of a tile */
/* Dynamic shared memory of a block with a ring of st stages (3: 230560 of
 * the 232448 bytes a block may have). */
#define V6_SMEM(st) (1024 + V6_Q_BYTES + 2 * (st) * V6_T_BYTES + 4 * (st) * 8 + 64)

/* The main path's form of the kernel (v6_forms). */
#define V6_FORM_MAIN 2

struct v6_args {
	CUtensorMap tk, tv;	/* TMA forms: K and V as [Hkv][n_kv][128] bf16 */
	uint16_t *out;
	const uint16_t *q, *k, *v;
	const int32_t *q_pos;
	int n_q, n_kv, n_heads, group;
	long long kv_stride;
	float scale_log2;	/* scale * log2(e) */
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define V6_DEVICE 1
#endif

/* ---- PTX helpers ---------------------------------------------------------- */
#ifdef V6_DEVICE
__device__ __forceinline__ void v6_cp16(uint32_t s, const void *g, bool valid)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g),
		     "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, int count)
{
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity)
{
	asm volatile("{\n"
		     ".reg .pred done;\n"
		     "WAIT_%=:\n"
		     "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
		     "@!done bra WAIT_%=;\n"
		     "}\n" ::"r"(bar),
		     "r"(parity)
		     : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
	asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

/* The barrier counts one arrival when this thread's earlier cp.async are done. */
__device__ __forceinline__ void mbar_cp_arrive(uint32_t bar)
{
	asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, int bytes)
{
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
		     : "memory");
}

/* A box of the tensor map at (c0, c1, c2) into shared memory at s, its bytes
 * counted on bar; rows past the map's end come in as zeros. */
__device__ __forceinline__ void tma_load3(uint32_t s, const CUtensorMap *m, uint32_t bar, int c0,
					  int c1, int c2)
{
	asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
		     " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(s),
		     "l"((uint64_t)m), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
		     : "memory");
}

/* The producer's side of one K or V tile in stage s of the ring: wait until
 * the consumers have handed the stage back (from the second lap on, wait),
 * then fill it. By the copy engine (one thread, two 64-column boxes, rows
 * past the map's end as zeros) ... */
__device__ __forceinline__ void v6_tile_tma(uint32_t d, const CUtensorMap *m, uint32_t empty,
					    uint32_t full, bool wait, int ph, int row, int kvh)
{
	if (wait)
		mbar_wait(empty, ph);
	mbar_expect_tx(full, V6_T_BYTES);
	tma_load3(d, m, full, 0, row, kvh);
	tma_load3(d + V6_HALF, m, full, 64, row, kvh);
}

/* ... or by the producer warpgroup's 128 threads through cp.async: this
 * thread's 16 chunks (rows 8 it + its first, 1024 bytes apart swizzled),
 * zero-filled from the row `left` on (reading `zero`, any valid address),
 * one arrival on full when they have landed. */
__device__ __forceinline__ void v6_tile_cp(uint32_t d, const uint16_t *g, const uint16_t *zero,
					   int left, uint32_t empty, uint32_t full, bool wait, int ph)
{
	if (wait)
		mbar_wait(empty, ph);
#pragma unroll 4
	for (int it = 0; it < V6_BN / 8; it++, d += 1024, g += 8 * V6_HD)
		v6_cp16(d, 8 * it < left ? g : zero, 8 * it < left);
	mbar_cp_arrive(full);
}

/* cp.async writes through the generic proxy, wgmma reads through the async
 * one. */
__device__ __forceinline__ void fence_async_smem(void)
{
	asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* A shared-memory matrix descriptor, 128-byte swizzle. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
	return (uint64_t)((addr & 0x3ffff) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
	       ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}

/* Named barriers (0 is __syncthreads): count threads, a multiple of 32. */
template <int N> __device__ __forceinline__ void bar_sync(int id)
{
	asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(N) : "memory");
}

template <int N> __device__ __forceinline__ void bar_arrive(int id)
{
	asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(N) : "memory");
}

__device__ __forceinline__ void wg_fence(void)
{
	asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wg_commit(void)
{
	asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N> __device__ __forceinline__ void wg_wait(void)
{
	asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* 2^x (ex2.approx, flush to zero): 2^-inf = 0. */
__device__ __forceinline__ float v6_ex2(float x)
{
	float y;

	asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
	return y;
}

/* Keeps the compiler from reading or writing an accumulator across the
 * asynchronous MMA (between its issue and the wait). */
__device__ __forceinline__ void wg_touch(float *d)
{
#pragma unroll
	for (int i = 0; i < 64; i++)
		asm volatile("" : "+f"(d[i])::"memory");
}

#define V6_D64                                                                                    \
	"{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,"  \
	"%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45," \
	"%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define V6_A8(d, i)                                                                               \
	"+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
		"+f"(d[i + 6]), "+f"(d[i + 7])
#define V6_A64(d)                                                                                 \
	V6_A8(d, 0), V6_A8(d, 8), V6_A8(d, 16), V6_A8(d, 24), V6_A8(d, 32), V6_A8(d, 40),         \
		V6_A8(d, 48), V6_A8(d, 56)

/* d (+)= A B, m64n128k16: A and B from shared memory, both K-major. */
__device__ __forceinline__ void wg_ss(float *d, uint64_t a, uint64_t b, int acc)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " V6_D64
		     ", %64, %65, p, 1, 1, 0, 0;\n}\n"
		     : V6_A64(d)
		     : "l"(a), "l"(b), "r"(acc)
		     : "memory");
}

/* d += A B, m64n128k16: A from registers (bf16 pairs), B from shared
 * memory MN-major (transposed). */
__device__ __forceinline__ void wg_rs(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
				      uint64_t b)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " V6_D64
		     ", {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
		     : V6_A64(d)
		     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1)
		     : "memory");
}

__device__ __forceinline__ uint32_t v6_pack(float lo, float hi)
{
	__nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);

	return *(uint32_t *)&h;
}
#endif

/* ---- the kernel ------------------------------------------------------------ */
template <int V6_STAGES, bool PP, bool TMA>
__global__ void __launch_bounds__(V6_THREADS, 1) attn_v6_kernel(const __grid_constant__ v6_args a)
{
#ifdef V6_DEVICE
	extern __shared__ unsigned char v6_smem_raw[];
	const uint32_t raw = (uint32_t)__cvta_generic_to_shared(v6_smem_raw);
	const uint32_t base = (raw + 1023) & ~1023u;
	const uint32_t sQ = base, sK = sQ + V6_Q_BYTES, sV = sK + V6_STAGES * V6_T_BYTES;
	/* mbarriers: K and V landed (fullK, fullV), K and V read (emptyK, emptyV) */
	const uint32_t bars = sV + V6_STAGES * V6_T_BYTES;
	const uint32_t fullK = bars, fullV = bars + 8 * V6_STAGES;
	const uint32_t emptyK = bars + 16 * V6_STAGES, emptyV = bars + 24 * V6_STAGES;
	int *s_pos = (int *)(v6_smem_raw + (bars - raw) + 32 * V6_STAGES);	/* [2] min, [2] max */

	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
	const int G = a.group, R = a.n_q * G;
	const int mt = gridDim.x - 1 - blockIdx.x;	/* heavy (late) tiles first */
	const int kvh = blockIdx.y, row0 = mt * V6_ROWS;

	if (tid == 0) {
		for (int s = 0; s < V6_STAGES; s++) {
			mbar_init(fullK + 8 * s, TMA ? 1 : 128);	/* the producer's threads */
			mbar_init(fullV + 8 * s, TMA ? 1 : 128);
			mbar_init(emptyK + 8 * s, 8);	/* the consumer warps */
			mbar_init(emptyV + 8 * s, 8);
		}
		s_pos[0] = s_pos[1] = INT_MAX;
		s_pos[2] = s_pos[3] = INT_MIN;
		asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
	}
	__syncthreads();
	if (tid < V6_ROWS) {
		/* Each row's position; the warpgroups' (64 rows each) smallest
		 * and largest. */
		const int r = row0 + tid;

		if (r < R) {
			const int p = a.q_pos[r / G];

			atomicMin(&s_pos[tid >> 6], p);
			atomicMax(&s_pos[2 + (tid >> 6)], p);
		}
	}
	__syncthreads();
	const int qmax = max(s_pos[2], s_pos[3]);
	const int ke = min(a.n_kv, qmax == INT_MIN ? 0 : (qmax == INT_MAX ? qmax : qmax + 1));
	const int n_tiles = ke > 0 ? (ke + V6_BN - 1) / V6_BN : 0;

	if (warp < 4) {
		/* ---- producer warpgroup: K and V tiles through the ring ---- */
		asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(V6_REG_PRODUCER));
		if constexpr (TMA) {
			/* One thread: each tile two boxes of 64 columns x 128 rows
			 * (the halves), in the 128-byte swizzle of the map. */
			if (tid == 0)
				for (int i = 0; i < n_tiles; i++) {
					const int s = i % V6_STAGES, ph = ((i / V6_STAGES) - 1) & 1;
					const uint32_t dk = sK + s * V6_T_BYTES, dv = sV + s * V6_T_BYTES;

					v6_tile_tma(dk, &a.tk, emptyK + 8 * s, fullK + 8 * s, i >= V6_STAGES,
						    ph, i * V6_BN, kvh);
					v6_tile_tma(dv, &a.tv, emptyV + 8 * s, fullV + 8 * s, i >= V6_STAGES,
						    ph, i * V6_BN, kvh);
				}
			return;
		}
		const uint16_t *kh = a.k + (size_t)kvh * a.kv_stride * V6_HD;
		const uint16_t *vh = a.v + (size_t)kvh * a.kv_stride * V6_HD;
		/* Thread's chunks: rows 8 it + rs (it = 0..15), 16-byte chunk c;
		 * r % 8 == rs, so the swizzled offset moves 1024 bytes an it. */
		const int c = tid & 15, rs = tid >> 4;
		const uint32_t toff = (c >> 3) * V6_HALF + rs * 128 + (((c & 7) ^ rs) << 4);

		for (int i = 0; i < n_tiles; i++) {
			const int s = i % V6_STAGES, ph = ((i / V6_STAGES) - 1) & 1;
			/* rows left from this thread's first one (at most 16 used) */
			const int left = a.n_kv - (i * V6_BN + rs);
			const size_t first = (size_t)(i * V6_BN + rs) * V6_HD + c * 8;

			v6_tile_cp(sK + s * V6_T_BYTES + toff, kh + first, kh, left, emptyK + 8 * s,
				   fullK + 8 * s, i >= V6_STAGES, ph);
			v6_tile_cp(sV + s * V6_T_BYTES + toff, vh + first, vh, left, emptyV + 8 * s,
				   fullV + 8 * s, i >= V6_STAGES, ph);
		}
		asm volatile("cp.async.wait_all;\n" ::: "memory");
	} else {
		/* ---- consumers: warpgroup wg, rows row0 + 64 wg ... + 63 ---- */
		asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(V6_REG_CONSUMER));
		const int wg = (warp >> 2) - 1, wq = warp & 3, gq = lane >> 2, t4 = lane & 3;
		const uint32_t sQw = sQ + wg * (V6_Q_BYTES / 2);

		/* Q: 64 rows x 16 chunks, 8 per thread, zero past the rows. */
		for (int e = tid & 127; e < 64 * 16; e += 128) {
			const int r = e >> 4, c = e & 15, rr = row0 + wg * 64 + r;
			const bool ok = rr < R;
			const uint16_t *src = ok ? a.q + ((size_t)(rr / G) * a.n_heads + kvh * G + rr % G) * V6_HD +
						      c * 8 : a.q;

			v6_cp16(sQw + (c >> 3) * (64 * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4), src, ok);
		}
		asm volatile("cp.async.wait_all;\n" ::: "memory");
		fence_async_smem();
		asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");

		const int r_lo = row0 + wg * 64 + wq * 16 + gq, r_hi = r_lo + 8;
		const int qp_lo = r_lo < R ? a.q_pos[r_lo / G] : INT_MIN;
		const int qp_hi = r_hi < R ? a.q_pos[r_hi / G] : INT_MIN;
		/* The warp's smallest position (rows past R do not count): tiles
		 * wholly at or below it need no mask. */
		int wmin = min(r_lo < R ? qp_lo : INT_MAX, r_hi < R ? qp_hi : INT_MAX);

		for (int o = 16; o > 0; o >>= 1)
			wmin = min(wmin, __shfl_xor_sync(0xffffffffu, wmin, o));
		const int wg_max = s_pos[2 + wg];
		/* Tiles this warpgroup computes: those starting at or below its last
		 * position (the rest it only hands back). */
		const int n_mine = PP ? n_tiles : (wg_max < 0 ? 0 : min(n_tiles, wg_max / V6_BN + 1));
		const float sl2 = a.scale_log2;

		float o[64], s[64];
		uint32_t p[32];
		float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
		float al_lo = 1.0f, al_hi = 1.0f;	/* the factors O is still to be scaled by */

	#pragma unroll
		for (int i = 0; i < 64; i++)
			o[i] = s[i] = 0.0f;
	#pragma unroll
		for (int i = 0; i < 32; i++)
			p[i] = 0;
		const uint64_t dq0 = wg_desc(sQw, 16, 1024);

		/* Issue S = Q K^T over tile i's K (stage st): 8 k-steps of 16. */
		auto issue_s = [&](int st) {
			const uint64_t dk0 = wg_desc(sK + st * V6_T_BYTES, 16, 1024);

	#pragma unroll
			for (int kk = 0; kk < V6_HD / 16; kk++) {
				/* k step kk: half kk / 4, 32 bytes further per step within it */
				const uint32_t qo = ((kk >> 2) * (64 * 128) + (kk & 3) * 32) >> 4;
				const uint32_t ko = ((kk >> 2) * V6_HALF + (kk & 3) * 32) >> 4;

				wg_ss(s, dq0 + qo, dk0 + ko, kk > 0);
			}
		};
		/* Issue O += P V over V at stage st: V MN-major, 64-column halves
		 * V6_HALF apart (LBO), 8-key groups 1024 apart (SBO), 16 keys (2048
		 * bytes) a step. */
		auto issue_pv = [&](int st) {
			const uint64_t dv0 = wg_desc(sV + st * V6_T_BYTES, V6_HALF, 1024);

	#pragma unroll
			for (int kk = 0; kk < V6_BN / 16; kk++)
				wg_rs(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
				      dv0 + ((kk * 2048) >> 4));
		};
		/* Mask tile i's scores in s, the online softmax: s becomes 2^(x - max)
		 * with x = score * scale * log2(e); returns the factors (al_lo, al_hi)
		 * the running output is to be scaled by. */
		auto softmax = [&](int i, float &al_lo, float &al_hi) {
			const int j0 = i * V6_BN;

			if (!(j0 + V6_BN <= a.n_kv && j0 + V6_BN - 1 <= wmin)) {
				/* Key j = j0 + 8 n + 2 t4 + e: past the keys or the row. */
	#pragma unroll
				for (int n = 0; n < V6_BN / 8; n++)
	#pragma unroll
					for (int e = 0; e < 2; e++) {
						const int j = j0 + 8 * n + 2 * t4 + e;

						if (j >= a.n_kv || j > qp_lo)
							s[4 * n + e] = -INFINITY;
						if (j >= a.n_kv || j > qp_hi)
							s[4 * n + 2 + e] = -INFINITY;
					}
			}
			/* Rows gq (lo) and gq + 8 (hi); the quad's 4 lanes share a row.
			 * The max of the raw scores (the scale is positive). */
			float mx_lo = -INFINITY, mx_hi = -INFINITY;
	#pragma unroll
			for (int n = 0; n < V6_BN / 8; n++) {
				mx_lo = fmaxf(mx_lo, fmaxf(s[4 * n], s[4 * n + 1]));
				mx_hi = fmaxf(mx_hi, fmaxf(s[4 * n + 2], s[4 * n + 3]));
			}
			mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
			mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
			mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
			mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
			const float mn_lo = fmaxf(m_lo, mx_lo * sl2), mn_hi = fmaxf(m_hi, mx_hi * sl2);
			/* A row that has seen nothing yet subtracts 0: every p is 0. */
			const float b_lo = mn_lo == -INFINITY ? 0.0f : mn_lo;
			const float b_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;
			float rs_lo = 0.0f, rs_hi = 0.0f;

			al_lo = v6_ex2(m_lo - b_lo);
			al_hi = v6_ex2(m_hi - b_hi);
	#pragma unroll
			for (int n = 0; n < V6_BN / 8; n++) {
				s[4 * n] = v6_ex2(fmaf(s[4 * n], sl2, -b_lo));
				s[4 * n + 1] = v6_ex2(fmaf(s[4 * n + 1], sl2, -b_lo));
				s[4 * n + 2] = v6_ex2(fmaf(s[4 * n + 2], sl2, -b_hi));
				s[4 * n + 3] = v6_ex2(fmaf(s[4 * n + 3], sl2, -b_hi));
				rs_lo += s[4 * n] + s[4 * n + 1];
				rs_hi += s[4 * n + 2] + s[4 * n + 3];
			}
			l_lo = l_lo * al_lo + rs_lo;
			l_hi = l_hi * al_hi + rs_hi;
			m_lo = mn_lo;
			m_hi = mn_hi;
		};
		/* P in bf16, the A fragments of the 8 key steps: the accumulator
		 * layout of n-tiles 2 kk, 2 kk + 1 is the A layout of one 16-key step. */
		auto pack_p = [&]() {
	#pragma unroll
			for (int kk = 0; kk < V6_BN / 16; kk++) {
				p[4 * kk] = v6_pack(s[8 * kk], s[8 * kk + 1]);
				p[4 * kk + 1] = v6_pack(s[8 * kk + 2], s[8 * kk + 3]);
				p[4 * kk + 2] = v6_pack(s[8 * kk + 4], s[8 * kk + 5]);
				p[4 * kk + 3] = v6_pack(s[8 * kk + 6], s[8 * kk + 7]);
			}
		};
		/* Hand a stage's K or V back to the producer (each warp once). */
		auto release = [&](uint32_t bar) {
			__syncwarp();
			if (lane == 0)
				mbar_arrive(bar);
		};

		/*
		 * The pipeline (FlashAttention-3's overlap within a warpgroup): at
		 * step i the tensor cores run S_i = Q K_i^T and then O += P_{i-1}
		 * V_{i-1} back to back while the warps, once S_i is in, work out its
		 * softmax; P_i is packed for the next step once the P V product is
		 * done. Without PP, O is rescaled by tile i's factor then; with PP,
		 * by tile i - 1's between the two issues (S_i runs meanwhile).
		 *
		 * PP, the ping-pong of FlashAttention-3: the two warpgroups take
		 * turns at issuing their products (named barrier 3 + wg is wg's
		 * turn), so that one's softmax runs while the other's products hold
		 * the tensor cores. Both run every tile of the block (n_mine =
		 * n_tiles; a tile past a warpgroup's rows is masked whole), hence
		 * the same n_tiles + 1 turns: warpgroup 1 gives warpgroup 0 its
		 * first turn and skips its own last hand-over, which nobody would
		 * wait for.
		 */
		auto turn = [&]() {
			if constexpr (PP)
				bar_sync<256>(3 + wg);
		};
		auto pass = [&](bool last) {
			if constexpr (PP)
				if (!(last && wg == 1))
					bar_arrive<256>(4 - wg);
		};
		auto rescale = [&]() {
	#pragma unroll
			for (int n = 0; n < V6_HD / 8; n++) {
				o[4 * n] *= al_lo;
				o[4 * n + 1] *= al_lo;
				o[4 * n + 2] *= al_hi;
				o[4 * n + 3] *= al_hi;
			}
		};

		if (PP && wg == 1 && n_mine > 0)
			bar_arrive<256>(3);
		if (n_mine > 0) {
			mbar_wait(fullK, 0);
			if constexpr (!TMA)
				fence_async_smem();
			turn();
			wg_touch(s);
			wg_fence();
			issue_s(0);
			wg_commit();
			pass(false);
			wg_wait<0>();
			wg_touch(s);
			release(emptyK);
			softmax(0, al_lo, al_hi);
			pack_p();
		}
		for (int i = 1; i < n_mine; i++) {
			const int st = i % V6_STAGES, ph = (i / V6_STAGES) & 1;
			const int sp = (i - 1) % V6_STAGES, pp = ((i - 1) / V6_STAGES) & 1;

			mbar_wait(fullK + 8 * st, ph);
			mbar_wait(fullV + 8 * sp, pp);
			if constexpr (!TMA)
				fence_async_smem();
			turn();
			wg_touch(s);
			wg_touch(o);
			wg_fence();
			issue_s(st);
			wg_commit();
			if constexpr (PP) {
				rescale();
				wg_touch(o);
				wg_fence();
			}
			issue_pv(sp);
			wg_commit();
			pass(false);
			wg_wait<1>();	/* S_i is in; P V still running */
			wg_touch(s);
			release(emptyK + 8 * st);
			softmax(i, al_lo, al_hi);
			wg_wait<0>();
			wg_touch(o);
			release(emptyV + 8 * sp);
			if constexpr (!PP)
				rescale();
			pack_p();
		}
		if (n_mine > 0) {
			const int sp = (n_mine - 1) % V6_STAGES, pp = ((n_mine - 1) / V6_STAGES) & 1;

			mbar_wait(fullV + 8 * sp, pp);
			if constexpr (!TMA)
				fence_async_smem();
			turn();
			if constexpr (PP)
				rescale();
			wg_touch(o);
			wg_fence();
			issue_pv(sp);
			wg_commit();
			pass(true);
			wg_wait<0>();
			wg_touch(o);
			release(emptyV + 8 * sp);
		}
		/* Tiles past this warpgroup's rows: handed back once they land. */
		for (int i = n_mine; i < n_tiles; i++) {
			const int st = i % V6_STAGES, ph = (i / V6_STAGES) & 1;

			mbar_wait(fullK + 8 * st, ph);
			release(emptyK + 8 * st);
			mbar_wait(fullV + 8 * st, ph);
			release(emptyV + 8 * st);
		}

		/* Normalise and store: row lo / hi, columns 8 n + 2 t4, + 1. */
		l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
		l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
		l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
		l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
		const float i_lo = l_lo > 0.0f ? 1.0f / l_lo : 0.0f, i_hi = l_hi > 0.0f ? 1.0f / l_hi : 0.0f;

		if (r_lo < R) {
			uint16_t *dst = a.out + ((size_t)(r_lo / G) * a.n_heads + kvh * G + r_lo % G) * V6_HD;
	#pragma unroll
			for (int n = 0; n < V6_HD / 8; n++)
				*(uint32_t *)(dst + 8 * n + 2 * t4) = v6_pack(o[4 * n] * i_lo, o[4 * n + 1] * i_lo);
		}
		if (r_hi < R) {
			uint16_t *dst = a.out + ((size_t)(r_hi / G) * a.n_heads + kvh * G + r_hi % G) * V6_HD;
	#pragma unroll
			for (int n = 0; n < V6_HD / 8; n++)
				*(uint32_t *)(dst + 8 * n + 2 * t4) = v6_pack(o[4 * n + 2] * i_hi, o[4 * n + 3] * i_hi);
		}
	}
#endif
}

/* ---- host side -------------------------------------------------------------- */

/* Per device: 0 not checked, 1 v6 runs here, -1 it does not (not sm_90, or
 * no sm_90a image). Set when a context is made (never in a capture). */
static int v6_ok[64];

/* The kernel's forms (template arguments: ring stages, ping-pong, TMA).
 * KVMEM_CUDA_V6 (an index, read when the first context is made) or
 * kvmem_cuda_attention_v6_form picks another than V6_FORM_MAIN for
 * comparisons. The TMA form runs as its cp.async twin (alt) where the
 * driver has no tensor-map encoder. */
typedef void (*v6_fn)(const v6_args);
static const struct {
	v6_fn fn;
	int smem, tma, alt;
} v6_forms[] = {
	{ attn_v6_kernel<2, false, false>, V6_SMEM(2), 0, 0 },	/* 0 as first written */
	{ attn_v6_kernel<2, true, false>, V6_SMEM(2), 0, 1 },	/* 1 ping-pong */
	{ attn_v6_kernel<3, true, true>, V6_SMEM(3), 1, 1 },	/* 2 ping-pong, TMA, 3 stages */
};
#define V6_FORMS ((int)(sizeof(v6_forms) / sizeof(v6_forms[0])))
static int v6_form = V6_FORM_MAIN;
static PFN_cuTensorMapEncodeTiled_v12000 v6_encode;	/* the driver's, for the TMA forms */

/* K or V, [Hkv][stride][128] bf16, as a 3-D tensor map of n_kv rows a head
 * (the copy engine fills rows past them with zeros), boxes of 64 x 128 x 1
 * in the 128-byte swizzle. 0, or 1 where it cannot be made. */
static int v6_map(CUtensorMap *m, const uint16_t *base, int n_kv, int n_kv_heads, size_t stride)
{
	const cuuint64_t dim[3] = { V6_HD, (cuuint64_t)(n_kv > 0 ? n_kv : 1), (cuuint64_t)n_kv_heads };
	const cuuint64_t str[2] = { V6_HD * 2, (cuuint64_t)stride * V6_HD * 2 };
	const cuuint32_t box[3] = { 64, V6_BN, 1 }, one[3] = { 1, 1, 1 };

	if (((uintptr_t)base & 15) || !v6_encode)
		return 1;
	return v6_encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dim, str, box, one,
			 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
			 CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
			 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS;
}

/* The form that runs: f, or its cp.async twin without an encoder. */
static int v6_pick(int f)
{
	return v6_forms[f].tma && !v6_encode ? v6_forms[f].alt : f;
}

/* Which form v6 runs from now on (for comparisons; not during a capture):
 * the form before, or -1 where f is none (then nothing changes). */
extern "C" int kvmem_cuda_attention_v6_form(int f)
{
	const int old = v6_form;

	if (f < 0 || f >= V6_FORMS)
		return -1;
	v6_form = v6_pick(f);
	return old;
}

extern "C" int kvmem_cuda_attention_v6_setup(kvmem_cuda_ctx *c)
{
	cudaFuncAttributes fa;
	int major = 0, minor = 0;
	const char *e = getenv("KVMEM_CUDA_V6");

	if (c->device >= 64 || v6_ok[c->device])
		return 0;
	if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device) != cudaSuccess ||
	    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->device) != cudaSuccess ||
	    major != 9 || minor != 0 || cudaFuncGetAttributes(&fa, v6_forms[0].fn) != cudaSuccess) {
		cudaGetLastError();	/* not an error: v4 runs instead */
		v6_ok[c->device] = -1;
		return 0;
	}
	if (!v6_encode) {
		cudaDriverEntryPointQueryResult q;
		void *fn = NULL;

		if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
						     cudaEnableDefault, &q) == cudaSuccess &&
		    q == cudaDriverEntryPointSuccess)
			v6_encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
		cudaGetLastError();
	}
	for (int f = 0; f < V6_FORMS; f++)
		if (int rc = kvmem_cuda_err(cudaFuncSetAttribute(v6_forms[f].fn,
								 cudaFuncAttributeMaxDynamicSharedMemorySize,
								 v6_forms[f].smem),
					    "attention v6: shared memory"))
			return rc;
	v6_form = v6_pick(e && *e && atoi(e) >= 0 && atoi(e) < V6_FORMS ? atoi(e) : V6_FORM_MAIN);
	v6_ok[c->device] = 1;
	return 0;
}

/* Whether the row tiles alone fill the GPU (no split-K in v6): the main
 * path takes v4, which splits the keys, for short chunks over long views. */
extern "C" int kvmem_cuda_attention_v6_fills(const kvmem_cuda_ctx *c, int n_q, int n_heads,
					     int n_kv_heads)
{
	const long long R = (long long)n_q * (n_heads / n_kv_heads);

	return (R + V6_ROWS - 1) / V6_ROWS * n_kv_heads >= c->sms;
}

/* Whether v6 runs on this device at this head_dim (other refusals below
 * are shapes: key positions given, decode rows). */
extern "C" int kvmem_cuda_attention_v6_takes(const kvmem_cuda_ctx *c, int head_dim)
{
	return c->device < 64 && v6_ok[c->device] == 1 && head_dim == V6_HD;
}

/* 0 done (or a negative errno), 1 not taken here: the caller runs v4. */
extern "C" int kvmem_cuda_attention_v6(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
				       const int32_t *q_pos, int n_q, const uint16_t *k,
				       const uint16_t *v, const int32_t *kv_pos, int n_kv,
				       size_t kv_stride, int n_heads, int n_kv_heads, int head_dim,
				       float scale)
{
	const long long R = (long long)n_q * (n_heads / n_kv_heads);
	const long long tiles = (R + V6_ROWS - 1) / V6_ROWS;
	v6_args a;

	if (c->device >= 64 || v6_ok[c->device] != 1 || head_dim != V6_HD || kv_pos || R <= 16 ||
	    tiles > INT_MAX)
		return 1;
	memset(&a, 0, sizeof(a));
	a.out = out;
	a.q = q;
	a.k = k;
	a.v = v;
	a.q_pos = q_pos;
	a.n_q = n_q;
	a.n_kv = n_kv;
	a.n_heads = n_heads;
	a.group = n_heads / n_kv_heads;
	a.kv_stride = (long long)kv_stride;
	a.scale_log2 = scale * 1.4426950408889634f;
	if (v6_forms[v6_form].tma && (v6_map(&a.tk, k, n_kv, n_kv_heads, kv_stride) ||
				      v6_map(&a.tv, v, n_kv, n_kv_heads, kv_stride)))
		return 1;	/* v4 runs */
	v6_forms[v6_form].fn<<<dim3((unsigned)tiles, n_kv_heads), V6_THREADS, v6_forms[v6_form].smem,
			       c->stream>>>(a);
	return kvmem_cuda_launched("attention v6");
}

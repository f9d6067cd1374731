/* SPDX-License-Identifier: MIT */
/*
 * Decode attention v5's shapes and its end, shared by attention.cu's
 * kernels (bf16, batched, fp8 tile form) and attention_fp8.cu's register
 * form: the stage and warp sizes, the kernel arguments, the shared-memory
 * layout, and dec_finish (the warps' merge and the splits' combine), so
 * that every form writes the same partials and combines them alike.
 */
#ifndef KVMEM_KERNELS_CUDA_ATTENTION_DEC_CUH
#define KVMEM_KERNELS_CUDA_ATTENTION_DEC_CUH

#include "attention_mma.cuh"

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

/*
 * A sequence of a batched launch (kvmem_cuda_att_dec_batch): blockIdx.z
 * picks one, whose own arguments replace the shared ones; each sequence
 * has its own partials and counters, its split count from its own key
 * count (decode_split at the one-sequence target), so its bits are those
 * of the lone kernel on it alone, whatever else is in the launch.
 */
struct dec_seq {
	uint16_t *out;		/* its first query row's output */
	const uint16_t *q, *k, *v;	/* fp8: k and v are e4m3 bytes */
	const float *ks, *vs;	/* fp8: their row scales; NULL for bf16 */
	const int32_t *q_pos, *kv_pos;
	int n_q, n_kv;
	long long kv_stride;
	float *part_o, *part_m, *part_l;
	unsigned *cnt;
};

__device__ __forceinline__ dec_args dec_seq_args(const dec_args &base, const dec_seq &s)
{
	dec_args a = base;

	a.out = s.out;
	a.q = s.q;
	a.k = s.k;
	a.v = s.v;
	a.ks = s.ks;
	a.vs = s.vs;
	a.q_pos = s.q_pos;
	a.kv_pos = s.kv_pos;
	a.n_q = s.n_q;
	a.n_kv = s.n_kv;
	a.kv_stride = s.kv_stride;
	a.part_o = s.part_o;
	a.part_m = s.part_m;
	a.part_l = s.part_l;
	a.cnt = s.cnt;
	return a;
}

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

/* A decode kernel's dynamic shared memory limit raised to `bytes`, with
 * the most shared memory per SM preferred; `what` names it in an error
 * (attention.cu). */
int kvmem_cuda_dec_smem(const void *kernel, int bytes, const char *what);
/* The register form over fp8 (attention_fp8.cu): its kernels' shared
 * memory limits (once per device, with v5's: dec_attr), and a launch of
 * grid x a.n_kv_heads blocks at head_dim 64 or 128, minb (2 or 3) blocks
 * an SM; a.target must be that minb's split target. */
int kvmem_cuda_dec8r_attr(int head_dim);
void kvmem_cuda_dec8r_launch(kvmem_cuda_ctx *c, const dec_args &a, int grid, int head_dim,
			     int minb);
/* The same over n_seqs sequences (seqs: device memory), grid x
 * base.n_kv_heads x n_seqs blocks. */
void kvmem_cuda_dec8r_batch_launch(kvmem_cuda_ctx *c, const dec_args &base, const dec_seq *seqs,
				   int grid, int n_seqs, int head_dim, int minb);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * bf16 ops for the CUDA engine, as CPU twins (kernels/cpu/bf16_ops.c,
 * kernels/cpu/score.c) on host pointers.
 *
 * Each function here has a CUDA version kvmem_cuda_<name> in
 * kernels/kernels_cuda.h that takes a kvmem_cuda_ctx first and then exactly
 * these arguments, with every array a device pointer (the small parameter
 * structs — kvmem_sampler, kvmem_score_geom — stay in host memory). The GPU
 * checks (tests/gpu/) run the two side by side on fresh random inputs; the
 * tolerances are in Documentation/kernels.md.
 *
 * Number formats of the CUDA engine: weights bf16 (converted at load), the
 * residual stream fp32, GEMM inputs bf16 with fp32 accumulation, q/k/v and
 * the MLP activations bf16, the KV view bf16. A bf16 value is a uint16_t
 * holding the top half of an fp32 (kvmem_bf16_to_f32). Every bf16 result is
 * computed in fp32 or double and rounded once, to nearest even.
 *
 * Layouts (row-major) as in kernels.h: activations x[n][dim], queries
 * q[n][n_heads][head_dim], the view head-major per layer
 * [n_layers][n_kv_heads][cap][head_dim], weights w[out][in].
 */
#ifndef KVMEM_KERNELS_BF16_H
#define KVMEM_KERNELS_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- conversions -------------------------------------------------------- */
/* dst[i] = bf16(src[i]) for src of KVMEM_DTYPE_F32, _BF16 (a copy) or _F16
 * (enum kvmem_dtype in kvmem.h): how weights reach the GPU. -EINVAL on
 * another type. */
int kvmem_convert_to_bf16(uint16_t *dst, const void *src, int src_dtype, size_t n);

/* ---- dense -------------------------------------------------------------- */
/* out[i][:] = fp32(table[ids[i]][:]); ids in [0, vocab). Exact. */
void kvmem_embedding_bf16(float *out, const uint16_t *table, const int32_t *ids, int n, int dim);

/* out[i] = bf16(x[i] * r * w), r = 1 / sqrt(mean(x[i]^2) + eps): fp32
 * residual rows in, bf16 rows out (the GEMM input). Sum of squares in double,
 * r rounded to fp32, then (x * r) * w in fp32, as kvmem_rmsnorm. */
void kvmem_rmsnorm_bf16(uint16_t *out, const float *x, const uint16_t *w, int n, int dim,
			float eps);

/* The per-head q/k norm in place: rows x[rows][head_dim] bf16 (rows =
 * tokens * heads), each normalised like kvmem_rmsnorm_bf16. */
void kvmem_headnorm_bf16(uint16_t *x, const uint16_t *w, int rows, int head_dim, float eps);

/* out[i][j] = bf16(silu(gate[i][j]) * up[i][j]) in fp32 (expf), for i < n,
 * j < dim. gate and up rows are ld elements apart (ld = dim for separate
 * arrays, 2 * dim for a fused [gate | up] GEMM output with up = gate + dim);
 * out is [n][dim], dense. out may equal gate when ld == dim. */
void kvmem_swiglu_bf16(uint16_t *out, const uint16_t *gate, const uint16_t *up, int n, int dim,
		       int ld);

/* The residual add is kvmem_add (kernels.h): fp32 y[i] += x[i]. */

/* ---- GEMM --------------------------------------------------------------- */
enum kvmem_gemm_out {
	KVMEM_GEMM_BF16 = 0,	/* y is uint16_t[n][out]: bf16(x . w^T) */
	KVMEM_GEMM_F32 = 1,	/* y is float[n][out]: x . w^T */
	KVMEM_GEMM_F32_ADD = 2,	/* y is float[n][out]: y += x . w^T (the residual) */
};

/*
 * y = x[n][in] . w[out][in]^T with bf16 inputs and fp32 accumulation; the
 * output as `mode` says. The CPU twin widens x and w to fp32 and runs
 * OpenBLAS sgemm (beta 1 for F32_ADD), then rounds once for BF16. Returns 0,
 * -EINVAL (sizes, mode) or -ENOMEM.
 */
int kvmem_gemm_bf16(void *y, int mode, const uint16_t *x, const uint16_t *w, int n, int in,
		    int out);

/* logits[n][vocab] = (rmsnorm(x[n][hidden]) * norm_w) . lm_head^T in fp32:
 * the final norm into tmp[n][hidden] (bf16 scratch), then the GEMM. */
int kvmem_logits_bf16(float *logits, const float *x, const uint16_t *norm_w,
		      const uint16_t *lm_head, uint16_t *tmp, int n, int hidden, int vocab,
		      float eps);

/*
 * Decode's fused ops (kernels/cpu/fused.c), defined as the compositions of
 * the ops above, which is what the CUDA versions compute in one kernel for
 * one row (bit for bit the unfused CUDA ops):
 *   kvmem_norm_gemv_bf16:        h = rmsnorm(x, norm_w); y (mode) h . w^T
 *   kvmem_norm_gemv_swiglu_bf16: h = rmsnorm(x, norm_w);
 *                                gu[n][2 inter] = bf16(h . w^T) (w is
 *                                [gate; up], [2 inter][in]);
 *                                act[n][inter] = swiglu(gu, gu + inter)
 * h ([n][in]) and gu are scratch the twin writes. Return 0, -EINVAL or
 * -ENOMEM as kvmem_gemm_bf16.
 */
int kvmem_norm_gemv_bf16(void *y, int mode, const float *x, const uint16_t *norm_w, float eps,
			 const uint16_t *w, uint16_t *h, int n, int in, int out);
int kvmem_norm_gemv_swiglu_bf16(uint16_t *act, const float *x, const uint16_t *norm_w, float eps,
				const uint16_t *w, uint16_t *h, uint16_t *gu, int n, int in,
				int inter);

/* ---- rotary position embedding ----------------------------------------- */
/*
 * Rotate-half RoPE in place on x[n][n_heads][head_dim] bf16, token t at
 * pos[t]. The angle pos * theta^(-2i/head_dim), its cosine and sine and the
 * rotation are all in double; the result is rounded once to bf16. The CUDA
 * version computes the same in double on the GPU (pow, sincos within 2 ulp of
 * double): its pre-rounding values differ from these by < 1e-15 relative,
 * so the bf16 results are equal except where a value falls that close to a
 * rounding midpoint (then 1 bf16 ulp).
 */
/* The angles kvmem_rope_bf16 rotates by: for each token t and pair i <
 * head_dim/2, ang[2 (t half + i)] = cos and [.. + 1] = sin of pos[t] *
 * theta^(-2i/head_dim), in double. The twin of kvmem_cuda_rope_angles. */
void kvmem_rope_angles(double *ang, const int32_t *pos, int n, int head_dim, double theta);
void kvmem_rope_bf16(uint16_t *x, const int32_t *pos, int n, int n_heads, int head_dim,
		     double theta);

/*
 * Re-RoPE of raw K into the view. One item moves n tokens from a packed
 * staging buffer into view slots slot..slot+n-1 of one layer: token t's raw
 * K (after k-norm, before RoPE) is rotated at position slot + t (a slot's
 * index is its position in the compact view) and V is copied as is. Staging
 * element (token t, KV head h, dim d) of an item is at
 *   src + t * tok_stride + h * head_stride + d
 * in stage_k and stage_v alike: a history page [n_kv_heads][B][head_dim] has
 * tok_stride = head_dim, head_stride = B * head_dim; the forward pass's new
 * tokens [n][n_kv_heads][head_dim] have tok_stride = n_kv_heads * head_dim,
 * head_stride = head_dim. The rotation is kvmem_rope_bf16's, so a token
 * written at one slot by the forward pass and again later from its stored
 * raw K gets the same bits.
 */
typedef struct kvmem_scatter_item {
	int32_t layer;		/* view layer */
	int32_t slot;		/* first view slot (= RoPE position) */
	int32_t n;		/* tokens */
	int32_t tok_stride;	/* staging elements between tokens */
	int64_t src;		/* staging element offset of token 0, head 0, dim 0 */
	int32_t head_stride;	/* staging elements between KV heads */
	int32_t reserved;	/* 0 */
} kvmem_scatter_item;

/*
 * view_k, view_v: [n_layers][n_kv_heads][cap][head_dim] bf16. Items that
 * would leave the view (layer outside [0, n_layers), slot < 0,
 * slot + n > cap, n < 0) are skipped; the CPU twin then returns -EINVAL
 * after doing the others (the CUDA version cannot report from the kernel
 * and skips them silently). Items may come in any order; two items must not
 * write the same slot.
 */
int kvmem_view_scatter_bf16(uint16_t *view_k, uint16_t *view_v, const uint16_t *stage_k,
			    const uint16_t *stage_v, const kvmem_scatter_item *items, int n_items,
			    int n_layers, int n_kv_heads, int head_dim, int cap, double theta);

/*
 * The scatter's gathering twin, for rematerialisation straight from pages:
 * each item reads n tokens of one history page where the page is (pinned
 * host memory the device can address, a device page pool, or any host
 * memory for the CPU twin), in the page's own dtype (f32, bf16 or f16,
 * rounded to bf16 as kvmem_f32_to_bf16 does), rotates K at slot + t and
 * copies V, exactly as kvmem_view_scatter_bf16 would from a bf16 staging
 * copy of the same values. Element (token t, KV head h, dim d) of an item is
 * at k[t * head_dim + h * head_stride + d] (a page [n_kv_heads][B][head_dim]
 * has head_stride = B * head_dim; k points at its token u0). When copy_k is
 * set the raw K (and V to copy_v) also goes there as bf16, at the same
 * offsets: how a device page pool is filled on the way; with raw_k set the
 * raw K goes there too (raw_stride apart per head). Items outside the view
 * are skipped (the twin returns -EINVAL after the others).
 *
 * fp8 pages (dtype KVMEM_DTYPE_FP8, kernels/kernels_fp8.h): k and v hold
 * e4m3 bytes, the row (t, h) scaled by k_scale[h * scale_stride + t] (and
 * v_scale): dequantised exactly in fp32, then rounded to bf16 as above, so
 * the device reads half the bytes of a bf16 page.
 */
typedef struct kvmem_gather_item {
	const void *k, *v;	/* token 0, head 0 of the item's K and V */
	uint16_t *copy_k;	/* NULL, or a bf16 page to copy the raw K into */
	uint16_t *copy_v;
	/* NULL, or where the raw K (bf16) also goes with its own head
	 * stride: the raw K a view keeps beside its slots (element (t, h, d)
	 * at raw_k[t * head_dim + h * raw_stride + d]). */
	uint16_t *raw_k;
	int32_t layer, slot, n;	/* view layer, first slot, tokens */
	int32_t head_stride;	/* elements between KV heads */
	int32_t dtype;		/* enum kvmem_dtype of k and v */
	int32_t raw_stride;	/* elements between KV heads of raw_k */
	/* fp8 only: the rows' scales, scale_stride apart per KV head (a
	 * page's [n_kv_heads][B] scales: B), pointing at token 0's. */
	const float *k_scale, *v_scale;
	int32_t scale_stride;
} kvmem_gather_item;

int kvmem_view_gather_bf16(uint16_t *view_k, uint16_t *view_v, const kvmem_gather_item *items,
			   int n_items, int n_layers, int n_kv_heads, int head_dim, int cap,
			   double theta);

/* ---- attention ---------------------------------------------------------- */
/*
 * Causal GQA attention over a head-major bf16 view, as kvmem_attention:
 *   q     [n_q][n_heads][head_dim] bf16, rotated
 *   k, v  [n_kv_heads][kv_stride][head_dim] bf16 (one layer of the view)
 *   query i sees key j iff kv_pos[j] <= q_pos[i]; kv_pos NULL means
 *   kv_pos[j] = j (the compact view: slot = position), which lets the CUDA
 *   version skip whole tiles past a query block's last position
 *   out   [n_q][n_heads][head_dim] bf16 (the o_proj input)
 * Scores and softmax in fp32 (the CUDA version rounds the probabilities to
 * bf16 for the P.V product, as flash attention does). A query that sees no
 * key gets zeros. The CPU twin widens to fp32 and calls kvmem_attention.
 * Returns 0, -EINVAL or -ENOMEM.
 */
int kvmem_attention_bf16(uint16_t *out, const uint16_t *q, const int32_t *q_pos, int n_q,
			 const uint16_t *k, const uint16_t *v, const int32_t *kv_pos, int n_kv,
			 size_t kv_stride, int n_heads, int n_kv_heads, int head_dim, float scale);

/* ---- sampling ----------------------------------------------------------- */
/* *token = kvmem_sample(logits, vocab, s, rng): the same rules, the same RNG
 * use (one draw per non-greedy sample). Returns 0 or -EINVAL (vocab <= 0),
 * -ENOMEM. */
int kvmem_sample_token(int32_t *token, const float *logits, int vocab, const kvmem_sampler *s,
		       uint64_t *rng);

/* ---- selection scorers (kernels/cpu/score.c) ---------------------------- */
/*
 * Plain-array forms of the workspace policies' scoring (user/workspace/
 * policy_meank.c, policy_subblock.c, policy_quest.c, token_mass.c, and the
 * planner's top-k), with the same arithmetic in the same order: a policy that
 * calls them gets the bits it got before. Scores are estimated attention
 * masses (Documentation/policies.md): per pair (layer, head[, query token])
 * a softmax over items of z = s * (q . summary) + log(tokens in the item),
 * s = 1/sqrt(head_dim), shares summed per block and added over pairs.
 */
/* Sub-blocks per block (kvmem/session.h says the same for policy authors). */
#ifndef KVMEM_SUBBLOCKS
#define KVMEM_SUBBLOCKS 4
#endif

typedef struct kvmem_score_geom {
	int n_layers, n_heads, n_kv_heads, head_dim;
	int block;		/* tokens per block */
	int64_t n_blocks;	/* blocks scored: 0..n_blocks-1 */
	int64_t cap_blocks;	/* blocks between (layer, KV head) runs of the index */
	int last_len;		/* tokens in block n_blocks-1 (1..block) */
	int last_sub[KVMEM_SUBBLOCKS];	/* tokens in each quarter of block n_blocks-1 */
	int index_dtype;	/* KVMEM_DTYPE_F32 (the workspace's) or _BF16 */
} kvmem_score_geom;

/* Distance-averaged RoPE on one head_dim vector in place (Documentation/
 * policies.md: x <- M^T x, M the mean of R(-t) over t < span; span 0: x). */
void kvmem_rope_mean(float *x, int head_dim, double theta, int64_t span);

/* gq[l * n_kv_heads + g][head_dim] = rope_mean(mean over the n_q tokens and
 * the query heads of KV head g of q[l][t][h][:]), q raw (after q-norm,
 * before RoPE), [n_layers][n_q][n_heads][head_dim]. */
void kvmem_group_queries(float *gq, const float *q, int n_layers, int n_q, int n_heads,
			 int n_kv_heads, int head_dim, double theta, int64_t span);

/* hq[(h * n_q + t)][head_dim] = rope_mean(q[layer][t][h][:]): the per-head
 * queries of one layer for kvmem_token_mass. */
void kvmem_head_queries(float *hq, const float *q, int layer, int n_q, int n_heads,
			int head_dim, double theta, int64_t span);

/* meank: scores[n_blocks] = sum over (layer, KV head) of the softmax shares
 * of z_b = s * gq . meank_b + log(len_b). meank is the index's
 * [n_layers][n_kv_heads][cap_blocks][head_dim] (index_dtype). 0 or -ENOMEM. */
int kvmem_score_meank(float *scores, const void *meank, const float *gq,
		      const kvmem_score_geom *g);

/* subblock: items are quarter blocks, sub is [L][H][cap_blocks][4][head_dim];
 * a quarter not yet begun has no weight; shares summed per block. */
int kvmem_score_subblock(float *scores, const void *sub, const float *gq,
			 const kvmem_score_geom *g);

/* quest: scores[n_layers][n_blocks]; per (layer, query head, query token) the
 * bound u_b = sum_d max(q_d min_d, q_d max_d) of raw q (no averaging) over
 * kmin/kmax [L][H][cap_blocks][head_dim]; q [n_layers][n_q][n_heads][hd]. */
int kvmem_score_quest(float *scores, const void *kmin, const void *kmax, const float *q,
		      int n_q, const kvmem_score_geom *g);

/*
 * refine's per-key pass for one layer (the workspace's ws_token_mass, one
 * layer of it): keys [n_kv_heads][n * block][head_dim] (index_dtype) hold
 * the raw K of the n listed blocks, block i at slots i*block.. (len[i]
 * tokens; slots past it are never read); blocks[i] its block number; hq
 * from kvmem_head_queries; q_pos[n_q] the query positions. Per (query head,
 * token): a softmax over the listed keys it may see (blocks[i]*block + j <=
 * q_pos), each block's share added to mass[i] (double), pairs in order.
 * Returns 0 or -ENOMEM.
 */
int kvmem_token_mass(double *mass, const void *keys, const int32_t *len, const int64_t *blocks,
		     int64_t n, const float *hq, const int64_t *q_pos, int n_q,
		     const kvmem_score_geom *g);

/* The k best of blocks 0..n-1 by scores (higher first, ties to the later
 * block, NaN lowest: the planner's order), written to out[0..min(k,n)) in
 * ascending block order. Returns min(k, n) (0 for k <= 0) or -ENOMEM. */
int64_t kvmem_top_k_blocks(int64_t *out, const float *scores, int64_t n, int64_t k);
/* The same order in place: rearrange the block numbers idx[0..n) (any
 * subset, scores indexed by block number) so that the k best come first,
 * in no particular order. The planner and the policies use it. */
void kvmem_top_k_select(int64_t *idx, int64_t n, int64_t k, const float *scores);

/*
 * The index's append over plain arrays (kernels/cpu/index_bf16.c; the GPU
 * keeps its index with kvmem_cuda_index_append): n new tokens' raw K,
 * raw_k [n_layers][n][n_kv_heads][head_dim] bf16, after `first` tokens, into
 * meank [n_layers][n_kv_heads][cap_blocks][head_dim], and when not NULL
 * kmin / kmax (the same layout) and sub ([..][cap_blocks][4][head_dim]),
 * stored as g->index_dtype. open_sum / open_sub [n_layers][n_kv_heads]
 * [head_dim] fp32 are the running sums of the block / quarter block being
 * filled, kept between calls (zeros at the start). The workspace index's
 * arithmetic (kvmem_index_append): with KVMEM_DTYPE_F32 its bits, with
 * _BF16 those rounded once. Uses n_layers, n_kv_heads, head_dim, block,
 * cap_blocks and index_dtype of g. -EINVAL when the blocks would pass
 * cap_blocks.
 */
int kvmem_index_append_bf16(void *meank, void *kmin, void *kmax, void *sub, float *open_sum,
			    float *open_sub, const uint16_t *raw_k, int64_t first, int n,
			    const kvmem_score_geom *g);

/* ---- rows into pages (kernels/cpu/pages.c) ------------------------------ */
/* One layer's n rows of a forward pass, k and v [n][H][D] bf16, into the
 * pages of the blocks they belong to: token j goes to pages[(t0 + j) / B]
 * ([2][H][B][D]: K then V) at token (t0 + j) % B. t0 is where the first row
 * falls in pages[0] (0 <= t0 < B); nothing else in the pages changes. */
void kvmem_rows_to_pages_bf16(void *const *pages, int t0, int n, const uint16_t *k,
			      const uint16_t *v, int H, int B, int D);

/* ---- fills (kernels/cpu/fill.c) ---------------------------------------- */
/* dst[i] = bf16 of a value uniform on [-sqrt(3) scale, sqrt(3) scale), a pure
 * function of (seed, i) (variance scale^2): random weights for a model that
 * is only a geometry. */
void kvmem_random_bf16(uint16_t *dst, size_t n, uint64_t seed, float scale);
/* dst[i] = bf16(v). */
void kvmem_fill_bf16(uint16_t *dst, size_t n, float v);

#ifdef __cplusplus
}
#endif
#endif

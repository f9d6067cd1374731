/* SPDX-License-Identifier: MIT */
/*
 * The CUDA ops (kernels/cuda/, built into libkvmem_cuda.a when nvcc is
 * found) and the small context they run in.
 *
 * Every op kvmem_cuda_<name>(ctx, ...) takes the arguments of its CPU twin
 * kvmem_<name> (kernels_bf16.h, kernels.h) with every array a device pointer,
 * and queues its work on the context's stream: it returns as soon as the
 * work is queued. A return of 0 means the launch was accepted; a fault while
 * the kernel runs shows at the next kvmem_cuda_sync(). Ops never allocate
 * device memory while a stream capture is under way: scratch comes from the
 * context, grown only outside a capture (kvmem_cuda_reserve before capturing
 * a CUDA graph, or run the step once first).
 *
 * Errors are negative errno values with kvmem_error's message: -EINVAL (a
 * bad argument), -ENOMEM (device or host memory), -ENOTSUP (no CUDA device,
 * or a shape the kernels do not handle, e.g. attention with head_dim other
 * than 64 or 128), -EBUSY (scratch would have to grow during a capture),
 * -EIO (any other CUDA or cuBLAS failure, the message names it).
 *
 * Determinism: every op gives the same bits for the same inputs and shapes
 * on the same GPU model (no atomics in any sum; the attention's and the
 * split GEMV's split counts depend only on the shapes and the number of
 * multiprocessors).
 */
#ifndef KVMEM_CUDA_H
#define KVMEM_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels_bf16.h"
#include "kernels/draw_fixed.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvmem_cuda_ctx kvmem_cuda_ctx;

/* Number of CUDA devices (0 when there is no driver or no GPU). */
int kvmem_cuda_device_count(void);

/* A context on `device`: its own non-blocking stream, a cuBLASLt handle with
 * a 32 MiB workspace, and scratch (empty until an op needs it). */
int kvmem_cuda_ctx_create(kvmem_cuda_ctx **out, int device);
void kvmem_cuda_ctx_destroy(kvmem_cuda_ctx *c);
/* The stream (a cudaStream_t) ops are queued on. */
void *kvmem_cuda_stream(const kvmem_cuda_ctx *c);
/* Multiprocessors of the device, and its name. */
int kvmem_cuda_sm_count(const kvmem_cuda_ctx *c);
const char *kvmem_cuda_device_name(const kvmem_cuda_ctx *c);
/* Grow the scratch to at least `bytes` now (not during a capture). */
int kvmem_cuda_reserve(kvmem_cuda_ctx *c, size_t bytes);
/* Switch one of the context's fast paths on or off, for comparisons:
 * "gemv" (one-row GEMMs by kvmem's own kernels, kernels/cuda/gemv.cu, not
 * cuBLASLt; default on, KVMEM_CUDA_GEMV=0 turns it off), "gemv_split"
 * (those by the split-K kernel, the input split over the warps of a block;
 * default on, KVMEM_CUDA_GEMV_SPLIT=0 turns it off), "gemv_ks" (not a
 * switch: `on` is the split forced on that kernel, 1, 2, 4 or 8; 0, the
 * default, lets the shape and SM count pick it), "fast_scores" (the
 * 16-byte-load bf16 Mean-K scorer; default on), "fuse" (decode's fused
 * norm + GEMV ops, kvmem_cuda_norm_gemv_bf16; KVMEM_CUDA_FUSE=0/1, default
 * in kernels/cuda/cuda_int.h; a CUDA graph captured before a change keeps
 * the kernels it holds), "gemm_tc" (decode's GEMMs, the lone row's and a
 * batched step's, on the tensor-core GEMM, kvmem_cuda_gemm_tc_bf16, which
 * also turns the fused ops off; KVMEM_CUDA_GEMM_TC=0/1, default in
 * cuda_int.h), "gemm_tc_ks" (its split forced, 1, 2, 4 or 8; 0 by shape),
 * "gemm_tc_mt" (its 16-row weight tiles a warp forced, 1 or 2; 0 by n),
 * "gemm_tc_u" (its 32-element blocks of loads in flight for a lone row, 4
 * or 8; 0: 4), "fp8_f16k" (decode attention v5 over fp8 K/V computes Q K^T
 * on the f16 MMA when the block's Q converts to f16 exactly, else as
 * before; on by default, KVMEM_CUDA_FP8_F16K=0 turns it off; the same bits,
 * tests/gpu/check_fp8_view.c compares them with the bf16 path's), "fp8_int"
 * (the same kernel's e4m3 -> bf16 by byte permutes, shifts and a multiply
 * instead of cvt; on by default, KVMEM_CUDA_FP8_INT=0 off).
 * Returns the previous
 * setting, or -EINVAL for an unknown name or value. Results stay within the
 * ops' tolerances either way; the bits of a GEMM may differ. */
int kvmem_cuda_tune(kvmem_cuda_ctx *c, const char *what, int on);
/* The rows GEMMs of 2+ rows are pinned to ("gemm_pin", gemm.cu), 0: none. */
int kvmem_cuda_gemm_pin(const kvmem_cuda_ctx *c);
/* Wait for the stream; reports a kernel fault as -EIO. */
int kvmem_cuda_sync(kvmem_cuda_ctx *c);

/* Free and total device memory now. */
int kvmem_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);
/* The device's copy rate: a device-to-device copy of `bytes`, bytes read
 * plus written per second in GB/s (best of 5), or a negative errno. */
double kvmem_cuda_copy_gbps(kvmem_cuda_ctx *c, size_t bytes);

/* Device memory and copies (synchronous with respect to the stream: they
 * wait for it). Plain cudaMalloc memory, never managed memory. */
int kvmem_cuda_malloc(void **p, size_t bytes);
void kvmem_cuda_free(void *p);
int kvmem_cuda_upload(kvmem_cuda_ctx *c, void *dst, const void *src, size_t bytes);
int kvmem_cuda_download(kvmem_cuda_ctx *c, void *dst, const void *src, size_t bytes);

/* ---- ops: arguments as the twins in kernels_bf16.h / kernels.h ---------- */
int kvmem_cuda_convert_to_bf16(kvmem_cuda_ctx *c, uint16_t *dst, const void *src,
			       int src_dtype, size_t n);
int kvmem_cuda_embedding_bf16(kvmem_cuda_ctx *c, float *out, const uint16_t *table,
			      const int32_t *ids, int n, int dim);
int kvmem_cuda_rmsnorm_bf16(kvmem_cuda_ctx *c, uint16_t *out, const float *x, const uint16_t *w,
			    int n, int dim, float eps);
int kvmem_cuda_headnorm_bf16(kvmem_cuda_ctx *c, uint16_t *x, const uint16_t *w, int rows,
			     int head_dim, float eps);
int kvmem_cuda_swiglu_bf16(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *gate,
			   const uint16_t *up, int n, int dim, int ld);
/* twin: kvmem_add (fp32 y += x) */
int kvmem_cuda_add(kvmem_cuda_ctx *c, float *y, const float *x, size_t n);
/* cuBLASLt: bf16 A/B, fp32 compute (CUBLAS_COMPUTE_32F), "TN" layout; the
 * algorithm for each shape is chosen once and kept in the context. */
int kvmem_cuda_gemm_bf16(kvmem_cuda_ctx *c, void *y, int mode, const uint16_t *x,
			 const uint16_t *w, int n, int in, int out);
/* n rows (a batched decode step), row b with the bits kvmem_cuda_gemm_bf16
 * gives x[b] alone (n == 1: the GEMV), read once for up to 8 rows
 * (gemv.cu); -ENOTSUP where the lone row would not take the GEMV (in % 8,
 * alignment, "gemv" off). */
int kvmem_cuda_gemv_rows_bf16(kvmem_cuda_ctx *c, void *y, int mode, const uint16_t *x,
			      const uint16_t *w, int n, int in, int out);
/* The tensor-core GEMM for few rows (gemm_tc.cu): y[m] (mode) x[m] . w^T,
 * row m's bits independent of n and of its place among the rows (fixed K
 * order, split by shape); within kvmem_gemm_bf16's tolerance, not its bits.
 * -ENOTSUP when in % 8 or x, w are not 16-byte aligned. With "gemm_tc" on,
 * the one-row GEMM and kvmem_cuda_gemv_rows_bf16 both run it. */
int kvmem_cuda_gemm_tc_bf16(kvmem_cuda_ctx *c, void *y, int mode, const uint16_t *x,
			    const uint16_t *w, int n, int in, int out);
int kvmem_cuda_logits_bf16(kvmem_cuda_ctx *c, float *logits, const float *x,
			   const uint16_t *norm_w, const uint16_t *lm_head, uint16_t *tmp, int n,
			   int hidden, int vocab, float eps);
int kvmem_cuda_rope_bf16(kvmem_cuda_ctx *c, uint16_t *x, const int32_t *pos, int n, int n_heads,
			 int head_dim, double theta);
/* ang: device [n][head_dim/2] of (cos, sin) in double, as kvmem_rope_angles
 * (its twin) lays them out: a forward pass works them out once for all its
 * layers (the q/k kernel's blocks each did, for each layer). */
int kvmem_cuda_rope_angles(kvmem_cuda_ctx *c, double *ang, const int32_t *pos, int n,
			   int head_dim, double theta);
/* items: device array of n_items kvmem_scatter_item */
int kvmem_cuda_view_scatter_bf16(kvmem_cuda_ctx *c, uint16_t *view_k, uint16_t *view_v,
				 const uint16_t *stage_k, const uint16_t *stage_v,
				 const kvmem_scatter_item *items, int n_items, int n_layers,
				 int n_kv_heads, int head_dim, int cap, double theta);
/* The same, the raw K also copied to raw_view (the view's layout, not
 * rotated; NULL: not kept): the raw K a view keeps beside its slots. */
int kvmem_cuda_view_scatter_raw_bf16(kvmem_cuda_ctx *c, uint16_t *view_k, uint16_t *view_v,
				     uint16_t *raw_view, const uint16_t *stage_k,
				     const uint16_t *stage_v, const kvmem_scatter_item *items,
				     int n_items, int n_layers, int n_kv_heads, int head_dim, int cap,
				     double theta);
/* items: device array of n_items kvmem_gather_item whose k / v (and copy_k /
 * copy_v) the device can address: device memory, or pinned host memory
 * (cudaMallocHost, or cudaHostRegister'd and mapped). run: items a block
 * takes (>= 1); consecutive items at the same slots share their rotary
 * angles within a block, so run is best their count. -ENOTSUP when one
 * token takes more than 256 threads (n_kv_heads * head_dim * 3 / 16). */
int kvmem_cuda_view_gather_bf16(kvmem_cuda_ctx *c, uint16_t *view_k, uint16_t *view_v,
				const kvmem_gather_item *items, int n_items, int run, int n_layers,
				int n_kv_heads, int head_dim, int cap, double theta);
/* Threads a gather block takes from now on (256, the default, 512, 768 or
 * 1024; the same bits): a measurement's knob. -EINVAL otherwise. */
int kvmem_cuda_gather_set_threads(int threads);
/*
 * Attention: the flash kernel (tensor cores, 64-key tiles, GQA heads packed
 * into the rows of one tile so each K/V tile is read once per KV head) with
 * 64-row tiles for prefill chunks and 16-row tiles for decode; the key range
 * is split over blocks (split-K, combined by a second kernel) when the rows
 * alone would not fill the GPU. head_dim 64 or 128.
 */
int kvmem_cuda_attention_bf16(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
			      const int32_t *q_pos, int n_q, const uint16_t *k, const uint16_t *v,
			      const int32_t *kv_pos, int n_kv, size_t kv_stride, int n_heads,
			      int n_kv_heads, int head_dim, float scale);
/* One numbered version of the attention (1: one warp per query head, plain
 * loads, the simple reference; 2: the flash kernel above; 3: the same with
 * 128-row prefill tiles and 32-key decode tiles; 4: 128-row prefill tiles
 * of 4 warps with two 16-row m-tiles each, decode as 2; 5: decode shapes by
 * a one-launch decode kernel, the split combine folded in, other shapes as
 * 4; 6: prefill by a wgmma kernel on sm_90, other devices and shapes as
 * 4), for the checks and the benchmark. The main path's choice is in
 * kernels/cuda/attention.cu. */
int kvmem_cuda_attention_bf16_v(kvmem_cuda_ctx *c, int version, uint16_t *out,
				const uint16_t *q, const int32_t *q_pos, int n_q, const uint16_t *k,
				const uint16_t *v, const int32_t *kv_pos, int n_kv, size_t kv_stride,
				int n_heads, int n_kv_heads, int head_dim, float scale);
/*
 * Decode with the key count in device memory (*n_kv_dev, capped at max_kv;
 * max_kv <= kv_stride): what a CUDA graph of a decode step captures, since
 * the view grows between replays. Rows n_q * (n_heads / n_kv_heads) <= 16
 * (else -EINVAL), kv_pos NULL. Decode splits the keys at offsets that
 * depend only on the key count and the SM count and combines the splits in
 * order, so the bits equal kvmem_cuda_attention_bf16's over the same keys,
 * whatever max_kv, kv_stride or graph. version 0: the main path's.
 */
int kvmem_cuda_attention_decode_bf16(kvmem_cuda_ctx *c, int version, uint16_t *out,
				     const uint16_t *q, const int32_t *q_pos, int n_q,
				     const uint16_t *k, const uint16_t *v, const int32_t *n_kv_dev,
				     int max_kv, size_t kv_stride, int n_heads, int n_kv_heads,
				     int head_dim, float scale);
/* Scratch bytes the decode attention of these shapes takes (reserve them
 * before capturing it); 0 when the shapes are not decode's. */
size_t kvmem_cuda_attention_scratch(const kvmem_cuda_ctx *c, int n_q, int n_heads,
				    int n_kv_heads, int head_dim);
/* Bumped whenever the context's scratch moves: a captured graph that used
 * it must be captured again. */
uint64_t kvmem_cuda_scratch_gen(const kvmem_cuda_ctx *c);
/*
 * After one GEMM into qkv [n][ld] (rows [q heads][k heads][v heads] of
 * head_dim): the per-head RMSNorm of q and k (as kvmem_cuda_headnorm_bf16:
 * k in place), q rotated at pos[t] into q_out [n][n_heads][head_dim] (as
 * kvmem_cuda_rope_bf16), and when set the normalised q, k and the v copied
 * to q_raw, k_raw, v_out ([n][heads][head_dim] each). Twins:
 * kvmem_headnorm_bf16, kvmem_rope_bf16 (kernels/cuda/qkv.cu).
 */
int kvmem_cuda_qk_norm_rope_bf16(kvmem_cuda_ctx *c, uint16_t *qkv, int ld, const uint16_t *q_norm,
				 const uint16_t *k_norm, int n, int n_heads, int n_kv_heads,
				 int head_dim, float eps, const int32_t *pos, double theta,
				 uint16_t *q_out, uint16_t *q_raw, uint16_t *k_raw, uint16_t *v_out);
/*
 * Decode's fused ops (kernels/cuda/gemv.cu; twins kvmem_norm_gemv_bf16 and
 * kvmem_norm_gemv_swiglu_bf16, the compositions of the unfused twins). With
 * "fuse" on (kvmem_cuda_tune, KVMEM_CUDA_FUSE) and one row on the split
 * one-row GEMV, one kernel whose blocks each compute the row's RMSNorm
 * themselves (kvmem_cuda_rmsnorm_bf16's sum and rounding) and stream the
 * weights: the bits of the unfused ops. Otherwise (n > 1, fusion off, a
 * shape the kernel does not take) the unfused ops through the scratch h
 * ([n][in] bf16) and gu ([n][2 inter] bf16), which the fused kernel leaves
 * untouched.
 */
int kvmem_cuda_norm_gemv_bf16(kvmem_cuda_ctx *c, void *y, int mode, const float *x,
			      const uint16_t *norm_w, float eps, const uint16_t *w, uint16_t *h,
			      int n, int in, int out);
int kvmem_cuda_norm_gemv_swiglu_bf16(kvmem_cuda_ctx *c, uint16_t *act, const float *x,
				     const uint16_t *norm_w, float eps, const uint16_t *w,
				     uint16_t *h, uint16_t *gu, int n, int in, int inter);
/*
 * kvmem_cuda_qk_norm_rope_bf16, then kvmem_cuda_view_scatter_bf16 of the
 * one device item `item` from qkv's K and V columns (stage_k = qkv +
 * n_heads * head_dim, stage_v = stage_k + n_kv_heads * head_dim): what a
 * forward pass does per layer. With "fuse" on one kernel does both, with
 * their bits; it takes only the item's layer, slot and n (n: the tokens of
 * these rows, token t at slot + t; the strides are the rows', as the
 * forward pass's item says), and reads the angles of pos from ang when set
 * (kvmem_cuda_rope_angles of the same pos; NULL: it works them out).
 * raw_view (NULL: none) gets the normalised K unrotated at the same slots:
 * the raw K a view keeps beside them (kvmem_cuda_view_scatter_raw_bf16).
 */
/* One row's view for kvmem_cuda_qk_norm_rope_scatter_rows_bf16 (device
 * memory): its K, V and raw K (NULL: none) as the lone call's view_k,
 * view_v, raw_view, its item (device) and capacity. */
typedef struct kvmem_qk_view {
	uint16_t *k, *v, *rk;
	const kvmem_scatter_item *item;
	int cap;
} kvmem_qk_view;
/* The same over n rows of n views (a batched decode step: token t its own
 * view, at its item's slot), one launch; row t gets the bits the entry
 * below gives it alone. "fuse" on only (-ENOTSUP otherwise). */
int kvmem_cuda_qk_norm_rope_scatter_rows_bf16(
	kvmem_cuda_ctx *c, uint16_t *qkv, int ld, const uint16_t *q_norm, const uint16_t *k_norm,
	int n, int n_heads, int n_kv_heads, int head_dim, float eps, const int32_t *pos,
	double theta, uint16_t *q_out, uint16_t *q_raw, uint16_t *k_raw, uint16_t *v_out,
	const kvmem_qk_view *views, int n_layers, const double *ang);
int kvmem_cuda_qk_norm_rope_scatter_bf16(kvmem_cuda_ctx *c, uint16_t *qkv, int ld,
					 const uint16_t *q_norm, const uint16_t *k_norm, int n,
					 int n_heads, int n_kv_heads, int head_dim, float eps,
					 const int32_t *pos, double theta, uint16_t *q_out,
					 uint16_t *q_raw, uint16_t *k_raw, uint16_t *v_out,
					 uint16_t *view_k, uint16_t *view_v, uint16_t *raw_view,
					 const kvmem_scatter_item *item, int n_layers, int cap,
					 const double *ang);
/*
 * A batched decode's greedy draws beside its logits (twin: kvmem_argmax_finite,
 * row by row): out[i] (device int32) = the first of row i's highest logits,
 * or -1 when a logit of the row is NaN or infinite; row i is also copied to
 * dst[i] when dst (a device array of n pointers, or NULL) has one there.
 * logits: [n][vocab] on the device. One block a row.
 */
int kvmem_cuda_argmax_rows(kvmem_cuda_ctx *c, int32_t *out, float *const *dst,
			   const float *logits, int n, int vocab);
/*
 * The rows of a batched step drawn at a temperature (twin: kvmem_sample over
 * each row with its spec's banned ids at -inf, from the state spec.rng),
 * after kvmem_cuda_argmax_rows over the same rows: out[i] = the token for
 * each row whose specs[i].temperature > 0 and whose out[i] is not -1; -1
 * where the host must draw (every logit banned). The banned ids' logits
 * are set to -inf in logits ([n][vocab], the pass's own rows). specs: n on
 * the device. small / narrowed: whether some row has a top-k of 1024 or
 * less (a radix select) / some row has none or a larger one (its rank keys
 * narrowed: kvmem_cuda_draw_rows's second kernel); the host knows.
 */
int kvmem_cuda_draw_rows(kvmem_cuda_ctx *c, int32_t *out, float *logits, int n, int vocab,
			 const kvmem_draw_spec *specs, int small, int narrowed);
/* token: one int32 on the device; rng: the uint64 RNG state on the device
 * (advanced there, so a captured decode graph samples from it); s: host. */
int kvmem_cuda_sample_token(kvmem_cuda_ctx *c, int32_t *token, const float *logits, int vocab,
			    const kvmem_sampler *s, uint64_t *rng);

/* Scorers: g in host memory, arrays on the device. */
int kvmem_cuda_group_queries(kvmem_cuda_ctx *c, float *gq, const float *q, int n_layers, int n_q,
			     int n_heads, int n_kv_heads, int head_dim, double theta, int64_t span);
int kvmem_cuda_head_queries(kvmem_cuda_ctx *c, float *hq, const float *q, int layer, int n_q,
			    int n_heads, int head_dim, double theta, int64_t span);
int kvmem_cuda_score_meank(kvmem_cuda_ctx *c, float *scores, const void *meank, const float *gq,
			   const kvmem_score_geom *g);
int kvmem_cuda_score_subblock(kvmem_cuda_ctx *c, float *scores, const void *sub,
			      const float *gq, const kvmem_score_geom *g);
int kvmem_cuda_score_quest(kvmem_cuda_ctx *c, float *scores, const void *kmin, const void *kmax,
			   const float *q, int n_q, const kvmem_score_geom *g);
/* q_pos, len, blocks: device arrays. */
int kvmem_cuda_token_mass(kvmem_cuda_ctx *c, double *mass, const void *keys, const int32_t *len,
			  const int64_t *blocks, int64_t n, const float *hq, const int64_t *q_pos,
			  int n_q, const kvmem_score_geom *g);
/* out: device int64[min(k, n)]; returns that count like the twin. */
int64_t kvmem_cuda_top_k_blocks(kvmem_cuda_ctx *c, int64_t *out, const float *scores, int64_t n,
				int64_t k);
/*
 * The view's blocks as the planner picks them (kvmem_plan_build: the
 * mandatory claims, then the best-scored rest), on the device: blocks
 * [0, head) and [n - tail, n) are taken (their scores set to +inf in
 * place), then the k best of the others; out (device int64) gets them all
 * in ascending order. Returns their count, min(n, taken + k), or -errno.
 * The planner's order: higher score, ties to the later block, NaN lowest.
 */
int64_t kvmem_cuda_plan_blocks(kvmem_cuda_ctx *c, int64_t *out, float *scores, int64_t n,
			       int64_t head, int64_t tail, int64_t k);
/* The index on the GPU (kernels/cuda/index.cu): twin kvmem_index_append_bf16,
 * every array on the device, g in host memory. */
int kvmem_cuda_index_append(kvmem_cuda_ctx *c, void *meank, void *kmin, void *kmax, void *sub,
			    float *open_sum, float *open_sub, const uint16_t *raw_k, int64_t first,
			    int n, const kvmem_score_geom *g);

/* Rows into pages in host memory (kernels/cuda/pages.cu), twin
 * kvmem_rows_to_pages_bf16: k and v [n][H][D] on the device; pages[] host
 * memory (pinned or registered, else each copy waits), written by copies
 * queued on `stream` (a cudaStream_t; NULL: the context's); stage device
 * memory of at least ((t0 + n - 1) / B + 1) pages of 2 H B D bf16, which
 * the copies read until they are done. */
int kvmem_cuda_rows_to_pages_bf16(kvmem_cuda_ctx *c, void *stream, uint16_t *stage,
				  void *const *pages, int t0, int n, const uint16_t *k,
				  const uint16_t *v, int H, int B, int D);
/* The same into fp8 pages (each row quantised: kvmem_fp8_quant_row of the
 * widened bf16), twin kvmem_rows_to_pages_fp8; stage of at least ((t0 + n -
 * 1) / B + 1) pages of 2 H B D + 8 H B bytes (no more than the bf16 form's
 * for D >= 4). */
int kvmem_cuda_rows_to_pages_fp8(kvmem_cuda_ctx *c, void *stream, void *stage,
				 void *const *pages, int t0, int n, const uint16_t *k,
				 const uint16_t *v, int H, int B, int D);

/* Fills (kernels/cuda/fill.cu), twins kvmem_random_bf16 / kvmem_fill_bf16. */
int kvmem_cuda_random_bf16(kvmem_cuda_ctx *c, uint16_t *dst, size_t n, uint64_t seed,
			   float scale);
int kvmem_cuda_fill_bf16(kvmem_cuda_ctx *c, uint16_t *dst, size_t n, float v);

#ifdef __cplusplus
}
#endif
#endif

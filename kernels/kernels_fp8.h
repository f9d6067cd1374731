/* SPDX-License-Identifier: MIT */
/*
 * fp8 KV: the e4m3 number format and its scales, CPU twins of
 * kernels/cuda/fp8.cu (kvmem_cuda_fp8_*).
 *
 * e4m3 ("fn", as Hopper's cvt and OCP's FP8 spell it): 1 sign bit, 4
 * exponent bits (bias 7), 3 mantissa bits; no infinity; 0x7f / 0xff are
 * NaN; the largest finite value is 448, the smallest normal 2^-6, the
 * subnormals m * 2^-9 (m = 1..7). Conversion from fp32 rounds to nearest
 * even and saturates: anything finite or infinite beyond 448 becomes +-448
 * (".satfinite"), a NaN becomes 0x7f (either sign).
 *
 * Scales: one per row of head_dim values (one token in one KV head), a
 * power of two 2^e, the smallest that brings the row's largest finite
 * magnitude to at most 448 (so it lands in (224, 448]), clamped to
 * [2^-126, 2^120]; 1 for a row of zeros. Per row and not per block: a
 * token's bytes are fixed the moment it is computed, whatever comes after
 * it in its block, so a forward pass can attend to fp8 K/V it has just
 * written, a decode step never rewrites an earlier token, and a chunked
 * prefill gives the bytes of a token-by-token one (a per-block scale would
 * change with the block's later tokens). A power of two makes x / scale
 * and q * scale exact: the CPU and the GPU agree bit for bit, and
 * dequantising never rounds. The cost is 4 bytes per 128-byte row (3%).
 *
 * An fp8 page (Documentation/formats.md): K bytes [H][B][D], V bytes
 * [H][B][D], K scales [H][B] then V scales [H][B] as fp32.
 */
#ifndef KVMEM_KERNELS_FP8_H
#define KVMEM_KERNELS_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels_bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVMEM_E4M3_MAX 448.0f
#define KVMEM_E4M3_NAN 0x7f

float kvmem_e4m3_to_f32(uint8_t q);
uint8_t kvmem_f32_to_e4m3(float x);	/* nearest even, saturating, NaN kept */

/* The scale of a row of n values (a power of two; see above). */
float kvmem_fp8_row_scale(const float *x, int n);
/* q[i] = e4m3(x[i] / scale), *scale the row's: one row of n values. */
void kvmem_fp8_quant_row(uint8_t *q, float *scale, const float *x, int n);
/* x[i] = q[i] * scale (exact). */
void kvmem_fp8_dequant_row(float *x, const uint8_t *q, float scale, int n);
/* rows rows of n values each, in place: what quantising and dequantising
 * them gives (the values an fp8 view holds), the same bits as the two
 * calls above. */
void kvmem_fp8_roundtrip_rows(float *x, size_t rows, int n);

/* One layer's n rows of a forward pass, k and v [n][H][D] bf16, into fp8
 * pages (the layout above) as kvmem_rows_to_pages_bf16 puts them into bf16
 * ones: token j at pages[(t0 + j) / B], token (t0 + j) % B, each row
 * quantised with its own scale (kvmem_fp8_quant_row of the widened row);
 * nothing else in the pages changes. D <= 1024. */
void kvmem_rows_to_pages_fp8(void *const *pages, int t0, int n, const uint16_t *k,
			     const uint16_t *v, int H, int B, int D);

/*
 * The K row an fp8 view holds at slot pos (kernels/cuda/fp8_view.cu, the
 * cuda backend's fp8 views): the raw row (e4m3 bytes raw[head_dim], scale
 * raw_scale) dequantised, rotated at pos in double and rounded to fp32, then
 * quantised with scale 2 * raw_scale (rotation lifts a component to at most
 * sqrt(2) of the row's largest, so it never saturates): q[head_dim] and
 * *scale. The V row is the raw one as it is.
 */
void kvmem_fp8_view_k_row(uint8_t *q, float *scale, const uint8_t *raw, float raw_scale,
			  int32_t pos, int head_dim, double theta);
/* Twins of kvmem_cuda_fp8_view_put and kvmem_cuda_fp8_view_gather
 * (kernels/kernels_cuda_fp8.h), host pointers, item in host memory; raw_k /
 * raw_scale (NULL: none) get the raw K bytes and scale at the same slots. */
void kvmem_fp8_view_put(uint8_t *view_k, uint8_t *view_v, float *k_scale, float *v_scale,
			uint8_t *raw_k, float *raw_scale, const uint16_t *rows_k, const uint16_t *rows_v, int ld,
			const kvmem_scatter_item *item, int n, int n_kv_heads, int head_dim, int cap,
			double theta);
void kvmem_fp8_view_gather(uint8_t *view_k, uint8_t *view_v, float *k_scale, float *v_scale,
			   uint8_t *raw_k, float *raw_scale, const kvmem_gather_item *items, int n_items, int n_layers,
			   int n_kv_heads, int head_dim, int cap, double theta);

/*
 * A research knob, not a page format (kernels/cpu/fp8_round.c): how the cpu
 * backend rounds each new token's raw K and V (KVMEM_CPU_KV_ROUND, over
 * its own fp32 KV). K is rounded before RoPE, as --kv-dtype fp8 rounds it.
 */
enum kvmem_kv_round {
	KVMEM_KV_ROUND_NONE,	/* fp32 as computed */
	KVMEM_KV_ROUND_BF16,	/* K and V to bf16: the cuda backend's own KV */
	KVMEM_KV_ROUND_FP8,	/* K and V through e4m3, a scale a row (--kv-dtype fp8) */
	KVMEM_KV_ROUND_FP8_K,	/* K as fp8, V kept fp32 */
	KVMEM_KV_ROUND_FP8_V,	/* V as fp8, K kept fp32 */
	KVMEM_KV_ROUND_FP8_G32,	/* K and V through e4m3, a scale per 32 channels */
	KVMEM_KV_ROUND_FP8_G16,	/* ... per 16 channels */
	/* K and V as int8 with an fp32 scale a row (largest magnitude / 127):
	 * the bytes of fp8, a uniform grid instead of a 3-bit mantissa */
	KVMEM_KV_ROUND_INT8,
	/* K centred (kvmem_fp8_centred_roundtrip): a block's fp32 mean per
	 * KV head plus e4m3 of each row less it, a scale a row; V as fp8 */
	KVMEM_KV_ROUND_FP8_KC,
	KVMEM_KV_ROUND_FP8_KC_K,	/* K centred as fp8-kc, V kept fp32 */
};
/* The mode a value of the knob names ("" or NULL: none), or -EINVAL with
 * a message that lists the values. */
int kvmem_kv_round_parse(const char *s);
const char *kvmem_kv_round_name(int mode);
/* rows rows of n values of K (is_v 0) or V (is_v 1), in place, as mode
 * rounds them. The centred modes take K's rows as one block of one head. */
void kvmem_kv_round_rows(float *x, size_t rows, int n, int mode, int is_v);
/* n_tok tokens' K rows [n_tok][heads][n] at slots pos0.. (blocks of `block`
 * slots from slot 0), in place: a centred mode centres each block the run
 * holds whole, per head, and rounds the rows of a block it holds in part as
 * fp8 a row (their block's mean is not known yet: the conservative choice;
 * a real page would keep them in a full-precision tail); any other mode is
 * kvmem_kv_round_rows. */
void kvmem_kv_round_k_run(float *k, int n_tok, int heads, int n, int64_t pos0, int block,
			  int mode);
/* rows rows of n values (n <= 1024), row r at x + r * ld, in place, as one
 * centred block: m = their mean per channel (summed in double, kept fp32),
 * each row m + e4m3((row - m) / s) * s in fp32, s the residual's row scale.
 * Attention's q.k' = q.m + q.(k' - m): a channel's shared offset is kept
 * exactly and the 3-bit mantissa errs only on what varies. */
void kvmem_fp8_centred_roundtrip(float *x, size_t rows, size_t ld, int n);
/* kvmem_fp8_roundtrip_rows on every run of `group` values of each row (the
 * last run shorter when group does not divide n): a scale per group. */
void kvmem_fp8_roundtrip_groups(float *x, size_t rows, int n, int group);
/* rows rows of n values, in place: q = rint(x / s) in -127..127 times s,
 * s = the row's largest finite magnitude / 127 (a row of zeros kept). */
void kvmem_int8_roundtrip_rows(float *x, size_t rows, int n);

/* ---- twins of kernels/cuda/fp8.cu (kernels/kernels_cuda_fp8.h) ---------- */
/* rows rows of n values of x (x_dtype KVMEM_DTYPE_F32, or _BF16: a GPU's
 * rows, widened exactly) to q[rows][n] and scale[rows]. -EINVAL on another
 * dtype. */
int kvmem_fp8_quant_rows(uint8_t *q, float *scale, const void *x, int x_dtype, size_t rows,
			 int n);
/* out[r][i] = bf16(q[r][i] * scale[r]): the value exact in fp32, one
 * rounding (none unless it falls below bf16's normal range). */
void kvmem_fp8_dequant_rows_bf16(uint16_t *out, const uint8_t *q, const float *scale,
				 size_t rows, int n);
/*
 * Decode attention of one token over every key of a view layer whose K and
 * V are bf16 (kv_dtype KVMEM_DTYPE_BF16) or fp8 (KVMEM_DTYPE_FP8, with
 * their row scales k_scale / v_scale [n_kv_heads][kv_stride]):
 *   q    [n_heads][head_dim] bf16 (rotated), out the same shape, bf16
 *   k, v [n_kv_heads][kv_stride][head_dim], keys 0..n_kv-1 all visible
 * The twin widens (dequantises) K and V to fp32 and calls kvmem_attention,
 * then rounds to bf16. -EINVAL on bad sizes or dtype.
 */
int kvmem_decode_kv_bf16(uint16_t *out, const uint16_t *q, const void *k, const void *v,
			 const float *k_scale, const float *v_scale, int kv_dtype, int n_kv,
			 size_t kv_stride, int n_heads, int n_kv_heads, int head_dim, float scale);
/*
 * The same for n_q query tokens at positions q_pos (q, out [n_q][n_heads]
 * [head_dim]), causal with keys at slot = position: the twin of a prefill
 * chunk over a view layer, kvmem_cuda_attention_fp8 (fp8) and
 * kvmem_cuda_attention_bf16 (bf16).
 */
int kvmem_attention_kv_bf16(uint16_t *out, const uint16_t *q, const int32_t *q_pos, int n_q,
			    const void *k, const void *v, const float *k_scale,
			    const float *v_scale, int kv_dtype, int n_kv, size_t kv_stride,
			    int n_heads, int n_kv_heads, int head_dim, float scale);

#ifdef __cplusplus
}
#endif
#endif

/* SPDX-License-Identifier: MIT */
/*
 * fp8 KV on the GPU (kernels/cuda/fp8.cu): the CUDA versions of the twins
 * in kernels/kernels_fp8.h, with a kvmem_cuda_ctx first and device
 * pointers. tests/gpu/check_fp8.c compares each with its twin (quantising
 * and dequantising bit for bit; attention within Documentation/kernels.md's
 * tolerance) and times them.
 */
#ifndef KVMEM_KERNELS_CUDA_FP8_H
#define KVMEM_KERNELS_CUDA_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kvmem_fp8_quant_rows: one warp a row; n <= 1024. */
int kvmem_cuda_fp8_quant_rows(kvmem_cuda_ctx *c, uint8_t *q, float *scale, const void *x,
			      int x_dtype, size_t rows, int n);
/* kvmem_fp8_dequant_rows_bf16. */
int kvmem_cuda_fp8_dequant_rows_bf16(kvmem_cuda_ctx *c, uint16_t *out, const uint8_t *q,
				     const float *scale, size_t rows, int n);
/*
 * kvmem_decode_kv_bf16: split-K flash decoding (tiles of 32 keys a warp:
 * each lane scores one key, the warp then sums the tile's V), K and V read
 * as bf16 or as e4m3 bytes dequantised in registers; head_dim 64 or 128,
 * n_heads / n_kv_heads 1, 2, 4 or 8 (-ENOTSUP otherwise). Partial sums in
 * the context's scratch.
 */
int kvmem_cuda_decode_kv_bf16(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
			      const void *k, const void *v, const float *k_scale,
			      const float *v_scale, int kv_dtype, int n_kv, size_t kv_stride,
			      int n_heads, int n_kv_heads, int head_dim, float scale);

/*
 * fp8 views (fp8_view.cu; twins in kernels/kernels_fp8.h): [n_layers]
 * [n_kv_heads][cap][head_dim] e4m3 K (rotated) and V, scales [n_layers]
 * [n_kv_heads][cap] fp32. A view K row is its raw K's bytes (scale s)
 * dequantised, rotated at the slot, quantised with scale 2s; V the raw
 * bytes and scale.
 * put: the n new tokens' rows from bf16 (row t of head h at rows + t * ld +
 * h * head_dim: the forward pass's normalised K and V columns), quantised
 * as kvmem_cuda_fp8_quant_rows does, at the device item's layer and slot.
 * gather: items of fp8 pages (dtype KVMEM_DTYPE_FP8 with scales) the device
 * can address. Both also write the raw K bytes and scale (the page's) at
 * the same slots of raw_k / raw_scale, the view's layout, when set (NULL:
 * the view keeps none). view_bf16: one layer's slots 0..len-1 as bf16
 * [n_kv_heads][out_stride][head_dim] (head_dim % 8 == 0): what attention
 * reads. snap: a move's sources copied aside (below), so the gather can
 * read them as pages while it writes the view.
 */
typedef struct kvmem_fp8_snap {
	int32_t layer, n;	/* slots from..from+n-1 of layer */
	int64_t from;
	int64_t off;		/* bytes into st: raw K then V [n_kv_heads][n][head_dim],
				 * their scales [n_kv_heads][n]; 16-byte aligned */
} kvmem_fp8_snap;
int kvmem_cuda_fp8_view_snap(kvmem_cuda_ctx *c, char *st, const kvmem_fp8_snap *items,
			     int n_items, const uint8_t *raw_k, const uint8_t *view_v,
			     const float *raw_scale, const float *v_scale, int n_kv_heads,
			     int head_dim, int cap);
int kvmem_cuda_fp8_view_put(kvmem_cuda_ctx *c, uint8_t *view_k, uint8_t *view_v, float *k_scale,
			    float *v_scale, uint8_t *raw_k, float *raw_scale,
			    const uint16_t *rows_k, const uint16_t *rows_v, int ld,
			    const kvmem_scatter_item *item, int n, int n_kv_heads, int head_dim,
			    int cap, double theta);
/*
 * put_rows: the put of a batched decode step, n rows each into its own
 * view (views: device memory, [n]): row i's K and V at rows_k + i * ld and
 * rows_v + i * ld, one token at views[i].item's layer and slot; each
 * view's bytes those of kvmem_cuda_fp8_view_put of that row alone.
 */
typedef struct kvmem_fp8_put_view {
	uint8_t *k8, *v8;		/* the view's K and V bytes */
	float *ks, *vs;			/* their scales */
	uint8_t *raw_k;			/* raw K bytes and scales, or NULL */
	float *raw_scale;
	const kvmem_scatter_item *item;	/* device: layer and slot (n = 1) */
	int cap;
} kvmem_fp8_put_view;
int kvmem_cuda_fp8_view_put_rows(kvmem_cuda_ctx *c, const kvmem_fp8_put_view *views,
				 const uint16_t *rows_k, const uint16_t *rows_v, int ld, int n,
				 int n_kv_heads, int head_dim, double theta);
/* run: items a block takes (>= 1). Consecutive items at the same slots
 * (a block of tokens' layers, as the session queues them) share their
 * rotary angles within a block: run is best their count. */
int kvmem_cuda_fp8_view_gather(kvmem_cuda_ctx *c, uint8_t *view_k, uint8_t *view_v,
			       float *k_scale, float *v_scale, uint8_t *raw_k, float *raw_scale,
			       const kvmem_gather_item *items, int n_items, int run, int n_layers,
			       int n_kv_heads, int head_dim, int cap, double theta);
int kvmem_cuda_fp8_view_bf16(kvmem_cuda_ctx *c, uint16_t *out_k, uint16_t *out_v, int out_stride,
			     const uint8_t *view_k, const uint8_t *view_v, const float *k_scale,
			     const float *v_scale, int n_kv_heads, int len, int cap, int head_dim);
/*
 * Decode attention (attention.cu, v5) over an fp8 view's layer: k, v e4m3
 * [n_kv_heads][kv_stride][head_dim], k_scale / v_scale [n_kv_heads]
 * [kv_stride], the key count on the device, arguments otherwise as
 * kvmem_cuda_attention_decode_bf16's, and its bits over the same rows
 * dequantised to bf16 (kvmem_cuda_fp8_view_bf16). -ENOTSUP when the main
 * path's decode is not v5 (KVMEM_CUDA_DECODE).
 */
int kvmem_cuda_attention_decode_fp8(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
				    const int32_t *q_pos, int n_q, const uint8_t *k,
				    const uint8_t *v, const float *k_scale, const float *v_scale,
				    const int32_t *n_kv_dev, int max_kv, size_t kv_stride,
				    int n_heads, int n_kv_heads, int head_dim, float scale);
/*
 * Prefill attention (attention.cu, v4's flash kernel reading e4m3 tiles)
 * over an fp8 view's layer: k, v, k_scale, v_scale as above, keys at slot
 * = position, the key count from the host, arguments otherwise as
 * kvmem_cuda_attention_bf16_v's; the bits of v4 over the same rows
 * dequantised to bf16 (twin: kvmem_attention_kv_bf16), decode shapes (at
 * most 16 rows a KV head, which the main path gives to v5 and fp8 views to
 * kvmem_cuda_attention_decode_fp8) included.
 */
int kvmem_cuda_attention_fp8(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
			     const int32_t *q_pos, int n_q, const uint8_t *k, const uint8_t *v,
			     const float *k_scale, const float *v_scale, int n_kv, size_t kv_stride,
			     int n_heads, int n_kv_heads, int head_dim, float scale);
/* 1 when kvmem_cuda_attention_bf16 runs v4 for this prefill shape (the
 * bits kvmem_cuda_attention_fp8 gives); 0 for v6 and the others. */
int kvmem_cuda_attention_fp8_same(const kvmem_cuda_ctx *c, int n_q, int n_heads, int n_kv_heads,
				  int head_dim);

#ifdef __cplusplus
}
#endif
#endif
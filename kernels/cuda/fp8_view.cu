// SPDX-License-Identifier: MIT
/*
 * fp8 views on the GPU (the cuda backend's kv_dtype fp8; CPU twins in
 * kernels/cpu/fp8_view.c, kernels/kernels_fp8.h).
 *
 * A view slot of an fp8 view holds, per KV head, K rotated at the slot and
 * V, as e4m3 bytes with one fp32 scale per row:
 *   V: the page's bytes and scale as they are (the token's V quantised by
 *      kvmem_fp8_quant_row);
 *   K: the page's raw K (pre-RoPE, e4m3 with scale s) dequantised exactly,
 *      rotated at the slot in double (rope.cuh's angles, explicit
 *      round-to-nearest products, one rounding to fp32), then quantised
 *      again with scale 2s. Rotation can lift a component to sqrt(2) times
 *      the row's largest raw magnitude (448 s at most), so 2s never
 *      saturates; a power of two keeps the division exact, and e4m3's
 *      relative step is the same at any scale (only the subnormal edge
 *      moves by one binade). A key is always rotated from the raw fp8
 *      bytes, never from a rotated copy.
 * The forward pass makes a new token's rows the same way from its bf16 K
 * and V (quantised as kvmem_fp8_quant_rows does: the bytes and scales the
 * host writes into the token's page), so a token placed from its page at
 * the slot the forward pass gave it gets the same bits.
 *
 * Attention reads the view through kvmem_cuda_fp8_view_bf16 (a layer's
 * rows dequantised to bf16: e4m3 x 2^e is exact in bf16), then the bf16
 * kernels: the first step, which keeps the bf16 path's bits over the
 * dequantised keys.
 */
#include "fp8.cuh"
#include "rope.cuh"
#include "kernels/kernels_cuda_fp8.h"

/* One rotary pair (a, b) of raw K (dequantised) at position pos, i of
 * half, as e4m3 bytes of the view at scale 1 / inv2s. */
__device__ __forceinline__ void f8_rot_cs(uint8_t *x8, uint8_t *y8, float a, float b, double cs,
					  double sn, float inv2s)
{
	const float x = (float)__dsub_rn(__dmul_rn((double)a, cs), __dmul_rn((double)b, sn));
	const float y = (float)__dadd_rn(__dmul_rn((double)b, cs), __dmul_rn((double)a, sn));

	*x8 = f32_to_e4m3(x * inv2s);
	*y8 = f32_to_e4m3(y * inv2s);
}

/* The same rotation, its two fp32 results (f8_rot_cs before the encode). */
__device__ __forceinline__ void f8_rot_f32(float *x, float *y, float a, float b, double cs,
					   double sn)
{
	*x = (float)__dsub_rn(__dmul_rn((double)a, cs), __dmul_rn((double)b, sn));
	*y = (float)__dadd_rn(__dmul_rn((double)b, cs), __dmul_rn((double)a, sn));
}

/* ---- the forward pass's new rows ----------------------------------------- */
/* Tokens a block of f8_put_kernel takes: their rotary angles are computed
 * once into shared memory for every KV head's warp (as the gather does,
 * below). Computed per (token, head, pair), a prefill chunk paid the
 * double-precision pow and sincos n_kv times over. */
#define FP_TOK 4

/* Tokens t0..t0+nt-1 of rows rk, rv (row t of head h at x + t * ld + h *
 * hd) into the view at item it's layer and slot: a warp per (token, KV
 * head, K or V) row, the block's warps taking its rows in turn. */
__device__ __forceinline__ void f8_put_block(uint8_t *k8, uint8_t *v8, float *ks, float *vs,
					     uint8_t *raw8, float *raws, const uint16_t *rk,
					     const uint16_t *rv, int ld, const kvmem_scatter_item it,
					     int t0, int nt, int n_kv, int hd, int cap, double theta)
{
	const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, half = hd / 2;
	__shared__ double cs_s[FP_TOK * ROPE_HALF_MAX], sn_s[FP_TOK * ROPE_HALF_MAX];

	for (int x = threadIdx.x; x < nt * half; x += blockDim.x)
		rope_angle(it.slot + t0 + x / half, x % half, hd, theta, &sn_s[x], &cs_s[x]);
	__syncthreads();
	for (int row = warp; row < 2 * nt * n_kv; row += blockDim.x / 32) {
		const int isv = row & 1, tl = (row >> 1) / n_kv, t = t0 + tl, h = (row >> 1) % n_kv;
		const uint16_t *x = (isv ? rv : rk) + (size_t)t * ld + (size_t)h * hd;
		const size_t d = ((size_t)it.layer * n_kv + h) * cap + it.slot + t;

		if (it.slot + t >= cap)
			continue;	/* the warp's whole row */
		const float s = fp8_warp_row_scale(x, hd, lane), inv = 1.0f / s;	/* exact: s = 2^e */

		if (isv) {
			for (int i = lane; i < hd; i += 32)
				v8[d * hd + i] = f32_to_e4m3(bf2f(x[i]) * inv);
			if (!lane)
				vs[d] = s;
			continue;
		}
		for (int i = lane; i < half; i += 32) {
			const uint8_t qa = f32_to_e4m3(bf2f(x[i]) * inv);
			const uint8_t qb = f32_to_e4m3(bf2f(x[i + half]) * inv);

			f8_rot_cs(k8 + d * hd + i, k8 + d * hd + i + half, e4m3_to_f32(qa) * s,
				  e4m3_to_f32(qb) * s, cs_s[tl * half + i], sn_s[tl * half + i],
				  0.5f * inv);
			if (raw8) {	/* the raw K kept beside the view: the page's bytes */
				raw8[d * hd + i] = qa;
				raw8[d * hd + i + half] = qb;
			}
		}
		if (!lane) {
			ks[d] = 2.0f * s;
			if (raws)
				raws[d] = s;
		}
	}
}

/* A block per FP_TOK tokens of one view. */
__global__ void __launch_bounds__(256)
f8_put_kernel(uint8_t *k8, uint8_t *v8, float *ks, float *vs, uint8_t *raw8, float *raws,
	      const uint16_t *rk, const uint16_t *rv, int ld, const kvmem_scatter_item *item,
	      int n, int n_kv, int hd, int cap, double theta)
{
	const int t0 = blockIdx.x * FP_TOK;

	/* the slot from the device: graphs */
	f8_put_block(k8, v8, ks, vs, raw8, raws, rk, rv, ld, *item, t0, min(FP_TOK, n - t0), n_kv,
		     hd, cap, theta);
}

/* A block per row, each into its own view (a batched decode step). */
__global__ void __launch_bounds__(256)
f8_put_rows_kernel(const kvmem_fp8_put_view *views, const uint16_t *rk, const uint16_t *rv,
		   int ld, int n_kv, int hd, double theta)
{
	const kvmem_fp8_put_view w = views[blockIdx.x];
	const size_t at = (size_t)blockIdx.x * ld;

	f8_put_block(w.k8, w.v8, w.ks, w.vs, w.raw_k, w.raw_scale, rk + at, rv + at, ld, *w.item,
		     0, 1, n_kv, hd, w.cap, theta);
}

extern "C" int kvmem_cuda_fp8_view_put(kvmem_cuda_ctx *c, uint8_t *view_k, uint8_t *view_v,
				       float *k_scale, float *v_scale, uint8_t *raw_k,
				       float *raw_scale, const uint16_t *rows_k,
				       const uint16_t *rows_v, int ld, const kvmem_scatter_item *item,
				       int n, int n_kv_heads, int head_dim, int cap, double theta)
{
	if (n < 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 ||
	    head_dim > 2 * ROPE_HALF_MAX || cap < 0)
		return kvmem_error(EINVAL, "fp8 view put: %d tokens of %d KV heads x %d", n,
				   n_kv_heads, head_dim);
	if (!n)
		return 0;
	f8_put_kernel<<<(n + FP_TOK - 1) / FP_TOK, 256, 0, c->stream>>>(
		view_k, view_v, k_scale, v_scale, raw_k, raw_scale, rows_k, rows_v, ld, item, n,
		n_kv_heads, head_dim, cap, theta);
	return kvmem_cuda_launched("fp8 view put");
}

extern "C" int kvmem_cuda_fp8_view_put_rows(kvmem_cuda_ctx *c, const kvmem_fp8_put_view *views,
					    const uint16_t *rows_k, const uint16_t *rows_v, int ld,
					    int n, int n_kv_heads, int head_dim, double theta)
{
	if (n < 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 ||
	    head_dim > 2 * ROPE_HALF_MAX)
		return kvmem_error(EINVAL, "fp8 view put (rows): %d rows of %d KV heads x %d", n,
				   n_kv_heads, head_dim);
	if (!n)
		return 0;
	f8_put_rows_kernel<<<n, 256, 0, c->stream>>>(views, rows_k, rows_v, ld, n_kv_heads,
						      head_dim, theta);
	return kvmem_cuda_launched("fp8 view put (rows)");
}

/* ---- rematerialisation from fp8 pages ------------------------------------ */
/*
 * Grid (items / run, FG_Y), 256 threads; a thread moves 16 bytes: a V
 * chunk (16 dims), or a K chunk pair (dims c..c+15 and their rotary
 * partners c+half..: one 16-byte load each). 12 tasks a token and KV head
 * at head_dim 128. Pages read over PCIe (mapped pinned host memory) move in
 * 16-byte requests, as a bf16 page's do: half the requests of bf16 for the
 * same tokens, where 8-byte ones made as many requests as bf16's (the
 * 1.27 of benchmarks.md, "fp8 KV"). Addresses not 16-byte aligned take
 * byte loads, the same arithmetic.
 */
#define FG_Y 8
/* Tokens a block takes at a time: their rotary angles are computed once
 * into shared memory and used by every KV head's threads (the bf16
 * gather's way, gather.cu). Computed per (token, head, pair) as before
 * 2026-12-02, the double-precision pow and sincos were most of an fp8
 * placement: 24 ns a token-layer against bf16's 9 (bench step, 32K view). */
#define FG_TOK 4

__device__ __forceinline__ void load16(uint8_t *o, const uint8_t *p, bool vec)
{
	if (vec) {
		*(uint4 *)o = *(const uint4 *)p;
	} else {
		for (int j = 0; j < 16; j++)
			o[j] = p[j];
	}
}

/* CVT: the e4m3 decode and encode of a K chunk by cvt, two values an
 * instruction (fp8_gather_cvt, the default), where the field decode and
 * one cvt a value were most of the kernel's instructions (ncu: 74% of
 * issue slots busy, 15% of DRAM; benchmarks.md, "Prefill attention over
 * fp8"). Both exact, so the same bits; the rotation is the twin's, in
 * double, either way.
 *
 * A block takes `run` consecutive items. The session queues a block of
 * tokens' layers one after another (the same slots), so the angles of the
 * block's tokens are computed once for all of them; they are computed
 * again only where an item's slots differ from the last. A thread's tasks
 * are K chunk pairs first, then V chunks: a warp mixing the two ran both
 * paths, each with a third or two thirds of its lanes. */
template <int CVT>
__global__ void __launch_bounds__(256, 4)	/* 64 registers: four blocks an SM */
f8_gather_kernel(uint8_t *k8, uint8_t *v8, float *ks, float *vs, uint8_t *raw8, float *raws,
		 const kvmem_gather_item *items, int n_items, int run, int n_layers, int n_kv,
		 int hd, int cap, double theta)
{
	const int half = hd / 2, tk = half / 16, tv = hd / 16;
	const int first = blockIdx.x * run, last = min(n_items, first + run);
	__shared__ double fr_s[ROPE_HALF_MAX];
	__shared__ double cs_s[FG_TOK * ROPE_HALF_MAX], sn_s[FG_TOK * ROPE_HALF_MAX];
	int have = -1;	/* the position cs_s/sn_s start at (uniform) */

	for (int x = threadIdx.x; x < half; x += blockDim.x)
		fr_s[x] = rope_freq(x, hd, theta);	/* seen after the first sync below */
	for (int at = first; at < last; at++) {
		const kvmem_gather_item m = items[at];

		if (m.layer < 0 || m.layer >= n_layers || m.slot < 0 || m.n < 0 ||
		    m.slot > cap - m.n || m.dtype != KVMEM_DTYPE_FP8 || !m.k_scale || !m.v_scale)
			continue;	/* uniform (the host checked them) */
		const bool vec = ((uintptr_t)m.k & 15) == 0 && ((uintptr_t)m.v & 15) == 0 &&
				 m.head_stride % 16 == 0;

		for (int t0 = blockIdx.y * FG_TOK; t0 < m.n; t0 += gridDim.y * FG_TOK) {
			const int nt = min(FG_TOK, m.n - t0), nk = nt * n_kv * tk;

			if (m.slot + t0 != have) {	/* every FG_TOK tokens' angles */
				have = m.slot + t0;
				__syncthreads();	/* the previous angles are used up */
				for (int x = threadIdx.x; x < FG_TOK * half; x += blockDim.x)
					rope_angle_of(have + x / half, fr_s[x % half], &sn_s[x],
						      &cs_s[x]);
				__syncthreads();
			}
			for (int task = threadIdx.x; task < nk + nt * n_kv * tv;
			     task += blockDim.x) {
				const bool is_k = task < nk;
				const int c = is_k ? task % tk : (task - nk) % tv;
				const int r = is_k ? task / tk : (task - nk) / tv;
				const int tl = r / n_kv, t = t0 + tl, h = r % n_kv;
				const size_t off = (size_t)t * hd + (size_t)h * m.head_stride;
				const size_t srow = (size_t)h * m.scale_stride + t;
				const size_t d = ((size_t)m.layer * n_kv + h) * cap + m.slot + t;

				if (!is_k) {	/* V: the bytes and the scale as they are */
					const int i0 = c * 16;
					__align__(16) uint8_t b[16];

					load16(b, (const uint8_t *)m.v + off + i0, vec);
					*(uint4 *)(v8 + d * hd + i0) = *(const uint4 *)b;
					if (c == 0)
						vs[d] = m.v_scale[srow];
					continue;
				}
				const int i0 = c * 16;
				const float s = m.k_scale[srow], inv2s = 0.5f / s;
				const double *cs = cs_s + tl * half + i0, *sn = sn_s + tl * half + i0;
				__align__(16) uint8_t a[16], b[16], x[16], y[16];

				load16(a, (const uint8_t *)m.k + off + i0, vec);
				load16(b, (const uint8_t *)m.k + off + half + i0, vec);
				if (CVT) {
#pragma unroll
					for (int j = 0; j < 16; j += 2) {
						float a0, a1, b0, b1, x0, x1, y0, y1;

						e4m3x2_to_f32((uint16_t)(a[j] | a[j + 1] << 8), &a0, &a1);
						e4m3x2_to_f32((uint16_t)(b[j] | b[j + 1] << 8), &b0, &b1);
						f8_rot_f32(&x0, &y0, a0 * s, b0 * s, cs[j], sn[j]);
						f8_rot_f32(&x1, &y1, a1 * s, b1 * s, cs[j + 1], sn[j + 1]);
						const uint16_t xx = f32x2_to_e4m3x2(x0 * inv2s, x1 * inv2s);
						const uint16_t yy = f32x2_to_e4m3x2(y0 * inv2s, y1 * inv2s);

						x[j] = (uint8_t)xx, x[j + 1] = (uint8_t)(xx >> 8);
						y[j] = (uint8_t)yy, y[j + 1] = (uint8_t)(yy >> 8);
					}
				} else {
					for (int j = 0; j < 16; j++)
						f8_rot_cs(&x[j], &y[j], e4m3_to_f32(a[j]) * s,
							  e4m3_to_f32(b[j]) * s, cs[j], sn[j], inv2s);
				}
				*(uint4 *)(k8 + d * hd + i0) = *(const uint4 *)x;
				*(uint4 *)(k8 + d * hd + half + i0) = *(const uint4 *)y;
				if (raw8) {	/* the raw K kept beside the view */
					*(uint4 *)(raw8 + d * hd + i0) = *(const uint4 *)a;
					*(uint4 *)(raw8 + d * hd + half + i0) = *(const uint4 *)b;
				}
				if (c == 0) {
					ks[d] = 2.0f * s;
					if (raws)
						raws[d] = s;
				}
			}
		}
	}
}

extern "C" int kvmem_cuda_fp8_view_gather(kvmem_cuda_ctx *c, uint8_t *view_k, uint8_t *view_v,
					  float *k_scale, float *v_scale, uint8_t *raw_k,
					  float *raw_scale, const kvmem_gather_item *items, int n_items,
					  int run, int n_layers, int n_kv_heads, int head_dim, int cap,
					  double theta)
{
	if (n_items < 0 || run < 1 || n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 ||
	    head_dim > 2 * ROPE_HALF_MAX || cap < 0)
		return kvmem_error(EINVAL, "fp8 view gather: %d items (%d a block) into %d layers x "
				   "%d heads x %d", n_items, run, n_layers, n_kv_heads, head_dim);
	if (head_dim % 32)
		return kvmem_error(ENOTSUP, "fp8 view gather: head_dim %d (a multiple of 32)",
				   head_dim);
	if (!n_items)
		return 0;
	run = gather_run(c, run, n_items, FG_Y);
	const dim3 grid((n_items + run - 1) / run, FG_Y);

	if (c->fp8_gather_cvt)
		f8_gather_kernel<1><<<grid, 256, 0, c->stream>>>(
			view_k, view_v, k_scale, v_scale, raw_k, raw_scale, items, n_items, run,
			n_layers, n_kv_heads, head_dim, cap, theta);
	else
		f8_gather_kernel<0><<<grid, 256, 0, c->stream>>>(
			view_k, view_v, k_scale, v_scale, raw_k, raw_scale, items, n_items, run,
			n_layers, n_kv_heads, head_dim, cap, theta);
	return kvmem_cuda_launched("fp8 view gather");
}

/* ---- moves: the sources copied aside ---------------------------------------- */
/* Grid (items, FG_Y): item i's raw K and V bytes [Hk][n][D], then their
 * scales [Hk][n], at st + off; a thread moves 16 bytes. */
__global__ void __launch_bounds__(256)
f8_snap_kernel(char *st, const kvmem_fp8_snap *items, const uint8_t *raw8, const uint8_t *v8,
	       const float *raws, const float *vs, int n_kv, int hd, int cap)
{
	const kvmem_fp8_snap m = items[blockIdx.x];
	const int per = hd / 16, rows = m.n * n_kv, total = 2 * rows * per;
	char *o = st + m.off;

	for (int task = blockIdx.y * blockDim.x + threadIdx.x; task < total;
	     task += gridDim.y * blockDim.x) {
		const int c = task % per, r = task / per, isv = r >= rows, rr = r % rows;
		const size_t src = ((size_t)m.layer * n_kv + rr / m.n) * cap + m.from + rr % m.n;

		*(uint4 *)(o + ((size_t)isv * rows + rr) * hd + c * 16) =
			*(const uint4 *)((isv ? v8 : raw8) + src * hd + c * 16);
		if (!c)
			((float *)(o + (size_t)2 * rows * hd))[(size_t)isv * rows + rr] =
				(isv ? vs : raws)[src];
	}
}

extern "C" int kvmem_cuda_fp8_view_snap(kvmem_cuda_ctx *c, char *st, const kvmem_fp8_snap *items,
					int n_items, const uint8_t *raw_k, const uint8_t *view_v,
					const float *raw_scale, const float *v_scale, int n_kv_heads,
					int head_dim, int cap)
{
	if (n_items < 0 || n_kv_heads <= 0 || head_dim % 16 || cap < 0)
		return kvmem_error(EINVAL, "fp8 view snapshot: %d items, %d heads x %d", n_items,
				   n_kv_heads, head_dim);
	if (!n_items)
		return 0;
	f8_snap_kernel<<<dim3(n_items, FG_Y), 256, 0, c->stream>>>(st, items, raw_k, view_v,
								    raw_scale, v_scale, n_kv_heads,
								    head_dim, cap);
	return kvmem_cuda_launched("fp8 view snapshot");
}

/* ---- a layer of the view as bf16 ------------------------------------------ */
/* A thread per 8 values: one 8-byte load, one 16-byte store. */
__global__ void f8_layer_kernel(uint16_t *ok, uint16_t *ov, const uint8_t *k8, const uint8_t *v8,
				const float *ks, const float *vs, int n_kv, int len, int cap,
				int ostride, int hd)
{
	const int per = hd / 8;
	const size_t total = (size_t)2 * n_kv * len * per;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * blockDim.x) {
		const int c8 = (int)(i % per);
		const size_t r = i / per;	/* (isv, h, t) */
		const int t = (int)(r % len), h = (int)((r / len) % n_kv), isv = (int)(r / len / n_kv);
		const size_t src = ((size_t)h * cap + t) * hd + c8 * 8;
		const float s = (isv ? vs : ks)[(size_t)h * cap + t];
		const uint2 u = *(const uint2 *)((isv ? v8 : k8) + src);
		const uint32_t w[2] = { u.x, u.y };
		uint16_t o[8];
		uint4 out;

		for (int j = 0; j < 4; j++) {
			const uint16_t two = (uint16_t)(w[j / 2] >> (16 * (j % 2)));
			float lo, hi;

			e4m3x2_to_f32(two, &lo, &hi);
			o[2 * j] = e4m3_bf16((uint8_t)two, lo, s);
			o[2 * j + 1] = e4m3_bf16((uint8_t)(two >> 8), hi, s);
		}
		out.x = o[0] | (uint32_t)o[1] << 16;
		out.y = o[2] | (uint32_t)o[3] << 16;
		out.z = o[4] | (uint32_t)o[5] << 16;
		out.w = o[6] | (uint32_t)o[7] << 16;
		*(uint4 *)((isv ? ov : ok) + ((size_t)h * ostride + t) * hd + c8 * 8) = out;
	}
}

extern "C" int kvmem_cuda_fp8_view_bf16(kvmem_cuda_ctx *c, uint16_t *out_k, uint16_t *out_v,
					int out_stride, const uint8_t *view_k, const uint8_t *view_v,
					const float *k_scale, const float *v_scale, int n_kv_heads,
					int len, int cap, int head_dim)
{
	if (len < 0 || len > cap || len > out_stride || n_kv_heads <= 0 || head_dim % 8)
		return kvmem_error(EINVAL, "fp8 view as bf16: %d of %d slots into %d, %d heads x %d",
				   len, cap, out_stride, n_kv_heads, head_dim);
	if (!len)
		return 0;
	f8_layer_kernel<<<4 * c->sms, 256, 0, c->stream>>>(out_k, out_v, view_k, view_v, k_scale,
							    v_scale, n_kv_heads, len, cap,
							    out_stride, head_dim);
	return kvmem_cuda_launched("fp8 view as bf16");
}

// SPDX-License-Identifier: MIT
/*
 * Rematerialisation straight from the pages: the gather twin of the view
 * scatter (twin: kvmem_view_gather_bf16 in kernels/cpu/gather.c).
 *
 * Each item reads n tokens of one page wherever the page is: a pinned host
 * page the device reads over PCIe (mapped memory: the host pool registered
 * with cudaHostRegister, or a pinned staging buffer), a device staging
 * buffer filled by batched copies, or a device page pool. Its raw K is
 * rounded to bf16 if it is f32 or f16, rotated at its slot by the very
 * rotation the forward pass uses (rope.cuh), and written to the view with V;
 * with copy_k set the raw K and V also go to a device page (the GPU page
 * pool is filled on the way, no second read).
 *
 * Grid (items / run, GATHER_Y), 256 threads (or 512, 768, 1024:
 * set_threads; the same bits). A thread moves W = 8 elements (one 16-byte
 * vector of bf16) of
 * one K rotary pair group or one V row part; a block handles P tokens per
 * round (P = threads / tasks of a token: 1 for Qwen3-8B at 256 threads,
 * with 64 of them idle and two barriers a token; 4 at 768). Loads are issued
 * before the round's angles are computed, so their latency (a microsecond
 * or two over PCIe) overlaps the double-precision sincos. Pointers that are
 * not 16-byte aligned, or head_dim not a multiple of 16, take scalar loads
 * with the same arithmetic.
 *
 * fp8 pages: W e4m3 bytes (one 8-byte load when aligned) and the row's
 * scale, decoded exactly in fp32 (fp8.cuh) and rounded once to bf16: half
 * the bytes over PCIe of a bf16 page.
 */
#include <stdlib.h>

#include <cuda_fp16.h>

#include "fp8.cuh"
#include "rope.cuh"

#define GATHER_THREADS 256	/* the default; at most 1024 */
#define GATHER_Y 8
#define GATHER_ANGLES 1024	/* P * half, at most (see kvmem_cuda_view_gather_bf16) */

__device__ __forceinline__ bool aligned16(const void *p)
{
	return ((uintptr_t)p & 15) == 0;
}

/* W elements at element offset off of a page half in dtype, as bf16
 * (fp8: scaled by sc). */
__device__ __forceinline__ void load_w(uint16_t *out, const void *base, size_t off, int dtype,
				       int W, bool vec, float sc = 1.0f)
{
	if (dtype == KVMEM_DTYPE_FP8) {
		const uint8_t *p = (const uint8_t *)base + off;

		if (vec && ((uintptr_t)p & 7) == 0) {
			const uint2 u = *(const uint2 *)p;
			const uint32_t w[2] = { u.x, u.y };

			for (int j = 0; j < 4; j++) {	/* a pair of bytes at a time */
				const uint16_t two = (uint16_t)(w[j / 2] >> (16 * (j % 2)));
				float lo, hi;

				e4m3x2_to_f32(two, &lo, &hi);
				out[2 * j] = e4m3_bf16((uint8_t)two, lo, sc);
				out[2 * j + 1] = e4m3_bf16((uint8_t)(two >> 8), hi, sc);
			}
		} else {
			for (int j = 0; j < W; j++)
				out[j] = e4m3_bf16(p[j], e4m3_to_f32(p[j]), sc);
		}
	} else if (dtype == KVMEM_DTYPE_BF16) {
		const uint16_t *p = (const uint16_t *)base + off;

		if (vec) {
			uint4 u = *(const uint4 *)p;
			uint32_t w[4] = { u.x, u.y, u.z, u.w };

			for (int j = 0; j < 4; j++) {
				out[2 * j] = (uint16_t)(w[j] & 0xffffu);
				out[2 * j + 1] = (uint16_t)(w[j] >> 16);
			}
		} else {
			for (int j = 0; j < W; j++)
				out[j] = p[j];
		}
	} else if (dtype == KVMEM_DTYPE_F32) {
		const float *p = (const float *)base + off;

		if (vec) {
			float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];

			out[0] = f2bf(a.x), out[1] = f2bf(a.y), out[2] = f2bf(a.z), out[3] = f2bf(a.w);
			out[4] = f2bf(b.x), out[5] = f2bf(b.y), out[6] = f2bf(b.z), out[7] = f2bf(b.w);
		} else {
			for (int j = 0; j < W; j++)
				out[j] = f2bf(p[j]);
		}
	} else {
		const __half *p = (const __half *)base + off;

		for (int j = 0; j < W; j++)
			out[j] = f2bf(__half2float(p[j]));
	}
}

__device__ __forceinline__ void store_w(uint16_t *dst, const uint16_t *v, int W, bool vec)
{
	if (vec) {
		uint4 u;

		u.x = v[0] | (uint32_t)v[1] << 16;
		u.y = v[2] | (uint32_t)v[3] << 16;
		u.z = v[4] | (uint32_t)v[5] << 16;
		u.w = v[6] | (uint32_t)v[7] << 16;
		*(uint4 *)dst = u;
	} else {
		for (int j = 0; j < W; j++)
			dst[j] = v[j];
	}
}

/* A block takes `run` consecutive items; items at the same slots (a block
 * of tokens' layers, as the session queues them) share the rotary angles
 * of every round, kept in cs/sn where they fit (GATHER_ANGLES) and made
 * again only where an item's slots differ. Each pair's frequency (a double
 * pow) is computed once a block. At 256 threads five blocks an SM (48
 * registers, as before run and the frequencies' table); the other widths
 * as the compiler had them. */
template <int THREADS>
__global__ void __launch_bounds__(THREADS, THREADS == 256 ? 5 : 2048 / THREADS)
gather_kernel(uint16_t *vk, uint16_t *vv, const kvmem_gather_item *items, int n_items, int run,
	      int n_layers, int n_kv, int hd, int cap, double theta, int W, int P)
{
	__shared__ double cs[GATHER_ANGLES], sn[GATHER_ANGLES], fr[ROPE_HALF_MAX];
	const int half = hd / 2, gk = half / W, gv = hd / W;
	const int TK = n_kv * gk, TT = TK + n_kv * gv;
	const int p = threadIdx.x / TT, e = threadIdx.x % TT;
	const bool is_k = e < TK;
	const int h = is_k ? e / gk : (e - TK) / gv;
	const int i0 = (is_k ? e % gk : (e - TK) % gv) * W;
	const int first = blockIdx.x * run, last = min(n_items, first + run), step = gridDim.y * P;
	int have_slot = -1, have_n = 0;	/* the item whose rounds' angles cs/sn hold */

	for (int x = threadIdx.x; x < half; x += blockDim.x)
		fr[x] = rope_freq(x, hd, theta);	/* seen after a round's first barrier */
	for (int at = first; at < last; at++) {
		const kvmem_gather_item m = items[at];

		if (m.layer < 0 || m.layer >= n_layers || m.slot < 0 || m.n < 0 ||
		    m.slot > cap - m.n ||
		    (m.dtype != KVMEM_DTYPE_F32 && m.dtype != KVMEM_DTYPE_BF16 &&
		     m.dtype != KVMEM_DTYPE_F16 &&
		     (m.dtype != KVMEM_DTYPE_FP8 || !m.k_scale || !m.v_scale)))
			continue;	/* the whole block: uniform */
		/* Uniform per item: 16-byte vectors where every address allows
		 * (fp8: 8-byte ones, each load checks its own address). */
		const bool vin = W == 8 && m.dtype != KVMEM_DTYPE_F16 &&
				 (m.dtype == KVMEM_DTYPE_FP8 || (aligned16(m.k) && aligned16(m.v))) &&
				 m.head_stride % 8 == 0;
		const bool vout = W == 8 && (!m.copy_k || aligned16(m.copy_k)) &&
				  (!m.copy_v || aligned16(m.copy_v)) && m.head_stride % 8 == 0;
		const bool vraw = W == 8 && aligned16(m.raw_k) && m.raw_stride % 8 == 0;
		const int t_first = blockIdx.y * P;
		const int rounds = m.n > t_first ? (m.n - t_first + step - 1) / step : 0;
		const bool keep = rounds * P * half <= GATHER_ANGLES;	/* every round's fit */
		const bool again = keep && m.slot == have_slot && m.n <= have_n;

		for (int r = 0, t0 = t_first; t0 < m.n; r++, t0 += step) {
			const int t = t0 + p, base = keep ? r * P * half : 0;
			const bool act = p < P && t < m.n;
			const size_t off = (size_t)t * hd + (size_t)h * m.head_stride + i0;
			uint16_t a[8], b[8];

			if (act) {
				const bool f8 = m.dtype == KVMEM_DTYPE_FP8;
				const size_t srow = (size_t)h * m.scale_stride + t;

				if (is_k) {
					const float sc = f8 ? m.k_scale[srow] : 1.0f;

					load_w(a, m.k, off, m.dtype, W, vin, sc);
					load_w(b, m.k, off + half, m.dtype, W, vin, sc);
				} else {
					load_w(a, m.v, off, m.dtype, W, vin,
					       f8 ? m.v_scale[srow] : 1.0f);
				}
			}
			if (!again) {
				__syncthreads();	/* the angles there are used up */
				for (int x = threadIdx.x; x < P * half; x += blockDim.x) {
					const int pp = x / half, i = x % half;

					if (t0 + pp < m.n)
						rope_angle_of(m.slot + t0 + pp, fr[i], &sn[base + x],
							      &cs[base + x]);
				}
				__syncthreads();
			}
			if (!act)
				continue;
			const size_t d = (((size_t)m.layer * n_kv + h) * cap + m.slot + t) * hd + i0;

			if (is_k) {
				const double *c = cs + base + p * half + i0, *s = sn + base + p * half + i0;
				uint16_t x[8], y[8];

				for (int j = 0; j < W; j++)
					rope_rot(a[j], b[j], c[j], s[j], &x[j], &y[j]);
				store_w(vk + d, x, W, W == 8);
				store_w(vk + d + half, y, W, W == 8);
				if (m.copy_k) {
					store_w(m.copy_k + off, a, W, vout);
					store_w(m.copy_k + off + half, b, W, vout);
				}
				if (m.raw_k) {
					const size_t rr = (size_t)t * hd + (size_t)h * m.raw_stride + i0;

					store_w(m.raw_k + rr, a, W, vraw);
					store_w(m.raw_k + rr + half, b, W, vraw);
				}
			} else {
				store_w(vv + d, a, W, W == 8);
				if (m.copy_v)
					store_w(m.copy_v + off, a, W, vout);
			}
		}
		if (!keep)
			have_slot = -1;	/* cs/sn hold only its last round */
		else if (!again)
			have_slot = m.slot, have_n = m.n;
	}
}

/* Threads a block (256, 512, 768 or 1024): a knob for the measurement in
 * `kvmem bench step --only remat` (the cuda backend's "gather_threads"),
 * and KVMEM_GATHER_THREADS for checks of the other widths' bits. 0: not
 * yet read. */
static int g_threads;

extern "C" int kvmem_cuda_gather_set_threads(int threads)
{
	if (threads != 256 && threads != 512 && threads != 768 && threads != 1024)
		return kvmem_error(EINVAL, "view gather: %d threads (256, 512, 768, 1024)", threads);
	g_threads = threads;
	return 0;
}

extern "C" int kvmem_cuda_view_gather_bf16(kvmem_cuda_ctx *c, uint16_t *view_k, uint16_t *view_v,
					   const kvmem_gather_item *items, int n_items, int run,
					   int n_layers, int n_kv_heads, int head_dim, int cap,
					   double theta)
{
	int W, TT, P, threads;

	if (!g_threads) {
		const char *e = getenv("KVMEM_GATHER_THREADS");

		g_threads = GATHER_THREADS;
		if (e && kvmem_cuda_gather_set_threads(atoi(e)) < 0)
			return kvmem_fail();
	}
	threads = g_threads;

	if (n_items < 0 || run < 1 || n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 ||
	    head_dim % 2 || head_dim > 2 * ROPE_HALF_MAX || cap < 0)
		return kvmem_error(EINVAL, "view gather: %d items (%d a block) into %d layers x %d "
				   "heads x %d", n_items, run, n_layers, n_kv_heads, head_dim);
	if (!n_items)
		return 0;
	W = head_dim % 16 == 0 ? 8 : 1;
	TT = n_kv_heads * (head_dim / 2 + head_dim) / W;
	if (TT > threads)
		return kvmem_error(ENOTSUP, "view gather: %d KV heads of %d take %d threads a token, "
				   "more than %d", n_kv_heads, head_dim, TT, threads);
	P = threads / TT;
	while (P > 1 && P * (head_dim / 2) > GATHER_ANGLES)
		P--;
	if (head_dim / 2 > GATHER_ANGLES)
		return kvmem_error(ENOTSUP, "view gather: head_dim %d", head_dim);
	run = gather_run(c, run, n_items, GATHER_Y);
#define GATHER_LAUNCH(T)                                                                       \
	gather_kernel<T><<<dim3((n_items + run - 1) / run, GATHER_Y), T, 0, c->stream>>>(      \
		view_k, view_v, items, n_items, run, n_layers, n_kv_heads, head_dim, cap, theta, W, \
		P)
	switch (threads) {
	case 512: GATHER_LAUNCH(512); break;
	case 768: GATHER_LAUNCH(768); break;
	case 1024: GATHER_LAUNCH(1024); break;
	default: GATHER_LAUNCH(256); break;
	}
#undef GATHER_LAUNCH
	return kvmem_cuda_launched("view gather");
}

// SPDX-License-Identifier: MIT
/*
 * fp8 KV on the GPU; the CPU twins are in kernels/cpu/fp8.c and fp8_attn.c
 * (kernels/kernels_fp8.h), the conversions in fp8.cuh.
 *
 * Quantising: a warp per row of n values (a token in a KV head): the row's
 * largest finite magnitude by a butterfly max, its power-of-two scale, and
 * every value divided by it (exact) and converted by cvt.rn.satfinite.
 *
 * Decode attention over bf16 or fp8 K/V: the keys are cut into splits, a
 * block of 4 warps per (KV head, split). A warp takes tiles of 32 keys: each
 * lane scores one key against the group's query heads (its K row read
 * whole: 256 bytes of bf16, 128 of fp8, dequantised in registers), the
 * tile's maximum and sum come from one butterfly per head, then the warp
 * walks the tile's V rows together (a lane holds head_dim / 32 dims). The
 * warps' running (max, sum, acc) are merged in shared memory, the splits by
 * a second kernel. fp8 reads half the bytes; the arithmetic is the same.
 */
#include <float.h>

#include "fp8.cuh"
#include "kernels/kernels_cuda_fp8.h"

/* ---- quantise / dequantise --------------------------------------------- */
template <typename T> __device__ __forceinline__ float load_f(const T *p, size_t i);
template <> __device__ __forceinline__ float load_f<float>(const float *p, size_t i)
{
	return p[i];
}
template <> __device__ __forceinline__ float load_f<uint16_t>(const uint16_t *p, size_t i)
{
	return bf2f(p[i]);
}

template <typename T>
__global__ void quant_kernel(uint8_t *q, float *scale, const T *x, size_t rows, int n)
{
	const size_t r = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
	const int lane = threadIdx.x & 31;
	float amax = 0.0f;

	if (r >= rows)
		return;
	const T *row = x + r * n;

	for (int i = lane; i < n; i += 32) {
		float a = fabsf(load_f(row, i));

		if (isfinite(a) && a > amax)
			amax = a;
	}
	for (int o = 16; o; o >>= 1)
		amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
	const float s = fp8_scale_of(amax), inv = 1.0f / s;	/* exact: s = 2^e */

	for (int i = lane; i < n; i += 32)
		q[r * n + i] = f32_to_e4m3(load_f(row, i) * inv);
	if (!lane)
		scale[r] = s;
}

extern "C" int kvmem_cuda_fp8_quant_rows(kvmem_cuda_ctx *c, uint8_t *q, float *scale,
					 const void *x, int x_dtype, size_t rows, int n)
{
	const unsigned grid = (unsigned)((rows + 7) / 8);

	if ((x_dtype != KVMEM_DTYPE_F32 && x_dtype != KVMEM_DTYPE_BF16) || n <= 0 || n > 1024)
		return kvmem_error(EINVAL, "fp8 quantise: rows of %d values of dtype %d", n, x_dtype);
	if (!rows)
		return 0;
	if (x_dtype == KVMEM_DTYPE_F32)
		quant_kernel<float><<<grid, 256, 0, c->stream>>>(q, scale, (const float *)x, rows, n);
	else
		quant_kernel<uint16_t><<<grid, 256, 0, c->stream>>>(q, scale, (const uint16_t *)x,
								     rows, n);
	return kvmem_cuda_launched("fp8 quantise");
}

__global__ void dequant_kernel(uint16_t *out, const uint8_t *q, const float *scale, size_t rows,
			       int n)
{
	const size_t total = rows * n;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * blockDim.x)
		out[i] = e4m3_bf16(q[i], e4m3_to_f32(q[i]), scale[i / n]);
}

extern "C" int kvmem_cuda_fp8_dequant_rows_bf16(kvmem_cuda_ctx *c, uint16_t *out,
						const uint8_t *q, const float *scale, size_t rows,
						int n)
{
	if (n <= 0)
		return kvmem_error(EINVAL, "fp8 dequantise: rows of %d values", n);
	if (!rows)
		return 0;
	dequant_kernel<<<4 * c->sms, 256, 0, c->stream>>>(out, q, scale, rows, n);
	return kvmem_cuda_launched("fp8 dequantise");
}

/* ---- decode attention over bf16 or fp8 K/V ------------------------------ */
#define DW 4		/* warps a block */

/* HD/32 dims of row `row` from dim lane * HD/32 (V: a lane's share). */
template <int FP8, int HD>
__device__ __forceinline__ void load_part(float *o, const void *base, const float *sc, size_t row,
					  int lane)
{
	constexpr int P = HD / 32;

	if (FP8) {
		const uint16_t *p = (const uint16_t *)((const uint8_t *)base + row * HD + lane * P);
		const float s = sc[row];

		for (int j = 0; j < P / 2; j++) {
			e4m3x2_to_f32(p[j], &o[2 * j], &o[2 * j + 1]);
			o[2 * j] *= s;
			o[2 * j + 1] *= s;
		}
	} else {
		const uint16_t *p = (const uint16_t *)base + row * HD + lane * P;

		for (int j = 0; j < P; j++)
			o[j] = bf2f(p[j]);
	}
}

/* Dot products of a whole K row (16-byte loads) with the G query heads. */
template <int FP8, int HD, int G>
__device__ __forceinline__ void score_row(float *s, const void *base, const float *sc, size_t row,
					  const float (*qs)[HD])
{
	for (int g = 0; g < G; g++)
		s[g] = 0.0f;
	if (FP8) {
		const uint4 *p = (const uint4 *)((const uint8_t *)base + row * HD);
		const float ks = sc[row];

		for (int c = 0; c < HD / 16; c++) {
			const uint4 u = p[c];
			const uint32_t w[4] = { u.x, u.y, u.z, u.w };

			for (int j = 0; j < 8; j++) {
				float k0, k1;

				e4m3x2_to_f32((uint16_t)(w[j / 2] >> (16 * (j % 2))), &k0, &k1);
				for (int g = 0; g < G; g++) {
					s[g] = fmaf(qs[g][c * 16 + 2 * j], k0, s[g]);
					s[g] = fmaf(qs[g][c * 16 + 2 * j + 1], k1, s[g]);
				}
			}
		}
		for (int g = 0; g < G; g++)
			s[g] *= ks;	/* one scale a row: out of the sum */
	} else {
		const uint4 *p = (const uint4 *)((const uint16_t *)base + row * HD);

		for (int c = 0; c < HD / 8; c++) {
			const uint4 u = p[c];
			const uint32_t w[4] = { u.x, u.y, u.z, u.w };

			for (int j = 0; j < 8; j++) {
				const float kv = bf2f((uint16_t)(w[j / 2] >> (16 * (j % 2))));

				for (int g = 0; g < G; g++)
					s[g] = fmaf(qs[g][c * 8 + j], kv, s[g]);
			}
		}
	}
}

template <int FP8, int HD, int G>
__global__ void __launch_bounds__(DW * 32)
decode_kernel(float *part, const uint16_t *q, const void *k, const void *v, const float *ks,
	      const float *vs, int n_kv, size_t stride, int chunk, float scale)
{
	constexpr int P = HD / 32;
	__shared__ float qs[G][HD];
	__shared__ float wm[DW][G], wl[DW][G], wacc[DW][G][HD];
	const int h = blockIdx.x, split = blockIdx.y, S = gridDim.y;
	const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
	const int c0 = split * chunk, c1 = min(n_kv, c0 + chunk);
	const size_t base = (size_t)h * stride;
	float m[G], l[G], acc[G][P];

	for (int i = threadIdx.x; i < G * HD; i += blockDim.x)
		qs[i / HD][i % HD] = bf2f(q[((size_t)h * G + i / HD) * HD + i % HD]) * scale;
	for (int g = 0; g < G; g++) {
		m[g] = -INFINITY;
		l[g] = 0.0f;
		for (int j = 0; j < P; j++)
			acc[g][j] = 0.0f;
	}
	__syncthreads();
	for (int t0 = c0 + warp * 32; t0 < c1; t0 += DW * 32) {
		const int key = t0 + lane, nt = min(32, c1 - t0);
		float s[G], p[G];

		if (key < c1)
			score_row<FP8, HD, G>(s, k, ks, base + key, qs);
		for (int g = 0; g < G; g++) {
			float mt = key < c1 ? s[g] : -INFINITY, mn, corr, sum;

			for (int o = 16; o; o >>= 1)
				mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
			mn = fmaxf(m[g], mt);
			corr = m[g] == -INFINITY ? 0.0f : expf(m[g] - mn);
			p[g] = key < c1 ? expf(s[g] - mn) : 0.0f;
			sum = p[g];
			for (int o = 16; o; o >>= 1)
				sum += __shfl_xor_sync(0xffffffffu, sum, o);
			l[g] = l[g] * corr + sum;
			m[g] = mn;
			for (int j = 0; j < P; j++)
				acc[g][j] *= corr;
		}
		/* The tile's V rows 8 at a time, the loads issued before the
		 * sums so their latency overlaps (a row past the tile adds 0). */
		for (int i0 = 0; i0 < nt; i0 += 8) {
			float vv[8][P];

#pragma unroll
			for (int i = 0; i < 8; i++)
				if (i0 + i < nt)
					load_part<FP8, HD>(vv[i], v, vs, base + t0 + i0 + i, lane);
				else
					for (int j = 0; j < P; j++)
						vv[i][j] = 0.0f;
#pragma unroll
			for (int i = 0; i < 8; i++)
				for (int g = 0; g < G; g++) {
					const float pi = __shfl_sync(0xffffffffu, p[g], i0 + i);

					for (int j = 0; j < P; j++)
						acc[g][j] = fmaf(pi, vv[i][j], acc[g][j]);
				}
		}
	}
	for (int g = 0; g < G; g++) {
		if (!lane) {
			wm[warp][g] = m[g];
			wl[warp][g] = l[g];
		}
		for (int j = 0; j < P; j++)
			wacc[warp][g][lane * P + j] = acc[g][j];
	}
	__syncthreads();
	/* The block's warps merged: part[h][split][g] = (max, sum, acc[HD]). */
	for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
		const int g = i / HD, d = i % HD;
		float mx = -INFINITY, sum = 0.0f, a = 0.0f;

		for (int w = 0; w < DW; w++)
			mx = fmaxf(mx, wm[w][g]);
		for (int w = 0; w < DW; w++) {
			const float f = wm[w][g] == -INFINITY ? 0.0f : expf(wm[w][g] - mx);

			sum += wl[w][g] * f;
			a += wacc[w][g][d] * f;
		}
		float *pp = part + (((size_t)h * S + split) * G + g) * (HD + 2);

		pp[2 + d] = a;
		if (!d) {
			pp[0] = mx;
			pp[1] = sum;
		}
	}
}

/* out[h * G + g][d]: the splits merged. One block a query head. */
template <int HD, int G>
__global__ void combine_kernel(uint16_t *out, const float *part, int S)
{
	const int hq = blockIdx.x, h = hq / G, g = hq % G, d = threadIdx.x;
	float mx = -INFINITY, sum = 0.0f, a = 0.0f;

	for (int s = 0; s < S; s++)
		mx = fmaxf(mx, part[(((size_t)h * S + s) * G + g) * (HD + 2)]);
	for (int s = 0; s < S; s++) {
		const float *pp = part + (((size_t)h * S + s) * G + g) * (HD + 2);
		const float f = pp[0] == -INFINITY ? 0.0f : expf(pp[0] - mx);

		sum += pp[1] * f;
		a += pp[2 + d] * f;
	}
	out[(size_t)hq * HD + d] = f2bf(sum > 0.0f ? a / sum : 0.0f);
}

template <int FP8, int HD, int G>
static int decode_run(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q, const void *k,
		      const void *v, const float *ks, const float *vs, int n_kv, size_t stride,
		      int n_kv_heads, float scale)
{
	/* About eight blocks an SM, splits of whole tiles of every warp. */
	const long want = 8L * c->sms;
	int chunk = (int)(((long)n_kv * n_kv_heads + want - 1) / want);
	int S;
	void *part;

	chunk = (chunk + DW * 32 - 1) / (DW * 32) * (DW * 32);
	S = (n_kv + chunk - 1) / chunk;
	if (kvmem_cuda_scratch(c, (size_t)n_kv_heads * S * G * (HD + 2) * sizeof(float), &part))
		return kvmem_fail();
	decode_kernel<FP8, HD, G><<<dim3(n_kv_heads, S), DW * 32, 0, c->stream>>>(
		(float *)part, q, k, v, ks, vs, n_kv, stride, chunk, scale);
	combine_kernel<HD, G><<<n_kv_heads * G, HD, 0, c->stream>>>(out, (const float *)part, S);
	return kvmem_cuda_launched("decode attention (bf16/fp8 K/V)");
}

template <int FP8, int HD>
static int decode_g(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q, const void *k,
		    const void *v, const float *ks, const float *vs, int n_kv, size_t stride,
		    int n_kv_heads, int G, float scale)
{
	switch (G) {
	case 1: return decode_run<FP8, HD, 1>(c, out, q, k, v, ks, vs, n_kv, stride, n_kv_heads, scale);
	case 2: return decode_run<FP8, HD, 2>(c, out, q, k, v, ks, vs, n_kv, stride, n_kv_heads, scale);
	case 4: return decode_run<FP8, HD, 4>(c, out, q, k, v, ks, vs, n_kv, stride, n_kv_heads, scale);
	case 8: return decode_run<FP8, HD, 8>(c, out, q, k, v, ks, vs, n_kv, stride, n_kv_heads, scale);
	}
	return kvmem_error(ENOTSUP, "decode attention (fp8): %d query heads a KV head", G);
}

extern "C" int kvmem_cuda_decode_kv_bf16(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
					 const void *k, const void *v, const float *k_scale,
					 const float *v_scale, int kv_dtype, int n_kv,
					 size_t kv_stride, int n_heads, int n_kv_heads,
					 int head_dim, float scale)
{
	const int G = n_kv_heads > 0 ? n_heads / n_kv_heads : 0, f8 = kv_dtype == KVMEM_DTYPE_FP8;

	if (n_kv <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || kv_stride < (size_t)n_kv ||
	    (kv_dtype != KVMEM_DTYPE_BF16 && kv_dtype != KVMEM_DTYPE_FP8) ||
	    (f8 && (!k_scale || !v_scale)))
		return kvmem_error(EINVAL, "decode attention: %d keys of %d KV heads x %d, dtype %d",
				   n_kv, n_kv_heads, head_dim, kv_dtype);
	if (head_dim == 128)
		return f8 ? decode_g<1, 128>(c, out, q, k, v, k_scale, v_scale, n_kv, kv_stride,
					    n_kv_heads, G, scale)
			  : decode_g<0, 128>(c, out, q, k, v, k_scale, v_scale, n_kv, kv_stride,
					    n_kv_heads, G, scale);
	if (head_dim == 64)
		return f8 ? decode_g<1, 64>(c, out, q, k, v, k_scale, v_scale, n_kv, kv_stride,
					   n_kv_heads, G, scale)
			  : decode_g<0, 64>(c, out, q, k, v, k_scale, v_scale, n_kv, kv_stride,
					   n_kv_heads, G, scale);
	return kvmem_error(ENOTSUP, "decode attention (fp8): head_dim %d (64 or 128)", head_dim);
}

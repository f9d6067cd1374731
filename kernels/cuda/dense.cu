// SPDX-License-Identifier: MIT
/*
 * Dense elementwise and row ops (CPU twins in kernels/cpu/bf16_ops.c and
 * kernels/cpu/dense.c): conversion to bf16, embedding gather, RMSNorm (rows
 * and per head), SwiGLU, residual add.
 *
 * All are memory-bound single passes. The norms sum squares in double like
 * the twins (only the order differs; RMSNorm's products and sums without
 * FMA, as the twin's), so their fp32 scale r almost always has the twin's
 * bits; x * r * w is two fp32 multiplies (nothing to contract), so outputs
 * differ from the twin's at most where r does. RMSNorm and SwiGLU share
 * their arithmetic with decode's fused kernels (dense.cuh).
 */
#include <cuda_fp16.h>

#include "dense.cuh"

/* ---- conversion ---------------------------------------------------------- */
__global__ void convert_kernel(uint16_t *dst, const void *src, int dt, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		if (dt == KVMEM_DTYPE_F32)
			dst[i] = f2bf(((const float *)src)[i]);
		else if (dt == KVMEM_DTYPE_F16)
			dst[i] = f2bf(__half2float(__ushort_as_half(((const uint16_t *)src)[i])));
		else
			dst[i] = ((const uint16_t *)src)[i];
	}
}

static unsigned grid_for(size_t n, int threads, int sms)
{
	size_t b = (n + threads - 1) / threads, cap = (size_t)sms * 16;

	return (unsigned)(b < 1 ? 1 : (b > cap ? cap : b));
}

extern "C" int kvmem_cuda_convert_to_bf16(kvmem_cuda_ctx *c, uint16_t *dst, const void *src,
					  int src_dtype, size_t n)
{
	if (src_dtype != KVMEM_DTYPE_F32 && src_dtype != KVMEM_DTYPE_BF16 &&
	    src_dtype != KVMEM_DTYPE_F16)
		return kvmem_error(EINVAL, "convert to bf16: unknown source type %d", src_dtype);
	if (!n)
		return 0;
	convert_kernel<<<grid_for(n, 256, c->sms), 256, 0, c->stream>>>(dst, src, src_dtype, n);
	return kvmem_cuda_launched("convert to bf16");
}

/* ---- embedding ---------------------------------------------------------- */
__global__ void embedding_kernel(float *out, const uint16_t *table, const int32_t *ids, int dim)
{
	const uint16_t *row = table + (size_t)ids[blockIdx.x] * dim;
	float *o = out + (size_t)blockIdx.x * dim;

	for (int d = threadIdx.x; d < dim; d += blockDim.x)
		o[d] = bf2f(row[d]);
}

extern "C" int kvmem_cuda_embedding_bf16(kvmem_cuda_ctx *c, float *out, const uint16_t *table,
					 const int32_t *ids, int n, int dim)
{
	if (n < 0 || dim <= 0)
		return kvmem_error(EINVAL, "embedding: %d rows of %d", n, dim);
	if (!n)
		return 0;
	embedding_kernel<<<n, 256, 0, c->stream>>>(out, table, ids, dim);
	return kvmem_cuda_launched("embedding");
}

/* ---- RMSNorm ------------------------------------------------------------- */
__device__ __forceinline__ double warp_sum_d(double v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* 1/sqrt(ss/dim + eps) in double, rounded to fp32: as the twin. */
__device__ __forceinline__ float rms_scale(double ss, int dim, float eps)
{
	return (float)(1.0 / sqrt(ss / dim + (double)eps));
}

/* One block (RMS_THREADS) per row: fp32 in, bf16 out. The scale and the
 * products are dense.cuh's, which the fused norm + GEMV of a decode step
 * (gemv.cu) shares. */
__global__ void __launch_bounds__(RMS_THREADS)
rmsnorm_kernel(uint16_t *out, const float *x, const uint16_t *w, int dim, float eps)
{
	const float *xi = x + (size_t)blockIdx.x * dim;
	uint16_t *oi = out + (size_t)blockIdx.x * dim;
	const float r = rms_block(xi, dim, eps);

	for (int d = threadIdx.x; d < dim; d += RMS_THREADS)
		oi[d] = rms_apply(xi[d], r, w[d]);
}

extern "C" int kvmem_cuda_rmsnorm_bf16(kvmem_cuda_ctx *c, uint16_t *out, const float *x,
				       const uint16_t *w, int n, int dim, float eps)
{
	if (n < 0 || dim <= 0)
		return kvmem_error(EINVAL, "rmsnorm: %d rows of %d", n, dim);
	if (!n)
		return 0;
	rmsnorm_kernel<<<n, RMS_THREADS, 0, c->stream>>>(out, x, w, dim, eps);
	return kvmem_cuda_launched("rmsnorm");
}

/* One warp per head row, in place on bf16. */
__global__ void headnorm_kernel(uint16_t *x, const uint16_t *w, int rows, int hd, float eps)
{
	const int row = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	uint16_t *xi = x + (size_t)row * hd;
	double ss = 0.0;

	if (row >= rows)
		return;
	for (int d = lane; d < hd; d += 32) {
		float v = bf2f(xi[d]);

		ss += (double)v * v;
	}
	const float r = rms_scale(warp_sum_d(ss), hd, eps);

	for (int d = lane; d < hd; d += 32)
		xi[d] = f2bf(__fmul_rn(__fmul_rn(bf2f(xi[d]), r), bf2f(w[d])));
}

extern "C" int kvmem_cuda_headnorm_bf16(kvmem_cuda_ctx *c, uint16_t *x, const uint16_t *w,
					int rows, int head_dim, float eps)
{
	if (rows < 0 || head_dim <= 0)
		return kvmem_error(EINVAL, "head norm: %d rows of %d", rows, head_dim);
	if (!rows)
		return 0;
	headnorm_kernel<<<(rows + 7) / 8, 256, 0, c->stream>>>(x, w, rows, head_dim, eps);
	return kvmem_cuda_launched("head norm");
}

/* ---- SwiGLU, add ---------------------------------------------------------- */
__global__ void swiglu_kernel(uint16_t *out, const uint16_t *gate, const uint16_t *up, int n,
			      int dim, int ld)
{
	const size_t total = (size_t)n * dim;

	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
	     e += (size_t)gridDim.x * blockDim.x) {
		size_t i = e / dim, j = e % dim;
		out[e] = swiglu_one(gate[i * ld + j], up[i * ld + j]);
	}
}

/* The same, 8 elements (16 bytes) a thread: rows of a multiple of 8 with
 * 16-byte aligned starts. A prefill chunk's gate|up output (4096 x 24576
 * at Qwen3-8B) read 2 bytes at a time with a 64-bit division per element
 * ran at about 1.3 TB/s under ncu. Each element is swiglu_one's: the bits
 * do not change. */
__global__ void swiglu8_kernel(uint16_t *out, const uint16_t *gate, const uint16_t *up, int n,
			       int dim8, int ld8)
{
	const size_t total = (size_t)n * dim8;

	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
	     e += (size_t)gridDim.x * blockDim.x) {
		const size_t i = e / dim8, j = e % dim8;
		const uint4 g = __ldcs((const uint4 *)gate + i * ld8 + j);
		const uint4 u = __ldcs((const uint4 *)up + i * ld8 + j);
		const uint32_t gw[4] = { g.x, g.y, g.z, g.w }, uw[4] = { u.x, u.y, u.z, u.w };
		uint32_t o[4];

#pragma unroll
		for (int k = 0; k < 4; k++)
			o[k] = (uint32_t)swiglu_one((uint16_t)gw[k], (uint16_t)uw[k]) |
			       (uint32_t)swiglu_one((uint16_t)(gw[k] >> 16), (uint16_t)(uw[k] >> 16)) << 16;
		((uint4 *)out)[e] = make_uint4(o[0], o[1], o[2], o[3]);
	}
}

extern "C" int kvmem_cuda_swiglu_bf16(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *gate,
				      const uint16_t *up, int n, int dim, int ld)
{
	if (n < 0 || dim <= 0 || ld < dim)
		return kvmem_error(EINVAL, "swiglu: %d rows of %d, row stride %d", n, dim, ld);
	if (!n)
		return 0;
	if (dim % 8 == 0 && ld % 8 == 0 && ((uintptr_t)out | (uintptr_t)gate | (uintptr_t)up) % 16 == 0)
		swiglu8_kernel<<<grid_for((size_t)n * dim / 8, 256, c->sms), 256, 0, c->stream>>>(
			out, gate, up, n, dim / 8, ld / 8);
	else
		swiglu_kernel<<<grid_for((size_t)n * dim, 256, c->sms), 256, 0, c->stream>>>(
			out, gate, up, n, dim, ld);
	return kvmem_cuda_launched("swiglu");
}

__global__ void add_kernel(float *y, const float *x, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		y[i] = __fadd_rn(y[i], x[i]);
}

extern "C" int kvmem_cuda_add(kvmem_cuda_ctx *c, float *y, const float *x, size_t n)
{
	if (!n)
		return 0;
	add_kernel<<<grid_for(n, 256, c->sms), 256, 0, c->stream>>>(y, x, n);
	return kvmem_cuda_launched("add");
}

// SPDX-License-Identifier: MIT
/*
 * The selection index kept on the GPU (twin: kvmem_index_append_bf16 in
 * kernels/cpu/index_bf16.c, the workspace index's arithmetic): Mean-K per
 * (block, layer, KV head), and min/max and quarter-block means when asked,
 * updated from the forward pass's raw K as tokens are appended.
 *
 * One thread per (layer, KV head, dimension) runs the tokens in order, as
 * the workspace does: the running sums are fp32 adds in token order and
 * each mean is one IEEE division, so an fp32 index has the workspace's
 * bits and a bf16 one those rounded once. A chunk of 4096 tokens is 4096
 * steps of one coalesced load per thread (36 x 8 x 128 threads at Qwen3-8B):
 * a fraction of a millisecond against the chunk's forward pass.
 */
#include "cuda_int.h"

template <typename T> __device__ __forceinline__ float ix_get(const T *a, size_t i);
template <> __device__ __forceinline__ float ix_get<float>(const float *a, size_t i)
{
	return a[i];
}
template <> __device__ __forceinline__ float ix_get<uint16_t>(const uint16_t *a, size_t i)
{
	return bf2f(a[i]);
}
template <typename T> __device__ __forceinline__ void ix_put(T *a, size_t i, float v);
template <> __device__ __forceinline__ void ix_put<float>(float *a, size_t i, float v)
{
	a[i] = v;
}
template <> __device__ __forceinline__ void ix_put<uint16_t>(uint16_t *a, size_t i, float v)
{
	a[i] = f2bf(v);
}

template <typename T>
__global__ void index_append_kernel(T *meank, T *kmin, T *kmax, T *sub, float *open_sum,
				    float *open_sub, const uint16_t *raw_k, long long first, int n,
				    int H, int D, int B, long long cap)
{
	const int lh = blockIdx.x, l = lh / H, h = lh % H, sub_len = B / 4;
	const size_t run = (size_t)lh * cap;

	for (int d = threadIdx.x; d < D; d += blockDim.x) {
		const size_t o = (size_t)lh * D + d;
		float sum = open_sum[o], ssum = open_sub ? open_sub[o] : 0.0f, lo = 0.0f, hi = 0.0f;

		if (kmin && first % B) {
			lo = ix_get(kmin, (run + first / B) * D + d);
			hi = ix_get(kmax, (run + first / B) * D + d);
		}
		for (int j = 0; j < n; j++) {
			const long long p = first + j, blk = p / B;
			const int t = (int)(p % B), u = t % sub_len;
			const float k = bf2f(raw_k[(((size_t)l * n + j) * H + h) * D + d]);

			sum = t == 0 ? k : __fadd_rn(sum, k);
			if (kmin) {
				lo = t == 0 ? k : (k < lo ? k : lo);
				hi = t == 0 ? k : (k > hi ? k : hi);
			}
			ssum = u == 0 ? k : __fadd_rn(ssum, k);
			if (t == B - 1 || j == n - 1) {
				ix_put(meank, (run + blk) * D + d, __fdiv_rn(sum, (float)(t + 1)));
				if (kmin) {
					ix_put(kmin, (run + blk) * D + d, lo);
					ix_put(kmax, (run + blk) * D + d, hi);
				}
			}
			if (sub && (u == sub_len - 1 || j == n - 1))
				ix_put(sub, ((run + blk) * 4 + t / sub_len) * D + d,
				       __fdiv_rn(ssum, (float)(u + 1)));
		}
		open_sum[o] = sum;
		if (sub && open_sub)
			open_sub[o] = ssum;
	}
}

extern "C" int kvmem_cuda_index_append(kvmem_cuda_ctx *c, void *meank, void *kmin, void *kmax,
				       void *sub, float *open_sum, float *open_sub,
				       const uint16_t *raw_k, int64_t first, int n,
				       const kvmem_score_geom *g)
{
	const int L = g->n_layers, H = g->n_kv_heads, D = g->head_dim, B = g->block;
	const int threads = D < 128 ? D : 128;

	if (L <= 0 || H <= 0 || D <= 0 || B < 4 || B % 4 || first < 0 || n < 0 ||
	    (!kmin != !kmax) ||
	    (g->index_dtype != KVMEM_DTYPE_F32 && g->index_dtype != KVMEM_DTYPE_BF16) ||
	    (first + n + B - 1) / B > g->cap_blocks)
		return kvmem_error(EINVAL, "index append: %d tokens after %lld into %lld blocks of %d "
				   "(%d layers, %d heads, head_dim %d)", n, (long long)first,
				   (long long)g->cap_blocks, B, L, H, D);
	if (!n)
		return 0;
	if (g->index_dtype == KVMEM_DTYPE_BF16)
		index_append_kernel<uint16_t><<<L * H, threads, 0, c->stream>>>(
			(uint16_t *)meank, (uint16_t *)kmin, (uint16_t *)kmax, (uint16_t *)sub, open_sum,
			open_sub, raw_k, (long long)first, n, H, D, B, (long long)g->cap_blocks);
	else
		index_append_kernel<float><<<L * H, threads, 0, c->stream>>>(
			(float *)meank, (float *)kmin, (float *)kmax, (float *)sub, open_sum, open_sub,
			raw_k, (long long)first, n, H, D, B, (long long)g->cap_blocks);
	return kvmem_cuda_launched("index append");
}

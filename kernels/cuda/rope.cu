// SPDX-License-Identifier: MIT
/*
 * RoPE on bf16 and the re-RoPE scatter of raw K into view slots (twins:
 * kvmem_rope_bf16, kvmem_view_scatter_bf16 in kernels/cpu/bf16_ops.c).
 *
 * Angles in double: per token, thread i < head_dim/2 computes
 * pos * pow(theta, -2i/head_dim) and its sincos (CUDA's double pow and
 * sincos are within 2 ulp), then every head of the token is rotated in
 * double with explicit round-to-nearest operations (no FMA contraction, as
 * the twin's ISO C) and rounded once to bf16. Both ops rotate through
 * rope_head(), so a K written by the forward pass and one placed later from
 * raw K at the same slot have the same bits. The angle's own error is about
 * pos * 2^-52 rad (4e-10 rad at position 2M): far below bf16's 2^-9.
 */
#include "rope.cuh"

/* One block per token: x[t][h][:] for every head. */
__global__ void rope_kernel(uint16_t *x, const int32_t *pos, int n_heads, int hd, double theta)
{
	__shared__ double cs[ROPE_HALF_MAX], sn[ROPE_HALF_MAX];
	const int half = hd / 2, t = blockIdx.x;

	rope_angles(cs, sn, pos[t], hd, theta);
	__syncthreads();
	for (int e = threadIdx.x; e < n_heads * half; e += blockDim.x) {
		int h = e / half, i = e % half;
		uint16_t *xh = x + ((size_t)t * n_heads + h) * hd;

		rope_pair(xh, xh, i, half, cs[i], sn[i]);
	}
}

extern "C" int kvmem_cuda_rope_bf16(kvmem_cuda_ctx *c, uint16_t *x, const int32_t *pos, int n,
				    int n_heads, int head_dim, double theta)
{
	if (n < 0 || n_heads <= 0 || head_dim <= 0 || head_dim % 2 || head_dim > 2 * ROPE_HALF_MAX)
		return kvmem_error(EINVAL, "rope: %d tokens of %d heads x %d", n, n_heads, head_dim);
	if (!n)
		return 0;
	rope_kernel<<<n, 128, 0, c->stream>>>(x, pos, n_heads, head_dim, theta);
	return kvmem_cuda_launched("rope");
}

/* One thread per (token, pair): the table the q/k kernel reads instead of
 * working the angles out again in each of its blocks and layers. */
__global__ void rope_angles_kernel(double2 *ang, const int32_t *pos, int n, int half, int hd,
				   double theta)
{
	const size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x;

	if (e < (size_t)n * half) {
		double s, c;

		rope_angle(pos[e / half], (int)(e % half), hd, theta, &s, &c);
		ang[e] = make_double2(c, s);
	}
}

extern "C" int kvmem_cuda_rope_angles(kvmem_cuda_ctx *c, double *ang, const int32_t *pos, int n,
				      int head_dim, double theta)
{
	const size_t total = (size_t)n * (head_dim / 2);

	if (n < 0 || head_dim <= 0 || head_dim % 2 || head_dim > 2 * ROPE_HALF_MAX)
		return kvmem_error(EINVAL, "rope angles: %d tokens x %d", n, head_dim);
	if (!n)
		return 0;
	rope_angles_kernel<<<(unsigned)((total + 255) / 256), 256, 0, c->stream>>>(
		(double2 *)ang, pos, n, head_dim / 2, head_dim, theta);
	return kvmem_cuda_launched("rope angles");
}

/*
 * Grid (items, Y): block y of an item takes its tokens y, y + Y, ... (a
 * 32-token page is one or two tokens per block). Each token: angles at
 * slot + t, then K rotated and V copied for every KV head. Few items may be
 * long runs of new tokens (a prefill chunk with "fuse" off: one item of
 * 4096 tokens took 1.76 ms over 16 blocks), so they get many blocks each;
 * the blocks past an item's tokens leave at once.
 */
#define SCATTER_Y 16
#define SCATTER_FEW 64		/* at most this many items: SCATTER_Y_FEW blocks each */
#define SCATTER_Y_FEW 256

__global__ void scatter_kernel(uint16_t *vk, uint16_t *vv, uint16_t *rk, const uint16_t *sk,
			       const uint16_t *sv, const kvmem_scatter_item *items, int n_layers,
			       int n_kv, int hd, int cap, double theta)
{
	__shared__ double cs[ROPE_HALF_MAX], sn[ROPE_HALF_MAX];
	const kvmem_scatter_item m = items[blockIdx.x];
	const int half = hd / 2;

	if (m.layer < 0 || m.layer >= n_layers || m.slot < 0 || m.n < 0 || m.slot > cap - m.n)
		return;		/* the whole block: uniform */
	for (int t = blockIdx.y; t < m.n; t += gridDim.y) {
		__syncthreads();	/* the previous token's angles are used up */
		rope_angles(cs, sn, m.slot + t, hd, theta);
		__syncthreads();
		for (int e = threadIdx.x; e < n_kv * half; e += blockDim.x) {
			int h = e / half, i = e % half;
			size_t s = (size_t)(m.src + (int64_t)t * m.tok_stride + (int64_t)h * m.head_stride);
			size_t d = (((size_t)m.layer * n_kv + h) * cap + m.slot + t) * hd;

			rope_pair(vk + d, sk + s, i, half, cs[i], sn[i]);
			vv[d + i] = sv[s + i];
			vv[d + i + half] = sv[s + i + half];
			if (rk) {	/* the raw K the view keeps beside the slot */
				rk[d + i] = sk[s + i];
				rk[d + i + half] = sk[s + i + half];
			}
		}
	}
}

extern "C" int kvmem_cuda_view_scatter_bf16(kvmem_cuda_ctx *c, uint16_t *view_k, uint16_t *view_v,
					    const uint16_t *stage_k, const uint16_t *stage_v,
					    const kvmem_scatter_item *items, int n_items,
					    int n_layers, int n_kv_heads, int head_dim, int cap,
					    double theta)
{
	return kvmem_cuda_view_scatter_raw_bf16(c, view_k, view_v, NULL, stage_k, stage_v, items,
						n_items, n_layers, n_kv_heads, head_dim, cap, theta);
}

extern "C" int kvmem_cuda_view_scatter_raw_bf16(kvmem_cuda_ctx *c, uint16_t *view_k,
						uint16_t *view_v, uint16_t *raw_view,
						const uint16_t *stage_k, const uint16_t *stage_v,
						const kvmem_scatter_item *items, int n_items,
						int n_layers, int n_kv_heads, int head_dim, int cap,
						double theta)
{
	if (n_items < 0 || n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 ||
	    head_dim > 2 * ROPE_HALF_MAX || cap < 0)
		return kvmem_error(EINVAL, "view scatter: %d items into %d layers x %d heads x %d",
				   n_items, n_layers, n_kv_heads, head_dim);
	if (!n_items)
		return 0;
	scatter_kernel<<<dim3(n_items, n_items <= SCATTER_FEW ? SCATTER_Y_FEW : SCATTER_Y), 128, 0,
			 c->stream>>>(
		view_k, view_v, raw_view, stage_k, stage_v, items, n_layers, n_kv_heads, head_dim, cap,
		theta);
	return kvmem_cuda_launched("view scatter");
}

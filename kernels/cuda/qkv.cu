// SPDX-License-Identifier: MIT
/*
 * The q/k step of a layer after the fused q/k/v GEMM, in one kernel (the
 * forward pass of the cuda backend; twins: kvmem_headnorm_bf16 on q and on
 * k, then kvmem_rope_bf16 on q, in kernels/cpu/bf16_ops.c), and in a fused
 * decode step the view scatter of the new token's K and V too.
 */
#include "rope.cuh"

/*
 * qkv is [n][ld] bf16, each row [q heads][k heads][v heads] of head_dim.
 * Per token (blockIdx.x) and head (a warp each): the head RMSNorm of
 * headnorm_kernel (the same double sum, the same shuffle tree, the same
 * rounding), then
 *   q heads: the normalised q to q_raw (if set), rotated at pos[t] by
 *            rope_pair into q_out[t][h] (contiguous, as attention reads);
 *   k heads: normalised in place (the view scatter rotates them from
 *            there), copied to k_raw (if set);
 *   v heads: copied to v_out (if set).
 * q_raw / k_raw / v_out are [n][n_heads or n_kv_heads][head_dim].
 * With vk set (kvmem_cuda_qk_norm_rope_scatter_bf16, "fuse" on) the k
 * warps also rotate their normalised head into the view at the item's slot
 * + t and the v warps copy theirs, as scatter_kernel (rope.cu) would from
 * this row: one kernel fewer a layer. In a prefill chunk that kernel was
 * the dearest after the GEMMs (1.76 ms a layer at 4096 tokens under ncu,
 * 16 blocks for the whole chunk); here the scatter rides on the q/k
 * kernel's grid and reuses its angles.
 *
 * The angles: each block worked out its token's (double pow and sincos on
 * 64 threads while the others waited): 153 us of a 4096-token chunk's
 * layer. With ang set (the scatter entry, kvmem_cuda_rope_angles' table)
 * the block reads them instead: the same values, once per forward pass.
 */
#define QKN_WARPS 8

__device__ __forceinline__ double qkn_warp_sum(double v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__global__ void __launch_bounds__(32 * QKN_WARPS)
qk_norm_rope_kernel(uint16_t *qkv, int ld, const uint16_t *qw, const uint16_t *kw, int n_heads,
		    int n_kv, int hd, float eps, const int32_t *pos, double theta, uint16_t *q_out,
		    uint16_t *q_raw, uint16_t *k_raw, uint16_t *v_out, uint16_t *vk, uint16_t *vv,
		    const kvmem_scatter_item *item, int n_layers, int cap, const double2 *ang)
{
	__shared__ double cs[ROPE_HALF_MAX], sn[ROPE_HALF_MAX];
	extern __shared__ uint16_t qkn_buf[];	/* [QKN_WARPS][hd] */
	const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int h = blockIdx.y * QKN_WARPS + warp, half = hd / 2;
	uint16_t *row = qkv + (size_t)t * ld, *buf = qkn_buf + warp * hd;

	/* The view scatter of token t (vk set) at the item's slot + t, as
	 * scatter_kernel does it for the item: skipped when the item leaves
	 * the view. */
	kvmem_scatter_item m = { 0 };
	bool put = false;
	int slot = 0;

	if (vk) {
		m = *item;
		put = m.layer >= 0 && m.layer < n_layers && m.slot >= 0 && m.n >= 1 &&
		      m.slot <= cap - m.n && t < m.n;
		slot = m.slot + t;
	}
	if (ang)	/* the forward's table: the same rope_angle values */
		for (int i = threadIdx.x; i < half; i += blockDim.x) {
			const double2 a = ang[(size_t)t * half + i];

			cs[i] = a.x;
			sn[i] = a.y;
		}
	else
		rope_angles(cs, sn, pos[t], hd, theta);
	__syncthreads();
	if (h >= n_heads + 2 * n_kv)
		return;
	if (h >= n_heads + n_kv) {	/* v: copied out */
		const int g = h - n_heads - n_kv;

		if (v_out)
			for (int d = lane; d < hd; d += 32)
				v_out[((size_t)t * n_kv + g) * hd + d] = row[(size_t)h * hd + d];
		if (put)
			for (int d = lane; d < hd; d += 32)
				vv[(((size_t)m.layer * n_kv + g) * cap + slot) * hd + d] =
					row[(size_t)h * hd + d];
		return;
	}
	uint16_t *x = row + (size_t)h * hd;
	const uint16_t *w = h < n_heads ? qw : kw;
	double ss = 0.0;

	for (int d = lane; d < hd; d += 32) {
		float v = bf2f(x[d]);

		ss += (double)v * v;
	}
	const float r = (float)(1.0 / sqrt(qkn_warp_sum(ss) / hd + (double)eps));

	for (int d = lane; d < hd; d += 32) {
		const uint16_t y = f2bf(__fmul_rn(__fmul_rn(bf2f(x[d]), r), bf2f(w[d])));

		if (h < n_heads) {
			buf[d] = y;
			if (q_raw)
				q_raw[((size_t)t * n_heads + h) * hd + d] = y;
		} else {
			x[d] = y;
			if (k_raw)
				k_raw[((size_t)t * n_kv + h - n_heads) * hd + d] = y;
		}
	}
	if (h >= n_heads) {
		if (!put)
			return;
		/* K rotated at the slot from the normalised row this warp just
		 * wrote: rope_pair on the same values with the same angles (those
		 * of pos[t] when the slot is that position, else rope_angle's at
		 * the slot) gives scatter_kernel's bits. */
		const size_t d0 = (((size_t)m.layer * n_kv + (h - n_heads)) * cap + slot) * hd;

		__syncwarp();
		for (int i = lane; i < half; i += 32) {
			double c = cs[i], s = sn[i];

			if (slot != pos[t])
				rope_angle(slot, i, hd, theta, &s, &c);
			rope_pair(vk + d0, x, i, half, c, s);
		}
		return;
	}
	__syncwarp();
	for (int i = lane; i < half; i += 32)
		rope_pair(q_out + ((size_t)t * n_heads + h) * hd, buf, i, half, cs[i], sn[i]);
}

extern "C" int kvmem_cuda_qk_norm_rope_bf16(kvmem_cuda_ctx *c, uint16_t *qkv, int ld,
					    const uint16_t *q_norm, const uint16_t *k_norm, int n,
					    int n_heads, int n_kv_heads, int head_dim, float eps,
					    const int32_t *pos, double theta, uint16_t *q_out,
					    uint16_t *q_raw, uint16_t *k_raw, uint16_t *v_out)
{
	const int heads = n_heads + 2 * n_kv_heads;

	if (n < 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 ||
	    head_dim > 2 * ROPE_HALF_MAX || ld < heads * head_dim)
		return kvmem_error(EINVAL, "q/k norm + rope: %d tokens of %d/%d heads x %d, row %d",
				   n, n_heads, n_kv_heads, head_dim, ld);
	if (!n)
		return 0;
	qk_norm_rope_kernel<<<dim3(n, (heads + QKN_WARPS - 1) / QKN_WARPS), 32 * QKN_WARPS,
			      QKN_WARPS * head_dim * sizeof(uint16_t), c->stream>>>(
		qkv, ld, q_norm, k_norm, n_heads, n_kv_heads, head_dim, eps, pos, theta, q_out, q_raw,
		k_raw, v_out, NULL, NULL, NULL, 0, 0, NULL);
	return kvmem_cuda_launched("q/k norm + rope");
}

extern "C" int kvmem_cuda_qk_norm_rope_scatter_bf16(
	kvmem_cuda_ctx *c, uint16_t *qkv, int ld, const uint16_t *q_norm, const uint16_t *k_norm,
	int n, int n_heads, int n_kv_heads, int head_dim, float eps, const int32_t *pos,
	double theta, uint16_t *q_out, uint16_t *q_raw, uint16_t *k_raw, uint16_t *v_out,
	uint16_t *view_k, uint16_t *view_v, const kvmem_scatter_item *item, int n_layers, int cap,
	const double *ang)
{
	const int heads = n_heads + 2 * n_kv_heads;
	int rc;

	if (!c->fuse) {
		if ((rc = kvmem_cuda_qk_norm_rope_bf16(c, qkv, ld, q_norm, k_norm, n, n_heads,
						       n_kv_heads, head_dim, eps, pos, theta, q_out,
						       q_raw, k_raw, v_out)))
			return rc;
		return kvmem_cuda_view_scatter_bf16(c, view_k, view_v, qkv + (size_t)n_heads * head_dim,
						    qkv + (size_t)(n_heads + n_kv_heads) * head_dim,
						    item, 1, n_layers, n_kv_heads, head_dim, cap, theta);
	}
	if (n < 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 ||
	    head_dim > 2 * ROPE_HALF_MAX || ld < heads * head_dim || n_layers <= 0 || cap < 0)
		return kvmem_error(EINVAL, "q/k norm + rope + scatter: %d tokens of %d/%d heads x %d, "
				   "row %d, %d layers, capacity %d", n, n_heads, n_kv_heads, head_dim,
				   ld, n_layers, cap);
	if (!n)
		return 0;
	qk_norm_rope_kernel<<<dim3(n, (heads + QKN_WARPS - 1) / QKN_WARPS), 32 * QKN_WARPS,
			      QKN_WARPS * head_dim * sizeof(uint16_t), c->stream>>>(
		qkv, ld, q_norm, k_norm, n_heads, n_kv_heads, head_dim, eps, pos, theta, q_out, q_raw,
		k_raw, v_out, view_k, view_v, item, n_layers, cap, (const double2 *)ang);
	return kvmem_cuda_launched("q/k norm + rope + scatter");
}

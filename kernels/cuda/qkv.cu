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
 * this row: one kernel fewer a layer (with rk set the normalised K also
 * goes there unrotated: the raw K a view keeps beside its slots). In a
 * prefill chunk that kernel was the dearest after the GEMMs (1.76 ms a
 * layer at 4096 tokens under ncu, 16 blocks for the whole chunk); here the
 * scatter rides on the q/k kernel's grid and reuses its angles.
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

/* One head (hd bf16) from src to dst by a warp: 16 bytes a lane when every
 * row, output and head_dim allow (vec), else 2. */
template <int HD>
__device__ __forceinline__ void qkn_copy(uint16_t *dst, const uint16_t *src, int hd, int lane,
					 bool vec)
{
	if (vec) {
#pragma unroll
		for (int d = lane * 8; d < (HD ? HD : hd); d += 256)
			*(uint4 *)(dst + d) = *(const uint4 *)(src + d);
	} else {
#pragma unroll
		for (int d = lane; d < (HD ? HD : hd); d += 32)
			dst[d] = src[d];
	}
}

/*
 * The block's warps stage their heads in shared memory (in[hd], then the
 * rotated head in rot[hd]) and move them in and out 16 bytes a lane, the
 * head's load issued before the angles' __syncthreads. HD = 128 with
 * VEC (every Qwen3; qk_norm_rope_launch picks it) has its loops unrolled at
 * compile time. At 125 us of a 4096-token chunk's layer the kernel took
 * four times its bytes at the copy rate; staging alone left that as it was
 * (ncu then: issue slots 80% busy, 508 instructions a warp, bound by
 * instruction issue), unrolling (fewer loop and address instructions)
 * brought it to 84 us. HD = 0 reads head_dim from hd_arg
 * and VEC from vec_arg. Every value is computed as before, by the same
 * arithmetic in the same order: the bits do not change.
 */
template <int HD, bool VEC>
__global__ void __launch_bounds__(32 * QKN_WARPS)
qk_norm_rope_kernel(uint16_t *qkv, int ld, const uint16_t *qw, const uint16_t *kw, int n_heads,
		    int n_kv, int hd_arg, float eps, const int32_t *pos, double theta,
		    uint16_t *q_out, uint16_t *q_raw, uint16_t *k_raw, uint16_t *v_out, uint16_t *vk,
		    uint16_t *vv, uint16_t *rk, const kvmem_scatter_item *item, int n_layers, int cap,
		    const double2 *ang, bool vec_arg, const kvmem_qk_view *tv)
{
	__shared__ double cs[HD ? HD / 2 : ROPE_HALF_MAX], sn[HD ? HD / 2 : ROPE_HALF_MAX];
	extern __shared__ __align__(16) uint16_t qkn_buf[];	/* [QKN_WARPS][2][hd] */
	const int hd = HD ? HD : hd_arg, half = hd / 2;
	const bool vec = HD ? VEC : vec_arg;
	const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int h = blockIdx.y * QKN_WARPS + warp;
	const bool live = h < n_heads + 2 * n_kv;
	uint16_t *row = qkv + (size_t)t * ld, *in = qkn_buf + (size_t)warp * 2 * hd, *rot = in + hd;
	uint16_t *x = row + (size_t)h * hd;

	if (live)
		qkn_copy<HD>(in, x, hd, lane, vec);

	/* The view scatter of token t (vk set) at the item's slot + t, as
	 * scatter_kernel does it for the item: skipped when the item leaves
	 * the view. */
	kvmem_scatter_item m = { 0 };
	bool put = false;
	int slot = 0, ti = t;	/* ti: the token's index in its item */

	if (tv) {		/* rows of many views: token t's own view and item */
		vk = tv[t].k;
		vv = tv[t].v;
		rk = tv[t].rk;
		item = tv[t].item;
		cap = tv[t].cap;
		ti = 0;
	}
	if (vk) {
		m = *item;
		put = m.layer >= 0 && m.layer < n_layers && m.slot >= 0 && m.n >= 1 &&
		      m.slot <= cap - m.n && ti < m.n;
		slot = m.slot + ti;
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
	if (!live)
		return;
	if (h >= n_heads + n_kv) {	/* v: copied out */
		const int g = h - n_heads - n_kv;

		if (v_out)
			qkn_copy<HD>(v_out + ((size_t)t * n_kv + g) * hd, in, hd, lane, vec);
		if (put)
			qkn_copy<HD>(vv + (((size_t)m.layer * n_kv + g) * cap + slot) * hd, in, hd, lane,
				     vec);
		return;
	}
	const uint16_t *w = h < n_heads ? qw : kw;
	double ss = 0.0;

#pragma unroll
	for (int d = lane; d < hd; d += 32) {
		float v = bf2f(in[d]);

		ss += (double)v * v;
	}
	const float r = (float)(1.0 / sqrt(qkn_warp_sum(ss) / hd + (double)eps));

#pragma unroll
	for (int d = lane; d < hd; d += 32)
		in[d] = f2bf(__fmul_rn(__fmul_rn(bf2f(in[d]), r), bf2f(w[d])));
	__syncwarp();
	if (h >= n_heads) {
		/* K normalised in place (the unfused scatter rotates it from
		 * qkv), copied raw, and rotated at the slot: rope_pair on the same
		 * values with the same angles (those of pos[t] when the slot is
		 * that position, else rope_angle's at the slot) gives
		 * scatter_kernel's bits. */
		qkn_copy<HD>(x, in, hd, lane, vec);
		if (k_raw)
			qkn_copy<HD>(k_raw + ((size_t)t * n_kv + h - n_heads) * hd, in, hd, lane, vec);
		if (!put)
			return;
		if (rk)		/* the raw K the view keeps beside the slot */
			qkn_copy<HD>(rk + (((size_t)m.layer * n_kv + (h - n_heads)) * cap + slot) * hd,
				     in, hd, lane, vec);
		const bool at_pos = slot == pos[t];

#pragma unroll
		for (int i = lane; i < half; i += 32) {
			double c = cs[i], s = sn[i];

			if (!at_pos)
				rope_angle(slot, i, hd, theta, &s, &c);
			rope_pair(rot, in, i, half, c, s);
		}
		__syncwarp();
		qkn_copy<HD>(vk + (((size_t)m.layer * n_kv + (h - n_heads)) * cap + slot) * hd, rot,
			     hd, lane, vec);
		return;
	}
	if (q_raw)
		qkn_copy<HD>(q_raw + ((size_t)t * n_heads + h) * hd, in, hd, lane, vec);
#pragma unroll
	for (int i = lane; i < half; i += 32)
		rope_pair(rot, in, i, half, cs[i], sn[i]);
	__syncwarp();
	qkn_copy<HD>(q_out + ((size_t)t * n_heads + h) * hd, rot, hd, lane, vec);
}

/* 16-byte moves: head_dim and the row a multiple of 8 elements and every
 * buffer 16-byte aligned (cudaMalloc's are; a view's layer and slot offsets
 * are multiples of head_dim). */
static bool qkn_vec(int ld, int hd, const void *const *p, int np)
{
	if (hd % 8 || ld % 8)
		return false;
	for (int i = 0; i < np; i++)
		if ((uintptr_t)p[i] % 16)
			return false;
	return true;
}

/* The kernel for the shape: head_dim 128 with 16-byte moves unrolled, else
 * the general one. */
static void qk_norm_rope_launch(cudaStream_t st, int n, int heads, uint16_t *qkv, int ld,
				const uint16_t *qw, const uint16_t *kw, int n_heads, int n_kv, int hd,
				float eps, const int32_t *pos, double theta, uint16_t *q_out,
				uint16_t *q_raw, uint16_t *k_raw, uint16_t *v_out, uint16_t *vk,
				uint16_t *vv, uint16_t *rk, const kvmem_scatter_item *item, int n_layers,
				int cap, const double2 *ang, bool vec, const kvmem_qk_view *tv)
{
	const dim3 grid(n, (heads + QKN_WARPS - 1) / QKN_WARPS);
	const size_t smem = (size_t)QKN_WARPS * 2 * hd * sizeof(uint16_t);

	if (hd == 128 && vec)
		qk_norm_rope_kernel<128, true><<<grid, 32 * QKN_WARPS, smem, st>>>(
			qkv, ld, qw, kw, n_heads, n_kv, hd, eps, pos, theta, q_out, q_raw, k_raw, v_out,
			vk, vv, rk, item, n_layers, cap, ang, vec, tv);
	else
		qk_norm_rope_kernel<0, false><<<grid, 32 * QKN_WARPS, smem, st>>>(
			qkv, ld, qw, kw, n_heads, n_kv, hd, eps, pos, theta, q_out, q_raw, k_raw, v_out,
			vk, vv, rk, item, n_layers, cap, ang, vec, tv);
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
	const void *p[] = { qkv, q_out, q_raw, k_raw, v_out };

	qk_norm_rope_launch(c->stream, n, heads, qkv, ld, q_norm, k_norm, n_heads, n_kv_heads,
			    head_dim, eps, pos, theta, q_out, q_raw, k_raw, v_out, NULL, NULL, NULL, NULL,
			    0, 0, NULL, qkn_vec(ld, head_dim, p, 5), NULL);
	return kvmem_cuda_launched("q/k norm + rope");
}

extern "C" int kvmem_cuda_qk_norm_rope_scatter_bf16(
	kvmem_cuda_ctx *c, uint16_t *qkv, int ld, const uint16_t *q_norm, const uint16_t *k_norm,
	int n, int n_heads, int n_kv_heads, int head_dim, float eps, const int32_t *pos,
	double theta, uint16_t *q_out, uint16_t *q_raw, uint16_t *k_raw, uint16_t *v_out,
	uint16_t *view_k, uint16_t *view_v, uint16_t *raw_view, const kvmem_scatter_item *item,
	int n_layers, int cap, const double *ang)
{
	const int heads = n_heads + 2 * n_kv_heads;
	int rc;

	if (!c->fuse) {
		if ((rc = kvmem_cuda_qk_norm_rope_bf16(c, qkv, ld, q_norm, k_norm, n, n_heads,
						       n_kv_heads, head_dim, eps, pos, theta, q_out,
						       q_raw, k_raw, v_out)))
			return rc;
		return kvmem_cuda_view_scatter_raw_bf16(c, view_k, view_v, raw_view,
							qkv + (size_t)n_heads * head_dim,
							qkv + (size_t)(n_heads + n_kv_heads) * head_dim,
							item, 1, n_layers, n_kv_heads, head_dim, cap,
							theta);
	}
	if (n < 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 ||
	    head_dim > 2 * ROPE_HALF_MAX || ld < heads * head_dim || n_layers <= 0 || cap < 0)
		return kvmem_error(EINVAL, "q/k norm + rope + scatter: %d tokens of %d/%d heads x %d, "
				   "row %d, %d layers, capacity %d", n, n_heads, n_kv_heads, head_dim,
				   ld, n_layers, cap);
	if (!n)
		return 0;
	const void *p[] = { qkv, q_out, q_raw, k_raw, v_out, view_k, view_v, raw_view };

	qk_norm_rope_launch(c->stream, n, heads, qkv, ld, q_norm, k_norm, n_heads, n_kv_heads,
			    head_dim, eps, pos, theta, q_out, q_raw, k_raw, v_out, view_k, view_v,
			    raw_view, item, n_layers, cap, (const double2 *)ang,
			    qkn_vec(ld, head_dim, p, 8), NULL);
	return kvmem_cuda_launched("q/k norm + rope + scatter");
}

/* Rows of many views (a batched decode step), fused only: the kernel of
 * the entry above with token t's view, item and capacity from views[t]
 * and its slot the item's own (token 0 of it). 16-byte moves when the
 * rows allow them; the views' K, V and raw K are cudaMalloc'd, and a
 * view's offsets are multiples of head_dim (the lone call's check). */
extern "C" int kvmem_cuda_qk_norm_rope_scatter_rows_bf16(
	kvmem_cuda_ctx *c, uint16_t *qkv, int ld, const uint16_t *q_norm, const uint16_t *k_norm,
	int n, int n_heads, int n_kv_heads, int head_dim, float eps, const int32_t *pos,
	double theta, uint16_t *q_out, uint16_t *q_raw, uint16_t *k_raw, uint16_t *v_out,
	const kvmem_qk_view *views, int n_layers, const double *ang)
{
	const int heads = n_heads + 2 * n_kv_heads;

	if (!c->fuse)
		return kvmem_error(ENOTSUP, "q/k norm + rope + scatter over rows: \"fuse\" is off");
	if (n < 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 ||
	    head_dim > 2 * ROPE_HALF_MAX || ld < heads * head_dim || n_layers <= 0 || !views || !ang)
		return kvmem_error(EINVAL, "q/k norm + rope + scatter over rows: %d tokens of %d/%d "
				   "heads x %d, row %d, %d layers", n, n_heads, n_kv_heads, head_dim,
				   ld, n_layers);
	if (!n)
		return 0;
	const void *p[] = { qkv, q_out, q_raw, k_raw, v_out };

	qk_norm_rope_launch(c->stream, n, heads, qkv, ld, q_norm, k_norm, n_heads, n_kv_heads,
			    head_dim, eps, pos, theta, q_out, q_raw, k_raw, v_out, NULL, NULL, NULL,
			    NULL, n_layers, 0, (const double2 *)ang, qkn_vec(ld, head_dim, p, 5),
			    views);
	return kvmem_cuda_launched("q/k norm + rope + scatter over rows");
}

/* SPDX-License-Identifier: MIT */
/*
 * One warp's online softmax over a run of keys for one (query, head): the
 * loop of attention v1 (attention.cu) and of the batched attention's
 * fallback for sequences of more than 16 rows per KV head
 * (attention_batch.cu), which calls it per split. 32 keys per step, a lane
 * per key (its dot product in dimension order), the running max and sum in
 * fp32 (expf), V accumulated lane per dimension: o[c] holds dimension
 * lane + 32 c. The caller starts with m = -inf, l = 0, o = 0 and the query
 * (fp32) in qs.
 */
#ifndef KVMEM_KERNELS_CUDA_ATTENTION_WARP_CUH
#define KVMEM_KERNELS_CUDA_ATTENTION_WARP_CUH

#include "cuda_int.h"

#define WARP_ATT_MAX_HD 256

__device__ __forceinline__ void warp_attend(const float *qs, const uint16_t *kh, const uint16_t *vh,
					    const int32_t *kv_pos, int qp, int j_lo, int j_hi,
					    int hd, float scale, int lane, float *o, float *m_io,
					    float *l_io)
{
	const int per = hd / 32;
	float m = *m_io, l = *l_io;

	for (int j0 = j_lo; j0 < j_hi; j0 += 32) {
		const int j = j0 + lane;
		float s = -INFINITY, mc, mn, alpha, p, ps;

		if (j < j_hi && (kv_pos ? kv_pos[j] : j) <= qp) {
			const uint16_t *kj = kh + (size_t)j * hd;
			float acc = 0.0f;

			for (int d = 0; d < hd; d++)
				acc += qs[d] * bf2f(kj[d]);
			s = acc * scale;
		}
		mc = s;
		for (int o2 = 16; o2 > 0; o2 >>= 1)
			mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, o2));
		mn = fmaxf(m, mc);
		if (mn == -INFINITY)
			continue;	/* nothing visible yet: uniform over the warp */
		alpha = expf(m - mn);
		p = s == -INFINITY ? 0.0f : expf(s - mn);
		ps = p;
		for (int o2 = 16; o2 > 0; o2 >>= 1)
			ps += __shfl_xor_sync(0xffffffffu, ps, o2);
		l = l * alpha + ps;
		for (int c = 0; c < per; c++)
			o[c] *= alpha;
		for (int jj = 0; jj < 32 && j0 + jj < j_hi; jj++) {
			const float pj = __shfl_sync(0xffffffffu, p, jj);

			if (pj == 0.0f)
				continue;
			const uint16_t *vj = vh + (size_t)(j0 + jj) * hd;

			for (int c = 0; c < per; c++)
				o[c] += pj * bf2f(vj[lane + 32 * c]);
		}
		m = mn;
	}
	*m_io = m;
	*l_io = l;
}

#endif

// SPDX-License-Identifier: MIT
/*
 * kvmem_attention_kv_bf16 and kvmem_decode_kv_bf16: the CPU twins of the
 * GPU's attention over bf16 or fp8 K/V (kernels/kernels_fp8.h): a prefill
 * chunk (attention.cu over an fp8 view's layer) and kernels/cuda/fp8.cu's
 * decode. Widen or dequantise (both exact) to fp32, kvmem_attention, round
 * to bf16.
 */
#include <errno.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"

static float widen(const void *p, const float *sc, int dtype, size_t row, size_t i)
{
	if (dtype == KVMEM_DTYPE_FP8)
		return kvmem_e4m3_to_f32(((const uint8_t *)p)[i]) * sc[row];
	return kvmem_bf16_to_f32(((const uint16_t *)p)[i]);
}

int kvmem_attention_kv_bf16(uint16_t *out, const uint16_t *q, const int32_t *q_pos, int n_q,
			    const void *k, const void *v, const float *k_scale,
			    const float *v_scale, int kv_dtype, int n_kv, size_t kv_stride,
			    int n_heads, int n_kv_heads, int head_dim, float scale)
{
	const size_t hd = (size_t)head_dim, kn = (size_t)n_kv_heads * n_kv * hd;
	const size_t qn = (size_t)n_q * n_heads * hd;
	float *qf, *kf, *vf, *of;
	int32_t *kv_pos;
	int rc = 0;

	if (n_q <= 0 || n_kv <= 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads ||
	    head_dim <= 0 || kv_stride < (size_t)n_kv ||
	    (kv_dtype != KVMEM_DTYPE_BF16 && kv_dtype != KVMEM_DTYPE_FP8))
		return kvmem_error(EINVAL, "attention over a view layer: %d queries, %d keys of %d "
				   "KV heads x %d, dtype %d", n_q, n_kv, n_kv_heads, head_dim,
				   kv_dtype);
	qf = malloc(sizeof(float) * qn);
	of = malloc(sizeof(float) * qn);
	kf = malloc(sizeof(float) * kn);
	vf = malloc(sizeof(float) * kn);
	kv_pos = malloc(sizeof(int32_t) * n_kv);
	if (!qf || !of || !kf || !vf || !kv_pos) {
		rc = kvmem_error(ENOMEM, "attention over a view layer: out of memory");
		goto out;
	}
	for (size_t i = 0; i < qn; i++)
		qf[i] = kvmem_bf16_to_f32(q[i]);
	for (int h = 0; h < n_kv_heads; h++)
		for (int j = 0; j < n_kv; j++) {
			const size_t row = (size_t)h * kv_stride + j;

			for (size_t d = 0; d < hd; d++) {
				kf[((size_t)h * n_kv + j) * hd + d] = widen(k, k_scale, kv_dtype, row,
									    row * hd + d);
				vf[((size_t)h * n_kv + j) * hd + d] = widen(v, v_scale, kv_dtype, row,
									    row * hd + d);
			}
		}
	for (int j = 0; j < n_kv; j++)
		kv_pos[j] = j;
	kvmem_attention(of, qf, q_pos, n_q, kf, vf, kv_pos, n_kv, (size_t)n_kv, n_heads, n_kv_heads,
			head_dim, scale);
	for (size_t i = 0; i < qn; i++)
		out[i] = kvmem_f32_to_bf16(of[i]);
out:
	free(qf);
	free(of);
	free(kf);
	free(vf);
	free(kv_pos);
	return rc;
}

int kvmem_decode_kv_bf16(uint16_t *out, const uint16_t *q, const void *k, const void *v,
			 const float *k_scale, const float *v_scale, int kv_dtype, int n_kv,
			 size_t kv_stride, int n_heads, int n_kv_heads, int head_dim, float scale)
{
	const int32_t q_pos = n_kv - 1;	/* every key visible */

	return kvmem_attention_kv_bf16(out, q, &q_pos, 1, k, v, k_scale, v_scale, kv_dtype, n_kv,
				       kv_stride, n_heads, n_kv_heads, head_dim, scale);
}

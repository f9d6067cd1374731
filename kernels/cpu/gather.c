// SPDX-License-Identifier: MIT
/*
 * kvmem_view_gather_bf16: the CPU twin of kernels/cuda/gather.cu. Each item's
 * tokens are first rounded to bf16 into a packed scratch row by row (what
 * the cuda backend's staging did), then moved by kvmem_view_scatter_bf16
 * with one item, so the twin is the scatter by construction: the same
 * rotation, the same bits.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_bf16.h"
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"

/* n elements of a page half in `dtype` to bf16. */
static int to_bf16(uint16_t *dst, const void *src, size_t off, size_t n, int dtype)
{
	switch (dtype) {
	case KVMEM_DTYPE_BF16:
		memcpy(dst, (const uint16_t *)src + off, n * 2);
		return 0;
	case KVMEM_DTYPE_F32:
		for (size_t i = 0; i < n; i++)
			dst[i] = kvmem_f32_to_bf16(((const float *)src)[off + i]);
		return 0;
	case KVMEM_DTYPE_F16:
		for (size_t i = 0; i < n; i++)
			dst[i] = kvmem_f32_to_bf16(kvmem_f16_to_f32(((const uint16_t *)src)[off + i]));
		return 0;
	}
	return -1;
}

int kvmem_view_gather_bf16(uint16_t *view_k, uint16_t *view_v, const kvmem_gather_item *items,
			   int n_items, int n_layers, int n_kv_heads, int head_dim, int cap,
			   double theta)
{
	uint16_t *sk = NULL, *sv = NULL;
	size_t room = 0;
	int bad = -1, rc = 0;

	if (n_items < 0 || n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 ||
	    cap < 0)
		return kvmem_error(EINVAL, "view gather: %d items into %d layers x %d heads x %d",
				   n_items, n_layers, n_kv_heads, head_dim);
	for (int it = 0; it < n_items; it++) {
		const kvmem_gather_item *m = &items[it];
		size_t row = (size_t)head_dim, need = (size_t)(m->n > 0 ? m->n : 0) * n_kv_heads * row;
		kvmem_scatter_item si;

		if (m->layer < 0 || m->layer >= n_layers || m->slot < 0 || m->n < 0 ||
		    m->slot > cap - m->n || (m->dtype != KVMEM_DTYPE_F32 &&
		    m->dtype != KVMEM_DTYPE_BF16 && m->dtype != KVMEM_DTYPE_F16 &&
		    (m->dtype != KVMEM_DTYPE_FP8 || !m->k_scale || !m->v_scale))) {
			bad = it;
			continue;
		}
		if (need > room) {
			uint16_t *a = realloc(sk, need * 2), *b;

			if (!a) {
				rc = kvmem_error(ENOMEM, "view gather: out of memory");
				goto out;
			}
			sk = a;
			if (!(b = realloc(sv, need * 2))) {
				rc = kvmem_error(ENOMEM, "view gather: out of memory");
				goto out;
			}
			sv = b;
			room = need;
		}
		/* Packed [n][n_kv_heads][head_dim], the forward pass's layout. */
		for (int t = 0; t < m->n; t++)
			for (int h = 0; h < n_kv_heads; h++) {
				size_t src = (size_t)t * row + (size_t)h * m->head_stride;
				size_t dst = ((size_t)t * n_kv_heads + h) * row;

				if (m->dtype == KVMEM_DTYPE_FP8) {
					/* exact in fp32, then one rounding */
					float ks = m->k_scale[(size_t)h * m->scale_stride + t];
					float vs = m->v_scale[(size_t)h * m->scale_stride + t];

					for (size_t i = 0; i < row; i++) {
						sk[dst + i] = kvmem_f32_to_bf16(kvmem_e4m3_to_f32(
							((const uint8_t *)m->k)[src + i]) * ks);
						sv[dst + i] = kvmem_f32_to_bf16(kvmem_e4m3_to_f32(
							((const uint8_t *)m->v)[src + i]) * vs);
					}
				} else {
					to_bf16(sk + dst, m->k, src, row, m->dtype);
					to_bf16(sv + dst, m->v, src, row, m->dtype);
				}
				if (m->copy_k)
					memcpy(m->copy_k + src, sk + dst, row * 2);
				if (m->copy_v)
					memcpy(m->copy_v + src, sv + dst, row * 2);
				if (m->raw_k)
					memcpy(m->raw_k + (size_t)t * row + (size_t)h * m->raw_stride,
					       sk + dst, row * 2);
			}
		si = (kvmem_scatter_item){ .layer = m->layer, .slot = m->slot, .n = m->n,
					   .tok_stride = n_kv_heads * head_dim, .src = 0,
					   .head_stride = head_dim };
		if ((rc = kvmem_view_scatter_bf16(view_k, view_v, sk, sv, &si, 1, n_layers,
						  n_kv_heads, head_dim, cap, theta)) < 0)
			goto out;
	}
	if (bad >= 0)
		rc = kvmem_error(EINVAL, "view gather: item %d (layer %d, slots %d..+%d, dtype %d) is "
				 "outside the view (%d layers, %d slots) or of no known dtype", bad,
				 items[bad].layer, items[bad].slot, items[bad].n, items[bad].dtype,
				 n_layers, cap);
out:
	free(sk);
	free(sv);
	return rc;
}

// SPDX-License-Identifier: MIT
/*
 * The twins of kernels/cuda/fp8_view.cu (kernels/kernels_fp8.h): a K row
 * of an fp8 view from its raw fp8 K row, the forward pass's put and the
 * gather from fp8 pages (tests/gpu/check_fp8_view.c compares them). The rotation is the bf16
 * path's (kvmem_rope_angles' double angles, double products rounded to
 * nearest, no FMA) rounded once to fp32, then quantised at twice the raw
 * row's scale.
 */
#include <string.h>

#include "kernels/kernels_bf16.h"
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"

void kvmem_fp8_view_k_row(uint8_t *q, float *scale, const uint8_t *raw, float raw_scale,
			  int32_t pos, int head_dim, double theta)
{
	const int half = head_dim / 2;
	const float inv2s = 0.5f / raw_scale;	/* exact: a power of two */
	double ang[1024];	/* head_dim <= 1024: (cos, sin) of each pair */

	kvmem_rope_angles(ang, &pos, 1, head_dim, theta);
	for (int i = 0; i < half; i++) {
		const double a = kvmem_e4m3_to_f32(raw[i]) * raw_scale;
		const double b = kvmem_e4m3_to_f32(raw[i + half]) * raw_scale;
		const double c = ang[2 * i], s = ang[2 * i + 1];
		const float x = (float)(a * c - b * s), y = (float)(b * c + a * s);

		q[i] = kvmem_f32_to_e4m3(x * inv2s);
		q[i + half] = kvmem_f32_to_e4m3(y * inv2s);
	}
	*scale = 2.0f * raw_scale;
}

/* Twin of kvmem_cuda_fp8_view_put: the n new tokens' bf16 K and V rows
 * into the view at the item's layer and slot. */
void kvmem_fp8_view_put(uint8_t *view_k, uint8_t *view_v, float *k_scale, float *v_scale,
			uint8_t *raw_k, float *raw_scale, const uint16_t *rows_k, const uint16_t *rows_v, int ld,
			const kvmem_scatter_item *item, int n, int n_kv_heads, int head_dim, int cap,
			double theta)
{
	float x[1024];
	uint8_t raw[1024];

	for (int t = 0; t < n; t++)
		for (int h = 0; h < n_kv_heads; h++) {
			const size_t d = ((size_t)item->layer * n_kv_heads + h) * cap + item->slot + t;
			const size_t src = (size_t)t * ld + (size_t)h * head_dim;
			float s;

			kvmem_bf16_to_f32_n(x, rows_v + src, (size_t)head_dim);
			kvmem_fp8_quant_row(view_v + d * head_dim, &v_scale[d], x, head_dim);
			kvmem_bf16_to_f32_n(x, rows_k + src, (size_t)head_dim);
			kvmem_fp8_quant_row(raw, &s, x, head_dim);
			kvmem_fp8_view_k_row(view_k + d * head_dim, &k_scale[d], raw, s,
					     item->slot + t, head_dim, theta);
			if (raw_k) {
				memcpy(raw_k + d * head_dim, raw, head_dim);
				raw_scale[d] = s;
			}
		}
}

/* Twin of kvmem_cuda_fp8_view_gather: fp8 pages into the view. Items of
 * another dtype, or out of the view, are skipped as the kernel skips them. */
void kvmem_fp8_view_gather(uint8_t *view_k, uint8_t *view_v, float *k_scale, float *v_scale,
			   uint8_t *raw_k, float *raw_scale, const kvmem_gather_item *items, int n_items, int n_layers,
			   int n_kv_heads, int head_dim, int cap, double theta)
{
	for (int i = 0; i < n_items; i++) {
		const kvmem_gather_item *m = &items[i];

		if (m->layer < 0 || m->layer >= n_layers || m->slot < 0 || m->n < 0 ||
		    m->slot > cap - m->n || m->dtype != KVMEM_DTYPE_FP8 || !m->k_scale || !m->v_scale)
			continue;
		for (int t = 0; t < m->n; t++)
			for (int h = 0; h < n_kv_heads; h++) {
				const size_t d = ((size_t)m->layer * n_kv_heads + h) * cap + m->slot + t;
				const size_t off = (size_t)t * head_dim + (size_t)h * m->head_stride;
				const size_t sr = (size_t)h * m->scale_stride + t;

				memcpy(view_v + d * head_dim, (const uint8_t *)m->v + off, head_dim);
				v_scale[d] = m->v_scale[sr];
				kvmem_fp8_view_k_row(view_k + d * head_dim, &k_scale[d],
						     (const uint8_t *)m->k + off, m->k_scale[sr],
						     m->slot + t, head_dim, theta);
				if (raw_k) {
					memcpy(raw_k + d * head_dim, (const uint8_t *)m->k + off, head_dim);
					raw_scale[d] = m->k_scale[sr];
				}
			}
	}
}

// SPDX-License-Identifier: MIT
/*
 * The twin of kernels/cuda/fp8_view.cu's view rows (kernels/kernels_fp8.h):
 * a K row of an fp8 view from its raw fp8 K row. The rotation is the bf16
 * path's (kvmem_rope_angles' double angles, double products rounded to
 * nearest, no FMA) rounded once to fp32, then quantised at twice the raw
 * row's scale.
 */
#include "kernels/kernels_bf16.h"
#include "kernels/kernels_fp8.h"

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

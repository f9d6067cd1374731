// SPDX-License-Identifier: MIT
/*
 * Rotary position embedding, "rotate half" form.
 *
 * Every output element depends only on its pair (x[i], x[i + D/2]), the
 * position, i, head_dim and theta: the angle, its cosine and sine and the
 * rotation itself are computed the same way whatever n or the batch holds.
 * The workspace layer relies on this: rotating a stored raw K again at the
 * same position later must give the same bits as the first time.
 */
#include <math.h>

#include "kernels/kernels.h"

/* theta^(-2i/head_dim) for i < head_dim/2: depends on i, head_dim, theta only. */
static void rope_inv_freq(double *f, int half, int head_dim, double theta)
{
	for (int i = 0; i < half; i++)
		f[i] = pow(theta, -2.0 * i / head_dim);
}

static void rope_apply(float *x, const int32_t *pos, int n, int n_heads, int head_dim,
		       double theta, double sign)
{
	int half = head_dim / 2;
	double inv_freq[half + 1];

	rope_inv_freq(inv_freq, half, head_dim, theta);

	#pragma omp parallel for schedule(static) if (n > 8)
	for (int t = 0; t < n; t++) {
		double cs[half + 1], sn[half + 1];

		for (int i = 0; i < half; i++) {
			double a = (double)pos[t] * inv_freq[i];

			cs[i] = cos(a);
			sn[i] = sign * sin(a);
		}
		for (int h = 0; h < n_heads; h++) {
			float *xh = x + ((size_t)t * n_heads + h) * head_dim;

			for (int i = 0; i < half; i++) {
				double a = xh[i], b = xh[i + half];

				xh[i] = (float)(a * cs[i] - b * sn[i]);
				xh[i + half] = (float)(b * cs[i] + a * sn[i]);
			}
		}
	}
}

void kvmem_rope(float *x, const int32_t *pos, int n, int n_heads, int head_dim, double theta)
{
	rope_apply(x, pos, n, n_heads, head_dim, theta, 1.0);
}

void kvmem_rope_ang(float *x, int n, int head_dim, const double *ang)
{
	const int half = head_dim / 2;

	for (int t = 0; t < n; t++) {
		float *xh = x + (size_t)t * head_dim;
		const double *at = ang + 2 * (size_t)t * half;

		for (int i = 0; i < half; i++) {
			double a = xh[i], b = xh[i + half], cs = at[2 * i], sn = at[2 * i + 1];

			xh[i] = (float)(a * cs - b * sn);
			xh[i + half] = (float)(b * cs + a * sn);
		}
	}
}

void kvmem_rope_inverse(float *x, const int32_t *pos, int n, int n_heads, int head_dim,
		      double theta)
{
	rope_apply(x, pos, n, n_heads, head_dim, theta, -1.0);
}

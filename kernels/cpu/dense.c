// SPDX-License-Identifier: MIT
/* Dense ops: the BLAS matmul (a ceiling and a peer; the engine's is
 * matmul.c), embedding lookup, RMSNorm, residual add (SwiGLU: swiglu.c). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"

void kvmem_matmul_blas(float *y, const float *x, const float *w, int n, int in, int out)
{
	if (n <= 0 || out <= 0)
		return;
	if (n == 1) {
		/* One token (decode): a matrix-vector product streams w once. */
		cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, w, in, x, 1, 0.0f, y, 1);
		return;
	}
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in,
		    1.0f, x, in, w, in, 0.0f, y, out);
}

void kvmem_embedding(float *out, const float *table, const int32_t *ids, int n, int dim)
{
	for (int i = 0; i < n; i++)
		memcpy(out + (size_t)i * dim, table + (size_t)ids[i] * dim, sizeof(float) * dim);
}

/* Rows whose sums of squares run side by side. A row's sum is one chain of
 * dependent double adds (4 cycles each): one row at a time, a decode step's
 * 8 heads x 64 of query norm waited on that chain, 8 rows at once keep 8
 * chains in flight. Each row's sum is still its own, in order of d: the
 * same bits as one row alone. */
#define NORM_ROWS 8

static void norm_out(float *out, const float *x, const float *w, int dim, double ss, float eps)
{
	float r = (float)(1.0 / sqrt(ss / dim + (double)eps));

	for (int d = 0; d < dim; d++)
		out[d] = x[d] * r * w[d];
}

void kvmem_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps)
{
	int i = 0;

	for (; i + NORM_ROWS <= n; i += NORM_ROWS) {
		const float *xi = x + (size_t)i * dim;
		double ss[NORM_ROWS] = { 0 };

		for (int d = 0; d < dim; d++)
			for (int r = 0; r < NORM_ROWS; r++)
				ss[r] += (double)xi[(size_t)r * dim + d] * xi[(size_t)r * dim + d];
		for (int r = 0; r < NORM_ROWS; r++)
			norm_out(out + (size_t)(i + r) * dim, xi + (size_t)r * dim, w, dim, ss[r], eps);
	}
	for (; i < n; i++) {
		const float *xi = x + (size_t)i * dim;
		double ss = 0.0;

		for (int d = 0; d < dim; d++)
			ss += (double)xi[d] * xi[d];
		norm_out(out + (size_t)i * dim, xi, w, dim, ss, eps);
	}
}

void kvmem_add(float *y, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] += x[i];
}

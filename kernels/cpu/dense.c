// SPDX-License-Identifier: MIT
/* Dense ops: the BLAS matmul (a ceiling and a peer; the engine's is
 * matmul.c), embedding lookup, RMSNorm, residual add, SwiGLU. */
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

void kvmem_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps)
{
	for (int i = 0; i < n; i++) {
		const float *xi = x + (size_t)i * dim;
		float *oi = out + (size_t)i * dim;
		double ss = 0.0;

		for (int d = 0; d < dim; d++)
			ss += (double)xi[d] * xi[d];
		float r = (float)(1.0 / sqrt(ss / dim + (double)eps));

		for (int d = 0; d < dim; d++)
			oi[d] = xi[d] * r * w[d];
	}
}

void kvmem_add(float *y, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] += x[i];
}

void kvmem_swiglu(float *out, const float *gate, const float *up, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float g = gate[i];

		out[i] = g / (1.0f + expf(-g)) * up[i];
	}
}

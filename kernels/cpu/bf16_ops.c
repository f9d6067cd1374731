// SPDX-License-Identifier: MIT
/*
 * CPU twins of the CUDA engine's bf16 ops (kernels/kernels_bf16.h).
 *
 * They define what the CUDA kernels compute: each value is computed in fp32
 * (or double where the header says so) from the widened bf16 inputs and
 * rounded once to bf16 at the end. They are references, written for clarity
 * over speed, except where a twin reuses an fp32 op of kernels.h (the GEMM
 * widens and calls OpenBLAS, attention widens and calls kvmem_attention).
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_bf16.h"
#include "kvmem/kvmem.h"

/* bf16 nearest to a double, rounded once. (float)x rounds to nearest fp32;
 * that can land exactly on a bf16 midpoint that x itself was not on (double
 * rounding): then step one fp32 ulp back towards x before rounding to bf16.
 * The CUDA kernels use the same steps (kernels/cuda/cuda_int.h). */
static uint16_t f64_to_bf16(double x)
{
	float f = (float)x;
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	if ((u & 0xffffu) == 0x8000u && (double)f != x && isfinite(f))
		u += (fabs(x) > fabs((double)f)) ? 1 : -1;
	memcpy(&f, &u, sizeof(f));
	return kvmem_f32_to_bf16(f);
}

int kvmem_convert_to_bf16(uint16_t *dst, const void *src, int src_dtype, size_t n)
{
	switch (src_dtype) {
	case KVMEM_DTYPE_F32:
		kvmem_f32_to_bf16_n(dst, src, n);
		return 0;
	case KVMEM_DTYPE_BF16:
		memmove(dst, src, n * sizeof(uint16_t));
		return 0;
	case KVMEM_DTYPE_F16:
		for (size_t i = 0; i < n; i++)
			dst[i] = kvmem_f32_to_bf16(kvmem_f16_to_f32(((const uint16_t *)src)[i]));
		return 0;
	}
	return kvmem_error(EINVAL, "convert to bf16: unknown source type %d", src_dtype);
}

void kvmem_embedding_bf16(float *out, const uint16_t *table, const int32_t *ids, int n, int dim)
{
	for (int i = 0; i < n; i++)
		kvmem_bf16_to_f32_n(out + (size_t)i * dim, table + (size_t)ids[i] * dim, dim);
}

/* 1/sqrt(mean(x^2) + eps) with the sum in double, as kvmem_rmsnorm. */
static float rms_scale_f32(const float *x, int dim, float eps)
{
	double ss = 0.0;

	for (int d = 0; d < dim; d++)
		ss += (double)x[d] * x[d];
	return (float)(1.0 / sqrt(ss / dim + (double)eps));
}

void kvmem_rmsnorm_bf16(uint16_t *out, const float *x, const uint16_t *w, int n, int dim,
			float eps)
{
	for (int i = 0; i < n; i++) {
		const float *xi = x + (size_t)i * dim;
		float r = rms_scale_f32(xi, dim, eps);

		for (int d = 0; d < dim; d++)
			out[(size_t)i * dim + d] = kvmem_f32_to_bf16(xi[d] * r * kvmem_bf16_to_f32(w[d]));
	}
}

void kvmem_headnorm_bf16(uint16_t *x, const uint16_t *w, int rows, int head_dim, float eps)
{
	float row[head_dim > 0 ? head_dim : 1];	/* head_dim <= 1024 (kvmem_config_validate) */

	for (int i = 0; i < rows; i++) {
		uint16_t *xi = x + (size_t)i * head_dim;
		float r;

		kvmem_bf16_to_f32_n(row, xi, head_dim);
		r = rms_scale_f32(row, head_dim, eps);
		for (int d = 0; d < head_dim; d++)
			xi[d] = kvmem_f32_to_bf16(row[d] * r * kvmem_bf16_to_f32(w[d]));
	}
}

void kvmem_swiglu_bf16(uint16_t *out, const uint16_t *gate, const uint16_t *up, int n, int dim,
		       int ld)
{
	for (int i = 0; i < n; i++)
		for (int j = 0; j < dim; j++) {
			float g = kvmem_bf16_to_f32(gate[(size_t)i * ld + j]);
			float u = kvmem_bf16_to_f32(up[(size_t)i * ld + j]);

			out[(size_t)i * dim + j] = kvmem_f32_to_bf16(g / (1.0f + expf(-g)) * u);
		}
}

static float *widen(const uint16_t *src, size_t n)
{
	float *f = malloc(sizeof(float) * (n ? n : 1));

	if (f)
		kvmem_bf16_to_f32_n(f, src, n);
	return f;
}

int kvmem_gemm_bf16(void *y, int mode, const uint16_t *x, const uint16_t *w, int n, int in,
		    int out)
{
	float *xf, *wf, *yf;

	if (n < 0 || in <= 0 || out <= 0 || mode < KVMEM_GEMM_BF16 || mode > KVMEM_GEMM_F32_ADD)
		return kvmem_error(EINVAL, "gemm: bad shape %d x %d -> %d or mode %d", n, in, out, mode);
	if (n == 0)
		return 0;
	xf = widen(x, (size_t)n * in);
	wf = widen(w, (size_t)out * in);
	yf = mode == KVMEM_GEMM_BF16 ? malloc(sizeof(float) * n * out) : y;
	if (!xf || !wf || !yf) {
		free(xf);
		free(wf);
		if (mode == KVMEM_GEMM_BF16)
			free(yf);
		return kvmem_error(ENOMEM, "gemm: out of memory for %d x %d -> %d", n, in, out);
	}
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, xf, in, wf, in,
		    mode == KVMEM_GEMM_F32_ADD ? 1.0f : 0.0f, yf, out);
	if (mode == KVMEM_GEMM_BF16) {
		for (size_t i = 0; i < (size_t)n * out; i++)
			((uint16_t *)y)[i] = kvmem_f32_to_bf16(yf[i]);
		free(yf);
	}
	free(xf);
	free(wf);
	return 0;
}

int kvmem_logits_bf16(float *logits, const float *x, const uint16_t *norm_w,
		      const uint16_t *lm_head, uint16_t *tmp, int n, int hidden, int vocab,
		      float eps)
{
	kvmem_rmsnorm_bf16(tmp, x, norm_w, n, hidden, eps);
	return kvmem_gemm_bf16(logits, KVMEM_GEMM_F32, tmp, lm_head, n, hidden, vocab);
}

/* ---- RoPE --------------------------------------------------------------- */

/* cos and sin of pos * theta^(-2i/head_dim) for i < head_dim/2, in double
 * (the frequencies as kernels/cpu/rope.c computes them). */
static void rope_angles(double *cs, double *sn, int32_t pos, int head_dim, double theta)
{
	for (int i = 0; i < head_dim / 2; i++) {
		double a = (double)pos * pow(theta, -2.0 * i / head_dim);

		cs[i] = cos(a);
		sn[i] = sin(a);
	}
}

void kvmem_rope_angles(double *ang, const int32_t *pos, int n, int head_dim, double theta)
{
	const int half = head_dim / 2;
	double cs[half + 1], sn[half + 1];

	for (int t = 0; t < n; t++) {
		rope_angles(cs, sn, pos[t], head_dim, theta);
		for (int i = 0; i < half; i++) {
			ang[2 * ((size_t)t * half + i)] = cs[i];
			ang[2 * ((size_t)t * half + i) + 1] = sn[i];
		}
	}
}

/* dst = R(pos) src on one head (dst may equal src). */
static void rope_head(uint16_t *dst, const uint16_t *src, const double *cs, const double *sn,
		      int half)
{
	for (int i = 0; i < half; i++) {
		double a = kvmem_bf16_to_f32(src[i]), b = kvmem_bf16_to_f32(src[i + half]);

		dst[i] = f64_to_bf16(a * cs[i] - b * sn[i]);
		dst[i + half] = f64_to_bf16(b * cs[i] + a * sn[i]);
	}
}

void kvmem_rope_bf16(uint16_t *x, const int32_t *pos, int n, int n_heads, int head_dim,
		     double theta)
{
	int half = head_dim / 2;
	double cs[half + 1], sn[half + 1];

	for (int t = 0; t < n; t++) {
		rope_angles(cs, sn, pos[t], head_dim, theta);
		for (int h = 0; h < n_heads; h++) {
			uint16_t *xh = x + ((size_t)t * n_heads + h) * head_dim;

			rope_head(xh, xh, cs, sn, half);
		}
	}
}

int kvmem_view_scatter_bf16(uint16_t *view_k, uint16_t *view_v, const uint16_t *stage_k,
			    const uint16_t *stage_v, const kvmem_scatter_item *items, int n_items,
			    int n_layers, int n_kv_heads, int head_dim, int cap, double theta)
{
	int half = head_dim / 2, bad = -1;
	double cs[half + 1], sn[half + 1];

	for (int it = 0; it < n_items; it++) {
		const kvmem_scatter_item *m = &items[it];

		if (m->layer < 0 || m->layer >= n_layers || m->slot < 0 || m->n < 0 ||
		    m->slot > cap - m->n) {
			bad = it;
			continue;
		}
		for (int t = 0; t < m->n; t++) {
			rope_angles(cs, sn, m->slot + t, head_dim, theta);
			for (int h = 0; h < n_kv_heads; h++) {
				size_t s = (size_t)(m->src + (int64_t)t * m->tok_stride +
						    (int64_t)h * m->head_stride);
				size_t d = (((size_t)m->layer * n_kv_heads + h) * cap + m->slot + t) *
					   head_dim;

				rope_head(view_k + d, stage_k + s, cs, sn, half);
				memcpy(view_v + d, stage_v + s, sizeof(uint16_t) * head_dim);
			}
		}
	}
	if (bad >= 0)
		return kvmem_error(EINVAL, "view scatter: item %d (layer %d, slots %d..+%d) is outside "
				   "the view (%d layers, %d slots)", bad, items[bad].layer,
				   items[bad].slot, items[bad].n, n_layers, cap);
	return 0;
}

/* ---- attention ---------------------------------------------------------- */

int kvmem_attention_bf16(uint16_t *out, const uint16_t *q, const int32_t *q_pos, int n_q,
			 const uint16_t *k, const uint16_t *v, const int32_t *kv_pos, int n_kv,
			 size_t kv_stride, int n_heads, int n_kv_heads, int head_dim, float scale)
{
	size_t qn = (size_t)n_q * n_heads * head_dim, kn = (size_t)n_kv_heads * n_kv * head_dim;
	float *qf, *kf, *vf, *of;
	int32_t *pos = NULL;
	int rc = 0;

	if (n_q < 0 || n_kv < 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads ||
	    head_dim <= 0 || kv_stride < (size_t)n_kv)
		return kvmem_error(EINVAL, "attention: bad shape (%d queries, %d keys of stride %zu, "
				   "%d/%d heads, head_dim %d)", n_q, n_kv, kv_stride, n_heads,
				   n_kv_heads, head_dim);
	if (n_q == 0)
		return 0;
	qf = widen(q, qn);
	kf = malloc(sizeof(float) * (kn ? kn : 1));
	vf = malloc(sizeof(float) * (kn ? kn : 1));
	of = malloc(sizeof(float) * qn);
	if (!kv_pos)
		pos = malloc(sizeof(int32_t) * (n_kv ? n_kv : 1));
	if (!qf || !kf || !vf || !of || (!kv_pos && !pos)) {
		rc = kvmem_error(ENOMEM, "attention: out of memory for %d keys", n_kv);
		goto out;
	}
	/* The view's rows 0..n_kv-1 of each head, compact. */
	for (int g = 0; g < n_kv_heads; g++) {
		kvmem_bf16_to_f32_n(kf + (size_t)g * n_kv * head_dim, k + g * kv_stride * head_dim,
				    (size_t)n_kv * head_dim);
		kvmem_bf16_to_f32_n(vf + (size_t)g * n_kv * head_dim, v + g * kv_stride * head_dim,
				    (size_t)n_kv * head_dim);
	}
	for (int j = 0; pos && j < n_kv; j++)
		pos[j] = j;
	kvmem_attention(of, qf, q_pos, n_q, kf, vf, kv_pos ? kv_pos : pos, n_kv, (size_t)n_kv,
			n_heads, n_kv_heads, head_dim, scale);
	for (size_t i = 0; i < qn; i++)
		out[i] = kvmem_f32_to_bf16(of[i]);
out:
	free(qf);
	free(kf);
	free(vf);
	free(of);
	free(pos);
	return rc;
}

/* ---- sampling ----------------------------------------------------------- */

int kvmem_sample_token(int32_t *token, const float *logits, int vocab, const kvmem_sampler *s,
		       uint64_t *rng)
{
	int t;

	if (vocab <= 0)
		return kvmem_error(EINVAL, "sample: vocabulary of %d tokens", vocab);
	t = kvmem_sample(logits, vocab, s, rng);
	if (t < 0)
		return kvmem_error(ENOMEM, "sample: out of memory for %d candidates", vocab);
	*token = t;
	return 0;
}

// SPDX-License-Identifier: MIT
/*
 * The CUDA engine's CPU twins (kernels/cpu/bf16_ops.c, kernels/cpu/score.c)
 * against naive double (or long double) references on fresh random inputs
 * (the seed is printed; KVMEM_TEST_SEED replays it), and the scorers against
 * the workspace policies they were taken from, bit for bit.
 *
 * Tolerances (bf16 outputs: one rounding is at most 2^-9 relative, so
 * 2^-8 |ref| bounds it with room for the fp32 arithmetic before it):
 *   rmsnorm, headnorm, swiglu   |err| <= 2^-8 |ref| + 1e-30
 *   rope (double angles)        |err| <= 2^-8 |ref| + 1e-12 (|a| + |b|)
 *   gemm                        |err| <= 1e-5 sum|x w| (+ 2^-8 |ref| for bf16 out)
 *   attention                   |err| <= 2^-8 |ref| + 4e-5 max|v|
 *   meank mass                  |err| <= 1e-4 (scores sum to layers x KV heads)
 * Exact: embedding, conversions, the view scatter against kvmem_rope_bf16 at
 * the same positions, kv_pos NULL against the identity, the scorers against
 * the policies (meank, subblock, quest, refine's ws_token_mass, the
 * planner's top-k), bf16 index rows against their fp32 widening.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_bf16.h"
#include "kvmem/kvmem.h"
#include "kvmem/source.h"
#include "session/inspect.h"
#include "helpers/test_model.h"
#include "select/score.h"

static uint64_t g_seed;

static uint64_t rng_for(const char *name)
{
	return test_rng_named(g_seed, name);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	assert_non_null(p);
	return p;
}

static float *rand_f32(uint64_t *r, size_t n, double lo, double hi)
{
	float *p = xmalloc(sizeof(float) * n);

	for (size_t i = 0; i < n; i++)
		p[i] = (float)test_rng_range(r, lo, hi);
	return p;
}

static uint16_t *rand_bf16(uint64_t *r, size_t n, double lo, double hi)
{
	uint16_t *p = xmalloc(sizeof(uint16_t) * n);

	for (size_t i = 0; i < n; i++)
		p[i] = kvmem_f32_to_bf16((float)test_rng_range(r, lo, hi));
	return p;
}

static double bf(uint16_t h)
{
	return kvmem_bf16_to_f32(h);
}

/* ---- conversions, embedding ------------------------------------------- */

static void test_convert(void **state)
{
	uint64_t r = rng_for("convert");
	size_t n = 5000;
	float *f = rand_f32(&r, n, -70000, 70000);
	uint16_t *h = xmalloc(2 * n), *out = xmalloc(2 * n), *src = rand_bf16(&r, n, -3, 3);

	assert_int_equal(kvmem_convert_to_bf16(out, f, KVMEM_DTYPE_F32, n), 0);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(out[i], kvmem_f32_to_bf16(f[i]));
	for (size_t i = 0; i < n; i++)
		h[i] = kvmem_f32_to_f16(f[i] / 8);
	assert_int_equal(kvmem_convert_to_bf16(out, h, KVMEM_DTYPE_F16, n), 0);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(out[i], kvmem_f32_to_bf16(kvmem_f16_to_f32(h[i])));
	assert_int_equal(kvmem_convert_to_bf16(out, src, KVMEM_DTYPE_BF16, n), 0);
	assert_memory_equal(out, src, 2 * n);
	assert_int_equal(kvmem_convert_to_bf16(out, src, 99, n), -EINVAL);
	free(f);
	free(h);
	free(out);
	free(src);
}

/* The vectorised bulk rounding gives kvmem_f32_to_bf16's bits for every
 * kind of value: random bit patterns (NaNs of both signs and any payload,
 * infinities, subnormals, the rounding ties), at odd lengths and offsets. */
static void test_f32_to_bf16_n(void **state)
{
	uint64_t r = rng_for("f32_to_bf16_n");
	const uint32_t edge[] = { 0x7f800000u, 0xff800000u, 0x7f800001u, 0xffffffffu, 0x7fc00000u,
				  0x00000001u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x7f7fffffu };
	size_t n = 4099;
	float *f = xmalloc(4 * n);
	uint16_t *out = xmalloc(2 * n + 2);

	for (size_t i = 0; i < n; i++) {
		uint32_t u = i < sizeof(edge) / sizeof(edge[0]) ? edge[i] : (uint32_t)test_rng_next(&r);

		memcpy(&f[i], &u, 4);
	}
	for (size_t off = 0; off < 3; off++) {
		out[n - off] = 0xabcd;
		kvmem_f32_to_bf16_n(out, f + off, n - off);
		for (size_t i = 0; i < n - off; i++)
			assert_int_equal(out[i], kvmem_f32_to_bf16(f[off + i]));
		if (off)
			assert_int_equal(out[n - off], 0xabcd);	/* nothing past n */
	}
	free(f);
	free(out);
}

static void test_embedding(void **state)
{
	uint64_t r = rng_for("embedding");
	int vocab = 97, dim = test_rng_int(&r, 1, 300), n = test_rng_int(&r, 1, 40);
	uint16_t *table = rand_bf16(&r, (size_t)vocab * dim, -1, 1);
	float *out = rand_f32(&r, (size_t)n * dim, -5, 5);
	int32_t *ids = xmalloc(sizeof(int32_t) * n);

	for (int i = 0; i < n; i++)
		ids[i] = test_rng_int(&r, 0, vocab - 1);
	kvmem_embedding_bf16(out, table, ids, n, dim);
	for (int i = 0; i < n; i++)
		for (int d = 0; d < dim; d++)
			assert_true(out[(size_t)i * dim + d] == (float)bf(table[(size_t)ids[i] * dim + d]));
	free(table);
	free(out);
	free(ids);
}

/* ---- norms, swiglu -------------------------------------------------------- */

static void check_bf16_rel(const char *what, uint16_t got, double ref, size_t i)
{
	double tol = 0x1p-8 * fabs(ref) + 1e-30;

	if (!(fabs(bf(got) - ref) <= tol))
		fail_msg("%s [%zu]: %.9g vs %.9g", what, i, bf(got), ref);
}

static void test_rmsnorm(void **state)
{
	uint64_t r = rng_for("rmsnorm");
	static const int dims[] = { 1, 7, 128, 4096 };

	for (int c = 0; c < 4; c++) {
		int dim = dims[c], n = test_rng_int(&r, 1, 9);
		float *x = rand_f32(&r, (size_t)n * dim, -4, 4), eps = 1e-6f;
		uint16_t *w = rand_bf16(&r, dim, 0.5, 1.5), *out = rand_bf16(&r, (size_t)n * dim, -1, 1);

		kvmem_rmsnorm_bf16(out, x, w, n, dim, eps);
		for (int i = 0; i < n; i++) {
			double ss = 0;

			for (int d = 0; d < dim; d++)
				ss += (double)x[(size_t)i * dim + d] * x[(size_t)i * dim + d];
			for (int d = 0; d < dim; d++)
				check_bf16_rel("rmsnorm", out[(size_t)i * dim + d],
					       x[(size_t)i * dim + d] / sqrt(ss / dim + eps) * bf(w[d]),
					       (size_t)i * dim + d);
		}
		free(x);
		free(w);
		free(out);
	}
}

static void test_headnorm(void **state)
{
	uint64_t r = rng_for("headnorm");
	int hd = 128, rows = test_rng_int(&r, 1, 64);
	uint16_t *x = rand_bf16(&r, (size_t)rows * hd, -3, 3), *w = rand_bf16(&r, hd, 0.5, 1.5);
	uint16_t *y = xmalloc(2 * (size_t)rows * hd);

	memcpy(y, x, 2 * (size_t)rows * hd);
	kvmem_headnorm_bf16(y, w, rows, hd, 1e-6f);
	for (int i = 0; i < rows; i++) {
		double ss = 0;

		for (int d = 0; d < hd; d++)
			ss += bf(x[i * hd + d]) * bf(x[i * hd + d]);
		for (int d = 0; d < hd; d++)
			check_bf16_rel("headnorm", y[i * hd + d],
				       bf(x[i * hd + d]) / sqrt(ss / hd + 1e-6) * bf(w[d]), i * hd + d);
	}
	free(x);
	free(w);
	free(y);
}

static void test_swiglu(void **state)
{
	uint64_t r = rng_for("swiglu");
	int n = test_rng_int(&r, 1, 20), dim = test_rng_int(&r, 1, 500);

	for (int fused = 0; fused < 2; fused++) {
		int ld = fused ? 2 * dim : dim;
		uint16_t *gate = rand_bf16(&r, (size_t)n * ld, -8, 8);
		uint16_t *up = fused ? gate + dim : rand_bf16(&r, (size_t)n * dim, -3, 3);
		uint16_t *out = rand_bf16(&r, (size_t)n * dim, -1, 1);

		kvmem_swiglu_bf16(out, gate, up, n, dim, ld);
		for (int i = 0; i < n; i++)
			for (int j = 0; j < dim; j++) {
				double g = bf(gate[(size_t)i * ld + j]), u = bf(up[(size_t)i * ld + j]);

				check_bf16_rel("swiglu", out[(size_t)i * dim + j], g / (1 + exp(-g)) * u,
					       (size_t)i * dim + j);
			}
		free(gate);
		if (!fused)
			free(up);
		free(out);
	}
}

/* ---- gemm, logits -------------------------------------------------------- */

static void test_gemm(void **state)
{
	uint64_t r = rng_for("gemm");

	for (int mode = KVMEM_GEMM_BF16; mode <= KVMEM_GEMM_F32_ADD; mode++) {
		int n = test_rng_int(&r, 1, 33), in = test_rng_int(&r, 1, 300), out = test_rng_int(&r, 1, 200);
		uint16_t *x = rand_bf16(&r, (size_t)n * in, -2, 2), *w = rand_bf16(&r, (size_t)out * in, -1, 1);
		float *y0 = rand_f32(&r, (size_t)n * out, -3, 3), *yf = xmalloc(4 * (size_t)n * out);
		uint16_t *yb = xmalloc(2 * (size_t)n * out);
		void *y = mode == KVMEM_GEMM_BF16 ? (void *)yb : (void *)yf;

		memcpy(yf, y0, 4 * (size_t)n * out);
		assert_int_equal(kvmem_gemm_bf16(y, mode, x, w, n, in, out), 0);
		for (int i = 0; i < n; i++)
			for (int o = 0; o < out; o++) {
				double s = 0, a = 0;

				for (int k = 0; k < in; k++) {
					s += bf(x[i * in + k]) * bf(w[o * in + k]);
					a += fabs(bf(x[i * in + k]) * bf(w[o * in + k]));
				}
				size_t at = (size_t)i * out + o;
				double got, tol = 1e-5 * a + 1e-30;

				if (mode == KVMEM_GEMM_F32_ADD)
					s += y0[at], tol += 1e-7 * fabs(y0[at]);
				got = mode == KVMEM_GEMM_BF16 ? bf(yb[at]) : yf[at];
				if (mode == KVMEM_GEMM_BF16)
					tol += 0x1p-8 * fabs(s);
				if (!(fabs(got - s) <= tol))
					fail_msg("gemm mode %d %dx%d->%d [%zu]: %g vs %g", mode, n, in, out, at,
						 got, s);
			}
		free(x);
		free(w);
		free(y0);
		free(yf);
		free(yb);
	}
	assert_int_equal(kvmem_gemm_bf16(NULL, 7, NULL, NULL, 1, 1, 1), -EINVAL);
}

static void test_logits(void **state)
{
	uint64_t r = rng_for("logits");
	int n = 3, hidden = 64, vocab = 50;
	float *x = rand_f32(&r, (size_t)n * hidden, -2, 2), *lg = xmalloc(4 * n * vocab);
	uint16_t *nw = rand_bf16(&r, hidden, 0.5, 1.5), *lm = rand_bf16(&r, (size_t)vocab * hidden, -1, 1);
	uint16_t *tmp = xmalloc(2 * n * hidden), *h2 = xmalloc(2 * n * hidden);

	assert_int_equal(kvmem_logits_bf16(lg, x, nw, lm, tmp, n, hidden, vocab, 1e-6f), 0);
	kvmem_rmsnorm_bf16(h2, x, nw, n, hidden, 1e-6f);
	assert_memory_equal(tmp, h2, 2 * n * hidden);
	for (int i = 0; i < n; i++)
		for (int v = 0; v < vocab; v++) {
			double s = 0, a = 0;

			for (int k = 0; k < hidden; k++) {
				s += bf(h2[i * hidden + k]) * bf(lm[v * hidden + k]);
				a += fabs(bf(h2[i * hidden + k]) * bf(lm[v * hidden + k]));
			}
			assert_true(fabs(lg[i * vocab + v] - s) <= 1e-5 * a);
		}
	free(x);
	free(lg);
	free(nw);
	free(lm);
	free(tmp);
	free(h2);
}

/* ---- RoPE and the view scatter ------------------------------------------ */

static void test_rope(void **state)
{
	uint64_t r = rng_for("rope_bf16");
	static const int dims[] = { 2, 64, 128 };

	for (int c = 0; c < 3; c++) {
		int d = dims[c], half = d / 2, heads = test_rng_int(&r, 1, 6), n = test_rng_int(&r, 1, 30);
		double theta = c == 2 ? 1e6 : 1e4;
		size_t len = (size_t)n * heads * d;
		uint16_t *x = rand_bf16(&r, len, -2, 2), *y = xmalloc(2 * len);
		int32_t *pos = xmalloc(sizeof(int32_t) * n);

		for (int t = 0; t < n; t++)
			pos[t] = t == 0 ? 0 : test_rng_int(&r, 0, t % 2 ? 40000 : 3000000);
		memcpy(y, x, 2 * len);
		kvmem_rope_bf16(y, pos, n, heads, d, theta);
		for (int t = 0; t < n; t++)
			for (int h = 0; h < heads; h++)
				for (int i = 0; i < half; i++) {
					size_t o = ((size_t)t * heads + h) * d;
					long double a = bf(x[o + i]), b = bf(x[o + i + half]);
					long double ang = (long double)pos[t] * powl(theta, -2.0L * i / d);
					long double r0 = a * cosl(ang) - b * sinl(ang);
					long double r1 = b * cosl(ang) + a * sinl(ang);
					/* The kernel's angle is a double, pos times pow():
					 * off by a few of its ulps, |ang| 2^-52 each, which
					 * turns (a, b) by as much: a result that cancels
					 * near zero at a position of millions (seed
					 * 8189808343028573904: 1.257e-7 against 1.262e-7)
					 * is that far from the long double one. */
					double slack = (1e-12 + 4.0 * (double)fabsl(ang) * 0x1p-52) *
						       (double)(fabsl(a) + fabsl(b));

					if (!(fabs(bf(y[o + i]) - (double)r0) <= 0x1p-8 * fabs((double)r0) + slack) ||
					    !(fabs(bf(y[o + i + half]) - (double)r1) <=
					      0x1p-8 * fabs((double)r1) + slack))
						fail_msg("rope_bf16 d=%d pos=%d i=%d: %g %g vs %Lg %Lg", d, pos[t],
							 i, bf(y[o + i]), bf(y[o + i + half]), r0, r1);
				}
		/* Position 0 is the identity; one token alone gives the same bits. */
		assert_memory_equal(y, x, 2 * heads * d);
		if (n > 1) {
			uint16_t *one = xmalloc(2 * heads * d);

			memcpy(one, x + (size_t)(n - 1) * heads * d, 2 * heads * d);
			kvmem_rope_bf16(one, pos + n - 1, 1, heads, d, theta);
			assert_memory_equal(one, y + (size_t)(n - 1) * heads * d, 2 * heads * d);
			free(one);
		}
		free(x);
		free(y);
		free(pos);
	}
}

/* The angle table (the twin of kvmem_cuda_rope_angles): cos and sin of
 * pos * theta^(-2i/d) against long double, pos 0 exactly (1, 0). */
static void test_rope_angles(void **state)
{
	uint64_t r = rng_for("rope_angles");
	const int d = 128, half = d / 2, n = test_rng_int(&r, 2, 40);
	int32_t *pos = xmalloc(sizeof(int32_t) * n);
	double *ang = xmalloc(sizeof(double) * n * d);

	for (int t = 0; t < n; t++)
		pos[t] = t == 0 ? 0 : test_rng_int(&r, 1, 3000000);
	kvmem_rope_angles(ang, pos, n, d, 1e6);
	for (int t = 0; t < n; t++)
		for (int i = 0; i < half; i++) {
			long double a = (long double)pos[t] * powl(1e6L, -2.0L * i / d);
			double c = ang[2 * ((size_t)t * half + i)], s = ang[2 * ((size_t)t * half + i) + 1];
			/* the angle in double carries pos * 2^-52 of error */
			double tol = 4.0 * (pos[t] + 1) * 0x1p-52;

			if (!(fabs(c - (double)cosl(a)) <= tol) || !(fabs(s - (double)sinl(a)) <= tol))
				fail_msg("rope angles pos=%d i=%d: %.17g %.17g vs %.17Lg %.17Lg", pos[t], i,
					 c, s, cosl(a), sinl(a));
			if (t == 0)
				assert_true(c == 1.0 && s == 0.0);
		}
	free(pos);
	free(ang);
}

static void test_view_scatter(void **state)
{
	uint64_t r = rng_for("view_scatter");
	const int L = 3, H = 2, d = 64, cap = 200, B = 16;
	const double theta = 1e6;
	size_t vn = (size_t)L * H * cap * d;
	uint16_t *vk = xmalloc(2 * vn), *vv = xmalloc(2 * vn), *vk0, *vv0;
	/* Staging: two pages [H][B][d] then 10 new tokens [10][H][d]. */
	size_t sn = (size_t)2 * H * B * d + (size_t)10 * H * d;
	uint16_t *sk = rand_bf16(&r, sn, -2, 2), *sv = rand_bf16(&r, sn, -2, 2);
	kvmem_scatter_item it[4] = {
		{ .layer = 0, .slot = 5, .n = B, .tok_stride = d, .src = 0, .head_stride = B * d },
		{ .layer = 2, .slot = 150, .n = 7, .tok_stride = d, .src = (int64_t)H * B * d + 3 * d,
		  .head_stride = B * d },
		{ .layer = 1, .slot = 190, .n = 10, .tok_stride = H * d, .src = (int64_t)2 * H * B * d,
		  .head_stride = d },
		{ .layer = 1, .slot = 195, .n = 10, .tok_stride = d, .src = 0, .head_stride = B * d },
	};

	for (size_t i = 0; i < vn; i++)
		vk[i] = vv[i] = 0x7fc1;	/* NaN poison */
	vk0 = xmalloc(2 * vn);
	vv0 = xmalloc(2 * vn);
	memcpy(vk0, vk, 2 * vn);
	memcpy(vv0, vv, 2 * vn);
	/* The last item runs past the view: skipped, reported. */
	assert_int_equal(kvmem_view_scatter_bf16(vk, vv, sk, sv, it, 4, L, H, d, cap, theta), -EINVAL);
	for (int m = 0; m < 3; m++)
		for (int t = 0; t < it[m].n; t++) {
			uint16_t row[2 * 64];
			int32_t pos = it[m].slot + t;

			for (int h = 0; h < H; h++) {
				size_t s = (size_t)(it[m].src + (int64_t)t * it[m].tok_stride +
						    (int64_t)h * it[m].head_stride);
				size_t o = (((size_t)it[m].layer * H + h) * cap + pos) * d;

				/* K: exactly kvmem_rope_bf16 of the raw row at the slot. */
				memcpy(row, sk + s, 2 * d);
				kvmem_rope_bf16(row, &pos, 1, 1, d, theta);
				assert_memory_equal(vk + o, row, 2 * d);
				assert_memory_equal(vv + o, sv + s, 2 * d);
				memcpy(vk0 + o, row, 2 * d);
				memcpy(vv0 + o, sv + s, 2 * d);
			}
		}
	/* Nothing else was written (the skipped item included). */
	assert_memory_equal(vk, vk0, 2 * vn);
	assert_memory_equal(vv, vv0, 2 * vn);
	free(vk);
	free(vv);
	free(vk0);
	free(vv0);
	free(sk);
	free(sv);
}

/* ---- attention ---------------------------------------------------------- */

static void test_attention(void **state)
{
	uint64_t r = rng_for("attention_bf16");
	static const int geo[][3] = { { 4, 4, 16 }, { 8, 2, 64 }, { 32, 8, 128 }, { 6, 1, 10 } };

	for (int c = 0; c < 4; c++) {
		int heads = geo[c][0], kvh = geo[c][1], d = geo[c][2], grp = heads / kvh;
		int n_q = test_rng_int(&r, 1, 12), n_kv = test_rng_int(&r, 1, 260);
		size_t stride = n_kv + test_rng_int(&r, 0, 30), qn = (size_t)n_q * heads * d;
		size_t kn = (size_t)kvh * stride * d;
		uint16_t *q = rand_bf16(&r, qn, -1, 1), *k = rand_bf16(&r, kn, -1, 1);
		uint16_t *v = rand_bf16(&r, kn, -1, 1), *out = rand_bf16(&r, qn, -1, 1);
		uint16_t *out2 = xmalloc(2 * qn);
		int32_t *qp = xmalloc(4 * n_q), *kp = xmalloc(4 * n_kv);
		float scale = 1.0f / sqrtf((float)d);

		/* Rows past n_kv hold NaN: never read. */
		for (int g = 0; g < kvh; g++)
			for (size_t j = n_kv; j < stride; j++)
				for (int e = 0; e < d; e++)
					k[((size_t)g * stride + j) * d + e] = v[((size_t)g * stride + j) * d + e] = 0x7fc1;
		for (int i = 0; i < n_q; i++)
			qp[i] = test_rng_int(&r, -1, n_kv + 3);	/* -1: sees nothing */
		for (int j = 0; j < n_kv; j++)
			kp[j] = j;
		assert_int_equal(kvmem_attention_bf16(out, q, qp, n_q, k, v, NULL, n_kv, stride, heads, kvh,
						      d, scale), 0);
		assert_int_equal(kvmem_attention_bf16(out2, q, qp, n_q, k, v, kp, n_kv, stride, heads, kvh,
						      d, scale), 0);
		assert_memory_equal(out, out2, 2 * qn);
		for (int i = 0; i < n_q; i++)
			for (int h = 0; h < heads; h++) {
				const int g = h / grp;
				double *s = xmalloc(sizeof(double) * n_kv), mx = -INFINITY, sum = 0;

				for (int j = 0; j < n_kv; j++) {
					double dot = 0;

					for (int e = 0; e < d; e++)
						dot += bf(q[((size_t)i * heads + h) * d + e]) *
						       bf(k[((size_t)g * stride + j) * d + e]);
					s[j] = j <= qp[i] ? dot * scale : -INFINITY;
					mx = s[j] > mx ? s[j] : mx;
				}
				for (int j = 0; j < n_kv; j++)
					sum += s[j] == -INFINITY ? 0 : exp(s[j] - mx);
				for (int e = 0; e < d; e++) {
					double ref = 0;
					size_t at = ((size_t)i * heads + h) * d + e;

					for (int j = 0; j < n_kv && sum > 0; j++)
						if (s[j] != -INFINITY)
							ref += exp(s[j] - mx) / sum * bf(v[((size_t)g * stride + j) * d + e]);
					if (!(fabs(bf(out[at]) - ref) <= 0x1p-8 * fabs(ref) + 4e-5))
						fail_msg("attention %d/%d d=%d n_kv=%d q%d h%d [%d]: %g vs %g", heads,
							 kvh, d, n_kv, i, h, e, bf(out[at]), ref);
				}
				free(s);
			}
		free(q);
		free(k);
		free(v);
		free(out);
		free(out2);
		free(qp);
		free(kp);
	}
}

static void test_sample_token(void **state)
{
	uint64_t r = rng_for("sample_token");
	int vocab = 1000;
	float *lg = rand_f32(&r, vocab, -5, 5);
	kvmem_sampler s = { .temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .seed = 7 };
	uint64_t a = kvmem_rng_seed(s.seed), b = a;
	int32_t tok = -5;

	for (int i = 0; i < 20; i++) {
		assert_int_equal(kvmem_sample_token(&tok, lg, vocab, &s, &a), 0);
		assert_int_equal(tok, kvmem_sample(lg, vocab, &s, &b));
		assert_true(a == b);
	}
	assert_int_equal(kvmem_sample_token(&tok, lg, 0, &s, &a), -EINVAL);
	free(lg);
}

/* ---- scorers against the workspace policies ------------------------------- */

struct ws_fixture {
	kvmem_index ix;
	kvmem_page_source src;
	kvmem_select_ctx c;
	float *q, *raw_k;
	int64_t q_pos[3];
	kvmem_score_geom g;
};

static void ws_make(struct ws_fixture *f, uint64_t *r, int L, int heads, int kvh, int d, int B,
		    int n_tokens, int n_q)
{
	float *v;

	memset(f, 0, sizeof(*f));
	assert_int_equal(kvmem_index_init(&f->ix, L, kvh, d, B,
					  KVMEM_SUM_MINMAX | KVMEM_SUM_SUBBLOCK), 0);
	assert_int_equal(kvmem_page_source_mem(&f->src, L, kvh, d, B), 0);
	f->raw_k = rand_f32(r, (size_t)L * n_tokens * kvh * d, -2, 2);
	v = rand_f32(r, (size_t)n_tokens * kvh * d, -1, 1);
	/* Give a few blocks a direction the queries share, so scores differ. */
	for (int l = 0; l < L; l++)
		for (int t = 0; t < n_tokens; t += 7)
			for (int e = 0; e < kvh * d; e++)
				f->raw_k[((size_t)l * n_tokens + t) * kvh * d + e] += e % d < 8 ? 3.0f : 0.0f;
	assert_int_equal(kvmem_index_append(&f->ix, f->raw_k, n_tokens), 0);
	for (int l = 0; l < L; l++)
		for (int b0 = 0; b0 < n_tokens; b0 += B) {
			int n = n_tokens - b0 < B ? n_tokens - b0 : B;

			assert_int_equal(f->src.ops->write(f->src.ctx, b0 / B, l, 0, n,
							   f->raw_k + ((size_t)l * n_tokens + b0) * kvh * d,
							   v + (size_t)b0 * kvh * d), 0);
		}
	free(v);
	f->q = rand_f32(r, (size_t)L * n_q * heads * d, -1, 1);
	for (size_t i = 0; i < (size_t)L * n_q * heads * d; i++)
		if (i % d < 8)
			f->q[i] += 1.0f;
	for (int t = 0; t < n_q; t++)
		f->q_pos[t] = n_tokens - n_q + t;
	f->c = (kvmem_select_ctx){
		.index = &f->ix, .keys = &f->src, .n_tokens = n_tokens, .n_blocks = f->ix.n_blocks,
		.block = B, .n_layers = L, .n_heads = heads, .n_kv_heads = kvh, .head_dim = d,
		.rope_theta = 1e6, .n_q = n_q, .q = f->q, .q_pos = f->q_pos, .span = 4096,
		.budget = 4 * B,
	};
	f->g = (kvmem_score_geom){
		.n_layers = L, .n_heads = heads, .n_kv_heads = kvh, .head_dim = d, .block = B,
		.n_blocks = f->ix.n_blocks, .cap_blocks = f->ix.cap_blocks,
		.last_len = kvmem_index_block_len(&f->ix, f->ix.n_blocks - 1),
		.index_dtype = KVMEM_DTYPE_F32,
	};
	for (int s = 0; s < 4; s++)
		f->g.last_sub[s] = kvmem_index_sub_len(&f->ix, f->ix.n_blocks - 1, s);
}

static void ws_free(struct ws_fixture *f)
{
	kvmem_index_free(&f->ix);
	kvmem_page_source_destroy(&f->src);
	free(f->q);
	free(f->raw_k);
}

/* A bf16 copy of an index array, and its exact fp32 widening. */
static uint16_t *to_bf16(const float *x, size_t n, float *widened)
{
	uint16_t *h = xmalloc(2 * n);

	for (size_t i = 0; i < n; i++) {
		h[i] = kvmem_f32_to_bf16(x[i]);
		widened[i] = kvmem_bf16_to_f32(h[i]);
	}
	return h;
}

static void test_score_policies(void **state)
{
	uint64_t r = rng_for("score_policies");
	static const int geo[][6] = {	/* L, heads, kv heads, d, block, tokens */
		{ 2, 8, 2, 64, 32, 32 * 37 + 13 }, { 3, 4, 4, 16, 16, 16 * 300 + 4 },
		{ 1, 32, 8, 128, 32, 32 * 150 },
	};

	for (int c = 0; c < 3; c++) {
		struct ws_fixture f;
		int n_q = c == 1 ? 1 : 3;

		ws_make(&f, &r, geo[c][0], geo[c][1], geo[c][2], geo[c][3], geo[c][4], geo[c][5], n_q);
		const int64_t nb = f.c.n_blocks, L = f.c.n_layers;
		const int d = f.c.head_dim, pairs = f.c.n_layers * f.c.n_kv_heads;
		float *a = xmalloc(4 * L * nb), *b = xmalloc(4 * L * nb);
		float *gq = xmalloc(4 * (size_t)pairs * d);
		size_t rows = (size_t)pairs * f.ix.cap_blocks * d;

		kvmem_group_queries(gq, f.q, f.c.n_layers, n_q, f.c.n_heads, f.c.n_kv_heads, d,
				    f.c.rope_theta, f.c.span);
		/* meank: the policy passes the index and its geometry to the twin
		 * (the workspace policies call these scorers), then the twin
		 * against a naive double mass */
		assert_int_equal(kvmem_policy_find("meank")->score(&f.c, a), 0);
		assert_int_equal(kvmem_score_meank(b, f.ix.meank, gq, &f.g), 0);
		assert_memory_equal(a, b, 4 * nb);
		/* ... against a naive double mass */
		{
			double *ref = calloc(nb, sizeof(double)), *z = xmalloc(8 * nb), tot = 0;

			for (int p = 0; p < pairs; p++) {
				double mx = -INFINITY, sum = 0;

				for (int64_t k = 0; k < nb; k++) {
					const float *mu = kvmem_index_meank(&f.ix, p / f.c.n_kv_heads,
									    p % f.c.n_kv_heads, k);
					double dot = 0;

					for (int e = 0; e < d; e++)
						dot += (double)gq[(size_t)p * d + e] * mu[e];
					z[k] = dot / sqrt(d) + log(kvmem_index_block_len(&f.ix, k));
					mx = z[k] > mx ? z[k] : mx;
				}
				for (int64_t k = 0; k < nb; k++)
					sum += exp(z[k] - mx);
				for (int64_t k = 0; k < nb; k++)
					ref[k] += exp(z[k] - mx) / sum;
			}
			for (int64_t k = 0; k < nb; k++) {
				tot += b[k];
				if (!(fabs(b[k] - ref[k]) <= 1e-4))
					fail_msg("meank block %lld: %g vs %g", (long long)k, b[k], ref[k]);
			}
			assert_true(fabs(tot - pairs) < 1e-3 * pairs);
			free(ref);
			free(z);
		}
		/* bf16 index rows: the same as their fp32 widening */
		{
			float *wide = xmalloc(4 * rows);
			uint16_t *h = to_bf16(f.ix.meank, rows, wide);
			kvmem_score_geom g2 = f.g;

			g2.index_dtype = KVMEM_DTYPE_BF16;
			assert_int_equal(kvmem_score_meank(a, h, gq, &g2), 0);
			assert_int_equal(kvmem_score_meank(b, wide, gq, &f.g), 0);
			assert_memory_equal(a, b, 4 * nb);
			free(wide);
			free(h);
		}
		/* subblock */
		assert_int_equal(kvmem_policy_find("subblock")->score(&f.c, a), 0);
		assert_int_equal(kvmem_score_subblock(b, f.ix.sub, gq, &f.g), 0);
		assert_memory_equal(a, b, 4 * nb);
		/* quest */
		assert_int_equal(kvmem_policy_find("quest")->score(&f.c, a), 0);
		assert_int_equal(kvmem_score_quest(b, f.ix.kmin, f.ix.kmax, f.q, n_q, &f.g), 0);
		assert_memory_equal(a, b, 4 * L * nb);
		free(a);
		free(b);
		free(gq);
		ws_free(&f);
	}
}

static void test_token_mass(void **state)
{
	uint64_t r = rng_for("token_mass");
	struct ws_fixture f;
	const int n_q = 2;

	ws_make(&f, &r, 2, 8, 2, 64, 32, 32 * 40 + 9, n_q);
	const int B = f.c.block, d = f.c.head_dim, H = f.c.n_kv_heads;
	const int64_t nb = f.c.n_blocks;
	int64_t n = 0, *blocks = xmalloc(8 * nb);
	double *ma = calloc(nb, sizeof(double)), *mb = calloc(nb, sizeof(double));
	float *keys, *hq = xmalloc(4 * (size_t)f.c.n_heads * n_q * d);
	int32_t *len;

	/* Every third block, and the newest (partial, and past the first query). */
	for (int64_t b = 0; b < nb; b++)
		if (b % 3 == 0 || b == nb - 1)
			blocks[n++] = b;
	keys = xmalloc(4 * (size_t)H * n * B * d);
	len = xmalloc(4 * n);
	assert_int_equal(ws_token_mass(&f.c, blocks, n, ma), 0);
	for (int l = 0; l < f.c.n_layers; l++) {
		for (int64_t i = 0; i < n; i++) {
			len[i] = kvmem_index_block_len(&f.ix, blocks[i]);
			for (int h = 0; h < H; h++)
				for (int j = 0; j < B; j++)
					for (int e = 0; e < d; e++)
						keys[(((size_t)h * n + i) * B + j) * d + e] =
							j < len[i] ? f.raw_k[(((size_t)l * f.c.n_tokens +
									       blocks[i] * B + j) * H + h) * d + e]
								   : NAN;	/* never used */
		}
		kvmem_head_queries(hq, f.q, l, n_q, f.c.n_heads, d, f.c.rope_theta, f.c.span);
		assert_int_equal(kvmem_token_mass(mb, keys, len, blocks, n, hq, f.q_pos, n_q, &f.g), 0);
	}
	assert_memory_equal(ma, mb, 8 * n);
	/* Shares of each (layer, head, token) add to 1. */
	{
		double tot = 0;

		for (int64_t i = 0; i < n; i++)
			tot += mb[i];
		assert_true(fabs(tot - (double)f.c.n_layers * f.c.n_heads * n_q) < 1e-9 * tot);
	}
	free(blocks);
	free(ma);
	free(mb);
	free(keys);
	free(hq);
	free(len);
	ws_free(&f);
}

static int cmp64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

/* The planner's order by brute force: a full sort, best first (higher
 * score, NaN lowest, ties to the later block). */
static const float *g_sc;

static int by_rank(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	float u = isnan(g_sc[x]) ? -INFINITY : g_sc[x], v = isnan(g_sc[y]) ? -INFINITY : g_sc[y];

	if (u != v)
		return u > v ? -1 : 1;
	return (x < y) - (x > y);
}

static void test_top_k(void **state)
{
	uint64_t r = rng_for("top_k_blocks");

	for (int c = 0; c < 40; c++) {
		int64_t n = test_rng_int(&r, 1, 3000), k = test_rng_int(&r, 0, (int)n + 3);
		float *sc = xmalloc(4 * n);
		int64_t *idx = xmalloc(8 * n), *out = xmalloc(8 * n), *ref = xmalloc(8 * n);
		int64_t want = k < n ? k : n, m = 0;

		/* Few distinct values: many ties; some NaN, -inf, -0 and +0. */
		for (int64_t i = 0; i < n; i++) {
			int u = test_rng_int(&r, 0, 9);

			sc[i] = u == 0 ? NAN : u == 1 ? -INFINITY : u == 2 ? -0.0f : u == 3 ? 0.0f
				: (float)test_rng_int(&r, -3, 3);
			ref[i] = i;
		}
		g_sc = sc;
		qsort(ref, n, 8, by_rank);
		assert_int_equal(kvmem_top_k_blocks(out, sc, n, k), k > 0 ? want : 0);
		if (k > 0) {
			memcpy(idx, ref, 8 * want);
			qsort(idx, want, 8, cmp64);
			assert_memory_equal(out, idx, 8 * want);
		}
		/* In place over a shuffled subset: its k best first. */
		for (int64_t i = 0; i < n; i++)
			if (test_rng_int(&r, 0, 2))
				idx[m++] = i;
		for (int64_t i = m - 1; i > 0; i--) {
			int64_t j = test_rng_int(&r, 0, (int)i), t = idx[i];

			idx[i] = idx[j], idx[j] = t;
		}
		memcpy(ref, idx, 8 * m);
		qsort(ref, m, 8, by_rank);
		k = k < m ? k : m;
		kvmem_top_k_select(idx, m, k, sc);
		qsort(idx, k, 8, cmp64);
		qsort(ref, k, 8, cmp64);
		assert_memory_equal(idx, ref, 8 * k);
		free(sc);
		free(idx);
		free(out);
		free(ref);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_convert),
		cmocka_unit_test(test_f32_to_bf16_n),
		cmocka_unit_test(test_embedding),
		cmocka_unit_test(test_rmsnorm),
		cmocka_unit_test(test_headnorm),
		cmocka_unit_test(test_swiglu),
		cmocka_unit_test(test_gemm),
		cmocka_unit_test(test_logits),
		cmocka_unit_test(test_rope),
		cmocka_unit_test(test_rope_angles),
		cmocka_unit_test(test_view_scatter),
		cmocka_unit_test(test_attention),
		cmocka_unit_test(test_sample_token),
		cmocka_unit_test(test_score_policies),
		cmocka_unit_test(test_token_mass),
		cmocka_unit_test(test_top_k),
	};

	g_seed = test_rng_fresh_seed("test_kernels_bf16");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

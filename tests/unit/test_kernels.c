// SPDX-License-Identifier: MIT
/*
 * Every CPU kernel against a naive double-precision reference on fresh
 * random inputs (the seed is printed; KVMEM_TEST_SEED replays it).
 *
 * Tolerances (fp32 kernels vs double references):
 *   matmul     |err| <= 1e-5 * sum_k |x_k w_k| + 1e-30
 *   rmsnorm    |err| <= 2e-6 * |ref| + 1e-7
 *   swiglu     |err| <= 4e-6 * |ref| + 1e-7
 *   rope       |err| <= 2e-6 * (|a| + |b|) per pair element
 *   attention  |err| <= 2e-5 * max|v|
 *   meank      |err| <= 1e-5 * sum |k|
 * Exact (bitwise): embedding, add, conversions of representable values,
 * RoPE of the same values at the same position in any batch, attention
 * independent of thread count, kv_stride and its batch, and attention
 * against its own arithmetic spelled out in fp32.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_bf16.h"	/* kvmem_rope_angles */
#include "kernels/cpu/bits.h"
#include "helpers/test_model.h"
#include "helpers/test_sample_ref.h"

static uint64_t g_seed;

static uint64_t rng_for(const char *name)
{
	return test_rng_named(g_seed, name);
}


/* ---- number formats --------------------------------------------------- */

/* The nearest bf16 by brute force: the two neighbours by truncation. */
static uint16_t ref_bf16(float f)
{
	uint32_t u = f32_bits(f);
	uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
	double dl = fabs((double)f - kvmem_bf16_to_f32(lo));
	double dh = fabs((double)f - (double)kvmem_bf16_to_f32(hi));

	if ((hi & 0x7fff) == 0x7f80)	/* the next one out is inf: judge by the halfway point */
		dh = fabs(fabs((double)f) - (fabs((double)kvmem_bf16_to_f32(lo)) + 0x1p+120));
	if (dl < dh)
		return lo;
	if (dh < dl)
		return hi;
	return (lo & 1) ? hi : lo;
}

static void test_bf16(void **state)
{
	uint64_t r = rng_for("bf16");

	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = kvmem_bf16_to_f32((uint16_t)h);

		if (isnan(f)) {
			assert_true(isnan(kvmem_bf16_to_f32(kvmem_f32_to_bf16(f))));
			continue;
		}
		assert_int_equal(kvmem_f32_to_bf16(f), h);
	}
	/* Ties go to even. */
	assert_int_equal(kvmem_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
	assert_int_equal(kvmem_f32_to_bf16(1.0f + 0x1p-7f + 0x1p-8f), 0x3f82);
	assert_int_equal(kvmem_f32_to_bf16(-1.0f - 0x1p-8f), 0xbf80);
	assert_int_equal(kvmem_f32_to_bf16(INFINITY), 0x7f80);
	assert_int_equal(kvmem_f32_to_bf16(3.4028235e38f), 0x7f80);	/* FLT_MAX rounds up */
	assert_true(isnan(kvmem_bf16_to_f32(kvmem_f32_to_bf16(bits_f32(0x7f800001u)))));
	for (int i = 0; i < 200000; i++) {
		uint32_t u = (uint32_t)(test_rng_uniform(&r) * 4294967296.0);
		float f = bits_f32(u);

		if (isnan(f) || isinf(f))
			continue;
		assert_int_equal(kvmem_f32_to_bf16(f), ref_bf16(f));
	}
	uint16_t src[5] = { 0x3f80, 0xc000, 0x0000, 0x8000, 0x4049 };
	float dst[5];

	kvmem_bf16_to_f32_n(dst, src, 5);
	for (int i = 0; i < 5; i++)
		assert_int_equal(f32_bits(dst[i]), f32_bits(kvmem_bf16_to_f32(src[i])));
}

/* The nearest fp16 by search over the (monotone) positive finite codes. */
static uint16_t ref_f16(float f)
{
	double a = fabs((double)f);
	uint16_t sign = signbit(f) ? 0x8000 : 0;
	int lo = 0, hi = 0x7bff;

	if (a >= 65520.0)
		return sign | 0x7c00;
	while (lo < hi) {		/* largest code with value <= a */
		int mid = (lo + hi + 1) / 2;

		if ((double)kvmem_f16_to_f32((uint16_t)mid) <= a)
			lo = mid;
		else
			hi = mid - 1;
	}
	if (lo == 0x7bff)
		return sign | 0x7bff;
	double dl = a - kvmem_f16_to_f32((uint16_t)lo);
	double dh = (double)kvmem_f16_to_f32((uint16_t)(lo + 1)) - a;

	if (dl < dh || (dl == dh && !(lo & 1)))
		return sign | (uint16_t)lo;
	return sign | (uint16_t)(lo + 1);
}

static void test_f16(void **state)
{
	uint64_t r = rng_for("f16");

	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = kvmem_f16_to_f32((uint16_t)h);

		if (isnan(f)) {
			assert_true(isnan(kvmem_f16_to_f32(kvmem_f32_to_f16(f))));
			continue;
		}
		assert_int_equal(kvmem_f32_to_f16(f), h);
	}
	/* Known values and rounding cases. */
	assert_true(kvmem_f16_to_f32(0x3c00) == 1.0f);
	assert_true(kvmem_f16_to_f32(0x0001) == 0x1p-24f);
	assert_true(kvmem_f16_to_f32(0x7bff) == 65504.0f);
	assert_int_equal(kvmem_f32_to_f16(65519.99f), 0x7bff);
	assert_int_equal(kvmem_f32_to_f16(65520.0f), 0x7c00);
	assert_int_equal(kvmem_f32_to_f16(-1e30f), 0xfc00);
	assert_int_equal(kvmem_f32_to_f16(0x1p-25f), 0x0000);		/* tie to even 0 */
	assert_int_equal(kvmem_f32_to_f16(0x1.8p-25f), 0x0001);
	assert_int_equal(kvmem_f32_to_f16(0x1.8p-24f), 0x0002);		/* tie to even 2 */
	assert_int_equal(kvmem_f32_to_f16(0x1p-14f), 0x0400);
	/* A subnormal tie rounds up to the smallest normal. */
	assert_int_equal(kvmem_f32_to_f16(0x1.ffcp-15f), 0x0400);
	assert_int_equal(kvmem_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
	assert_int_equal(kvmem_f32_to_f16(1.0f + 0x1.8p-10f), 0x3c02);
	assert_true(isnan(kvmem_f16_to_f32(kvmem_f32_to_f16(NAN))));
	for (int i = 0; i < 100000; i++) {
		/* Spread over the fp16 range and a bit past it. */
		double mag = pow(2.0, test_rng_range(&r, -27.0, 17.0));
		float f = (float)(test_rng_uniform(&r) < 0.5 ? -mag : mag);

		assert_int_equal(kvmem_f32_to_f16(f), ref_f16(f));
	}
	uint16_t src[4] = { 0x3c00, 0xc000, 0x0001, 0x7c00 };
	float dst[4];

	kvmem_f16_to_f32_n(dst, src, 4);
	for (int i = 0; i < 4; i++)
		assert_int_equal(f32_bits(dst[i]), f32_bits(kvmem_f16_to_f32(src[i])));
}

/* ---- dense ------------------------------------------------------------ */

static void test_matmul(void **state)
{
	uint64_t r = rng_for("matmul");
	static const int ns[] = { 1, 2, 7, 33 };

	for (int c = 0; c < 4; c++) {
		int n = ns[c], in = test_rng_int(&r, 1, 300), out = test_rng_int(&r, 1, 200);
		float *x = test_rand_floats(&r, (size_t)n * in, -2, 2);
		float *w = test_rand_floats(&r, (size_t)out * in, -1, 1);
		float *y = test_rand_floats(&r, (size_t)n * out, -9, 9);	/* overwritten */

		kvmem_matmul(y, x, w, n, in, out);
		for (int i = 0; i < n; i++)
			for (int o = 0; o < out; o++) {
				double ref = 0, mag = 0;

				for (int k = 0; k < in; k++) {
					double t = (double)x[i * in + k] * w[(size_t)o * in + k];

					ref += t;
					mag += fabs(t);
				}
				double err = fabs(y[(size_t)i * out + o] - ref);

				if (err > 1e-5 * mag + 1e-30)
					fail_msg("matmul n=%d in=%d out=%d [%d][%d]: %g vs %g", n, in,
						 out, i, o, y[(size_t)i * out + o], ref);
			}
		free(x);
		free(w);
		free(y);
	}
}

/* kvmem_matmul_bf16w: kvmem_matmul's bits over the widened weights, at each
 * instruction set the CPU has, at row counts on one thread, the pool and
 * OpenMP, and sizes with tails of 16 and 8. */
static void test_matmul_bf16w(void **state)
{
	uint64_t r = rng_for("matmul-bf16w");
	static const char *const isas[] = { "avx512", "avx2", "c" };
	static const int ns[] = { 1, 2, 3, 8, 33, 70 };
	const char *best = kvmem_matmul_isa();

	(void)state;
	for (int c = 0; c < 6; c++) {
		int n = ns[c], in = test_rng_int(&r, 1, 700), out = test_rng_int(&r, 1, 900);
		float *x = test_rand_floats(&r, (size_t)n * in, -2, 2);
		float *w = malloc(sizeof(float) * (size_t)out * in);
		uint16_t *w16 = malloc(sizeof(uint16_t) * (size_t)out * in);
		float *y = malloc(sizeof(float) * (size_t)n * out), *z = malloc(sizeof(float) * n * out);

		assert_true(w && w16 && y && z);
		for (size_t i = 0; i < (size_t)out * in; i++) {
			w16[i] = kvmem_f32_to_bf16((float)test_rng_range(&r, -1, 1));
			w[i] = kvmem_bf16_to_f32(w16[i]);
		}
		for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
			if (kvmem_matmul_use(isas[i]))
				continue;
			kvmem_matmul(y, x, w, n, in, out);
			kvmem_matmul_bf16w(z, x, w16, n, in, out);
			if (memcmp(y, z, sizeof(float) * n * out))
				fail_msg("matmul %s n=%d in=%d out=%d: bf16 weights give other bits",
					 isas[i], n, in, out);
		}
		assert_int_equal(kvmem_matmul_use(best), 0);
		free(x);
		free(w);
		free(w16);
		free(y);
		free(z);
	}
}

static void test_embedding_add(void **state)
{
	uint64_t r = rng_for("embedding");
	int vocab = test_rng_int(&r, 5, 100), dim = test_rng_int(&r, 1, 64), n = 17;
	float *table = test_rand_floats(&r, (size_t)vocab * dim, -1, 1);
	float *out = test_rand_floats(&r, (size_t)n * dim, -1, 1);
	int32_t ids[17];

	for (int i = 0; i < n; i++)
		ids[i] = test_rng_int(&r, 0, vocab - 1);
	ids[0] = vocab - 1;
	kvmem_embedding(out, table, ids, n, dim);
	for (int i = 0; i < n; i++)
		assert_memory_equal(out + i * dim, table + (size_t)ids[i] * dim,
				    sizeof(float) * dim);

	float *a = test_rand_floats(&r, 1000, -5, 5), *b = test_rand_floats(&r, 1000, -5, 5);
	float *a0 = malloc(sizeof(float) * 1000);

	memcpy(a0, a, sizeof(float) * 1000);
	kvmem_add(a, b, 1000);
	for (int i = 0; i < 1000; i++)
		assert_true(a[i] == a0[i] + b[i]);
	free(table);
	free(out);
	free(a);
	free(b);
	free(a0);
}

static void test_rmsnorm(void **state)
{
	uint64_t r = rng_for("rmsnorm");

	for (int c = 0; c < 24; c++) {
		int n = test_rng_int(&r, 1, 40), dim = test_rng_int(&r, 1, 500);
		float eps = c % 2 ? 1e-6f : 1e-5f;
		float *x = test_rand_floats(&r, (size_t)n * dim, -3, 3);
		float *w = test_rand_floats(&r, dim, 0.2, 2);
		float *y = test_rand_floats(&r, (size_t)n * dim, -1, 1);

		kvmem_rmsnorm(y, x, w, n, dim, eps);
		for (int i = 0; i < n; i++) {
			double ss = 0;

			for (int d = 0; d < dim; d++)
				ss += (double)x[i * dim + d] * x[i * dim + d];
			double inv = 1.0 / sqrt(ss / dim + eps);

			for (int d = 0; d < dim; d++) {
				double ref = x[i * dim + d] * inv * w[d];

				if (fabs(y[i * dim + d] - ref) > 2e-6 * fabs(ref) + 1e-7)
					fail_msg("rmsnorm [%d][%d]: %g vs %g", i, d, y[i * dim + d],
						 ref);
			}
		}
		/* A row alone has the bits it has among others (rows are
		 * summed 8 side by side, the rest one by one). */
		for (int i = 0; i < n; i++) {
			float z[500];

			kvmem_rmsnorm(z, x + (size_t)i * dim, w, 1, dim, eps);
			assert_memory_equal(z, y + (size_t)i * dim, sizeof(float) * dim);
		}
		/* In place gives the same bits. */
		kvmem_rmsnorm(x, x, w, n, dim, eps);
		assert_memory_equal(x, y, sizeof(float) * n * dim);
		free(x);
		free(w);
		free(y);
	}
}

/* Back to the widest e^x the CPU has. */
static void vexp_best(void)
{
	if (kvmem_vexp_use(16) && kvmem_vexp_use(8))
		assert_int_equal(kvmem_vexp_use(1), 0);
}

/* e^x at each width the CPU has, against the scalar reference bit for bit
 * and against exp in double within 2 ulp on [-87, 88]; the ends, the
 * clamped range past them, zeros, infinities and a NaN. */
static void test_expf_widths(void **state)
{
	uint64_t r = rng_for("expf");
	enum { N = 4096 };
	static float x[N];
	static const float special[] = { 0.0f, -0.0f, 87.0f, 88.0f, -87.0f, 88.5f, -87.5f,
					 1e-30f, -1e-30f, 0.34657359f, -0.34657359f };

	(void)state;
	for (int i = 0; i < N; i++)
		x[i] = (float)test_rng_range(&r, -120, 120);
	memcpy(x, special, sizeof(special));
	x[20] = INFINITY;
	x[21] = -INFINITY;
	x[22] = NAN;
	assert_true(isnan(kvmem_expf(NAN)));
	for (int i = 0; i < N; i++) {
		float e = kvmem_expf(x[i]);
		double want = exp((double)fminf(fmaxf(x[i], -87.0f), 88.0f));

		if (fabs(e - want) > 2 * (nextafterf((float)want, INFINITY) - (float)want))
			fail_msg("kvmem_expf(%a) = %a, e^x = %a", x[i], e, want);
	}
	if (kvmem_vexp_use(3) != -EINVAL)
		fail_msg("kvmem_vexp_use(3) did not say -EINVAL");
	for (int w = 16; w >= 1; w /= 2) {
		static float g[N], u[N], o[N];

		if (w == 4 || w == 2 || kvmem_vexp_use(w))
			continue;
		/* silu(g) * 1 = g / (1 + e^-g): e^-g's bits show through */
		for (int i = 0; i < N; i++) {
			g[i] = -x[i];
			u[i] = 1.0f;
		}
		/* A NaN score makes attention's output NaN: it is not clamped away. */
		{
			float q[2 * 16], k[16 * 16], v[16 * 16], out[2 * 16];
			int32_t qp = 15, kp[16];

			for (int j = 0; j < 16 * 16; j++) {
				k[j] = (float)test_rng_range(&r, -1, 1);
				v[j] = (float)test_rng_range(&r, -1, 1);
			}
			for (int j = 0; j < 2 * 16; j++)
				q[j] = (float)test_rng_range(&r, -1, 1);
			for (int j = 0; j < 16; j++)
				kp[j] = j;
			k[5 * 16 + 3] = NAN;
			kvmem_attention(out, q, &qp, 1, k, v, kp, 16, 16, 2, 1, 16, 0.25f);
			for (int j = 0; j < 2 * 16; j++)
				if (!isnan(out[j]))
					fail_msg("width %d: a NaN key gave output %d = %g", w, j, out[j]);
		}
		kvmem_swiglu(o, g, u, N);
		for (int i = 0; i < N; i++) {
			float want = g[i] / (1.0f + kvmem_expf(x[i]));

			if (memcmp(&o[i], &want, sizeof(float)) && !(isnan(o[i]) && isnan(want)))
				fail_msg("width %d: silu(%a) = %a, from kvmem_expf %a", w, g[i],
					 o[i], want);
		}
	}
	vexp_best();
}

/* A draw's weights (kvmem_sample_weight) at each width the CPU has against
 * the scalar reference bit for bit, and against libm's exp within 2 ulp
 * (normal results) or two of the least subnormal; 0 below -745.2, for
 * -inf and NaN; 1 at 0 and -0. */
static void test_sample_weight(void **state)
{
	uint64_t r = rng_for("sample-weight");
	enum { N = 4099 };
	static double x[N], y[N];
	static const double special[] = { 0.0, -0.0, -1e-300, -0.34657359027997264,
					  -0.34657359027997270, -708.0, -708.5, -744.0, -745.1,
					  -745.2, -745.3, -1e6 };

	(void)state;
	for (int i = 0; i < N; i++)
		x[i] = i % 3 ? -test_rng_range(&r, 0, 40) : -test_rng_range(&r, 0, 800);
	memcpy(x, special, sizeof(special));
	x[20] = -INFINITY;
	x[21] = NAN;
	for (int i = 0; i < N; i++) {
		const double e = kvmem_sample_weight(x[i]), want = exp(x[i]);
		const double tol = want >= 0x1p-1022 ? 2 * (nextafter(want, INFINITY) - want)
						     : 2 * 0x1p-1074;

		if (!(x[i] >= -745.2) ? e != 0.0 : fabs(e - want) > tol)
			fail_msg("kvmem_sample_weight(%a) = %a, e^x = %a", x[i], e, want);
	}
	assert_true(kvmem_sample_weight(0.0) == 1.0 && kvmem_sample_weight(-0.0) == 1.0);
	assert_int_equal(kvmem_sample_weight_use(3), -EINVAL);
	for (int w = 8; w >= 1; w /= 2) {
		if (w == 2 || kvmem_sample_weight_use(w))
			continue;
		memcpy(y, x, sizeof(x));
		kvmem_sample_weights(y + 1, N - 1);	/* off the vectors' alignment too */
		for (int i = 1; i < N; i++) {
			const double want = kvmem_sample_weight(x[i]);

			if (memcmp(&y[i], &want, sizeof(want)))
				fail_msg("width %d: weight of %a = %a, the scalar's %a", w, x[i], y[i],
					 want);
		}
	}
	if (kvmem_sample_weight_use(8) && kvmem_sample_weight_use(4))
		assert_int_equal(kvmem_sample_weight_use(1), 0);
}

static void test_swiglu(void **state)
{
	uint64_t r = rng_for("swiglu");
	size_t n = (size_t)test_rng_int(&r, 4000, 6000);	/* a tail past the vectors */
	float *g = test_rand_floats(&r, n, -12, 12), *u = test_rand_floats(&r, n, -3, 3);
	float *o = test_rand_floats(&r, n, -1, 1), *one = malloc(sizeof(float) * n);

	assert_non_null(one);
	/* The ends of e^x's range and past them: e^-g clamped at +-87, 88. */
	for (size_t i = 0; i < n / 8; i++)
		g[test_rng_int(&r, 0, (int)n - 1)] = (float)test_rng_int(&r, -120, 120) +
						     (float)test_rng_int(&r, 0, 999) / 1000;
	kvmem_swiglu(o, g, u, n);
	for (size_t i = 0; i < n; i++) {
		double ref = g[i] / (1.0 + exp(-(double)g[i])) * u[i];

		if (fabs(o[i] - ref) > 4e-6 * fabs(ref) + 1e-7)
			fail_msg("swiglu [%zu]: silu(%g)*%g = %g vs %g", i, g[i], u[i], o[i], ref);
	}
	/* Each element has its bits whatever its place: alone (the scalar
	 * path), or at another offset in the vectors. */
	for (size_t i = 0; i < n; i++)
		kvmem_swiglu(one + i, g + i, u + i, 1);
	assert_memory_equal(one, o, sizeof(float) * n);
	kvmem_swiglu(one + 3, g + 3, u + 3, n - 3);
	assert_memory_equal(one, o, sizeof(float) * n);
	kvmem_swiglu(g, g, u, n);	/* out == gate */
	assert_memory_equal(g, o, sizeof(float) * n);
	free(g);
	free(u);
	free(o);
	free(one);
}

/* ---- RoPE ------------------------------------------------------------- */

static void ref_rope(double *out, const float *x, int pos, int head_dim, double theta)
{
	int half = head_dim / 2;

	for (int i = 0; i < half; i++) {
		double ang = pos / pow(theta, (2.0 * i) / head_dim);

		out[i] = x[i] * cos(ang) - x[i + half] * sin(ang);
		out[i + half] = x[i + half] * cos(ang) + x[i] * sin(ang);
	}
}

static void test_rope(void **state)
{
	uint64_t r = rng_for("rope");
	static const int dims[] = { 2, 6, 64, 128 };

	for (int c = 0; c < 4; c++) {
		int d = dims[c], heads = test_rng_int(&r, 1, 5), n = test_rng_int(&r, 1, 40);
		double theta = c % 2 ? 1e6 : 1e4;
		size_t len = (size_t)n * heads * d;
		float *x = test_rand_floats(&r, len, -2, 2);
		float *y = malloc(sizeof(float) * len);
		int32_t *pos = malloc(sizeof(int32_t) * n);
		double ref[128];

		for (int t = 0; t < n; t++)
			pos[t] = t == 0 ? 0 : test_rng_int(&r, 0, t % 3 ? 5000 : 4000000);
		memcpy(y, x, sizeof(float) * len);
		kvmem_rope(y, pos, n, heads, d, theta);
		for (int t = 0; t < n; t++)
			for (int h = 0; h < heads; h++) {
				const float *xr = x + ((size_t)t * heads + h) * d;
				const float *yr = y + ((size_t)t * heads + h) * d;

				ref_rope(ref, xr, pos[t], d, theta);
				for (int i = 0; i < d; i++) {
					double tol = 2e-6 * (fabs(xr[i % (d / 2)]) +
							     fabs(xr[i % (d / 2) + d / 2])) + 1e-30;

					if (fabs(yr[i] - ref[i]) > tol)
						fail_msg("rope d=%d pos=%d [%d]: %g vs %g", d, pos[t], i,
							 yr[i], ref[i]);
				}
				if (pos[t] == 0)	/* position 0 is the identity */
					assert_memory_equal(yr, xr, sizeof(float) * d);
			}
		/* The inverse undoes it (to rounding). */
		kvmem_rope_inverse(y, pos, n, heads, d, theta);
		for (size_t i = 0; i < len; i++)
			if (fabs(y[i] - x[i]) > 4e-6 * 2.0)
				fail_msg("rope_inverse(rope(x)) [%zu]: %g vs %g", i, y[i], x[i]);
		free(x);
		free(y);
		free(pos);
	}
}

/* A row rotated alone, or in the middle of another batch, gives the same bits. */
static void test_rope_batch_independent(void **state)
{
	uint64_t r = rng_for("rope-batch");
	int d = 128, heads = 4, n = 37;
	size_t row = (size_t)heads * d;
	float *x = test_rand_floats(&r, n * row, -3, 3);
	float *batch = malloc(sizeof(float) * n * row);
	int32_t pos[37];

	for (int t = 0; t < n; t++)
		pos[t] = test_rng_int(&r, 0, 3000000);
	memcpy(batch, x, sizeof(float) * n * row);
	kvmem_rope(batch, pos, n, heads, d, 1e6);
	for (int t = 0; t < n; t++) {
		/* Alone, and at slot 5 of a batch of 9 with other positions. */
		float one[512], other[9 * 512];
		int32_t p1 = pos[t], p9[9];

		memcpy(one, x + t * row, sizeof(float) * row);
		kvmem_rope(one, &p1, 1, heads, d, 1e6);
		assert_memory_equal(one, batch + t * row, sizeof(float) * row);
		for (int j = 0; j < 9; j++) {
			p9[j] = j == 5 ? pos[t] : test_rng_int(&r, 0, 100000);
			memcpy(other + j * row, x + ((t + j) % n) * row, sizeof(float) * row);
		}
		memcpy(other + 5 * row, x + t * row, sizeof(float) * row);
		kvmem_rope(other, p9, 9, heads, d, 1e6);
		assert_memory_equal(other + 5 * row, batch + t * row, sizeof(float) * row);
		/* And as one head of a single-head call. */
		for (int h = 0; h < heads; h++) {
			memcpy(one, x + t * row + h * d, sizeof(float) * d);
			kvmem_rope(one, &p1, 1, 1, d, 1e6);
			assert_memory_equal(one, batch + t * row + h * d, sizeof(float) * d);
		}
	}
	free(x);
	free(batch);
}

/* kvmem_rope_ang with kvmem_rope_angles' table (the cpu backend's place()
 * and move(): the angles made once for every head and layer at the same
 * positions) gives kvmem_rope's bits, and a prefix of the table serves
 * fewer tokens. */
static void test_rope_ang(void **state)
{
	uint64_t r = rng_for("rope-ang");
	static const int dims[] = { 2, 64, 128 };

	for (int c = 0; c < 6; c++) {
		const int d = dims[c % 3], n = test_rng_int(&r, 1, 48);
		const double theta = c % 2 ? 1e6 : 1e4;
		const int32_t p0 = test_rng_int(&r, 0, c < 3 ? 70000 : 4000000);
		float *x = test_rand_floats(&r, (size_t)n * d, -3, 3);
		float *a = malloc(sizeof(float) * n * d), *b = malloc(sizeof(float) * n * d);
		double *ang = malloc(sizeof(double) * n * d);
		int32_t *pos = malloc(sizeof(int32_t) * n);

		for (int t = 0; t < n; t++)
			pos[t] = p0 + t;
		memcpy(a, x, sizeof(float) * n * d);
		memcpy(b, x, sizeof(float) * n * d);
		kvmem_rope(a, pos, n, 1, d, theta);
		kvmem_rope_angles(ang, pos, n, d, theta);
		kvmem_rope_ang(b, n, d, ang);
		assert_memory_equal(a, b, sizeof(float) * n * d);
		memcpy(b, x, sizeof(float) * n * d);
		kvmem_rope_ang(b, n / 2, d, ang);	/* the first n/2 positions */
		assert_memory_equal(a, b, sizeof(float) * (n / 2) * d);
		free(x);
		free(a);
		free(b);
		free(ang);
		free(pos);
	}
}

/* ---- attention -------------------------------------------------------- */

static void ref_attention(double *out, const float *q, const int32_t *q_pos, int n_q,
			  const float *k, const float *v, const int32_t *kv_pos, int n_kv,
			  size_t stride, int heads, int kv_heads, int d, double scale)
{
	double *s = malloc(sizeof(double) * (n_kv ? n_kv : 1));

	for (int i = 0; i < n_q; i++)
		for (int h = 0; h < heads; h++) {
			int g = h / (heads / kv_heads);
			double *o = out + ((size_t)i * heads + h) * d, max = -INFINITY, sum = 0;

			for (int e = 0; e < d; e++)
				o[e] = 0;
			for (int j = 0; j < n_kv; j++) {
				if (kv_pos[j] > q_pos[i])
					continue;
				double dot = 0;

				for (int e = 0; e < d; e++)
					dot += (double)q[((size_t)i * heads + h) * d + e] *
					       k[((size_t)g * stride + j) * d + e];
				s[j] = dot * scale;
				if (s[j] > max)
					max = s[j];
			}
			for (int j = 0; j < n_kv; j++) {
				if (kv_pos[j] > q_pos[i])
					continue;
				double p = exp(s[j] - max);

				sum += p;
				for (int e = 0; e < d; e++)
					o[e] += p * v[((size_t)g * stride + j) * d + e];
			}
			for (int e = 0; e < d && sum > 0; e++)
				o[e] /= sum;
		}
	free(s);
}

struct att_case {
	int n_q, n_kv, heads, kv_heads, d;
	size_t stride;
	float *q, *k, *v;
	int32_t *q_pos, *kv_pos;
};

static void att_case_make(struct att_case *a, uint64_t *r, int n_q, int n_kv, int heads,
			  int kv_heads, int d, size_t stride)
{
	a->n_q = n_q;
	a->n_kv = n_kv;
	a->heads = heads;
	a->kv_heads = kv_heads;
	a->d = d;
	a->stride = stride;
	a->q = test_rand_floats(r, (size_t)n_q * heads * d, -2, 2);
	a->k = test_rand_floats(r, (size_t)kv_heads * stride * d, -2, 2);
	a->v = test_rand_floats(r, (size_t)kv_heads * stride * d, -1, 1);
	/* Slots past n_kv hold NaN: the kernel must never read them. */
	for (int g = 0; g < kv_heads; g++)
		for (size_t j = n_kv; j < stride; j++)
			for (int e = 0; e < d; e++) {
				a->k[((size_t)g * stride + j) * d + e] = NAN;
				a->v[((size_t)g * stride + j) * d + e] = NAN;
			}
	a->q_pos = malloc(sizeof(int32_t) * n_q);
	a->kv_pos = malloc(sizeof(int32_t) * (n_kv ? n_kv : 1));
	/* Arbitrary positions, unsorted, with repeats; some queries see nothing. */
	for (int j = 0; j < n_kv; j++)
		a->kv_pos[j] = test_rng_int(r, 0, 3 * n_kv);
	for (int i = 0; i < n_q; i++)
		a->q_pos[i] = test_rng_int(r, -2, 3 * n_kv + 2);
}

static void att_case_free(struct att_case *a)
{
	free(a->q);
	free(a->k);
	free(a->v);
	free(a->q_pos);
	free(a->kv_pos);
}

static void att_run(const struct att_case *a, float *out)
{
	kvmem_attention(out, a->q, a->q_pos, a->n_q, a->k, a->v, a->kv_pos, a->n_kv, a->stride,
		      a->heads, a->kv_heads, a->d, 1.0f / sqrtf((float)a->d));
}

static void test_attention(void **state)
{
	uint64_t r = rng_for("attention");
	static const int geo[][3] = { { 4, 4, 16 }, { 8, 2, 64 }, { 6, 1, 10 }, { 16, 8, 128 },
				      { 2, 1, 2 } };

	for (int c = 0; c < 5; c++) {
		struct att_case a;
		int n_kv = test_rng_int(&r, 1, 300);

		att_case_make(&a, &r, test_rng_int(&r, 1, 20), n_kv, geo[c][0], geo[c][1],
			      geo[c][2], n_kv + test_rng_int(&r, 0, 40));
		size_t on = (size_t)a.n_q * a.heads * a.d;
		float *out = test_rand_floats(&r, on, -1, 1);
		double *ref = malloc(sizeof(double) * on);

		att_run(&a, out);
		ref_attention(ref, a.q, a.q_pos, a.n_q, a.k, a.v, a.kv_pos, a.n_kv, a.stride,
			      a.heads, a.kv_heads, a.d, 1.0 / sqrt((double)a.d));
		for (size_t i = 0; i < on; i++)
			if (!(fabs(out[i] - ref[i]) <= 2e-5))
				fail_msg("attention heads %d/%d d=%d n_kv=%d [%zu]: %g vs %g",
					 a.heads, a.kv_heads, a.d, a.n_kv, i, out[i], ref[i]);
		free(out);
		free(ref);
		att_case_free(&a);
	}
}

/* Plain causal prefill: queries at positions p0.., keys 0..n_kv-1. */
static void test_attention_causal(void **state)
{
	uint64_t r = rng_for("attention-causal");
	struct att_case a;
	int n_kv = 150, n_q = 40;

	att_case_make(&a, &r, n_q, n_kv, 8, 2, 32, 256);
	for (int j = 0; j < n_kv; j++)
		a.kv_pos[j] = j;
	for (int i = 0; i < n_q; i++)
		a.q_pos[i] = n_kv - n_q + i;
	size_t on = (size_t)n_q * 8 * 32;
	float *out = malloc(sizeof(float) * on);
	double *ref = malloc(sizeof(double) * on);

	att_run(&a, out);
	ref_attention(ref, a.q, a.q_pos, n_q, a.k, a.v, a.kv_pos, n_kv, a.stride, 8, 2, 32,
		      1.0 / sqrt(32.0));
	for (size_t i = 0; i < on; i++)
		if (fabs(out[i] - ref[i]) > 2e-5)
			fail_msg("causal attention [%zu]: %g vs %g", i, out[i], ref[i]);
	free(out);
	free(ref);
	att_case_free(&a);
}

/* Same bits whatever the thread count, the kv_stride, or the batch. */
static void test_attention_deterministic(void **state)
{
	uint64_t r = rng_for("attention-det");
	struct att_case a, b;
	int n_q = 24, n_kv = 200, heads = 8, kvh = 2, d = 64;
	size_t on = (size_t)n_q * heads * d, row = (size_t)heads * d;

	att_case_make(&a, &r, n_q, n_kv, heads, kvh, d, n_kv);
	for (int i = 0; i < n_q; i++)	/* everyone sees something */
		a.q_pos[i] = 3 * n_kv;
	float *o1 = malloc(sizeof(float) * on), *o2 = malloc(sizeof(float) * on);
	int saved = omp_get_max_threads();

	omp_set_num_threads(1);
	att_run(&a, o1);
	omp_set_num_threads(3);
	att_run(&a, o2);
	omp_set_num_threads(saved);
	assert_memory_equal(o1, o2, sizeof(float) * on);

	/* The same K/V in a wider view (stride 333) */
	b = a;
	b.stride = 333;
	b.k = malloc(sizeof(float) * kvh * b.stride * d);
	b.v = malloc(sizeof(float) * kvh * b.stride * d);
	for (int g = 0; g < kvh; g++) {
		memcpy(b.k + g * b.stride * d, a.k + g * a.stride * d, sizeof(float) * n_kv * d);
		memcpy(b.v + g * b.stride * d, a.v + g * a.stride * d, sizeof(float) * n_kv * d);
	}
	att_run(&b, o2);
	assert_memory_equal(o1, o2, sizeof(float) * on);
	free(b.k);
	free(b.v);

	/* One query alone. */
	for (int i = 0; i < n_q; i += 5) {
		kvmem_attention(o2, a.q + i * row, a.q_pos + i, 1, a.k, a.v, a.kv_pos, n_kv,
			      a.stride, heads, kvh, d, 1.0f / sqrtf((float)d));
		assert_memory_equal(o2, o1 + i * row, sizeof(float) * row);
	}
	free(o1);
	free(o2);
	att_case_free(&a);
}

/* The kernel's own arithmetic spelled out in fp32 (attention.c's file
 * header): eight running sums per dot product in a fixed tree, times
 * scale; the max; kvmem_expf; the denominator in double; the weighted sum of V
 * key after key from zero; times the float inverse. A faster kernel must
 * keep these bits (a lone session's results), whatever path it takes. */
static float exact_dot(const float *a, const float *b, int n)
{
	float acc[8] = { 0 };
	int e = 0;

	for (; e + 8 <= n; e += 8)
		for (int k = 0; k < 8; k++)
			acc[k] += a[e + k] * b[e + k];
	float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));

	for (; e < n; e++)
		s += a[e] * b[e];
	return s;
}

static void exact_attention(float *out, const struct att_case *a, float scale)
{
	int grp = a->heads / a->kv_heads, d = a->d;
	float *sc = malloc(sizeof(float) * (a->n_kv ? a->n_kv : 1));

	for (int i = 0; i < a->n_q; i++)
		for (int h = 0; h < a->heads; h++) {
			const float *qh = a->q + ((size_t)i * a->heads + h) * d;
			const float *k = a->k + (size_t)(h / grp) * a->stride * d;
			const float *v = a->v + (size_t)(h / grp) * a->stride * d;
			float *o = out + ((size_t)i * a->heads + h) * d, max = -INFINITY;
			double sum = 0;
			int seen = 0;

			for (int e = 0; e < d; e++)
				o[e] = 0;
			for (int j = 0; j < a->n_kv; j++)
				if (a->kv_pos[j] <= a->q_pos[i]) {
					sc[j] = exact_dot(qh, k + (size_t)j * d, d) * scale;
					max = sc[j] > max ? sc[j] : max;
					seen = 1;
				}
			if (!seen)
				continue;
			for (int j = 0; j < a->n_kv; j++)
				if (a->kv_pos[j] <= a->q_pos[i]) {
					float p = kvmem_expf(sc[j] - max);

					sum += p;
					for (int e = 0; e < d; e++)
						o[e] += p * v[(size_t)j * d + e];
				}
			float inv = (float)(1.0 / sum);

			for (int e = 0; e < d; e++)
				o[e] *= inv;
		}
	free(sc);
}

/* test_attention_exact's cases at one instruction set. */
static void attention_exact_cases(uint64_t *rp, const int (*geo)[3], int n_geo, const char *isa)
{
	for (int c = 0; c < n_geo; c++)
		for (int causal = 0; causal < 2; causal++) {
			struct att_case a;
			int n_kv = test_rng_int(rp, 1, 300), n_q = test_rng_int(rp, 1, 12);

			att_case_make(&a, rp, n_q, n_kv, geo[c][0], geo[c][1], geo[c][2],
				      n_kv + test_rng_int(rp, 0, 20));
			if (causal) {
				for (int j = 0; j < n_kv; j++)
					a.kv_pos[j] = j;
				for (int i = 0; i < n_q; i++)
					a.q_pos[i] = test_rng_int(rp, 0, n_kv - 1);
			}
			size_t on = (size_t)n_q * a.heads * a.d;
			float *out = malloc(sizeof(float) * on), *ref = malloc(sizeof(float) * on);
			float scale = 1.0f / sqrtf((float)a.d);

			exact_attention(ref, &a, scale);
			for (int w = 16; w >= 1; w /= 2) {	/* the softmax at each width */
				if (w == 4 || w == 2 || kvmem_vexp_use(w))
					continue;
				att_run(&a, out);
				for (size_t i = 0; i < on; i++)
					if (memcmp(&out[i], &ref[i], sizeof(float)))
						fail_msg("attention %s heads %d/%d d=%d n_kv=%d causal "
							 "%d width %d [%zu]: %a vs %a", isa, a.heads,
							 a.kv_heads, a.d, n_kv, causal, w, i, out[i],
							 ref[i]);
			}
			vexp_best();
			free(out);
			free(ref);
			att_case_free(&a);
		}
}

/* Bit for bit the arithmetic above: head sizes with and without a tail
 * of 8, over 64 and not a multiple of it; causal views (runs of eight
 * visible keys) and scattered positions (keys one at a time); the
 * softmax's e^x at each width the CPU has; each instruction set the CPU
 * has (kvmem_attention_use: an AVX-512 machine runs the AVX2 and plain
 * paths only when asked). */
static void test_attention_exact(void **state)
{
	static const char *const isas[] = { "avx512", "avx2", "c" };
	const char *best = kvmem_attention_isa();
	uint64_t r = rng_for("attention-exact");
	static const int geo[][3] = { { 8, 2, 64 }, { 4, 1, 72 }, { 4, 2, 136 }, { 6, 3, 10 },
				      { 16, 8, 128 }, { 2, 2, 16 } };
	int tried = 0;

	for (int v = 0; v < 3; v++) {
		if (kvmem_attention_use(isas[v]) == -ENOTSUP)
			continue;
		assert_string_equal(kvmem_attention_isa(), isas[v]);
		tried++;
		attention_exact_cases(&r, geo, 6, isas[v]);
	}
	assert_true(tried >= 1);
	assert_int_equal(kvmem_attention_use("nonsense"), -EINVAL);
	assert_string_equal(kvmem_attention_isa(), "c");	/* a refused name changes nothing */
	assert_int_equal(kvmem_attention_use(best), 0);
}

/* ---- sampling --------------------------------------------------------- */

/* The first of the highest by a plain loop: the reference for the draws. */
static int ref_argmax(const float *l, int vocab)
{
	int best = 0;

	for (int i = 1; i < vocab; i++)
		if (l[i] > l[best])
			best = i;
	return best;
}

/* kvmem_argmax_finite gives kvmem_sample's greedy draw (and the plain
 * loop's) over random logits of many sizes, across chunk edges and tails,
 * with ties far apart and in one chunk, with +0 against -0 as the highest;
 * a NaN or an infinity anywhere gives -1 and the first one's index. */
static void argmax_finite_cases(uint64_t r)
{
	static const int sizes[] = { 1, 5, 16, 17, 1023, 1024, 1025, 3000, 151936 };
	kvmem_sampler greedy = { 0 };
	uint64_t st = 0;
	int bad;

	for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
		const int vocab = sizes[z];
		float *l = test_rand_floats(&r, vocab, -30, 30);
		int best = ref_argmax(l, vocab);

		assert_int_equal(kvmem_argmax_finite(l, vocab, &bad), best);
		assert_int_equal(bad, -1);
		assert_int_equal(kvmem_sample(l, vocab, &greedy, &st), best);
		if (vocab > 1) {	/* a tie later, maybe chunks away: the first stays */
			int at = best + 1 + (int)(test_rng_next(&r) % (uint64_t)(vocab - best));

			if (at < vocab) {
				l[at] = l[best];
				assert_int_equal(kvmem_argmax_finite(l, vocab, &bad), best);
			}
			/* a tie earlier than the best: now the first */
			if (best > 0) {
				int before = (int)(test_rng_next(&r) % (uint64_t)best);

				l[before] = l[best];
				assert_int_equal(kvmem_argmax_finite(l, vocab, &bad), before);
				best = before;
			}
		}
		for (int k = 0; k < 3 && vocab > 2; k++) {	/* NaN, +inf, -inf anywhere */
			const float odd[3] = { NAN, INFINITY, -INFINITY };
			int at = (int)(test_rng_next(&r) % (uint64_t)vocab);
			int at2 = (int)(test_rng_next(&r) % (uint64_t)vocab);
			float keep = l[at], keep2 = l[at2];

			l[at] = odd[k];
			l[at2] = odd[(k + 1) % 3];
			assert_int_equal(kvmem_argmax_finite(l, vocab, &bad), -1);
			assert_int_equal(bad, at < at2 ? at : at2);
			l[at2] = keep2;
			l[at] = keep;
		}
		free(l);
	}
	{	/* zeros as the highest: -0 first, then +0 in a later chunk */
		float *l = test_rand_floats(&r, 4096, -9, -1);

		l[1500] = -0.0f;
		l[3000] = 0.0f;
		assert_int_equal(kvmem_argmax_finite(l, 4096, &bad), 1500);
		assert_int_equal(kvmem_sample(l, 4096, &greedy, &st), 1500);
		free(l);
	}
}

/* The cases above with the SSE2 form and, where the CPU has it, AVX-512. */
static void test_argmax_finite(void **state)
{
	for (int on = 0; on < 2; on++) {
		if (kvmem_argmax_use_avx512(on))
			continue;
		argmax_finite_cases(rng_for(on ? "argmax-finite-512" : "argmax-finite"));
	}
	kvmem_argmax_use_avx512(1);	/* back to the best (a no-op without it) */
}

static void test_sample_greedy(void **state)
{
	uint64_t r = rng_for("greedy");
	int vocab = 1000;
	float *l = test_rand_floats(&r, vocab, -5, 5);
	kvmem_sampler s = { .temperature = 0, .seed = 1 };
	uint64_t st = kvmem_rng_seed(1), st0 = st;
	int best = 0;

	for (int i = 1; i < vocab; i++)
		if (l[i] > l[best])
			best = i;
	assert_int_equal(kvmem_sample(l, vocab, &s, &st), best);
	assert_true(st == st0);	/* greedy leaves the RNG alone */
	l[vocab - 1] = l[best];	/* a tie: the lower id wins */
	assert_int_equal(kvmem_sample(l, vocab, &s, &st), best);
	l[best == 3 ? 4 : 3] = NAN;	/* a NaN elsewhere than the best (and its tie) */
	assert_int_equal(kvmem_sample(l, vocab, &s, &st), best);
	if (best != 0) {	/* a NaN first never stands in for the best */
		float l0 = l[0];

		l[0] = NAN;
		assert_int_equal(kvmem_sample(l, vocab, &s, &st), best);
		l[0] = l0;
	}
	/* top_k = 1 is greedy too, at any temperature. */
	s.temperature = 2.0f;
	s.top_k = 1;
	for (int i = 0; i < 20; i++)
		assert_int_equal(kvmem_sample(l, vocab, &s, &st), best);
	free(l);
}

/* The running best, as greedy drew before it was vectorised: the first of
 * the highest logits, NaN never winning (index 0 when nothing beats it). */
static int argmax_ref(const float *l, int vocab)
{
	float top = isnan(l[0]) ? -INFINITY : l[0];
	int best = 0;

	for (int i = 1; i < vocab; i++)
		if (l[i] > top) {
			top = l[i];
			best = i;
		}
	return best;
}

/* Greedy against the reference on awkward logits: sizes around the
 * 16-lane groups, few distinct values (ties), NaN, both infinities, both
 * zeros, all NaN or -inf. */
static void test_sample_greedy_ref(void **state)
{
	uint64_t r = rng_for("greedy_ref");
	const float odd[] = { NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1.0f, -1.0f, 3.5f };
	const kvmem_sampler s = { 0 };
	float *l = malloc(sizeof(float) * 4100);

	for (int t = 0; t < 4000; t++) {
		int vocab = t < 100 ? 1 + t : test_rng_int(&r, 1, 4100);
		int mode = test_rng_int(&r, 0, 3);
		uint64_t st = 0;

		for (int i = 0; i < vocab; i++) {
			double u = test_rng_uniform(&r);

			l[i] = mode == 0 ? (float)test_rng_range(&r, -5, 5) :
			       mode == 1 ? (float)test_rng_int(&r, -2, 2) :	/* ties */
			       mode == 2 ? (u < 0.5 ? NAN : -INFINITY) :	/* nothing wins */
			       u < 0.7 ? (float)test_rng_int(&r, -1, 1) : odd[test_rng_int(&r, 0, 7)];
		}
		if (kvmem_sample(l, vocab, &s, &st) != argmax_ref(l, vocab))
			fail_msg("case %d (vocab %d, mode %d): greedy drew %d, the reference %d", t,
				 vocab, mode, kvmem_sample(l, vocab, &s, &st), argmax_ref(l, vocab));
	}
	free(l);
}

static void test_sample_deterministic(void **state)
{
	uint64_t r = rng_for("sample-det");
	int vocab = 5000;
	float *l = test_rand_floats(&r, vocab, -3, 3);
	kvmem_sampler s = { .temperature = 0.8f, .top_k = 50, .top_p = 0.9f,
			  .seed = (uint64_t)test_rng_int(&r, 0, 1 << 30) };
	int a[64], b[64], c[64], same = 1;
	uint64_t st;

	for (int pass = 0; pass < 3; pass++) {
		int *dst = pass == 0 ? a : pass == 1 ? b : c;
		kvmem_sampler t = s;

		if (pass == 2)
			t.seed ^= 0x5555;
		st = kvmem_rng_seed(t.seed);
		for (int i = 0; i < 64; i++)
			dst[i] = kvmem_sample(l, vocab, &t, &st);
	}
	assert_memory_equal(a, b, sizeof(a));
	for (int i = 0; i < 64; i++)
		same &= a[i] == c[i];
	assert_false(same);	/* another seed, another sequence */
	for (int i = 0; i < 100; i++) {
		double u = kvmem_rng_uniform(&st);

		assert_true(u >= 0.0 && u < 1.0);
	}
	free(l);
}

/* Observed frequencies against the exact probabilities (chi-square-ish:
 * every count within 5 sigma). */
static void check_freq(const float *l, int vocab, const kvmem_sampler *s, const double *want,
		       int draws)
{
	int *count = calloc(vocab, sizeof(int));
	uint64_t st = kvmem_rng_seed(s->seed);

	for (int i = 0; i < draws; i++) {
		int t = kvmem_sample(l, vocab, s, &st);

		assert_in_range(t, 0, vocab - 1);
		count[t]++;
	}
	for (int t = 0; t < vocab; t++) {
		double mean = want[t] * draws, sd = sqrt(draws * want[t] * (1 - want[t]));

		if (want[t] == 0.0 && count[t])
			fail_msg("token %d (probability 0) drawn %d times", t, count[t]);
		if (fabs(count[t] - mean) > 5 * sd + 1)
			fail_msg("token %d drawn %d times, expected %.1f (T=%g k=%d p=%g)", t,
				 count[t], mean, s->temperature, s->top_k, s->top_p);
	}
	free(count);
}

static void test_sample_distribution(void **state)
{
	uint64_t r = rng_for("sample-dist");
	enum { V = 8 };
	float l[V];
	double p[V], want[V];
	int order[V];

	for (int i = 0; i < V; i++)
		l[i] = (float)test_rng_range(&r, -2, 2);
	l[6] = NAN;
	for (int i = 0; i < V; i++)
		order[i] = i;
	for (int i = 0; i < V; i++)	/* rank: higher logit first (NaN last) */
		for (int j = i + 1; j < V; j++) {
			float li = isnan(l[order[i]]) ? -INFINITY : l[order[i]];
			float lj = isnan(l[order[j]]) ? -INFINITY : l[order[j]];

			if (lj > li || (lj == li && order[j] < order[i])) {
				int t = order[i];

				order[i] = order[j];
				order[j] = t;
			}
		}
	static const float temps[] = { 1.0f, 0.5f, 2.0f };

	for (int c = 0; c < 3; c++) {
		float T = temps[c];
		double sum = 0;

		for (int i = 0; i < V; i++)
			sum += p[i] = isnan(l[i]) ? 0 : exp(l[i] / T);
		/* Plain temperature. */
		kvmem_sampler s = { .temperature = T, .seed = rng_for("d") + c };

		for (int i = 0; i < V; i++)
			want[i] = p[i] / sum;
		check_freq(l, V, &s, want, 40000);

		/* Top-3. */
		double s3 = 0;

		for (int i = 0; i < V; i++)
			want[i] = 0;
		for (int i = 0; i < 3; i++)
			s3 += p[order[i]];
		for (int i = 0; i < 3; i++)
			want[order[i]] = p[order[i]] / s3;
		s.top_k = 3;
		check_freq(l, V, &s, want, 40000);

		/* Top-p 0.6: the shortest prefix reaching 60% of the mass. */
		double cum = 0;
		int keep = 0;

		while (cum < 0.6 * sum)
			cum += p[order[keep++]];
		for (int i = 0; i < V; i++)
			want[i] = 0;
		for (int i = 0; i < keep; i++)
			want[order[i]] = p[order[i]] / cum;
		s.top_k = 0;
		s.top_p = 0.6f;
		check_freq(l, V, &s, want, 40000);
	}
}

/* Top-k with a large vocabulary goes through the sort path: same answers
 * as the small-k path would give (only the k best ever drawn). */
static void test_sample_large_topk(void **state)
{
	uint64_t r = rng_for("sample-large");
	int vocab = 3000, k = 1500;
	float *l = test_rand_floats(&r, vocab, -4, 4);
	kvmem_sampler s = { .temperature = 1.0f, .top_k = k, .seed = 7 };
	uint64_t st = kvmem_rng_seed(7);
	float kth;
	float *sorted = malloc(sizeof(float) * vocab);

	memcpy(sorted, l, sizeof(float) * vocab);
	for (int i = 0; i < k; i++)	/* partial selection sort to find the k-th best */
		for (int j = i + 1; j < vocab; j++)
			if (sorted[j] > sorted[i]) {
				float t = sorted[i];

				sorted[i] = sorted[j];
				sorted[j] = t;
			}
	kth = sorted[k - 1];
	for (int i = 0; i < 2000; i++) {
		int t = kvmem_sample(l, vocab, &s, &st);

		assert_true(l[t] >= kth);
	}
	free(l);
	free(sorted);
}

/*
 * kvmem_sample's full order (a temperature with no top-k, or top-k past
 * 1024) against the qsort it replaced (helpers/test_sample_ref.c). Logits
 * with ties, NaN, infinities and -0 beside +0; the token and the random
 * state after it must be the same, draw after draw.
 */
static void test_sample_full_order(void **state)
{
	uint64_t r = rng_for("sample-full-order");
	static const kvmem_sampler cfg[] = {
		{ .temperature = 1.0f }, { .temperature = 0.8f, .top_p = 0.9f },
		{ .temperature = 1.3f, .top_k = 2000, .top_p = 0.8f }, { .temperature = 40.0f },
		/* top-k of 1024 or less: the selection's path, the same rule */
		{ .temperature = 0.7f, .top_k = 20, .top_p = 0.95f }, { .temperature = 0.5f, .top_k = 1024 },
		{ .temperature = 1.0f, .top_p = 1e-6f },	/* a bar of 0 or so: the best */
	};
	int same = 0, draws = 0;

	(void)state;
	for (int t = 0; t < 12; t++) {
		const int vocab = t == 11 ? 151936 : test_rng_int(&r, 1, 5000);
		float *l = test_rand_floats(&r, vocab, -6, 6);

		for (int i = 0; i < vocab; i++) {
			const double u = test_rng_uniform(&r);

			if (t % 3 == 1)	/* few values: long runs of ties */
				l[i] = (float)test_rng_int(&r, -3, 3);
			if (t % 4 == 3)	/* a spread past 38 T: most never weigh */
				l[i] *= 25.0f;
			if (u < 0.01)
				l[i] = NAN;
			else if (u < 0.015)
				l[i] = -INFINITY;
			else if (u < 0.03)
				l[i] = i & 1 ? -0.0f : 0.0f;
		}
		if (t == 5)
			l[test_rng_int(&r, 0, vocab - 1)] = INFINITY;	/* wins outright */
		if (t == 6)
			for (int i = 0; i < vocab; i++)
				l[i] = NAN;	/* all as -inf: the first id */
		for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
			uint64_t a = kvmem_rng_seed((uint64_t)t * 31 + c), b = a;

			for (int d = 0; d < (vocab > 10000 ? 2 : 5); d++) {
				const int got = kvmem_sample(l, vocab, &cfg[c], &a);
				const int want = test_sample_qsort(l, vocab, &cfg[c], &b);

				if (got != want || a != b)
					fail_msg("vocab %d, config %zu, draw %d: %d, the qsort order's %d",
						 vocab, c, d, got, want);
				same++;
				draws++;
			}
		}
		free(l);
	}
	assert_int_equal(same, draws);
}

/* ---- Mean-K ------------------------------------------------------------ */

static void test_meank(void **state)
{
	uint64_t r = rng_for("meank");
	int n = test_rng_int(&r, 1, 64), kvh = test_rng_int(&r, 1, 8);
	int d = 2 * test_rng_int(&r, 1, 64);
	size_t row = (size_t)kvh * d;
	float *k = test_rand_floats(&r, n * row, -3, 3), *sum = test_rand_floats(&r, row, -1, 1);
	double *ref = malloc(sizeof(double) * row), *mag = malloc(sizeof(double) * row);

	for (size_t e = 0; e < row; e++) {
		ref[e] = sum[e];
		mag[e] = fabs(sum[e]);
	}
	for (int t = 0; t < n; t++)
		for (size_t e = 0; e < row; e++) {
			ref[e] += k[t * row + e];
			mag[e] += fabs(k[t * row + e]);
		}
	kvmem_meank_accumulate(sum, k, n, kvh, d);
	for (size_t e = 0; e < row; e++)
		if (fabs(sum[e] - ref[e]) > 1e-5 * mag[e])
			fail_msg("meank [%zu]: %g vs %g", e, sum[e], ref[e]);
	free(k);
	free(sum);
	free(ref);
	free(mag);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bf16),
		cmocka_unit_test(test_f16),
		cmocka_unit_test(test_matmul),
		cmocka_unit_test(test_matmul_bf16w),
		cmocka_unit_test(test_embedding_add),
		cmocka_unit_test(test_rmsnorm),
		cmocka_unit_test(test_expf_widths),
		cmocka_unit_test(test_swiglu),
		cmocka_unit_test(test_rope),
		cmocka_unit_test(test_rope_batch_independent),
		cmocka_unit_test(test_rope_ang),
		cmocka_unit_test(test_attention),
		cmocka_unit_test(test_attention_causal),
		cmocka_unit_test(test_attention_deterministic),
		cmocka_unit_test(test_attention_exact),
		cmocka_unit_test(test_argmax_finite),
		cmocka_unit_test(test_sample_greedy),
		cmocka_unit_test(test_sample_greedy_ref),
		cmocka_unit_test(test_sample_deterministic),
		cmocka_unit_test(test_sample_distribution),
		cmocka_unit_test(test_sample_large_topk),
		cmocka_unit_test(test_sample_full_order),
		cmocka_unit_test(test_sample_weight),
		cmocka_unit_test(test_meank),
	};

	g_seed = test_rng_fresh_seed("test_kernels");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

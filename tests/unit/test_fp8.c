// SPDX-License-Identifier: MIT
/*
 * The e4m3 format and its row scales (kernels/cpu/fp8.c) against naive
 * double references on fresh random inputs (the seed is printed;
 * KVMEM_TEST_SEED replays it):
 *  - every one of the 256 codes decodes to the value its bits spell;
 *  - encoding picks the nearest finite value, ties to the even code, over
 *    random values in every binade, at exact midpoints, and in the
 *    subnormal range; saturation at 448 (infinity too); NaN -> 0x7f; and
 *    gives, alone and in a row's lanes, the code of the fields' arithmetic
 *    (frexpf) for float bit patterns a stride apart (all 2^32 with
 *    KVMEM_TEST_EXHAUSTIVE=1);
 *  - a row's scale is a power of two that brings its largest finite
 *    magnitude into (224, 448];
 *  - the round trip errs by at most half a step: 2^-4 |x| for normal
 *    values, 2^-10 scale below them; and a second round trip changes
 *    nothing;
 *  - the GPU kernels' twins: quantising bf16 rows is quantising their
 *    fp32 widening; gathering an fp8 page into a bf16 view, and decode
 *    attention over fp8 K/V, give the bits of the same over the bf16 page
 *    of the dequantised values (which bf16 holds exactly);
 *  - an fp8 view's K row (the cuda backend's): the rotation within half a
 *    step at twice the raw scale, never saturated; the put twin;
 *  - tools/train/e4m3_fixture.txt, which train.py's fake quantisation is
 *    checked against, holds what these functions give.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_bf16.h"
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"
#include "kernels/cpu/bits.h"
#include "helpers/test_model.h"

static uint64_t g_seed;

/* The value of a finite code from its fields, in double. */
static double ref_decode(int c)
{
	int e = (c >> 3) & 15, m = c & 7;
	double a = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);

	return (c & 0x80) ? -a : a;
}

/* Nearest finite non-negative code to a >= 0, ties to the even code. */
static int ref_encode_abs(double a)
{
	int best = 0;
	double bd = INFINITY;

	for (int c = 0; c <= 0x7e; c++) {
		double d = fabs(ref_decode(c) - a);

		if (d < bd || (d == bd && !(c & 1))) {
			best = c;
			bd = d;
		}
	}
	return best;
}

static void test_decode_every_code(void **state)
{
	for (int c = 0; c < 256; c++) {
		float f = kvmem_e4m3_to_f32((uint8_t)c);

		if ((c & 0x7f) == 0x7f) {
			assert_true(isnan(f));
			continue;
		}
		assert_true((double)f == ref_decode(c));
		assert_int_equal(!!signbit(f), c >> 7);
		if (c & 0x7f)	/* positive codes increase with their value */
			assert_true(fabsf(kvmem_e4m3_to_f32((uint8_t)(c - 1))) < fabsf(f));
	}
	assert_true(kvmem_e4m3_to_f32(0x7e) == 448.0f);
	assert_true(kvmem_e4m3_to_f32(0x08) == 0x1p-6f);
	assert_true(kvmem_e4m3_to_f32(0x01) == 0x1p-9f);
}

static void test_encode_codes_and_midpoints(void **state)
{
	/* Every finite code round-trips; the midpoint between two codes goes
	 * to the even one, and a hair either side to the nearer. */
	for (int c = 0; c < 256; c++) {
		if ((c & 0x7f) == 0x7f)
			continue;
		assert_int_equal(kvmem_f32_to_e4m3(kvmem_e4m3_to_f32((uint8_t)c)), c);
	}
	for (int c = 0; c < 0x7e; c++) {
		float lo = kvmem_e4m3_to_f32((uint8_t)c), hi = kvmem_e4m3_to_f32((uint8_t)(c + 1));
		float mid = (lo + hi) / 2;	/* exact: both are short binary fractions */

		assert_int_equal(kvmem_f32_to_e4m3(mid), (c & 1) ? c + 1 : c);
		assert_int_equal(kvmem_f32_to_e4m3(nextafterf(mid, 0)), c);
		assert_int_equal(kvmem_f32_to_e4m3(nextafterf(mid, INFINITY)), c + 1);
		assert_int_equal(kvmem_f32_to_e4m3(-mid), 0x80 | ((c & 1) ? c + 1 : c));
	}
}

static void test_encode_random(void **state)
{
	uint64_t r = g_seed ^ 0xe4;

	for (int i = 0; i < 200000; i++) {
		/* log-uniform over 2^-14 .. 2^10: subnormals, every binade,
		 * and past the saturation point */
		double a = ldexp(1.0 + test_rng_uniform(&r), test_rng_int(&r, -14, 9));
		float x = (float)a * (test_rng_int(&r, 0, 1) ? -1.0f : 1.0f);
		int want = ref_encode_abs(fabs((double)x)) | (signbit(x) ? 0x80 : 0);

		if (kvmem_f32_to_e4m3(x) != want)
			fail_msg("e4m3(%a) = 0x%02x, the nearest even code is 0x%02x", (double)x,
				 kvmem_f32_to_e4m3(x), want);
	}
}

/* The encoding by its fields, as kvmem_f32_to_e4m3 computed it before
 * 2026-12-04 (frexpf and rintf): the library now works on the bits. */
static uint8_t fields_e4m3(float x)
{
	const uint8_t sign = signbit(x) ? 0x80 : 0;
	float a = fabsf(x), f;
	int k;

	if (isnan(x))
		return KVMEM_E4M3_NAN;
	if (a >= KVMEM_E4M3_MAX)
		return sign | 0x7e;
	if (a < 0x1p-6f)
		return sign | (uint8_t)rintf(a * 0x1p9f);
	f = frexpf(a, &k);
	return sign | (uint8_t)(((k + 6) << 3) + (int)rintf(f * 16.0f) - 8);
}

/* Every float bit pattern a stride apart (an odd stride: every residue of
 * the low bits over the whole range), from a random start, each as a
 * value alone and in a row of 16 (the quantiser's lanes, scale 1: values
 * of at most 448): the codes of the fields' form. KVMEM_TEST_EXHAUSTIVE=1
 * takes all 2^32 (half a minute). */
static void test_encode_every_bit_pattern(void **state)
{
	uint64_t r = g_seed ^ 0xb175;
	const uint64_t step = getenv("KVMEM_TEST_EXHAUSTIVE") ? 1 : 4099;
	uint32_t u = step == 1 ? 0 : (uint32_t)test_rng_next(&r);
	uint64_t done = 0;
	float row[16];
	uint8_t q[16];
	int fill = 0;

	for (uint64_t i = 0; i < (1ull << 32); i += step, u += (uint32_t)step, done++) {
		float x;

		memcpy(&x, &u, sizeof(x));
		if (kvmem_f32_to_e4m3(x) != fields_e4m3(x))
			fail_msg("e4m3 of bits 0x%08x: 0x%02x, by the fields 0x%02x (seed %llu)", u,
				 kvmem_f32_to_e4m3(x), fields_e4m3(x), (unsigned long long)g_seed);
		if (!isnan(x) && fabsf(x) <= 448.0f)	/* a row's scale 1: its lanes as they are */
			row[fill++] = x;
		if (fill == 16) {
			row[0] = 448.0f;	/* the row's largest: scale 1 */
			kvmem_fp8_quant_row(q, &(float){ 0 }, row, 16);
			for (int j = 0; j < 16; j++)
				if (q[j] != fields_e4m3(row[j]))
					fail_msg("a row's lane %d, %a: 0x%02x, by the fields 0x%02x", j,
						 (double)row[j], q[j], fields_e4m3(row[j]));
			fill = 0;
		}
	}
	assert_true(done >= (1ull << 32) / 4099);
}

static void test_special_values(void **state)
{
	assert_int_equal(kvmem_f32_to_e4m3(NAN), KVMEM_E4M3_NAN);
	assert_int_equal(kvmem_f32_to_e4m3(-NAN), KVMEM_E4M3_NAN);
	assert_int_equal(kvmem_f32_to_e4m3(INFINITY), 0x7e);	/* saturates */
	assert_int_equal(kvmem_f32_to_e4m3(-INFINITY), 0xfe);
	assert_int_equal(kvmem_f32_to_e4m3(449.0f), 0x7e);
	assert_int_equal(kvmem_f32_to_e4m3(1e30f), 0x7e);
	assert_int_equal(kvmem_f32_to_e4m3(-3e38f), 0xfe);
	assert_int_equal(kvmem_f32_to_e4m3(0.0f), 0x00);
	assert_int_equal(kvmem_f32_to_e4m3(-0.0f), 0x80);
	/* Subnormals: steps of 2^-9; a tie goes to the even step. */
	assert_int_equal(kvmem_f32_to_e4m3(0x1p-9f), 0x01);
	assert_int_equal(kvmem_f32_to_e4m3(0x1p-10f), 0x00);
	assert_int_equal(kvmem_f32_to_e4m3(0x3p-10f), 0x02);
	assert_int_equal(kvmem_f32_to_e4m3(0x1.8p-7f), 0x06);	/* 3 * 2^-9 */
	assert_int_equal(kvmem_f32_to_e4m3(0x1.fp-7f), 0x08);	/* rounds up to 2^-6 */
	assert_int_equal(kvmem_f32_to_e4m3(0x1p-140f), 0x00);	/* an fp32 subnormal */
	assert_int_equal(kvmem_f32_to_e4m3(-0x1p-140f), 0x80);
}

static void test_row_scales(void **state)
{
	uint64_t r = g_seed ^ 0x5ca1e;
	float row[128];

	for (int i = 0; i < 20000; i++) {
		const int n = test_rng_int(&r, 1, 128), e = test_rng_int(&r, -140, 120);
		float amax = 0, s;
		int k;

		for (int j = 0; j < n; j++) {
			row[j] = (float)ldexp(test_rng_range(&r, -1, 1), e);
			amax = fmaxf(amax, fabsf(row[j]));
		}
		if (test_rng_int(&r, 0, 9) == 0)	/* non-finite values do not count */
			row[test_rng_int(&r, 0, n - 1)] = test_rng_int(&r, 0, 1) ? NAN : -INFINITY;
		amax = 0;
		for (int j = 0; j < n; j++)
			if (isfinite(row[j]))
				amax = fmaxf(amax, fabsf(row[j]));
		s = kvmem_fp8_row_scale(row, n);
		assert_true(frexpf(s, &k) == 0.5f);	/* a power of two */
		if (amax == 0) {
			assert_true(s == 1.0f);
		} else if (s > 0x1p-126f && s < 0x1p120f) {
			/* the smallest power of two that fits: (224, 448] */
			assert_true(amax / s <= 448.0f);
			assert_true(amax / s > 224.0f);
		} else {
			assert_true(s == 0x1p-126f ? amax / s <= 448.0f : amax / s > 224.0f);
		}
	}
	memset(row, 0, sizeof(row));
	assert_true(kvmem_fp8_row_scale(row, 128) == 1.0f);
	row[3] = 448.0f;
	assert_true(kvmem_fp8_row_scale(row, 128) == 1.0f);
	row[3] = 448.5f;
	assert_true(kvmem_fp8_row_scale(row, 128) == 2.0f);
	row[3] = -224.0f;
	assert_true(kvmem_fp8_row_scale(row, 128) == 0.5f);
}

/* A row's codes (kvmem_fp8_quant_row: SSE2 lanes 16 values at a time, a
 * scalar tail) are kvmem_f32_to_e4m3 of each value over the row's scale,
 * whatever the bits: rows of every length to 300 of random bit patterns
 * (NaN payloads, infinities, fp32 subnormals, every exponent) or of values
 * in and around e4m3's range with its midpoints. */
static void test_quant_row_lanes(void **state)
{
	uint64_t r = g_seed ^ 0x1a4e5;
	float x[300], s;
	uint8_t q[300];

	for (int i = 0; i < 4000; i++) {
		const int n = test_rng_int(&r, 1, 300), kind = test_rng_int(&r, 0, 2);

		for (int j = 0; j < n; j++) {
			if (kind == 0) {
				uint32_t u = (uint32_t)test_rng_next(&r);

				memcpy(&x[j], &u, sizeof(u));
			} else if (kind == 1) {	/* a midpoint of two codes, or a hair off */
				const int c = test_rng_int(&r, 0, 0x7d);
				float m = (kvmem_e4m3_to_f32((uint8_t)c) +
					   kvmem_e4m3_to_f32((uint8_t)(c + 1))) / 2;

				m = ldexpf(m, test_rng_int(&r, -3, 3));
				x[j] = test_rng_int(&r, 0, 2) ? m : nextafterf(m, test_rng_int(&r, 0, 1) ?
										  INFINITY : 0);
			} else {
				x[j] = (float)ldexp(test_rng_range(&r, -1, 1), test_rng_int(&r, -150, 12));
			}
			if (test_rng_int(&r, 0, 1) == 0)
				x[j] = -x[j];
		}
		kvmem_fp8_quant_row(q, &s, x, n);
		assert_true(s == kvmem_fp8_row_scale(x, n));
		for (int j = 0; j < n; j++)
			if (q[j] != kvmem_f32_to_e4m3(x[j] / s))
				fail_msg("row of %d, value %d (%a over scale %a): 0x%02x, one at a time "
					 "0x%02x (seed %llu)", n, j, (double)x[j], (double)s, q[j],
					 kvmem_f32_to_e4m3(x[j] / s), (unsigned long long)g_seed);
	}
}

/* Round trips of rows like K and V: within half a step; idempotent; the
 * in-place helper gives the bits of quant + dequant. Prints the relative
 * RMS error of per-row against per-block (32 rows) scales, the figure the
 * granularity was chosen by. */
static void test_round_trip(void **state)
{
	enum { D = 128, ROWS = 32 * 64 };
	uint64_t r = g_seed ^ 0x7214;
	float *x = malloc(sizeof(float) * ROWS * D), *y = malloc(sizeof(float) * ROWS * D);
	float *z = malloc(sizeof(float) * ROWS * D);
	uint8_t q[D];
	double err_row = 0, err_blk = 0;

	assert_non_null(x);
	assert_non_null(y);
	assert_non_null(z);
	for (size_t t = 0; t < ROWS; t++) {
		/* rows of unlike size, as after k-norm with outlier channels */
		double row_mag = ldexp(1.0, test_rng_int(&r, -8, 8));

		for (int j = 0; j < D; j++) {
			double u1 = test_rng_uniform(&r) + 1e-12, u2 = test_rng_uniform(&r);
			double g = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);

			x[t * D + j] = (float)(g * row_mag * (j % 37 == 0 ? 8 : 1));
		}
	}
	for (size_t t = 0; t < ROWS; t++) {
		float s;
		double e2 = 0, x2 = 0;

		kvmem_fp8_quant_row(q, &s, x + t * D, D);
		kvmem_fp8_dequant_row(y + t * D, q, s, D);
		for (int j = 0; j < D; j++) {
			double a = x[t * D + j], b = y[t * D + j];
			double bound = fabs(a / s) >= 0x1p-6 ? 0x1p-4 * fabs(a) : 0x1p-10 * s;

			if (fabs(a - b) > bound)
				fail_msg("row %zu value %d: %a -> %a (scale %a), off by more than half "
					 "a step", t, j, a, b, (double)s);
			e2 += (a - b) * (a - b);
			x2 += a * a;
		}
		err_row += sqrt(e2 / x2) / ROWS;
	}
	memcpy(z, x, sizeof(float) * ROWS * D);
	kvmem_fp8_roundtrip_rows(z, ROWS, D);
	assert_memory_equal(z, y, sizeof(float) * ROWS * D);
	kvmem_fp8_roundtrip_rows(z, ROWS, D);
	assert_memory_equal(z, y, sizeof(float) * ROWS * D);
	/* The same values with one scale per block of 32 rows. */
	for (size_t b = 0; b < ROWS / 32; b++) {
		float s = kvmem_fp8_row_scale(x + b * 32 * D, 32 * D), inv = 1.0f / s;

		for (size_t t = b * 32; t < (b + 1) * 32; t++) {
			double e2 = 0, x2 = 0;

			for (size_t i = t * D; i < (t + 1) * D; i++) {
				double d = x[i] - kvmem_e4m3_to_f32(kvmem_f32_to_e4m3(x[i] * inv)) * s;

				e2 += d * d;
				x2 += (double)x[i] * x[i];
			}
			err_blk += sqrt(e2 / x2) / ROWS;
		}
	}
	printf("fp8 round trip, rows of 2^-8..2^8: mean relative RMS error of a row %.4f with "
	       "a scale per row, %.4f per block of 32 rows\n", err_row, err_blk);
	assert_true(err_row < 0x1p-4);
	free(x);
	free(y);
	free(z);
}

/* The prefill twin (kvmem_attention_kv_bf16), 3 tokens of 4 query heads
 * at positions 2, 9 and B - 1 over a page's H KV heads: fp8 gives the
 * output of its rows dequantised to bf16, and causally: a key after a
 * token's position (a NaN code put there) changes nothing before it. */
static void test_prefill_twin(uint8_t *pg, const uint16_t *deq, const float *sc, int B, int H,
			      int D, uint64_t *r)
{
	const size_t rows = (size_t)H * B, half = rows * D, n = (size_t)3 * 4 * D;
	const int32_t qp[3] = { 2, 9, B - 1 };
	uint16_t *q = malloc(2 * n), *o1 = malloc(2 * n), *o2 = malloc(2 * n);

	for (size_t i = 0; i < n; i++)
		q[i] = kvmem_f32_to_bf16((float)test_rng_range(r, -2, 2));
	assert_int_equal(kvmem_attention_kv_bf16(o1, q, qp, 3, pg, pg + half, sc, sc + rows,
						 KVMEM_DTYPE_FP8, B, B, 4, H, D, 0.125f), 0);
	assert_int_equal(kvmem_attention_kv_bf16(o2, q, qp, 3, deq, deq + half, NULL, NULL,
						 KVMEM_DTYPE_BF16, B, B, 4, H, D, 0.125f), 0);
	assert_memory_equal(o1, o2, 2 * n);
	pg[(size_t)10 * D + 5] = 0x7f;	/* key 10 of KV head 0: after token 9 */
	assert_int_equal(kvmem_attention_kv_bf16(o2, q, qp, 3, pg, pg + half, sc, sc + rows,
						 KVMEM_DTYPE_FP8, B, B, 4, H, D, 0.125f), 0);
	assert_memory_equal(o1, o2, 2 * 2 * 4 * D);	/* tokens at 2 and 9 */
	assert_true(kvmem_bf16_to_f32(o2[2 * 4 * D]) != kvmem_bf16_to_f32(o2[2 * 4 * D]));
	assert_int_equal(kvmem_attention_kv_bf16(o2, q, qp, 0, pg, pg + half, sc, sc + rows,
						 KVMEM_DTYPE_FP8, B, B, 4, H, D, 0.125f), -EINVAL);
	free(q);
	free(o1);
	free(o2);
}

static void test_twins(void **state)
{
	enum { H = 2, B = 16, D = 64, L = 2, CAP = 64 };
	const size_t rows = (size_t)H * B, half = rows * D;
	uint64_t r = g_seed ^ 0x7a1;
	float *x = malloc(sizeof(float) * 2 * half), w[D];
	uint16_t *xb = malloc(2 * 2 * half), *deq = malloc(2 * 2 * half);
	uint16_t *vk1 = calloc((size_t)L * H * CAP * D, 2), *vv1 = calloc((size_t)L * H * CAP * D, 2);
	uint16_t *vk2 = calloc((size_t)L * H * CAP * D, 2), *vv2 = calloc((size_t)L * H * CAP * D, 2);
	uint16_t q[4 * D], o1[4 * D], o2[4 * D];
	uint8_t *pg = malloc(2 * half + 8 * rows), qa[D], qb[D];
	float *sc = (float *)(pg + 2 * half), sa, sb;

	for (size_t i = 0; i < 2 * half; i++)
		x[i] = (float)ldexp(test_rng_range(&r, -1, 1), test_rng_int(&r, -6, 6));
	kvmem_f32_to_bf16_n(xb, x, 2 * half);
	/* bf16 rows: the widening's bytes and scale */
	for (size_t row = 0; row < 2 * rows; row++) {
		kvmem_bf16_to_f32_n(w, xb + row * D, D);
		kvmem_fp8_quant_row(qa, &sa, w, D);
		assert_int_equal(kvmem_fp8_quant_rows(qb, &sb, xb + row * D, KVMEM_DTYPE_BF16, 1, D), 0);
		assert_memory_equal(qa, qb, D);
		assert_true(sa == sb);
	}
	assert_int_equal(kvmem_fp8_quant_rows(pg, sc, x, KVMEM_DTYPE_F32, 2 * rows, D), 0);
	assert_int_equal(kvmem_fp8_quant_rows(pg, sc, x, KVMEM_DTYPE_F16, 1, D), -EINVAL);
	kvmem_fp8_dequant_rows_bf16(deq, pg, sc, 2 * rows, D);
	for (size_t i = 0; i < 2 * half; i++)	/* exact in bf16 */
		assert_true(kvmem_bf16_to_f32(deq[i]) ==
			    kvmem_e4m3_to_f32(pg[i]) * sc[i / D]);
	/* the same page as fp8 and as bf16, tokens 3..12 to slot 20 of layer 1 */
	{
		kvmem_gather_item a = { .k = pg + 3 * D, .v = pg + half + 3 * D, .layer = 1,
					.slot = 20, .n = 10, .head_stride = B * D,
					.dtype = KVMEM_DTYPE_FP8, .k_scale = sc + 3,
					.v_scale = sc + rows + 3, .scale_stride = B };
		kvmem_gather_item b = { .k = deq + 3 * D, .v = deq + half + 3 * D, .layer = 1,
					.slot = 20, .n = 10, .head_stride = B * D,
					.dtype = KVMEM_DTYPE_BF16 };

		assert_int_equal(kvmem_view_gather_bf16(vk1, vv1, &a, 1, L, H, D, CAP, 1e6), 0);
		assert_int_equal(kvmem_view_gather_bf16(vk2, vv2, &b, 1, L, H, D, CAP, 1e6), 0);
		assert_memory_equal(vk1, vk2, (size_t)L * H * CAP * D * 2);
		assert_memory_equal(vv1, vv2, (size_t)L * H * CAP * D * 2);
		a.k_scale = NULL;	/* fp8 without its scales: refused */
		assert_int_equal(kvmem_view_gather_bf16(vk1, vv1, &a, 1, L, H, D, CAP, 1e6), -EINVAL);
	}
	/* decode attention: 4 query heads over the page's 2 KV heads, B keys */
	for (int i = 0; i < 4 * D; i++)
		q[i] = kvmem_f32_to_bf16((float)test_rng_range(&r, -2, 2));
	assert_int_equal(kvmem_decode_kv_bf16(o1, q, pg, pg + half, sc, sc + rows, KVMEM_DTYPE_FP8,
					      B, B, 4, H, D, 0.125f), 0);
	assert_int_equal(kvmem_decode_kv_bf16(o2, q, deq, deq + half, NULL, NULL, KVMEM_DTYPE_BF16,
					      B, B, 4, H, D, 0.125f), 0);
	assert_memory_equal(o1, o2, sizeof(o1));
	/* and decode is the prefill twin's last token */
	{
		const int32_t qp = B - 1;

		assert_int_equal(kvmem_attention_kv_bf16(o2, q, &qp, 1, pg, pg + half, sc, sc + rows,
							 KVMEM_DTYPE_FP8, B, B, 4, H, D, 0.125f), 0);
		assert_memory_equal(o1, o2, sizeof(o1));
	}
	test_prefill_twin(pg, deq, sc, B, H, D, &r);
	free(x);
	free(xb);
	free(deq);
	free(pg);
	free(vk1);
	free(vv1);
	free(vk2);
	free(vv2);
}

/* The K row of an fp8 view (the cuda backend's; kvmem_fp8_view_k_row):
 * the raw row dequantised and rotated at the slot, within half an e4m3
 * step of the exact rotation at scale 2s, and never saturated; the same
 * rows at scale s would saturate (why the view doubles it). The put twin
 * is the host's page quantisation, then that row. */
static void test_view_rows(void **state)
{
	uint64_t r = g_seed ^ 0xf8e3;
	const int D = 128;
	const double theta = 1e6;
	int saturated_at_s = 0;

	for (int it = 0; it < 400; it++) {
		float x[128], rot[128], back[128], sk, s2;
		uint8_t raw[128], q[128];
		const int32_t pos = test_rng_int(&r, 0, 1 << 20);
		const int e = test_rng_int(&r, -30, 30);

		for (int i = 0; i < D; i++)
			x[i] = (float)ldexp(test_rng_range(&r, -1, 1), e);
		if (it % 4 == 0)	/* rows whose largest values share a rotary pair */
			x[3] = x[3 + D / 2] = (float)ldexp(1.75, e);	/* 448 s each */
		kvmem_fp8_quant_row(raw, &sk, x, D);
		kvmem_fp8_dequant_row(rot, raw, sk, D);
		kvmem_rope(rot, &pos, 1, 1, D, theta);
		kvmem_fp8_view_k_row(q, &s2, raw, sk, pos, D, theta);
		assert_true(s2 == 2 * sk);
		kvmem_fp8_dequant_row(back, q, s2, D);
		for (int i = 0; i < D; i++) {
			const double y = rot[i], err = fabs((double)back[i] - y);

			/* the fp32 rotation (cpu) against the double one (the twin):
			 * a few fp32 ulps beside half an e4m3 step */
			if (err > 0x1p-4 * fabs(y) + 0x1p-10 * s2 + 0x1p-20 * sk * 448)
				fail_msg("view K row %d dim %d: %g against %g (scale %g)", it, i,
					 back[i], y, s2);
			assert_true((q[i] & 0x7f) != 0x7e);	/* 448: saturated */
			saturated_at_s |= fabs(y) / sk > 448;
		}
	}
	assert_true(saturated_at_s);
	{
		uint16_t rows[2][2 * 64];	/* [token][K heads | V heads], 2 heads of 32 */
		uint8_t vk[2 * 7 * 32], vv[2 * 7 * 32], q[32];	/* 2 heads x 7 slots */
		float ks[2 * 7], vs[2 * 7], x[32], sc;
		const kvmem_scatter_item item = { .layer = 0, .slot = 5, .n = 2 };

		for (int t = 0; t < 2; t++)
			for (int i = 0; i < 2 * 64; i++)
				rows[t][i] = kvmem_f32_to_bf16((float)test_rng_range(&r, -3, 3));
		memset(vk, 0, sizeof(vk));
		kvmem_fp8_view_put(vk, vv, ks, vs, NULL, NULL, rows[0], rows[0] + 64, 2 * 64, &item, 2, 2, 32, 7,
				   theta);
		for (int t = 0; t < 2; t++)
			for (int h = 0; h < 2; h++) {
				const size_t d = (size_t)h * 7 + 5 + t;
				uint8_t raw[32], kq[32];
				float kss, k2;

				kvmem_bf16_to_f32_n(x, rows[t] + 64 + h * 32, 32);
				kvmem_fp8_quant_row(q, &sc, x, 32);
				assert_memory_equal(vv + d * 32, q, 32);
				assert_true(vs[d] == sc);
				kvmem_bf16_to_f32_n(x, rows[t] + h * 32, 32);
				kvmem_fp8_quant_row(raw, &kss, x, 32);
				kvmem_fp8_view_k_row(kq, &k2, raw, kss, 5 + t, 32, theta);
				assert_memory_equal(vk + d * 32, kq, 32);
				assert_true(ks[d] == k2);
			}
	}
}

/*
 * tools/train/e4m3_fixture.txt: what kvmem_e4m3_to_f32, kvmem_f32_to_e4m3,
 * kvmem_fp8_row_scale and kvmem_fp8_roundtrip_rows give for fixed inputs
 * (every code; every code's value, the midpoints after it and a hair either
 * side; the special values; deterministic pseudo-random values; rows with
 * the scale's edge cases). train.py's fake quantisation (--kv-fp8) checks
 * itself against the same file in its --self-test, so the two agree bit for
 * bit through it. Run from the repository root; KVMEM_FP8_FIXTURE_WRITE=1
 * writes the file instead of comparing (only after a deliberate change to
 * the format or to the inputs below).
 */
#define FIXTURE_PATH "tools/train/e4m3_fixture.txt"

struct fixbuf {
	char *s;
	size_t n, cap;
};

static void fix_printf(struct fixbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->cap - b->n < 4096) {
		b->cap = b->cap * 2 + 65536;
		b->s = realloc(b->s, b->cap);
		assert_non_null(b->s);
	}
	va_start(ap, fmt);
	n = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
	va_end(ap);
	assert_true(n >= 0 && (size_t)n < b->cap - b->n);
	b->n += (size_t)n;
}

static void fix_encode(struct fixbuf *b, float x)
{
	fix_printf(b, "encode %08x %02x\n", f32_bits(x), kvmem_f32_to_e4m3(x));
}

static void fix_row(struct fixbuf *b, const float *x, int n)
{
	float y[64];

	assert_true(n <= 64);
	memcpy(y, x, sizeof(float) * (size_t)n);
	kvmem_fp8_roundtrip_rows(y, 1, n);
	fix_printf(b, "row %08x", f32_bits(kvmem_fp8_row_scale(x, n)));
	for (int i = 0; i < n; i++)
		fix_printf(b, "%c%08x", i ? ',' : ' ', f32_bits(x[i]));
	for (int i = 0; i < n; i++)
		fix_printf(b, "%c%08x", i ? ',' : ' ', f32_bits(y[i]));
	fix_printf(b, "\n");
}

/* A fixed generator (not the run's seed: the file is fixed). */
static uint32_t fix_rand(uint64_t *r)
{
	*r = *r * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(*r >> 33);
}

static float fix_value(uint64_t *r, int lo, int hi)
{
	const float m = 1.0f + (float)(fix_rand(r) & 0xfffff) / 0x100000;
	const int neg = fix_rand(r) & 1, e = lo + (int)(fix_rand(r) % (uint32_t)(hi - lo + 1));

	return ldexpf(neg ? -m : m, e);
}

static void test_train_fixture(void **state)
{
	static const uint32_t special[] = {
		0x00000000, 0x80000000, 0x7fc00000, 0xffc00000, 0x7f800000, 0xff800000,
		0x7f7fffff, 0xff7fffff, 0x00000001, 0x80000001, 0x00800000, 0x3a800000,
	};
	static const float edges[] = {
		448.0f, -448.0f, 449.0f, 464.0f, 480.0f, 1e30f, -3e38f, 447.99997f,
		0x1p-6f, 0x1.fffffep-7f, 0x1p-9f, 0x1p-10f, 0x3p-10f, 0x5p-10f, 0x7p-10f,
		0xfp-10f, 0x1.000002p-10f, 0x1.fffffep-11f, 0x1p-140f, -0x1p-140f,
	};
	struct fixbuf b = { 0 };
	uint64_t r = 0x6b766d656d;	/* "kvmem" */
	float row[64];
	FILE *f;

	fix_printf(&b, "# e4m3 fixture: kernels/cpu/fp8.c's answers, written by build/tests/test_fp8\n"
		   "# (test_train_fixture) and read by tools/train/train.py --self-test.\n"
		   "# decode CODE F32 | encode F32 CODE | row SCALE IN,... OUT,... (roundtrip);\n"
		   "# F32 as its bits in hex.\n");
	for (int c = 0; c < 256; c++)
		fix_printf(&b, "decode %02x %08x\n", c,
			   f32_bits(kvmem_e4m3_to_f32((uint8_t)c)));
	for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); i++)
		fix_encode(&b, bits_f32(special[i]));
	for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++)
		fix_encode(&b, edges[i]);
	for (int c = 0; c < 0x7e; c++) {
		float lo = kvmem_e4m3_to_f32((uint8_t)c), hi = kvmem_e4m3_to_f32((uint8_t)(c + 1));
		float mid = (lo + hi) / 2;	/* exact */

		fix_encode(&b, lo);
		fix_encode(&b, mid);
		fix_encode(&b, -mid);
		fix_encode(&b, nextafterf(mid, 0));
		fix_encode(&b, nextafterf(mid, INFINITY));
	}
	for (int i = 0; i < 300; i++)
		fix_encode(&b, fix_value(&r, -14, 9));

	/* Rows: amax at the scale's edges, zeros, -0, NaN and infinity among
	 * finite values, all NaN, fp32 subnormals (the clamp at 2^-126), near
	 * fp32's largest (the clamp at 2^120, then saturation), and random
	 * rows of 8 and 64 at K's and V's magnitudes. */
	static const float rows8[][8] = {
		{ 448.0f, 1.0f, -3.5f, 0.1f, 200.0f, -0.0f, 7.0f, 0.01f },
		{ 448.00003f, 1.0f, -3.5f, 0.1f, 200.0f, 0.0f, 7.0f, 0.01f },
		{ 224.0f, -1.0f, 3.5f, 0.1f, 2e-3f, 0.0f, -7.0f, 0.01f },
		{ -224.00002f, -1.0f, 3.5f, 0.1f, 2e-3f, 0.0f, -7.0f, 0.01f },
		{ 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f },
		{ -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f },
		{ NAN, 0.5f, -0.25f, INFINITY, 0.125f, -INFINITY, 3.0f, -NAN },
		{ NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN },
		{ INFINITY, -INFINITY, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f },
		{ 0x1p-140f, -0x1p-149f, 0x1p-130f, 0.0f, -0x1.8p-127f, 0x1p-126f, 0x1p-145f, 0.0f },
		{ 3e38f, -1e38f, 1e36f, 1.0f, -5e37f, 0.0f, 2.5e38f, 1e30f },
		{ 3.4028235e38f, -3.4028235e38f, 1e38f, -1.0f, 0.0f, 1e37f, 2e38f, 3e38f },
		{ 0.875f, 0.4375f, -0.21875f, 0.1f, 0.05f, -0.9f, 0.3f, 1e-6f },
	};
	for (size_t i = 0; i < sizeof(rows8) / sizeof(rows8[0]); i++)
		fix_row(&b, rows8[i], 8);
	for (int i = 0; i < 12; i++) {
		const int n = i & 1 ? 64 : 8, lo = -8 + 3 * (i / 2);

		for (int j = 0; j < n; j++)
			row[j] = fix_value(&r, lo - 10, lo);
		fix_row(&b, row, n);
	}

	if (getenv("KVMEM_FP8_FIXTURE_WRITE")) {
		f = fopen(FIXTURE_PATH, "w");
		assert_non_null(f);
		assert_int_equal(fwrite(b.s, 1, b.n, f), b.n);
		assert_int_equal(fclose(f), 0);
		print_message("wrote %s (%zu bytes)\n", FIXTURE_PATH, b.n);
	} else {
		char *have = malloc(b.n + 2);
		size_t got, line = 1, at = 0;

		assert_non_null(have);
		f = fopen(FIXTURE_PATH, "r");
		if (!f)
			fail_msg("%s: %s (run from the repository root)", FIXTURE_PATH, strerror(errno));
		got = fread(have, 1, b.n + 1, f);
		fclose(f);
		while (at < got && at < b.n && have[at] == b.s[at])
			line += b.s[at++] == '\n';
		if (got != b.n || at != b.n)
			fail_msg("%s differs from what kernels/cpu/fp8.c gives at line %zu (%zu bytes, "
				 "want %zu)", FIXTURE_PATH, line, got, b.n);
		free(have);
	}
	free(b.s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decode_every_code),
		cmocka_unit_test(test_encode_codes_and_midpoints),
		cmocka_unit_test(test_encode_random),
		cmocka_unit_test(test_special_values),
		cmocka_unit_test(test_encode_every_bit_pattern),
		cmocka_unit_test(test_row_scales),
		cmocka_unit_test(test_quant_row_lanes),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_twins),
		cmocka_unit_test(test_view_rows),
		cmocka_unit_test(test_train_fixture),
	};

	g_seed = test_rng_fresh_seed("test_fp8");
	if (getenv("KVMEM_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KVMEM_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}

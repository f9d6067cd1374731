// SPDX-License-Identifier: MIT
/*
 * The cpu backend's research knob KVMEM_CPU_KV_ROUND (kernels/cpu/
 * fp8_round.c, user/backend/cpu.c), on fresh random inputs (the seed is
 * printed; KVMEM_TEST_SEED replays it):
 *  - every mode's name parses to it; "" means none; any other value is an
 *    error that names the knob and lists the values;
 *  - each mode rounds as it says: bf16 is kvmem_f32_to_bf16 per value, fp8
 *    is kvmem_fp8_roundtrip_rows, fp8-k / fp8-v round K / V alone and leave
 *    the other's bits, fp8-g32 / -g16 are the row round trip per run of 32 /
 *    16 channels, int8 is a uniform grid of the row's largest magnitude / 127
 *    (within half a step of each value, the largest kept);
 *  - a finer scale never errs more, value by value, than a coarser one
 *    (g16 <= g32 <= a scale a row), and errs strictly less in all on rows
 *    with an outlier channel 10^4-10^5 times the rest;
 *  - fp8-kc / fp8-kc-k: K rows as one block, m (their mean per channel)
 *    plus e4m3 of each row less m, a scale a row (hand-made rows with an
 *    exact answer; random blocks against the primitives); V as fp8 / kept;
 *    a run of tokens centres the blocks it holds whole, per head, and
 *    rounds a part block's rows as fp8; on rows sharing large channel
 *    offsets the centred rows err less in all than fp8 a row;
 *  - the backend: with the knob set, every view slot of a forward pass is
 *    the raw row the pass returned rounded by the mode (K then rotated at
 *    its slot), and a page of those raw rows placed into another view gives
 *    the same bits; for the centred modes the forward centres the blocks of
 *    32 slots it holds whole, a page placed whole is centred, a part of a
 *    page is fp8 a row, and a move re-rotates the centred raw K; the knob
 *    with --kv-dtype fp8 or a bad value refuses to open the backend, with a
 *    message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"
#include "helpers/test_model.h"

static uint64_t g_seed;

static const char *const mode_names[] = { "none", "bf16", "fp8", "fp8-k", "fp8-v", "fp8-g32",
					  "fp8-g16", "int8", "fp8-kc", "fp8-kc-k" };
#define N_MODES 10
#define N_ROW_MODES 8	/* the modes a row alone decides (the centred ones follow) */

/* n values of a row: magnitudes over a few binades, and with outlier 1 a
 * channel 10-100 times the rest, with 2 one 10^4-10^5 times (the rest of
 * its row falls below e4m3's normal range at the row's scale). */
static void random_row(uint64_t *rng, float *x, int n, int outlier)
{
	for (int i = 0; i < n; i++)
		x[i] = (float)(test_rng_range(rng, -1.0, 1.0) * ldexp(1.0, test_rng_int(rng, -3, 2)));
	if (outlier)
		x[test_rng_int(rng, 0, n - 1)] = (float)(test_rng_range(rng, 10.0, 100.0) *
							 (outlier == 2 ? 1e3 : 1.0));
}

static void test_parse(void **state)
{
	(void)state;
	for (int m = 0; m < N_MODES; m++) {
		assert_int_equal(kvmem_kv_round_parse(mode_names[m]), m);
		assert_string_equal(kvmem_kv_round_name(m), mode_names[m]);
	}
	assert_int_equal(kvmem_kv_round_parse(""), KVMEM_KV_ROUND_NONE);
	assert_int_equal(kvmem_kv_round_parse(NULL), KVMEM_KV_ROUND_NONE);
	for (int i = 0; i < 4; i++) {
		static const char *const bad[] = { "fp9", "FP8", "fp8-g8", "bf16 " };

		assert_int_equal(kvmem_kv_round_parse(bad[i]), -EINVAL);
		assert_non_null(strstr(kvmem_last_error(), "KVMEM_CPU_KV_ROUND"));
		assert_non_null(strstr(kvmem_last_error(), bad[i]));
		assert_non_null(strstr(kvmem_last_error(), "fp8-g16"));
		assert_non_null(strstr(kvmem_last_error(), "int8"));
		assert_non_null(strstr(kvmem_last_error(), "fp8-kc-k"));
	}
}

/* The centred block built by hand: the mean in double, then the row
 * round trip of each residual. */
static void centred_by_hand(float *x, int rows, int ld, int n)
{
	float m[128], d[128];

	for (int i = 0; i < n; i++) {
		double sum = 0;

		for (int r = 0; r < rows; r++)
			sum += x[r * ld + i];
		m[i] = (float)(sum / rows);
	}
	for (int r = 0; r < rows; r++) {
		for (int i = 0; i < n; i++)
			d[i] = x[r * ld + i] - m[i];
		kvmem_fp8_roundtrip_rows(d, 1, n);
		for (int i = 0; i < n; i++)
			x[r * ld + i] = m[i] + d[i];
	}
}

/* mode on K and V rows against the rounding it names, built from the
 * primitives by hand. */
static void test_modes_round_as_said(void **state)
{
	uint64_t rng = test_rng_named(g_seed, "modes");
	static const int dims[] = { 64, 128, 16, 48 };

	(void)state;
	for (int trial = 0; trial < 200; trial++) {
		const int n = dims[trial % 4], rows = test_rng_int(&rng, 1, 5);
		float x[5 * 128], k[5 * 128], v[5 * 128], want[5 * 128];
		const size_t sz = sizeof(float) * rows * n;

		for (int r = 0; r < rows; r++)
			random_row(&rng, x + r * n, n, test_rng_int(&rng, 0, 2));
		for (int m = 0; m < N_MODES; m++) {
			memcpy(k, x, sz);
			memcpy(v, x, sz);
			kvmem_kv_round_rows(k, rows, n, m, 0);
			kvmem_kv_round_rows(v, rows, n, m, 1);
			for (int is_v = 0; is_v < 2; is_v++) {
				memcpy(want, x, sz);
				switch (m) {
				case KVMEM_KV_ROUND_BF16:
					for (int i = 0; i < rows * n; i++)
						want[i] = kvmem_bf16_to_f32(kvmem_f32_to_bf16(x[i]));
					break;
				case KVMEM_KV_ROUND_FP8:
					kvmem_fp8_roundtrip_rows(want, rows, n);
					break;
				case KVMEM_KV_ROUND_FP8_K:
				case KVMEM_KV_ROUND_FP8_V:
					if (is_v == (m == KVMEM_KV_ROUND_FP8_V))
						kvmem_fp8_roundtrip_rows(want, rows, n);
					break;
				case KVMEM_KV_ROUND_FP8_G32:
				case KVMEM_KV_ROUND_FP8_G16: {
					const int g = m == KVMEM_KV_ROUND_FP8_G32 ? 32 : 16;

					for (int r = 0; r < rows; r++)
						for (int c = 0; c < n; c += g)
							kvmem_fp8_roundtrip_rows(want + r * n + c, 1,
										 n - c < g ? n - c : g);
					break;
				}
				case KVMEM_KV_ROUND_FP8_KC:
				case KVMEM_KV_ROUND_FP8_KC_K:
					if (!is_v)
						centred_by_hand(want, rows, n, n);
					else if (m == KVMEM_KV_ROUND_FP8_KC)
						kvmem_fp8_roundtrip_rows(want, rows, n);
					break;
				case KVMEM_KV_ROUND_INT8:
					for (int r = 0; r < rows; r++) {
						float amax = 0.0f;

						for (int i = 0; i < n; i++)
							amax = fmaxf(amax, fabsf(x[r * n + i]));
						for (int i = 0; i < n; i++) {
							const float s = amax / 127.0f;
							float *w = want + r * n + i;

							*w = rintf(x[r * n + i] / s) * s;
							assert_true(fabsf(*w - x[r * n + i]) <= 0.5f * s * 1.0001f);
							if (fabsf(x[r * n + i]) == amax)
								assert_true(fabsf(*w) == 127.0f * s);
						}
					}
					break;
				default:
					break;
				}
				assert_memory_equal(is_v ? v : k, want, sz);
			}
		}
	}
}

/* A finer scale: never a larger error, value by value (the coarse grid,
 * up to the group's largest value, is part of the fine one); less in all
 * on a row whose outlier channel pushes the rest of the row below e4m3's
 * normal range. A power-of-two scale moves no value within the normal
 * range: its relative step (2^-3) is the same at every scale, so an
 * outlier 10-100 times the rest may cost nothing more. */
static void test_finer_scale_errs_less(void **state)
{
	uint64_t rng = test_rng_named(g_seed, "finer");

	(void)state;
	for (int trial = 0; trial < 500; trial++) {
		const int n = trial % 2 ? 128 : 64, outlier = trial % 3;
		float x[128], row[128], g32[128], g16[128];
		double e_row = 0, e_g32 = 0, e_g16 = 0;

		random_row(&rng, x, n, outlier);
		memcpy(row, x, sizeof(x));
		memcpy(g32, x, sizeof(x));
		memcpy(g16, x, sizeof(x));
		kvmem_kv_round_rows(row, 1, n, KVMEM_KV_ROUND_FP8, 0);
		kvmem_kv_round_rows(g32, 1, n, KVMEM_KV_ROUND_FP8_G32, 1);
		kvmem_kv_round_rows(g16, 1, n, KVMEM_KV_ROUND_FP8_G16, 0);
		for (int i = 0; i < n; i++) {
			const double a = fabs((double)row[i] - x[i]), b = fabs((double)g32[i] - x[i]),
				     c = fabs((double)g16[i] - x[i]);

			assert_true(c <= b);
			assert_true(b <= a);
			e_row += a * a;
			e_g32 += b * b;
			e_g16 += c * c;
		}
		if (outlier == 2) {
			assert_true(e_g32 < e_row);
			assert_true(e_g16 < e_row);
		}
	}
}

static kvmem_model *small_model(uint64_t *rng)
{
	/* head_dim 64 as the shipped model's: a scale per 16 or 32 channels
	 * divides it; 40 does not divide by 32 (the last group is shorter). */
	const int hd = test_rng_int(rng, 0, 1) ? 64 : 40;
	kvmem_config c = test_model_config(2, 32, 4, 2, hd, 48, 61, 1);

	return test_model_random(&c, (uint64_t)test_rng_int(rng, 1, 1 << 30));
}

static int open_cpu(const kvmem_model *m, int chunk, uint32_t kv, kvmem_backend **b)
{
	return kvmem_backend_open("cpu", m, &(kvmem_backend_opts){ .max_chunk = chunk,
								   .kv_dtype = kv }, b);
}

/* Layer l of the forward's raw rows ([L][n][H][D] f32) as a page's K and V
 * ([H][n][D]), the layout place() takes. */
static void rows_to_page(float *pk, float *pv, const float *rk, const float *rv, int l, int n,
			 int H, int D)
{
	for (int h = 0; h < H; h++)
		for (int t = 0; t < n; t++) {
			size_t src = (((size_t)l * n + t) * H + h) * D;

			memcpy(pk + ((size_t)h * n + t) * D, rk + src, sizeof(float) * D);
			memcpy(pv + ((size_t)h * n + t) * D, rv + src, sizeof(float) * D);
		}
}

/* Each mode end to end: the view a forward pass fills, and a page placed. */
static void test_backend_rounds(void **state)
{
	uint64_t rng = test_rng_named(g_seed, "backend");

	(void)state;
	for (int m = 0; m < N_ROW_MODES; m++) {
		kvmem_model *mod = small_model(&rng);
		const kvmem_config *c = &mod->cfg;
		const int L = c->n_layers, H = c->n_kv_heads, D = c->head_dim, n = 24;
		const size_t rows = (size_t)L * n * H * D;
		float *rk = malloc(sizeof(float) * rows), *rv = malloc(sizeof(float) * rows);
		float *pk = malloc(sizeof(float) * H * n * D), *pv = malloc(sizeof(float) * H * n * D);
		float *logits = malloc(sizeof(float) * c->vocab), want[128];
		kvmem_fwd_out out = { .raw_k = rk, .v = rv };
		kvmem_view *a, *p;
		kvmem_backend *b;
		int32_t tok[24];
		int changed = 0;

		for (int i = 0; i < n; i++)
			tok[i] = test_rng_int(&rng, 0, c->vocab - 1);
		assert_int_equal(setenv("KVMEM_CPU_KV_ROUND", mode_names[m], 1), 0);
		if (open_cpu(mod, 32, 0, &b) < 0)
			fail_msg("mode %s: %s", mode_names[m], kvmem_last_error());
		assert_int_equal(b->ops->view_create(b->ctx, &a), 0);
		assert_int_equal(b->ops->view_create(b->ctx, &p), 0);
		assert_int_equal(b->ops->reserve(b->ctx, a, n), 0);
		assert_int_equal(b->ops->reserve(b->ctx, p, n), 0);
		assert_int_equal(kvmem_backend_append_out(b, a, tok, n, logits, 0, &out), 0);
		const kvmem_kvcache *va = b->ops->host_view(b->ctx, a), *vp = b->ops->host_view(b->ctx, p);

		for (int l = 0; l < L; l++) {
			/* the raw rows as an f32 page [H][n][D], placed at slot 0 */
			rows_to_page(pk, pv, rk, rv, l, n, H, D);
			kvmem_place it = { .block = l, .layer = l, .u0 = 0, .n = n, .stride = n,
					   .slot = 0,
					   .page = { .k = pk, .v = pv, .dtype = KVMEM_DTYPE_F32,
						     .mem = KVMEM_MEM_HOST } };

			assert_int_equal(b->ops->place(b->ctx, p, &it, 1), 0);
			for (int h = 0; h < H; h++)
				for (int t = 0; t < n; t++) {
					const size_t src = (((size_t)l * n + t) * H + h) * D;
					int32_t pos = t;

					memcpy(want, rv + src, sizeof(float) * D);
					kvmem_kv_round_rows(want, 1, D, m, 1);
					changed += memcmp(want, rv + src, sizeof(float) * D) != 0;
					assert_memory_equal(kvmem_kv_v(va, l, h, t), want, sizeof(float) * D);
					assert_memory_equal(kvmem_kv_v(vp, l, h, t), want, sizeof(float) * D);
					memcpy(want, rk + src, sizeof(float) * D);
					kvmem_kv_round_rows(want, 1, D, m, 0);
					changed += memcmp(want, rk + src, sizeof(float) * D) != 0;
					kvmem_rope(want, &pos, 1, 1, D, c->rope_theta);
					assert_memory_equal(kvmem_kv_k(va, l, h, t), want, sizeof(float) * D);
					assert_memory_equal(kvmem_kv_k(vp, l, h, t), want, sizeof(float) * D);
				}
		}
		/* the rows handed back are the raw ones: a mode changes them */
		if (m == KVMEM_KV_ROUND_NONE)
			assert_int_equal(changed, 0);
		else
			assert_true(changed > 0);
		b->ops->view_destroy(b->ctx, a);
		b->ops->view_destroy(b->ctx, p);
		kvmem_backend_close(b);
		test_model_free(mod);
		free(rk);
		free(rv);
		free(pk);
		free(pv);
		free(logits);
	}
	unsetenv("KVMEM_CPU_KV_ROUND");
}

/* Two rows whose channel 0 shares 100.3: the mean (100.3, 1.0, 0, 0) is
 * kept, the residuals +-0.1 (scale 2^-12, 409.6 -> e4m3 416) give
 * 1.0 +- 0.1015625; fp8 a row (scale 2^-2) gives 104 and 1.125 / 0.875. */
static void test_centred_exact(void **state)
{
	float k[8] = { 100.3f, 1.1f, 0, 0, 100.3f, 0.9f, 0, 0 }, v[8], plain[8];
	const float want_k[8] = { 100.3f, 1.1015625f, 0, 0, 100.3f, 0.8984375f, 0, 0 };
	const float want_plain[8] = { 104.0f, 1.125f, 0, 0, 104.0f, 0.875f, 0, 0 };

	(void)state;
	memcpy(v, k, sizeof(k));
	memcpy(plain, k, sizeof(k));
	kvmem_kv_round_rows(k, 2, 4, KVMEM_KV_ROUND_FP8_KC, 0);
	assert_memory_equal(k, want_k, sizeof(k));
	kvmem_kv_round_rows(plain, 2, 4, KVMEM_KV_ROUND_FP8, 0);
	assert_memory_equal(plain, want_plain, sizeof(k));
	kvmem_kv_round_rows(v, 2, 4, KVMEM_KV_ROUND_FP8_KC, 1);	/* V: fp8 a row */
	assert_memory_equal(v, want_plain, sizeof(k));
	memcpy(v, want_plain, sizeof(v));
	kvmem_kv_round_rows(v, 2, 4, KVMEM_KV_ROUND_FP8_KC_K, 1);	/* V kept */
	assert_memory_equal(v, want_plain, sizeof(v));
	/* one row is its own mean: kept exactly */
	memcpy(k, (float[4]){ 100.3f, 1.1f, -7.7f, 0 }, sizeof(float) * 4);
	kvmem_fp8_centred_roundtrip(k, 1, 4, 4);
	assert_memory_equal(k, ((float[4]){ 100.3f, 1.1f, -7.7f, 0 }), sizeof(float) * 4);
}

/* A run [n_tok][heads][n] at slot pos0, blocks of 4: whole blocks centred
 * per head, the others fp8 a row; a row mode is kvmem_kv_round_rows. */
static void test_centred_run(void **state)
{
	uint64_t rng = test_rng_named(g_seed, "run");

	(void)state;
	for (int trial = 0; trial < 200; trial++) {
		const int heads = test_rng_int(&rng, 1, 3), n = trial % 2 ? 16 : 8, B = 4;
		const int n_tok = test_rng_int(&rng, 1, 13), pos0 = test_rng_int(&rng, 0, 9);
		const int ld = heads * n, mode = trial % 3 ? KVMEM_KV_ROUND_FP8_KC : KVMEM_KV_ROUND_INT8;
		float x[13 * 3 * 16], got[13 * 3 * 16], want[13 * 3 * 16];
		const size_t sz = sizeof(float) * n_tok * ld;

		for (int r = 0; r < n_tok * heads; r++)
			random_row(&rng, x + r * n, n, test_rng_int(&rng, 0, 1));
		memcpy(got, x, sz);
		memcpy(want, x, sz);
		kvmem_kv_round_k_run(got, n_tok, heads, n, pos0, B, mode);
		if (mode == KVMEM_KV_ROUND_INT8) {
			kvmem_kv_round_rows(want, (size_t)n_tok * heads, n, mode, 0);
		} else {
			for (int t = 0; t < n_tok; t++) {
				const int p = pos0 + t, b0 = p - p % B;

				if (b0 >= pos0 && b0 + B <= pos0 + n_tok) {
					if (p == b0)	/* the block's first row: centre it */
						for (int h = 0; h < heads; h++)
							centred_by_hand(want + t * ld + h * n, B, ld, n);
				} else {
					kvmem_fp8_roundtrip_rows(want + t * ld, (size_t)heads, n);
				}
			}
		}
		assert_memory_equal(got, want, sz);
	}
}

/* Rows of a block sharing channel offsets 10-100 times their spread:
 * centred, the block errs less in all than fp8 a row. */
static void test_centred_errs_less(void **state)
{
	uint64_t rng = test_rng_named(g_seed, "centred");

	(void)state;
	for (int trial = 0; trial < 200; trial++) {
		const int n = trial % 2 ? 64 : 128, rows = test_rng_int(&rng, 2, 32);
		float off[128], x[32 * 128], c[32 * 128], p[32 * 128];
		double e_c = 0, e_p = 0;

		for (int i = 0; i < n; i++)
			off[i] = (float)(test_rng_range(&rng, -1.0, 1.0) *
					 test_rng_range(&rng, 10.0, 100.0));
		for (int r = 0; r < rows; r++)
			for (int i = 0; i < n; i++)
				x[r * n + i] = off[i] + (float)test_rng_range(&rng, -1.0, 1.0);
		memcpy(c, x, sizeof(float) * rows * n);
		memcpy(p, x, sizeof(float) * rows * n);
		kvmem_kv_round_rows(c, rows, n, KVMEM_KV_ROUND_FP8_KC_K, 0);
		kvmem_kv_round_rows(p, rows, n, KVMEM_KV_ROUND_FP8, 0);
		for (int i = 0; i < rows * n; i++) {
			e_c += ((double)c[i] - x[i]) * ((double)c[i] - x[i]);
			e_p += ((double)p[i] - x[i]) * ((double)p[i] - x[i]);
		}
		assert_true(e_c < 0.1 * e_p);
	}
}

/* The expected K of slot t: row (raw, copied) rounded as `how` says and
 * rotated at pos. */
static void expect_k(float *want, const float *raw, int D, int32_t pos, double theta)
{
	memcpy(want, raw, sizeof(float) * D);
	kvmem_rope(want, &pos, 1, 1, D, theta);
}

/* The centred modes in the backend: 40 tokens in one forward (chunk 64):
 * slots 0..31 one whole block, centred per head; 32..39 fp8 a row. A page
 * of the raw rows (stride 40) placed whole: centred over its 40 rows; its
 * tokens 8..23 placed alone: fp8 a row. A move re-rotates the kept raw K,
 * the centred one. */
static void test_backend_centred(void **state)
{
	uint64_t rng = test_rng_named(g_seed, "backend-centred");

	(void)state;
	for (int m = KVMEM_KV_ROUND_FP8_KC; m <= KVMEM_KV_ROUND_FP8_KC_K; m++) {
		kvmem_model *mod = small_model(&rng);
		const kvmem_config *c = &mod->cfg;
		const int L = c->n_layers, H = c->n_kv_heads, D = c->head_dim, n = 40;
		const size_t rows = (size_t)L * n * H * D;
		float *rk = malloc(sizeof(float) * rows), *rv = malloc(sizeof(float) * rows);
		float *pk = malloc(sizeof(float) * H * n * D), *pv = malloc(sizeof(float) * H * n * D);
		float *ek = malloc(sizeof(float) * H * n * D), *ev = malloc(sizeof(float) * H * n * D);
		float *logits = malloc(sizeof(float) * c->vocab), want[128];
		kvmem_fwd_out out = { .raw_k = rk, .v = rv };
		kvmem_view *a, *p, *q;
		kvmem_backend *b;
		int32_t tok[40];

		for (int i = 0; i < n; i++)
			tok[i] = test_rng_int(&rng, 0, c->vocab - 1);
		assert_int_equal(setenv("KVMEM_CPU_KV_ROUND", mode_names[m], 1), 0);
		if (open_cpu(mod, 64, 0, &b) < 0)
			fail_msg("mode %s: %s", mode_names[m], kvmem_last_error());
		assert_int_equal(b->ops->view_create(b->ctx, &a), 0);
		assert_int_equal(b->ops->view_create(b->ctx, &p), 0);
		assert_int_equal(b->ops->view_create(b->ctx, &q), 0);
		assert_int_equal(b->ops->keep_raw(b->ctx, a), 0);
		assert_int_equal(b->ops->reserve(b->ctx, a, n + 8), 0);
		assert_int_equal(b->ops->reserve(b->ctx, p, n), 0);
		assert_int_equal(b->ops->reserve(b->ctx, q, n), 0);
		assert_int_equal(kvmem_backend_append_out(b, a, tok, n, logits, 0, &out), 0);
		const kvmem_kvcache *va = b->ops->host_view(b->ctx, a), *vp = b->ops->host_view(b->ctx, p),
				    *vq = b->ops->host_view(b->ctx, q);

		for (int l = 0; l < L; l++) {
			rows_to_page(pk, pv, rk, rv, l, n, H, D);
			kvmem_place whole = { .block = l, .layer = l, .u0 = 0, .n = n, .stride = n,
					      .slot = 0,
					      .page = { .k = pk, .v = pv, .dtype = KVMEM_DTYPE_F32,
							.mem = KVMEM_MEM_HOST } }, part = whole;

			part.u0 = 8;
			part.n = 16;
			part.slot = 8;
			assert_int_equal(b->ops->place(b->ctx, p, &whole, 1), 0);
			assert_int_equal(b->ops->place(b->ctx, q, &part, 1), 0);
			/* the forward's rounding, by hand: [H][n][D] per layer */
			memcpy(ek, pk, sizeof(float) * H * n * D);
			memcpy(ev, pv, sizeof(float) * H * n * D);
			for (int h = 0; h < H; h++) {
				float *kh = ek + (size_t)h * n * D;

				centred_by_hand(kh, 32, D, D);
				kvmem_fp8_roundtrip_rows(kh + 32 * D, 8, D);
				if (m == KVMEM_KV_ROUND_FP8_KC)
					kvmem_fp8_roundtrip_rows(ev + (size_t)h * n * D, n, D);
			}
			for (int h = 0; h < H; h++)
				for (int t = 0; t < n; t++) {
					const size_t r = ((size_t)h * n + t) * D;

					assert_memory_equal(kvmem_kv_v(va, l, h, t), ev + r, sizeof(float) * D);
					assert_memory_equal(kvmem_kv_v(vp, l, h, t), ev + r, sizeof(float) * D);
					expect_k(want, ek + r, D, t, c->rope_theta);
					assert_memory_equal(kvmem_kv_k(va, l, h, t), want, sizeof(float) * D);
				}
			/* placed whole: all 40 rows one block; in part: fp8 a row */
			memcpy(ek, pk, sizeof(float) * H * n * D);
			for (int h = 0; h < H; h++) {
				centred_by_hand(ek + (size_t)h * n * D, n, D, D);
				for (int t = 8; t < 24; t++) {
					const size_t r = ((size_t)h * n + t) * D;
					int32_t pos = t;

					memcpy(want, pk + r, sizeof(float) * D);
					kvmem_fp8_roundtrip_rows(want, 1, D);
					kvmem_rope(want, &pos, 1, 1, D, c->rope_theta);
					assert_memory_equal(kvmem_kv_k(vq, l, h, t), want, sizeof(float) * D);
				}
				for (int t = 0; t < n; t++) {
					expect_k(want, ek + ((size_t)h * n + t) * D, D, t, c->rope_theta);
					assert_memory_equal(kvmem_kv_k(vp, l, h, t), want, sizeof(float) * D);
				}
			}
		}
		/* a move: slots 0..31 of layer 0 to 8..39, K re-rotated from the
		 * kept raw K (centred), so at slot 8 + t the rotation of row t */
		assert_int_equal(b->ops->move(b->ctx, a, &(kvmem_move){ .layer = 0, .n = 32, .from = 0,
									 .to = 8 }, 1), 0);
		memcpy(ek, rk, sizeof(float) * n * H * D);	/* layer 0, [n][H][D] */
		for (int h = 0; h < H; h++)
			centred_by_hand(ek + (size_t)h * D, 32, H * D, D);
		for (int h = 0; h < H; h++)
			for (int t = 0; t < 32; t++) {
				expect_k(want, ek + ((size_t)t * H + h) * D, D, 8 + t, c->rope_theta);
				assert_memory_equal(kvmem_kv_k(va, 0, h, 8 + t), want, sizeof(float) * D);
			}
		b->ops->view_destroy(b->ctx, a);
		b->ops->view_destroy(b->ctx, p);
		b->ops->view_destroy(b->ctx, q);
		kvmem_backend_close(b);
		test_model_free(mod);
		free(rk);
		free(rv);
		free(pk);
		free(pv);
		free(ek);
		free(ev);
		free(logits);
	}
	unsetenv("KVMEM_CPU_KV_ROUND");
}

static void test_backend_refuses(void **state)
{
	uint64_t rng = test_rng_named(g_seed, "refuse");
	kvmem_model *mod = small_model(&rng);
	kvmem_backend *b = NULL;

	(void)state;
	assert_int_equal(setenv("KVMEM_CPU_KV_ROUND", "fp8-g8", 1), 0);
	assert_int_equal(open_cpu(mod, 16, 0, &b), -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "KVMEM_CPU_KV_ROUND=fp8-g8"));
	assert_int_equal(setenv("KVMEM_CPU_KV_ROUND", "bf16", 1), 0);
	assert_int_equal(open_cpu(mod, 16, KVMEM_DTYPE_FP8, &b), -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "--kv-dtype fp8"));
	/* none with fp8 is fp8 as ever */
	assert_int_equal(setenv("KVMEM_CPU_KV_ROUND", "none", 1), 0);
	if (open_cpu(mod, 16, KVMEM_DTYPE_FP8, &b) < 0)
		fail_msg("%s", kvmem_last_error());
	kvmem_backend_close(b);
	unsetenv("KVMEM_CPU_KV_ROUND");
	test_model_free(mod);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse),
		cmocka_unit_test(test_modes_round_as_said),
		cmocka_unit_test(test_finer_scale_errs_less),
		cmocka_unit_test(test_centred_exact),
		cmocka_unit_test(test_centred_run),
		cmocka_unit_test(test_centred_errs_less),
		cmocka_unit_test(test_backend_rounds),
		cmocka_unit_test(test_backend_centred),
		cmocka_unit_test(test_backend_refuses),
	};

	g_seed = test_rng_fresh_seed("test_kv_round");
	if (getenv("KVMEM_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KVMEM_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}

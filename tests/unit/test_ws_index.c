// SPDX-License-Identifier: MIT
/*
 * The index: Mean-K (and min/max, sub-block means) per (block, layer, KV
 * head), right after every append, partial block included, independent of
 * how the tokens were split into appends, across capacity growth.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "session/inspect.h"
#include "helpers/test_model.h"

static uint64_t g_seed;

struct stream {
	int L, H, D, B;
	int64_t n;
	float *k;	/* [n][L][H][D] */
};

static float *key(const struct stream *s, int64_t p, int l, int h)
{
	return s->k + (((size_t)p * s->L + l) * s->H + h) * s->D;
}

/* Tokens p0..p0+n-1 in the engine's [L][n][H][D] layout. */
static float *pack(const struct stream *s, int64_t p0, int n)
{
	float *out = malloc(sizeof(float) * (size_t)s->L * n * s->H * s->D + 1);

	for (int l = 0; l < s->L; l++)
		for (int j = 0; j < n; j++)
			for (int h = 0; h < s->H; h++)
				memcpy(out + (((size_t)l * n + j) * s->H + h) * s->D,
				       key(s, p0 + j, l, h), sizeof(float) * s->D);
	return out;
}

/* Tokens [a, z) of the stream: fp32 sum in token order / count, min, max;
 * the fp32 result must match bit for bit, the double mean closely. */
static void expect_summary(const struct stream *s, const float *mean, const float *lo,
			   const float *hi, int64_t a, int64_t z, int l, int h)
{
	float sum[512], mn[512], mx[512];
	double dsum[512];
	int D = s->D;

	for (int i = 0; i < D; i++) {
		sum[i] = 0;
		dsum[i] = 0;
		mn[i] = INFINITY;
		mx[i] = -INFINITY;
	}
	for (int64_t p = a; p < z; p++) {
		const float *k = key(s, p, l, h);

		for (int i = 0; i < D; i++) {
			sum[i] = p == a ? k[i] : sum[i] + k[i];
			dsum[i] += k[i];
			mn[i] = k[i] < mn[i] ? k[i] : mn[i];
			mx[i] = k[i] > mx[i] ? k[i] : mx[i];
		}
	}
	for (int i = 0; i < D; i++) {
		float m = sum[i] / (float)(z - a);

		assert_memory_equal(&mean[i], &m, sizeof(float));
		assert_true(fabs(mean[i] - dsum[i] / (double)(z - a)) < 1e-5);
		if (lo) {
			assert_true(lo[i] == mn[i]);
			assert_true(hi[i] == mx[i]);
		}
	}
}

static void expect_block(const struct stream *s, const kvmem_index *ix, int64_t b)
{
	int64_t a = b * s->B, z = a + kvmem_index_block_len(ix, b);

	for (int l = 0; l < s->L; l++)
		for (int h = 0; h < s->H; h++) {
			int mm = (ix->sums & KVMEM_SUM_MINMAX) != 0;

			expect_summary(s, kvmem_index_meank(ix, l, h, b),
				       mm ? kvmem_index_min(ix, l, h, b) : NULL,
				       mm ? kvmem_index_max(ix, l, h, b) : NULL, a, z, l, h);
			if (!(ix->sums & KVMEM_SUM_SUBBLOCK))
				continue;
			for (int q = 0; q < KVMEM_SUBBLOCKS; q++) {
				int len = kvmem_index_sub_len(ix, b, q);
				int64_t sa = a + (int64_t)q * ix->sub_len;

				if (len)
					expect_summary(s, kvmem_index_sub(ix, l, h, b, q), NULL, NULL,
						       sa, sa + len, l, h);
			}
		}
}

static void run_stream(uint64_t *rng, unsigned sums, int64_t n_tokens, int B)
{
	struct stream s = { .L = test_rng_int(rng, 1, 3), .H = test_rng_int(rng, 1, 3),
			    .D = 2 * test_rng_int(rng, 2, 24), .B = B, .n = n_tokens };
	kvmem_index ix, iy;
	int64_t p = 0;

	s.k = malloc(sizeof(float) * (size_t)s.n * s.L * s.H * s.D);
	for (size_t i = 0; i < (size_t)s.n * s.L * s.H * s.D; i++)
		s.k[i] = (float)test_rng_range(rng, -3, 3);
	assert_int_equal(kvmem_index_init(&ix, s.L, s.H, s.D, B, sums), 0);
	assert_int_equal(kvmem_index_init(&iy, s.L, s.H, s.D, B, sums), 0);
	while (p < s.n) {
		int n = test_rng_int(rng, 1, 3 * B);

		if (n > s.n - p)
			n = (int)(s.n - p);
		float *chunk = pack(&s, p, n);

		assert_int_equal(kvmem_index_append(&ix, chunk, n), 0);
		free(chunk);
		p += n;
		assert_int_equal(ix.n_tokens, p);
		assert_int_equal(ix.n_blocks, (p + B - 1) / B);
		/* Every block this append touched, the partial one included. */
		for (int64_t b = (p - n) / B; b < ix.n_blocks; b++)
			expect_block(&s, &ix, b);
	}
	for (int64_t b = 0; b < ix.n_blocks; b++)
		expect_block(&s, &ix, b);
	/* One token at a time gives the very same bits. */
	for (int64_t q = 0; q < s.n; q++) {
		float *one = pack(&s, q, 1);

		assert_int_equal(kvmem_index_append(&iy, one, 1), 0);
		free(one);
	}
	for (int l = 0; l < s.L; l++)
		for (int h = 0; h < s.H; h++)
			assert_memory_equal(kvmem_index_meank(&ix, l, h, 0), kvmem_index_meank(&iy, l, h, 0),
					    sizeof(float) * s.D * ix.n_blocks);
	if (!(sums & KVMEM_SUM_MINMAX))
		assert_null(ix.kmin);
	if (!(sums & KVMEM_SUM_SUBBLOCK))
		assert_null(ix.sub);
	kvmem_index_free(&ix);
	kvmem_index_free(&iy);
	free(s.k);
}

static void test_meank_incremental(void **state)
{
	uint64_t rng = g_seed;

	for (int it = 0; it < 12; it++)
		run_stream(&rng, KVMEM_SUM_MEANK, test_rng_int(&rng, 1, 900),
			   16 << test_rng_int(&rng, 0, 4));
}

static void test_minmax_and_subblocks(void **state)
{
	uint64_t rng = g_seed ^ 0xabcdef;

	for (int it = 0; it < 10; it++)
		run_stream(&rng, KVMEM_SUM_MINMAX | KVMEM_SUM_SUBBLOCK, test_rng_int(&rng, 1, 900),
			   16 << test_rng_int(&rng, 0, 4));
}

/* Past the first capacity (64 blocks) and the next: arrays re-laid right. */
static void test_index_growth(void **state)
{
	uint64_t rng = g_seed ^ 0x777;

	run_stream(&rng, KVMEM_SUM_MINMAX | KVMEM_SUM_SUBBLOCK, 16 * 140 + 5, 16);
}

static void test_index_errors(void **state)
{
	kvmem_index ix;

	assert_true(kvmem_index_init(&ix, 0, 2, 8, 32, 0) < 0);
	assert_true(kvmem_index_init(&ix, 2, 2, 8, 33, 0) < 0);
	assert_non_null(strstr(kvmem_last_error(), "block size"));
	assert_int_equal(kvmem_index_init(&ix, 2, 2, 8, 32, 0), 0);
	assert_int_equal(ix.sums, KVMEM_SUM_MEANK);
	assert_true(kvmem_index_append(&ix, NULL, -1) < 0);
	kvmem_index_free(&ix);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_meank_incremental),
		cmocka_unit_test(test_minmax_and_subblocks),
		cmocka_unit_test(test_index_growth),
		cmocka_unit_test(test_index_errors),
	};

	g_seed = test_rng_fresh_seed("test_ws_index");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

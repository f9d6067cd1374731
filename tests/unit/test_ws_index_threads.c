// SPDX-License-Identifier: MIT
/*
 * The index's append runs its layers on the OpenMP threads when a call
 * brings enough work (a prefill chunk). Appending in large chunks, on
 * 1 to 4 threads, gives the very bits of appending one token at a time
 * (always on one thread): Mean-K, min/max and sub-block means of every
 * block, partial last block included, across capacity growth.
 */
#include <omp.h>
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

/* Tokens p0..p0+n-1 of keys ([n_tok][L][H][D]) in the engine's [L][n][H][D]. */
static void pack(float *out, const float *keys, int L, int H, int D, int64_t p0, int n)
{
	const size_t row = (size_t)H * D;

	for (int l = 0; l < L; l++)
		for (int j = 0; j < n; j++)
			memcpy(out + ((size_t)l * n + j) * row, keys + ((p0 + j) * L + l) * row,
			       sizeof(float) * row);
}

static void same_array(const float *a, const float *b, size_t n)
{
	if (a || b)
		assert_memory_equal(a, b, sizeof(float) * n);
}

static void test_chunks_match_tokens(void **state)
{
	const unsigned sums = KVMEM_SUM_MEANK | KVMEM_SUM_MINMAX | KVMEM_SUM_SUBBLOCK;
	uint64_t rng = g_seed;

	for (int it = 0; it < 4; it++) {
		const int L = test_rng_int(&rng, 2, 6), H = test_rng_int(&rng, 1, 4);
		const int D = 16 * test_rng_int(&rng, 1, 8), B = 16 << test_rng_int(&rng, 0, 3);
		const int threads = test_rng_int(&rng, 1, 4);
		const size_t per = (size_t)L * H * D;
		/* 65536 values a call: the threaded path (index.c). */
		const int big_n = (int)(65536 / per) + 1, C = 2 * big_n + 64;
		const int64_t n_tok = test_rng_int(&rng, 3 * C, 6 * C);
		float *keys = malloc(sizeof(float) * n_tok * per);
		float *buf = malloc(sizeof(float) * C * per);
		kvmem_index ix, iy;
		int big = 0;

		assert_true(keys && buf);
		for (size_t i = 0; i < n_tok * per; i++)
			keys[i] = (float)test_rng_range(&rng, -3, 3);
		assert_int_equal(kvmem_index_init(&ix, L, H, D, B, sums), 0);
		assert_int_equal(kvmem_index_init(&iy, L, H, D, B, sums), 0);
		omp_set_num_threads(threads);
		for (int64_t p = 0, a = 0; p < n_tok; a++) {
			int n = test_rng_int(&rng, a % 2 ? 1 : big_n, C);

			n = n > n_tok - p ? (int)(n_tok - p) : n;
			big += (size_t)n * per >= 65536;
			pack(buf, keys, L, H, D, p, n);
			assert_int_equal(kvmem_index_append(&ix, buf, n), 0);
			p += n;
		}
		for (int64_t p = 0; p < n_tok; p++) {
			pack(buf, keys, L, H, D, p, 1);
			assert_int_equal(kvmem_index_append(&iy, buf, 1), 0);
		}
		assert_true(big > 0);
		assert_int_equal(ix.n_blocks, iy.n_blocks);
		assert_int_equal(ix.cap_blocks, iy.cap_blocks);
		same_array(ix.meank, iy.meank, per * ix.cap_blocks);
		same_array(ix.kmin, iy.kmin, per * ix.cap_blocks);
		same_array(ix.kmax, iy.kmax, per * ix.cap_blocks);
		same_array(ix.sub, iy.sub, per * ix.cap_blocks * KVMEM_SUBBLOCKS);
		same_array(ix.open_sum, iy.open_sum, per);
		same_array(ix.open_sub, iy.open_sub, per);
		kvmem_index_free(&ix);
		kvmem_index_free(&iy);
		free(keys);
		free(buf);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chunks_match_tokens),
	};

	g_seed = test_rng_fresh_seed("test_ws_index_threads");
	if (getenv("KVMEM_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KVMEM_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}

// SPDX-License-Identifier: MIT
/* The block registry: sizes, block arithmetic, the partial block, pins. */
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

static void test_block_sizes(void **state)
{
	kvmem_blocks r;

	for (int b = KVMEM_BLOCK_MIN; b <= KVMEM_BLOCK_MAX; b *= 2) {
		assert_int_equal(kvmem_blocks_init(&r, b), 0);
		assert_int_equal(r.block, b);
		assert_int_equal(1 << r.shift, b);
		kvmem_blocks_free(&r);
	}
	assert_int_equal(kvmem_blocks_init(&r, 0), 0);
	assert_int_equal(r.block, KVMEM_BLOCK_DEFAULT);
	kvmem_blocks_free(&r);
	const int bad[] = { 1, 8, 24, 48, 100, 512, -32 };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_true(kvmem_blocks_init(&r, bad[i]) < 0);
		assert_non_null(strstr(kvmem_last_error(), "power of two"));
	}
}

/* count / start / len / block_of against plain arithmetic, partial block
 * included, for random history sizes. */
static void test_block_math(void **state)
{
	uint64_t rng = g_seed;

	for (int it = 0; it < 200; it++) {
		int B = 16 << test_rng_int(&rng, 0, 4);
		kvmem_blocks r;
		int64_t total = 0;

		assert_int_equal(kvmem_blocks_init(&r, B), 0);
		r.n_tokens = test_rng_int(&rng, 0, 5000);
		for (int64_t b = 0; b < kvmem_blocks_count(&r); b++) {
			int len = kvmem_block_len(&r, b);

			assert_int_equal(kvmem_block_start(&r, b), b * B);
			assert_true(len >= 1 && len <= B);
			if (b < kvmem_blocks_count(&r) - 1)
				assert_int_equal(len, B);
			total += len;
		}
		assert_int_equal(total, r.n_tokens);
		assert_int_equal(kvmem_blocks_count(&r), (r.n_tokens + B - 1) / B);
		assert_int_equal(kvmem_block_len(&r, kvmem_blocks_count(&r)), 0);
		for (int k = 0; k < 20 && r.n_tokens; k++) {
			int64_t p = test_rng_int(&rng, 0, (int)r.n_tokens - 1);
			int64_t b = kvmem_block_of(&r, p);

			assert_true(p >= kvmem_block_start(&r, b));
			assert_true(p < kvmem_block_start(&r, b) + kvmem_block_len(&r, b));
		}
		kvmem_blocks_free(&r);
	}
}

/* Random pins and unpins against a per-token bitmap. */
static void test_pins_random(void **state)
{
	uint64_t rng = g_seed ^ 0x5555;
	enum { N = 3000 };

	for (int it = 0; it < 60; it++) {
		int B = 16 << test_rng_int(&rng, 0, 4);
		unsigned char *want = calloc(N, 1);
		kvmem_blocks r;

		assert_int_equal(kvmem_blocks_init(&r, B), 0);
		for (int op = 0; op < 40; op++) {
			int64_t s = test_rng_int(&rng, 0, N - 1);
			int64_t e = s + test_rng_int(&rng, 0, 300);

			if (e > N)
				e = N;
			if (test_rng_int(&rng, 0, 3)) {
				assert_int_equal(kvmem_blocks_pin(&r, s, e), 0);
				memset(want + s, 1, (size_t)(e - s));
			} else {
				assert_int_equal(kvmem_blocks_unpin(&r, s, e), 0);
				memset(want + s, 0, (size_t)(e - s));
			}
			/* Sorted, disjoint, not touching, and exactly the bitmap. */
			unsigned char *got = calloc(N, 1);

			for (int i = 0; i < r.n_pins; i++) {
				assert_true(r.pins[i].start < r.pins[i].end);
				if (i)
					assert_true(r.pins[i - 1].end < r.pins[i].start);
				memset(got + r.pins[i].start, 1,
				       (size_t)(r.pins[i].end - r.pins[i].start));
			}
			assert_memory_equal(got, want, N);
			free(got);
			/* Whole-block token count at a random history size. */
			int64_t n_tok = test_rng_int(&rng, 0, N), expect = 0;

			for (int64_t b = 0; b * B < n_tok; b++) {
				int64_t a = b * B, z = a + B < n_tok ? a + B : n_tok;
				int hit = 0;

				for (int64_t p = a; p < z; p++)
					hit |= want[p];
				if (hit)
					expect += z - a;
			}
			assert_int_equal(kvmem_blocks_pinned_tokens(&r, n_tok), expect);
		}
		assert_true(kvmem_blocks_pin(&r, 5, 4) < 0);
		assert_true(kvmem_blocks_pin(&r, -1, 4) < 0);
		kvmem_blocks_free(&r);
		free(want);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_block_sizes),
		cmocka_unit_test(test_block_math),
		cmocka_unit_test(test_pins_random),
	};

	g_seed = test_rng_fresh_seed("test_ws_blocks");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

// SPDX-License-Identifier: MIT
/*
 * The module's own XXH3-64 (kmod/kvmem_xxh3.c, which compiles in the kernel
 * and here) against libxxhash's XXH3_64bits: every length up to 2100 (all
 * four length classes and the block boundary at 1024), then random lengths
 * up to 300 KiB, random contents and offsets (unaligned reads).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <xxhash.h>

#include "helpers/test_model.h"
#include "../../kmod/kvmem_xxh3.c"

static uint64_t g_seed;

static void fill_random(uint64_t *rng, unsigned char *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)test_rng_next(rng);
}

static void test_every_short_length(void **state)
{
	uint64_t rng = g_seed;
	size_t max = 2100;
	unsigned char *buf = malloc(max + 8);

	(void)state;
	assert_non_null(buf);
	fill_random(&rng, buf, max + 8);
	for (size_t len = 0; len <= max; len++) {
		size_t off = len % 8;

		if (kvmem_xxh3_64(buf + off, len) != XXH3_64bits(buf + off, len))
			fail_msg("length %zu offset %zu differs (seed %llu)", len, off,
				 (unsigned long long)g_seed);
	}
	free(buf);
}

static void test_random_lengths(void **state)
{
	uint64_t rng = g_seed ^ 0x5eed;
	size_t max = 300 << 10;
	unsigned char *buf = malloc(max + 64);

	(void)state;
	assert_non_null(buf);
	for (int round = 0; round < 300; round++) {
		size_t len = test_rng_next(&rng) % (max + 1);
		size_t off = test_rng_next(&rng) % 64;

		if (round % 3 == 0)	/* page-like sizes, as the module hashes */
			len = (size_t)test_rng_int(&rng, 1, 64) * 4096 - test_rng_int(&rng, 0, 2) * 64;
		fill_random(&rng, buf + off, len);
		if (kvmem_xxh3_64(buf + off, len) != XXH3_64bits(buf + off, len))
			fail_msg("round %d: length %zu offset %zu differs (seed %llu)", round, len,
				 off, (unsigned long long)g_seed);
	}
	free(buf);
}

/* A single flipped bit changes the sum (the module relies on it). */
static void test_bit_flip_detected(void **state)
{
	uint64_t rng = g_seed ^ 0xb17;
	unsigned char buf[8192];

	(void)state;
	fill_random(&rng, buf, sizeof(buf));
	for (int i = 0; i < 200; i++) {
		size_t len = 1 + test_rng_next(&rng) % sizeof(buf);
		size_t pos = test_rng_next(&rng) % len;
		uint64_t before = kvmem_xxh3_64(buf, len);

		buf[pos] ^= (unsigned char)(1u << (test_rng_next(&rng) % 8));
		assert_true(kvmem_xxh3_64(buf, len) != before);
		assert_true(kvmem_xxh3_64(buf, len) == XXH3_64bits(buf, len));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_short_length),
		cmocka_unit_test(test_random_lengths),
		cmocka_unit_test(test_bit_flip_detected),
	};

	g_seed = test_rng_fresh_seed("test_kmod_xxh3");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

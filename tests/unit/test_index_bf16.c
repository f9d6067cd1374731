// SPDX-License-Identifier: MIT
/*
 * kvmem_index_append_bf16 (kernels/cpu/index_bf16.c, the twin of the GPU
 * index kernels/cuda/index.cu) against the workspace index it mirrors
 * (kvmem_index_append), and kvmem_index_append_rows over the same rows as
 * bf16 (the session's typed rows) likewise: fresh random raw K (bf16
 * values, as the forward pass makes them) appended in chunks of random
 * sizes. With an fp32 index
 * every summary (Mean-K, min, max, quarter-block means) and the running
 * sums equal the workspace's bit for bit; with a bf16 index each stored
 * value is the workspace's rounded once; the typed rows give the fp32
 * rows' index bit for bit. Bad geometry is refused.
 * KVMEM_TEST_SEED replays a run.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_bf16.h"
#include "kvmem/kvmem.h"
#include "session/inspect.h"
#include "helpers/test_model.h"

static uint64_t g_seed;

static void *xcalloc(size_t n, size_t sz)
{
	void *p = calloc(n ? n : 1, sz);

	assert_non_null(p);
	return p;
}

/* One run: L layers, H heads, D dims, block B, `tokens` in random chunks. */
static void run(int L, int H, int D, int B, int tokens, int dtype, uint64_t *r)
{
	const int eb = dtype == KVMEM_DTYPE_BF16 ? 2 : 4;
	const int64_t cap = (tokens + B - 1) / B;
	const size_t run_n = (size_t)L * H * cap * D, open = (size_t)L * H * D;
	kvmem_score_geom g = { .n_layers = L, .n_heads = H, .n_kv_heads = H, .head_dim = D,
			       .block = B, .cap_blocks = cap, .index_dtype = dtype };
	kvmem_index ix, ix2;
	char *m = xcalloc(run_n, eb), *lo = xcalloc(run_n, eb), *hi = xcalloc(run_n, eb);
	char *sub = xcalloc(run_n * 4, eb);
	float *os = xcalloc(open, 4), *ob = xcalloc(open, 4);
	int64_t first = 0;

	assert_int_equal(kvmem_index_init(&ix, L, H, D, B, KVMEM_SUM_MINMAX | KVMEM_SUM_SUBBLOCK), 0);
	assert_int_equal(kvmem_index_init(&ix2, L, H, D, B, KVMEM_SUM_MINMAX | KVMEM_SUM_SUBBLOCK), 0);
	while (first < tokens) {
		int n = test_rng_int(r, 1, test_rng_int(r, 0, 3) ? 3 : 2 * B + 5);
		uint16_t *k16;
		float *k32;

		if (first + n > tokens)
			n = (int)(tokens - first);
		k16 = xcalloc((size_t)L * n * H * D, 2);
		k32 = xcalloc((size_t)L * n * H * D, 4);
		for (size_t i = 0; i < (size_t)L * n * H * D; i++) {
			k16[i] = kvmem_f32_to_bf16((float)test_rng_range(r, -4, 4));
			k32[i] = kvmem_bf16_to_f32(k16[i]);
		}
		assert_int_equal(kvmem_index_append(&ix, k32, n), 0);
		/* The session's typed rows (a GPU's bf16, never widened by the
		 * caller): the bits of the fp32 rows. */
		assert_int_equal(kvmem_index_append_rows(&ix2, k16, KVMEM_DTYPE_BF16, n), 0);
		assert_int_equal(kvmem_index_append_bf16(m, lo, hi, sub, os, ob, k16, first, n, &g), 0);
		first += n;
		free(k16);
		free(k32);
	}
	for (int l = 0; l < L; l++)
		for (int h = 0; h < H; h++)
			for (int64_t b = 0; b < cap; b++) {
				const size_t at = (((size_t)l * H + h) * cap + b) * D;
				const float *wm = kvmem_index_meank(&ix, l, h, b);
				const float *wl = kvmem_index_min(&ix, l, h, b), *wh = kvmem_index_max(&ix, l, h, b);

				for (int d = 0; d < D; d++) {
					if (dtype == KVMEM_DTYPE_F32) {
						assert_memory_equal(&((float *)m)[at + d], &wm[d], 4);
						assert_memory_equal(&((float *)lo)[at + d], &wl[d], 4);
						assert_memory_equal(&((float *)hi)[at + d], &wh[d], 4);
					} else {
						assert_int_equal(((uint16_t *)m)[at + d], kvmem_f32_to_bf16(wm[d]));
						assert_int_equal(((uint16_t *)lo)[at + d], kvmem_f32_to_bf16(wl[d]));
						assert_int_equal(((uint16_t *)hi)[at + d], kvmem_f32_to_bf16(wh[d]));
					}
				}
				for (int s = 0; s < 4; s++) {
					const float *ws = kvmem_index_sub(&ix, l, h, b, s);

					if (!kvmem_index_sub_len(&ix, b, s))
						continue;	/* not begun: neither wrote it */
					for (int d = 0; d < D; d++) {
						const size_t e = (at / D * 4 + s) * D + d;

						if (dtype == KVMEM_DTYPE_F32)
							assert_memory_equal(&((float *)sub)[e], &ws[d], 4);
						else
							assert_int_equal(((uint16_t *)sub)[e],
									 kvmem_f32_to_bf16(ws[d]));
					}
				}
			}
	assert_memory_equal(os, ix.open_sum, open * 4);
	assert_memory_equal(ob, ix.open_sub, open * 4);
	assert_int_equal(ix2.n_tokens, ix.n_tokens);
	assert_int_equal(ix2.cap_blocks, ix.cap_blocks);
	{
		const size_t all = (size_t)L * H * ix.cap_blocks * D * sizeof(float);

		assert_memory_equal(ix2.meank, ix.meank, all);
		assert_memory_equal(ix2.kmin, ix.kmin, all);
		assert_memory_equal(ix2.kmax, ix.kmax, all);
		assert_memory_equal(ix2.sub, ix.sub, 4 * all);
		assert_memory_equal(ix2.open_sum, ix.open_sum, open * 4);
		assert_memory_equal(ix2.open_sub, ix.open_sub, open * 4);
	}
	assert_int_equal(kvmem_index_append_rows(&ix2, os, 7, 1), -EINVAL);
	kvmem_index_free(&ix);
	kvmem_index_free(&ix2);
	free(m);
	free(lo);
	free(hi);
	free(sub);
	free(os);
	free(ob);
}

static void test_append_matches_workspace(void **state)
{
	uint64_t r = g_seed;

	(void)state;
	run(3, 2, 64, 32, 1000, KVMEM_DTYPE_F32, &r);
	run(2, 3, 40, 16, 333, KVMEM_DTYPE_F32, &r);
	run(3, 2, 64, 32, 1000, KVMEM_DTYPE_BF16, &r);
	run(1, 1, 128, 64, 700, KVMEM_DTYPE_BF16, &r);
}

static void test_append_refuses(void **state)
{
	kvmem_score_geom g = { .n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
			       .block = 32, .cap_blocks = 2, .index_dtype = KVMEM_DTYPE_F32 };
	float m[2 * 8], os[8] = { 0 }, lo[16];
	uint16_t k[8 * 40] = { 0 };

	(void)state;
	/* past cap_blocks */
	assert_int_equal(kvmem_index_append_bf16(m, NULL, NULL, NULL, os, NULL, k, 30, 40, &g), -EINVAL);
	/* min without max */
	assert_int_equal(kvmem_index_append_bf16(m, lo, NULL, NULL, os, NULL, k, 0, 1, &g), -EINVAL);
	g.index_dtype = KVMEM_DTYPE_F16;
	assert_int_equal(kvmem_index_append_bf16(m, NULL, NULL, NULL, os, NULL, k, 0, 1, &g), -EINVAL);
	g.index_dtype = KVMEM_DTYPE_F32;
	g.block = 6;
	assert_int_equal(kvmem_index_append_bf16(m, NULL, NULL, NULL, os, NULL, k, 0, 1, &g), -EINVAL);
	g.block = 32;
	assert_int_equal(kvmem_index_append_bf16(m, NULL, NULL, NULL, os, NULL, k, 0, 33, &g), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_append_matches_workspace),
		cmocka_unit_test(test_append_refuses),
	};

	g_seed = test_rng_fresh_seed("test_index_bf16");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

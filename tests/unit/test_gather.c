// SPDX-License-Identifier: MIT
/*
 * kvmem_view_gather_bf16 (kernels/cpu/gather.c), the CPU twin of the GPU's
 * rematerialisation kernel, against what it must equal on fresh random
 * pages (the seed is printed; KVMEM_TEST_SEED replays it):
 *
 *   - K at a view slot is kvmem_rope_bf16 of the page's raw K row rounded to
 *     bf16 (kvmem_f32_to_bf16, or via f16), at the slot's position: the
 *     forward pass's rotation, so a placed token equals a computed one;
 *   - V at the slot is the row rounded the same way, bit for bit;
 *   - copy_k / copy_v receive the rounded raw rows at the page's offsets;
 *   - slots no item names are left alone, and an item outside the view is
 *     skipped with -EINVAL after the others are done.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_bf16.h"
#include "kvmem/kvmem.h"
#include "helpers/test_model.h"

static uint64_t g_seed;

static double runi(uint64_t *r)
{
	return kvmem_rng_uniform(r);
}

/* One page half [H][B][D] of random values in `dtype`, and its bf16
 * rounding (what every path must see). */
static void *rand_page(uint64_t *r, int dtype, size_t n, uint16_t *rounded)
{
	void *p = malloc(n * (dtype == KVMEM_DTYPE_F32 ? 4 : 2));

	assert_non_null(p);
	for (size_t i = 0; i < n; i++) {
		float x = (float)(runi(r) * 8 - 4);

		switch (dtype) {
		case KVMEM_DTYPE_F32:
			((float *)p)[i] = x;
			rounded[i] = kvmem_f32_to_bf16(x);
			break;
		case KVMEM_DTYPE_BF16:
			((uint16_t *)p)[i] = kvmem_f32_to_bf16(x);
			rounded[i] = ((uint16_t *)p)[i];
			break;
		default:
			((uint16_t *)p)[i] = kvmem_f32_to_f16(x);
			rounded[i] = kvmem_f32_to_bf16(kvmem_f16_to_f32(((uint16_t *)p)[i]));
		}
	}
	return p;
}

static void gather_case(int L, int H, int D, int B, int dtype)
{
	const int cap = 8 * B, n_items = 12;
	const size_t half = (size_t)H * B * D, vsz = (size_t)L * H * cap * D;
	uint64_t r = kvmem_rng_seed(g_seed ^ (uint64_t)(L * 131 + H * 17 + D + B * 7 + dtype));
	uint16_t *vk = malloc(vsz * 2), *vv = malloc(vsz * 2), *raw = malloc(vsz * 2);
	uint16_t *rk[12], *rv[12], *ck[12], *cv[12];
	void *pk[12], *pv[12];
	kvmem_gather_item it[13];
	uint8_t *used = calloc((size_t)L * cap, 1);

	assert_non_null(vk);
	assert_non_null(vv);
	assert_non_null(used);
	memset(vk, 0xa5, vsz * 2);
	memset(vv, 0x5a, vsz * 2);
	assert_non_null(raw);
	memset(raw, 0x33, vsz * 2);
	for (int i = 0; i < n_items; i++) {
		int l, slot, u0 = (int)(runi(&r) * B / 2), n = 1 + (int)(runi(&r) * (B - u0 - 1));

		rk[i] = malloc(half * 2);
		rv[i] = malloc(half * 2);
		ck[i] = calloc(half, 2);
		cv[i] = calloc(half, 2);
		pk[i] = rand_page(&r, dtype, half, rk[i]);
		pv[i] = rand_page(&r, dtype, half, rv[i]);
		/* A free run of slots in a random layer (items never overlap). */
		for (;;) {
			int ok = 1;

			l = (int)(runi(&r) * L);
			slot = (int)(runi(&r) * (cap - n + 1));
			for (int t = 0; t < n; t++)
				ok &= !used[(size_t)l * cap + slot + t];
			if (ok)
				break;
		}
		for (int t = 0; t < n; t++)
			used[(size_t)l * cap + slot + t] = 1;
		it[i] = (kvmem_gather_item){
			.k = (const char *)pk[i] + (size_t)u0 * D * (dtype == KVMEM_DTYPE_F32 ? 4 : 2),
			.v = (const char *)pv[i] + (size_t)u0 * D * (dtype == KVMEM_DTYPE_F32 ? 4 : 2),
			.copy_k = i % 2 ? ck[i] + (size_t)u0 * D : NULL,
			.copy_v = i % 2 ? cv[i] + (size_t)u0 * D : NULL,
			/* Every other item also keeps its raw K beside the view. */
			.raw_k = i % 2 ? NULL : raw + ((size_t)l * H * cap + slot) * D,
			.layer = l, .slot = slot, .n = n, .head_stride = B * D, .dtype = dtype,
			.raw_stride = cap * D,
		};
	}
	/* One item outside the view: skipped, reported. */
	it[n_items] = (kvmem_gather_item){ .k = pk[0], .v = pv[0], .layer = 0, .slot = cap - 1,
					   .n = 2, .head_stride = B * D, .dtype = dtype };
	assert_int_equal(kvmem_view_gather_bf16(vk, vv, it, n_items + 1, L, H, D, cap, 1e6), -EINVAL);
	for (int i = 0; i < n_items; i++) {
		const kvmem_gather_item *m = &it[i];
		int u0 = (int)(((const char *)m->k - (const char *)pk[i]) /
			       (D * (dtype == KVMEM_DTYPE_F32 ? 4 : 2)) / 1);
		uint16_t *row = malloc((size_t)H * D * 2);

		for (int t = 0; t < m->n; t++) {
			int32_t pos = m->slot + t;

			for (int h = 0; h < H; h++)
				memcpy(row + (size_t)h * D, rk[i] + ((size_t)h * B + u0 + t) * D, (size_t)D * 2);
			kvmem_rope_bf16(row, &pos, 1, H, D, 1e6);
			for (int h = 0; h < H; h++) {
				size_t d = (((size_t)m->layer * H + h) * cap + m->slot + t) * D;
				size_t s = ((size_t)h * B + u0 + t) * D;

				assert_memory_equal(vk + d, row + (size_t)h * D, (size_t)D * 2);
				assert_memory_equal(vv + d, rv[i] + s, (size_t)D * 2);
				if (m->raw_k)
					assert_memory_equal(raw + d, rk[i] + s, (size_t)D * 2);
				else
					assert_int_equal(raw[d], 0x3333);
				if (m->copy_k) {
					assert_memory_equal(ck[i] + s, rk[i] + s, (size_t)D * 2);
					assert_memory_equal(cv[i] + s, rv[i] + s, (size_t)D * 2);
				}
			}
		}
		free(row);
	}
	/* Untouched slots keep their poison. */
	for (int l = 0; l < L; l++)
		for (int h = 0; h < H; h++)
			for (int sl = 0; sl < cap; sl++)
				if (!used[(size_t)l * cap + sl] && !(l == 0 && sl == cap - 1)) {
					size_t d = (((size_t)l * H + h) * cap + sl) * D;

					assert_int_equal(vk[d], 0xa5a5);
					assert_int_equal(vv[d + D - 1], 0x5a5a);
				}
	for (int i = 0; i < n_items; i++) {
		free(rk[i]);
		free(rv[i]);
		free(ck[i]);
		free(cv[i]);
		free(pk[i]);
		free(pv[i]);
	}
	free(vk);
	free(vv);
	free(raw);
	free(used);
}

static void test_gather_bf16(void **state)
{
	gather_case(3, 8, 128, 32, KVMEM_DTYPE_BF16);
	gather_case(2, 2, 64, 16, KVMEM_DTYPE_BF16);
}

static void test_gather_f32(void **state)
{
	gather_case(3, 8, 128, 32, KVMEM_DTYPE_F32);
	gather_case(4, 2, 64, 64, KVMEM_DTYPE_F32);
}

static void test_gather_f16(void **state)
{
	gather_case(2, 4, 64, 32, KVMEM_DTYPE_F16);
}

static void test_gather_bad_args(void **state)
{
	uint16_t v[64];
	kvmem_gather_item it = { .k = v, .v = v, .n = 1, .head_stride = 32, .dtype = 99 };

	assert_int_equal(kvmem_view_gather_bf16(v, v, &it, 1, 1, 1, 32, 1, 1e4), -EINVAL);
	assert_int_equal(kvmem_view_gather_bf16(v, v, &it, 1, 1, 1, 31, 1, 1e4), -EINVAL);
	assert_int_equal(kvmem_view_gather_bf16(v, v, NULL, 0, 1, 1, 32, 1, 1e4), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gather_bf16),
		cmocka_unit_test(test_gather_f32),
		cmocka_unit_test(test_gather_f16),
		cmocka_unit_test(test_gather_bad_args),
	};

	g_seed = test_rng_fresh_seed("test_gather");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

// SPDX-License-Identifier: MIT
/*
 * The host pool: slot arithmetic, 2 MiB alignment, NUMA placement, runs of
 * consecutive slots, and that every slot holds its own bytes; io_uring
 * registration a piece at a time, when first used.
 */
#include <numa.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "pager/pager_int.h"
#include "pager_fixture.h"

static uint64_t g_seed;

static void test_geometry(void **state)
{
	uint64_t rng = g_seed;

	for (int it = 0; it < 20; it++) {
		size_t slot = KVMEM_IO_ALIGN * test_rng_int(&rng, 1, 64);
		uint32_t want = test_rng_int(&rng, 1, 100);
		uint64_t cap = slot * want + test_rng_int(&rng, 0, slot - 1);
		kvmem_hostpool *hp = kvmem_hostpool_create(cap, slot, -1);
		void *base;
		size_t len;

		assert_non_null(hp);
		assert_int_equal(kvmem_hostpool_slots(hp), want);
		assert_int_equal(kvmem_hostpool_free_slots(hp), want);
		assert_int_equal(kvmem_hostpool_slot_bytes(hp), slot);
		kvmem_hostpool_region(hp, &base, &len);
		assert_int_equal((uintptr_t)base % (2u << 20), 0);
		assert_int_equal(len % (2u << 20), 0);
		assert_true(len >= slot * want);
		for (uint32_t s = 0; s < want; s++) {
			uint8_t *p = kvmem_hostpool_slot(hp, s);

			assert_int_equal((uintptr_t)p % KVMEM_IO_ALIGN, 0);
			assert_ptr_equal(p, (uint8_t *)base + (size_t)s * slot);
		}
		if (numa_available() >= 0)
			assert_true(kvmem_hostpool_node(hp) >= 0);
		kvmem_hostpool_free(hp);
	}
}

static void test_errors(void **state)
{
	assert_null(kvmem_hostpool_create(4096, 8192, -1));
	assert_non_null(strstr(kvmem_last_error(), "holds no page"));
	assert_null(kvmem_hostpool_create(1 << 20, 1000, -1));
	assert_non_null(strstr(kvmem_last_error(), "multiple of 4096"));
	if (numa_available() >= 0) {
		assert_null(kvmem_hostpool_create(1 << 20, 4096, numa_max_node() + 1));
		assert_non_null(strstr(kvmem_last_error(), "NUMA node"));
	}
}

/* Random allocate/release against a shadow map: runs are consecutive free
 * slots, counts add up, nothing is handed out twice; data stays put. */
static void test_runs_and_contents(void **state)
{
	uint64_t rng = g_seed ^ 9, seed = fx_mix(g_seed);
	const size_t slot = 8192;
	const uint32_t n = 200;
	kvmem_hostpool *hp = kvmem_hostpool_create(slot * n, slot, -1);
	int32_t owner[200];
	uint32_t used = 0;

	assert_non_null(hp);
	for (uint32_t s = 0; s < n; s++)
		owner[s] = -1;
	for (int it = 0; it < 3000; it++) {
		if (test_rng_int(&rng, 0, 1)) {
			uint32_t first, want = test_rng_int(&rng, 1, 12);
			uint32_t got = kvmem_hostpool_alloc_run(hp, want, &first);

			if (used == n) {
				assert_int_equal(got, 0);
				continue;
			}
			assert_true(got >= 1 && got <= want);
			for (uint32_t s = first; s < first + got; s++) {
				assert_int_equal(owner[s], -1);
				owner[s] = it;
				fx_fill(kvmem_hostpool_slot(hp, s), slot, seed, s, it);
				assert_false(kvmem_hostpool_is_free(hp, s));
			}
			/* A run stops only at a used slot or the end. */
			if (got < want && first + got < n)
				assert_int_not_equal(owner[first + got], -1);
			used += got;
		} else {
			uint32_t s = test_rng_int(&rng, 0, n - 1);

			if (owner[s] < 0)
				continue;
			kvmem_hostpool_release(hp, s, 1);
			owner[s] = -1;
			used--;
			assert_true(kvmem_hostpool_is_free(hp, s));
		}
		assert_int_equal(kvmem_hostpool_free_slots(hp), n - used);
	}
	for (uint32_t s = 0; s < n; s++) {
		uint8_t *want = malloc(slot);

		if (owner[s] >= 0) {
			fx_fill(want, slot, seed, s, owner[s]);
			assert_memory_equal(want, kvmem_hostpool_slot(hp, s), slot);
		}
		free(want);
	}
	kvmem_hostpool_free(hp);
}

/* The pager's pool is registered with io_uring (reads land in it) and
 * sized from the cap. */
static void test_pager_pool(void **state)
{
	uint64_t rng = g_seed ^ 3, seed = fx_mix(g_seed ^ 3);
	kvmem_page_geom g = fx_geom(&rng);
	kvmem_pager_opts o;
	char dir[256];
	kvmem_pager *p;

	kvmem_pager_opts_default(&o);
	o.flags = KVMEM_PAGER_CREATE;
	o.host_cap = kvmem_page_stride(&g) * 7 + 100;
	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	assert_int_equal(kvmem_pager_open(dir, &g, &o, &p), 0);
	assert_int_equal(kvmem_hostpool_slots(kvmem_pager_hostpool(p)), 7);
	/* Root may pin memory (CAP_IPC_LOCK): registration must work then. */
	if (geteuid() == 0)
		assert_int_equal(kvmem_pager_registered(p), 1);
	assert_int_equal(kvmem_hostpool_slot_bytes(kvmem_pager_hostpool(p)), kvmem_page_stride(&g));
	assert_int_equal(fx_append(p, seed, 5 * g.block_tokens), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_true(kvmem_hostpool_free_slots(kvmem_pager_hostpool(p)) <= 7);
	assert_int_equal(kvmem_pager_close(p), 0);
	fx_rmtree(dir);
}

/* Registration pins memory and costs seconds on a loaded machine: a pager
 * registers nothing at open, the stage-out buffer's piece at its first
 * write, a pool piece at the first read into it. */
static int pieces_registered(const kvmem_pager *p)
{
	int n = 0;

	for (unsigned i = 0; i < p->io.n_iov; i++)
		n += p->io.state[i] == 1;
	return n;
}

static void test_registered_when_first_used(void **state)
{
	uint64_t rng = g_seed ^ 0x1a2;
	uint64_t seed = test_rng_next(&rng);
	kvmem_page_geom g = fx_geom(&rng);
	kvmem_pager_opts o;
	char dir[256];
	kvmem_pager *p;

	if (geteuid() != 0)
		skip();	/* pinning may be refused (RLIMIT_MEMLOCK) */
	kvmem_pager_opts_default(&o);
	o.flags = KVMEM_PAGER_CREATE | KVMEM_PAGER_NO_KEEP;
	o.host_cap = kvmem_page_stride(&g) * 7 + 100;
	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	assert_int_equal(kvmem_pager_open(dir, &g, &o, &p), 0);
	assert_int_equal(kvmem_pager_registered(p), 1);
	if (!p->io.sparse)
		skip();	/* a kernel without sparse tables registers all at once */
	assert_int_equal(pieces_registered(p), 0);
	assert_int_equal(fx_append(p, seed, 5 * g.block_tokens), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	assert_int_equal(pieces_registered(p), 1);	/* the stage-out buffer's */
	assert_int_equal(fx_check(p, seed, 1), 0);	/* reads from NVMe into the pool */
	assert_int_equal(pieces_registered(p), 2);
	assert_int_equal(kvmem_pager_close(p), 0);
	fx_rmtree(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_geometry),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_runs_and_contents),
		cmocka_unit_test(test_pager_pool),
		cmocka_unit_test(test_registered_when_first_used),
	};

	g_seed = test_rng_fresh_seed("test_hostpool");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

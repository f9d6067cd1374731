// SPDX-License-Identifier: MIT
/*
 * The page table: the uapi layout the kernel module will share, and the
 * entries the pager keeps as pages are appended, staged out, fetched and
 * evicted.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "pager_fixture.h"

static uint64_t g_seed;

static void test_uapi_layout(void **state)
{
	assert_int_equal(sizeof(struct kvmem_pte), 32);
	assert_int_equal(offsetof(struct kvmem_pte, page_id), 0);
	assert_int_equal(offsetof(struct kvmem_pte, host_slot), 8);
	assert_int_equal(offsetof(struct kvmem_pte, gpu_slot), 12);
	assert_int_equal(offsetof(struct kvmem_pte, tiers), 16);
	assert_int_equal(offsetof(struct kvmem_pte, flags), 17);
	assert_int_equal(offsetof(struct kvmem_pte, access_count), 20);
	assert_int_equal(offsetof(struct kvmem_pte, last_step), 24);
	assert_int_equal(sizeof(struct kvmem_pt_header), 64);
	assert_int_equal(offsetof(struct kvmem_pte, seq), 18);
	assert_int_equal(KVMEM_PT_VERSION, 2);
	/* Tier bits and state flags are distinct single bits. */
	assert_int_equal(KVMEM_TIER_GPU | KVMEM_TIER_HOST | KVMEM_TIER_NVME, 7);
	assert_int_equal(__builtin_popcount(KVMEM_PTE_IN_FLIGHT | KVMEM_PTE_DIRTY | KVMEM_PTE_PINNED |
					    KVMEM_PTE_BAD | KVMEM_PTE_PREFETCHED), 5);
	assert_int_equal(KVMEM_IO_ALIGN, 4096);
	assert_int_not_equal(KVMEM_IOC_SETUP, KVMEM_IOC_PREFETCH);
}

/* Every resident entry points to its own slot, no two share one, and the
 * slot holds the page's bytes. */
static void check_invariants(kvmem_pager *p, uint64_t seed)
{
	const kvmem_page_geom *g = kvmem_pager_geom(p);
	kvmem_hostpool *hp = kvmem_pager_hostpool(p);
	uint32_t n = kvmem_hostpool_slots(hp), resident = 0;
	uint8_t *seen = calloc(n, 1), *want = malloc(kvmem_page_bytes(g));

	for (uint64_t pg = 0; pg < kvmem_pager_blocks(p) * g->n_layers; pg++) {
		const struct kvmem_pte *e = kvmem_pager_pte(p, pg);

		assert_non_null(e);
		assert_int_equal(e->page_id, pg);
		assert_int_equal(e->gpu_slot, KVMEM_SLOT_NONE);
		assert_int_equal(e->seq, 0);	/* the pager's own table: no concurrent writer */
		if (!(e->tiers & KVMEM_TIER_HOST)) {
			assert_int_equal(e->host_slot, KVMEM_SLOT_NONE);
			continue;
		}
		assert_true(e->host_slot < n);
		assert_false(seen[e->host_slot]);
		assert_false(kvmem_hostpool_is_free(hp, e->host_slot));
		seen[e->host_slot] = 1;
		resident++;
		fx_page(g, seed, pg, want);
		assert_memory_equal(want, kvmem_hostpool_slot(hp, e->host_slot), kvmem_page_bytes(g));
	}
	assert_int_equal(resident, n - kvmem_hostpool_free_slots(hp));
	assert_null(kvmem_pager_pte(p, kvmem_pager_blocks(p) * g->n_layers));
	free(seen);
	free(want);
}

static void test_entries_follow_pages(void **state)
{
	uint64_t rng = g_seed, seed = fx_mix(g_seed), n_pages;
	kvmem_page_geom g = fx_geom(&rng);
	kvmem_pager_opts o;
	char dir[256];
	kvmem_pager *p;

	kvmem_pager_opts_default(&o);
	o.flags = KVMEM_PAGER_CREATE;
	o.host_cap = kvmem_page_stride(&g) * (2 * g.n_layers + 1);
	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	assert_int_equal(kvmem_pager_open(dir, &g, &o, &p), 0);
	assert_int_equal(fx_append(p, seed, 6 * g.block_tokens), 0);
	/* Appended: dirty until its write is done. */
	for (uint64_t pg = 0; pg < 6 * g.n_layers; pg++) {
		const struct kvmem_pte *e = kvmem_pager_pte(p, pg);

		assert_true((e->flags & KVMEM_PTE_DIRTY) || (e->tiers & KVMEM_TIER_NVME));
	}
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	n_pages = 6 * g.n_layers;
	for (uint64_t pg = 0; pg < n_pages; pg++) {
		const struct kvmem_pte *e = kvmem_pager_pte(p, pg);

		assert_true(e->tiers & KVMEM_TIER_NVME);
		assert_false(e->flags & (KVMEM_PTE_DIRTY | KVMEM_PTE_IN_FLIGHT));
	}
	check_invariants(p, seed);

	/* Fetches count and stamp the step; evictions clear the host tier. */
	for (int step = 1; step <= 20; step++) {
		uint64_t pg = test_rng_int(&rng, 0, n_pages - 1);
		uint32_t before = kvmem_pager_pte(p, pg)->access_count;
		const void *ptr;

		assert_int_equal(kvmem_pager_step(p, step), 0);
		assert_int_equal(kvmem_pager_fetch(p, &pg, 1, &ptr), 0);
		assert_int_equal(kvmem_pager_pte(p, pg)->access_count, before + 1);
		assert_int_equal(kvmem_pager_pte(p, pg)->last_step, step);
		assert_true(kvmem_pager_pte(p, pg)->tiers & KVMEM_TIER_HOST);
		assert_ptr_equal(ptr, kvmem_hostpool_slot(kvmem_pager_hostpool(p),
							 kvmem_pager_pte(p, pg)->host_slot));
		kvmem_pager_release(p, &pg, 1);
		if (step % 5 == 0) {
			uint64_t want = test_rng_int(&rng, 0, n_pages - 1);

			if (kvmem_pager_prefetch(p, &want, 1) == 1) {
				assert_int_equal(kvmem_pager_fetch(p, &want, 1, &ptr), 0);
				assert_false(kvmem_pager_pte(p, want)->flags & KVMEM_PTE_PREFETCHED);
				kvmem_pager_release(p, &want, 1);
			}
		}
		check_invariants(p, seed);
	}
	assert_int_equal(kvmem_pager_close(p), 0);
	fx_rmtree(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_uapi_layout),
		cmocka_unit_test(test_entries_follow_pages),
	};

	g_seed = test_rng_fresh_seed("test_pagetable");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

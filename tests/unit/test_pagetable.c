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
	assert_int_equal(sizeof(struct kvm_pte), 32);
	assert_int_equal(offsetof(struct kvm_pte, page_id), 0);
	assert_int_equal(offsetof(struct kvm_pte, host_slot), 8);
	assert_int_equal(offsetof(struct kvm_pte, gpu_slot), 12);
	assert_int_equal(offsetof(struct kvm_pte, tiers), 16);
	assert_int_equal(offsetof(struct kvm_pte, flags), 17);
	assert_int_equal(offsetof(struct kvm_pte, access_count), 20);
	assert_int_equal(offsetof(struct kvm_pte, last_step), 24);
	assert_int_equal(sizeof(struct kvm_pt_header), 64);
	assert_int_equal(KVM_PT_VERSION, 1);
	/* Tier bits and state flags are distinct single bits. */
	assert_int_equal(KVM_TIER_GPU | KVM_TIER_HOST | KVM_TIER_NVME, 7);
	assert_int_equal(__builtin_popcount(KVM_PTE_IN_FLIGHT | KVM_PTE_DIRTY | KVM_PTE_PINNED |
					    KVM_PTE_BAD | KVM_PTE_PREFETCHED | KVM_PTE_MARK), 6);
	assert_int_equal(KVM_IO_ALIGN, 4096);
	assert_int_not_equal(KVM_IOC_SETUP, KVM_IOC_PREFETCH);
}

/* Every resident entry points to its own slot, no two share one, and the
 * slot holds the page's bytes. */
static void check_invariants(kvm_pager *p, uint64_t seed)
{
	const kvm_page_geom *g = kvm_pager_geom(p);
	kvm_hostpool *hp = kvm_pager_hostpool(p);
	uint32_t n = kvm_hostpool_slots(hp), resident = 0;
	uint8_t *seen = calloc(n, 1), *want = malloc(kvm_page_bytes(g));

	for (uint64_t pg = 0; pg < kvm_pager_blocks(p) * g->n_layers; pg++) {
		const struct kvm_pte *e = kvm_pager_pte(p, pg);

		assert_non_null(e);
		assert_int_equal(e->page_id, pg);
		assert_int_equal(e->gpu_slot, KVM_SLOT_NONE);
		assert_int_equal(e->reserved, 0);
		if (!(e->tiers & KVM_TIER_HOST)) {
			assert_int_equal(e->host_slot, KVM_SLOT_NONE);
			continue;
		}
		assert_true(e->host_slot < n);
		assert_false(seen[e->host_slot]);
		assert_false(kvm_hostpool_is_free(hp, e->host_slot));
		seen[e->host_slot] = 1;
		resident++;
		fx_page(g, seed, pg, want);
		assert_memory_equal(want, kvm_hostpool_slot(hp, e->host_slot), kvm_page_bytes(g));
	}
	assert_int_equal(resident, n - kvm_hostpool_free_slots(hp));
	assert_null(kvm_pager_pte(p, kvm_pager_blocks(p) * g->n_layers));
	free(seen);
	free(want);
}

static void test_entries_follow_pages(void **state)
{
	uint64_t rng = g_seed, seed = fx_mix(g_seed), n_pages;
	kvm_page_geom g = fx_geom(&rng);
	kvm_pager_opts o;
	char dir[256];
	kvm_pager *p;

	kvm_pager_opts_default(&o);
	o.flags = KVM_PAGER_CREATE;
	o.host_cap = kvm_page_stride(&g) * (2 * g.n_layers + 1);
	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	assert_int_equal(kvm_pager_open(dir, &g, &o, &p), 0);
	assert_int_equal(fx_append(p, seed, 6 * g.block_tokens), 0);
	/* Appended: dirty until its write is done. */
	for (uint64_t pg = 0; pg < 6 * g.n_layers; pg++) {
		const struct kvm_pte *e = kvm_pager_pte(p, pg);

		assert_true((e->flags & KVM_PTE_DIRTY) || (e->tiers & KVM_TIER_NVME));
	}
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	n_pages = 6 * g.n_layers;
	for (uint64_t pg = 0; pg < n_pages; pg++) {
		const struct kvm_pte *e = kvm_pager_pte(p, pg);

		assert_true(e->tiers & KVM_TIER_NVME);
		assert_false(e->flags & (KVM_PTE_DIRTY | KVM_PTE_IN_FLIGHT));
	}
	check_invariants(p, seed);

	/* Fetches count and stamp the step; evictions clear the host tier. */
	for (int step = 1; step <= 20; step++) {
		uint64_t pg = test_rng_int(&rng, 0, n_pages - 1);
		uint32_t before = kvm_pager_pte(p, pg)->access_count;
		const void *ptr;

		assert_int_equal(kvm_pager_step(p, step), 0);
		assert_int_equal(kvm_pager_fetch(p, &pg, 1, &ptr), 0);
		assert_int_equal(kvm_pager_pte(p, pg)->access_count, before + 1);
		assert_int_equal(kvm_pager_pte(p, pg)->last_step, step);
		assert_true(kvm_pager_pte(p, pg)->tiers & KVM_TIER_HOST);
		assert_ptr_equal(ptr, kvm_hostpool_slot(kvm_pager_hostpool(p),
							 kvm_pager_pte(p, pg)->host_slot));
		kvm_pager_release(p, &pg, 1);
		if (step % 5 == 0) {
			uint64_t want = test_rng_int(&rng, 0, n_pages - 1);

			if (kvm_pager_prefetch(p, &want, 1) == 1) {
				assert_int_equal(kvm_pager_fetch(p, &want, 1, &ptr), 0);
				assert_false(kvm_pager_pte(p, want)->flags & KVM_PTE_PREFETCHED);
				kvm_pager_release(p, &want, 1);
			}
		}
		check_invariants(p, seed);
	}
	assert_int_equal(kvm_pager_close(p), 0);
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

// SPDX-License-Identifier: MIT
/*
 * Host pool pages without copies, and one pool several pagers share (issue
 * 24: kvmem serve's conversations, a prefill's pages made where they stay):
 *   - a block made in the memory kvmem_pager_block_memory gives is appended
 *     without a copy: a fetch of its pages returns that memory, and what
 *     reaches the disk is its bytes;
 *   - pagers on one shared pool take each other's unpinned pages when short
 *     of room, every page reads back right, and closing gives every slot
 *     back; the pool is not freed under an open pager;
 *   - a block in scattered slots (several writes) is written whole;
 *   - the disk reserved ahead of a pager's writes is its share of the pool;
 *   - a pager below its share of the pool takes from those above theirs
 *     before it gives up its own pages;
 *   - pagers on one pool from two threads at once (a serve round's
 *     conversations) keep their bytes apart.
 */
#include <inttypes.h>
#include <pthread.h>
#include <unistd.h>
#include <sys/stat.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "pager/pager_int.h"
#include "pager_fixture.h"

static uint64_t g_seed;

/* Append tokens [have, have + n), each full block made in the pager's pool
 * memory; with `check`, assert that it is pool memory and stays put. */
static int append_in_pool(kvmem_pager *p, uint64_t seed, uint64_t n)
{
	const kvmem_page_geom *g = kvmem_pager_geom(p);
	uint8_t *ix = malloc(g->index_bytes + 1);
	void *layers[64];
	int rc = 0;

	for (uint64_t i = 0; i < n && !rc; i++) {
		uint64_t pos = kvmem_pager_tokens(p), b = pos / g->block_tokens;
		int32_t t = fx_token(seed, pos);

		rc = kvmem_pager_append_tokens(p, &t, 1);
		if (rc || (pos + 1) % g->block_tokens)
			continue;
		rc = kvmem_pager_block_memory(p, b, layers);
		for (uint32_t l = 0; l < g->n_layers && !rc; l++)
			fx_page(g, seed, kvmem_page_id(g, b, l), layers[l]);
		fx_index(g, seed, b, ix);
		if (!rc)
			rc = kvmem_pager_append_block(p, b, (const void *const *)layers, ix);
	}
	free(ix);
	return rc;
}

static void test_block_memory_is_not_copied(void **state)
{
	uint64_t rng = g_seed ^ 0x51, seed = fx_mix(g_seed ^ 0x51);
	kvmem_page_geom g = fx_geom(&rng);
	const uint32_t L = g.n_layers;
	kvmem_pager *p;
	char dir[256];
	void *first[64], *again[64];
	const void *got[64];
	uint64_t ids[64];

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	p = fx_open(dir, &g, kvmem_page_stride(&g) * L * 16, 0, KVMEM_PAGER_CREATE, 0);
	assert_non_null(p);
	/* Asked twice before the append: the same memory, in the pool. */
	assert_int_equal(kvmem_pager_block_memory(p, 0, first), 0);
	assert_int_equal(kvmem_pager_block_memory(p, 0, again), 0);
	for (uint32_t l = 0; l < L; l++) {
		void *base;
		size_t len;

		kvmem_hostpool_region(kvmem_pager_hostpool(p), &base, &len);
		assert_ptr_equal(first[l], again[l]);
		assert_true((uint8_t *)first[l] >= (uint8_t *)base &&
			    (uint8_t *)first[l] < (uint8_t *)base + len);
	}
	assert_int_equal(append_in_pool(p, seed, 5 * g.block_tokens + 3), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	/* Block 0's pages are where they were made: no copy was taken. */
	for (uint32_t l = 0; l < L; l++)
		ids[l] = kvmem_page_id(&g, 0, l);
	assert_int_equal(kvmem_pager_fetch(p, ids, L, got), 0);
	for (uint32_t l = 0; l < L; l++)
		assert_ptr_equal(got[l], first[l]);
	kvmem_pager_release(p, ids, L);
	/* Blocks being made take at most half the pool. */
	{
		kvmem_pager *q;
		char qdir[256];

		assert_non_null(fx_tmpdir(qdir, sizeof(qdir)));
		q = fx_open(qdir, &g, kvmem_page_stride(&g) * L * 2, 0, KVMEM_PAGER_CREATE, 0);
		assert_non_null(q);
		assert_int_equal(kvmem_pager_block_memory(q, 0, again), 0);
		assert_int_equal(kvmem_pager_block_memory(q, 1, again), -ENOBUFS);
		assert_int_equal(kvmem_pager_close(q), 0);
		fx_rmtree(qdir);
	}
	/* A block already appended has no memory to make. */
	assert_int_equal(kvmem_pager_block_memory(p, 1, first), -EINVAL);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	/* What reached the disk is what was made in the pool. */
	p = fx_open(dir, &g, kvmem_page_stride(&g) * L * 2, 0, KVMEM_PAGER_RDONLY, 0);
	assert_non_null(p);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_block_memory(p, 6, first), -ENOTSUP);
	assert_int_equal(kvmem_pager_close(p), 0);
	fx_rmtree(dir);
}

static kvmem_pager *open_on(const char *dir, const kvmem_page_geom *g, kvmem_hostpool *pool)
{
	kvmem_pager_opts o;
	kvmem_pager *p = NULL;

	kvmem_pager_opts_default(&o);
	o.flags = KVMEM_PAGER_CREATE;
	o.stage_bytes = 1;	/* the smallest: the pool is where pages are kept */
	o.pool = pool;
	if (kvmem_pager_open(dir, g, &o, &p) < 0)
		fprintf(stderr, "open %s: %s\n", dir, kvmem_last_error());
	return p;
}

static void test_pagers_share_one_pool(void **state)
{
	uint64_t rng = g_seed ^ 0x52;
	kvmem_page_geom g = fx_geom(&rng), other = g;
	const uint32_t L = g.n_layers, slots = 6 * L;
	kvmem_hostpool *pool;
	kvmem_pager *p[3];
	char dir[3][256];
	uint64_t seed[3], ev;
	kvmem_pager_stats st;

	assert_int_equal(kvmem_pager_pool_create(&g, (uint64_t)slots * kvmem_page_stride(&g), -1,
						 &pool), 0);
	assert_int_equal(kvmem_hostpool_slots(pool), slots);
	for (int i = 0; i < 3; i++) {
		seed[i] = fx_mix(g_seed + i);
		assert_non_null(fx_tmpdir(dir[i], sizeof(dir[i])));
		p[i] = open_on(dir[i], &g, pool);
		assert_non_null(p[i]);
		assert_ptr_equal(kvmem_pager_hostpool(p[i]), pool);
	}
	/* Each writes more than a third of the pool, some more than all of
	 * it: the later ones take the earlier ones' pages. */
	assert_int_equal(append_in_pool(p[0], seed[0], 4 * g.block_tokens + 1), 0);
	assert_int_equal(fx_commit(p[0], seed[0], NULL, 0), 0);
	assert_int_equal(fx_append(p[1], seed[1], 5 * g.block_tokens), 0);
	assert_int_equal(fx_commit(p[1], seed[1], NULL, 0), 0);
	assert_int_equal(append_in_pool(p[2], seed[2], 9 * g.block_tokens + 2), 0);
	assert_int_equal(fx_commit(p[2], seed[2], NULL, 0), 0);
	kvmem_pager_stats_get(p[0], &st);
	ev = st.evictions;
	kvmem_pager_stats_get(p[1], &st);
	ev += st.evictions;
	assert_true(ev > 0);	/* p[2] could not have fit otherwise */
	for (int i = 0; i < 3; i++)
		assert_int_equal(fx_check(p[i], seed[i], 1), 0);
	/* Open pagers: the pool stays. */
	assert_int_equal(kvmem_pager_pool_free(pool), -EBUSY);
	/* Another page size does not fit in it. */
	other.block_tokens = g.block_tokens * 16;	/* 16x the page */
	{
		char odir[256];

		assert_non_null(fx_tmpdir(odir, sizeof(odir)));
		assert_null(open_on(odir, &other, pool));
		assert_non_null(strstr(kvmem_last_error(), "slots are"));
		fx_rmtree(odir);
	}
	for (int i = 0; i < 3; i++) {
		assert_int_equal(kvmem_pager_close(p[i]), 0);
		fx_rmtree(dir[i]);
	}
	assert_int_equal(kvmem_hostpool_free_slots(pool), slots);
	assert_int_equal(kvmem_pager_pool_free(pool), 0);
}

/* A block in scattered slots goes out in several writes, and writes of
 * earlier blocks finish while they are queued: the commit still ends,
 * every page reads back. (A block's count of writes left was once kept
 * at the end of a list that finished blocks reorder: the commit waited
 * forever.) The test holds every other slot of a shared pool. */
static void test_scattered_slots(void **state)
{
	uint64_t rng = g_seed ^ 0x54, seed = fx_mix(g_seed ^ 0x54);
	kvmem_page_geom g = fx_geom(&rng);
	const uint32_t blocks = 160, slots = 2 * 4 * blocks + 8;
	kvmem_hostpool *pool;
	kvmem_pager *p;
	char dir[256];
	uint32_t first;

	g.n_layers = 4;
	g.index_bytes = g.n_layers * g.n_kv_heads * g.head_dim * 4;
	assert_int_equal(kvmem_pager_pool_create(&g, (uint64_t)slots * kvmem_page_stride(&g), -1,
						 &pool), 0);
	assert_int_equal(kvmem_hostpool_alloc_run(pool, slots, &first), slots);
	for (uint32_t s = 0; s < slots; s += 2)
		kvmem_hostpool_release(pool, s, 1);
	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	p = open_on(dir, &g, pool);
	assert_non_null(p);
	alarm(60);	/* a hang is a failure, not a stuck run */
	assert_int_equal(append_in_pool(p, seed, (uint64_t)blocks * g.block_tokens + 1), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	alarm(0);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	fx_rmtree(dir);
	for (uint32_t s = 1; s < slots; s += 2)
		kvmem_hostpool_release(pool, s, 1);
	assert_int_equal(kvmem_pager_pool_free(pool), 0);
}

/* The pages file is allocated ahead of the writes as far as they can be in
 * flight: for blocks written from a shared pool, this pager's share of it,
 * not the whole pool for every pager (kvmem serve: 64 conversations on a
 * 256 MiB pool would each hold 256 MiB of disk). */
static void test_reserve_is_a_share(void **state)
{
	uint64_t rng = g_seed ^ 0x55, seed = fx_mix(g_seed ^ 0x55);
	kvmem_page_geom g = fx_geom(&rng);
	const uint64_t bytes = 1ull << 30;
	kvmem_hostpool *pool;
	kvmem_pager *p[4];
	char dir[4][256], path[300];
	struct stat st;

	assert_int_equal(kvmem_pager_pool_create(&g, bytes, -1, &pool), 0);
	for (int i = 0; i < 4; i++) {
		assert_non_null(fx_tmpdir(dir[i], sizeof(dir[i])));
		p[i] = open_on(dir[i], &g, pool);
		assert_non_null(p[i]);
	}
	assert_int_equal(append_in_pool(p[0], seed, 2 * g.block_tokens), 0);
	assert_int_equal(fx_commit(p[0], seed, NULL, 0), 0);
	snprintf(path, sizeof(path), "%s/pages", dir[0]);
	assert_int_equal(stat(path, &st), 0);
	/* A quarter of the pool (and a directory's 64 MiB steps), not all. */
	assert_true((uint64_t)st.st_size <= bytes / 4 + (64u << 20));
	for (int i = 0; i < 4; i++) {
		assert_int_equal(kvmem_pager_close(p[i]), 0);
		fx_rmtree(dir[i]);
	}
	assert_int_equal(kvmem_pager_pool_free(pool), 0);
}

/* Host pool pages of p: resident or on their way in (the slots it holds). */
static uint32_t resident(kvmem_pager *p)
{
	const kvmem_page_geom *g = kvmem_pager_geom(p);
	uint32_t n = 0;

	for (uint64_t pg = 0; pg < p->n_blocks * g->n_layers; pg++)
		n += (p->pt[pg].tiers & KVMEM_TIER_HOST) != 0;
	return n;
}

/* Each pager's share of a shared pool is its slots over its pagers: one
 * below its share takes from those above theirs before it gives up its
 * own pages. A pool of 8 blocks' pages, A fills it, then B writes 4
 * blocks one commit at a time: B keeps all 4 (A gives them), where it
 * once gave up its own last block for each next one and held 1 while A
 * kept 7. Past its share, B's own pages go first: A keeps its 4. */
static void test_share_of_the_pool(void **state)
{
	uint64_t rng = g_seed ^ 0x57, sa = fx_mix(g_seed ^ 0x57), sb = fx_mix(g_seed ^ 0x58);
	kvmem_page_geom g = fx_geom(&rng);
	const uint32_t L = g.n_layers, slots = 8 * L;
	kvmem_hostpool *pool;
	kvmem_pager *a, *b;
	char da[256], db[256];

	assert_int_equal(kvmem_pager_pool_create(&g, (uint64_t)slots * kvmem_page_stride(&g), -1,
						 &pool), 0);
	assert_non_null(fx_tmpdir(da, sizeof(da)));
	assert_non_null(fx_tmpdir(db, sizeof(db)));
	a = open_on(da, &g, pool);
	b = open_on(db, &g, pool);
	assert_non_null(a);
	assert_non_null(b);
	assert_int_equal(append_in_pool(a, sa, 8 * g.block_tokens), 0);
	assert_int_equal(fx_commit(a, sa, NULL, 0), 0);
	assert_int_equal(resident(a), 8 * L);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(append_in_pool(b, sb, g.block_tokens), 0);
		assert_int_equal(fx_commit(b, sb, NULL, 0), 0);
	}
	assert_int_equal(resident(b), 4 * L);
	assert_int_equal(resident(a), 4 * L);
	assert_int_equal(b->held, 4 * L);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(append_in_pool(b, sb, g.block_tokens), 0);
		assert_int_equal(fx_commit(b, sb, NULL, 0), 0);
	}
	assert_int_equal(resident(a), 4 * L);
	assert_int_equal(resident(b), 4 * L);
	assert_int_equal(fx_check(a, sa, 1), 0);
	assert_int_equal(fx_check(b, sb, 1), 0);
	assert_int_equal(kvmem_pager_close(a), 0);
	assert_int_equal(kvmem_pager_close(b), 0);
	assert_int_equal(kvmem_hostpool_free_slots(pool), slots);
	fx_rmtree(da);
	fx_rmtree(db);
	assert_int_equal(kvmem_pager_pool_free(pool), 0);
}

struct worker {
	kvmem_hostpool *pool;
	const kvmem_page_geom *g;
	uint64_t seed;
	int bad;
};

static void *work(void *arg)
{
	struct worker *w = arg;
	char dir[256];
	kvmem_pager *p;

	if (!fx_tmpdir(dir, sizeof(dir)) || !(p = open_on(dir, w->g, w->pool))) {
		w->bad = 1;
		return NULL;
	}
	for (int round = 0; round < 6 && !w->bad; round++) {
		uint64_t n = (uint64_t)(round + 1) * w->g->block_tokens + round;

		w->bad |= (round % 2 ? fx_append(p, w->seed, n) : append_in_pool(p, w->seed, n)) != 0;
		w->bad |= fx_commit(p, w->seed, NULL, 0) != 0;
		w->bad |= fx_check(p, w->seed, 1) != 0;
	}
	if (w->bad)
		fprintf(stderr, "worker %" PRIu64 ": %s\n", w->seed, kvmem_last_error());
	w->bad |= kvmem_pager_close(p) != 0;
	fx_rmtree(dir);
	return NULL;
}

static void test_pagers_on_threads(void **state)
{
	uint64_t rng = g_seed ^ 0x53;
	kvmem_page_geom g = fx_geom(&rng);
	kvmem_hostpool *pool;
	struct worker w[4];
	pthread_t t[4];

	assert_int_equal(kvmem_pager_pool_create(&g, (uint64_t)16 * g.n_layers * kvmem_page_stride(&g),
						 -1, &pool), 0);
	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){ .pool = pool, .g = &g, .seed = fx_mix(g_seed ^ (i + 99)) };
		assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		assert_int_equal(w[i].bad, 0);
	}
	assert_int_equal(kvmem_hostpool_free_slots(pool), kvmem_hostpool_slots(pool));
	assert_int_equal(kvmem_pager_pool_free(pool), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_block_memory_is_not_copied),
		cmocka_unit_test(test_pagers_share_one_pool),
		cmocka_unit_test(test_scattered_slots),
		cmocka_unit_test(test_reserve_is_a_share),
		cmocka_unit_test(test_share_of_the_pool),
		cmocka_unit_test(test_pagers_on_threads),
	};

	g_seed = test_rng_fresh_seed("test_shared_pool");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

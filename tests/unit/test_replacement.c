// SPDX-License-Identifier: MIT
/*
 * Replacement policies: lru's exact order, lfu's aging, score's use of the
 * selector's hints, the busy predicate for all, and hit rates on a step
 * sequence where recency alone is the wrong guide.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "pager_fixture.h"
#include "pager/repl_int.h"

static uint64_t g_seed;

static int busy_odd(void *arg, uint32_t s)
{
	return s & 1;
}

static void test_registry(void **state)
{
	int n = 0;

	for (int i = 0; kvmem_repl_policies[i]; i++, n++) {
		assert_ptr_equal(kvmem_repl_find(kvmem_repl_policies[i]->name), kvmem_repl_policies[i]);
		assert_non_null(kvmem_repl_policies[i]->what);
	}
	assert_int_equal(n, 3);
	assert_non_null(kvmem_repl_find("lru"));
	assert_non_null(kvmem_repl_find("lfu"));
	assert_non_null(kvmem_repl_find("score"));
	assert_null(kvmem_repl_find("fifo"));
}

/* lru: victims come in exact least-recently-touched order. */
static void test_lru_order(void **state)
{
	uint64_t rng = g_seed;
	const kvmem_repl_ops *ops = kvmem_repl_find("lru");
	enum { N = 64 };
	uint32_t order[N], out[N], n = 0;
	void *st = ops->create(N, 1);

	for (uint32_t s = 0; s < N; s++) {
		ops->insert(st, s, s, 0);
		order[s] = s;
	}
	/* Touch random slots; keep the shadow order (oldest first). */
	for (int it = 0; it < 500; it++) {
		uint32_t s = test_rng_int(&rng, 0, N - 1), k = 0;

		ops->touch(st, s, it);
		while (order[k] != s)
			k++;
		memmove(order + k, order + k + 1, (N - 1 - k) * sizeof(*order));
		order[N - 1] = s;
	}
	assert_int_equal(ops->victims(st, N, out, 600, NULL, NULL), N);
	assert_memory_equal(out, order, sizeof(order));
	/* Busy slots are skipped; the rest keep their order. */
	n = ops->victims(st, N, out, 600, busy_odd, NULL);
	assert_int_equal(n, N / 2);
	for (uint32_t i = 0, j = 0; i < N; i++)
		if (!(order[i] & 1))
			assert_int_equal(out[j++], order[i]);
	ops->remove(st, order[0]);
	assert_int_equal(ops->victims(st, 1, out, 600, NULL, NULL), 1);
	assert_int_equal(out[0], order[1]);
	ops->destroy(st);
}

/* lfu: a page fetched often stays; once it stops being fetched, aging lets
 * a newly popular page win. */
static void test_lfu_aging(void **state)
{
	const kvmem_repl_ops *ops = kvmem_repl_find("lfu");
	void *st = ops->create(3, 1);
	uint32_t v;

	for (uint32_t s = 0; s < 3; s++)
		ops->insert(st, s, s, 0);
	for (int i = 0; i < 8; i++)
		ops->touch(st, 0, 1);	/* slot 0: popular at step 1 */
	ops->touch(st, 1, 2);
	ops->touch(st, 2, 2);
	ops->touch(st, 2, 2);
	assert_int_equal(ops->victims(st, 1, &v, 3, NULL, NULL), 1);
	assert_int_equal(v, 1);
	/* Slot 1 becomes popular much later; slot 0's old count has halved
	 * many times by then. */
	for (int step = 40; step < 44; step++) {
		ops->touch(st, 1, step);
		ops->touch(st, 2, step);
	}
	assert_int_equal(ops->victims(st, 1, &v, 44, NULL, NULL), 1);
	assert_int_equal(v, 0);
	assert_int_equal(ops->victims(st, 1, &v, 44, busy_odd, NULL), 1);
	assert_int_equal(v, 0);
	ops->destroy(st);
}

/* score: pages of blocks the selector hints at stay, even against pages
 * touched more recently; all layers of a block share the priority. */
static void test_score_hints(void **state)
{
	const kvmem_repl_ops *ops = kvmem_repl_find("score");
	enum { L = 4 };
	void *st = ops->create(3 * L, L);
	uint32_t out[3 * L];

	for (uint32_t b = 0; b < 3; b++)
		for (uint32_t l = 0; l < L; l++)
			ops->insert(st, b * L + l, b * L + l, 0);
	for (int step = 1; step < 6; step++) {
		ops->hint(st, 1, 1.0f, step);	/* chosen every step */
		ops->hint(st, 2, 0.5f, step);	/* a near miss */
		for (uint32_t l = 0; l < L; l++)
			ops->touch(st, 0 * L + l, step);	/* fetched, never hinted */
	}
	assert_int_equal(ops->victims(st, 3 * L, out, 6, NULL, NULL), 3 * L);
	for (uint32_t i = 0; i < 3 * L; i++)
		assert_int_equal(out[i] / L, i < L ? 0 : i < 2 * L ? 2 : 1);
	ops->destroy(st);
}

/*
 * Victim choice against a brute-force sort, for the policies that keep a
 * count per block (lfu, score): blocks of several layers, each block's
 * touches (lfu: on a random layer) or hints (score) at random steps,
 * keys recomputed here from the documented rule (per block, halving every
 * 4 steps; lfu breaks ties by age at 1e-9 per step; score adds 0.25 per
 * fetch of the page, halving too), then every `want` from 1 to all: the
 * victims must be the `want` lowest keys, lowest first. A count kept per
 * page instead of per block, or a heap that keeps the largest keys, fails.
 */
static double halve(double x, uint64_t steps)
{
	return x * exp2(-(double)steps / 4.0);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static void test_victims_match_brute_force(void **state)
{
	uint64_t rng = g_seed ^ 7;

	for (int pol = 0; pol < 2; pol++) {
		const kvmem_repl_ops *ops = kvmem_repl_find(pol ? "score" : "lfu");

		for (int round = 0; round < 20; round++) {
			enum { MAXB = 24, MAXL = 6 };
			uint32_t L = test_rng_int(&rng, 2, MAXL), nb = test_rng_int(&rng, 3, MAXB);
			uint32_t n = nb * L, out[MAXB * MAXL];
			uint64_t now = 40, last[MAXB * MAXL];
			double blockval[MAXB] = { 0 }, touch[MAXB * MAXL], key[MAXB * MAXL],
			       sorted[MAXB * MAXL];
			void *st = ops->create(n, L);

			/* Slot s holds page s (block s / L, layer s % L). */
			for (uint32_t s = 0; s < n; s++) {
				ops->insert(st, s, s, 0);
				last[s] = 0;
				touch[s] = 0.25;
			}
			/* Steps in order, as the pager makes them. */
			for (uint64_t t = 1; t < now; t++) {
				for (uint32_t b = 0; b < nb; b++) {
					uint32_t s = b * L + test_rng_int(&rng, 0, L - 1);

					if (test_rng_int(&rng, 0, 3))
						continue;
					if (pol == 0) {
						ops->touch(st, s, t);
						blockval[b] += halve(1.0, now - t);
						last[s] = t;
					} else {
						double x = test_rng_int(&rng, 1, 1000) / 1000.0;

						ops->hint(st, b, (float)x, t);
						blockval[b] += halve((float)x, now - t);
					}
				}
			}
			for (uint32_t s = 0; s < n; s++) {
				if (pol == 0)
					key[s] = blockval[s / L] - 1e-9 * (double)(now - last[s]);
				else
					key[s] = halve(touch[s], now) + blockval[s / L] - 1e-9 * (double)now;
				sorted[s] = key[s];
			}
			qsort(sorted, n, sizeof(double), cmp_double);
			for (uint32_t want = 1; want <= n; want++) {
				assert_int_equal(ops->victims(st, want, out, now, NULL, NULL), want);
				for (uint32_t i = 0; i < want; i++)
					if (fabs(key[out[i]] - sorted[i]) > 1e-9)
						fail_msg("%s: victim %u of %u is slot %u (block %u) with key "
							 "%.12f, the %u-th lowest key is %.12f", ops->name, i,
							 want, out[i], out[i] / L, key[out[i]], i, sorted[i]);
			}
			ops->destroy(st);
		}
	}
}

/* Every policy: victims never busy, never more than asked, all distinct. */
static void test_victims_contract(void **state)
{
	uint64_t rng = g_seed ^ 5;

	for (int i = 0; kvmem_repl_policies[i]; i++) {
		const kvmem_repl_ops *ops = kvmem_repl_policies[i];
		enum { N = 50 };
		void *st = ops->create(N, 2);
		uint8_t present[N] = { 0 };
		uint32_t out[N];

		for (int it = 0; it < 400; it++) {
			uint32_t s = test_rng_int(&rng, 0, N - 1), want, n;

			switch (test_rng_int(&rng, 0, 3)) {
			case 0:
				if (present[s])
					ops->remove(st, s);
				ops->insert(st, s, s, it);
				present[s] = 1;
				break;
			case 1:
				if (present[s])
					ops->touch(st, s, it);
				break;
			case 2:
				if (present[s])
					ops->remove(st, s);
				present[s] = 0;
				break;
			default:
				if (ops->hint)
					ops->hint(st, s / 2, test_rng_uniform(&rng), it);
			}
			want = test_rng_int(&rng, 1, N);
			n = ops->victims(st, want, out, it, busy_odd, NULL);
			assert_true(n <= want);
			for (uint32_t k = 0; k < n; k++) {
				assert_true(present[out[k]]);
				assert_false(out[k] & 1);
				for (uint32_t j = 0; j < k; j++)
					assert_int_not_equal(out[j], out[k]);
			}
		}
		ops->destroy(st);
	}
}

/* A hot set fetched every third step, two scans of blocks never seen again
 * in between: lru lets the scans flush the hot set; lfu and score keep it. */
static void test_hit_rates(void **state)
{
	uint64_t rng = g_seed ^ 6;
	enum { STEPS = 90, HOT = 10, SCAN = 8, L = 2 };
	size_t off[STEPS + 1], hoff[STEPS + 1], n = 0;
	uint64_t *pages = malloc(STEPS * (HOT + SCAN) * L * sizeof(*pages)), hb[STEPS * HOT];
	float hs[STEPS * HOT];
	uint64_t next_scan = HOT;
	double rate[3];

	for (int s = 0; s < STEPS; s++) {
		size_t first = n;

		off[s] = n;
		hoff[s] = s * HOT;
		for (int b = 0; b < HOT; b++) {
			hb[s * HOT + b] = b;	/* the selector keeps choosing these */
			hs[s * HOT + b] = 1.0f;
		}
		for (int b = 0; b < (s % 3 ? SCAN : HOT); b++) {
			uint64_t blk = s % 3 ? next_scan++ : (uint64_t)b;

			for (int l = 0; l < L; l++)
				pages[n++] = blk * L + l;
		}
		/* Fetch order within a step is shuffled. */
		for (size_t i = n - 1; i > first; i--) {
			size_t j = first + test_rng_int(&rng, 0, i - first);
			uint64_t t = pages[i];

			pages[i] = pages[j];
			pages[j] = t;
		}
	}
	off[STEPS] = n;
	hoff[STEPS] = STEPS * HOT;
	kvmem_repl_trace t = { STEPS, off, pages, hoff, hb, hs };

	for (int i = 0; i < 3; i++) {
		rate[i] = kvmem_repl_simulate(kvmem_repl_policies[i], (HOT + SCAN + 1) * L, L, &t, NULL,
					    NULL);
		print_message("%s hit rate %.3f\n", kvmem_repl_policies[i]->name, rate[i]);
	}
	/* The best possible: the hot set hits each time after the first,
	 * 10 of every 26 blocks. */
	assert_true(rate[0] < 0.05);
	assert_true(rate[1] > 0.3);
	assert_true(rate[2] > 0.3);
	free(pages);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_registry),
		cmocka_unit_test(test_lru_order),
		cmocka_unit_test(test_lfu_aging),
		cmocka_unit_test(test_score_hints),
		cmocka_unit_test(test_victims_match_brute_force),
		cmocka_unit_test(test_victims_contract),
		cmocka_unit_test(test_hit_rates),
	};

	g_seed = test_rng_fresh_seed("test_replacement");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

// SPDX-License-Identifier: MIT
/*
 * kvmem_session_reserve: room in the view claimed before a turn runs
 * (kvmem serve reserves a turn's prompt and max_tokens at its start, so that
 * a turn short of memory waits having done nothing). On the backend under
 * test (KVMEM_TEST_BACKEND, cpu when unset), random small models:
 *
 *  - A session that reserves room for its whole script first and its twin
 *    that does not get the same logits after every append and the same
 *    decoded tokens, bit for bit: room changes no result. On cpu the
 *    reserving one's view holds the room asked for (as far as budget +
 *    reserve) and its appends do not grow it.
 *  - Under a memory cap (kvmem_backend_opts.mem_cap) too small for the
 *    room asked, reserve fails with ENOMEM naming the cap and the session
 *    goes on as its twin does.
 *  - A negative count is EINVAL; a view given up is refused (EINVAL).
 */
#include <errno.h>
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

static kvmem_model *small_model(uint64_t *r)
{
	/* The CUDA attention takes head_dim 64 or 128 only. */
	const int hd = strcmp(test_backend_name(), "cuda") ? 16 : 64;
	kvmem_config c = test_model_config(test_rng_int(r, 1, 3), 64, 4, 2, hd, 96, 97,
					   test_rng_int(r, 0, 1));

	return test_model_random(&c, test_rng_next(r));
}

struct twin {
	kvmem_backend *b;
	kvmem_page_source src;
	kvmem_session *s;
};

static void twin_open(struct twin *t, const kvmem_model *m, uint64_t cap, int budget, int chunk,
		      uint64_t seed)
{
	const kvmem_config *c = &m->cfg;
	kvmem_session_opts o;

	if (kvmem_backend_open(test_backend_name(), m,
			       &(kvmem_backend_opts){ .max_chunk = chunk, .mem_cap = cap }, &t->b) < 0)
		fail_msg("backend %s: %s", test_backend_name(), kvmem_last_error());
	assert_int_equal(kvmem_page_source_mem(&t->src, c->n_layers, c->n_kv_heads, c->head_dim, 16),
			 0);
	kvmem_session_opts_default(&o);
	o.block = 16;
	o.budget = budget;
	o.chunk = chunk;
	o.seed = seed;
	o.source = &t->src;
	if (!(t->s = kvmem_session_create(t->b, &o)))
		fail_msg("session: %s", kvmem_last_error());
}

static void twin_close(struct twin *t)
{
	kvmem_session_free(t->s);
	kvmem_page_source_destroy(&t->src);
	kvmem_backend_close(t->b);
}

/* The view's room on cpu (its host view); -1 where the backend keeps none. */
static int64_t room(const kvmem_session *s)
{
	const kvmem_kvcache *kv = kvmem_session_view(s);

	return kv ? kv->cap : -1;
}

/* The script: appends of random sizes, then a greedy decode; a and b get
 * the same calls and must give the same bits. */
static void run_both(struct twin *a, struct twin *b, uint64_t *r, int vocab, int chunk, int total)
{
	const int64_t room0 = room(a->s);
	int32_t ids[256], out_a[8], out_b[8];
	int done = 0;

	while (done < total) {
		int n = test_rng_int(r, 1, chunk);

		n = n < total - done ? n : total - done;
		for (int i = 0; i < n; i++)
			ids[i] = test_rng_int(r, 0, vocab - 1);
		assert_int_equal(kvmem_session_append(a->s, ids, n, 0), 0);
		assert_int_equal(kvmem_session_append(b->s, ids, n, 0), 0);
		assert_memory_equal(kvmem_session_logits(a->s), kvmem_session_logits(b->s),
				    (size_t)vocab * sizeof(float));
		done += n;
	}
	assert_int_equal(kvmem_session_decode(a->s, 8, NULL, out_a), 0);
	assert_int_equal(kvmem_session_decode(b->s, 8, NULL, out_b), 0);
	assert_memory_equal(out_a, out_b, sizeof(out_a));
	/* The room reserved first was enough: no growth on the way. */
	if (room0 >= 0 && room0 >= total + 8)
		assert_int_equal(room(a->s), room0);
}

static void test_reserve_same_bits(void **state)
{
	uint64_t r = test_rng_named(g_seed, "same bits");

	for (int i = 0; i < 6; i++) {
		kvmem_model *m = small_model(&r);
		const int chunk = test_rng_int(&r, 8, 64), total = test_rng_int(&r, 40, 400);
		/* Unlimited, or a budget below the history: room stops at
		 * budget + reserve. */
		const int budget = test_rng_int(&r, 0, 1) ? 0 : 64 + 16 * test_rng_int(&r, 0, 8);
		const uint64_t seed = test_rng_next(&r);
		struct twin a, b;

		twin_open(&a, m, 0, budget, chunk, seed);
		twin_open(&b, m, 0, budget, chunk, seed);
		assert_int_equal(kvmem_session_reserve(a.s, total + 8), 0);
		if (room(a.s) >= 0) {
			/* As far as the view may grow: the room asked for,
			 * or the view's limit (budget + reserve). */
			if (!budget)
				assert_true(room(a.s) >= total + 8);
			else
				assert_true(room(a.s) >= (total + 8 < budget ? total + 8 : budget));
			assert_int_equal(room(b.s), 0);
		}
		run_both(&a, &b, &r, m->cfg.vocab, chunk, total);
		twin_close(&a);
		twin_close(&b);
		test_model_free(m);
	}
}

static void test_reserve_refused_under_cap(void **state)
{
	uint64_t r = test_rng_named(g_seed, "cap");

	if (strcmp(test_backend_name(), "cpu"))
		skip();	/* the cap's arithmetic below is the cpu view's */
	for (int i = 0; i < 4; i++) {
		kvmem_model *m = small_model(&r);
		const kvmem_config *c = &m->cfg;
		/* A slot's bytes on cpu: fp32 K, V and raw K, every layer. */
		const uint64_t slot = (uint64_t)c->n_layers * c->n_kv_heads * c->head_dim * 4 * 3;
		const int chunk = test_rng_int(&r, 8, 32), total = test_rng_int(&r, 40, 200);
		const uint64_t cap = slot * 4096;	/* a 1024-slot view grows to 2048 inside it */
		const uint64_t seed = test_rng_next(&r);
		struct twin a, b;

		twin_open(&a, m, cap, 0, chunk, seed);
		twin_open(&b, m, 0, 0, chunk, seed);
		assert_int_equal(kvmem_session_reserve(a.s, 100000), -ENOMEM);
		assert_int_equal(kvmem_last_errno(), ENOMEM);
		assert_non_null(strstr(kvmem_last_error(), "cap"));
		assert_int_equal(room(a.s), 0);	/* nothing taken */
		run_both(&a, &b, &r, c->vocab, chunk, total);
		/* Room that fits is made. */
		assert_int_equal(kvmem_session_reserve(a.s, 500), 0);
		assert_true(room(a.s) >= total + 8 + 500);
		twin_close(&a);
		twin_close(&b);
		test_model_free(m);
	}
}

static void test_reserve_refusals(void **state)
{
	uint64_t r = test_rng_named(g_seed, "refusals");
	kvmem_model *m = small_model(&r);
	struct twin a;
	int32_t ids[4] = { 1, 2, 3, 4 };

	twin_open(&a, m, 0, 0, 16, test_rng_next(&r));
	assert_int_equal(kvmem_session_reserve(a.s, -1), -EINVAL);
	assert_int_equal(kvmem_session_reserve(a.s, 0), 0);
	assert_int_equal(kvmem_session_append(a.s, ids, 4, 0), 0);
	assert_int_equal(kvmem_session_release_view(a.s), 0);
	assert_int_equal(kvmem_session_reserve(a.s, 8), -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "kvmem_session_restore_view"));
	assert_int_equal(kvmem_session_restore_view(a.s), 0);
	assert_int_equal(kvmem_session_reserve(a.s, 8), 0);
	twin_close(&a);
	test_model_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reserve_same_bits),
		cmocka_unit_test(test_reserve_refused_under_cap),
		cmocka_unit_test(test_reserve_refusals),
	};

	g_seed = test_rng_fresh_seed("test_ws_reserve");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

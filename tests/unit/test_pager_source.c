// SPDX-License-Identifier: MIT
/*
 * The session's page source over the pager: a CPU agent session paged
 * through a host pool far smaller than its workspace decodes exactly what the
 * same session over plain host memory decodes, logit for logit; the
 * workspace it leaves verifies; a session committed (with its state),
 * closed and adopted from the reopened workspace goes on exactly like one
 * that never stopped, at a budget over the workspace and at a small one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "kvmem/store.h"
#include "session/inspect.h"
#include "pager_fixture.h"

static uint64_t g_seed;

struct logs {
	float *buf;
	size_t n, cap;
	int vocab;
};

static void log_forward(void *arg, const int32_t *tok, int n, const float *logits)
{
	struct logs *lg = arg;

	if (lg->n + lg->vocab > lg->cap) {
		lg->cap = (lg->cap + lg->vocab) * 2;
		lg->buf = realloc(lg->buf, lg->cap * sizeof(float));
	}
	memcpy(lg->buf + lg->n, logits, lg->vocab * sizeof(float));
	lg->n += lg->vocab;
}

struct run {
	kvmem_model *m;
	kvmem_backend *e;
	int block;
	int64_t budget;
	const char *dir;	/* NULL: memory source */
	uint64_t cap;		/* host pool bytes */
	const char *policy;
	const char *repl;	/* pager replacement policy */
};

/* Prompts and decode lengths of the steps, from the seed. */
static int step_tokens(uint64_t seed, int step, int vocab, int32_t *out, int *decode)
{
	uint64_t r = fx_mix(seed + step);
	int n = 5 + (int)(r % 40);

	for (int i = 0; i < n; i++)
		out[i] = (int32_t)(fx_mix(r + i) % vocab);
	*decode = 3 + (int)(fx_mix(r ^ 7) % 6);
	return n;
}

/*
 * Steps [first, last) of the session: over memory, or over a pager in dir
 * (created or reopened; a reopened one is adopted), committed after each
 * step. Decoded tokens go to out; returns how many.
 */
static int run_steps(const struct run *r, int first, int last, uint64_t seed, int32_t *out,
		     struct logs *lg)
{
	kvmem_session_opts o;
	kvmem_page_source src = { 0 };
	kvmem_pager *p = NULL;
	kvmem_session *s;
	int got = 0;

	kvmem_session_opts_default(&o);
	o.block = r->block;
	o.budget = r->budget;
	o.chunk = 16;
	o.policy = r->policy;
	o.on_forward = lg ? log_forward : NULL;
	o.arg = lg;
	if (r->dir) {
		kvmem_pager_opts po;
		kvmem_page_geom g;

		kvmem_pager_opts_default(&po);
		po.host_cap = r->cap;
		po.flags = KVMEM_PAGER_CREATE;
		po.policy = r->repl ? r->repl : "lru";
		kvmem_page_geom_model(&g, r->m, r->block);
		assert_int_equal(kvmem_pager_open(r->dir, &g, &po, &p), 0);
		assert_int_equal(kvmem_page_source_pager(&src, p), 0);
		o.source = &src;
	}
	s = kvmem_session_create(r->e, &o);
	assert_non_null(s);
	if (p && kvmem_pager_tokens(p)) {
		int64_t n = kvmem_pager_tokens(p);
		int32_t *ids = malloc(n * sizeof(*ids));

		uint32_t len;
		const void *state = kvmem_pager_app_state(p, &len);

		assert_int_equal(kvmem_pager_read_tokens(p, 0, n, ids), 0);
		if (kvmem_session_adopt_state(s, ids, n, state, len))
			fail_msg("adopt_state: %s", kvmem_last_error());
		free(ids);
	}
	for (int step = first; step < last; step++) {
		int32_t prompt[64];
		int decode, n = step_tokens(seed, step, r->m->cfg.vocab, prompt, &decode);

		assert_int_equal(kvmem_session_append(s, prompt, n, step == 0), 0);
		assert_int_equal(kvmem_session_decode(s, decode, NULL, out + got), 0);
		got += decode;
		if (p) {
			void *st;
			size_t len;

			assert_int_equal(kvmem_session_save_state(s, &st, &len), 0);
			assert_int_equal(kvmem_page_source_commit(&src, kvmem_session_token_ids(s),
								      kvmem_session_tokens(s), st,
								      len), 0);
			free(st);
			assert_int_equal(kvmem_pager_step(p, step + 1), 0);
		}
	}
	kvmem_session_free(s);
	if (p) {
		kvmem_pager_stats st;

		kvmem_pager_stats_get(p, &st);
		if (r->cap < (1u << 20))
			print_message("pager: %llu hits, %llu misses, %llu pages in, %llu evictions\n",
				      (unsigned long long)st.host_hits,
				      (unsigned long long)st.host_misses,
				      (unsigned long long)st.pages_in,
				      (unsigned long long)st.evictions);
		kvmem_page_source_destroy(&src);
		assert_int_equal(kvmem_pager_close(p), 0);
	}
	return got;
}

static kvmem_model *model(uint64_t *rng)
{
	kvmem_config c = test_model_config(2, 64, 4, 2, 16, 96, 97, test_rng_int(rng, 0, 1));

	return test_model_random(&c, fx_mix(*rng));
}

/* Paging through a pool of a few pages changes nothing: same logits, same
 * tokens, for a small budget (selection, re-reads) and a full one. */
static void test_paging_is_exact(void **state)
{
	uint64_t rng = g_seed, seed = fx_mix(g_seed + 1);
	kvmem_model *m = model(&rng);
	kvmem_backend *e = kvmem_backend_cpu(m, 64);
	const int64_t budgets[] = { 96, 96, 96, 0 };
	const char *repl[] = { "lru", "lfu", "score", "lru" };
	char dir[256];

	assert_non_null(e);
	for (int i = 0; i < 4; i++) {
		struct run mem = { m, e, 16, budgets[i], NULL, 0, "meank", repl[i] }, pg = mem;
		struct logs a = { .vocab = m->cfg.vocab }, b = { .vocab = m->cfg.vocab };
		int32_t ta[1024], tb[1024];
		int na, nb;
		kvmem_page_geom g;

		kvmem_page_geom_model(&g, m, 16);
		assert_non_null(fx_tmpdir(dir, sizeof(dir)));
		pg.dir = dir;
		pg.cap = kvmem_page_stride(&g) * (g.n_layers + 2);	/* a block and a bit */
		na = run_steps(&mem, 0, 12, seed, ta, &a);
		nb = run_steps(&pg, 0, 12, seed, tb, &b);
		assert_int_equal(na, nb);
		assert_memory_equal(ta, tb, na * sizeof(int32_t));
		assert_int_equal(a.n, b.n);
		assert_memory_equal(a.buf, b.buf, a.n * sizeof(float));
		assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), 0);
		free(a.buf);
		free(b.buf);
		fx_rmtree(dir);
	}
	kvmem_backend_close(e);
	test_model_free(m);
}

/*
 * Two parts with a close and reopen between them decode what one go does
 * and compute the same logits, with a budget that holds the whole workspace
 * and with one that holds a fraction of it: the session state stored with
 * the commit brings back the view, the queries and the logits it had.
 */
static void two_parts(int64_t budget)
{
	uint64_t rng = g_seed ^ 3, seed = fx_mix(g_seed + 3);
	kvmem_model *m = model(&rng);
	kvmem_backend *e = kvmem_backend_cpu(m, 64);
	char d1[256], d2[256];
	int32_t one[512], two[512];
	int split = test_rng_int(&rng, 1, 5), n1, n2a, n2b;
	struct logs l1 = { .vocab = m->cfg.vocab }, l2 = l1;
	kvmem_page_geom g;

	kvmem_page_geom_model(&g, m, 16);
	assert_non_null(fx_tmpdir(d1, sizeof(d1)));
	assert_non_null(fx_tmpdir(d2, sizeof(d2)));
	struct run a = { m, e, 16, budget, d1, kvmem_page_stride(&g) * 3 * g.n_layers, "meank",
			 "lru" };
	struct run b = a;

	b.dir = d2;
	n1 = run_steps(&a, 0, 6, seed, one, &l1);
	n2a = run_steps(&b, 0, split, seed, two, &l2);
	n2b = run_steps(&b, split, 6, seed, two + n2a, &l2);
	assert_int_equal(n1, n2a + n2b);
	assert_memory_equal(one, two, n1 * sizeof(int32_t));
	assert_int_equal(l1.n, l2.n);
	assert_memory_equal(l1.buf, l2.buf, l1.n * sizeof(float));
	free(l1.buf);
	free(l2.buf);
	/* Both workspaces hold the same history. */
	{
		kvmem_pager *p1, *p2;
		int32_t t1[2048], t2[2048];

		assert_int_equal(kvmem_pager_open(d1, &g, &(kvmem_pager_opts){ .flags = KVMEM_PAGER_RDONLY,
									.host_cap = 1 << 20,
									.numa_node = -1 }, &p1), 0);
		assert_int_equal(kvmem_pager_open(d2, &g, &(kvmem_pager_opts){ .flags = KVMEM_PAGER_RDONLY,
									.host_cap = 1 << 20,
									.numa_node = -1 }, &p2), 0);
		assert_int_equal(kvmem_pager_tokens(p1), kvmem_pager_tokens(p2));
		assert_int_equal(kvmem_pager_read_tokens(p1, 0, kvmem_pager_tokens(p1), t1), 0);
		assert_int_equal(kvmem_pager_read_tokens(p2, 0, kvmem_pager_tokens(p2), t2), 0);
		assert_memory_equal(t1, t2, kvmem_pager_tokens(p1) * 4);
		kvmem_pager_close(p1);
		kvmem_pager_close(p2);
	}
	fx_rmtree(d1);
	fx_rmtree(d2);
	kvmem_backend_close(e);
	test_model_free(m);
}

static void test_two_parts_equal_one_go(void **state)
{
	two_parts(0);		/* the whole workspace */
	two_parts(48);		/* a small fraction of about 200 tokens */
}

/* A workspace written for one model is refused by another, naming both. */
static void test_other_model_refused(void **state)
{
	uint64_t rng = g_seed ^ 5, seed = fx_mix(g_seed + 5);
	kvmem_model *m1 = model(&rng), *m2;
	kvmem_backend *e = kvmem_backend_cpu(m1, 64);
	kvmem_page_geom g1, g2;
	char dir[256], fp[32];
	int32_t out[512];
	kvmem_pager *p;

	rng++;
	m2 = model(&rng);
	/* In-memory test models have no weight fingerprint; give them one. */
	m1->fingerprint = fx_mix(seed) | 1;
	m2->fingerprint = fx_mix(seed + 1) | 1;
	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	struct run r = { m1, e, 16, 0, dir, 1 << 20, "meank", "lru" };

	run_steps(&r, 0, 2, seed, out, NULL);
	kvmem_page_geom_model(&g1, m1, 16);
	kvmem_page_geom_model(&g2, m2, 16);
	assert_true(kvmem_pager_open(dir, &g2, NULL, &p) < 0);
	snprintf(fp, sizeof(fp), "%016llx", (unsigned long long)g1.fingerprint);
	assert_non_null(strstr(kvmem_last_error(), fp));
	snprintf(fp, sizeof(fp), "%016llx", (unsigned long long)g2.fingerprint);
	assert_non_null(strstr(kvmem_last_error(), fp));
	fx_rmtree(dir);
	kvmem_backend_close(e);
	test_model_free(m1);
	test_model_free(m2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_paging_is_exact),
		cmocka_unit_test(test_two_parts_equal_one_go),
		cmocka_unit_test(test_other_model_refused),
	};

	g_seed = test_rng_fresh_seed("test_pager_source");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

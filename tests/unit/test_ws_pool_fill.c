// SPDX-License-Identifier: MIT
/*
 * The device page pool filled when a session adopts a stored history
 * (user/session/pool_fill.c), on the backend under test
 * (KVMEM_TEST_BACKEND):
 *
 *  - a reopened bf16 workspace, adopted, then steps (a question appended,
 *    a selection, two tokens decoded) that bring blocks from anywhere back
 *    into the view: every logit is the same bits with the fill and without
 *    it (KVMEM_POOL_FILL=0);
 *  - on a backend with a page pool (pool_fill: cuda) the fill took pages
 *    at adopt, and the steps read pages from the pool that the run without
 *    it read from host memory. The cpu backend keeps no pool: only the
 *    bits are compared there;
 *  - on the cpu backend wrapped with a recording pool: what the session
 *    offers (every whole block outside the first view, all its layers,
 *    whole bf16 pages of host memory) and that a full pool stops it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "kvmem/store.h"
#include "backend/backend_impl.h"
#include "helpers/test_model.h"
#include "helpers/test_logits.h"
#include "helpers/test_tmpdir.h"

static uint64_t g_seed;

static kvmem_model *small_model(uint64_t *rng)
{
	/* The CUDA attention takes head_dim 64 or 128 only. */
	const int cuda = !strcmp(test_backend_name(), "cuda");
	kvmem_config c = test_model_config(2, 24, 4, 2, cuda ? 64 : 16, 40, 53,
					   test_rng_int(rng, 0, 1));

	return test_model_random(&c, (uint64_t)test_rng_int(rng, 1, 1 << 30));
}

enum { B = 16, N0 = 48 * B, ROUNDS = 6 };

static void opts(kvmem_session_opts *o, kvmem_workspace *w, struct test_logits *r)
{
	kvmem_session_opts_default(o);
	o->block = B;
	o->chunk = 32;
	o->budget = 8 * B;
	o->sink = 0;
	o->recent = B;
	o->policy = "random";	/* blocks enter from everywhere, steps alike in both runs */
	o->source = kvmem_workspace_source(w);
	if (r) {
		o->on_forward = test_logits_record;
		o->arg = r;
	}
}

/* The workspace: N0 tokens appended and committed. */
static void write_history(kvmem_backend *e, const char *dir, const int32_t *tok)
{
	kvmem_workspace_opts wo = { .block = B, .dtype = KVMEM_DTYPE_BF16 };
	kvmem_session_opts o;
	kvmem_workspace *w;
	kvmem_session *s;

	if (kvmem_workspace_open(dir, e->model, &wo, &w) < 0)
		fail_msg("%s", kvmem_last_error());
	opts(&o, w, NULL);
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	assert_int_equal(kvmem_session_append(s, tok, N0, 0), 0);
	assert_true(kvmem_workspace_commit(w, s) >= 0);
	kvmem_session_free(s);
	assert_int_equal(kvmem_workspace_close(w), 0);
}

/* Reopened, adopted (fresh selection), ROUNDS steps; place() counters
 * over the adopt (at) and over the steps (st). */
static void run(kvmem_backend *e, const char *dir, const int32_t *tok, int fill, struct test_logits *r,
		kvmem_place_stats *at, kvmem_place_stats *st)
{
	kvmem_workspace_opts wo = { .block = B, .dtype = KVMEM_DTYPE_BF16 };
	const char *was = getenv("KVMEM_POOL_FILL");
	char keep[16] = "";
	kvmem_place_stats p0 = { 0 }, p1 = { 0 }, p2 = { 0 };
	kvmem_session_opts o;
	kvmem_workspace *w;
	kvmem_session *s;
	int32_t out[2];

	if (was)
		snprintf(keep, sizeof(keep), "%s", was);
	if (kvmem_workspace_open(dir, e->model, &wo, &w) < 0)
		fail_msg("%s", kvmem_last_error());
	opts(&o, w, r);
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	/* The peer turns it off; the run with it leaves the caller's
	 * setting (KVMEM_POOL_FILL=0 from outside: the check must fail). */
	if (!fill)
		setenv("KVMEM_POOL_FILL", "0", 1);
	if (e->ops->place_stats)
		e->ops->place_stats(e->ctx, &p0);
	assert_int_equal(kvmem_session_adopt(s, tok, N0), 0);
	if (e->ops->place_stats)
		e->ops->place_stats(e->ctx, &p1);
	if (was)
		setenv("KVMEM_POOL_FILL", keep, 1);
	else
		unsetenv("KVMEM_POOL_FILL");
	for (int i = 0; i < ROUNDS; i++) {
		assert_int_equal(kvmem_session_append(s, tok + N0 + 8 * i, 8, 0), 0);
		assert_int_equal(kvmem_session_select(s), 0);
		assert_int_equal(kvmem_session_decode(s, 2, NULL, out), 0);
	}
	if (e->ops->place_stats)
		e->ops->place_stats(e->ctx, &p2);
	kvmem_session_free(s);
	assert_int_equal(kvmem_workspace_close(w), 0);
	*at = (kvmem_place_stats){ .filled_pages = p1.filled_pages - p0.filled_pages,
				   .pool_pages = p1.pool_pages, .pool_cap = p1.pool_cap };
	*st = (kvmem_place_stats){ .pool_hits = p2.pool_hits - p1.pool_hits,
				   .bytes_in = p2.bytes_in - p1.bytes_in,
				   .items = p2.items - p1.items };
}

static void test_pool_fill_equal(void **state)
{
	uint64_t rng = g_seed ^ 0xf1;
	kvmem_model *m = small_model(&rng);
	kvmem_backend *e;
	kvmem_place_stats at0, st0, at1, st1;
	struct test_logits r0 = { .vocab = m->cfg.vocab }, r1 = { .vocab = m->cfg.vocab };
	int32_t *tok = malloc(sizeof(int32_t) * (N0 + 8 * ROUNDS));
	char tmp[256], dir[300];

	assert_non_null(tok);
	for (int i = 0; i < N0 + 8 * ROUNDS; i++)
		tok[i] = test_rng_int(&rng, 0, m->cfg.vocab - 1);
	if (kvmem_backend_open(test_backend_name(), m, &(kvmem_backend_opts){ .max_chunk = 32 },
			       &e) < 0)
		fail_msg("backend: %s", kvmem_last_error());
	assert_int_equal(test_tmpdir_make(tmp, sizeof(tmp), "ws-fill"), 0);
	snprintf(dir, sizeof(dir), "%s/ws", tmp);
	write_history(e, dir, tok);
	run(e, dir, tok, 0, &r0, &at0, &st0);
	run(e, dir, tok, 1, &r1, &at1, &st1);
	assert_int_equal(r0.n, r1.n);
	assert_true(r0.n > 0);
	assert_memory_equal(r0.buf, r1.buf, r0.n * sizeof(float));
	print_message("%s: adopt filled %llu pages (pool %llu of %llu slots); steps: %llu items, "
		      "%llu from the pool with the fill (%llu without), %.1f KB from host memory "
		      "(%.1f KB without)\n", e->ops->name, (unsigned long long)at1.filled_pages,
		      (unsigned long long)at1.pool_pages, (unsigned long long)at1.pool_cap,
		      (unsigned long long)st1.items, (unsigned long long)st1.pool_hits,
		      (unsigned long long)st0.pool_hits, st1.bytes_in / 1e3, st0.bytes_in / 1e3);
	assert_int_equal(at0.filled_pages, 0);
	if (e->ops->pool_fill) {
		assert_true(at1.filled_pages > 0);
		assert_true(st1.pool_hits > st0.pool_hits);
		assert_true(st1.bytes_in < st0.bytes_in);
	}
	free(r0.buf);
	free(r1.buf);
	free(tok);
	test_tmpdir_remove(tmp);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* ---- what the session hands a pool (a backend wrapped to record it) ---- */
static struct {
	int64_t block[4096];
	int layer[4096], n, calls, room;
	int bad;		/* an item not a whole, resident bf16 page */
} g_fill;

static int fake_register(void *ctx, void *base, size_t len)
{
	return 0;
}

static void fake_unregister(void *ctx, void *base)
{
}

/* Takes up to g_fill.room pages, as a pool with that many free slots. */
static int fake_fill(void *ctx, const kvmem_place *it, int n)
{
	int took = 0;

	g_fill.calls++;
	for (int i = 0; i < n && g_fill.room > 0 && g_fill.n < 4096; i++) {
		if (it[i].u0 || it[i].n != B || it[i].stride != B || !it[i].owner ||
		    it[i].page.mem != KVMEM_MEM_HOST || it[i].page.dtype != KVMEM_DTYPE_BF16)
			g_fill.bad++;
		g_fill.block[g_fill.n] = it[i].block;
		g_fill.layer[g_fill.n++] = it[i].layer;
		g_fill.room--;
		took++;
	}
	return took;
}

static void fill_run(kvmem_backend *e, const char *dir, const int32_t *tok, int room,
		     kvmem_plan *first)
{
	kvmem_workspace_opts wo = { .block = B, .dtype = KVMEM_DTYPE_BF16 };
	kvmem_session_opts o;
	kvmem_workspace *w;
	kvmem_session *s;
	const kvmem_plan *p;

	memset(&g_fill, 0, sizeof(g_fill));
	g_fill.room = room;
	if (kvmem_workspace_open(dir, e->model, &wo, &w) < 0)
		fail_msg("%s", kvmem_last_error());
	opts(&o, w, NULL);
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	assert_int_equal(kvmem_session_adopt(s, tok, N0), 0);
	p = kvmem_session_plan(s);
	first->n_view = p->n_view;
	first->n_sets = p->n_sets;
	first->blocks = malloc(sizeof(int64_t) * (size_t)(p->n_view * p->n_sets + 1));
	assert_non_null(first->blocks);
	memcpy(first->blocks, p->blocks, sizeof(int64_t) * (size_t)(p->n_view * p->n_sets));
	kvmem_session_free(s);
	assert_int_equal(kvmem_workspace_close(w), 0);
}

/*
 * On the cpu backend wrapped with a recording pool: adopt hands the pool
 * every page of every whole block outside the first view (all layers),
 * none of the view's, each a whole bf16 page of host memory; a pool with
 * fewer free slots stops the fill (no further call once it took less).
 */
static void test_pool_fill_offers(void **state)
{
	uint64_t rng = g_seed ^ 0xf2;
	kvmem_model *m;
	kvmem_backend *e;
	kvmem_backend_ops ops;
	const kvmem_backend_ops *inner;
	kvmem_plan first = { 0 };
	int32_t *tok;
	char tmp[256], dir[300];
	int L, per[N0 / B] = { 0 };

	if (strcmp(test_backend_name(), "cpu"))
		skip();
	m = small_model(&rng);
	L = m->cfg.n_layers;
	tok = malloc(sizeof(int32_t) * N0);
	assert_non_null(tok);
	for (int i = 0; i < N0; i++)
		tok[i] = test_rng_int(&rng, 0, m->cfg.vocab - 1);
	if (kvmem_backend_open("cpu", m, &(kvmem_backend_opts){ .max_chunk = 32 }, &e) < 0)
		fail_msg("backend: %s", kvmem_last_error());
	assert_int_equal(test_tmpdir_make(tmp, sizeof(tmp), "ws-offers"), 0);
	snprintf(dir, sizeof(dir), "%s/ws", tmp);
	write_history(e, dir, tok);
	ops = *e->ops;
	inner = e->ops;
	ops.host_register = fake_register;
	ops.host_unregister = fake_unregister;
	ops.pool_fill = fake_fill;
	e->ops = &ops;

	fill_run(e, dir, tok, 1 << 30, &first);
	assert_int_equal(g_fill.bad, 0);
	assert_int_equal(first.n_sets, 1);
	for (int i = 0; i < g_fill.n; i++) {
		assert_true(g_fill.block[i] >= 0 && g_fill.block[i] < N0 / B);
		assert_true(g_fill.layer[i] >= 0 && g_fill.layer[i] < L);
		per[g_fill.block[i]]++;
	}
	for (int i = 0; i < first.n_view; i++)
		per[first.blocks[i]] = per[first.blocks[i]] ? -1 : L;	/* in the view: none */
	for (int b = 0; b < N0 / B; b++)
		assert_int_equal(per[b], L);
	assert_int_equal(g_fill.n, (N0 / B - first.n_view) * L);
	free(first.blocks);

	/* A pool with 5 free slots: 5 pages, then no further call. */
	fill_run(e, dir, tok, 5, &first);
	assert_int_equal(g_fill.n, 5);
	assert_int_equal(g_fill.calls, 1);
	free(first.blocks);

	e->ops = inner;
	free(tok);
	test_tmpdir_remove(tmp);
	kvmem_backend_close(e);
	test_model_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pool_fill_equal),
		cmocka_unit_test(test_pool_fill_offers),
	};

	g_seed = test_rng_fresh_seed("test_ws_pool_fill");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

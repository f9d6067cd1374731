// SPDX-License-Identifier: MIT
/*
 * A forward pass asked for the queries of its last q_last tokens only
 * (kvmem_fwd_out.q_last) on the backend under test (KVMEM_TEST_BACKEND,
 * cpu when unset):
 *
 *  - q_raw holds, packed [L][q_last][n_heads][head_dim], bit for bit the
 *    last q_last rows of each layer of the same call with q_last = 0, and
 *    nothing past them; raw K, V and logits are the same bits; q_last >= n
 *    means all n. Prefill chunks over a growing view, then one-token steps
 *    (the cuda backend's graph path).
 *  - A negative q_last fails and leaves the view as it was.
 *  - A session (which asks for its last query_tokens only) selects with
 *    exactly the queries of the last query_tokens tokens of a plain run
 *    beside it, seen through the selection tap, over appends longer and
 *    shorter than query_tokens and decode steps.
 */
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

static kvmem_backend *test_backend(const kvmem_model *m, int chunk)
{
	kvmem_backend *b;

	if (kvmem_backend_open(test_backend_name(), m, &(kvmem_backend_opts){ .max_chunk = chunk },
			       &b) < 0)
		fail_msg("backend: %s", kvmem_last_error());
	return b;
}

static kvmem_model *small_model(uint64_t *rng)
{
	static const int geo[][4] = {	/* layers, heads, kv heads, head_dim */
		{ 2, 4, 2, 16 }, { 3, 6, 2, 8 }, { 1, 2, 1, 12 },
	};
	/* The CUDA attention takes head_dim 64 or 128 only. */
	static const int gpu_geo[][4] = {
		{ 2, 4, 2, 64 }, { 3, 6, 2, 64 }, { 1, 2, 1, 128 },
	};
	const int *g = (!strcmp(test_backend_name(), "cuda") ? gpu_geo : geo)[test_rng_int(rng, 0, 2)];
	kvmem_config c = test_model_config(g[0], 24, g[1], g[2], g[3], 40, 61,
					   test_rng_int(rng, 0, 1));

	return test_model_random(&c, test_rng_next(rng));
}

static void random_tokens(uint64_t *rng, int32_t *t, int n, int vocab)
{
	for (int i = 0; i < n; i++)
		t[i] = test_rng_int(rng, 0, vocab - 1);
}

/* What one call returns. */
struct outs {
	float *k, *v, *q, *logits;
};

static void outs_alloc(struct outs *o, const kvmem_config *c, int C)
{
	size_t L = c->n_layers, kw = (size_t)c->n_kv_heads * c->head_dim;
	size_t qw = (size_t)c->n_heads * c->head_dim;

	o->k = malloc(sizeof(float) * L * C * kw);
	o->v = malloc(sizeof(float) * L * C * kw);
	o->q = malloc(sizeof(float) * L * C * qw);
	o->logits = malloc(sizeof(float) * C * c->vocab);
	assert_true(o->k && o->v && o->q && o->logits);
}

static void outs_free(struct outs *o)
{
	free(o->k);
	free(o->v);
	free(o->q);
	free(o->logits);
}

/*
 * One call of n tokens on two views holding the same history: a with every
 * query, b with the last q_last. b's q buffer is filled with a canary
 * first; whatever b's call does not write must keep it.
 */
static void one_call(kvmem_backend *e, kvmem_view *va, kvmem_view *vb, const int32_t *tok, int n,
		     int q_last, struct outs *a, struct outs *b, int C)
{
	const kvmem_config *c = &e->model->cfg;
	const size_t L = c->n_layers, kw = (size_t)c->n_kv_heads * c->head_dim;
	const size_t qw = (size_t)c->n_heads * c->head_dim, all = L * C * qw;
	const int rows = q_last > 0 && q_last < n ? q_last : n;
	kvmem_fwd_out fa = { .raw_k = a->k, .v = a->v, .q_raw = a->q };
	kvmem_fwd_out fb = { .raw_k = b->k, .v = b->v, .q_raw = b->q, .q_last = q_last };
	const uint32_t canary = 0x7fc12345u;	/* a NaN no forward pass makes */

	for (size_t i = 0; i < all; i++)
		memcpy(b->q + i, &canary, sizeof(canary));
	assert_int_equal(kvmem_fwd_q_rows(&fb, n), rows);
	assert_int_equal(kvmem_fwd_q_rows(&fa, n), n);
	assert_int_equal(kvmem_backend_append_out(e, va, tok, n, a->logits, 1, &fa), 0);
	assert_int_equal(kvmem_backend_append_out(e, vb, tok, n, b->logits, 1, &fb), 0);
	assert_memory_equal(a->logits, b->logits, sizeof(float) * n * c->vocab);
	assert_memory_equal(a->k, b->k, sizeof(float) * L * n * kw);
	assert_memory_equal(a->v, b->v, sizeof(float) * L * n * kw);
	for (size_t l = 0; l < L; l++)
		assert_memory_equal(b->q + l * rows * qw, a->q + (l * n + (n - rows)) * qw,
				    sizeof(float) * rows * qw);
	for (size_t i = L * rows * qw; i < all; i++)
		assert_memory_equal(b->q + i, &canary, sizeof(canary));
}

static void test_qlast_rows(void **state)
{
	uint64_t rng = g_seed ^ 0x51a57;

	for (int rep = 0; rep < 4; rep++) {
		kvmem_model *m = small_model(&rng);
		const kvmem_config *c = &m->cfg;
		const int C = test_rng_int(&rng, 2, 24);
		kvmem_backend *e = test_backend(m, C);
		kvmem_view *va, *vb;
		struct outs a, b;
		int32_t tok[24];

		assert_int_equal(e->ops->view_create(e->ctx, &va), 0);
		assert_int_equal(e->ops->view_create(e->ctx, &vb), 0);
		outs_alloc(&a, c, C);
		outs_alloc(&b, c, C);
		/* Prefill chunks, each with its own q_last: 1, some, n, past n. */
		for (int call = 0; call < 6; call++) {
			int n = test_rng_int(&rng, 1, C);
			int q_last = call == 0 ? 1 : call == 1 ? n : call == 2 ? n + 3
				   : test_rng_int(&rng, 1, n);

			random_tokens(&rng, tok, n, c->vocab);
			one_call(e, va, vb, tok, n, q_last, &a, &b, C);
		}
		/* One-token steps: q_last 0, 1 and more all mean the one token. */
		for (int step = 0; step < 6; step++) {
			random_tokens(&rng, tok, 1, c->vocab);
			one_call(e, va, vb, tok, 1, step % 3 == 2 ? 4 : step % 3, &a, &b, C);
		}
		outs_free(&a);
		outs_free(&b);
		e->ops->view_destroy(e->ctx, va);
		e->ops->view_destroy(e->ctx, vb);
		kvmem_backend_close(e);
		test_model_free(m);
	}
}

static void test_qlast_negative(void **state)
{
	uint64_t rng = g_seed ^ 0xbad;
	kvmem_model *m = small_model(&rng);
	kvmem_backend *e = test_backend(m, 8);
	kvmem_view *v;
	struct outs o;
	int32_t tok[4];
	kvmem_fwd_out fo;

	outs_alloc(&o, &m->cfg, 8);
	fo = (kvmem_fwd_out){ .raw_k = o.k, .v = o.v, .q_raw = o.q, .q_last = -1 };
	random_tokens(&rng, tok, 4, m->cfg.vocab);
	assert_int_equal(e->ops->view_create(e->ctx, &v), 0);
	assert_int_equal(kvmem_backend_append_out(e, v, tok, 4, NULL, 0, NULL), 0);
	assert_int_equal(kvmem_backend_append_out(e, v, tok, 3, o.logits, 0, &fo), -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "q_last"));
	assert_int_equal(e->ops->length(e->ctx, v), 4);
	fo.q_last = 2;
	assert_int_equal(kvmem_backend_append_out(e, v, tok, 3, o.logits, 0, &fo), 0);
	assert_int_equal(e->ops->length(e->ctx, v), 7);
	e->ops->view_destroy(e->ctx, v);
	outs_free(&o);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* ---- the session's queries against a plain run beside it ---------------- */
struct twin {
	kvmem_backend *e;
	kvmem_view *v;
	struct outs o;
	float *q_all;		/* [pos][L][qw]: every token's queries */
	int64_t n_tok, cap_tok;
	int selections;
};

static void twin_forward(void *arg, const int32_t *tok, int n, const float *logits)
{
	struct twin *t = arg;
	const kvmem_config *c = &t->e->model->cfg;
	const size_t L = c->n_layers, qw = (size_t)c->n_heads * c->head_dim;
	kvmem_fwd_out fo = { .q_raw = t->o.q };

	assert_int_equal(kvmem_backend_append_out(t->e, t->v, tok, n, NULL, 0, &fo), 0);
	assert_true(t->n_tok + n <= t->cap_tok);
	for (int i = 0; i < n; i++)
		for (size_t l = 0; l < L; l++)
			memcpy(t->q_all + ((t->n_tok + i) * L + l) * qw, t->o.q + (l * n + i) * qw,
			       sizeof(float) * qw);
	t->n_tok += n;
}

static void twin_scored(void *arg, const struct kvmem_session *s, const kvmem_select_ctx *c,
			const float *scores, int forced)
{
	struct twin *t = arg;
	const int T = kvmem_session_options(s)->query_tokens;
	const size_t L = c->n_layers, qw = (size_t)c->n_heads * c->head_dim;

	assert_int_equal(c->n_q, t->n_tok < T ? t->n_tok : T);
	for (int i = 0; i < c->n_q; i++) {
		assert_int_equal(c->q_pos[i], t->n_tok - c->n_q + i);
		for (size_t l = 0; l < L; l++)
			assert_memory_equal(c->q + (l * c->n_q + i) * qw,
					    t->q_all + ((size_t)c->q_pos[i] * L + l) * qw,
					    sizeof(float) * qw);
	}
	t->selections++;
}

static void test_session_queries(void **state)
{
	uint64_t rng = g_seed ^ 0x5e55;

	for (int rep = 0; rep < 3; rep++) {
		kvmem_model *m = small_model(&rng);
		const kvmem_config *c = &m->cfg;
		const int chunk = test_rng_int(&rng, 1, 12), T = test_rng_int(&rng, 1, 8);
		const int64_t cap = 400;
		kvmem_backend *e = test_backend(m, chunk);
		struct twin t = { .e = e, .cap_tok = cap };
		kvmem_session_tap tap = { .scored = twin_scored, .arg = &t };
		kvmem_session_opts so;
		kvmem_session *s;
		int32_t tok[40];

		/* A budget that holds everything: the session's view is the whole
		 * history, so its queries are the plain run's, bit for bit. */
		kvmem_session_opts_default(&so);
		so.block = 16;
		so.budget = 512;
		so.chunk = chunk;
		so.query_tokens = T;
		so.on_forward = twin_forward;
		so.arg = &t;
		so.tap = &tap;
		assert_int_equal(e->ops->view_create(e->ctx, &t.v), 0);
		outs_alloc(&t.o, c, chunk);
		t.q_all = malloc(sizeof(float) * cap * c->n_layers * c->n_heads * c->head_dim);
		assert_non_null(s = kvmem_session_create(e, &so));
		for (int step = 0; step < 8; step++) {
			int n = test_rng_int(&rng, 1, 40);

			random_tokens(&rng, tok, n, c->vocab);
			assert_int_equal(kvmem_session_append(s, tok, n, 0), 0);
			assert_int_equal(kvmem_session_select(s), 0);
			assert_int_equal(kvmem_session_decode(s, test_rng_int(&rng, 0, 3), NULL, NULL),
					 0);
		}
		assert_int_equal(t.n_tok, kvmem_session_tokens(s));
		assert_true(t.selections >= 8);
		kvmem_session_free(s);
		e->ops->view_destroy(e->ctx, t.v);
		outs_free(&t.o);
		free(t.q_all);
		kvmem_backend_close(e);
		test_model_free(m);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_qlast_rows),
		cmocka_unit_test(test_qlast_negative),
		cmocka_unit_test(test_session_queries),
	};

	g_seed = test_rng_fresh_seed("test_fwd_qlast");
	if (getenv("KVMEM_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KVMEM_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}

// SPDX-License-Identifier: MIT
/*
 * The server's batch runner (tools/serve/serve_batch.h) on the backend
 * under test (KVMEM_TEST_BACKEND, cpu when unset; tests/gpu/serve24.sh
 * runs it on cuda): a round's token units go through the library's
 * batched forward in one pass, and every conversation gets what the loop
 * of per-session calls gives it.
 *
 *  - Random sessions (budgets, chunks, history lengths, so views of
 *    different lengths and forced selections inside rounds) run rounds of
 *    mixed units as the engine hands them over: prefill chunks (some longer
 *    than the session's chunk, which run alone), decode steps of the token
 *    sampled from the session's logits, and selections; each session has a
 *    twin on another backend that makes the same calls alone. After every
 *    round the logits and tokens equal the twin's bit for bit, the runner at
 *    1, 2 or 3 threads, the twins at 1.
 *  - The round really is one forward: the backend's ops are wrapped to
 *    count calls, and a round of m >= 1 token units (all within their
 *    chunks) costs exactly one forward_batch and no plain forward (the loop
 *    runner made m forwards and no forward_batch: this part fails there).
 *    The cuda backend may decline a batch (-ENOTSUP: its decode attention
 *    is not the batch-invariant one); the session then runs the items one
 *    by one, which is allowed there, but at least one round must have run
 *    batched (it is counted and printed).
 *  - A unit's failure is its own: a token outside the vocabulary fails its
 *    unit with the library's message, the others' results equal their
 *    twins'; the counters (units by kind, tokens, calls) add up.
 *
 * The runner is compiled in here (it needs nothing of the server but the
 * library).
 */
#include <errno.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "backend/backend_impl.h"
#include "helpers/test_model.h"
#include "tools/serve/serve_batch.c"

static uint64_t g_seed;

#define MAX_CHUNK 16

/* ---- the backend's forwards, counted ------------------------------------ */
static const kvmem_backend_ops *g_real;
static int64_t g_forwards, g_batches, g_declined;

static int count_forward(void *ctx, kvmem_view *v, const int32_t *tokens, int n, float *logits,
			 int all_logits, const kvmem_fwd_out *out)
{
	g_forwards++;
	return g_real->forward(ctx, v, tokens, n, logits, all_logits, out);
}

static int count_forward_batch(void *ctx, const kvmem_fwd_item *items, int n)
{
	int rc = g_real->forward_batch(ctx, items, n);

	g_batches++;
	g_declined += rc == -ENOTSUP;
	return rc;
}

/* The backend under test. */
static kvmem_backend *test_backend(const kvmem_model *m)
{
	kvmem_backend *b;

	if (kvmem_backend_open(test_backend_name(), m,
			       &(kvmem_backend_opts){ .max_chunk = MAX_CHUNK }, &b) < 0)
		fail_msg("backend %s: %s", test_backend_name(), kvmem_last_error());
	return b;
}

struct conv {
	kvmem_session *s, *t;	/* through the runner, alone */
	int32_t *script;
	int64_t n_script, fed;
	int chunk;
	int32_t tok;		/* a decode unit's token */
};

static void conv_open(struct conv *c, uint64_t *r, kvmem_backend *bb, kvmem_backend *bt,
		      int vocab)
{
	static const int64_t budgets[] = { 0, 64, 96 };
	kvmem_session_opts o;

	kvmem_session_opts_default(&o);
	o.block = 16;
	o.budget = budgets[test_rng_int(r, 0, 2)];
	o.chunk = test_rng_int(r, 3, MAX_CHUNK);
	o.query_tokens = test_rng_int(r, 1, 4);
	o.seed = test_rng_next(r);
	c->s = kvmem_session_create(bb, &o);
	c->t = kvmem_session_create(bt, &o);
	assert_non_null(c->s);
	assert_non_null(c->t);
	c->chunk = o.chunk;
	c->n_script = test_rng_int(r, 1, 200);
	c->script = malloc(sizeof(int32_t) * (size_t)c->n_script);
	assert_non_null(c->script);
	for (int64_t i = 0; i < c->n_script; i++)
		c->script[i] = test_rng_int(r, 0, vocab - 1);
	c->fed = 0;
}

static void conv_close(struct conv *c)
{
	kvmem_session_free(c->s);
	kvmem_session_free(c->t);
	free(c->script);
}

static void expect_same(const struct conv *c, int vocab, int i, int round)
{
	const float *a = kvmem_session_logits(c->s), *b = kvmem_session_logits(c->t);
	int64_t n = kvmem_session_tokens(c->s);

	assert_int_equal(n, kvmem_session_tokens(c->t));
	if (n && memcmp(kvmem_session_token_ids(c->s), kvmem_session_token_ids(c->t),
			sizeof(int32_t) * (size_t)n))
		fail_msg("conversation %d, round %d: tokens differ from its twin's", i, round);
	assert_true(!a == !b);
	if (a && memcmp(a, b, sizeof(float) * vocab))
		fail_msg("conversation %d, round %d: logits differ from its twin's", i, round);
	assert_int_equal(kvmem_session_view_len(c->s), kvmem_session_view_len(c->t));
}

/* The twin makes unit u's call alone. */
static int twin_call(const struct conv *c, const struct serve_unit *u)
{
	if (u->kind == SERVE_UNIT_SELECT)
		return kvmem_session_select(c->t);
	return kvmem_session_append(c->t, u->tokens, u->n, 0);
}

static void test_runner_equals_loop(void **state)
{
	uint64_t r = g_seed ^ 0x5b1;
	const int cpu = !strcmp(test_backend_name(), "cpu");
	/* The CUDA attention takes head_dim 64 or 128 only. */
	kvmem_config cfg = test_model_config(test_rng_int(&r, 1, 2), 64, 4, 2, cpu ? 16 : 64, 96, 97,
					     (int)(test_rng_next(&r) & 1));
	kvmem_model *m = test_model_random(&cfg, test_rng_next(&r));
	kvmem_backend *bb = test_backend(m), *bt = test_backend(m);
	kvmem_backend_ops counted = *bb->ops;
	const int n = test_rng_int(&r, 4, 9), vocab = m->cfg.vocab, saved = omp_get_max_threads();
	struct conv *cs = calloc((size_t)n, sizeof(*cs));
	struct serve_unit *units = calloc((size_t)n, sizeof(*units));
	int *who = calloc((size_t)n, sizeof(*who));
	struct serve_batch_stats st = { 0 };
	uint64_t want_units[SERVE_UNIT_KINDS] = { 0 }, want_tokens = 0;
	int64_t batched_rounds = 0, declined_rounds = 0;
	const kvmem_sampler greedy = { 0 };
	uint64_t rng = 0;

	g_real = bb->ops;
	counted.forward = count_forward;
	counted.forward_batch = count_forward_batch;
	bb->ops = &counted;
	for (int i = 0; i < n; i++)
		conv_open(&cs[i], &r, bb, bt, vocab);
	for (int round = 0; round < 50; round++) {
		int k = 0, long_run = 0, select = 0;

		omp_set_num_threads(test_rng_int(&r, 1, 3));
		for (int i = 0; i < n; i++) {
			struct conv *c = &cs[i];
			struct serve_unit *u = &units[k];
			double p = test_rng_uniform(&r);

			memset(u, 0, sizeof(*u));
			u->s = c->s;
			if (c->fed < c->n_script) {
				int64_t left = c->n_script - c->fed;
				/* Now and then a run longer than the chunk: alone. */
				int want = p < 0.15 ? 2 * c->chunk : c->chunk;

				u->kind = SERVE_UNIT_PREFILL;
				u->tokens = c->script + c->fed;
				u->n = (int)(left < want ? left : want);
				long_run |= u->n > c->chunk;
				c->fed += u->n;
			} else if (p < 0.1) {
				u->kind = SERVE_UNIT_SELECT;
				select = 1;
			} else if (p < 0.3) {
				continue;	/* no unit this round */
			} else {	/* the token the server sampled */
				c->tok = kvmem_sample(kvmem_session_logits(c->s), vocab, &greedy, &rng);
				u->kind = SERVE_UNIT_DECODE;
				u->tokens = &c->tok;
				u->n = 1;
			}
			who[k++] = i;
		}
		g_forwards = g_batches = g_declined = 0;
		assert_int_equal(serve_batch_run(bb, units, k, &st), 0);
		/* One forward for the round's token units (a forced or asked
		 * selection makes no forward; a long run makes its own). */
		if (!long_run && !select && k) {
			assert_int_equal(g_batches, 1);
			if (g_declined && !cpu) {
				declined_rounds++;	/* one by one: allowed off cpu */
			} else {
				assert_int_equal(g_declined, 0);
				assert_int_equal(g_forwards, 0);
				batched_rounds++;
			}
		}
		omp_set_num_threads(1);
		for (int j = 0; j < k; j++) {
			struct serve_unit *u = &units[j];

			assert_int_equal(u->rc, 0);
			assert_true(u->seconds >= 0);
			assert_int_equal(twin_call(&cs[who[j]], u), 0);
			want_units[u->kind]++;
			if (u->kind != SERVE_UNIT_SELECT)
				want_tokens += (uint64_t)u->n;
		}
		for (int i = 0; i < n; i++)
			expect_same(&cs[i], vocab, i, round);
	}
	omp_set_num_threads(saved);
	print_message("%s backend: %d conversations, %lld of 50 rounds in one forward, %lld "
		      "declined (run one by one)\n", test_backend_name(), n, (long long)batched_rounds,
		      (long long)declined_rounds);
	assert_true(batched_rounds > 0);
	assert_int_equal(st.calls, 50);
	assert_int_equal(st.tokens, want_tokens);
	for (int kind = 0; kind < SERVE_UNIT_KINDS; kind++)
		assert_int_equal(st.units[kind], want_units[kind]);

	/* A bad token fails its unit alone; the others run and count. */
	for (int i = 0; i < n; i++) {
		units[i] = (struct serve_unit){ .kind = SERVE_UNIT_DECODE, .s = cs[i].s,
						.tokens = &cs[i].tok, .n = 1 };
		cs[i].tok = i == 1 ? vocab : kvmem_sample(kvmem_session_logits(cs[i].s), vocab,
							   &greedy, &rng);
	}
	memset(&st, 0, sizeof(st));
	assert_int_equal(serve_batch_run(bb, units, n, &st), 1);
	assert_int_equal(units[1].rc, -EINVAL);
	assert_non_null(strstr(units[1].err, "vocabulary"));
	assert_int_equal(st.units[SERVE_UNIT_DECODE], (uint64_t)n);
	for (int i = 0; i < n; i++) {
		if (i == 1) {
			assert_true(twin_call(&cs[i], &units[i]) < 0);
		} else {
			assert_int_equal(units[i].rc, 0);
			assert_string_equal(units[i].err, "");
			assert_int_equal(twin_call(&cs[i], &units[i]), 0);
		}
		expect_same(&cs[i], vocab, i, 50);
	}

	bb->ops = g_real;
	for (int i = 0; i < n; i++)
		conv_close(&cs[i]);
	free(cs);
	free(units);
	free(who);
	kvmem_backend_close(bb);
	kvmem_backend_close(bt);
	test_model_free(m);
}

/* The caller's value of an environment variable, put back by env_restore. */
static char *env_save(const char *name)
{
	const char *e = getenv(name);

	return e ? strdup(e) : NULL;
}

static void env_restore(const char *name, char *was)
{
	if (was)
		setenv(name, was, 1);
	else
		unsetenv(name);
	free(was);
}

/* A batching server asks the cuda backend for the tensor-core GEMM, and
 * over fp8 views for decode splits of at least 8 stages, unless the
 * environment already says; one that does not batch leaves both be, and
 * bf16 views keep the splits' default. */
static void test_batch_knobs(void **state)
{
	char *tc = env_save("KVMEM_CUDA_GEMM_TC"), *mt = env_save("KVMEM_CUDA_DEC_MIN_TILES");

	(void)state;
	unsetenv("KVMEM_CUDA_GEMM_TC");
	unsetenv("KVMEM_CUDA_DEC_MIN_TILES");
	serve_batch_knobs(1, KVMEM_DTYPE_FP8);
	assert_null(getenv("KVMEM_CUDA_GEMM_TC"));
	assert_null(getenv("KVMEM_CUDA_DEC_MIN_TILES"));
	serve_batch_knobs(64, 0);	/* the backend's own KV (bf16 on cuda) */
	assert_non_null(getenv("KVMEM_CUDA_GEMM_TC"));
	assert_string_equal(getenv("KVMEM_CUDA_GEMM_TC"), "1");
	assert_null(getenv("KVMEM_CUDA_DEC_MIN_TILES"));
	serve_batch_knobs(64, KVMEM_DTYPE_FP8);
	assert_non_null(getenv("KVMEM_CUDA_DEC_MIN_TILES"));
	assert_string_equal(getenv("KVMEM_CUDA_DEC_MIN_TILES"), "8");
	setenv("KVMEM_CUDA_GEMM_TC", "0", 1);	/* the user's word stands */
	setenv("KVMEM_CUDA_DEC_MIN_TILES", "4", 1);
	serve_batch_knobs(64, KVMEM_DTYPE_FP8);
	assert_string_equal(getenv("KVMEM_CUDA_GEMM_TC"), "0");
	assert_string_equal(getenv("KVMEM_CUDA_DEC_MIN_TILES"), "4");
	env_restore("KVMEM_CUDA_GEMM_TC", tc);
	env_restore("KVMEM_CUDA_DEC_MIN_TILES", mt);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_batch_knobs),
		cmocka_unit_test(test_runner_equals_loop),
	};

	g_seed = test_rng_fresh_seed("test_serve_batch");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

// SPDX-License-Identifier: MIT
/*
 * Batched session steps (kvmem_session_append_batch, _decode_batch): batch
 * invariance on random models and random sessions, on the CPU backend (or
 * KVMEM_TEST_BACKEND: the GPU script runs it on cuda).
 *
 *  - Sessions of different budgets, blocks, chunks, policies and history
 *    lengths (so views of different lengths, forced selections inside a
 *    batch, a session with every row's logits) run rounds that mix prefill
 *    chunks, decode steps and selections; each has a twin on another
 *    backend that makes the same calls alone. After every round each
 *    session's logits and tokens equal its twin's (memcmp), and at the end
 *    its view (every slot's K and V), plan and counters do; the batch runs
 *    at 1, 2 or 3 threads, the twins at 1.
 *  - The exactness invariant in a batch: a session with an unlimited
 *    budget equals a plain full-context run, forward for forward.
 *  - The same through the one-by-one path (a backend without a batched
 *    forward), and with every row job on the sessions' writer threads.
 *  - The same over fp8 views (kv_dtype fp8 on every backend: the
 *    exactness invariant over fp8 KV too).
 *  - 72 sessions in one forward (B >= 64) equal their twins.
 *  - Every backend here is opened with batch_prefill: prefill chunks of
 *    several sessions share a pass (the cuda backend's GEMMs pinned, the
 *    twins' too).
 *  - Failures are their item's: a token outside the vocabulary, a run
 *    longer than the chunk, a session with nothing to decode from; the
 *    others' results stand. Sessions twice or of two backends: -EINVAL and
 *    nothing runs.
 */
#include <errno.h>
#include <math.h>
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
#include "session/inspect.h"
#include "helpers/test_model.h"

static uint64_t g_seed;
static uint32_t g_kv_dtype;	/* the backends' kv_dtype (test_batch_fp8: fp8) */

#define MAX_CHUNK 16

/* The backend under test: KVMEM_TEST_BACKEND (cpu when unset; the GPU
 * script runs this program with cuda). */
static kvmem_backend *cpu_backend(const kvmem_model *m)
{
	kvmem_backend *b;

	if (kvmem_backend_open(test_backend_name(), m,
			       &(kvmem_backend_opts){ .max_chunk = MAX_CHUNK, .kv_dtype = g_kv_dtype,
						      .batch_prefill = 1 },
			       &b) < 0)
		fail_msg("backend: %s", kvmem_last_error());
	return b;
}

/* Batched forwards of two items or more that ran as one pass (0: the
 * backend declined every time and the session went one by one, which
 * would make the comparisons below vacuous). */
static const kvmem_backend_ops *g_real;
static int64_t g_batched;
static int64_t g_lazy, g_fetched;	/* logits left on the backend, fetched later */
static int64_t g_drawn;		/* draws at a temperature made beside them */

static int counting_forward_batch(void *ctx, const kvmem_fwd_item *items, int n)
{
	int rc = g_real->forward_batch ? g_real->forward_batch(ctx, items, n) : -ENOTSUP;

	g_batched += rc == 0 && n > 1;
	return rc;
}

/* b's ops with forward_batch counted (into *ops, which b then uses). */
static void count_batches(kvmem_backend *b, kvmem_backend_ops *ops)
{
	g_real = b->ops;
	*ops = *b->ops;
	ops->forward_batch = counting_forward_batch;
	b->ops = ops;
	g_batched = 0;
}

static kvmem_model *small_model(uint64_t *r, int layers)
{
	/* The CUDA attention takes head_dim 64 or 128 only. */
	const int hd = strcmp(test_backend_name(), "cuda") ? 16 : 64;
	kvmem_config c = test_model_config(layers, 64, 4, 2 * test_rng_int(r, 1, 2), hd, 96, 97,
					   (int)(test_rng_next(r) & 1));

	return test_model_random(&c, test_rng_next(r));
}

/* ---- a plain full-context twin, fed by on_forward --------------------- */
struct full {
	kvmem_backend *b;
	kvmem_view *v;
	int vocab, all;
	float *logits;
	int64_t calls, mismatches;
};

static void full_forward(void *arg, const int32_t *tok, int n, const float *logits)
{
	struct full *f = arg;
	size_t cnt = (size_t)(f->all ? n : 1) * f->vocab;

	assert_int_equal(kvmem_backend_append(f->b, f->v, tok, n, f->logits, f->all), 0);
	f->calls++;
	f->mismatches += memcmp(logits, f->logits, cnt * sizeof(float)) != 0;
}

/* ---- sessions and their twins ------------------------------------------ */
struct pair {
	kvmem_session *s, *t;	/* batched, alone */
	int32_t *script;	/* its prompt */
	int64_t n_script, fed;
	kvmem_sampler smp;
	int chunk;
	uint64_t rng;		/* a caller's own state (kvmem_session_draw_with) */
	int32_t banned[3];
	int n_banned;
};

static const char *const policies[] = { "meank", "recency", "subblock", "quest", "infllm" };

static void pair_open(struct pair *p, uint64_t *r, kvmem_backend *bb, kvmem_backend *bt,
		      int vocab, struct full *full)
{
	kvmem_session_opts o;
	static const int64_t budgets[] = { 0, 64, 96, 128 };

	kvmem_session_opts_default(&o);
	o.block = test_rng_uniform(r) < 0.5 ? 16 : 32;
	o.budget = budgets[test_rng_int(r, 0, 3)];
	if (o.budget && o.budget < 2 * o.block)
		o.budget = 2 * o.block;
	o.chunk = test_rng_int(r, 3, MAX_CHUNK);
	o.query_tokens = test_rng_int(r, 1, 5);
	o.policy = policies[test_rng_int(r, 0, 4)];
	o.seed = test_rng_next(r);
	o.all_logits = test_rng_uniform(r) < 0.2;
	if (full) {	/* the exactness twin: unlimited, every forward compared */
		o.budget = 0;
		o.on_forward = full_forward;
		o.arg = full;
		full->all = o.all_logits;
	}
	p->s = kvmem_session_create(bb, &o);
	o.on_forward = NULL;	/* the full-context twin follows the batched one */
	p->t = kvmem_session_create(bt, &o);
	assert_non_null(p->s);
	assert_non_null(p->t);
	p->chunk = o.chunk;
	/* Histories of different lengths: views of different lengths. */
	p->n_script = test_rng_int(r, 1, 260);
	p->script = malloc(sizeof(int32_t) * (size_t)p->n_script);
	for (int64_t i = 0; i < p->n_script; i++)
		p->script[i] = test_rng_int(r, 0, vocab - 1);
	p->fed = 0;
	p->smp = (kvmem_sampler){ 0 };
	if (test_rng_uniform(r) < 0.5)
		p->smp = (kvmem_sampler){ .temperature = 0.8f, .top_k = 20, .top_p = 0.9f };
	if (test_rng_uniform(r) < 0.25)	/* no top-k: the sorted path */
		p->smp = (kvmem_sampler){ .temperature = 1.2f, .top_p = test_rng_uniform(r) < 0.5 ? 0.7f : 1 };
	p->rng = kvmem_rng_seed(test_rng_next(r));
	p->n_banned = test_rng_int(r, 0, 3);
	for (int b = 0; b < p->n_banned; b++)
		p->banned[b] = test_rng_int(r, 0, vocab - 1);
}

static void pair_close(struct pair *p)
{
	kvmem_session_free(p->s);
	kvmem_session_free(p->t);
	free(p->script);
}

/* Tokens and view length of a session and its twin, and (look) their
 * logits. Not looking leaves a batched greedy step's logits on the
 * backend (kvmem_session_stats.lazy_logits), so that the next draw is
 * its argmax and a later look fetches them. */
static void expect_same(const struct pair *p, int i, int round, int look)
{
	const kvmem_model *m = kvmem_backend_model(kvmem_session_backend(p->s));
	const float *a, *b;
	int64_t n = kvmem_session_tokens(p->s);

	assert_int_equal(n, kvmem_session_tokens(p->t));
	if (n && memcmp(kvmem_session_token_ids(p->s), kvmem_session_token_ids(p->t),
			sizeof(int32_t) * (size_t)n))
		fail_msg("session %d, round %d: tokens differ from its twin's", i, round);
	assert_int_equal(kvmem_session_view_len(p->s), kvmem_session_view_len(p->t));
	if (!look)
		return;
	a = kvmem_session_logits(p->s);
	b = kvmem_session_logits(p->t);
	assert_true(!a == !b);
	if (a && memcmp(a, b, sizeof(float) * m->cfg.vocab))
		fail_msg("session %d, round %d: logits differ from its twin's (alone)", i, round);
}

/* The saved states of a session and its twin, byte for byte: the last
 * logits among them, fetched from the backend when a batched step left
 * them there. */
static void expect_same_saved(const struct pair *p, int i)
{
	void *a, *b;
	size_t na, nb;

	assert_int_equal(kvmem_session_save_state(p->s, &a, &na), 0);
	assert_int_equal(kvmem_session_save_state(p->t, &b, &nb), 0);
	assert_int_equal(na, nb);
	if (memcmp(a, b, na))
		fail_msg("session %d: its saved state differs from its twin's", i);
	free(a);
	free(b);
}

/* The view slot for slot, the plan and the counters. */
static void expect_same_state(const struct pair *p, int i)
{
	const kvmem_kvcache *a = kvmem_session_view(p->s), *b = kvmem_session_view(p->t);
	const kvmem_plan *pa = kvmem_session_plan(p->s), *pb = kvmem_session_plan(p->t);
	kvmem_session_stats sa, sb;

	/* A backend with no host view (cuda): its views are judged by the
	 * logits they gave every round. */
	assert_true(!a == !b);
	if (!a && strcmp(test_backend_name(), "cpu"))
		goto plan;
	assert_non_null(a);
	assert_int_equal(a->len, b->len);
	for (int l = 0; l < a->n_layers; l++)
		for (int h = 0; h < a->n_kv_heads; h++)
			if (memcmp(kvmem_kv_k(a, l, h, 0), kvmem_kv_k(b, l, h, 0),
				   sizeof(float) * a->len * a->head_dim) ||
			    memcmp(kvmem_kv_v(a, l, h, 0), kvmem_kv_v(b, l, h, 0),
				   sizeof(float) * a->len * a->head_dim))
				fail_msg("session %d: its view differs from its twin's (layer %d)", i, l);
plan:
	assert_int_equal(pa->n_view, pb->n_view);
	assert_int_equal(pa->n_sets, pb->n_sets);
	if (pa->n_view)
		assert_memory_equal(pa->blocks, pb->blocks,
				    sizeof(int64_t) * (size_t)pa->n_sets * pa->n_view);
	kvmem_session_get_stats(p->s, &sa);
	kvmem_session_get_stats(p->t, &sb);
	assert_int_equal(sa.forwards, sb.forwards);
	assert_int_equal(sa.selections, sb.selections);
	assert_int_equal(sa.forced, sb.forced);
}

/*
 * Rounds over n pairs. Each round every session takes one unit: a prefill
 * chunk of its script, a decode step, or (now and then) a selection. The
 * batched sessions run the round as a server does (selections alone, then
 * one append_batch, or a decode_batch in a round of decodes only); the
 * twins make the same calls alone. Returns the forced selections seen.
 */
static int64_t run_rounds(uint64_t *r, struct pair *ps, int n, int rounds)
{
	kvmem_batch_item *items = calloc((size_t)n, sizeof(*items));
	kvmem_session **ds = calloc((size_t)n, sizeof(*ds));
	const kvmem_sampler **dsmp = calloc((size_t)n, sizeof(*dsmp));
	int32_t *dout = calloc((size_t)n, sizeof(*dout)), *dec = calloc((size_t)n, sizeof(*dec));
	int *rc = calloc((size_t)n, sizeof(*rc)), *who = calloc((size_t)n, sizeof(*who));
	int64_t forced = 0;
	const int saved = omp_get_max_threads();

	for (int round = 0; round < rounds; round++) {
		int m = 0, nd = 0, decode_round = test_rng_uniform(r) < 0.3;

		omp_set_num_threads(test_rng_int(r, 1, 3));
		for (int i = 0; i < n; i++) {
			struct pair *p = &ps[i];
			double u = test_rng_uniform(r);

			if (p->fed < p->n_script) {	/* a prefill chunk */
				int k = (int)(p->n_script - p->fed < p->chunk ? p->n_script - p->fed
									       : p->chunk);

				if (decode_round)
					continue;
				items[m] = (kvmem_batch_item){ .s = p->s, .tokens = p->script + p->fed,
							       .n = k };
				who[m++] = i;
				p->fed += k;
			} else if (u < 0.1) {		/* a step boundary, alone */
				assert_int_equal(kvmem_session_select(p->s), 0);
				assert_int_equal(kvmem_session_select(p->t), 0);
			} else if (decode_round) {	/* drawn inside the call */
				ds[nd] = p->s;
				dsmp[nd] = &p->smp;
				who[nd++] = i;
			} else if (p->smp.temperature <= 0 && test_rng_uniform(r) < 0.5) {
				/* drawn by the session, as the server draws greedily:
				 * from a batched step, the argmax beside its logits */
				uint64_t rng = 0;
				int32_t want = kvmem_sample(kvmem_session_logits(p->t),
							    kvmem_backend_model(kvmem_session_backend(p->t))->cfg.vocab,
							    &p->smp, &rng);

				assert_int_equal(kvmem_session_draw(p->s, NULL, &dec[i]), 0);
				if (dec[i] != want)
					fail_msg("session %d, round %d: kvmem_session_draw gave %d, the "
						 "twin's logits %d", i, round, dec[i], want);
				items[m] = (kvmem_batch_item){ .s = p->s, .tokens = &dec[i], .n = 1 };
				who[m++] = i;
			} else if (p->smp.temperature > 0 && test_rng_uniform(r) < 0.7) {
				/* drawn by the session at a temperature with the
				 * caller's state and ids left out, as the server
				 * draws: after a batched step, beside its logits
				 * (kvmem_fwd_item.draw); the twin's logits say
				 * what kvmem_sample draws */
				const int vocab = kvmem_backend_model(kvmem_session_backend(p->t))->cfg.vocab;
				float *tl = malloc(sizeof(float) * (size_t)vocab);
				const kvmem_draw_opts o = { .rng = &p->rng, .banned = p->banned,
							    .n_banned = p->n_banned };
				uint64_t st = p->rng;
				int32_t want;

				memcpy(tl, kvmem_session_logits(p->t), sizeof(float) * (size_t)vocab);
				for (int b = 0; b < p->n_banned; b++)
					tl[p->banned[b]] = -INFINITY;
				want = kvmem_sample(tl, vocab, &p->smp, &st);
				free(tl);
				assert_int_equal(kvmem_session_draw_with(p->s, &p->smp, &o, &dec[i]), 0);
				if (dec[i] != want || p->rng != st)
					fail_msg("session %d, round %d: kvmem_session_draw_with gave %d, the "
						 "twin's logits %d (states %s)", i, round, dec[i], want,
						 p->rng == st ? "equal" : "differ");
				items[m] = (kvmem_batch_item){ .s = p->s, .tokens = &dec[i], .n = 1 };
				who[m++] = i;
			} else {			/* drawn here, from the logits */
				uint64_t rng = test_rng_next(r);

				dec[i] = kvmem_sample(kvmem_session_logits(p->s),
						      kvmem_backend_model(kvmem_session_backend(p->s))->cfg.vocab,
						      &p->smp, &rng);
				items[m] = (kvmem_batch_item){ .s = p->s, .tokens = &dec[i], .n = 1 };
				who[m++] = i;
			}
		}
		if (decode_round) {
			assert_int_equal(kvmem_session_decode_batch(ds, nd, dsmp, dout, rc), 0);
			omp_set_num_threads(1);
			for (int k = 0; k < nd; k++) {
				int32_t t;

				assert_int_equal(rc[k], 0);
				assert_int_equal(kvmem_session_decode(ps[who[k]].t, 1, &ps[who[k]].smp, &t), 0);
				if (t != dout[k])
					fail_msg("session %d, round %d: drew %d in the batch, %d alone", who[k],
						 round, dout[k], t);
			}
		} else {
			assert_int_equal(kvmem_session_append_batch(items, m), 0);
			omp_set_num_threads(1);
			for (int k = 0; k < m; k++) {
				assert_int_equal(items[k].rc, 0);
				assert_int_equal(kvmem_session_append(ps[who[k]].t, items[k].tokens,
								      items[k].n, 0), 0);
			}
		}
		for (int i = 0; i < n; i++)
			expect_same(&ps[i], i, round, test_rng_uniform(r) < 0.3);
	}
	omp_set_num_threads(saved);
	for (int i = 0; i < n; i++) {
		kvmem_session_stats st;

		if (test_rng_uniform(r) < 0.5)
			expect_same_saved(&ps[i], i);
		expect_same(&ps[i], i, rounds, 1);
		expect_same_state(&ps[i], i);
		kvmem_session_get_stats(ps[i].s, &st);
		forced += st.forced;
		g_lazy += st.lazy_logits;
		g_fetched += st.lazy_fetches;
		g_drawn += st.lazy_draws;
	}
	free(items);
	free(ds);
	free(dsmp);
	free(dout);
	free(dec);
	free(rc);
	free(who);
	return forced;
}

/* One trial: n random pairs (the first an exactness twin), rounds. */
static void trial(uint64_t *r, int n, int rounds, int no_batch_op)
{
	kvmem_model *m = small_model(r, test_rng_int(r, 1, 2));
	kvmem_backend *bb = cpu_backend(m), *bt = cpu_backend(m);
	kvmem_backend_ops plain;
	const kvmem_backend_ops *real = bb->ops;
	struct pair *ps = calloc((size_t)n, sizeof(*ps));
	struct full full = { .b = cpu_backend(m), .vocab = m->cfg.vocab };
	int64_t forced;

	if (no_batch_op) {	/* a backend without forward_batch: one by one */
		plain = *real;
		plain.forward_batch = NULL;
		bb->ops = &plain;
	} else {
		count_batches(bb, &plain);
	}
	full.logits = malloc(sizeof(float) * MAX_CHUNK * m->cfg.vocab);
	assert_int_equal(kvmem_backend_view_new(full.b, 0, &full.v), 0);
	for (int i = 0; i < n; i++)
		pair_open(&ps[i], r, bb, bt, m->cfg.vocab, i == 0 ? &full : NULL);
	ps[n - 1].smp = (kvmem_sampler){ 0 };	/* one greedy at least: lazy logits */
	if (n > 1 && ps[0].smp.temperature <= 0)	/* and one at a temperature: draws beside them */
		ps[0].smp = (kvmem_sampler){ .temperature = 0.8f, .top_k = 20, .top_p = 0.9f };
	forced = run_rounds(r, ps, n, rounds);
	/* Budgets of 64..128 tokens under 260-token scripts fill tails. */
	print_message("%d sessions, %lld forced selections\n", n, (long long)forced);
	assert_true(full.calls > 0);
	assert_int_equal(full.mismatches, 0);
	if (!no_batch_op) {
		print_message("%lld batched forwards of 2 items or more; %lld steps' logits so far left on "
			      "the backend, %lld of them fetched later\n", (long long)g_batched,
			      (long long)g_lazy, (long long)g_fetched);
		assert_true(g_batched > 0);
	}
	for (int i = 0; i < n; i++)
		pair_close(&ps[i]);
	free(ps);
	kvmem_backend_view_free(full.b, full.v);
	free(full.logits);
	bb->ops = real;
	kvmem_backend_close(full.b);
	kvmem_backend_close(bb);
	kvmem_backend_close(bt);
	test_model_free(m);
}

static void test_batch_equals_alone(void **state)
{
	uint64_t r = g_seed ^ 0xb1;

	g_lazy = g_fetched = g_drawn = 0;
	for (int t = 0; t < 3; t++)
		trial(&r, test_rng_int(&r, 3, 9), 60, 0);
	/* Both backends leave greedy steps' logits beside the view: the
	 * draws from their argmax and the fetches were both compared; and
	 * draws at a temperature made there (kvmem_session_draw_with). */
	print_message("%lld draws at a temperature made beside the logits\n", (long long)g_drawn);
	assert_true(g_lazy > 0);
	assert_true(g_fetched > 0);
	assert_true(g_drawn > 0);
}

static void test_batch_one_by_one(void **state)
{
	uint64_t r = g_seed ^ 0xb2;

	trial(&r, 5, 40, 1);
}

/* The same over fp8 views (every backend, the twins' and the full-context
 * one's too: the exactness invariant over fp8 KV), with batched forwards
 * counted: on cuda the batch's own fp8 path (put_rows, the register
 * decode over every view), which a backend that declined would skip. */
static void test_batch_fp8(void **state)
{
	uint64_t r = g_seed ^ 0xb5;

	g_kv_dtype = KVMEM_DTYPE_FP8;
	g_lazy = g_fetched = 0;
	for (int t = 0; t < 2; t++)
		trial(&r, test_rng_int(&r, 3, 9), 50, 0);
	g_kv_dtype = 0;
	assert_true(g_lazy > 0);
}

/* Every row job on the sessions' writer threads, several at once. */
static void test_batch_writer_threads(void **state)
{
	uint64_t r = g_seed ^ 0xb3;

	setenv("KVMEM_WRITER_MIN", "1", 1);
	trial(&r, 6, 40, 0);
	unsetenv("KVMEM_WRITER_MIN");
}

/* B >= 64: 72 sessions decode in one forward. */
static void test_batch_72(void **state)
{
	uint64_t r = g_seed ^ 0xb4;
	kvmem_model *m = small_model(&r, 1);
	kvmem_backend *bb = cpu_backend(m), *bt = cpu_backend(m);
	const kvmem_backend_ops *real = bb->ops;
	kvmem_backend_ops counted;
	const int n = 72;
	struct pair *ps = calloc(n, sizeof(*ps));
	kvmem_session **ss = calloc(n, sizeof(*ss));
	const kvmem_sampler **smp = calloc(n, sizeof(*smp));
	int32_t *out = calloc(n, sizeof(*out));

	for (int i = 0; i < n; i++) {
		pair_open(&ps[i], &r, bb, bt, m->cfg.vocab, NULL);
		if (ps[i].n_script > 40)
			ps[i].n_script = test_rng_int(&r, 1, 40);
		assert_int_equal(kvmem_session_append(ps[i].s, ps[i].script, ps[i].n_script, 0), 0);
		assert_int_equal(kvmem_session_append(ps[i].t, ps[i].script, ps[i].n_script, 0), 0);
		ss[i] = ps[i].s;
		smp[i] = &ps[i].smp;
	}
	count_batches(bb, &counted);
	for (int step = 0; step < 4; step++) {
		assert_int_equal(kvmem_session_decode_batch(ss, n, smp, out, NULL), 0);
		for (int i = 0; i < n; i++) {
			int32_t t;

			assert_int_equal(kvmem_session_decode(ps[i].t, 1, &ps[i].smp, &t), 0);
			assert_int_equal(t, out[i]);
			expect_same(&ps[i], i, step, 1);
		}
	}
	assert_int_equal(g_batched, 4);	/* each step one batched forward */
	for (int i = 0; i < n; i++) {
		expect_same_state(&ps[i], i);
		pair_close(&ps[i]);
	}
	bb->ops = real;
	free(ps);
	free(ss);
	free(smp);
	free(out);
	kvmem_backend_close(bb);
	kvmem_backend_close(bt);
	test_model_free(m);
}

static void test_batch_failures(void **state)
{
	uint64_t r = g_seed ^ 0xb5;
	kvmem_model *m = small_model(&r, 1);
	kvmem_backend *bb = cpu_backend(m), *bt = cpu_backend(m), *other = cpu_backend(m);
	struct pair ps[4];
	int32_t bad = m->cfg.vocab, tok[MAX_CHUNK + 1] = { 0 }, out[4];
	kvmem_batch_item it[4];
	kvmem_session_opts o;
	kvmem_session *fresh, *elsewhere, *ds[3];
	int rc[3];

	kvmem_session_opts_default(&o);
	o.chunk = 8;
	fresh = kvmem_session_create(bb, &o);
	elsewhere = kvmem_session_create(other, &o);
	assert_non_null(fresh);
	assert_non_null(elsewhere);
	for (int i = 0; i < 4; i++) {
		pair_open(&ps[i], &r, bb, bt, m->cfg.vocab, NULL);
		if (ps[i].n_script < 8) {	/* 7 tokens are read below */
			ps[i].script = realloc(ps[i].script, sizeof(int32_t) * 8);
			for (int k = 0; k < 8; k++)
				ps[i].script[k] = k;
			ps[i].n_script = 8;
		}
		assert_int_equal(kvmem_session_append(ps[i].s, ps[i].script, 5, 0), 0);
		assert_int_equal(kvmem_session_append(ps[i].t, ps[i].script, 5, 0), 0);
	}
	/* A bad token in item 1, a run past the chunk in item 2. */
	for (int i = 0; i < 4; i++)
		it[i] = (kvmem_batch_item){ .s = ps[i].s, .tokens = ps[i].script + 5, .n = 2 };
	it[1].tokens = &bad;
	it[1].n = 1;
	it[2].tokens = tok;
	it[2].n = ps[2].chunk + 1;
	assert_int_equal(kvmem_session_append_batch(it, 4), 2);
	assert_int_equal(it[0].rc, 0);
	assert_int_equal(it[3].rc, 0);
	assert_int_equal(it[1].rc, -EINVAL);
	assert_int_equal(it[2].rc, -EINVAL);
	assert_non_null(strstr(it[1].err, "vocabulary"));
	assert_non_null(strstr(it[2].err, "chunk"));
	/* The twins: the same calls alone. */
	assert_int_equal(kvmem_session_append(ps[0].t, ps[0].script + 5, 2, 0), 0);
	assert_true(kvmem_session_append(ps[1].t, &bad, 1, 0) < 0);
	assert_int_equal(kvmem_session_append(ps[3].t, ps[3].script + 5, 2, 0), 0);
	for (int i = 0; i < 4; i++)
		expect_same(&ps[i], i, 0, 1);
	/* The failed sessions go on. */
	it[1] = (kvmem_batch_item){ .s = ps[1].s, .tokens = ps[1].script, .n = 1 };
	assert_int_equal(kvmem_session_append_batch(&it[1], 1), 0);
	assert_int_equal(kvmem_session_append(ps[1].t, ps[1].script, 1, 0), 0);
	expect_same(&ps[1], 1, 1, 1);

	/* One session twice, or sessions of two backends: nothing runs. */
	it[0] = (kvmem_batch_item){ .s = ps[0].s, .tokens = ps[0].script, .n = 1 };
	it[1] = it[0];
	assert_int_equal(kvmem_session_append_batch(it, 2), -EINVAL);
	it[1] = (kvmem_batch_item){ .s = elsewhere, .tokens = ps[0].script, .n = 1 };
	assert_int_equal(kvmem_session_append_batch(it, 2), -EINVAL);
	assert_int_equal(kvmem_session_tokens(ps[0].s), kvmem_session_tokens(ps[0].t));
	assert_int_equal(kvmem_session_tokens(elsewhere), 0);

	/* Decoding: a session with nothing to decode from fails alone. */
	ds[0] = ps[0].s;
	ds[1] = fresh;
	ds[2] = ps[3].s;
	assert_int_equal(kvmem_session_decode_batch(ds, 3, NULL, out, rc), 1);
	assert_int_equal(rc[0], 0);
	assert_int_equal(rc[1], -EINVAL);
	assert_int_equal(rc[2], 0);
	assert_non_null(strstr(kvmem_last_error(), "nothing to decode"));
	assert_int_equal(kvmem_session_decode(ps[0].t, 1, NULL, &tok[0]), 0);
	assert_int_equal(kvmem_session_decode(ps[3].t, 1, NULL, &tok[1]), 0);
	assert_int_equal(out[0], tok[0]);
	assert_int_equal(out[2], tok[1]);
	expect_same(&ps[0], 0, 2, 1);
	expect_same(&ps[3], 3, 2, 1);
	assert_int_equal(kvmem_session_decode_batch(ds, -1, NULL, out, rc), -EINVAL);
	assert_int_equal(kvmem_session_decode_batch(ds, 0, NULL, out, rc), 0);
	/* A draw's options that make no sense: an error naming them, nothing
	 * drawn (the state stays). */
	{
		const kvmem_sampler hot = { .temperature = 0.9f };
		uint64_t st = 7;

		assert_int_equal(kvmem_session_draw_with(ps[0].s, &hot,
							 &(kvmem_draw_opts){ .rng = &st, .n_banned = 2 },
							 &tok[2]), -EINVAL);
		assert_non_null(strstr(kvmem_last_error(), "banned"));
		assert_int_equal(kvmem_session_draw_with(ps[0].s, &hot,
							 &(kvmem_draw_opts){ .rng = &st, .n_banned = -1 },
							 &tok[2]), -EINVAL);
		assert_int_equal(st, 7);
		assert_int_equal(kvmem_session_draw_with(ps[0].s, &hot, NULL, NULL), -EINVAL);
	}
	/* Enough sessions that the draws run on several threads (batch.c's
	 * PAR_DRAWS): the failures (the last four, never the calling thread's
	 * share alone) still fail alone, each with its code, and the message
	 * is a failing draw's, not lost with its thread. */
	{
		kvmem_session *d9[9];
		int32_t o9[9];
		int r9[9];

		for (int i = 0; i < 9; i++) {
			d9[i] = i < 4 ? ps[i].s : kvmem_session_create(bb, &o);
			assert_non_null(d9[i]);
		}
		assert_int_equal(kvmem_session_append(d9[4], ps[0].script, 5, 0), 0);
		kvmem_error(EIO, "a message from before");
		assert_int_equal(kvmem_session_decode_batch(d9, 9, NULL, o9, r9), 4);
		for (int i = 0; i < 9; i++)
			assert_int_equal(r9[i], i < 5 ? 0 : -EINVAL);
		assert_non_null(strstr(kvmem_last_error(), "nothing to decode"));
		assert_int_equal(kvmem_session_decode(ps[0].t, 1, NULL, &tok[0]), 0);
		assert_int_equal(kvmem_session_decode(ps[3].t, 1, NULL, &tok[1]), 0);
		assert_int_equal(o9[0], tok[0]);
		assert_int_equal(o9[3], tok[1]);
		expect_same(&ps[0], 0, 3, 1);
		expect_same(&ps[3], 3, 3, 1);
		for (int i = 4; i < 9; i++)
			kvmem_session_free(d9[i]);
	}

	for (int i = 0; i < 4; i++)
		pair_close(&ps[i]);
	kvmem_session_free(fresh);
	kvmem_session_free(elsewhere);
	kvmem_backend_close(bb);
	kvmem_backend_close(bt);
	kvmem_backend_close(other);
	test_model_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_batch_equals_alone),
		cmocka_unit_test(test_batch_one_by_one),
		cmocka_unit_test(test_batch_fp8),
		cmocka_unit_test(test_batch_writer_threads),
		cmocka_unit_test(test_batch_72),
		cmocka_unit_test(test_batch_failures),
	};

	g_seed = test_rng_fresh_seed("test_ws_batch");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

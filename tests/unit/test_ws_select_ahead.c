// SPDX-License-Identifier: MIT
/*
 * kvmem_session_select_ahead: selecting with the queries of tokens not yet
 * appended. It must leave the history untouched, keep the exactness
 * invariant (a budget over the workspace gives the same logits as never
 * selecting ahead), choose what a plain selection would choose from the same
 * queries, hand a tap every token's queries, select with another policy on
 * request as that policy's own session would, and refuse bad calls.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "session/inspect.h"
#include "helpers/test_model.h"

static uint64_t g_seed;

#define ROUNDS 12

static kvmem_model *model(uint64_t *rng)
{
	kvmem_config c = test_model_config(2, 32, 4, 2, 16, 48, 61, test_rng_int(rng, 0, 1));

	return test_model_random(&c, (uint64_t)test_rng_int(rng, 1, 1 << 30));
}

static void random_ids(uint64_t *rng, int32_t *t, int n, int vocab)
{
	for (int i = 0; i < n; i++)
		t[i] = test_rng_int(rng, 0, vocab - 1);
}

static kvmem_session *open_session(kvmem_backend *e, int64_t budget, int block, int qtok,
				 const char *policy)
{
	kvmem_session_opts o;

	kvmem_session_opts_default(&o);
	o.budget = budget;
	o.block = block;
	o.chunk = 16;
	o.query_tokens = qtok;
	o.policy = policy;
	return kvmem_session_create(e, &o);
}

/* Budget over the workspace: select ahead + append + decode gives the same
 * tokens and logits, bit for bit, as append + decode. */
static void test_exact_with_select_ahead(void **state)
{
	uint64_t rng = g_seed;

	for (int round = 0; round < 6; round++) {
		kvmem_model *m = model(&rng);
		kvmem_backend *e = kvmem_backend_cpu(m, 16);
		int V = m->cfg.vocab, nh = test_rng_int(&rng, 20, 150), nq = test_rng_int(&rng, 1, 16);
		int block = 16 << test_rng_int(&rng, 0, 2);
		int32_t hist[150], q[16], out_a[6], out_b[6];
		kvmem_session *a = open_session(e, 0, block, test_rng_int(&rng, 1, 4), NULL);
		kvmem_session *b = open_session(e, 0, block, 4, NULL);

		random_ids(&rng, hist, nh, V);
		random_ids(&rng, q, nq, V);
		assert_non_null(a);
		assert_non_null(b);
		assert_int_equal(kvmem_session_append(a, hist, nh, 0), 0);
		assert_int_equal(kvmem_session_append(b, hist, nh, 0), 0);
		assert_int_equal(kvmem_session_select_ahead(a, q, nq), 0);
		assert_int_equal(kvmem_session_tokens(a), nh);	/* history untouched */
		assert_int_equal(kvmem_session_view_len(a), nh);
		assert_int_equal(kvmem_session_append(a, q, nq, 0), 0);
		assert_int_equal(kvmem_session_append(b, q, nq, 0), 0);
		assert_memory_equal(kvmem_session_logits(a), kvmem_session_logits(b), sizeof(float) * V);
		assert_int_equal(kvmem_session_decode(a, 6, NULL, out_a), 0);
		assert_int_equal(kvmem_session_decode(b, 6, NULL, out_b), 0);
		assert_memory_equal(out_a, out_b, sizeof(out_a));
		assert_memory_equal(kvmem_session_logits(a), kvmem_session_logits(b), sizeof(float) * V);
		kvmem_session_free(a);
		kvmem_session_free(b);
		kvmem_backend_close(e);
		test_model_free(m);
	}
}

/* Whether every one of x[0..nx) is in y[0..ny). */
static int subset(const int64_t *x, int nx, const int64_t *y, int ny)
{
	for (int j = 0; j < nx; j++) {
		int found = 0;

		for (int i = 0; i < ny && !found; i++)
			found = y[i] == x[j];
		if (!found)
			return 0;
	}
	return 1;
}

/* A small budget: the twin appends the tokens over the same view, then
 * selects with the last one's query — the same query select ahead takes.
 * Both score the same old history, so the old blocks they choose (beyond
 * the newest two, which the question's own block shifts) agree per layer,
 * except where the twin's extra block, which enters every softmax
 * denominator, reorders a near tie. quest is per layer: many sets a round. */
static void test_same_choice_as_plain_select(void **state)
{
	uint64_t rng = g_seed ^ 0x9e3779b97f4a7c15ull;
	int agree = 0, sets = 0;

	for (int round = 0; round < ROUNDS; round++) {
		kvmem_model *m = model(&rng);
		kvmem_backend *e = kvmem_backend_cpu(m, 16);
		int V = m->cfg.vocab, nh = 16 * test_rng_int(&rng, 20, 30), nq = test_rng_int(&rng, 1, 8);
		int32_t hist[480], q[8];
		kvmem_session *a = open_session(e, 96, 16, 1, "quest");
		kvmem_session *b = open_session(e, 96, 16, 1, "quest");
		const kvmem_plan *pa, *pb;
		int64_t old_blocks = nh / 16;
		int64_t ba[64], bb[64];

		random_ids(&rng, hist, nh, V);
		random_ids(&rng, q, nq, V);
		assert_int_equal(kvmem_session_append(a, hist, nh, 0), 0);
		assert_int_equal(kvmem_session_append(b, hist, nh, 0), 0);
		assert_int_equal(kvmem_session_select_ahead(a, q, nq), 0);
		assert_int_equal(kvmem_session_append(b, q, nq, 0), 0);
		assert_int_equal(kvmem_session_select(b), 0);
		pa = kvmem_session_plan(a);
		pb = kvmem_session_plan(b);
		assert_true(pa->view_tokens <= 96);
		assert_int_equal(pa->n_sets, pb->n_sets);
		for (int set = 0; set < pa->n_sets; set++) {
			const int64_t *xa = pa->blocks + (size_t)set * pa->n_view;
			const int64_t *xb = pb->blocks + (size_t)set * pb->n_view;
			int na = 0, nb = 0;

			for (int i = 0; i < pa->n_view; i++)
				if (xa[i] < old_blocks - 2)
					ba[na++] = xa[i];
			for (int i = 0; i < pb->n_view; i++)
				if (xb[i] < old_blocks - 2)
					bb[nb++] = xb[i];
			/* The budget left for scored blocks may differ by the
			 * question's own block: one choice holds the other. */
			agree += subset(bb, nb, ba, na) || subset(ba, na, bb, nb);
			sets++;
		}
		kvmem_session_free(a);
		kvmem_session_free(b);
		kvmem_backend_close(e);
		test_model_free(m);
	}
	print_message("ahead and plain choices agree in %d of %d layer sets\n", agree, sets);
	/* Scores are softmax shares over all blocks, so the twin's extra
	 * block can reorder a near tie now and then; other queries would
	 * disagree in most sets. */
	assert_true(agree * 10 >= sets * 9);
}

/* The tap's ahead hook gets every token's queries, [L][n][qw]; the session
 * itself keeps only the last query_tokens (session.c, ws_q_rows). With and
 * without the tap the selection reads the same queries: the same scores and
 * plan, bit for bit. The tap's last rows are the rows the selection read,
 * so a third session fed them through a tap-less select ahead agrees. */
struct ahead_rec {
	float *q;
	int n, calls;
	int64_t pos0;
	size_t qw;
	int layers;
};

static void rec_ahead(void *arg, const kvmem_session *s, const float *q, int n, int64_t pos0)
{
	struct ahead_rec *r = arg;

	free(r->q);
	r->q = malloc(sizeof(float) * r->layers * (size_t)n * r->qw);
	memcpy(r->q, q, sizeof(float) * r->layers * (size_t)n * r->qw);
	r->n = n;
	r->pos0 = pos0;
	r->calls++;
}

static void test_tap_gets_every_query(void **state)
{
	uint64_t rng = g_seed ^ 0x7a9;

	for (int round = 0; round < 4; round++) {
		kvmem_model *m = model(&rng);
		kvmem_backend *e = kvmem_backend_cpu(m, 16);
		const kvmem_config *c = &m->cfg;
		int V = c->vocab, nh = 16 * test_rng_int(&rng, 12, 20), nq = test_rng_int(&rng, 2, 16);
		int qtok = test_rng_int(&rng, 1, 4);
		struct ahead_rec rec = { .qw = (size_t)c->n_heads * c->head_dim, .layers = c->n_layers };
		kvmem_session_tap tap = { .ahead = rec_ahead, .arg = &rec };
		kvmem_session_opts o;
		kvmem_session *a, *b;
		int32_t hist[320], q[16];
		const float *sa, *sb;
		int sets_a, sets_b;
		int64_t nb_a, nb_b;

		kvmem_session_opts_default(&o);
		o.budget = 96;
		o.block = 16;
		o.chunk = 16;
		o.query_tokens = qtok;
		o.policy = "quest";
		a = kvmem_session_create(e, &o);
		o.tap = &tap;
		b = kvmem_session_create(e, &o);
		assert_non_null(a);
		assert_non_null(b);
		random_ids(&rng, hist, nh, V);
		random_ids(&rng, q, nq, V);
		assert_int_equal(kvmem_session_append(a, hist, nh, 0), 0);
		assert_int_equal(kvmem_session_append(b, hist, nh, 0), 0);
		assert_int_equal(kvmem_session_select_ahead(a, q, nq), 0);
		assert_int_equal(kvmem_session_select_ahead(b, q, nq), 0);
		assert_int_equal(rec.calls, 1);
		assert_int_equal(rec.n, nq);
		assert_int_equal(rec.pos0, nh);
		/* every row a token's own: in the last layer (past attention;
		 * the first layer's, before RoPE, are alike for equal ids) no
		 * two tokens' queries alike */
		for (int i = 1; i < nq; i++) {
			const float *last = rec.q + (size_t)(c->n_layers - 1) * nq * rec.qw;

			assert_memory_not_equal(last + (size_t)(i - 1) * rec.qw,
						last + (size_t)i * rec.qw, sizeof(float) * rec.qw);
		}
		sa = kvmem_session_scores(a, &sets_a, &nb_a);
		sb = kvmem_session_scores(b, &sets_b, &nb_b);
		assert_non_null(sa);
		assert_int_equal(sets_a, sets_b);
		assert_int_equal(nb_a, nb_b);
		assert_memory_equal(sa, sb, sizeof(float) * (size_t)sets_a * nb_a);
		assert_int_equal(kvmem_session_plan(a)->n_view, kvmem_session_plan(b)->n_view);
		assert_memory_equal(kvmem_session_plan(a)->blocks, kvmem_session_plan(b)->blocks,
				    sizeof(int64_t) * kvmem_session_plan(a)->n_sets *
				    kvmem_session_plan(a)->n_view);
		/* and the append after it is the same in both */
		assert_int_equal(kvmem_session_append(a, q, nq, 0), 0);
		assert_int_equal(kvmem_session_append(b, q, nq, 0), 0);
		assert_memory_equal(kvmem_session_logits(a), kvmem_session_logits(b), sizeof(float) * V);
		free(rec.q);
		kvmem_session_free(a);
		kvmem_session_free(b);
		kvmem_backend_close(e);
		test_model_free(m);
	}
}

/* kvmem_session_select_ahead_with (bench recall's --query-view): a meank
 * session selecting ahead with lexical chooses what a lexical session
 * chooses over the same history and text, and is meank again after it; a
 * per-layer policy, or one needing summaries its index lacks, is refused. */
static void test_ahead_with_another_policy(void **state)
{
	uint64_t rng = g_seed ^ 0x5851f42d4c957f2dull;

	for (int round = 0; round < 4; round++) {
		kvmem_model *m = model(&rng);
		kvmem_backend *e = kvmem_backend_cpu(m, 16);
		int V = m->cfg.vocab, nh = 16 * test_rng_int(&rng, 20, 30), nq = test_rng_int(&rng, 2, 8);
		int32_t hist[480], q[8];
		kvmem_session *a = open_session(e, 96, 16, 1, "meank");
		kvmem_session *b = open_session(e, 96, 16, 1, "lexical");
		const kvmem_plan *pa, *pb;

		random_ids(&rng, hist, nh, V);
		random_ids(&rng, q, nq, V);
		/* the question's words in the history, so lexical has blocks to find */
		memcpy(hist + 16 * test_rng_int(&rng, 1, 8), q, sizeof(int32_t) * (size_t)nq);
		assert_int_equal(kvmem_session_append(a, hist, nh, 0), 0);
		assert_int_equal(kvmem_session_append(b, hist, nh, 0), 0);
		assert_int_equal(kvmem_session_select_ahead_with(a, kvmem_policy_find("lexical"), q,
								 nq), 0);
		assert_int_equal(kvmem_session_select_ahead(b, q, nq), 0);
		pa = kvmem_session_plan(a);
		pb = kvmem_session_plan(b);
		assert_int_equal(pa->n_view, pb->n_view);
		assert_memory_equal(pa->blocks, pb->blocks, sizeof(int64_t) * (size_t)pa->n_view);
		assert_string_equal(kvmem_session_policy(a)->name, "meank");
		assert_int_equal(kvmem_session_tokens(a), nh);

		assert_true(kvmem_session_select_ahead_with(a, kvmem_policy_find("quest"), q, nq) < 0);
		assert_non_null(strstr(kvmem_last_error(), "per layer"));
		assert_true(kvmem_session_select_ahead_with(a, kvmem_policy_find("subblock"), q, nq) < 0);
		assert_non_null(strstr(kvmem_last_error(), "does not keep"));
		assert_true(kvmem_session_select_ahead_with(a, NULL, q, nq) < 0);
		assert_string_equal(kvmem_session_policy(a)->name, "meank");
		kvmem_session_free(a);
		kvmem_session_free(b);
		kvmem_backend_close(e);
		test_model_free(m);
	}
}

static void test_bad_calls(void **state)
{
	uint64_t rng = g_seed + 7;
	kvmem_model *m = model(&rng);
	kvmem_backend *e = kvmem_backend_cpu(m, 16);
	kvmem_session *s = open_session(e, 64, 16, 1, NULL);
	int32_t t[20] = { 1, 2, 3 };

	assert_true(kvmem_session_select_ahead(s, t, 0) < 0);
	assert_non_null(strstr(kvmem_last_error(), "select ahead takes 1..16 tokens"));
	assert_true(kvmem_session_select_ahead(s, t, 17) < 0);
	assert_int_equal(kvmem_session_tokens(s), 0);
	kvmem_session_free(s);
	kvmem_backend_close(e);
	test_model_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exact_with_select_ahead),
		cmocka_unit_test(test_same_choice_as_plain_select),
		cmocka_unit_test(test_tap_gets_every_query),
		cmocka_unit_test(test_ahead_with_another_policy),
		cmocka_unit_test(test_bad_calls),
	};

	g_seed = test_rng_fresh_seed("test_ws_select_ahead");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

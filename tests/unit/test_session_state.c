// SPDX-License-Identifier: MIT
/*
 * Session state across a reopen: a random agent session with a small
 * budget (about a tenth of the workspace) run in one go, and the same run in
 * two parts with kvmem_session_save_state -> a new session ->
 * kvmem_session_adopt_state between them, decode the same tokens and compute
 * the same logits in every forward pass (memcmp), and end with the same
 * plan and view, bit for bit:
 *  - over the in-memory page source, every policy, blocks of 16..64;
 *  - over the pager on a real directory with a host pool of a few pages
 *    (the state stored with the commit, the pager closed and reopened);
 *  - split mid-tail (after an append), right after a selection, after a
 *    decode;
 *  - in half the cases the new session gives its (empty) view up before it
 *    adopts (a server reopening a conversation): it adopts with the view
 *    still given up, takes the history's index in and lays the view out in
 *    steps (of a random number of layers), with the same result.
 * The same split with kvmem_session_adopt (a fresh selection) does differ:
 * the test can fail. A state from other options or another history is
 * refused naming what differs and leaves the session fresh; a flipped byte,
 * a torn state, another version are refused.
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
#include "session/inspect.h"
#include "pager_fixture.h"

static uint64_t g_seed;

/* ---- every forward pass's logits --------------------------------------- */
struct logs {
	float *buf;
	size_t n, cap;
	int vocab, all;
	int64_t passes;
};

static void log_forward(void *arg, const int32_t *tok, int n, const float *logits)
{
	struct logs *lg = arg;
	size_t cnt = (size_t)(lg->all ? n : 1) * lg->vocab;

	if (lg->n + cnt > lg->cap) {
		lg->cap = (lg->n + cnt) * 2;
		lg->buf = realloc(lg->buf, lg->cap * sizeof(float));
		assert_non_null(lg->buf);
	}
	memcpy(lg->buf + lg->n, logits, cnt * sizeof(float));
	lg->n += cnt;
	lg->passes++;
}

/* ---- a random script ------------------------------------------------------ */
enum { OP_APPEND, OP_SELECT, OP_DECODE, OP_UNPIN };

struct op {
	int kind, n, pin, sample;
	int32_t *ids;		/* OP_APPEND */
};

struct script {
	struct op ops[96];
	int n_ops;
	int64_t total;		/* tokens at the end */
};

static void make_script(uint64_t *rng, int vocab, struct script *sc)
{
	int steps = test_rng_int(rng, 6, 9);

	memset(sc, 0, sizeof(*sc));
	for (int s = 0; s < steps; s++) {
		int appends = test_rng_int(rng, 1, 2);

		for (int a = 0; a < appends; a++) {
			struct op *op = &sc->ops[sc->n_ops++];

			op->kind = OP_APPEND;
			op->n = test_rng_int(rng, 1, 90);
			op->pin = (s == 0 && a == 0) || test_rng_int(rng, 0, 7) == 0;
			op->ids = malloc(sizeof(int32_t) * op->n);
			for (int i = 0; i < op->n; i++)
				op->ids[i] = test_rng_int(rng, 0, vocab - 1);
			sc->total += op->n;
		}
		if (s && test_rng_int(rng, 0, 5) == 0)
			sc->ops[sc->n_ops++] = (struct op){ .kind = OP_UNPIN };
		sc->ops[sc->n_ops++] = (struct op){ .kind = OP_SELECT };
		sc->ops[sc->n_ops] = (struct op){ .kind = OP_DECODE, .n = test_rng_int(rng, 1, 24),
						  .sample = test_rng_int(rng, 0, 1) };
		sc->total += sc->ops[sc->n_ops++].n;
	}
}

static void free_script(struct script *sc)
{
	for (int i = 0; i < sc->n_ops; i++)
		free(sc->ops[i].ids);
}

/* A random op of this kind, not the last one (part 2 has work to do). */
static int split_after(uint64_t *rng, const struct script *sc, int kind)
{
	int cand[96], n = 0;

	for (int i = 0; i < sc->n_ops - 1; i++)
		if (sc->ops[i].kind == kind)
			cand[n++] = i;
	assert_true(n > 0);
	return cand[test_rng_int(rng, 0, n - 1)];
}

/* Ops [from, to): decoded tokens appended to out[*got]. Returns 0, or -1
 * (kvmem_error) when an op failed. */
static int run_ops(kvmem_session *s, const struct script *sc, int from, int to, int32_t *out,
		   int *got)
{
	static const kvmem_sampler warm = { .temperature = 0.9f, .top_k = 0, .top_p = 1.0f };

	for (int i = from; i < to; i++) {
		const struct op *op = &sc->ops[i];
		int rc = 0;

		switch (op->kind) {
		case OP_APPEND:
			rc = kvmem_session_append(s, op->ids, op->n, op->pin);
			if (rc && op->pin && strstr(kvmem_last_error(), "budget"))
				rc = kvmem_session_append(s, op->ids, op->n, 0);	/* pin refused */
			break;
		case OP_SELECT:
			rc = kvmem_session_select(s);
			break;
		case OP_DECODE:
			rc = kvmem_session_decode(s, op->n, op->sample ? &warm : NULL, out + *got);
			*got += op->n;
			break;
		case OP_UNPIN:
			rc = kvmem_session_unpin(s, 0, kvmem_session_tokens(s));
			break;
		}
		if (rc)
			return kvmem_error_prefix("op %d", i);
	}
	return 0;
}

/* ---- one case ------------------------------------------------------------ */
struct kase {
	kvmem_model *m;
	kvmem_backend *e;
	const struct script *sc;
	const char *policy;
	int block, chunk, query_tokens, all_logits;
	int64_t budget;
	uint64_t seed;
	int split;		/* the last op of part 1 */
	int pager;		/* 1: the pager on a directory, else memory */
	int fresh;		/* part 2 adopts with a fresh selection (the control) */
	int layout;		/* enum kvmem_layout */
	int released;		/* >0: part 2's session gives its view up before it
				 * adopts, and lays it out that many layers a step */
};

/* A session (and its source) of either kind. */
struct side {
	kvmem_page_source src;
	kvmem_pager *p;
	kvmem_session *s;
	char dir[256];
	struct logs lg;
};

static void opts_of(const struct kase *k, struct side *d, kvmem_session_opts *o)
{
	kvmem_session_opts_default(o);
	o->block = k->block;
	o->budget = k->budget;
	o->chunk = k->chunk;
	o->query_tokens = k->query_tokens;
	o->policy = k->policy;
	o->seed = k->seed;
	o->all_logits = k->all_logits;
	o->layout = k->layout;
	o->source = &d->src;
	o->on_forward = log_forward;
	o->arg = &d->lg;
}

static void side_open(const struct kase *k, struct side *d)
{
	kvmem_session_opts o;

	if (k->pager) {
		kvmem_pager_opts po;
		kvmem_page_geom g;

		kvmem_page_geom_model(&g, k->m, k->block);
		kvmem_pager_opts_default(&po);
		po.flags = KVMEM_PAGER_CREATE;
		po.host_cap = kvmem_page_stride(&g) * (g.n_layers * 2 + 1);	/* two blocks and a page */
		assert_int_equal(kvmem_pager_open(d->dir, &g, &po, &d->p), 0);
		assert_int_equal(kvmem_page_source_pager(&d->src, d->p), 0);
	} else if (!d->src.ops) {
		const kvmem_config *c = &k->m->cfg;

		assert_int_equal(kvmem_page_source_mem(&d->src, c->n_layers, c->n_kv_heads,
						     c->head_dim, k->block), 0);
	}
	opts_of(k, d, &o);
	d->s = kvmem_session_create(k->e, &o);
	if (!d->s)
		fail_msg("session: %s", kvmem_last_error());
}

static void side_close(struct side *d, int keep_source)
{
	kvmem_session_free(d->s);
	d->s = NULL;
	if (d->p) {
		kvmem_page_source_destroy(&d->src);
		memset(&d->src, 0, sizeof(d->src));
		assert_int_equal(kvmem_pager_close(d->p), 0);
		d->p = NULL;
	} else if (!keep_source) {
		kvmem_page_source_destroy(&d->src);
		memset(&d->src, 0, sizeof(d->src));
	}
}

/* The first part ends: save (and with the pager commit, close, reopen),
 * then a new session adopts. */
static void reopen(const struct kase *k, struct side *d)
{
	void *state;
	size_t len;
	int64_t n = kvmem_session_tokens(d->s);
	int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));

	memcpy(ids, kvmem_session_token_ids(d->s), sizeof(int32_t) * n);
	assert_int_equal(kvmem_session_save_state(d->s, &state, &len), 0);
	if (k->pager) {
		uint32_t alen;
		const void *app;

		assert_int_equal(kvmem_page_source_commit(&d->src, ids, n, state, len), 0);
		free(state);
		side_close(d, 0);
		side_open(k, d);
		assert_int_equal(kvmem_pager_tokens(d->p), n);
		assert_int_equal(kvmem_pager_read_tokens(d->p, 0, n, ids), 0);
		app = kvmem_pager_app_state(d->p, &alen);
		assert_true(alen == len);
		state = malloc(alen);
		memcpy(state, app, alen);
	} else {
		side_close(d, 1);
		side_open(k, d);
	}
	if (k->released)
		assert_int_equal(kvmem_session_release_view(d->s), 0);
	if (k->fresh) {
		assert_int_equal(kvmem_session_adopt(d->s, ids, n), 0);
		assert_int_equal(kvmem_session_view_released(d->s), 0);
	} else if (kvmem_session_adopt_state(d->s, ids, n, state, len)) {
		fail_msg("adopt_state: %s", kvmem_last_error());
	} else if (k->released) {
		/* Adopted with the view still given up: the index taken in and
		 * the view laid out in steps. */
		const int L = k->m->cfg.n_layers;
		int rc, steps = 0;

		assert_int_equal(kvmem_session_view_released(d->s), 1);
		assert_int_equal(kvmem_session_view_len(d->s), 0);
		assert_int_equal(kvmem_session_tokens(d->s), n);
		while ((rc = kvmem_session_restore_view_step(d->s, k->released)) == 1)
			steps++;
		if (rc)
			fail_msg("laying the adopted view out: %s", kvmem_last_error());
		/* First the index, a call per 32 blocks; then the layers. */
		assert_int_equal(steps, (((n + k->block - 1) / k->block + 31) / 32) +
					(L + k->released - 1) / k->released - 1);
		assert_int_equal(kvmem_session_view_released(d->s), 0);
	}
	free(state);
	free(ids);
}

/* Returns 1 when the two-part run equals the one-go run in every token,
 * logit, plan and view slot (the fresh control may differ: 0). */
static int run_case(const struct kase *k)
{
	const kvmem_config *c = &k->m->cfg;
	struct side one = { .lg = { .vocab = c->vocab, .all = k->all_logits } };
	struct side two = one;
	int32_t *t1 = malloc(sizeof(int32_t) * (k->sc->total + 1));
	int32_t *t2 = malloc(sizeof(int32_t) * (k->sc->total + 1));
	int n1 = 0, n2 = 0, same;

	if (k->pager) {
		assert_non_null(fx_tmpdir(one.dir, sizeof(one.dir)));
		assert_non_null(fx_tmpdir(two.dir, sizeof(two.dir)));
	}
	side_open(k, &one);
	if (run_ops(one.s, k->sc, 0, k->sc->n_ops, t1, &n1))
		fail_msg("one go: %s", kvmem_last_error());
	side_open(k, &two);
	if (run_ops(two.s, k->sc, 0, k->split + 1, t2, &n2))
		fail_msg("part 1: %s", kvmem_last_error());
	reopen(k, &two);
	if (run_ops(two.s, k->sc, k->split + 1, k->sc->n_ops, t2, &n2)) {
		/* A fresh adopt has no logits: a decode right after it fails. */
		if (!k->fresh)
			fail_msg("part 2: %s", kvmem_last_error());
		same = 0;
	} else {
		same = n1 == n2 && !memcmp(t1, t2, sizeof(int32_t) * n1) &&
		       one.lg.n == two.lg.n &&
		       !memcmp(one.lg.buf, two.lg.buf, one.lg.n * sizeof(float));
	}
	if (!k->fresh) {
		const kvmem_plan *p1 = kvmem_session_plan(one.s), *p2 = kvmem_session_plan(two.s);
		const kvmem_kvcache *v1 = kvmem_session_view(one.s), *v2 = kvmem_session_view(two.s);
		kvmem_session_stats s1, s2;

		assert_int_equal(n1, n2);
		assert_int_equal(one.lg.passes, two.lg.passes);
		if (!same)
			fail_msg("%s, block %d, budget %lld, split after op %d (%s), %s: two parts "
				 "differ from one go", k->policy, k->block, (long long)k->budget,
				 k->split, (const char *[]){ "append", "select", "decode",
							     "unpin" }[k->sc->ops[k->split].kind],
				 k->pager ? "pager" : "memory");
		assert_int_equal(kvmem_session_tokens(one.s), kvmem_session_tokens(two.s));
		assert_int_equal(p1->n_sets, p2->n_sets);
		assert_int_equal(p1->n_view, p2->n_view);
		assert_int_equal(p1->reused, p2->reused);
		assert_int_equal(p1->entering, p2->entering);
		assert_memory_equal(p1->blocks, p2->blocks, sizeof(int64_t) * p1->n_sets * p1->n_view);
		assert_memory_equal(p1->start, p2->start, sizeof(int64_t) * p1->n_sets * p1->n_view);
		assert_int_equal(v1->len, v2->len);
		for (int l = 0; l < c->n_layers; l++)
			for (int h = 0; h < c->n_kv_heads; h++) {
				assert_memory_equal(kvmem_kv_k(v1, l, h, 0), kvmem_kv_k(v2, l, h, 0),
						    sizeof(float) * v1->len * c->head_dim);
				assert_memory_equal(kvmem_kv_v(v1, l, h, 0), kvmem_kv_v(v2, l, h, 0),
						    sizeof(float) * v1->len * c->head_dim);
			}
		kvmem_session_get_stats(one.s, &s1);
		kvmem_session_get_stats(two.s, &s2);
		assert_int_equal(s1.forwards, s2.forwards);
		assert_int_equal(s1.selections, s2.selections);
		assert_int_equal(s1.forced, s2.forced);
	}
	if (k->pager) {
		/* Commit the end too: verify then finds nothing past the commit. */
		void *st;
		size_t len;

		assert_int_equal(kvmem_session_save_state(two.s, &st, &len), 0);
		assert_int_equal(kvmem_page_source_commit(&two.src, kvmem_session_token_ids(two.s),
							      kvmem_session_tokens(two.s), st, len), 0);
		free(st);
	}
	side_close(&one, 0);
	side_close(&two, 0);
	if (k->pager) {
		assert_int_equal(kvmem_workspace_verify(two.dir, stderr, 0), 0);
		fx_rmtree(one.dir);
		fx_rmtree(two.dir);
	}
	free(one.lg.buf);
	free(two.lg.buf);
	free(t1);
	free(t2);
	return same;
}

static kvmem_model *small_model(uint64_t *rng)
{
	static const int geo[][4] = {	/* layers, heads, kv heads, head_dim */
		{ 2, 4, 2, 16 }, { 1, 2, 1, 8 }, { 3, 4, 1, 12 }, { 2, 6, 3, 8 },
	};
	const int *g = geo[test_rng_int(rng, 0, 3)];
	kvmem_config c = test_model_config(g[0], 24, g[1], g[2], g[3], 40, 53, test_rng_int(rng, 0, 1));

	return test_model_random(&c, (uint64_t)test_rng_int(rng, 1, 1 << 30));
}

/* A case over a fresh script: budget a tenth of the workspace (at least two
 * blocks), chunk and query window random. */
static void setup_case(uint64_t *rng, struct kase *k, kvmem_model *m, kvmem_backend *e,
		       struct script *sc, const char *policy, int split_kind, int pager)
{
	memset(k, 0, sizeof(*k));
	make_script(rng, m->cfg.vocab, sc);
	k->m = m;
	k->e = e;
	k->sc = sc;
	k->policy = policy;
	k->block = 16 << test_rng_int(rng, 0, 2);
	k->budget = sc->total / 10 > 2 * k->block ? sc->total / 10 : 2 * k->block;
	k->chunk = test_rng_int(rng, 1, 32);
	k->query_tokens = test_rng_int(rng, 1, 6);
	k->all_logits = test_rng_int(rng, 0, 1);
	k->seed = (uint64_t)test_rng_int(rng, 0, 1 << 30);
	k->split = split_after(rng, sc, split_kind);
	k->pager = pager;
	k->released = test_rng_int(rng, 0, 1) ? test_rng_int(rng, 1, m->cfg.n_layers) : 0;
}

/* The case's first append made 600 tokens long, blocks of 16, and part 2
 * adopting into a released session: its history (38 blocks and more) is
 * taken into the index in two calls or more before the layers. */
static void long_history(uint64_t *rng, struct kase *k, struct script *sc)
{
	struct op *op = &sc->ops[0];
	int32_t *ids = realloc(op->ids, 600 * sizeof(int32_t));

	assert_non_null(ids);
	for (int i = op->n; i < 600; i++)
		ids[i] = test_rng_int(rng, 0, k->m->cfg.vocab - 1);
	sc->total += 600 - op->n;
	op->ids = ids;
	op->n = 600;
	k->block = 16;
	k->budget = sc->total / 10 > 2 * k->block ? sc->total / 10 : 2 * k->block;
	k->released = test_rng_int(rng, 1, k->m->cfg.n_layers);
}

/* Every policy the library knows, the anchors added for the lab included:
 * a new policy gets these checks with no change here. */
#define POLICY(p) (kvmem_policy_at(p)->name)
static const int split_kinds[] = { OP_APPEND, OP_SELECT, OP_DECODE };

/* Memory source: every policy, every kind of split point; and the control
 * (run with OMP_WAIT_POLICY=passive, as tests/run.sh does, on a shared box). */
static void test_two_parts_memory(void **state)
{
	uint64_t rng = g_seed ^ 0x51;
	int controls = 0, differ = 0;

	for (int p = 0; kvmem_policy_at(p); p++) {
		kvmem_model *m = small_model(&rng);
		kvmem_backend *e = kvmem_backend_cpu(m, 32);

		assert_non_null(e);
		for (int k = 0; k < 3; k++) {
			struct script sc;
			struct kase kc;

			setup_case(&rng, &kc, m, e, &sc, POLICY(p), split_kinds[k], 0);
			assert_true(run_case(&kc));
			if (p < 3) {
				/* The fresh selection that adopt makes instead. */
				kc.fresh = 1;
				differ += !run_case(&kc);
				controls++;
			}
			free_script(&sc);
		}
		kvmem_backend_close(e);
		test_model_free(m);
	}
	print_message("fresh adopt differed from one go in %d of %d cases\n", differ, controls);
	assert_true(differ > 0);
}

/* The stable layout: its plans (starts out of order) travel in the state
 * and the view is rebuilt slot for slot: two parts compute what one go
 * does, every policy, every kind of split point. */
static void test_two_parts_stable(void **state)
{
	uint64_t rng = g_seed ^ 0x57;

	(void)state;
	for (int p = 0; kvmem_policy_at(p); p++) {
		kvmem_model *m = small_model(&rng);
		kvmem_backend *e = kvmem_backend_cpu(m, 32);

		assert_non_null(e);
		for (int k = 0; k < 3; k++) {
			struct script sc;
			struct kase kc;

			setup_case(&rng, &kc, m, e, &sc, POLICY(p), split_kinds[k], 0);
			kc.layout = KVMEM_LAYOUT_STABLE;
			assert_true(run_case(&kc));
			free_script(&sc);
		}
		kvmem_backend_close(e);
		test_model_free(m);
	}
}

/* The pager on a real directory: the state travels in the commit. */
static void test_two_parts_pager(void **state)
{
	uint64_t rng = g_seed ^ 0x52;

	for (int p = 0; p < 3; p++) {
		kvmem_model *m = small_model(&rng);
		kvmem_backend *e = kvmem_backend_cpu(m, 32);

		assert_non_null(e);
		for (int k = 0; k < 3; k++) {
			struct script sc;
			struct kase kc;

			setup_case(&rng, &kc, m, e, &sc, POLICY(p), split_kinds[k], 1);
			if (p == 0)
				long_history(&rng, &kc, &sc);
			assert_true(run_case(&kc));
			free_script(&sc);
		}
		kvmem_backend_close(e);
		test_model_free(m);
	}
}

/* ---- refusals ------------------------------------------------------------ */
struct saved_run {
	kvmem_page_source src;
	int32_t *ids;
	int64_t n;
	void *state;
	size_t len;
	int block;		/* of the pages */
};

/* The refusal tests' options: blocks of 16, a 64-token budget, chunks of
 * 16, in the given layout. */
static void small_opts(kvmem_session_opts *o, int layout)
{
	kvmem_session_opts_default(o);
	o->block = 16;
	o->budget = 64;
	o->chunk = 16;
	o->layout = layout;
}

/* A short small-budget session over memory, saved. */
static void save_one(kvmem_backend *e, const kvmem_session_opts *base, uint64_t *rng,
		     struct saved_run *sr)
{
	const kvmem_config *c = &e->model->cfg;
	kvmem_session_opts o = *base;
	int32_t tok[300], out[8];
	kvmem_session *s;

	for (int i = 0; i < 300; i++)
		tok[i] = test_rng_int(rng, 0, c->vocab - 1);
	assert_int_equal(kvmem_page_source_mem(&sr->src, c->n_layers, c->n_kv_heads, c->head_dim,
					     o.block), 0);
	o.source = &sr->src;
	sr->block = o.block;
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	assert_int_equal(kvmem_session_append(s, tok, 20, 1), 0);
	assert_int_equal(kvmem_session_append(s, tok + 20, 280, 0), 0);
	assert_int_equal(kvmem_session_select(s), 0);
	assert_int_equal(kvmem_session_decode(s, 8, NULL, out), 0);
	sr->n = kvmem_session_tokens(s);
	sr->ids = malloc(sizeof(int32_t) * sr->n);
	memcpy(sr->ids, kvmem_session_token_ids(s), sizeof(int32_t) * sr->n);
	assert_int_equal(kvmem_session_save_state(s, &sr->state, &sr->len), 0);
	kvmem_session_free(s);
}

/* adopt_state must refuse with `what` in the message and leave the session
 * fresh: kvmem_session_adopt then works. */
static void expect_refused(kvmem_backend *e, const kvmem_session_opts *o, struct saved_run *sr,
			   const int32_t *ids, int64_t n, const void *state, size_t len,
			   const char *what)
{
	kvmem_session_opts oo = *o;
	kvmem_session *s;

	oo.source = &sr->src;
	s = kvmem_session_create(e, &oo);
	assert_non_null(s);
	assert_true(kvmem_session_adopt_state(s, ids, n, state, len) < 0);
	if (!strstr(kvmem_last_error(), what) || strncmp(kvmem_last_error(), "session state:", 14))
		fail_msg("expected \"session state: ...%s\" in: %s", what, kvmem_last_error());
	assert_int_equal(kvmem_session_tokens(s), 0);
	/* Adopting pages of another block size is not a fallback. */
	if (kvmem_session_options(s)->block == o->block && o->block == sr->block)
		assert_int_equal(kvmem_session_adopt(s, sr->ids, sr->n), 0);
	kvmem_session_free(s);
}

/* A stable state: read back by a stable session only (its version says so;
 * a compact one keeps version 1's bytes). */
static void test_stable_state_refused(void **state)
{
	uint64_t rng = g_seed ^ 0x58;
	kvmem_model *m = small_model(&rng);
	kvmem_backend *e = kvmem_backend_cpu(m, 32);
	kvmem_session_opts o, x;
	struct saved_run sr = { 0 };
	kvmem_session *s;
	uint32_t version;

	(void)state;
	small_opts(&o, KVMEM_LAYOUT_STABLE);
	save_one(e, &o, &rng, &sr);
	memcpy(&version, (const char *)sr.state + 4, 4);
	assert_int_equal(version, 2);
	x = o, x.layout = KVMEM_LAYOUT_COMPACT;
	expect_refused(e, &x, &sr, sr.ids, sr.n, sr.state, sr.len,
		       "layout stable (this session: compact)");
	x = o, x.source = &sr.src;
	s = kvmem_session_create(e, &x);
	assert_non_null(s);
	assert_int_equal(kvmem_session_adopt_state(s, sr.ids, sr.n, sr.state, sr.len), 0);
	kvmem_session_free(s);
	kvmem_page_source_destroy(&sr.src);
	free(sr.ids);
	free(sr.state);
	kvmem_backend_close(e);
	test_model_free(m);
}

/*
 * A session that leaves the layout to the default adopts a saved state of
 * either layout, taking the saved one (states saved compact before stable
 * became the default reopen), and goes on as the saving session would: its
 * next step's logits are the bits of a session opened with that layout
 * explicitly. An explicit layout still has to match (above).
 */
static void test_default_layout_adopts_saved(void **state)
{
	uint64_t rng = g_seed ^ 0x5d;
	kvmem_model *m = small_model(&rng);
	kvmem_backend *e = kvmem_backend_cpu(m, 32);
	const int vocab = m->cfg.vocab;

	(void)state;
	for (int k = 0; k < 2; k++) {
		const int layout = k ? KVMEM_LAYOUT_STABLE : KVMEM_LAYOUT_COMPACT;
		kvmem_session_opts o, x;
		struct saved_run sr = { 0 };
		float *la = malloc(sizeof(float) * vocab), *lb = malloc(sizeof(float) * vocab);
		int32_t next[4] = { 1, 2, 3, 4 }, out[2];
		kvmem_session *s[2];

		small_opts(&o, layout);
		save_one(e, &o, &rng, &sr);
		for (int j = 0; j < 2; j++) {	/* 0: the default's, 1: explicit */
			x = o, x.source = &sr.src, x.layout = j ? layout : KVMEM_LAYOUT_DEFAULT;
			s[j] = kvmem_session_create(e, &x);
			assert_non_null(s[j]);
			if (kvmem_session_adopt_state(s[j], sr.ids, sr.n, sr.state, sr.len) < 0)
				fail_msg("layout %d, %s: %s", layout, j ? "explicit" : "default",
					 kvmem_last_error());
			assert_int_equal(kvmem_session_options(s[j])->layout, layout);
			assert_int_equal(kvmem_session_append(s[j], next, 4, 0), 0);
			assert_int_equal(kvmem_session_select(s[j]), 0);
			assert_int_equal(kvmem_session_decode(s[j], 2, NULL, out), 0);
			memcpy(j ? lb : la, kvmem_session_logits(s[j]), sizeof(float) * vocab);
		}
		assert_memory_equal(la, lb, sizeof(float) * vocab);
		for (int j = 0; j < 2; j++)
			kvmem_session_free(s[j]);
		kvmem_page_source_destroy(&sr.src);
		free(sr.ids);
		free(sr.state);
		free(la);
		free(lb);
	}
	kvmem_backend_close(e);
	test_model_free(m);
}

static void test_other_options_refused(void **state)
{
	uint64_t rng = g_seed ^ 0x53;
	kvmem_model *m = small_model(&rng);
	kvmem_backend *e = kvmem_backend_cpu(m, 32);
	kvmem_session_opts o, x;
	struct saved_run sr = { 0 };
	kvmem_session *s;

	small_opts(&o, KVMEM_LAYOUT_COMPACT);	/* a stable session is refused it */
	o.policy = "meank";
	o.seed = 5;
	save_one(e, &o, &rng, &sr);

	x = o, x.budget = 96;
	expect_refused(e, &x, &sr, sr.ids, sr.n, sr.state, sr.len, "budget 64 (this session: 96)");
	x = o, x.block = 32;
	expect_refused(e, &x, &sr, sr.ids, sr.n, sr.state, sr.len, "block 16 (this session: 32)");
	x = o, x.policy = "quest";
	expect_refused(e, &x, &sr, sr.ids, sr.n, sr.state, sr.len, "policy meank (this session: quest)");
	x = o, x.chunk = 8;
	expect_refused(e, &x, &sr, sr.ids, sr.n, sr.state, sr.len, "chunk 16");
	x = o, x.seed = 6;
	expect_refused(e, &x, &sr, sr.ids, sr.n, sr.state, sr.len, "seed 5");
	x = o, x.recent = 40;
	expect_refused(e, &x, &sr, sr.ids, sr.n, sr.state, sr.len, "recent");
	x = o, x.layout = KVMEM_LAYOUT_STABLE;
	expect_refused(e, &x, &sr, sr.ids, sr.n, sr.state, sr.len,
		       "layout compact (this session: stable)");
	/* Another history: one token fewer, one token changed. */
	expect_refused(e, &o, &sr, sr.ids, sr.n - 1, sr.state, sr.len, "saved at 308 tokens");
	sr.ids[7] = (sr.ids[7] + 1) % m->cfg.vocab;
	expect_refused(e, &o, &sr, sr.ids, sr.n, sr.state, sr.len, "other token ids");
	sr.ids[7] = (sr.ids[7] + m->cfg.vocab - 1) % m->cfg.vocab;
	/* The right options restore (options that do not shape results may differ). */
	x = o, x.rebuild_all = 1, x.all_logits = 1, x.source = &sr.src;
	s = kvmem_session_create(e, &x);
	assert_int_equal(kvmem_session_adopt_state(s, sr.ids, sr.n, sr.state, sr.len), 0);
	assert_true(kvmem_session_adopt_state(s, sr.ids, sr.n, sr.state, sr.len) < 0);
	assert_non_null(strstr(kvmem_last_error(), "fresh session"));
	kvmem_session_free(s);
	/* Another model of the same geometry. */
	{
		kvmem_config c2 = m->cfg;
		kvmem_model *m2;
		kvmem_backend *e2;

		c2.vocab += 1;
		m2 = test_model_random(&c2, 99);
		e2 = kvmem_backend_cpu(m2, 32);
		expect_refused(e2, &o, &sr, sr.ids, sr.n, sr.state, sr.len, "another model");
		kvmem_backend_close(e2);
		test_model_free(m2);
	}
	kvmem_page_source_destroy(&sr.src);
	free(sr.ids);
	free(sr.state);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* ---- the query ring across a save ------------------------------------- */
/* What the next selection is given, recorded by a tap. */
struct qseen {
	int n_q;
	float q[8 * 4 * 4 * 16];	/* [L][n_q][heads][D] of the small model */
	int64_t pos[8];
};

static void seen_queries(void *arg, const kvmem_session *s, const kvmem_select_ctx *c,
			 const float *scores, int forced)
{
	struct qseen *w = arg;
	size_t n = (size_t)c->n_layers * c->n_q * c->n_heads * c->head_dim;

	assert_true(n <= sizeof(w->q) / sizeof(w->q[0]) && c->n_q <= 8);
	w->n_q = c->n_q;
	memcpy(w->q, c->q, n * sizeof(float));
	memcpy(w->pos, c->q_pos, sizeof(int64_t) * c->n_q);
}

/*
 * Decode steps wrap the session's query ring (the oldest query is not in its
 * first slot); a saved state must carry the queries oldest first with their
 * positions, so the next selection of the restored session is given exactly
 * what the original's is.
 */
static void test_query_ring_travels(void **state)
{
	uint64_t rng = g_seed ^ 0x9e;
	kvmem_config c = test_model_config(2, 24, 4, 2, 16, 40, 53, 0);
	kvmem_model *m = test_model_random(&c, (uint64_t)test_rng_int(&rng, 1, 1 << 30));
	kvmem_backend *e = kvmem_backend_cpu(m, 32);
	/* Each 32-token chunk (and the last, 8) moves the ring by T and leaves
	 * its oldest in slot 0; decode steps that are not a multiple of T leave
	 * it elsewhere. */
	int T = test_rng_int(&rng, 2, 5);
	int steps = T * test_rng_int(&rng, 1, 2) + test_rng_int(&rng, 1, T - 1);
	kvmem_page_source src;
	kvmem_session_opts o;
	struct qseen a, b;
	kvmem_session_tap tap = { .scored = seen_queries, .arg = &a };
	kvmem_session *s1, *s2;
	int32_t tok[200], out[16];
	void *st;
	size_t len;

	for (int i = 0; i < 200; i++)
		tok[i] = test_rng_int(&rng, 0, c.vocab - 1);
	assert_int_equal(kvmem_page_source_mem(&src, c.n_layers, c.n_kv_heads, c.head_dim, 16), 0);
	kvmem_session_opts_default(&o);
	o.block = 16;
	o.chunk = 32;
	o.budget = 64;
	o.query_tokens = T;
	o.source = &src;
	o.tap = &tap;
	s1 = kvmem_session_create(e, &o);
	assert_non_null(s1);
	assert_int_equal(kvmem_session_append(s1, tok, 200, 0), 0);
	assert_int_equal(kvmem_session_decode(s1, steps, NULL, out), 0);
	assert_int_equal(kvmem_session_save_state(s1, &st, &len), 0);
	s2 = kvmem_session_create(e, &o);
	assert_non_null(s2);
	assert_int_equal(kvmem_session_adopt_state(s2, kvmem_session_token_ids(s1),
						   kvmem_session_tokens(s1), st, len), 0);
	tap.arg = &a;
	assert_int_equal(kvmem_session_select(s1), 0);
	tap.arg = &b;
	assert_int_equal(kvmem_session_select(s2), 0);
	assert_int_equal(a.n_q, T);
	assert_int_equal(b.n_q, T);
	for (int i = 0; i < T; i++)	/* the last T tokens, oldest first */
		assert_int_equal(a.pos[i], 200 + steps - T + i);
	assert_memory_equal(a.pos, b.pos, sizeof(int64_t) * T);
	assert_memory_equal(a.q, b.q, sizeof(float) * c.n_layers * T * c.n_heads * c.head_dim);
	free(st);
	kvmem_session_free(s1);
	kvmem_session_free(s2);
	kvmem_page_source_destroy(&src);
	kvmem_backend_close(e);
	test_model_free(m);
}

static void test_corrupt_state_refused(void **state)
{
	uint64_t rng = g_seed ^ 0x54;
	kvmem_model *m = small_model(&rng);
	kvmem_backend *e = kvmem_backend_cpu(m, 32);
	kvmem_session_opts o;
	struct saved_run sr = { 0 };
	uint8_t *bad;

	kvmem_session_opts_default(&o);
	o.block = 32;
	o.budget = 96;
	o.chunk = 24;
	o.policy = "quest";
	save_one(e, &o, &rng, &sr);
	bad = malloc(sr.len);
	/* A flipped byte anywhere past the header: the checksum. */
	for (int i = 0; i < 40; i++) {
		size_t at = 24 + (size_t)test_rng_int(&rng, 0, (int)sr.len - 25);

		memcpy(bad, sr.state, sr.len);
		bad[at] ^= (uint8_t)test_rng_int(&rng, 1, 255);
		expect_refused(e, &o, &sr, sr.ids, sr.n, bad, sr.len, "checksum mismatch");
	}
	/* In the header: magic, version, length, checksum. */
	memcpy(bad, sr.state, sr.len);
	bad[1] ^= 0x10;
	expect_refused(e, &o, &sr, sr.ids, sr.n, bad, sr.len, "not a session state");
	memcpy(bad, sr.state, sr.len);
	bad[4] = 9;
	expect_refused(e, &o, &sr, sr.ids, sr.n, bad, sr.len, "version 9");
	memcpy(bad, sr.state, sr.len);
	bad[20] ^= 1;
	expect_refused(e, &o, &sr, sr.ids, sr.n, bad, sr.len, "checksum mismatch");
	expect_refused(e, &o, &sr, sr.ids, sr.n, sr.state, sr.len - 3, "torn");
	expect_refused(e, &o, &sr, sr.ids, sr.n, sr.state, 10, "too short");
	expect_refused(e, &o, &sr, sr.ids, sr.n, NULL, 0, "too short");
	free(bad);
	kvmem_page_source_destroy(&sr.src);
	free(sr.ids);
	free(sr.state);
	kvmem_backend_close(e);
	test_model_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_parts_memory),
		cmocka_unit_test(test_two_parts_pager),
		cmocka_unit_test(test_two_parts_stable),
		cmocka_unit_test(test_stable_state_refused),
		cmocka_unit_test(test_default_layout_adopts_saved),
		cmocka_unit_test(test_other_options_refused),
		cmocka_unit_test(test_corrupt_state_refused),
		cmocka_unit_test(test_query_ring_travels),
	};

	g_seed = test_rng_fresh_seed("test_session_state");
	if (getenv("KVMEM_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KVMEM_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}

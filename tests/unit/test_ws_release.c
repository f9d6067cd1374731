// SPDX-License-Identifier: MIT
/*
 * An idle session's view given up and laid out again from its pages
 * (kvmem_session_release_view / kvmem_session_restore_view, issue #24 and
 * #26), on the backend under test (KVMEM_TEST_BACKEND, cpu when unset):
 *
 *  - A random agent session (appends, selections, decodes greedy and
 *    sampled, a budget of a fraction of the history so views shift) runs
 *    twice: once keeping its view, once giving it up after random ops and
 *    laying it out again before the next one. Every forward pass's logits
 *    and every decoded token are equal, bit for bit (memcmp), and so are
 *    the final plan and (cpu) every slot of the view; half the layouts
 *    are made in steps of a random number of layers
 *    (kvmem_session_restore_view_step). Over the memory
 *    source and over the pager with a host pool of a few pages, so the
 *    layout reads pages back from disk; on cpu a third of the sessions
 *    with fp8 views (kv_dtype).
 *  - The same two sides, the second making half its selections in steps of
 *    a random number of layers (kvmem_session_select_step), the first
 *    whole: the same bits again; while a selection is under way the
 *    session refuses to run (EBUSY) and keeps its old view's length.
 *  - The second side also rests now and then between ops, its view kept
 *    (kvmem_session_idle: its row buffers and writer given back), and
 *    the bits stay the same; resting twice, or with the view given up, is
 *    a no-op.
 *  - The view really goes: its length is 0 and (cpu) its capacity too; no
 *    forward runs while it is away (on_forward counts passes); a run call
 *    is refused (EINVAL) naming kvmem_session_restore_view; reading
 *    the session and saving its state work; releasing twice or restoring
 *    a view in place is a no-op.
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
#include "kvmem/store.h"
#include "session/inspect.h"
#include "pager_fixture.h"

static uint64_t g_seed;

/* ---- every forward pass's logits ------------------------------------ */
struct logs {
	float *buf;
	size_t n, cap;
	int vocab;
	int64_t passes;
};

static void log_forward(void *arg, const int32_t *tok, int n, const float *logits)
{
	struct logs *lg = arg;

	if (lg->n + (size_t)lg->vocab > lg->cap) {
		lg->cap = (lg->n + (size_t)lg->vocab) * 2;
		lg->buf = realloc(lg->buf, lg->cap * sizeof(float));
		assert_non_null(lg->buf);
	}
	memcpy(lg->buf + lg->n, logits, (size_t)lg->vocab * sizeof(float));
	lg->n += (size_t)lg->vocab;
	lg->passes++;
}

/* ---- a random agent script -------------------------------------------- */
enum { OP_APPEND, OP_SELECT, OP_DECODE };

struct op {
	int kind, n, sample;
	int32_t *ids;
};

struct script {
	struct op ops[64];
	int n_ops;
	int64_t total;
};

static void make_script(uint64_t *r, int vocab, struct script *sc)
{
	int steps = test_rng_int(r, 5, 8);

	memset(sc, 0, sizeof(*sc));
	for (int s = 0; s < steps; s++) {
		struct op *op = &sc->ops[sc->n_ops++];

		op->kind = OP_APPEND;
		op->n = test_rng_int(r, 1, 120);
		op->ids = malloc(sizeof(int32_t) * (size_t)op->n);
		assert_non_null(op->ids);
		for (int i = 0; i < op->n; i++)
			op->ids[i] = test_rng_int(r, 0, vocab - 1);
		sc->total += op->n;
		if (test_rng_int(r, 0, 2))
			sc->ops[sc->n_ops++] = (struct op){ .kind = OP_SELECT };
		op = &sc->ops[sc->n_ops++];
		*op = (struct op){ .kind = OP_DECODE, .n = test_rng_int(r, 1, 20),
				   .sample = test_rng_int(r, 0, 1) };
		sc->total += op->n;
	}
}

static void free_script(struct script *sc)
{
	for (int i = 0; i < sc->n_ops; i++)
		free(sc->ops[i].ids);
}

static int run_op(kvmem_session *s, const struct op *op, int32_t *out)
{
	static const kvmem_sampler warm = { .temperature = 0.9f, .top_k = 0, .top_p = 1.0f };

	switch (op->kind) {
	case OP_APPEND:
		return kvmem_session_append(s, op->ids, op->n, 0);
	case OP_SELECT:
		return kvmem_session_select(s);
	default:
		return kvmem_session_decode(s, op->n, op->sample ? &warm : NULL, out);
	}
}

/* ---- one side: a session over memory or over the pager ------------------ */
struct side {
	kvmem_page_source src;
	kvmem_pager *p;
	kvmem_session *s;
	char dir[256];
	struct logs lg;
	int32_t *toks;
	int n_toks;
};

struct kase {
	kvmem_model *m;
	kvmem_backend *b;
	const struct script *sc;
	int block, chunk, query_tokens, pager;
	int64_t budget;
	uint64_t seed;
};

static void side_open(const struct kase *k, struct side *d)
{
	const kvmem_config *c = &k->m->cfg;
	kvmem_session_opts o;

	d->lg.vocab = c->vocab;
	d->toks = calloc((size_t)k->sc->total + 1, sizeof(int32_t));
	assert_non_null(d->toks);
	if (k->pager) {
		kvmem_pager_opts po;
		kvmem_page_geom g;

		assert_non_null(fx_tmpdir(d->dir, sizeof(d->dir)));
		kvmem_page_geom_model(&g, k->m, k->block);
		kvmem_pager_opts_default(&po);
		po.flags = KVMEM_PAGER_CREATE;
		/* Three blocks' pages: laying a view out reads most from disk. */
		po.host_cap = kvmem_page_stride(&g) * (uint64_t)(g.n_layers * 3 + 1);
		assert_int_equal(kvmem_pager_open(d->dir, &g, &po, &d->p), 0);
		assert_int_equal(kvmem_page_source_pager(&d->src, d->p), 0);
	} else {
		assert_int_equal(kvmem_page_source_mem(&d->src, c->n_layers, c->n_kv_heads,
						     c->head_dim, k->block), 0);
	}
	kvmem_session_opts_default(&o);
	o.block = k->block;
	o.budget = k->budget;
	o.chunk = k->chunk;
	o.query_tokens = k->query_tokens;
	o.seed = k->seed;
	o.source = &d->src;
	o.on_forward = log_forward;
	o.arg = &d->lg;
	d->s = kvmem_session_create(k->b, &o);
	if (!d->s)
		fail_msg("session: %s", kvmem_last_error());
}

static void side_close(struct side *d)
{
	kvmem_session_free(d->s);
	kvmem_page_source_destroy(&d->src);
	if (d->p) {
		assert_int_equal(kvmem_pager_close(d->p), 0);
		fx_rmtree(d->dir);
	}
	free(d->lg.buf);
	free(d->toks);
}

/* While the view is away: nothing runs, reading works. */
static void check_released(const struct kase *k, struct side *d, const struct op *next)
{
	kvmem_session *s = d->s;
	const kvmem_kvcache *kv = kvmem_session_view(s);
	int64_t passes = d->lg.passes, n = kvmem_session_tokens(s);
	void *state;
	size_t len;

	assert_int_equal(kvmem_session_view_released(s), 1);
	assert_int_equal(kvmem_session_view_len(s), 0);
	if (kv)	/* a backend whose view lives in host memory: it is gone */
		assert_int_equal(kv->cap, 0);
	assert_int_equal(kvmem_session_release_view(s), 0);	/* again: nothing */
	assert_true(run_op(s, next, d->toks + d->n_toks) < 0);
	assert_int_equal(kvmem_last_errno(), EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "kvmem_session_restore_view"));
	assert_int_equal(d->lg.passes, passes);
	assert_int_equal(kvmem_session_tokens(s), n);
	assert_int_equal(kvmem_session_save_state(s, &state, &len), 0);
	free(state);
	(void)k;
}

/* A selection laid out `per` layers a call: while it is under way the
 * session runs nothing (EBUSY) and keeps its old view's length. 1 when it
 * took more than one call. */
static int select_in_steps(const struct kase *k, struct side *d, const struct op *op, int per, int i)
{
	const int L = k->m->cfg.n_layers;
	const int64_t len = kvmem_session_view_len(d->s);
	int rc, calls = 1;

	assert_int_equal(kvmem_session_select_step(d->s, 0), -EINVAL);
	while ((rc = kvmem_session_select_step(d->s, per)) == 1) {
		calls++;
		assert_int_equal(kvmem_session_view_len(d->s), len);
		assert_true(kvmem_session_select(d->s) < 0);
		assert_int_equal(kvmem_last_errno(), EBUSY);
		assert_non_null(strstr(kvmem_last_error(), "kvmem_session_select_step"));
		assert_true(kvmem_session_append(d->s, op->ids ? op->ids : (int32_t[]){ 1 }, 1, 0) < 0);
		assert_int_equal(kvmem_last_errno(), EBUSY);
		assert_true(kvmem_session_release_view(d->s) < 0);
		assert_int_equal(kvmem_last_errno(), EBUSY);
		assert_int_equal(kvmem_session_idle(d->s), 0);	/* a no-op mid-selection */
		assert_int_equal(kvmem_session_view_len(d->s), len);
	}
	if (rc)
		fail_msg("selection in steps of %d, op %d: %s", per, i, kvmem_last_error());
	/* Every slice but the last returns 1 (none when the history is empty). */
	assert_true(calls == 1 || calls == (L + per - 1) / per);
	return calls > 1;
}

/* Returns the times the view was given up (*rested: the times the session
 * rested with its view kept). */
static int run_case(const struct kase *k, uint64_t *r, int *stepped, int *rested)
{
	const kvmem_config *c = &k->m->cfg;
	struct side one = { 0 }, two = { 0 };
	int released = 0;

	side_open(k, &one);
	side_open(k, &two);
	for (int i = 0; i < k->sc->n_ops; i++) {
		const struct op *op = &k->sc->ops[i];

		if (kvmem_session_view_released(two.s)) {
			check_released(k, &two, op);
			if (test_rng_int(r, 0, 1)) {
				/* In steps of `per` layers: given up until the last. */
				int per = (int)test_rng_int(r, 1, c->n_layers), rc, steps = 0;

				assert_int_equal(kvmem_session_restore_view_step(two.s, 0), -EINVAL);
				assert_int_equal(kvmem_last_errno(), EINVAL);
				while ((rc = kvmem_session_restore_view_step(two.s, per)) == 1) {
					steps++;
					assert_int_equal(kvmem_session_view_released(two.s), 1);
				}
				if (rc)
					fail_msg("restore in steps of %d before op %d: %s", per, i,
						 kvmem_last_error());
				assert_int_equal(steps, (c->n_layers + per - 1) / per - 1);
			} else if (kvmem_session_restore_view(two.s)) {
				fail_msg("restore before op %d: %s", i, kvmem_last_error());
			}
			assert_int_equal(kvmem_session_view_released(two.s), 0);
			assert_int_equal(kvmem_session_view_len(two.s), kvmem_session_view_len(one.s));
		}
		assert_int_equal(kvmem_session_restore_view(two.s), 0);	/* in place: nothing */
		if (run_op(one.s, op, one.toks + one.n_toks))
			fail_msg("kept view, op %d: %s", i, kvmem_last_error());
		if (op->kind == OP_SELECT && test_rng_int(r, 0, 1))
			*stepped += select_in_steps(k, &two, op,
						    (int)test_rng_int(r, 1, c->n_layers > 1 ? c->n_layers - 1 : 1), i);
		else if (run_op(two.s, op, two.toks + two.n_toks))
			fail_msg("released view, op %d: %s", i, kvmem_last_error());
		if (op->kind == OP_DECODE) {
			one.n_toks += op->n;
			two.n_toks += op->n;
		}
		if (test_rng_int(r, 0, 1)) {
			assert_int_equal(kvmem_session_release_view(two.s), 0);
			released++;
		} else if (test_rng_int(r, 0, 1)) {
			if (kvmem_session_idle(two.s))
				fail_msg("rest after op %d: %s", i, kvmem_last_error());
			assert_int_equal(kvmem_session_idle(two.s), 0);	/* again: nothing */
			assert_int_equal(kvmem_session_view_len(two.s), kvmem_session_view_len(one.s));
			(*rested)++;
		}
		if (kvmem_session_view_released(two.s))
			assert_int_equal(kvmem_session_idle(two.s), 0);	/* nothing to give */
	}
	if (kvmem_session_restore_view(two.s))
		fail_msg("restore at the end: %s", kvmem_last_error());
	if (one.n_toks != two.n_toks || memcmp(one.toks, two.toks, sizeof(int32_t) * one.n_toks))
		fail_msg("block %d, budget %lld, %s: decoded tokens differ after %d releases",
			 k->block, (long long)k->budget, k->pager ? "pager" : "memory", released);
	assert_int_equal(one.lg.passes, two.lg.passes);
	if (memcmp(one.lg.buf, two.lg.buf, one.lg.n * sizeof(float)))
		fail_msg("block %d, budget %lld, %s: logits differ after %d releases", k->block,
			 (long long)k->budget, k->pager ? "pager" : "memory", released);
	{
		const kvmem_plan *p1 = kvmem_session_plan(one.s), *p2 = kvmem_session_plan(two.s);
		const kvmem_kvcache *v1 = kvmem_session_view(one.s), *v2 = kvmem_session_view(two.s);

		assert_int_equal(p1->n_view, p2->n_view);
		assert_memory_equal(p1->blocks, p2->blocks, sizeof(int64_t) * p1->n_sets * p1->n_view);
		assert_memory_equal(p1->start, p2->start, sizeof(int64_t) * p1->n_sets * p1->n_view);
		assert_int_equal(kvmem_session_view_len(one.s), kvmem_session_view_len(two.s));
		for (int l = 0; v1 && l < c->n_layers; l++)
			for (int h = 0; h < c->n_kv_heads; h++) {
				assert_memory_equal(kvmem_kv_k(v1, l, h, 0), kvmem_kv_k(v2, l, h, 0),
						    sizeof(float) * v1->len * c->head_dim);
				assert_memory_equal(kvmem_kv_v(v1, l, h, 0), kvmem_kv_v(v2, l, h, 0),
						    sizeof(float) * v1->len * c->head_dim);
			}
	}
	side_close(&one);
	side_close(&two);
	return released;
}

static kvmem_model *small_model(uint64_t *r)
{
	/* The CUDA attention takes head_dim 64 or 128 only. */
	const int hd = strcmp(test_backend_name(), "cuda") ? 16 : 64;
	kvmem_config c = test_model_config(test_rng_int(r, 1, 3), 64, 4, 2, hd, 96, 97,
					   test_rng_int(r, 0, 1));

	return test_model_random(&c, test_rng_next(r));
}

static void cases(int pager)
{
	uint64_t r = test_rng_named(g_seed, pager ? "pager" : "memory");
	const int cpu = !strcmp(test_backend_name(), "cpu");
	int released = 0, fp8 = 0, stepped = 0, rested = 0;

	for (int i = 0; i < 6; i++) {
		kvmem_model *m = small_model(&r);
		kvmem_backend *b;
		struct script sc;
		struct kase k = { .m = m, .sc = &sc, .pager = pager };

		/* Now and then an fp8 view (cpu): a placed page is rounded as
		 * the engine rounds a new token. */
		uint32_t kv = cpu && test_rng_int(&r, 0, 2) == 0 ? KVMEM_DTYPE_FP8 : 0;

		fp8 += kv != 0;
		if (kvmem_backend_open(test_backend_name(), m,
				       &(kvmem_backend_opts){ .max_chunk = 32, .kv_dtype = kv }, &b) < 0)
			fail_msg("backend %s: %s", test_backend_name(), kvmem_last_error());
		k.b = b;
		make_script(&r, m->cfg.vocab, &sc);
		k.block = 16 << test_rng_int(&r, 0, 1);
		/* A fraction of the history: selections shift the view. */
		k.budget = sc.total / 4 > 2 * k.block ? sc.total / 4 : 2 * k.block;
		k.chunk = test_rng_int(&r, 1, 32);
		k.query_tokens = test_rng_int(&r, 1, 6);
		k.seed = test_rng_next(&r);
		released += run_case(&k, &r, &stepped, &rested);
		free_script(&sc);
		kvmem_backend_close(b);
		test_model_free(m);
	}
	print_message("%s source, %s backend: 6 sessions (%d with fp8 views), %d views given up "
		      "and laid out again, %d rests with the view kept, %d selections in steps\n",
		      pager ? "pager" : "memory", test_backend_name(), fp8, released, rested, stepped);
	assert_true(released > 0);
	assert_true(rested > 0);
}

static void test_release_memory(void **state)
{
	cases(0);
}

static void test_release_pager(void **state)
{
	cases(1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_release_memory),
		cmocka_unit_test(test_release_pager),
	};

	g_seed = test_rng_fresh_seed("test_ws_release");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

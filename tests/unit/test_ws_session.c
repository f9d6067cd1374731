// SPDX-License-Identifier: MIT
/*
 * Agent sessions on the CPU engine.
 *
 *  - Exactness: with a budget that holds the whole workspace, every logit
 *    of every forward pass equals (memcmp) a plain full-context run with the
 *    same chunking, for every policy, block sizes 16..256, partial blocks,
 *    several chunk sizes, over many steps; with and without rebuilding
 *    every view token from raw K.
 *  - Raw K from the pages, rotated at position p, is the engine's own
 *    rotated K at p.
 *  - With small budgets, over random step sequences: the view is exactly
 *    what the plan says (every slot's K is raw K rotated at that slot, V is
 *    V), chronological, within budget, pins present; generation far past
 *    the tail reserve goes on.
 *  - Tokens moved inside the view on the backend (from the raw K it keeps)
 *    give the bits of placing them from their pages; a step reads from the
 *    page source only the pages of the blocks that entered.
 *  - Over a bf16 workspace, pages a backend writes itself (page_rows: the
 *    cuda backend's copies into the pinned pool) are the pages made from
 *    its rows on the host (KVMEM_PAGE_ROWS=0): every logit, every page,
 *    the checksums verify.
 *  - Sessions over workspaces that share one host pool (a server's
 *    conversations), steps interleaved: each one's logits are those of it
 *    alone; a backend with a device page pool serves them pages from it
 *    (each session's pages keyed by its owner tag).
 */
#include <math.h>
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
#include "helpers/test_model.h"
#include "helpers/test_logits.h"
#include "helpers/test_tmpdir.h"

static uint64_t g_seed;

/* The backend under test: KVMEM_TEST_BACKEND (cpu when unset), so the same
 * exactness checks run on every backend through its ops. */
static kvmem_backend *test_backend(const kvmem_model *m, int chunk)
{
	kvmem_backend *b;

	if (kvmem_backend_open(test_backend_name(), m,
			       &(kvmem_backend_opts){ .max_chunk = chunk }, &b) < 0)
		fail_msg("backend: %s", kvmem_last_error());
	return b;
}

/* ---- a plain full-context twin fed by on_forward ---------------------- */
/* A second view on the session's backend that only grows. */
struct twin {
	kvmem_backend *e;
	kvmem_view *v;
	int vocab, all;
	float *logits;
	int64_t calls, mismatches;
	double max_diff;
};

static void twin_open(struct twin *t, kvmem_backend *e)
{
	t->e = e;
	assert_int_equal(e->ops->view_create(e->ctx, &t->v), 0);
}

static void twin_close(struct twin *t)
{
	t->e->ops->view_destroy(t->e->ctx, t->v);
	free(t->logits);
}

static void twin_forward(void *arg, const int32_t *tok, int n, const float *logits)
{
	struct twin *t = arg;
	size_t cnt = (size_t)(t->all ? n : 1) * t->vocab;

	assert_int_equal(kvmem_backend_append_out(t->e, t->v, tok, n, t->logits, t->all, NULL), 0);
	t->calls++;
	if (memcmp(logits, t->logits, cnt * sizeof(float)))
		t->mismatches++;
	for (size_t i = 0; i < cnt; i++)
		t->max_diff = fmax(t->max_diff, fabs((double)logits[i] - t->logits[i]));
}

/* ---- models ------------------------------------------------------------ */
static kvmem_model *small_model(uint64_t *rng)
{
	static const int geo[][4] = {	/* layers, heads, kv heads, head_dim */
		{ 2, 4, 2, 16 }, { 1, 2, 1, 8 }, { 3, 4, 1, 12 }, { 2, 6, 3, 8 },
	};
	/* The CUDA attention takes head_dim 64 or 128 only. */
	static const int gpu_geo[][4] = {
		{ 2, 4, 2, 64 }, { 1, 2, 1, 128 }, { 3, 4, 1, 64 }, { 2, 6, 3, 64 },
	};
	const int *g = (!strcmp(test_backend_name(), "cuda") ? gpu_geo : geo)[test_rng_int(rng, 0, 3)];
	kvmem_config c = test_model_config(g[0], 24, g[1], g[2], g[3], 40, 53, test_rng_int(rng, 0, 1));

	return test_model_random(&c, (uint64_t)test_rng_int(rng, 1, 1 << 30));
}

static int32_t *random_tokens(uint64_t *rng, int n, int vocab)
{
	int32_t *t = malloc(sizeof(int32_t) * (n ? n : 1));

	for (int i = 0; i < n; i++)
		t[i] = test_rng_int(rng, 0, vocab - 1);
	return t;
}

/* ---- a random step script ---------------------------------------------- */
struct op {
	int kind;	/* 0 append, 1 select + decode, 2 unpin all */
	int n, pin;
};

static int make_script(uint64_t *rng, struct op *ops, int max_ops, int steps, int max_append,
		       int64_t *total)
{
	int n = 0;

	*total = 0;
	for (int s = 0; s < steps && n + 4 < max_ops; s++) {
		int appends = test_rng_int(rng, 1, 2);

		for (int a = 0; a < appends; a++) {
			ops[n] = (struct op){ 0, test_rng_int(rng, 1, max_append),
					     test_rng_int(rng, 0, 4) == 0 };
			*total += ops[n++].n;
		}
		if (test_rng_int(rng, 0, 5) == 0)
			ops[n++] = (struct op){ 2, 0, 0 };
		ops[n] = (struct op){ 1, test_rng_int(rng, 0, max_append / 4), 0 };
		*total += ops[n++].n;
	}
	return n;
}

/* ---- the view invariant -------------------------------------------------- */
/*
 * Every slot of the view holds what the plan says: history slots the K of
 * their block's token rotated from raw K at that slot, tail slots the
 * tokens after the plan at their slots; V copied; within budget; pins in.
 */
static void check_view(kvmem_session *s, const kvmem_page_source *src, const kvmem_config *c)
{
	const kvmem_plan *p = kvmem_session_plan(s);
	const kvmem_kvcache *kv = kvmem_session_view(s);
	const kvmem_blocks *r = kvmem_session_blocks(s);
	const kvmem_session_opts *o = kvmem_session_options(s);
	const int d = c->head_dim, B = r->block;
	float *rot;
	int64_t tail;

	if (!kv)
		return;	/* the backend's view is not in host memory */
	/* The source is read here, past the session: a decode step's last
	 * rows may still be on the writer (KVMEM_WRITER_MIN=1, a GPU). */
	assert_int_equal(kvmem_session_sync(s), 0);
	rot = malloc(sizeof(float) * d);
	tail = kv->len - p->view_tokens;

	if (o->budget) {
		assert_true(p->view_tokens <= o->budget);
		assert_true(kv->len <= o->budget + o->reserve);
	}
	assert_true(tail >= 0);
	assert_int_equal(p->n_tokens + tail, kvmem_session_tokens(s));
	int64_t *at = malloc(sizeof(int64_t) * (p->view_tokens ? p->view_tokens : 1));

	assert_non_null(at);
	for (int l = 0; l < c->n_layers; l++) {
		int set = p->n_sets == 1 ? 0 : l;
		const int64_t *blk = p->blocks + (size_t)set * p->n_view;
		const int64_t *st = p->start + (size_t)set * p->n_view;

		/* The position each history slot holds: the blocks, chronological,
		 * tile the slots (in order when compact, anywhere when stable). */
		for (int64_t slot = 0; slot < p->view_tokens; slot++)
			at[slot] = -1;
		for (int i = 0; i < p->n_view; i++) {
			int64_t len = p->n_tokens - blk[i] * B < B ? p->n_tokens - blk[i] * B : B;

			if (i)
				assert_true(blk[i - 1] < blk[i]);
			if (o->layout != KVMEM_LAYOUT_STABLE)
				assert_int_equal(st[i], i ? st[i - 1] + B : 0);
			assert_true(st[i] >= 0 && st[i] + len <= p->view_tokens);
			for (int64_t u = 0; u < len; u++) {
				assert_int_equal(at[st[i] + u], -1);
				at[st[i] + u] = blk[i] * B + u;
			}
		}
		for (int64_t slot = 0; slot < kv->len; slot++) {
			int64_t pos;

			if (slot < p->view_tokens) {
				pos = at[slot];
				assert_true(pos >= 0);	/* no hole */
			} else {
				pos = p->n_tokens + (slot - p->view_tokens);
			}
			const float *pk, *pv;
			int32_t s32 = (int32_t)slot;
			kvmem_page pg;

			assert_int_equal(src->ops->get(src->ctx, pos / B, l, &pg), 0);
			assert_int_equal(pg.dtype, KVMEM_DTYPE_F32);
			pk = pg.k;
			pv = pg.v;
			for (int h = 0; h < c->n_kv_heads; h++) {
				const float *rk = pk + ((size_t)h * B + pos % B) * d;

				memcpy(rot, rk, sizeof(float) * d);
				kvmem_rope(rot, &s32, 1, 1, d, c->rope_theta);
				assert_memory_equal(kvmem_kv_k(kv, l, h, (int)slot), rot, sizeof(float) * d);
				assert_memory_equal(kvmem_kv_v(kv, l, h, (int)slot),
						    pv + ((size_t)h * B + pos % B) * d, sizeof(float) * d);
			}
			src->ops->put(src->ctx, pos / B, l);
		}
		/* Pins (as of the plan) are in the view. */
		for (int i = 0; i < r->n_pins && r->pins[i].start < p->n_tokens; i++) {
			int64_t e = r->pins[i].end < p->n_tokens ? r->pins[i].end : p->n_tokens;

			for (int64_t b = r->pins[i].start / B; b <= (e - 1) / B; b++) {
				int found = 0;

				for (int j = 0; j < p->n_view; j++)
					found |= blk[j] == b;
				assert_true(found);
			}
		}
	}
	free(at);
	free(rot);
}

/* ---- one scripted run --------------------------------------------------- */
struct run_cfg {
	const char *policy;
	int block, chunk, rebuild_all, all_logits;
	int layout;		/* enum kvmem_layout */
	int64_t budget;		/* < 0: the whole workspace plus -budget-1 */
	int budget_div;		/* > 0: budget = max(2 blocks, workspace / budget_div) */
	int steps, max_append;
	int check_every;	/* check_view after every op */
};

struct run_out {
	int64_t budget, tokens, calls, mismatches, forced, pins_refused;
	double max_diff;
};

static void run_session(uint64_t *rng, const struct run_cfg *rc, struct run_out *ro)
{
	kvmem_model *m = small_model(rng);
	const kvmem_config *c = &m->cfg;
	kvmem_backend *e = test_backend(m, rc->chunk);
	struct op ops[128];
	int64_t total;
	int n_ops = make_script(rng, ops, 128, rc->steps, rc->max_append, &total);
	kvmem_page_source src;
	kvmem_session_opts o;
	struct twin t = { .vocab = c->vocab, .all = rc->all_logits };
	kvmem_session *s;

	memset(ro, 0, sizeof(*ro));
	kvmem_session_stats st;
	kvmem_sampler smp = { .temperature = 0.9f, .top_k = 0, .top_p = 1.0f };

	assert_non_null(e);
	twin_open(&t, e);
	t.logits = malloc(sizeof(float) * rc->chunk * c->vocab);
	assert_int_equal(kvmem_page_source_mem(&src, c->n_layers, c->n_kv_heads, c->head_dim,
					     rc->block), 0);
	kvmem_session_opts_default(&o);
	o.block = rc->block;
	o.chunk = rc->chunk;
	o.policy = rc->policy;
	o.budget = rc->budget < 0 ? total + (-rc->budget - 1) : rc->budget;
	if (o.budget < rc->block)	/* a budget holds at least one block */
		o.budget = rc->block;
	if (rc->budget_div)
		o.budget = total / rc->budget_div > 2 * rc->block ? total / rc->budget_div :
			   2 * rc->block;
	ro->budget = o.budget;
	o.rebuild_all = rc->rebuild_all;
	o.all_logits = rc->all_logits;
	o.layout = rc->layout;
	o.seed = (uint64_t)test_rng_int(rng, 0, 1 << 30);
	o.source = &src;
	o.on_forward = twin_forward;
	o.arg = &t;
	s = kvmem_session_create(e, &o);
	if (!s)
		fail_msg("session: %s", kvmem_last_error());
	int32_t *want = malloc(sizeof(int32_t) * (total + 1));
	int64_t at = 0;

	for (int i = 0; i < n_ops; i++) {
		int32_t *tok = random_tokens(rng, ops[i].n, c->vocab), out[32];

		if (ops[i].kind == 0) {
			int rcode = kvmem_session_append(s, tok, ops[i].n, ops[i].pin);

			if (rcode && ops[i].pin && strstr(kvmem_last_error(), "budget")) {
				/* Refused pin: nothing ran; append without it. */
				ro->pins_refused++;
				rcode = kvmem_session_append(s, tok, ops[i].n, 0);
			}
			if (rcode)
				fail_msg("append: %s", kvmem_last_error());
			memcpy(want + at, tok, sizeof(int32_t) * ops[i].n);
			at += ops[i].n;
		} else if (ops[i].kind == 1) {
			if (kvmem_session_select(s))
				fail_msg("select: %s", kvmem_last_error());
			if (rc->check_every)
				check_view(s, &src, c);
			if (kvmem_session_decode(s, ops[i].n, i % 3 ? NULL : &smp, out))
				fail_msg("decode: %s", kvmem_last_error());
			for (int j = 0; j < ops[i].n; j++)
				assert_true(out[j] >= 0 && out[j] < c->vocab);
			memcpy(want + at, out, sizeof(int32_t) * ops[i].n);
			at += ops[i].n;
		} else {
			assert_int_equal(kvmem_session_unpin(s, 0, kvmem_session_tokens(s)), 0);
		}
		if (rc->check_every)
			check_view(s, &src, c);
		free(tok);
	}
	assert_int_equal(kvmem_session_tokens(s), total);
	assert_memory_equal(kvmem_session_token_ids(s), want, sizeof(int32_t) * total);
	free(want);
	/* A last selection, then the whole view checked once more. */
	assert_int_equal(kvmem_session_select(s), 0);
	check_view(s, &src, c);
	kvmem_session_get_stats(s, &st);
	ro->tokens = total;
	ro->calls = t.calls;
	ro->mismatches = t.mismatches;
	ro->max_diff = t.max_diff;
	ro->forced = st.forced;
	assert_int_equal(st.forwards, t.calls);
	if (rc->budget < 0) {
		/* Identity view: the session's K / V are the twin's, bit for bit. */
		const kvmem_kvcache *kv = kvmem_session_view(s);
		const kvmem_kvcache *tkv = e->ops->host_view ? e->ops->host_view(e->ctx, t.v) : NULL;

		if (kv && tkv)
			assert_int_equal(kv->len, tkv->len);
		for (int l = 0; kv && tkv && l < c->n_layers; l++)
			for (int h = 0; h < c->n_kv_heads; h++) {
				assert_memory_equal(kvmem_kv_k(kv, l, h, 0), kvmem_kv_k(tkv, l, h, 0),
						    sizeof(float) * kv->len * c->head_dim);
				assert_memory_equal(kvmem_kv_v(kv, l, h, 0), kvmem_kv_v(tkv, l, h, 0),
						    sizeof(float) * kv->len * c->head_dim);
			}
	}
	kvmem_session_free(s);
	kvmem_page_source_destroy(&src);
	twin_close(&t);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* ---- tests ---------------------------------------------------------------- */
/* Every policy the library knows, the anchors added for the lab included:
 * a new policy gets these checks with no change here. */
#define POLICY(p) (kvmem_policy_at(p)->name)

static void test_exact_every_policy(void **state)
{
	static const int chunks[] = { 1, 3, 8, 17, 32, 64 };
	uint64_t rng = g_seed;

	for (int p = 0; kvmem_policy_at(p); p++)
		for (int bi = 0; bi < 5; bi++) {
			struct run_cfg rc = {
				.policy = POLICY(p), .block = 16 << bi,
				.chunk = chunks[test_rng_int(&rng, 1, 5)],
				.rebuild_all = (p + bi) % 2, .all_logits = 1,
				/* tight (== workspace) or with room to spare */
				.budget = -1 - test_rng_int(&rng, 0, 1) * test_rng_int(&rng, 0, 300),
				.steps = 7, .max_append = 56,
			};
			struct run_out ro;

			run_session(&rng, &rc, &ro);
			if (ro.mismatches)
				fail_msg("policy %s block %d chunk %d: %lld of %lld forward passes differ "
					 "(max |diff| %g)", rc.policy, rc.block, rc.chunk,
					 (long long)ro.mismatches, (long long)ro.calls, ro.max_diff);
			assert_true(ro.calls > 8);
		}
}

/* Chunk of one token (slow path) and a chunk larger than most appends. */
static void test_exact_chunk_extremes(void **state)
{
	uint64_t rng = g_seed ^ 0xce;
	const int chunks[] = { 1, 100 };

	for (int i = 0; i < 2; i++) {
		struct run_cfg rc = { .policy = "meank", .block = 16, .chunk = chunks[i],
				      .rebuild_all = 1, .all_logits = i, .budget = -1, .steps = 4,
				      .max_append = 90 };
		struct run_out ro;

		run_session(&rng, &rc, &ro);
		assert_int_equal(ro.mismatches, 0);
	}
}

/* The raw K of every page, rotated at its position, is the engine's K. */
static void test_raw_k_rotates_to_engine_k(void **state)
{
	uint64_t rng = g_seed ^ 0x4b;
	kvmem_model *m = small_model(&rng);
	const kvmem_config *c = &m->cfg;
	kvmem_backend *e = kvmem_backend_cpu(m, 32);
	kvmem_page_source src;
	kvmem_session_opts o;
	struct twin t = { .vocab = c->vocab };
	int n = test_rng_int(&rng, 100, 400), B = 16 << test_rng_int(&rng, 0, 4);
	int32_t *tok = random_tokens(&rng, n, c->vocab);
	kvmem_session *s;
	float *rot = malloc(sizeof(float) * c->head_dim);

	twin_open(&t, e);
	t.logits = malloc(sizeof(float) * c->vocab * 32);
	kvmem_page_source_mem(&src, c->n_layers, c->n_kv_heads, c->head_dim, B);
	kvmem_session_opts_default(&o);
	o.block = B;
	o.chunk = 32;
	o.source = &src;
	o.on_forward = twin_forward;
	o.arg = &t;
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	assert_int_equal(kvmem_session_append(s, tok, n, 0), 0);
	for (int64_t p = 0; p < n; p++)
		for (int l = 0; l < c->n_layers; l++) {
			const float *pk;
			int32_t p32 = (int32_t)p;
			kvmem_page pg;

			assert_int_equal(src.ops->get(src.ctx, p / B, l, &pg), 0);
			pk = pg.k;
			for (int h = 0; h < c->n_kv_heads; h++) {
				memcpy(rot, pk + ((size_t)h * B + p % B) * c->head_dim,
				       sizeof(float) * c->head_dim);
				kvmem_rope(rot, &p32, 1, 1, c->head_dim, c->rope_theta);
				assert_memory_equal(rot,
						    kvmem_kv_k(e->ops->host_view(e->ctx, t.v), l, h,
							       (int)p), sizeof(float) * c->head_dim);
			}
		}
	kvmem_session_free(s);
	kvmem_page_source_destroy(&src);
	twin_close(&t);
	free(tok);
	free(rot);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* Budgets about a tenth of the workspace: every invariant after every op. */
static void test_small_budget_properties(void **state)
{
	uint64_t rng = g_seed ^ 0x5b;

	for (int p = 0; kvmem_policy_at(p); p++)
		for (int k = 0; k < 2; k++) {
			int B = 16 << test_rng_int(&rng, 0, 2);
			struct run_cfg rc = {
				.policy = POLICY(p), .block = B,
				.chunk = test_rng_int(&rng, 1, 40), .rebuild_all = k,
				.budget_div = 10, .steps = 8, .max_append = 90,
				.check_every = 1,
			};
			struct run_out ro;

			run_session(&rng, &rc, &ro);
			/* A tenth of the workspace, unless two blocks is more. */
			assert_true(ro.budget == 2 * rc.block || ro.tokens >= 10 * ro.budget);
		}
}

/* Far past the reserve: 600 decoded tokens with an 8-slot reserve. */
static void test_long_generation(void **state)
{
	uint64_t rng = g_seed ^ 0x10;
	kvmem_model *m = small_model(&rng);
	const kvmem_config *c = &m->cfg;
	kvmem_backend *e = test_backend(m, 8);
	kvmem_page_source src;
	kvmem_session_opts o;
	kvmem_session_stats st;
	int32_t *tok = random_tokens(&rng, 50, c->vocab), out[600];
	kvmem_session *s;

	kvmem_page_source_mem(&src, c->n_layers, c->n_kv_heads, c->head_dim, 16);
	kvmem_session_opts_default(&o);
	o.block = 16;
	o.chunk = 8;
	o.budget = 64;
	o.reserve = 8;
	o.source = &src;
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	assert_int_equal(kvmem_session_append(s, tok, 20, 1), 0);	/* a pinned "system prompt" */
	assert_int_equal(kvmem_session_append(s, tok + 20, 30, 0), 0);
	assert_int_equal(kvmem_session_select(s), 0);
	assert_int_equal(kvmem_session_decode(s, 600, NULL, out), 0);
	check_view(s, &src, c);
	kvmem_session_get_stats(s, &st);
	assert_int_equal(kvmem_session_tokens(s), 650);
	/* The pins hold 32 of the 64: the tail never has more than 40 slots. */
	assert_true(st.forced >= 600 / 40 - 1);
	assert_true(kvmem_session_view_len(s) <= 64 + 8);
	kvmem_session_free(s);
	kvmem_page_source_destroy(&src);
	free(tok);
	kvmem_backend_close(e);
	test_model_free(m);
}

/*
 * A second session adopts the first one's pages (a reopened workspace) and
 * goes on: with a budget over the workspace it stays bit-exact with the
 * full-context twin that saw the whole history.
 */
static void test_adopt_resumes(void **state)
{
	uint64_t rng = g_seed ^ 0xad;
	kvmem_model *m = small_model(&rng);
	const kvmem_config *c = &m->cfg;
	kvmem_backend *e = test_backend(m, 16);
	kvmem_page_source src;
	kvmem_session_opts o;
	struct twin t = { .vocab = c->vocab, .all = 1 };
	int B = 16 << test_rng_int(&rng, 0, 2), n1 = test_rng_int(&rng, 1, 300);
	int32_t *tok = random_tokens(&rng, n1 + 100, c->vocab), *ids, out[8];
	kvmem_session *s;

	twin_open(&t, e);
	t.logits = malloc(sizeof(float) * c->vocab * 16);
	kvmem_page_source_mem(&src, c->n_layers, c->n_kv_heads, c->head_dim, B);
	kvmem_session_opts_default(&o);
	o.block = B;
	o.chunk = 16;
	o.budget = 4096;
	o.all_logits = 1;
	o.source = &src;
	o.on_forward = twin_forward;
	o.arg = &t;
	s = kvmem_session_create(e, &o);
	assert_int_equal(kvmem_session_append(s, tok, n1, 0), 0);
	ids = malloc(sizeof(int32_t) * n1);
	memcpy(ids, kvmem_session_token_ids(s), sizeof(int32_t) * n1);
	kvmem_session_free(s);

	s = kvmem_session_create(e, &o);
	assert_true(kvmem_session_decode(s, 1, NULL, out) < 0);
	assert_int_equal(kvmem_session_adopt(s, ids, n1), 0);
	assert_int_equal(kvmem_session_tokens(s), n1);
	assert_int_equal(kvmem_session_plan(s)->view_tokens, n1);
	assert_int_equal(kvmem_session_plan(s)->entering, kvmem_session_plan(s)->n_view);
	check_view(s, &src, c);
	assert_true(kvmem_session_adopt(s, ids, n1) < 0);	/* only once */
	assert_int_equal(kvmem_session_append(s, tok + n1, 100, 0), 0);
	assert_int_equal(kvmem_session_select(s), 0);
	assert_int_equal(kvmem_session_decode(s, 8, NULL, out), 0);
	check_view(s, &src, c);
	assert_int_equal(t.mismatches, 0);
	assert_true(t.calls > 8);
	kvmem_session_free(s);
	kvmem_page_source_destroy(&src);
	twin_close(&t);
	free(tok);
	free(ids);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* ---- the selector's hints to the page source ----------------------------- */
/* The last hint call a source heard (a source's ops are shared, so the log
 * is one per test run, not per source). */
static struct {
	const kvmem_page_source_ops *real;
	int64_t blocks[4096];
	float scores[4096];
	int n, calls;
} g_hints;

static void log_hint(void *ctx, const int64_t *blocks, const float *scores, int n)
{
	assert_true(n >= 0 && n <= 4096);
	memcpy(g_hints.blocks, blocks, sizeof(int64_t) * n);
	memcpy(g_hints.scores, scores, sizeof(float) * n);
	g_hints.n = n;
	g_hints.calls++;
	if (g_hints.real->hint)
		g_hints.real->hint(ctx, blocks, scores, n);
}

/* A block's best score over the selection's sets. */
static float best_score(const float *sc, int sets, int64_t nb, int64_t b)
{
	float x = sc[b];

	for (int k = 1; k < sets; k++)
		x = sc[(size_t)k * nb + b] > x ? sc[(size_t)k * nb + b] : x;
	return x;
}

/*
 * After a selection the source hears 1 for every block of the new view and
 * 0.5 for as many runners-up (fewer when fewer are left): the best of the
 * other blocks by their best score. What a score-keeping cache uses.
 */
static void test_hints_follow_selection(void **state)
{
	uint64_t rng = g_seed ^ 0x417;
	kvmem_model *m = small_model(&rng);
	const kvmem_config *c = &m->cfg;
	kvmem_backend *e = test_backend(m, 32);
	kvmem_page_source src, logged;
	kvmem_page_source_ops ops;
	kvmem_session_opts o;
	const int B = 16;

	assert_int_equal(kvmem_page_source_mem(&src, c->n_layers, c->n_kv_heads, c->head_dim, B), 0);
	ops = *src.ops;	/* the same source, its hints logged on the way */
	ops.hint = log_hint;
	g_hints.real = src.ops;
	g_hints.calls = 0;
	logged = (kvmem_page_source){ .ops = &ops, .ctx = src.ctx };
	for (int p = 0; kvmem_policy_at(p); p++) {
		int n = test_rng_int(&rng, 12, 40) * B, sets;
		int32_t *tok = random_tokens(&rng, n, c->vocab);
		int64_t nb, in = 0, out = 0;
		const kvmem_plan *pl;
		const float *sc;
		kvmem_session *s;
		char *held;

		kvmem_session_opts_default(&o);
		o.block = B;
		o.chunk = 32;
		o.policy = kvmem_policy_at(p)->name;
		o.budget = test_rng_int(&rng, 3, 10) * B;
		o.source = &logged;
		s = kvmem_session_create(e, &o);
		assert_non_null(s);
		assert_int_equal(kvmem_session_append(s, tok, n, 0), 0);
		g_hints.n = -1;
		assert_int_equal(kvmem_session_select(s), 0);
		pl = kvmem_session_plan(s);
		sc = kvmem_session_scores(s, &sets, &nb);
		assert_non_null(sc);
		assert_true(g_hints.n > 0);
		held = calloc((size_t)nb, 1);
		for (int k = 0; k < pl->n_sets; k++)
			for (int i = 0; i < pl->n_view; i++)
				held[pl->blocks[(size_t)k * pl->n_view + i]] = 1;
		for (int64_t b = 0; b < nb; b++)
			in += held[b];
		/* the view's blocks at 1, each once, first */
		for (int i = 0; i < in; i++) {
			assert_true(g_hints.scores[i] == 1.0f);
			assert_int_equal(held[g_hints.blocks[i]], 1);
			held[g_hints.blocks[i]] = 2;
		}
		/* then min(in, nb - in) runners-up at 0.5, none scored below a
		 * block left out */
		out = in < nb - in ? in : nb - in;
		assert_int_equal(g_hints.n, in + out);
		for (int i = in; i < g_hints.n; i++) {
			assert_true(g_hints.scores[i] == 0.5f);
			assert_int_equal(held[g_hints.blocks[i]], 0);
			held[g_hints.blocks[i]] = 3;
		}
		for (int i = in; i < g_hints.n; i++)
			for (int64_t b = 0; b < nb; b++)
				if (!held[b])
					assert_true(best_score(sc, sets, nb, g_hints.blocks[i]) >=
						    best_score(sc, sets, nb, b));
		free(held);
		kvmem_session_free(s);
		free(tok);
	}
	assert_true(g_hints.calls > 0);
	kvmem_page_source_destroy(&src);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* ---- scoring on the backend's device ------------------------------------- */
/* Each selection's scores against the policy's own host scoring of the
 * same context (device NULL), within a few fp32 ulps. */
struct score_check {
	const kvmem_policy_ops *pol;
	int64_t calls;
	double max_rel;
};

static void check_scored(void *arg, const kvmem_session *s, const kvmem_select_ctx *c,
			 const float *scores, int forced)
{
	struct score_check *k = arg;
	kvmem_select_ctx hc = *c;
	float *host = malloc(sizeof(float) * (size_t)c->n_blocks);

	hc.device = NULL;
	assert_int_equal(k->pol->score(&hc, host), 0);
	for (int64_t b = 0; b < c->n_blocks; b++) {
		double d = fabs((double)scores[b] - host[b]);

		assert_true(d <= 1e-5 * fabs((double)host[b]) + 1e-7);
		if (host[b])
			k->max_rel = fmax(k->max_rel, d / fabs((double)host[b]));
	}
	k->calls++;
	free(host);
}

/*
 * meank and subblock score on the backend's device when it has a score op
 * (cuda), over a copy of the index kept up to date between selections:
 * appends of odd lengths leave the last block part-filled at one selection
 * and grown at the next, which the copy must see. Scores match the host's;
 * with host_scoring the host scores; with an index share too small for the
 * copy the device scores the host's index in place (mapped), holding only
 * the queries and the scores.
 */
static void test_device_scores_match_host(void **state)
{
	uint64_t rng = g_seed ^ 0xd5c;
	kvmem_model *m = small_model(&rng);
	const kvmem_config *c = &m->cfg;
	const char *pols[] = { "meank", "subblock" };

	for (int mode = 0; mode < 3; mode++)	/* device, host_scoring, no room */
		for (int p = 0; p < 2; p++) {
			kvmem_backend_opts bo = { .max_chunk = 32, .index_mem = mode == 2 ? 1 : 0 };
			struct score_check k = { .pol = kvmem_policy_find(pols[p]) };
			kvmem_session_tap tap = { .scored = check_scored, .arg = &k };
			int n = test_rng_int(&rng, 40, 90) * 16;
			int32_t *tok = random_tokens(&rng, n, c->vocab);
			kvmem_session_stats st;
			kvmem_session_opts o;
			kvmem_backend *e;
			kvmem_session *s;
			int at = 0, selects = 0, on_device;

			assert_int_equal(kvmem_backend_open(test_backend_name(), m, &bo, &e), 0);
			on_device = e->ops->score && mode == 0;
			kvmem_session_opts_default(&o);
			o.block = 16;
			o.chunk = 32;
			o.policy = pols[p];
			o.budget = 6 * 16;
			o.host_scoring = mode == 1;
			o.tap = &tap;
			s = kvmem_session_create(e, &o);
			assert_non_null(s);
			while (at < n) {
				int len = test_rng_int(&rng, 1, 70);

				len = len < n - at ? len : n - at;
				assert_int_equal(kvmem_session_append(s, tok + at, len, 0), 0);
				at += len;
				assert_int_equal(kvmem_session_select(s), 0);
				selects++;
			}
			kvmem_session_get_stats(s, &st);
			assert_int_equal(k.calls, st.selections);
			assert_true(st.selections >= selects);
			if (on_device) {
				assert_int_equal(st.device_scored, st.selections);
				assert_true(st.index_device_bytes > 0);
			} else if (e->ops->score && mode == 2) {
				/* No room for a copy: the device reads the host's
				 * index where it is, holding only the queries and
				 * the scores. */
				assert_int_equal(st.device_scored, st.selections);
				assert_true(st.index_device_bytes <
					    (uint64_t)c->n_layers * c->n_kv_heads * c->head_dim * 4 *
					    1024);
			} else {
				assert_int_equal(st.device_scored, 0);
				assert_int_equal(st.index_device_bytes, 0);
			}
			print_message("%s %s: %lld selections, %lld on the device, max rel diff %.2e\n",
				      pols[p], mode == 0 ? "device" : mode == 1 ? "host_scoring" : "no room",
				      (long long)st.selections, (long long)st.device_scored, k.max_rel);
			kvmem_session_free(s);
			kvmem_backend_close(e);
			free(tok);
		}
	test_model_free(m);
}

static void test_session_errors(void **state)
{
	uint64_t rng = g_seed ^ 0xee;
	kvmem_model *m = small_model(&rng);
	kvmem_backend *e = test_backend(m, 16);
	kvmem_session_opts o;
	kvmem_session *s;
	int32_t tok[200] = { 0 }, out[4];

	kvmem_session_opts_default(&o);
	o.block = 24;
	assert_null(kvmem_session_create(e, &o));
	assert_non_null(strstr(kvmem_last_error(), "power of two"));
	assert_int_equal(kvmem_last_errno(), EINVAL);
	kvmem_session_opts_default(&o);
	o.chunk = 17;	/* more than the backend takes in one call */
	assert_null(kvmem_session_create(e, &o));
	assert_int_equal(kvmem_last_errno(), EINVAL);
	kvmem_session_opts_default(&o);
	o.budget = 8;
	assert_null(kvmem_session_create(e, &o));
	assert_non_null(strstr(kvmem_last_error(), "budget"));
	kvmem_session_opts_default(&o);
	o.budget = 256;
	o.chunk = 16;
	o.reserve = 4;
	assert_null(kvmem_session_create(e, &o));
	assert_non_null(strstr(kvmem_last_error(), "reserve"));
	kvmem_session_opts_default(&o);
	o.policy = "nope";
	assert_null(kvmem_session_create(e, &o));
	assert_non_null(strstr(kvmem_last_error(), "nope"));

	kvmem_session_opts_default(&o);
	o.budget = 64;
	o.block = 16;
	o.chunk = 16;
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	assert_true(kvmem_session_decode(s, 1, NULL, out) < 0);
	assert_non_null(strstr(kvmem_last_error(), "append"));
	assert_int_equal(kvmem_session_select(s), 0);	/* empty: nothing to do */
	/* Pins over the budget are refused up front and leave nothing pinned. */
	assert_true(kvmem_session_append(s, tok, 100, 1) < 0);
	assert_non_null(strstr(kvmem_last_error(), "budget"));
	assert_int_equal(kvmem_session_tokens(s), 0);
	assert_int_equal(kvmem_session_blocks(s)->n_pins, 0);
	assert_int_equal(kvmem_session_append(s, tok, 100, 0), 0);
	assert_true(kvmem_session_pin(s, 0, 65) < 0);
	assert_int_equal(kvmem_session_pin(s, 0, 64), 0);
	assert_int_equal(kvmem_session_select(s), 0);
	assert_int_equal(kvmem_session_plan(s)->view_tokens, 64);
	assert_true(kvmem_session_plan(s)->newest_dropped);
	tok[0] = 10000;	/* outside the vocabulary: the engine refuses, nothing stored */
	assert_true(kvmem_session_append(s, tok, 1, 0) < 0);
	assert_int_equal(kvmem_session_tokens(s), 100);
	tok[0] = 0;
	assert_int_equal(kvmem_session_decode(s, 4, NULL, out), 0);
	kvmem_session_free(s);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* Logits the model's arithmetic made NaN are an error, not token 0. */
static void test_nan_logits_refused(void **state)
{
	uint64_t rng = g_seed ^ 0x7a;
	kvmem_model *m = small_model(&rng);
	kvmem_backend *e;
	kvmem_session_opts o;
	kvmem_session *s;
	int32_t tok[40], out[4];

	for (int i = 0; i < 40; i++)
		tok[i] = test_rng_int(&rng, 0, m->cfg.vocab - 1);
	/* Before the backend takes its copy of the weights (a GPU's). */
	((float *)m->final_norm)[test_rng_int(&rng, 0, m->cfg.hidden - 1)] = NAN;
	e = test_backend(m, 16);
	kvmem_session_opts_default(&o);
	o.chunk = 16;
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	assert_int_equal(kvmem_session_append(s, tok, 40, 0), 0);
	assert_int_equal(kvmem_session_decode(s, 4, NULL, out), -ERANGE);
	assert_non_null(strstr(kvmem_last_error(), "NaN"));
	assert_int_equal(kvmem_session_tokens(s), 40);	/* nothing was appended */
	kvmem_session_free(s);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* ---- the text a policy is given ------------------------------------------ */
/* A policy that keeps what it was given (and scores like recency). */
static struct {
	int calls;
	int64_t n_tokens, n_text, n_q, q_pos[8];
	int32_t text[64], tokens[512];
	int had_tokens, had_text;
} g_seen;

static int seen_score(const kvmem_select_ctx *c, float *scores)
{
	g_seen.calls++;
	g_seen.n_tokens = c->n_tokens;
	g_seen.n_text = c->n_text;
	g_seen.n_q = c->n_q;
	g_seen.had_tokens = c->tokens != NULL;
	g_seen.had_text = c->text != NULL;
	for (int i = 0; i < c->n_q && i < 8; i++)
		g_seen.q_pos[i] = c->q_pos[i];
	if (c->tokens)
		memcpy(g_seen.tokens, c->tokens, sizeof(int32_t) * (c->n_tokens < 512 ? c->n_tokens : 512));
	if (c->text)
		memcpy(g_seen.text, c->text, sizeof(int32_t) * (c->n_text < 64 ? c->n_text : 64));
	for (int64_t b = 0; b < c->n_blocks; b++)
		scores[b] = (float)b;
	return 0;
}

static const kvmem_policy_ops test_seen = {
	.name = "test_seen", .what = "keeps its context (test_ws_session.c)",
	.needs = KVMEM_SUM_MEANK, .score = seen_score,
};

/* The history as the policy saw it, and the text: want[n_want]. */
static void expect_seen(const kvmem_session *s, const int32_t *want, int64_t n_want)
{
	int64_t n = kvmem_session_tokens(s);

	assert_true(g_seen.had_tokens);
	assert_int_equal(g_seen.n_tokens, n);
	assert_memory_equal(g_seen.tokens, kvmem_session_token_ids(s), sizeof(int32_t) * n);
	assert_int_equal(g_seen.n_text, n_want);
	assert_int_equal(g_seen.had_text, n_want > 0);
	if (n_want)
		assert_memory_equal(g_seen.text, want, sizeof(int32_t) * n_want);
}

/*
 * kvmem_select_ctx's text (session.h): the history's token ids, and the
 * query text: the tokens at the query positions for a selection after
 * appends and decodes (forced ones mid-append too), the tokens about to be
 * appended for a select-ahead, none for adopt's first selection.
 */
static void test_select_ctx_text(void **state)
{
	uint64_t rng = g_seed ^ 0x7e7;
	kvmem_model *m = small_model(&rng);
	kvmem_backend *e = test_backend(m, 16);
	kvmem_session_opts o;
	kvmem_page_source src;
	kvmem_session *s;
	int32_t *tok = random_tokens(&rng, 300, m->cfg.vocab), out[4];
	const int32_t *ids;
	int64_t n;

	assert_int_equal(kvmem_policy_register(&test_seen), 0);
	kvmem_session_opts_default(&o);
	o.block = 16;
	o.chunk = 16;
	o.budget = 64;
	o.query_tokens = 3;
	o.policy = "test_seen";
	o.source = &src;
	assert_int_equal(kvmem_page_source_mem(&src, m->cfg.n_layers, m->cfg.n_kv_heads,
					       m->cfg.head_dim, 16), 0);
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	/* 200 tokens through a view of 64 + reserve: forced selections. */
	assert_int_equal(kvmem_session_append(s, tok, 200, 0), 0);
	assert_true(g_seen.calls > 0);
	assert_int_equal(g_seen.n_q, 3);
	assert_int_equal(g_seen.n_text, 3);
	assert_memory_equal(g_seen.text, tok + g_seen.q_pos[0], sizeof(int32_t) * 3);
	assert_int_equal(g_seen.q_pos[2], g_seen.q_pos[0] + 2);
	assert_int_equal(kvmem_session_select(s), 0);
	expect_seen(s, tok + 197, 3);
	/* Ahead: the five tokens to come; the queries are the last three's. */
	assert_int_equal(kvmem_session_select_ahead(s, tok + 200, 5), 0);
	expect_seen(s, tok + 200, 5);
	assert_int_equal(g_seen.n_q, 3);
	assert_int_equal(g_seen.q_pos[0], 202);
	assert_int_equal(kvmem_session_append(s, tok + 200, 5, 0), 0);
	assert_int_equal(kvmem_session_decode(s, 2, NULL, out), 0);
	assert_int_equal(kvmem_session_select(s), 0);
	ids = kvmem_session_token_ids(s);
	n = kvmem_session_tokens(s);
	expect_seen(s, ids + n - 3, 3);
	memcpy(tok, ids, sizeof(int32_t) * n);
	kvmem_session_free(s);
	/* Adopted: no queries yet, no text; the history all the same. */
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	g_seen.calls = 0;
	assert_int_equal(kvmem_session_adopt(s, tok, n), 0);
	assert_int_equal(g_seen.calls, 1);
	assert_int_equal(g_seen.n_q, 0);
	expect_seen(s, NULL, 0);
	kvmem_session_free(s);
	kvmem_page_source_destroy(&src);
	free(tok);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* ---- moves inside the view ------------------------------------------------ */
/* The script's appends and greedy decodes (64 tokens at most each), then
 * a last selection: moves_run and pages_run play it the same way. */
static void play_ops(kvmem_session *s, const struct op *ops, int n_ops, int32_t *const *tok)
{
	int32_t out[64];

	for (int i = 0; i < n_ops; i++) {
		if (ops[i].kind == 0)
			assert_int_equal(kvmem_session_append(s, tok[i], ops[i].n, 0), 0);
		else if (ops[i].kind == 1)
			assert_int_equal(kvmem_session_select(s) ||
					 kvmem_session_decode(s, ops[i].n < 64 ? ops[i].n : 64, NULL, out),
					 0);
	}
	assert_int_equal(kvmem_session_select(s), 0);
}

/* One scripted session over a fresh memory source; move 0 places every
 * token that changes slots from its page (KVMEM_MOVE=0, the path before
 * moves). Greedy decoding: the tokens follow the logits. */
static void moves_run(kvmem_backend *e, const kvmem_config *c, const struct op *ops, int n_ops,
		      int32_t *const *tok, const struct run_cfg *rc, int move, struct test_logits *r,
		      kvmem_session_stats *st)
{
	kvmem_page_source src;
	kvmem_session_opts o;
	kvmem_session *s;

	assert_int_equal(kvmem_page_source_mem(&src, c->n_layers, c->n_kv_heads, c->head_dim,
					     rc->block), 0);
	kvmem_session_opts_default(&o);
	o.block = rc->block;
	o.chunk = rc->chunk;
	o.policy = rc->policy;
	o.budget = rc->budget;
	o.layout = rc->layout;
	o.source = &src;
	o.on_forward = test_logits_record;
	o.arg = r;
	if (!move)
		setenv("KVMEM_MOVE", "0", 1);
	s = kvmem_session_create(e, &o);
	unsetenv("KVMEM_MOVE");
	assert_non_null(s);
	play_ops(s, ops, n_ops, tok);
	kvmem_session_get_stats(s, st);
	kvmem_session_free(s);
	kvmem_page_source_destroy(&src);
}

/*
 * Tokens that stay in the view but change slots are moved on the backend,
 * from the raw K it keeps, instead of being placed again from their pages:
 * every forward pass's logits are the same bits either way, at small
 * budgets (many moves) on every backend, and the moves did happen.
 */
static void test_moves_equal_pages(void **state)
{
	uint64_t rng = g_seed ^ 0x6d;

	for (int k = 0; k < 4; k++) {
		kvmem_model *m = small_model(&rng);
		const kvmem_config *c = &m->cfg;
		struct run_cfg rc = { .policy = k % 2 ? "meank" : "subblock",
				      .block = 16 << test_rng_int(&rng, 0, 1),
				      .chunk = test_rng_int(&rng, 1, 24),
				      /* stable's moves are a permutation, not a shift */
				      .layout = k < 2 ? KVMEM_LAYOUT_COMPACT :
					      KVMEM_LAYOUT_STABLE };
		kvmem_backend *e = test_backend(m, rc.chunk);
		struct op ops[128];
		int32_t *tok[128];
		int64_t total;
		int n_ops = make_script(&rng, ops, 128, 10, 90, &total);
		struct test_logits a = { .vocab = c->vocab }, b = { .vocab = c->vocab };
		kvmem_session_stats sa, sb;

		rc.budget = total / 6 > 2 * rc.block ? total / 6 : 2 * rc.block;
		for (int i = 0; i < n_ops; i++)
			tok[i] = random_tokens(&rng, ops[i].n, c->vocab);
		moves_run(e, c, ops, n_ops, tok, &rc, 1, &a, &sa);
		moves_run(e, c, ops, n_ops, tok, &rc, 0, &b, &sb);
		assert_int_equal(a.n, b.n);
		assert_memory_equal(a.buf, b.buf, a.n * sizeof(float));
		assert_int_equal(sb.moved_tokens, 0);
		if (e->ops->keep_raw)
			assert_true(sa.moved_tokens > 0);
		/* The same tokens left their slots either way. */
		assert_int_equal(sa.rebuilt_tokens, sb.rebuilt_tokens);
		for (int i = 0; i < n_ops; i++)
			free(tok[i]);
		free(a.buf);
		free(b.buf);
		kvmem_backend_close(e);
		test_model_free(m);
	}
}

/* One scripted session over a new bf16 workspace in dir, committed; rows
 * 0: KVMEM_PAGE_ROWS=0 (pages made from rows on the host). Its tokens. */
static int64_t pages_run(kvmem_backend *e, const kvmem_config *c, const struct op *ops, int n_ops,
		      int32_t *const *tok, const struct run_cfg *rc, const char *dir, int rows,
		      struct test_logits *r)
{
	int64_t n;
	kvmem_workspace_opts wo = { .block = rc->block, .dtype = KVMEM_DTYPE_BF16 };
	kvmem_session_opts o;
	kvmem_workspace *w;
	kvmem_session *s;

	if (kvmem_workspace_open(dir, e->model, &wo, &w) < 0)
		fail_msg("%s", kvmem_last_error());
	kvmem_session_opts_default(&o);
	o.block = rc->block;
	o.chunk = rc->chunk;
	o.policy = rc->policy;
	o.budget = rc->budget;
	o.source = kvmem_workspace_source(w);
	o.on_forward = test_logits_record;
	o.arg = r;
	if (!rows)
		setenv("KVMEM_PAGE_ROWS", "0", 1);
	s = kvmem_session_create(e, &o);
	unsetenv("KVMEM_PAGE_ROWS");
	assert_non_null(s);
	play_ops(s, ops, n_ops, tok);
	if (kvmem_workspace_commit(w, s) < 0)
		fail_msg("%s", kvmem_last_error());
	n = kvmem_session_tokens(s);
	kvmem_session_free(s);
	assert_int_equal(kvmem_workspace_close(w), 0);
	return n;
}

/* Every page of two committed workspaces of n tokens: the same tokens. */
static void pages_equal(const char *a, const char *b, const kvmem_model *m, int B, int64_t n)
{
	kvmem_workspace_opts wo = { .block = B, .dtype = KVMEM_DTYPE_BF16 };
	const kvmem_config *c = &m->cfg;
	kvmem_workspace *w[2];
	const kvmem_page_source *src[2];

	for (int i = 0; i < 2; i++) {
		if (kvmem_workspace_open(i ? b : a, m, &wo, &w[i]) < 0)
			fail_msg("%s", kvmem_last_error());
		src[i] = kvmem_workspace_source(w[i]);
	}
	for (int64_t blk = 0; blk * B < n; blk++)
		for (int l = 0; l < c->n_layers; l++) {
			const int len = n - blk * B < B ? (int)(n - blk * B) : B;
			kvmem_page pg[2];

			for (int i = 0; i < 2; i++)
				assert_int_equal(src[i]->ops->get(src[i]->ctx, blk, l, &pg[i]), 0);
			for (int h = 0; h < c->n_kv_heads; h++) {
				const size_t o = (size_t)h * B * c->head_dim * 2, len_b = (size_t)len * c->head_dim * 2;

				if (memcmp((const char *)pg[0].k + o, (const char *)pg[1].k + o, len_b) ||
				    memcmp((const char *)pg[0].v + o, (const char *)pg[1].v + o, len_b))
					fail_msg("block %lld layer %d head %d: the pages differ", (long long)blk,
						 l, h);
			}
			for (int i = 0; i < 2; i++)
				src[i]->ops->put(src[i]->ctx, blk, l);
		}
	for (int i = 0; i < 2; i++)
		assert_int_equal(kvmem_workspace_close(w[i]), 0);
}

/*
 * Pages the backend writes itself (kvmem_fwd_out.pages: on cuda, each
 * layer laid out as pages on the device and copied into the pinned pool
 * slots) against pages made from its rows on the host (KVMEM_PAGE_ROWS=0):
 * a scripted session over a bf16 workspace, chunks that start and end
 * inside blocks, a budget that makes steps read pages back; every logit
 * the same bits, every page the same, both workspaces verify (the
 * checksums were taken of what the GPU wrote). The cpu backend writes rows
 * either way: there the check holds trivially.
 */
static void test_pages_equal_rows(void **state)
{
	uint64_t rng = g_seed ^ 0x9a;
	char tmp[256], a_dir[300], b_dir[300];

	assert_int_equal(test_tmpdir_make(tmp, sizeof(tmp), "ws-pages"), 0);
	for (int k = 0; k < 3; k++) {
		kvmem_model *m = small_model(&rng);
		const kvmem_config *c = &m->cfg;
		struct run_cfg rc = { .policy = k % 2 ? "meank" : "subblock", .block = 16,
				      .chunk = test_rng_int(&rng, 16, 56) };
		kvmem_backend *e = test_backend(m, rc.chunk);
		struct op ops[128];
		int32_t *tok[128];
		int64_t total;
		int n_ops = make_script(&rng, ops, 128, 8, 120, &total);
		struct test_logits a = { .vocab = c->vocab }, b = { .vocab = c->vocab };
		int64_t na, nb;

		rc.budget = total / 4 > 2 * rc.block ? total / 4 : 2 * rc.block;
		for (int i = 0; i < n_ops; i++)
			tok[i] = random_tokens(&rng, ops[i].n, c->vocab);
		snprintf(a_dir, sizeof(a_dir), "%s/pages%d", tmp, k);
		snprintf(b_dir, sizeof(b_dir), "%s/rows%d", tmp, k);
		na = pages_run(e, c, ops, n_ops, tok, &rc, a_dir, 1, &a);
		nb = pages_run(e, c, ops, n_ops, tok, &rc, b_dir, 0, &b);
		assert_int_equal(a.n, b.n);
		assert_memory_equal(a.buf, b.buf, a.n * sizeof(float));
		assert_int_equal(na, nb);
		pages_equal(a_dir, b_dir, m, rc.block, na);
		assert_int_equal(kvmem_workspace_verify(a_dir, NULL, 0), 0);
		assert_int_equal(kvmem_workspace_verify(b_dir, NULL, 0), 0);
		for (int i = 0; i < n_ops; i++)
			free(tok[i]);
		free(a.buf);
		free(b.buf);
		kvmem_backend_close(e);
		test_model_free(m);
	}
	test_tmpdir_remove(tmp);
}

/* The backend's reserve, counting the calls that grow a view. */
static const kvmem_backend_ops *g_inner;
static int g_grows;

static int counting_reserve(void *ctx, kvmem_view *v, int64_t slots)
{
	if (slots > g_inner->capacity(ctx, v))
		g_grows++;
	return g_inner->reserve(ctx, v, slots);
}

/*
 * An append of many chunks makes room for all of them at once: the view
 * grows once (it used to double chunk by chunk, each growth a device
 * allocation and a copy of the view), and no further when the budget
 * bounds it; the logits are those of the append made chunk by chunk.
 */
static void test_append_reserves_once(void **state)
{
	uint64_t rng = g_seed ^ 0x2e;
	kvmem_model *m = small_model(&rng);
	const kvmem_config *c = &m->cfg;
	kvmem_backend *e = test_backend(m, 32);
	kvmem_backend_ops ops = *e->ops;
	const int n = test_rng_int(&rng, 12, 30) * 32 + test_rng_int(&rng, 0, 31);
	int32_t *tok = random_tokens(&rng, n, c->vocab);
	kvmem_session_opts o;
	kvmem_session *s;
	struct test_logits a = { .vocab = c->vocab }, b = { .vocab = c->vocab };

	g_inner = e->ops;
	ops.reserve = counting_reserve;
	e->ops = &ops;
	kvmem_session_opts_default(&o);
	o.block = 16;
	o.chunk = 32;
	o.on_forward = test_logits_record;
	o.arg = &a;
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	g_grows = 0;
	assert_int_equal(kvmem_session_append(s, tok, n, 0), 0);
	assert_int_equal(g_grows, 1);
	kvmem_session_free(s);
	/* The same tokens a chunk per call: the same logits. */
	o.arg = &b;
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	g_grows = 0;
	for (int i = 0; i < n; i += 32)
		assert_int_equal(kvmem_session_append(s, tok + i, n - i < 32 ? n - i : 32, 0), 0);
	assert_true(g_grows > 1);	/* the test's premise: growing in steps */
	kvmem_session_free(s);
	assert_int_equal(a.n, b.n);
	assert_memory_equal(a.buf, b.buf, a.n * sizeof(float));
	e->ops = g_inner;
	free(a.buf);
	free(b.buf);
	free(tok);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* One of the shared-pool test's sessions: its workspace and its logits. */
struct conv {
	kvmem_workspace *w;
	kvmem_session *s;
	struct test_logits r;
	int32_t *tok;
};

static void conv_open(struct conv *v, kvmem_backend *e, const char *dir, kvmem_pager_pool *pool,
		      int B)
{
	kvmem_workspace_opts wo = { .block = B, .dtype = KVMEM_DTYPE_BF16, .pool = pool };
	kvmem_session_opts o;

	if (kvmem_workspace_open(dir, e->model, &wo, &v->w) < 0)
		fail_msg("%s", kvmem_last_error());
	kvmem_session_opts_default(&o);
	o.block = B;
	o.chunk = 32;
	o.budget = 6 * B;
	o.sink = 0;
	o.recent = B;
	o.policy = "random";	/* blocks enter everywhere: pages come back */
	o.source = kvmem_workspace_source(v->w);
	o.on_forward = test_logits_record;
	o.arg = &v->r;
	v->s = kvmem_session_create(e, &o);
	assert_non_null(v->s);
}

/* Conversation v's part of round i (0: its long first append). */
static void conv_round(struct conv *v, int i, int n0)
{
	int32_t out[2];

	if (!i) {
		assert_int_equal(kvmem_session_append(v->s, v->tok, n0, 0), 0);
		return;
	}
	assert_int_equal(kvmem_session_append(v->s, v->tok + n0 + 8 * (i - 1), 8, 0), 0);
	assert_int_equal(kvmem_session_select(v->s), 0);
	assert_int_equal(kvmem_session_decode(v->s, 2, NULL, out), 0);
}

static void conv_close(struct conv *v)
{
	kvmem_session_free(v->s);
	assert_int_equal(kvmem_workspace_close(v->w), 0);
}

/*
 * Two conversations over workspaces sharing one host pool, as kvmem serve's
 * do, their rounds interleaved: each one's logits are the bits of the same
 * conversation alone over a pool of its own. Their block numbers overlap
 * (both start at 0): a backend that kept pages of the shared region by
 * block alone would hand one the other's. On a backend with a device page
 * pool (cuda), pages that come back into a shared view are served from it
 * (before, a shared region's pages were never kept there: every follow-up
 * read its pages from host memory again).
 */
static void test_shared_pool_owners(void **state)
{
	uint64_t rng = g_seed ^ 0x5a;
	kvmem_model *m = small_model(&rng);
	const kvmem_config *c = &m->cfg;
	const int B = 16, n0 = 24 * B, rounds = 8;
	kvmem_backend *e = test_backend(m, 32);
	kvmem_workspace_opts wo = { .block = B, .dtype = KVMEM_DTYPE_BF16 };
	kvmem_page_geom g;
	kvmem_pager_pool *pool;
	kvmem_workspace *probe;
	kvmem_place_stats p0 = { 0 }, p1 = { 0 };
	struct conv sh[2], alone[2];
	char tmp[256], dir[300];

	assert_int_equal(test_tmpdir_make(tmp, sizeof(tmp), "ws-shared"), 0);
	snprintf(dir, sizeof(dir), "%s/probe", tmp);
	if (kvmem_workspace_open(dir, m, &wo, &probe) < 0)
		fail_msg("%s", kvmem_last_error());
	g = *kvmem_pager_geom(kvmem_workspace_pager(probe));
	assert_int_equal(kvmem_workspace_close(probe), 0);
	/* Room for both conversations' pages, twice over (blocks being made
	 * take at most half of a pool). */
	assert_int_equal(kvmem_pager_pool_create(&g, (uint64_t)4 * (n0 / B + rounds + 4) *
					       c->n_layers * kvmem_page_stride(&g), -1, &pool), 0);
	memset(sh, 0, sizeof(sh));
	memset(alone, 0, sizeof(alone));
	for (int k = 0; k < 2; k++) {
		sh[k].tok = alone[k].tok = random_tokens(&rng, n0 + 8 * rounds, c->vocab);
		sh[k].r.vocab = alone[k].r.vocab = c->vocab;
	}
	if (e->ops->place_stats)
		e->ops->place_stats(e->ctx, &p0);
	for (int k = 0; k < 2; k++) {
		snprintf(dir, sizeof(dir), "%s/shared%d", tmp, k);
		conv_open(&sh[k], e, dir, pool, B);
	}
	for (int i = 0; i <= rounds; i++)
		for (int k = 0; k < 2; k++)
			conv_round(&sh[k], i, n0);
	if (e->ops->place_stats)
		e->ops->place_stats(e->ctx, &p1);
	for (int k = 0; k < 2; k++)
		conv_close(&sh[k]);
	for (int k = 0; k < 2; k++) {	/* each alone, over a pool of its own */
		snprintf(dir, sizeof(dir), "%s/alone%d", tmp, k);
		conv_open(&alone[k], e, dir, NULL, B);
		for (int i = 0; i <= rounds; i++)
			conv_round(&alone[k], i, n0);
		conv_close(&alone[k]);
		assert_int_equal(sh[k].r.n, alone[k].r.n);
		assert_memory_equal(sh[k].r.buf, alone[k].r.buf, sh[k].r.n * sizeof(float));
	}
	print_message("shared pool, %d rounds of 2 conversations: %llu items placed, %llu from "
		      "the device page pool, %.1f MB of pages read from host memory\n", rounds,
		      (unsigned long long)(p1.items - p0.items),
		      (unsigned long long)(p1.pool_hits - p0.pool_hits),
		      (double)(p1.bytes_in - p0.bytes_in) / 1e6);
	if (e->ops->page_cached && p1.pool_cap)
		assert_true(p1.pool_hits > p0.pool_hits);
	for (int k = 0; k < 2; k++) {
		free(sh[k].tok);
		free(sh[k].r.buf);
		free(alone[k].r.buf);
	}
	assert_int_equal(kvmem_pager_pool_free(pool), 0);
	test_tmpdir_remove(tmp);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* One of test_interleaved_chunks' sessions: in host memory, meank (so the
 * index's summaries choose what a step places). */
static kvmem_session *chunked_session(kvmem_backend *e, struct test_logits *r, int B)
{
	kvmem_session_opts o;
	kvmem_session *s;

	kvmem_session_opts_default(&o);
	o.block = B;
	o.chunk = 2 * B;
	o.budget = 6 * B;
	o.sink = 0;
	o.recent = B;
	o.policy = "meank";
	o.on_forward = test_logits_record;
	o.arg = r;
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	return s;
}

/*
 * Two sessions on one backend, their prefill chunks interleaved (as kvmem
 * bench batch and a server's conversations run): each gets the logits it
 * gets alone, bit for bit, selections included. A backend that makes the
 * index's summaries itself (cuda) keeps one running state: a chunk whose
 * session last ran there but whose state another's chunk replaced must go
 * fresh (the host's state up), not fail ("continue no summaries kept
 * here", seen at 16 sessions of bench batch on the H200).
 */
static void test_interleaved_chunks(void **state)
{
	uint64_t rng = g_seed ^ 0x1c;
	kvmem_model *m = small_model(&rng);
	const kvmem_config *c = &m->cfg;
	const int B = 16, parts = 6, n = parts * 2 * B;
	kvmem_backend *e = test_backend(m, 2 * B);
	struct test_logits both[2], alone[2];
	kvmem_session *s[2];
	int32_t *tok[2], out[2];

	(void)state;
	memset(both, 0, sizeof(both));
	memset(alone, 0, sizeof(alone));
	for (int k = 0; k < 2; k++) {
		tok[k] = random_tokens(&rng, n, c->vocab);
		both[k].vocab = alone[k].vocab = c->vocab;
		s[k] = chunked_session(e, &both[k], B);
	}
	for (int i = 0; i < parts; i++)
		for (int k = 0; k < 2; k++) {
			if (kvmem_session_append(s[k], tok[k] + i * 2 * B, 2 * B, 0) < 0)
				fail_msg("session %d, part %d: %s", k, i, kvmem_last_error());
			if (i == parts / 2)	/* a step between: the index chooses */
				assert_int_equal(kvmem_session_select(s[k]), 0);
		}
	for (int k = 0; k < 2; k++) {
		assert_int_equal(kvmem_session_select(s[k]), 0);
		assert_int_equal(kvmem_session_decode(s[k], 2, NULL, out), 0);
		kvmem_session_free(s[k]);
	}
	for (int k = 0; k < 2; k++) {
		kvmem_session *a = chunked_session(e, &alone[k], B);

		for (int i = 0; i < parts; i++) {
			assert_int_equal(kvmem_session_append(a, tok[k] + i * 2 * B, 2 * B, 0), 0);
			if (i == parts / 2)
				assert_int_equal(kvmem_session_select(a), 0);
		}
		assert_int_equal(kvmem_session_select(a), 0);
		assert_int_equal(kvmem_session_decode(a, 2, NULL, out), 0);
		kvmem_session_free(a);
		assert_int_equal(both[k].n, alone[k].n);
		assert_memory_equal(both[k].buf, alone[k].buf, both[k].n * sizeof(float));
		free(both[k].buf);
		free(alone[k].buf);
		free(tok[k]);
	}
	kvmem_backend_close(e);
	test_model_free(m);
}

/*
 * What a step reads from the page source is the pages of the blocks that
 * entered the view, whatever else shifted: a step entering N blocks gets at
 * most N * n_layers pages (kvmem_session_stats.source_pages), though most
 * of the view changes slots when an early block enters.
 */
static void test_step_reads_what_entered(void **state)
{
	uint64_t rng = g_seed ^ 0x7e;
	kvmem_model *m = small_model(&rng);
	const kvmem_config *c = &m->cfg;
	const int B = 16, n = 40 * B;
	kvmem_backend *e = test_backend(m, 32);
	kvmem_page_source src;
	kvmem_session_opts o;
	int32_t *tok = random_tokens(&rng, n + 64, c->vocab), out[4];
	int64_t entered = 0, moved = 0;
	kvmem_session *s;

	kvmem_page_source_mem(&src, c->n_layers, c->n_kv_heads, c->head_dim, B);
	kvmem_session_opts_default(&o);
	o.block = B;
	o.chunk = 32;
	o.budget = 10 * B;
	o.sink = 0;
	o.recent = B;
	o.policy = "random";	/* every step a new choice: blocks enter everywhere */
	o.source = &src;
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	assert_int_equal(kvmem_session_append(s, tok, n, 0), 0);
	assert_int_equal(kvmem_session_select(s), 0);
	for (int step = 0; step < 8; step++) {
		kvmem_session_stats a, b;
		const kvmem_plan *p;

		/* A question (new tokens in the tail), then the step. */
		assert_int_equal(kvmem_session_append(s, tok + n + 8 * step, 8, 0), 0);
		kvmem_session_get_stats(s, &a);
		assert_int_equal(kvmem_session_select(s), 0);
		kvmem_session_get_stats(s, &b);
		p = kvmem_session_plan(s);
		assert_int_equal(p->n_sets, 1);
		assert_true(b.source_pages - a.source_pages <= p->entering * c->n_layers);
		entered += p->entering;
		moved += b.moved_tokens - a.moved_tokens;
		assert_int_equal(kvmem_session_decode(s, 1, NULL, out), 0);
	}
	/* Blocks did enter and tokens did shift, so the bound said something. */
	assert_true(entered > 0);
	assert_true(moved > 0);
	check_view(s, &src, c);
	kvmem_session_free(s);
	kvmem_page_source_destroy(&src);
	free(tok);
	kvmem_backend_close(e);
	test_model_free(m);
}

/*
 * The stable layout, exactness: with a budget that holds the workspace no
 * block ever leaves, so stable lays out the identity view too, and every
 * forward pass's logits are the full-context twin's bits (as compact's
 * are: test_exact_every_policy), for every policy, block and chunk.
 */
static void test_stable_exact(void **state)
{
	static const int chunks[] = { 1, 3, 8, 17, 32, 64 };
	uint64_t rng = g_seed ^ 0x57ab1e;

	(void)state;
	for (int p = 0; kvmem_policy_at(p); p++)
		for (int bi = 0; bi < 3; bi++) {
			struct run_cfg rc = {
				.policy = POLICY(p), .block = 16 << bi,
				.chunk = chunks[test_rng_int(&rng, 0, 5)], .all_logits = 1,
				.layout = KVMEM_LAYOUT_STABLE,
				.budget = -1 - test_rng_int(&rng, 0, 1) *
					       test_rng_int(&rng, 0, 300),
				.steps = 6, .max_append = 56, .check_every = bi == 0,
			};
			struct run_out ro;

			run_session(&rng, &rc, &ro);
			if (ro.mismatches)
				fail_msg("stable, policy %s block %d chunk %d: %lld of %lld "
					 "forward passes differ from full context (max |diff| "
					 "%g)", rc.policy, rc.block, rc.chunk,
					 (long long)ro.mismatches, (long long)ro.calls,
					 ro.max_diff);
			assert_true(ro.calls > 8);
		}
}

/* The stable layout at a tenth of the workspace: after every op the view
 * tiles its slots with no hole, every slot's K is raw K rotated at that
 * slot, V copied, pins in (check_view), for every policy. */
static void test_stable_small_budget(void **state)
{
	uint64_t rng = g_seed ^ 0x5b5b;

	(void)state;
	for (int p = 0; kvmem_policy_at(p); p++) {
		struct run_cfg rc = {
			.policy = POLICY(p), .block = 16 << test_rng_int(&rng, 0, 2),
			.chunk = test_rng_int(&rng, 1, 40), .rebuild_all = p % 2,
			.layout = KVMEM_LAYOUT_STABLE, .budget_div = 10, .steps = 8,
			.max_append = 90, .check_every = 1,
		};
		struct run_out ro;

		run_session(&rng, &rc, &ro);
		assert_true(ro.budget == 2 * rc.block || ro.tokens >= 10 * ro.budget);
	}
}

/* Token-layers moved inside the view over 8 follow-up steps (a short
 * question, a selection, one decoded token) at a quarter of the history,
 * with blocks entering everywhere (random policy); the view checked after. */
static int64_t followups_moved(kvmem_backend *e, const kvmem_config *c, const int32_t *tok, int n,
			       int B, int layout)
{
	kvmem_page_source src;
	kvmem_session_opts o;
	kvmem_session_stats a, b;
	kvmem_session *s;
	int32_t out[1];

	kvmem_page_source_mem(&src, c->n_layers, c->n_kv_heads, c->head_dim, B);
	kvmem_session_opts_default(&o);
	o.block = B;
	o.chunk = 32;
	o.budget = n / 4;
	o.policy = "random";
	o.layout = layout;
	o.source = &src;
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	assert_int_equal(kvmem_session_append(s, tok, n, 0), 0);
	assert_int_equal(kvmem_session_select(s), 0);
	kvmem_session_get_stats(s, &a);
	for (int step = 0; step < 8; step++) {
		assert_int_equal(kvmem_session_append(s, tok + n + 8 * step, 8, 0), 0);
		assert_int_equal(kvmem_session_select(s), 0);
		assert_int_equal(kvmem_session_decode(s, 1, NULL, out), 0);
	}
	kvmem_session_get_stats(s, &b);
	check_view(s, &src, c);
	kvmem_session_free(s);
	kvmem_page_source_destroy(&src);
	return b.moved_tokens - a.moved_tokens;
}

/* What the stable layout is for: the same follow-up steps move fewer
 * tokens inside the view (kvmem_session_stats.moved_tokens) than compact. */
static void test_stable_moves_less(void **state)
{
	uint64_t rng = g_seed ^ 0x3e;
	kvmem_model *m = small_model(&rng);
	const kvmem_config *c = &m->cfg;
	const int B = 16, n = 120 * B;
	kvmem_backend *e = test_backend(m, 32);
	int32_t *tok = random_tokens(&rng, n + 64, c->vocab);
	int64_t compact, stable;

	(void)state;
	if (!e->ops->keep_raw) {	/* no moves on this backend: nothing to count */
		kvmem_backend_close(e);
		test_model_free(m);
		free(tok);
		skip();
	}
	compact = followups_moved(e, c, tok, n, B, KVMEM_LAYOUT_COMPACT);
	stable = followups_moved(e, c, tok, n, B, KVMEM_LAYOUT_STABLE);
	print_message("moved token-layers over 8 follow-ups: compact %lld, stable %lld\n",
		      (long long)compact, (long long)stable);
	assert_true(compact > 0);
	assert_true(2 * stable < compact);
	free(tok);
	kvmem_backend_close(e);
	test_model_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exact_every_policy),
		cmocka_unit_test(test_exact_chunk_extremes),
		cmocka_unit_test(test_raw_k_rotates_to_engine_k),
		cmocka_unit_test(test_small_budget_properties),
		cmocka_unit_test(test_long_generation),
		cmocka_unit_test(test_adopt_resumes),
		cmocka_unit_test(test_hints_follow_selection),
		cmocka_unit_test(test_device_scores_match_host),
		cmocka_unit_test(test_session_errors),
		cmocka_unit_test(test_nan_logits_refused),
		cmocka_unit_test(test_select_ctx_text),
		cmocka_unit_test(test_moves_equal_pages),
		cmocka_unit_test(test_step_reads_what_entered),
		cmocka_unit_test(test_pages_equal_rows),
		cmocka_unit_test(test_shared_pool_owners),
		cmocka_unit_test(test_append_reserves_once),
		cmocka_unit_test(test_interleaved_chunks),
		cmocka_unit_test(test_stable_exact),
		cmocka_unit_test(test_stable_small_budget),
		cmocka_unit_test(test_stable_moves_less),
	};

	g_seed = test_rng_fresh_seed("test_ws_session");
	if (getenv("KVMEM_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KVMEM_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}

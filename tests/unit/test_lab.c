// SPDX-License-Identifier: MIT
/*
 * The policy lab: a session recorded over a workspace and replayed offline
 * with its own policy, budget and block size selects exactly what the live
 * session selected (plans and scores bit for bit, for every policy,
 * including one this file registers); the replayed view reads are the
 * recorded ones; replays are deterministic; a corrupt or truncated trace is
 * refused with -EBADMSG naming it; a trace of another model or workspace
 * with -ESTALE; the simulated pool is kvmem_repl_simulate's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "kvmem/kvmem.h"
#include "kvmem/lab.h"
#include "kvmem/store.h"
#include "session/inspect.h"
#include "lab/lab_int.h"
#include "pager_fixture.h"

static uint64_t g_seed;

/* ---- a policy of this file: the oldest blocks first ------------------------ */
static int oldest_score(const kvmem_select_ctx *c, float *scores)
{
	for (int64_t b = 0; b < c->n_blocks; b++)
		scores[b] = (float)(c->n_blocks - b);
	return 0;
}

static const kvmem_policy_ops test_oldest = {
	.name = "test_oldest",
	.what = "the oldest blocks first (tests/unit/test_lab.c)",
	.needs = KVMEM_SUM_MEANK,
	.score = oldest_score,
};

/* ---- a live session, logged ---------------------------------------------- */
struct live {
	kvmem_session *s;
	int64_t n;
	int64_t *blocks[256];	/* per selection: [n_sets][n_view] */
	float *scores[256];	/* per selection: [n_sets][n_blocks] */
	size_t n_blocks[256], n_scores[256];
};

static void log_select(void *arg, const kvmem_plan *p, int forced)
{
	struct live *lv = arg;
	int sets;
	int64_t nb;
	const float *sc = kvmem_session_scores(lv->s, &sets, &nb);
	size_t nv = (size_t)p->n_sets * p->n_view;

	(void)forced;
	assert_true(lv->n < 256);
	lv->blocks[lv->n] = malloc((nv ? nv : 1) * sizeof(int64_t));
	memcpy(lv->blocks[lv->n], p->blocks, nv * sizeof(int64_t));
	lv->n_blocks[lv->n] = nv;
	lv->scores[lv->n] = malloc((size_t)sets * nb * sizeof(float));
	memcpy(lv->scores[lv->n], sc, (size_t)sets * nb * sizeof(float));
	lv->n_scores[lv->n] = (size_t)sets * nb;
	lv->n++;
}

static void live_free(struct live *lv)
{
	for (int64_t i = 0; i < lv->n; i++) {
		free(lv->blocks[i]);
		free(lv->scores[i]);
	}
	lv->n = 0;
}

struct rec_cfg {
	const char *policy;
	int block;
	int64_t budget;
	int query_tokens;
	int steps;
	uint64_t seed;
};

/*
 * A recorded session over a new workspace in dir: a pinned prompt, then per
 * step random text, a question selected ahead (its needle annotated) and a
 * few decoded tokens, committed. Every selection logged into lv.
 */
static void record(kvmem_model *m, kvmem_backend *e, const char *dir, const char *trace,
		   const struct rec_cfg *rc, struct live *lv)
{
	kvmem_workspace_opts wo = { .block = rc->block, .host_cap = 1 << 20 };
	kvmem_workspace *w;
	kvmem_lab_recorder *r;
	kvmem_session_opts o;
	uint64_t rng = rc->seed;
	int32_t ids[256];

	assert_int_equal(kvmem_workspace_open(dir, m, &wo, &w), 0);
	assert_int_equal(kvmem_lab_record_open(trace, m, &(kvmem_lab_record_opts){
			 .label = "test_lab", .pager = kvmem_workspace_pager(w) }, &r), 0);
	kvmem_session_opts_default(&o);
	o.block = rc->block;
	o.budget = rc->budget;
	o.chunk = 16;
	o.query_tokens = rc->query_tokens;
	o.policy = rc->policy;
	o.seed = rc->seed;
	o.source = kvmem_workspace_source(w);
	o.on_select = log_select;
	o.arg = lv;
	assert_int_equal(kvmem_lab_record_attach(r, &o), 0);
	lv->s = kvmem_session_create(e, &o);
	if (!lv->s)
		fail_msg("session: %s", kvmem_last_error());
	for (int i = 0; i < 12; i++)
		ids[i] = (int32_t)(test_rng_next(&rng) % m->cfg.vocab);
	assert_int_equal(kvmem_session_append(lv->s, ids, 12, 1), 0);
	for (int step = 0; step < rc->steps; step++) {
		int n = test_rng_int(&rng, 20, 90), nq = test_rng_int(&rng, 2, 6);
		int64_t at = kvmem_session_tokens(lv->s);
		int64_t ns = at + test_rng_int(&rng, 0, n / 2), ne = ns + test_rng_int(&rng, 3, 10);
		int32_t out[8];

		for (int i = 0; i < n + nq; i++)
			ids[i] = (int32_t)(test_rng_next(&rng) % m->cfg.vocab);
		assert_int_equal(kvmem_session_append(lv->s, ids, n, 0), 0);
		assert_int_equal(kvmem_lab_record_span(r, KVMEM_LAB_SPAN_NEEDLE, ns, ne, "needle"), 0);
		assert_int_equal(kvmem_lab_record_span(r, KVMEM_LAB_SPAN_QUERY, at + n, at + n + nq - 1,
						       NULL), 0);
		if (kvmem_session_select_ahead(lv->s, ids + n, nq))
			fail_msg("select ahead: %s", kvmem_last_error());
		assert_int_equal(kvmem_session_append(lv->s, ids + n, nq, 0), 0);
		assert_int_equal(kvmem_session_decode(lv->s, test_rng_int(&rng, 1, 8), NULL, out), 0);
		assert_true(kvmem_workspace_commit(w, lv->s) >= 0);
	}
	kvmem_session_free(lv->s);
	lv->s = NULL;
	assert_int_equal(kvmem_workspace_close(w), 0);
	if (kvmem_lab_record_close(r))
		fail_msg("record close: %s", kvmem_last_error());
}

static kvmem_model *model(uint64_t *rng)
{
	kvmem_config c = test_model_config(2, 64, 4, 2, 16, 96, 97, test_rng_int(rng, 0, 1));

	return test_model_random(&c, test_rng_next(rng));
}

/* Replay with the live parameters: the live plans and scores, bit for bit. */
static void check_equal_live(kvmem_lab *lab, const struct live *lv)
{
	kvmem_lab_params p;
	kvmem_lab_result r, r2;
	int64_t needles = 0;

	kvmem_lab_params_default(&p);
	p.keep_plans = 1;
	if (kvmem_lab_replay(lab, &p, &r))
		fail_msg("replay: %s", kvmem_last_error());
	assert_int_equal(r.n_steps, lv->n);
	assert_int_equal(r.live_compared, lv->n);
	assert_int_equal(r.live_equal, lv->n);
	assert_int_equal(r.first_diff, -1);
	for (int64_t k = 0; k < r.n_steps; k++) {
		const kvmem_lab_step *st = &r.steps[k];
		int64_t view = 0;

		assert_int_equal((size_t)st->n_sets * st->n_view, lv->n_blocks[k]);
		assert_memory_equal(st->blocks, lv->blocks[k], lv->n_blocks[k] * sizeof(int64_t));
		assert_int_equal((size_t)st->n_sets * st->n_blocks, lv->n_scores[k]);
		assert_memory_equal(st->scores, lv->scores[k], lv->n_scores[k] * sizeof(float));
		/* The view's page reads are the ones the session made. */
		for (int t = 0; t < KVMEM_LAB_TIERS; t++)
			view += st->pages[KVMEM_LAB_VIEW][t];
		{
			const struct lab_sel *s = &lab->t.sel[k];
			int64_t live_view = 0, live_score = 0, score = 0;

			for (uint32_t i = 0; i < s->h.n_runs; i++)
				if (s->runs[i].why == KVMEM_LAB_VIEW)
					live_view += s->runs[i].count;
				else
					live_score += s->runs[i].count;
			for (int t = 0; t < KVMEM_LAB_TIERS; t++)
				score += st->pages[KVMEM_LAB_SCORE][t];
			if (view != live_view || score != live_score)
				fail_msg("step %lld: replayed %lld view and %lld score reads, recorded "
					 "%lld and %lld", (long long)k, (long long)view, (long long)score,
					 (long long)live_view, (long long)live_score);
		}
		assert_true(st->needle_in_view <= 1);
		needles += st->needle_in_view >= 0;
		assert_true(st->overlap >= 0 && st->overlap <= 1 + 1e-12);
		/* The oracle's plan holds the most mass a plan can at the budget. */
		assert_true(st->mass >= 0 && st->mass <= st->oracle_mass + 1e-6);
	}
	assert_int_equal(needles, r.needles);
	assert_true(needles > 0);
	/* Deterministic: the same numbers again. */
	assert_int_equal(kvmem_lab_replay(lab, &p, &r2), 0);
	assert_int_equal(r2.n_steps, r.n_steps);
	for (int64_t k = 0; k < r.n_steps; k++) {
		kvmem_lab_step a = r.steps[k], b = r2.steps[k];

		assert_memory_equal(a.scores, b.scores, lv->n_scores[k] * sizeof(float));
		a.blocks = b.blocks = NULL;
		a.scores = b.scores = NULL;
		a.top = b.top = NULL;
		assert_memory_equal(&a, &b, sizeof(a));
	}
	assert_int_equal(r.hits, r.pages[0][KVMEM_LAB_HOST] + r.pages[1][KVMEM_LAB_HOST]);
	assert_int_equal(r.misses, r.pages[0][KVMEM_LAB_NVME] + r.pages[1][KVMEM_LAB_NVME]);
	kvmem_lab_result_free(&r);
	kvmem_lab_result_free(&r2);
}

/*
 * Every policy, the test's own included, recorded live and replayed: the
 * same plans and scores. Then the lab's other dimensions run: another
 * block size, budget, pool and replacement policy.
 */
static void test_replay_equals_live(void **state)
{
	uint64_t rng = g_seed;
	kvmem_model *m = model(&rng);
	kvmem_backend *e = kvmem_backend_cpu(m, 16);
	const kvmem_policy_ops *pol;
	char dir[256], ws[300], trace[300];

	assert_non_null(e);
	for (int i = 0; (pol = kvmem_policy_at(i)); i++) {
		struct rec_cfg rc = { .policy = pol->name, .block = 16 << test_rng_int(&rng, 0, 1),
				      .budget = 64 * test_rng_int(&rng, 1, 2),
				      .query_tokens = test_rng_int(&rng, 1, 4), .steps = 6,
				      .seed = test_rng_next(&rng) };
		struct live lv = { 0 };
		kvmem_lab *lab;

		assert_non_null(fx_tmpdir(dir, sizeof(dir)));
		snprintf(ws, sizeof(ws), "%s/ws", dir);
		snprintf(trace, sizeof(trace), "%s/trace", dir);
		print_message("policy %s, block %d, budget %lld\n", pol->name, rc.block,
			      (long long)rc.budget);
		record(m, e, ws, trace, &rc, &lv);
		if (kvmem_lab_open(ws, trace, &lab))
			fail_msg("lab open: %s", kvmem_last_error());
		/* each question's (select ahead), and those the view forced when
		 * it filled: none when the random appends never overfill it (seed
		 * 12175395094459062076, infllm: 6 of 6 steps) */
		assert_true(lv.n >= rc.steps);
		assert_int_equal(kvmem_lab_info(lab)->steps, lv.n);
		assert_string_equal(kvmem_lab_info(lab)->policy, pol->name);
		check_equal_live(lab, &lv);
		{
			kvmem_lab_params p;
			kvmem_lab_result r;

			kvmem_lab_params_default(&p);
			p.block = rc.block == 16 ? 64 : 16;
			p.budget = 128;
			p.policy = "meank";
			p.cache_policy = "lfu";
			p.host_cap = 64 << 10;
			p.bw = (kvmem_lab_bw){ 1e9, 2e9, 4e9 };
			if (kvmem_lab_replay(lab, &p, &r))
				fail_msg("replay: %s", kvmem_last_error());
			assert_int_equal(r.live_compared, 0);
			assert_int_equal(r.block, p.block);
			assert_true(r.time_s > 0);
			assert_true(r.needles > 0 && r.needle_in_view >= 0 && r.needle_in_view <= 1);
			kvmem_lab_result_free(&r);
		}
		kvmem_lab_close(lab);
		live_free(&lv);
		fx_rmtree(dir);
	}
	kvmem_backend_close(e);
	test_model_free(m);
}

/* The policy this file registered is a policy like any other, and the
 * planner takes the blocks it prefers. */
static void test_policy_from_test_file(void **state)
{
	uint64_t rng = g_seed ^ 11;
	kvmem_model *m = model(&rng);
	kvmem_backend *e = kvmem_backend_cpu(m, 16);
	char dir[256], ws[300], trace[300];
	struct rec_cfg rc = { .policy = "meank", .block = 16, .budget = 64, .steps = 5,
			      .seed = test_rng_next(&rng) };
	struct live lv = { 0 };
	kvmem_lab_params p;
	kvmem_lab_result r;
	kvmem_lab *lab;

	assert_int_equal(kvmem_policy_register(&test_oldest), -EEXIST);
	assert_ptr_equal(kvmem_policy_find("test_oldest"), &test_oldest);
	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	snprintf(ws, sizeof(ws), "%s/ws", dir);
	snprintf(trace, sizeof(trace), "%s/trace", dir);
	record(m, e, ws, trace, &rc, &lv);
	assert_int_equal(kvmem_lab_open(ws, trace, &lab), 0);
	kvmem_lab_params_default(&p);
	p.policy = "test_oldest";
	p.keep_plans = 1;
	if (kvmem_lab_replay(lab, &p, &r))
		fail_msg("replay: %s", kvmem_last_error());
	assert_ptr_equal(r.policy, &test_oldest);
	assert_int_equal(r.live_compared, 0);
	for (int64_t k = 0; k < r.n_steps; k++) {
		const kvmem_lab_step *st = &r.steps[k];

		/* Past sink, pins, recent and the newest block, the plan takes
		 * the oldest blocks: block 0 and 1 are in every view. */
		if (st->n_blocks > 6) {
			assert_int_equal(st->blocks[0], 0);
			assert_int_equal(st->blocks[1], 1);
		}
		assert_true(st->scores[0] >= st->scores[st->n_blocks - 1]);
	}
	kvmem_lab_result_free(&r);
	p.policy = "no_such_policy";
	assert_int_equal(kvmem_lab_replay(lab, &p, &r), -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "test_oldest"));
	kvmem_lab_close(lab);
	live_free(&lv);
	fx_rmtree(dir);
	kvmem_backend_close(e);
	test_model_free(m);
}

static int copy_file(const char *from, const char *to, long len)
{
	FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
	int c, rc = 0;

	if (!a || !b)
		rc = -1;
	for (long i = 0; !rc && (len < 0 || i < len) && (c = fgetc(a)) != EOF; i++)
		fputc(c, b);
	if (a)
		fclose(a);
	if (b && fclose(b))
		rc = -1;
	return rc;
}

static long file_len(const char *path)
{
	struct stat st;

	return stat(path, &st) ? -1 : (long)st.st_size;
}

/* A flipped byte anywhere, or a trace cut anywhere, is refused: -EBADMSG,
 * naming the file. */
static void test_corrupt_trace_refused(void **state)
{
	uint64_t rng = g_seed ^ 21;
	kvmem_model *m = model(&rng);
	kvmem_backend *e = kvmem_backend_cpu(m, 16);
	char dir[256], ws[300], trace[300], bad[300];
	struct rec_cfg rc = { .policy = "refine", .block = 16, .budget = 64, .steps = 3,
			      .seed = test_rng_next(&rng) };
	struct live lv = { 0 };
	kvmem_lab_trace_info ti;
	kvmem_lab *lab;
	long len;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	snprintf(ws, sizeof(ws), "%s/ws", dir);
	snprintf(trace, sizeof(trace), "%s/trace", dir);
	snprintf(bad, sizeof(bad), "%s/bad", dir);
	record(m, e, ws, trace, &rc, &lv);
	assert_int_equal(kvmem_lab_trace_info_read(trace, &ti), 0);
	len = file_len(trace);
	assert_int_equal((long)ti.bytes, len);
	for (int i = 0; i < 40; i++) {
		long off = (long)(test_rng_next(&rng) % (uint64_t)len);

		assert_int_equal(copy_file(trace, bad, -1), 0);
		assert_int_equal(fx_flip(bad, (uint64_t)off), 0);
		if (kvmem_lab_open(ws, bad, &lab) != -EBADMSG)
			fail_msg("a flipped byte at %ld of %ld was not refused: %s", off, len,
				 kvmem_last_error());
		assert_non_null(strstr(kvmem_last_error(), bad));
	}
	for (int i = 0; i < 20; i++) {
		long cut = (long)(test_rng_next(&rng) % (uint64_t)len);

		assert_int_equal(copy_file(trace, bad, cut), 0);
		if (kvmem_lab_open(ws, bad, &lab) != -EBADMSG)
			fail_msg("a trace cut at %ld of %ld was not refused: %s", cut, len,
				 kvmem_last_error());
		assert_non_null(strstr(kvmem_last_error(), bad));
	}
	/* The version field is covered by the header's checksum: a flipped
	 * byte there is corruption (seed 11257860156330906260 drew byte 9 and
	 * got -ESTALE); another version's intact header is -ESTALE, naming
	 * both versions. */
	assert_int_equal(copy_file(trace, bad, -1), 0);
	assert_int_equal(fx_flip(bad, offsetof(struct lab_header, version) + 1), 0);
	assert_int_equal(kvmem_lab_open(ws, bad, &lab), -EBADMSG);
	{
		struct lab_header h;
		char want[64];
		FILE *f;

		assert_int_equal(copy_file(trace, bad, -1), 0);
		f = fopen(bad, "r+b");
		assert_non_null(f);
		assert_int_equal(fread(&h, sizeof(h), 1, f), 1);
		h.version = KVMEM_LAB_TRACE_VERSION + 1;
		h.checksum = lab_header_checksum(&h);
		assert_int_equal(fseek(f, 0, SEEK_SET), 0);
		assert_int_equal(fwrite(&h, sizeof(h), 1, f), 1);
		assert_int_equal(fclose(f), 0);
		assert_int_equal(kvmem_lab_open(ws, bad, &lab), -ESTALE);
		snprintf(want, sizeof(want), "version %d; this kvmem reads version %d",
			 KVMEM_LAB_TRACE_VERSION + 1, KVMEM_LAB_TRACE_VERSION);
		assert_non_null(strstr(kvmem_last_error(), want));
	}
	/* And the good one opens. */
	assert_int_equal(kvmem_lab_open(ws, trace, &lab), 0);
	kvmem_lab_close(lab);
	live_free(&lv);
	fx_rmtree(dir);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* A trace of another model, or of a longer history, does not fit the
 * workspace: -ESTALE naming both fingerprints. */
static void test_other_model_refused(void **state)
{
	uint64_t rng = g_seed ^ 31;
	kvmem_model *m1 = model(&rng), *m2 = model(&rng);
	kvmem_backend *e1 = kvmem_backend_cpu(m1, 16), *e2 = kvmem_backend_cpu(m2, 16);
	char dir[256], ws1[300], ws2[300], t1[300], t2[300], fp[32];
	struct rec_cfg rc = { .policy = "meank", .block = 16, .budget = 64, .steps = 3,
			      .seed = test_rng_next(&rng) };
	struct live lv = { 0 };
	kvmem_lab *lab;

	m1->fingerprint = test_rng_next(&rng) | 1;
	m2->fingerprint = test_rng_next(&rng) | 1;
	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	snprintf(ws1, sizeof(ws1), "%s/ws1", dir);
	snprintf(ws2, sizeof(ws2), "%s/ws2", dir);
	snprintf(t1, sizeof(t1), "%s/t1", dir);
	snprintf(t2, sizeof(t2), "%s/t2", dir);
	record(m1, e1, ws1, t1, &rc, &lv);
	live_free(&lv);
	rc.steps = 6;
	record(m2, e2, ws2, t2, &rc, &lv);
	live_free(&lv);
	assert_int_equal(kvmem_lab_open(ws2, t1, &lab), -ESTALE);
	snprintf(fp, sizeof(fp), "%016llx", (unsigned long long)m1->fingerprint);
	assert_non_null(strstr(kvmem_last_error(), fp));
	snprintf(fp, sizeof(fp), "%016llx", (unsigned long long)m2->fingerprint);
	assert_non_null(strstr(kvmem_last_error(), fp));
	assert_non_null(strstr(kvmem_last_error(), t1));
	/* Same model, but the trace selects past the workspace's history. */
	m1->fingerprint = m2->fingerprint;
	rc.steps = 2;
	fx_rmtree(ws1);
	record(m1, e1, ws1, t1, &rc, &lv);
	live_free(&lv);
	assert_int_equal(kvmem_lab_open(ws1, t2, &lab), -ESTALE);
	assert_non_null(strstr(kvmem_last_error(), "tokens"));
	assert_int_equal(kvmem_lab_open(ws2, t2, &lab), 0);
	kvmem_lab_close(lab);
	fx_rmtree(dir);
	kvmem_backend_close(e1);
	kvmem_backend_close(e2);
	test_model_free(m1);
	test_model_free(m2);
}

/* ---- every policy keeps the exactness invariant ----------------------------- */
struct twin {
	kvmem_backend *e;
	kvmem_view *v;
	int vocab;
	float *logits;
	int64_t calls, differ;
};

static void twin_forward(void *arg, const int32_t *tok, int n, const float *logits)
{
	struct twin *t = arg;

	assert_int_equal(kvmem_backend_append_out(t->e, t->v, tok, n, t->logits, 1, NULL), 0);
	t->calls++;
	t->differ += memcmp(logits, t->logits, (size_t)n * t->vocab * sizeof(float)) != 0;
}

/*
 * With a budget that holds the whole workspace (exactly: the policy still
 * scores and the tail fills), every forward pass of a session equals a
 * plain full-context run, for every policy there is: the ones the lab adds
 * and the one this file registers (test_ws_session holds the shipped list
 * to the same rule in depth).
 */
static void test_exact_every_policy(void **state)
{
	uint64_t rng = g_seed ^ 51;
	kvmem_model *m = model(&rng);
	kvmem_backend *e = kvmem_backend_cpu(m, 16);
	const kvmem_policy_ops *pol;

	for (int i = 0; (pol = kvmem_policy_at(i)); i++) {
		struct twin t = { .e = e, .vocab = m->cfg.vocab };
		kvmem_session_opts o;
		kvmem_session *s;
		int32_t ids[400], out[16];
		int n = 0;

		for (int k = 0; k < 400; k++)
			ids[k] = (int32_t)(test_rng_next(&rng) % m->cfg.vocab);
		assert_int_equal(e->ops->view_create(e->ctx, &t.v), 0);
		t.logits = malloc(16 * sizeof(float) * m->cfg.vocab);
		kvmem_session_opts_default(&o);
		o.block = 16;
		o.chunk = 16;
		o.budget = 400 + 16 + 5 * 8;	/* the tokens this run makes */
		o.policy = pol->name;
		o.all_logits = 1;
		o.on_forward = twin_forward;
		o.arg = &t;
		assert_non_null(s = kvmem_session_create(e, &o));
		for (int step = 0; step < 5; step++) {
			int a = test_rng_int(&rng, 20, 60), q = test_rng_int(&rng, 2, 8);

			assert_int_equal(kvmem_session_append(s, ids + n, a, step == 0), 0);
			assert_int_equal(kvmem_session_select_ahead(s, ids + n + a, q), 0);
			assert_int_equal(kvmem_session_append(s, ids + n + a, q, 0), 0);
			assert_int_equal(kvmem_session_decode(s, 3, NULL, out), 0);
			n += a + q;
		}
		if (t.differ)
			fail_msg("policy %s: %lld of %lld forward passes differ from full context",
				 pol->name, (long long)t.differ, (long long)t.calls);
		assert_true(t.calls > 10);
		kvmem_session_free(s);
		e->ops->view_destroy(e->ctx, t.v);
		free(t.logits);
	}
	kvmem_backend_close(e);
	test_model_free(m);
}

/* With reads only, the lab's pool is kvmem_repl_simulate's, hit for hit. */
static void test_pool_is_the_simulators(void **state)
{
	uint64_t rng = g_seed ^ 41;

	for (int i = 0; kvmem_repl_policies[i]; i++)
		for (int trial = 0; trial < 4; trial++) {
			const kvmem_repl_ops *ops = kvmem_repl_policies[i];
			size_t n_steps = (size_t)test_rng_int(&rng, 5, 40), off[41] = { 0 }, n = 0;
			uint64_t pages[41 * 30], hits = 0, misses = 0, h = 0, mi = 0;
			uint32_t slots = (uint32_t)test_rng_int(&rng, 8, 60), L = 3;
			struct lab_cache c;

			for (size_t s = 0; s < n_steps; s++) {
				int k = test_rng_int(&rng, 1, 6);

				for (int j = 0; j < k; j++)
					pages[n++] = (uint64_t)test_rng_int(&rng, 0, 90);
				off[s + 1] = n;
			}
			kvmem_repl_trace t = { .n_steps = n_steps, .step_off = off, .pages = pages };

			kvmem_repl_simulate(ops, slots, L, &t, &hits, &misses);
			assert_int_equal(lab_cache_init(&c, ops, slots, L), 0);
			for (size_t s = 0; s < n_steps; s++) {
				lab_cache_step(&c, s);
				for (size_t j = off[s]; j < off[s + 1]; j++) {
					int r = lab_cache_read(&c, pages[j]);

					assert_true(r >= 0);
					h += r == 1, mi += r == 0;
				}
			}
			lab_cache_free(&c);
			assert_int_equal(h, hits);
			assert_int_equal(mi, misses);
		}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_replay_equals_live),
		cmocka_unit_test(test_policy_from_test_file),
		cmocka_unit_test(test_corrupt_trace_refused),
		cmocka_unit_test(test_other_model_refused),
		cmocka_unit_test(test_pool_is_the_simulators),
		cmocka_unit_test(test_exact_every_policy),
	};

	g_seed = test_rng_fresh_seed("test_lab");
	/* Before any test: the registered policy is in every list. */
	if (kvmem_policy_register(&test_oldest)) {
		fprintf(stderr, "test_lab: %s\n", kvmem_last_error());
		return 1;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}

// SPDX-License-Identifier: MIT
/*
 * A decode step returns with its rows in flight (user/session/writer.c,
 * issue #26): the batched calls and kvmem_session_decode hand their last
 * rows to the sessions' writer threads and return; the next step waits
 * for them after its forward. What must hold:
 *
 *  - The call does not wait for its writers: with every write held at a
 *    gate, a batched step (and a lone decode step) returns, and its
 *    writers then block at the gate. (A call that waited would block there
 *    itself until the gate gave up, which the test sees.)
 *  - Whatever reads the history waits first: a state saved while the rows
 *    are held is the one of a twin that made the same calls alone; the next
 *    steps, kvmem_session_sync and kvmem_session_index see every row; a
 *    session freed with its rows held loses none (the pages are its twin's).
 *  - Commits: a workspace committed right after each batched step, closed
 *    and reopened, goes on bit for bit like its twin; a child committing
 *    after each batched step and killed at a random moment leaves every
 *    commit it saw succeed, and the reopened sessions go on like twins.
 *  - A write that fails after the step returned: the next call (or
 *    kvmem_session_sync) reports the writer's code and message once, the
 *    calls after it -EINVAL, and no state is saved (no commit).
 *
 * Every row job goes to the writers here (KVMEM_WRITER_MIN=1, as on a
 * GPU); the twins use memory sources and the same calls one by one.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "kvmem/store.h"
#include "session/inspect.h"
#include "helpers/test_model.h"
#include "helpers/test_tmpdir.h"

#define B 16		/* tokens a block */
#define CHUNK 32
#define N 3		/* sessions in a batch */
#define GATE_S 5	/* a held write gives up after this long */

static uint64_t g_seed;
/* In a forked child a failed check exits (status 2): cmocka's jump would
 * run the rest of the suite in the child. */
static int g_child;
#define NEED(x)								\
	do {								\
		if (!(x)) {						\
			if (g_child)					\
				_exit(2);				\
			fail_msg("%s:%d: %s", __FILE__, __LINE__, #x);	\
		}							\
	} while (0)

/* ---- a gate every wrapped source's writes go through ------------------- */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int closed, blocked, gave_up, fail, delay_us;
	const kvmem_page_source_ops *real;
} g = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

/* Wait while the gate is closed (at most GATE_S), then fail or go on. */
static int pass_gate(void)
{
	struct timespec until;
	int rc = 0, delay;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += GATE_S;
	pthread_mutex_lock(&g.mu);
	g.blocked++;
	pthread_cond_broadcast(&g.cv);
	while (g.closed && !rc)
		rc = pthread_cond_timedwait(&g.cv, &g.mu, &until);
	g.gave_up += rc != 0;
	g.blocked--;
	pthread_cond_broadcast(&g.cv);	/* gate_cleared */
	rc = g.fail;
	delay = g.delay_us;
	pthread_mutex_unlock(&g.mu);
	if (delay)
		usleep((useconds_t)delay);
	return rc ? kvmem_error(EIO, "injected write failure after the step") : 0;
}

static int gated_write(void *ctx, int64_t b, int layer, int t0, int n, const float *k,
		       const float *v)
{
	return pass_gate() ? kvmem_fail() : g.real->write(ctx, b, layer, t0, n, k, v);
}

static int gated_write_rows(void *ctx, int64_t p0, int n, const void *k, const void *v,
			    uint32_t dtype)
{
	return pass_gate() ? kvmem_fail() : g.real->write_rows(ctx, p0, n, k, v, dtype);
}

static void gate_set(int closed, int fail)
{
	pthread_mutex_lock(&g.mu);
	g.closed = closed;
	g.fail = fail;
	pthread_cond_broadcast(&g.cv);
	pthread_mutex_unlock(&g.mu);
}

/* Writes held longer than GATE_S so far. */
static int gave_up(void)
{
	int n;

	pthread_mutex_lock(&g.mu);
	n = g.gave_up;
	pthread_mutex_unlock(&g.mu);
	return n;
}

/* Every write slowed by us microseconds (0: not). */
static void slow_writes(int us)
{
	pthread_mutex_lock(&g.mu);
	g.delay_us = us;
	pthread_mutex_unlock(&g.mu);
}

/* Until `want` writers wait at the gate (0: GATE_S passed first). */
static int gate_await(int want)
{
	struct timespec until;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += GATE_S;
	pthread_mutex_lock(&g.mu);
	while (g.blocked < want && !rc)
		rc = pthread_cond_timedwait(&g.cv, &g.mu, &until);
	rc = g.blocked >= want;
	pthread_mutex_unlock(&g.mu);
	return rc;
}

/* Until no writer waits at the gate (each has read fail): 0 when GATE_S
 * passed first. The writers are woken by a broadcast of gate_set. */
static int gate_cleared(void)
{
	struct timespec until;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += GATE_S;
	pthread_mutex_lock(&g.mu);
	while (g.blocked && !rc)
		rc = pthread_cond_timedwait(&g.cv, &g.mu, &until);
	rc = !g.blocked;
	pthread_mutex_unlock(&g.mu);
	return rc;
}

/* Opens the gate after 100 ms, from another thread. */
static void *open_later(void *arg)
{
	usleep(100 * 1000);
	pthread_mutex_lock(&g.mu);
	g.closed = 0;
	pthread_cond_broadcast(&g.cv);
	pthread_mutex_unlock(&g.mu);
	return NULL;
}

/* src's ops with the writes through the gate, in *ops; the wrapped source. */
static kvmem_page_source gated(const kvmem_page_source *src, kvmem_page_source_ops *ops)
{
	g.real = src->ops;
	*ops = *src->ops;
	ops->write = gated_write;
	if (ops->write_rows)
		ops->write_rows = gated_write_rows;
	return (kvmem_page_source){ .ops = ops, .ctx = src->ctx };
}

/* ---- sessions and their twins ------------------------------------------ */
static kvmem_model *small_model(uint64_t seed)
{
	kvmem_config c = test_model_config(2, 32, 4, 2, 16, 48, 61, 1);

	return test_model_random(&c, seed);
}

static kvmem_session *open_session(kvmem_backend *e, const kvmem_page_source *src,
				   int64_t budget)
{
	kvmem_session_opts o;
	kvmem_session *s;

	kvmem_session_opts_default(&o);
	o.block = B;
	o.chunk = CHUNK;
	o.budget = budget;
	o.source = src;
	s = kvmem_session_create(e, &o);
	NEED(s);
	return s;
}

/* History i: its length and ids (a function of the seed and i). */
static int history(uint64_t seed, int i, int32_t *ids, int vocab)
{
	uint64_t r = seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
	int n = test_rng_int(&r, 20, 90);

	for (int k = 0; k < n; k++)
		ids[k] = test_rng_int(&r, 0, vocab - 1);
	return n;
}

static void feed(kvmem_session *s, uint64_t seed, int i, int vocab)
{
	int32_t ids[90];
	int n = history(seed, i, ids, vocab);

	NEED(kvmem_session_append(s, ids, n, 0) == 0);
}

/* Every written row of every page of two memory sources, bit for bit. */
static void same_pages(const kvmem_page_source *a, const kvmem_page_source *b,
		       const kvmem_config *c, int64_t n_tokens)
{
	const size_t D = (size_t)c->head_dim;

	for (int64_t blk = 0; blk * B < n_tokens; blk++)
		for (int l = 0; l < c->n_layers; l++) {
			int64_t len = n_tokens - blk * B < B ? n_tokens - blk * B : B;
			kvmem_page pa, pb;

			assert_int_equal(a->ops->get(a->ctx, blk, l, &pa), 0);
			assert_int_equal(b->ops->get(b->ctx, blk, l, &pb), 0);
			for (int h = 0; h < c->n_kv_heads; h++) {
				size_t at = (size_t)h * B * D;

				assert_memory_equal((const float *)pa.k + at, (const float *)pb.k + at,
						    sizeof(float) * len * D);
				assert_memory_equal((const float *)pa.v + at, (const float *)pb.v + at,
						    sizeof(float) * len * D);
			}
			a->ops->put(a->ctx, blk, l);
			b->ops->put(b->ctx, blk, l);
		}
}

static void same_state(const kvmem_session *a, const kvmem_session *b)
{
	void *sa, *sb;
	size_t la, lb;

	assert_int_equal(kvmem_session_save_state(a, &sa, &la), 0);
	assert_int_equal(kvmem_session_save_state(b, &sb, &lb), 0);
	assert_int_equal(la, lb);
	assert_memory_equal(sa, sb, la);
	free(sa);
	free(sb);
}

/* The next k greedy tokens and their logits: a's (decoded in a batch of
 * one) equal b's (decoded alone). */
static void same_next(kvmem_session *a, kvmem_session *b, int k, int vocab)
{
	for (int i = 0; i < k; i++) {
		int32_t ta, tb;
		int rc;

		assert_int_equal(kvmem_session_decode_batch(&a, 1, NULL, &ta, &rc), 0);
		assert_int_equal(kvmem_session_decode(b, 1, NULL, &tb), 0);
		assert_int_equal(ta, tb);
		assert_memory_equal(kvmem_session_logits(a), kvmem_session_logits(b),
				    sizeof(float) * vocab);
	}
}

static char *g_writer_min;	/* KVMEM_WRITER_MIN as the test found it */

static int setup(void **state)
{
	const char *e = getenv("KVMEM_WRITER_MIN");

	g_writer_min = e ? strdup(e) : NULL;
	setenv("KVMEM_WRITER_MIN", "1", 1);
	gate_set(0, 0);
	slow_writes(0);
	pthread_mutex_lock(&g.mu);
	g.gave_up = 0;
	pthread_mutex_unlock(&g.mu);
	return 0;
}

static int teardown(void **state)
{
	if (g_writer_min)
		setenv("KVMEM_WRITER_MIN", g_writer_min, 1);
	else
		unsetenv("KVMEM_WRITER_MIN");
	free(g_writer_min);
	g_writer_min = NULL;
	return 0;
}

/* ---- the tests ---------------------------------------------------------- */
struct fixture {
	kvmem_model *m;
	kvmem_backend *e;
	kvmem_page_source src[N], tsrc[N], wrapped[N];
	kvmem_page_source_ops ops;
	kvmem_session *s[N], *t[N];
	int32_t out[N];
	int rc[N];
};

static void fx_open(struct fixture *f, uint64_t seed, int64_t budget)
{
	const kvmem_config *c;

	memset(f, 0, sizeof(*f));
	f->m = small_model(seed);
	c = &f->m->cfg;
	f->e = kvmem_backend_cpu(f->m, CHUNK);
	assert_non_null(f->e);
	for (int i = 0; i < N; i++) {
		assert_int_equal(kvmem_page_source_mem(&f->src[i], c->n_layers, c->n_kv_heads,
						       c->head_dim, B), 0);
		assert_int_equal(kvmem_page_source_mem(&f->tsrc[i], c->n_layers, c->n_kv_heads,
						       c->head_dim, B), 0);
		f->wrapped[i] = gated(&f->src[i], &f->ops);
		f->s[i] = open_session(f->e, &f->wrapped[i], budget);
		f->t[i] = open_session(f->e, &f->tsrc[i], budget);
		feed(f->s[i], seed, i, c->vocab);
		feed(f->t[i], seed, i, c->vocab);
	}
}

static void fx_close(struct fixture *f)
{
	for (int i = 0; i < N; i++) {
		kvmem_session_free(f->s[i]);
		kvmem_session_free(f->t[i]);
		kvmem_page_source_destroy(&f->src[i]);
		kvmem_page_source_destroy(&f->tsrc[i]);
	}
	kvmem_backend_close(f->e);
	test_model_free(f->m);
}

/* The twins' step: each draws alone what the batch drew. */
static void twins_step(struct fixture *f)
{
	for (int i = 0; i < N; i++) {
		int32_t t;

		assert_int_equal(f->rc[i], 0);
		assert_int_equal(kvmem_session_decode(f->t[i], 1, NULL, &t), 0);
		assert_int_equal(t, f->out[i]);
	}
}

/* A batched step with every write held: it returns, then its N writers
 * block at the gate. The state saved meanwhile waits for them. */
static void test_step_returns_first(void **state)
{
	struct fixture f;
	const kvmem_config *c;
	pthread_t th;

	fx_open(&f, g_seed ^ 0xd1, 0);
	c = &f.m->cfg;
	for (int step = 0; step < 4; step++) {
		gate_set(1, 0);
		assert_int_equal(kvmem_session_decode_batch(f.s, N, NULL, f.out, f.rc), 0);
		assert_true(gate_await(N));	/* each writer at the gate, after the call */
		assert_int_equal(gave_up(), 0);
		twins_step(&f);
		/* Read while the rows are held: the reader waits for them. */
		assert_int_equal(pthread_create(&th, NULL, open_later, NULL), 0);
		if (step % 2)
			same_state(f.s[step % N], f.t[step % N]);
		else
			assert_int_equal(kvmem_session_sync(f.s[step % N]), 0);
		pthread_join(th, NULL);
		assert_int_equal(gave_up(), 0);
		for (int i = 0; i < N; i++)	/* all through before the gate closes again */
			assert_int_equal(kvmem_session_sync(f.s[i]), 0);
	}
	/* The next steps and every reader see every row. */
	for (int step = 0; step < 3; step++) {
		assert_int_equal(kvmem_session_decode_batch(f.s, N, NULL, f.out, f.rc), 0);
		twins_step(&f);
	}
	for (int i = 0; i < N; i++) {
		const kvmem_index *a = kvmem_session_index(f.s[i]), *b = kvmem_session_index(f.t[i]);

		assert_int_equal(a->n_blocks, b->n_blocks);
		assert_int_equal(kvmem_session_sync(f.s[i]), 0);
		assert_int_equal(kvmem_session_sync(f.t[i]), 0);
		same_pages(&f.src[i], &f.tsrc[i], c, kvmem_session_tokens(f.s[i]));
		same_state(f.s[i], f.t[i]);
	}
	/* A lone decode step returns first too. */
	gate_set(1, 0);
	assert_int_equal(kvmem_session_decode(f.s[0], 1, NULL, f.out), 0);
	assert_true(gate_await(1));
	gate_set(0, 0);
	assert_int_equal(kvmem_session_sync(f.s[0]), 0);
	/* Freed with its rows held: nothing lost (the source outlives it). */
	assert_int_equal(kvmem_session_decode(f.t[0], 1, NULL, f.out), 0);
	gate_set(1, 0);
	assert_int_equal(kvmem_session_decode_batch(f.s, N, NULL, f.out, f.rc), 0);
	twins_step(&f);
	assert_true(gate_await(N));
	assert_int_equal(pthread_create(&th, NULL, open_later, NULL), 0);
	for (int i = 0; i < N; i++) {
		int64_t n = kvmem_session_tokens(f.s[i]);

		kvmem_session_free(f.s[i]);
		f.s[i] = NULL;
		assert_int_equal(kvmem_session_sync(f.t[i]), 0);
		same_pages(&f.src[i], &f.tsrc[i], c, n);
	}
	pthread_join(th, NULL);
	assert_int_equal(gave_up(), 0);
	fx_close(&f);
}

/* A selection in the next step (small budgets: forced ones) waits for
 * the rows in flight; the views stay the twins'. */
static void test_selections_between(void **state)
{
	struct fixture f;

	fx_open(&f, g_seed ^ 0xd2, 2 * B);
	for (int step = 0; step < 80; step++) {
		slow_writes(step % 3 ? 0 : 300);	/* rows slow now and then */
		assert_int_equal(kvmem_session_decode_batch(f.s, N, NULL, f.out, f.rc), 0);
		twins_step(&f);
		if (step % 29 == 5) {	/* one each, far apart: forced ones between */
			assert_int_equal(kvmem_session_select(f.s[step % N]), 0);
			assert_int_equal(kvmem_session_select(f.t[step % N]), 0);
		}
	}
	slow_writes(0);
	for (int i = 0; i < N; i++) {
		kvmem_session_stats st;

		kvmem_session_get_stats(f.s[i], &st);
		assert_true(st.forced > 0);
		same_state(f.s[i], f.t[i]);
		assert_int_equal(kvmem_session_sync(f.s[i]), 0);
		same_pages(&f.src[i], &f.tsrc[i], &f.m->cfg, kvmem_session_tokens(f.s[i]));
	}
	fx_close(&f);
}

/* A write failing after the step returned: reported once, by the next
 * call or by kvmem_session_sync, with the writer's code and message. */
static void test_failure_after_return(void **state)
{
	struct fixture f;
	void *st;
	size_t len;

	fx_open(&f, g_seed ^ 0xd3, 0);
	gate_set(1, 1);
	assert_int_equal(kvmem_session_decode_batch(f.s, N, NULL, f.out, f.rc), 0);
	assert_true(gate_await(N));
	gate_set(0, 1);
	/* Session 0: found by sync; session 1: by the next step; session 2: by
	 * a save (a commit). */
	assert_int_equal(kvmem_session_sync(f.s[0]), -EIO);
	assert_non_null(strstr(kvmem_last_error(), "injected write failure"));
	assert_int_equal(kvmem_session_save_state(f.s[2], &st, &len), -EIO);
	assert_null(st);
	assert_true(gate_cleared());	/* session 1's writer failed too */
	gate_set(0, 0);
	assert_int_equal(kvmem_session_decode_batch(f.s, N, NULL, f.out, f.rc), N);
	assert_int_equal(f.rc[0], -EINVAL);
	assert_int_equal(f.rc[1], -EIO);
	assert_int_equal(f.rc[2], -EINVAL);
	assert_int_equal(kvmem_session_decode_batch(&f.s[1], 1, NULL, f.out, f.rc), 1);
	assert_int_equal(f.rc[0], -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "unusable"));
	for (int i = 0; i < N; i++) {
		assert_int_equal(kvmem_session_sync(f.s[i]), -EINVAL);
		assert_true(kvmem_session_save_state(f.s[i], &st, &len) < 0);
	}
	fx_close(&f);
}

/* ---- commits ------------------------------------------------------------ */
static kvmem_workspace *ws_open(const char *dir, const kvmem_model *m)
{
	kvmem_workspace_opts wo = { .block = B };
	kvmem_workspace *w;

	if (kvmem_workspace_open(dir, m, &wo, &w) < 0)
		return NULL;
	return w;
}

/*
 * N workspaces; rounds of one batched step, then a commit of each session
 * right away (its rows in flight, slowed). report (may be -1): a pipe the
 * token counts of every commit go to. Runs rounds steps; returns nothing
 * (a child is killed in it).
 */
static void commit_run(const char *const *dirs, uint64_t seed, int rounds, int report)
{
	kvmem_model *m = small_model(seed);
	kvmem_backend *e = kvmem_backend_cpu(m, CHUNK);
	kvmem_workspace *w[N];
	kvmem_page_source wrapped[N];
	kvmem_page_source_ops ops;
	kvmem_session *s[N];
	int32_t out[N];
	int rc[N];

	NEED(e);
	for (int i = 0; i < N; i++) {
		NEED(w[i] = ws_open(dirs[i], m));
		wrapped[i] = gated(kvmem_workspace_source(w[i]), &ops);
		s[i] = open_session(e, &wrapped[i], 3 * B);
		feed(s[i], seed, i, m->cfg.vocab);
		NEED(kvmem_workspace_commit(w[i], s[i]) == 0);
	}
	slow_writes(200);
	for (int r = 0; r < rounds; r++) {
		NEED(kvmem_session_decode_batch(s, N, NULL, out, rc) == 0);
		for (int i = 0; i < N; i++) {
			int64_t n = kvmem_session_tokens(s[i]);

			NEED(kvmem_workspace_commit(w[i], s[i]) == 0);
			if (report >= 0 && write(report, &n, sizeof(n)) != sizeof(n))
				_exit(3);
		}
	}
	slow_writes(0);
	for (int i = 0; i < N; i++) {
		kvmem_session_free(s[i]);
		NEED(kvmem_workspace_close(w[i]) == 0);
	}
	kvmem_backend_close(e);
	test_model_free(m);
}

/* Reopen each workspace: at least `least[i]` tokens, the state restored,
 * and the session goes on like a twin that ran as many tokens alone. */
static void check_reopened(const char *const *dirs, uint64_t seed, const int64_t *least)
{
	kvmem_model *m = small_model(seed);
	kvmem_backend *e = kvmem_backend_cpu(m, CHUNK);

	for (int i = 0; i < N; i++) {
		kvmem_workspace *w = ws_open(dirs[i], m);
		kvmem_page_source tsrc;
		kvmem_session *s, *t;
		int64_t n;
		int32_t tok;

		assert_non_null(w);
		assert_true(kvmem_workspace_tokens(w) >= least[i]);
		s = open_session(e, kvmem_workspace_source(w), 3 * B);
		assert_int_equal(kvmem_workspace_adopt(w, s), 0);	/* the state too */
		n = kvmem_session_tokens(s);
		assert_int_equal(n, kvmem_workspace_tokens(w));
		assert_int_equal(kvmem_page_source_mem(&tsrc, m->cfg.n_layers, m->cfg.n_kv_heads,
						       m->cfg.head_dim, B), 0);
		t = open_session(e, &tsrc, 3 * B);
		feed(t, seed, i, m->cfg.vocab);
		while (kvmem_session_tokens(t) < n)
			assert_int_equal(kvmem_session_decode(t, 1, NULL, &tok), 0);
		assert_memory_equal(kvmem_session_token_ids(s), kvmem_session_token_ids(t),
				    sizeof(int32_t) * (size_t)n);
		same_next(s, t, 4, m->cfg.vocab);
		kvmem_session_free(s);
		kvmem_session_free(t);
		kvmem_page_source_destroy(&tsrc);
		assert_int_equal(kvmem_workspace_close(w), 0);
	}
	kvmem_backend_close(e);
	test_model_free(m);
}

struct dirs {
	char buf[N][256];
	const char *p[N];
};

static void dirs_make(struct dirs *d, const char *name)
{
	for (int i = 0; i < N; i++) {
		assert_int_equal(test_tmpdir_make(d->buf[i], sizeof(d->buf[i]), name), 0);
		d->p[i] = d->buf[i];
	}
}

static void dirs_remove(struct dirs *d)
{
	for (int i = 0; i < N; i++)
		test_tmpdir_remove(d->buf[i]);
}

/* Committed right after each batched step, closed, reopened: the same. */
static void test_commit_after_step(void **state)
{
	struct dirs d;
	const int64_t none[N] = { 0 };
	const uint64_t seed = g_seed ^ 0xd4;

	dirs_make(&d, "ws-defer");
	commit_run(d.p, seed, 12, -1);
	check_reopened(d.p, seed, none);
	dirs_remove(&d);
}

/* A child commits after each batched step and is killed at a random
 * moment: every commit it reported survives, and each session goes on.
 * Every child is forked before this process runs OpenMP (libgomp's pool
 * does not survive a fork: a child of a process that used it hangs in
 * its first parallel region), so the checks come after the kills. */
#define KILLS 3

static void test_killed_while_committing(void **state)
{
	uint64_t r = g_seed ^ 0xd5, seed[KILLS];
	struct dirs d[KILLS];
	int64_t least[KILLS][N];

	memset(least, 0, sizeof(least));
	for (int k = 0; k < KILLS; k++) {
		int64_t n;
		int fd[2], status, got = 0, want = test_rng_int(&r, 1, 20);
		pid_t pid;

		seed[k] = test_rng_next(&r);
		dirs_make(&d[k], "ws-defer-kill");
		assert_int_equal(pipe(fd), 0);
		pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			g_child = 1;
			close(fd[0]);
			commit_run(d[k].p, seed[k], 1000, fd[1]);
			_exit(0);
		}
		close(fd[1]);
		/* Kill after `want` commits were reported, a little later. */
		while (got < want && read(fd[0], &n, sizeof(n)) == sizeof(n))
			least[k][got++ % N] = n;
		usleep((useconds_t)test_rng_int(&r, 0, 20000));
		kill(pid, SIGKILL);
		while (read(fd[0], &n, sizeof(n)) == sizeof(n))	/* reported before it died */
			least[k][got++ % N] = n;
		close(fd[0]);
		assert_int_equal(waitpid(pid, &status, 0), pid);
		assert_true(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0));
		print_message("killed after %d commits\n", got);
	}
	for (int k = 0; k < KILLS; k++) {
		check_reopened(d[k].p, seed[k], least[k]);
		dirs_remove(&d[k]);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		/* First: the child forks before this process runs OpenMP. */
		cmocka_unit_test_setup_teardown(test_killed_while_committing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_step_returns_first, setup, teardown),
		cmocka_unit_test_setup_teardown(test_selections_between, setup, teardown),
		cmocka_unit_test_setup_teardown(test_failure_after_return, setup, teardown),
		cmocka_unit_test_setup_teardown(test_commit_after_step, setup, teardown),
	};

	g_seed = test_rng_fresh_seed("test_ws_defer");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

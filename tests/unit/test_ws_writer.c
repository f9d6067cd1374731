// SPDX-License-Identifier: MIT
/*
 * A prefill chunk's rows go to the page source on the writer thread
 * (user/session/writer.c) while the next chunk computes. What the
 * session gives out must not change: the same pages, the same index, the
 * same logits and plans as writing in line; selections in the middle of an
 * append see every row written; a failed write surfaces as the append's
 * error and leaves the session unusable. The same holds when a decode
 * step's one token goes to the worker (a device backend's default).
 *
 * The in-line twin is the same source with a sync op (a commit per forward
 * pass is written in line), so both runs use the same chunks.
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
#include "session/inspect.h"
#include "helpers/test_model.h"

static uint64_t g_seed;

/* ---- a memory source, its writes counted (and failed on demand) --------- */
static struct {
	const kvmem_page_source_ops *real;
	int writes, fail_at;	/* fail the fail_at-th write (0: never) */
} g_src;

static int counted_write(void *ctx, int64_t b, int layer, int t0, int n, const float *k,
			 const float *v)
{
	if (++g_src.writes == g_src.fail_at)
		return kvmem_error(EIO, "injected write failure at block %lld layer %d",
				   (long long)b, layer);
	return g_src.real->write(ctx, b, layer, t0, n, k, v);
}

static int no_sync(void *ctx, int64_t n_tokens)
{
	return 0;
}

/* One run's record: every forward's last logits row, every plan's blocks. */
struct record {
	float *logits;		/* [forwards][vocab] */
	int64_t *plans;		/* view blocks of each plan, concatenated */
	int n_fwd, n_plan_blocks, vocab;
};

static void rec_forward(void *arg, const int32_t *tok, int n, const float *logits)
{
	struct record *r = arg;

	r->logits = realloc(r->logits, sizeof(float) * (size_t)(r->n_fwd + 1) * r->vocab);
	memcpy(r->logits + (size_t)r->n_fwd * r->vocab, logits, sizeof(float) * r->vocab);
	r->n_fwd++;
}

static void rec_select(void *arg, const kvmem_plan *p, int forced)
{
	struct record *r = arg;
	int n = p->n_sets * p->n_view;

	r->plans = realloc(r->plans, sizeof(int64_t) * (size_t)(r->n_plan_blocks + n + 1));
	memcpy(r->plans + r->n_plan_blocks, p->blocks, sizeof(int64_t) * n);
	r->n_plan_blocks += n;
	r->plans[r->n_plan_blocks++] = -1;	/* a plan's end */
}

struct run {
	kvmem_page_source src, wrapped;
	kvmem_page_source_ops ops;
	kvmem_session *s;
	struct record rec;
};

static void run_open(struct run *r, kvmem_backend *e, const kvmem_config *c, int in_line,
		     int64_t budget)
{
	kvmem_session_opts o;

	memset(r, 0, sizeof(*r));
	assert_int_equal(kvmem_page_source_mem(&r->src, c->n_layers, c->n_kv_heads, c->head_dim,
					       16), 0);
	r->ops = *r->src.ops;
	g_src.real = r->src.ops;
	r->ops.write = counted_write;
	/* One piece at a time through write, so the failure can land in any
	 * of a chunk's writes. */
	r->ops.write_rows = NULL;
	if (in_line)
		r->ops.sync = no_sync;
	r->wrapped = (kvmem_page_source){ .ops = &r->ops, .ctx = r->src.ctx };
	r->rec.vocab = c->vocab;
	kvmem_session_opts_default(&o);
	o.block = 16;
	o.chunk = 128;
	o.budget = budget;
	o.source = &r->wrapped;
	o.on_forward = rec_forward;
	o.on_select = rec_select;
	o.arg = &r->rec;
	r->s = kvmem_session_create(e, &o);
	assert_non_null(r->s);
}

static void run_close(struct run *r)
{
	kvmem_session_free(r->s);
	kvmem_page_source_destroy(&r->src);
	free(r->rec.logits);
	free(r->rec.plans);
}

/* Every written row of every page of both sources, bit for bit. */
static void same_pages(struct run *a, struct run *b, const kvmem_config *c, int64_t n_tokens)
{
	const size_t D = (size_t)c->head_dim;

	for (int64_t blk = 0; blk * 16 < n_tokens; blk++)
		for (int l = 0; l < c->n_layers; l++) {
			int64_t len = n_tokens - blk * 16 < 16 ? n_tokens - blk * 16 : 16;
			kvmem_page pa, pb;

			assert_int_equal(a->src.ops->get(a->src.ctx, blk, l, &pa), 0);
			assert_int_equal(b->src.ops->get(b->src.ctx, blk, l, &pb), 0);
			assert_int_equal(pa.dtype, KVMEM_DTYPE_F32);
			assert_int_equal(pb.dtype, KVMEM_DTYPE_F32);
			for (int h = 0; h < c->n_kv_heads; h++) {
				size_t at = (size_t)h * 16 * D;

				assert_memory_equal((const float *)pa.k + at, (const float *)pb.k + at,
						    sizeof(float) * len * D);
				assert_memory_equal((const float *)pa.v + at, (const float *)pb.v + at,
						    sizeof(float) * len * D);
			}
			a->src.ops->put(a->src.ctx, blk, l);
			b->src.ops->put(b->src.ctx, blk, l);
		}
}

/* decode: tokens each decode call takes (a long one forces selections
 * while its rows are in flight). */
static void same_as_in_line(uint64_t rng, int decode)
{
	kvmem_config c = test_model_config(2, 32, 4, 2, 16, 48, 61, 0);
	kvmem_model *m = test_model_random(&c, (uint64_t)test_rng_int(&rng, 1, 1 << 30));
	kvmem_backend *e = kvmem_backend_cpu(m, 128);

	assert_non_null(e);
	for (int k = 0; k < 2; k++) {
		/* unlimited, then a budget small enough to select mid-append */
		int64_t budget = k ? 96 : 0;
		int n = test_rng_int(&rng, 700, 1100);
		int32_t *tok = malloc(sizeof(int32_t) * n);
		struct run a, b;
		int32_t *da = malloc(sizeof(int32_t) * 2 * decode), *db = malloc(sizeof(int32_t) * 2 * decode);
		kvmem_session_stats sa, sb;

		for (int i = 0; i < n; i++)
			tok[i] = test_rng_int(&rng, 0, c.vocab - 1);
		run_open(&a, e, &c, 0, budget);
		run_open(&b, e, &c, 1, budget);
		/* two appends, a decode in between: both stage-out and in-line
		 * writes, and selections while rows are in flight */
		assert_int_equal(kvmem_session_append(a.s, tok, n / 2, 0), 0);
		assert_int_equal(kvmem_session_append(b.s, tok, n / 2, 0), 0);
		assert_int_equal(kvmem_session_decode(a.s, decode, NULL, da), 0);
		assert_int_equal(kvmem_session_decode(b.s, decode, NULL, db), 0);
		assert_int_equal(kvmem_session_append(a.s, tok + n / 2, n - n / 2, 0), 0);
		assert_int_equal(kvmem_session_append(b.s, tok + n / 2, n - n / 2, 0), 0);
		assert_int_equal(kvmem_session_decode(a.s, decode, NULL, da + decode), 0);
		assert_int_equal(kvmem_session_decode(b.s, decode, NULL, db + decode), 0);
		assert_memory_equal(da, db, sizeof(int32_t) * 2 * decode);
		/* The timers: the in-line twin wrote every page on the session's
		 * thread; with the worker taking every job (KVMEM_WRITER_MIN=1)
		 * none was. */
		kvmem_session_get_stats(a.s, &sa);
		kvmem_session_get_stats(b.s, &sb);
		assert_true(sa.forward_ns > 0 && sb.forward_ns > 0);
		assert_true(sa.own_ns > 0 && sb.own_ns > 0);
		assert_true(sb.store_ns > 0);
		if (getenv("KVMEM_WRITER_MIN"))
			assert_int_equal(sa.store_ns, 0);
		else	/* the decode steps' tokens, in line */
			assert_true(sa.store_ns > 0);
		if (decode > 100 && budget) {
			kvmem_session_stats st;

			kvmem_session_get_stats(a.s, &st);
			assert_true(st.forced > 0);	/* a selection inside a decode */
		}
		assert_int_equal(a.rec.n_fwd, b.rec.n_fwd);
		assert_memory_equal(a.rec.logits, b.rec.logits,
				    sizeof(float) * (size_t)a.rec.n_fwd * c.vocab);
		assert_int_equal(a.rec.n_plan_blocks, b.rec.n_plan_blocks);
		if (budget)
			assert_true(a.rec.n_plan_blocks > 0);
		if (a.rec.n_plan_blocks)
			assert_memory_equal(a.rec.plans, b.rec.plans,
					    sizeof(int64_t) * a.rec.n_plan_blocks);
		/* The sources read past the sessions: the last decode's rows
		 * may still be on the writer. */
		assert_int_equal(kvmem_session_sync(a.s), 0);
		assert_int_equal(kvmem_session_sync(b.s), 0);
		same_pages(&a, &b, &c, kvmem_session_tokens(a.s));
		{	/* the query window, the plan, the counters: one state */
			void *ba, *bb;
			size_t la, lb;

			assert_int_equal(kvmem_session_save_state(a.s, &ba, &la), 0);
			assert_int_equal(kvmem_session_save_state(b.s, &bb, &lb), 0);
			assert_int_equal(la, lb);
			assert_memory_equal(ba, bb, la);
			free(ba);
			free(bb);
		}
		{
			const kvmem_index *ia = kvmem_session_index(a.s),
					  *ib = kvmem_session_index(b.s);

			assert_int_equal(ia->n_blocks, ib->n_blocks);
			for (int64_t r = 0; r < (int64_t)c.n_layers * c.n_kv_heads; r++)
				assert_memory_equal(ia->meank + r * ia->cap_blocks * c.head_dim,
						    ib->meank + r * ib->cap_blocks * c.head_dim,
						    sizeof(float) * ia->n_blocks * c.head_dim);
		}
		run_close(&a);
		run_close(&b);
		free(tok);
		free(da);
		free(db);
	}
	kvmem_backend_close(e);
	test_model_free(m);
}

static void test_same_as_in_line(void **state)
{
	same_as_in_line(g_seed, 3);
}

/* A device backend hands even a decode step's one token to the worker;
 * forced here on the cpu backend, with decodes long enough to select in
 * the middle. */
static void test_decode_on_worker(void **state)
{
	setenv("KVMEM_WRITER_MIN", "1", 1);
	same_as_in_line(g_seed ^ 0xdec0de, 150);
	unsetenv("KVMEM_WRITER_MIN");
}

/* A write that fails on the writer thread: the append reports it (the
 * worker's message, not a generic one) and the session refuses to go on. */
static void test_failed_write(void **state)
{
	uint64_t rng = g_seed ^ 0xfa11;
	kvmem_config c = test_model_config(2, 32, 4, 2, 16, 48, 61, 1);
	kvmem_model *m = test_model_random(&c, (uint64_t)test_rng_int(&rng, 1, 1 << 30));
	kvmem_backend *e = kvmem_backend_cpu(m, 128);
	int32_t tok[640];
	struct run a;

	for (int i = 0; i < 640; i++)
		tok[i] = test_rng_int(&rng, 0, c.vocab - 1);
	run_open(&a, e, &c, 0, 0);
	g_src.writes = 0;
	/* a write of the third chunk (2 layers x 8 blocks a chunk) */
	g_src.fail_at = 2 * 2 * 8 + test_rng_int(&rng, 1, 16);
	assert_int_equal(kvmem_session_append(a.s, tok, 640, 0), -EIO);
	assert_non_null(strstr(kvmem_last_error(), "injected write failure"));
	g_src.fail_at = 0;
	assert_int_equal(kvmem_session_append(a.s, tok, 16, 0), -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "unusable"));
	run_close(&a);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* The same in a decode whose tokens go to the worker. A write of a token
 * before the last fails the decode itself; the last token's rows are put
 * away after the decode returned (writer.c: the wait falls in the next
 * step), so their failure is reported by the next call that waits, here
 * kvmem_session_sync, with the worker's message, unless
 * KVMEM_WRITER_DEFER=0 makes the decode wait at its end. Either way
 * nothing runs after it. */
static void failed_write_in_decode(uint64_t rng, int in_last, int defer)
{
	enum { N = 40, LAYERS = 2 };
	kvmem_config c = test_model_config(LAYERS, 32, 4, 2, 16, 48, 61, 1);
	kvmem_model *m = test_model_random(&c, (uint64_t)test_rng_int(&rng, 1, 1 << 30));
	kvmem_backend *e = kvmem_backend_cpu(m, 128);
	int32_t tok[64], out[N];
	struct run a;

	for (int i = 0; i < 64; i++)
		tok[i] = test_rng_int(&rng, 0, c.vocab - 1);
	setenv("KVMEM_WRITER_MIN", "1", 1);
	if (!defer)
		setenv("KVMEM_WRITER_DEFER", "0", 1);
	run_open(&a, e, &c, 0, 0);
	assert_int_equal(kvmem_session_append(a.s, tok, 64, 0), 0);
	g_src.writes = 0;
	/* one of the decode's writes (a job a token, LAYERS writes a job) */
	g_src.fail_at = in_last ? test_rng_int(&rng, LAYERS * (N - 1) + 1, LAYERS * N)
				: test_rng_int(&rng, 1, LAYERS * (N - 1));
	if (in_last && defer) {
		assert_int_equal(kvmem_session_decode(a.s, N, NULL, out), 0);
		assert_int_equal(kvmem_session_sync(a.s), -EIO);
	} else {
		assert_int_equal(kvmem_session_decode(a.s, N, NULL, out), -EIO);
	}
	assert_non_null(strstr(kvmem_last_error(), "injected write failure"));
	assert_true(g_src.writes >= g_src.fail_at);
	g_src.fail_at = 0;
	assert_int_equal(kvmem_session_decode(a.s, 1, NULL, out), -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "unusable"));
	assert_int_equal(kvmem_session_sync(a.s), -EINVAL);
	run_close(&a);
	unsetenv("KVMEM_WRITER_MIN");
	unsetenv("KVMEM_WRITER_DEFER");
	kvmem_backend_close(e);
	test_model_free(m);
}

static void test_failed_write_in_decode(void **state)
{
	failed_write_in_decode(g_seed ^ 0xdead, 0, 1);
}

static void test_failed_write_of_last_token(void **state)
{
	failed_write_in_decode(g_seed ^ 0x1a57, 1, 1);
}

static void test_failed_write_of_last_token_no_defer(void **state)
{
	failed_write_in_decode(g_seed ^ 0xde7e, 1, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_same_as_in_line),
		cmocka_unit_test(test_failed_write),
		cmocka_unit_test(test_decode_on_worker),
		cmocka_unit_test(test_failed_write_in_decode),
		cmocka_unit_test(test_failed_write_of_last_token),
		cmocka_unit_test(test_failed_write_of_last_token_no_defer),
	};

	g_seed = test_rng_fresh_seed("test_ws_writer");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

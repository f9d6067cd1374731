// SPDX-License-Identifier: MIT
/*
 * An append's forward passes (user/session/session.c): only the last
 * chunk's logits are computed when nobody reads the others (no on_forward,
 * no all_logits), and the logits and the tokens decoded from them are the
 * bits of a session that computed every chunk's. A failed chunk after
 * logit-less ones leaves no logits to decode from (they would be an older
 * token's). The append's split of its time (kvmem_session_stats: before
 * each forward, the view's reserve, the writer's start and its index and
 * pages, the last job's wait, the forwards whose pages the backend wrote)
 * is filled in.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend_impl.h"
#include "kvmem/kvmem.h"
#include "kvmem/session.h"
#include "helpers/test_model.h"

static uint64_t g_seed;
static const kvmem_backend_ops *g_real;
static int g_calls, g_with_logits, g_fail_at;

/* The cpu forward, its calls counted (those asked for logits apart), and
 * the g_fail_at-th failed on demand. */
static int counted_forward(void *ctx, kvmem_view *v, const int32_t *tok, int n, float *logits,
			   int all, const kvmem_fwd_out *out)
{
	if (++g_calls == g_fail_at)
		return kvmem_error(EIO, "injected forward failure");
	g_with_logits += logits != NULL;
	return g_real->forward(ctx, v, tok, n, logits, all, out);
}

static int n_fwd;

static void on_fwd(void *arg, const int32_t *tok, int n, const float *logits)
{
	n_fwd++;
}

struct fixture {
	kvmem_config c;
	kvmem_model *m;
	kvmem_backend *e;
	kvmem_backend_ops ops;
};

static void fx_open(struct fixture *f, uint64_t *rng)
{
	f->c = test_model_config(2, 32, 4, 2, 16, 48, 61, 0);
	f->m = test_model_random(&f->c, test_rng_next(rng));
	f->e = kvmem_backend_cpu(f->m, 16);
	assert_non_null(f->e);
	g_real = f->e->ops;
	f->ops = *f->e->ops;
	f->ops.forward = counted_forward;
	f->e->ops = &f->ops;
}

static void fx_close(struct fixture *f)
{
	f->e->ops = g_real;
	kvmem_backend_close(f->e);
	test_model_free(f->m);
}

static kvmem_session *open_session(struct fixture *f, int every)
{
	kvmem_session_opts o;
	kvmem_session *s;

	kvmem_session_opts_default(&o);
	o.block = 16;
	o.chunk = 16;
	if (every)
		o.on_forward = on_fwd;
	s = kvmem_session_create(f->e, &o);
	assert_non_null(s);
	return s;
}

static void test_last_chunk_logits(void **state)
{
	uint64_t rng = g_seed ^ 0x1061;
	struct fixture f;
	int32_t tok[100], da[6], db[6];
	kvmem_session *a, *b;

	fx_open(&f, &rng);
	for (int i = 0; i < 100; i++)
		tok[i] = test_rng_int(&rng, 0, f.c.vocab - 1);
	/* 100 tokens in chunks of 16: 7 forwards, the last one's logits */
	a = open_session(&f, 0);
	g_calls = g_with_logits = 0;
	assert_int_equal(kvmem_session_append(a, tok, 100, 0), 0);
	assert_int_equal(g_calls, 7);
	assert_int_equal(g_with_logits, 1);
	/* the twin reads every forward's logits: all computed */
	b = open_session(&f, 1);
	g_calls = g_with_logits = n_fwd = 0;
	assert_int_equal(kvmem_session_append(b, tok, 100, 0), 0);
	assert_int_equal(g_with_logits, 7);
	assert_int_equal(n_fwd, 7);
	assert_non_null(kvmem_session_logits(a));
	assert_memory_equal(kvmem_session_logits(a), kvmem_session_logits(b),
			    sizeof(float) * f.c.vocab);
	/* a decode step computes its logits; a short append its one chunk's */
	g_calls = g_with_logits = 0;
	assert_int_equal(kvmem_session_decode(a, 3, NULL, da), 0);
	assert_int_equal(g_with_logits, 3);
	assert_int_equal(kvmem_session_append(a, tok, 10, 0), 0);
	assert_int_equal(g_with_logits, 4);
	assert_int_equal(kvmem_session_decode(a, 3, NULL, da + 3), 0);
	assert_int_equal(kvmem_session_decode(b, 3, NULL, db), 0);
	assert_int_equal(kvmem_session_append(b, tok, 10, 0), 0);
	assert_int_equal(kvmem_session_decode(b, 3, NULL, db + 3), 0);
	assert_memory_equal(da, db, sizeof(da));
	assert_memory_equal(kvmem_session_logits(a), kvmem_session_logits(b),
			    sizeof(float) * f.c.vocab);
	kvmem_session_free(a);
	kvmem_session_free(b);
	fx_close(&f);
}

/* The 4th of 7 forwards fails: the 3 before computed no logits, so none
 * are left to decode from; the error is the forward's. */
static void test_failed_chunk(void **state)
{
	uint64_t rng = g_seed ^ 0xfa1;
	struct fixture f;
	int32_t tok[100], out;
	kvmem_session *a;

	fx_open(&f, &rng);
	for (int i = 0; i < 100; i++)
		tok[i] = test_rng_int(&rng, 0, f.c.vocab - 1);
	a = open_session(&f, 0);
	assert_int_equal(kvmem_session_append(a, tok, 20, 0), 0);	/* logits there */
	assert_non_null(kvmem_session_logits(a));
	g_calls = 0;
	g_fail_at = 4;
	assert_true(kvmem_session_append(a, tok, 100, 0) < 0);
	g_fail_at = 0;
	assert_non_null(strstr(kvmem_last_error(), "injected forward failure"));
	assert_null(kvmem_session_logits(a));
	assert_int_equal(kvmem_session_decode(a, 1, NULL, &out), -EINVAL);
	kvmem_session_free(a);
	fx_close(&f);
}

/* With the writer taking every job (KVMEM_WRITER_MIN=1), a prefill's time
 * is split: each part that ran is counted, the writer's parts fit in its
 * time, and the cpu backend wrote no pages itself. */
static void test_split(void **state)
{
	uint64_t rng = g_seed ^ 0x5b1;
	struct fixture f;
	int32_t tok[200];
	kvmem_session *a;
	kvmem_session_stats st;

	setenv("KVMEM_WRITER_MIN", "1", 1);
	fx_open(&f, &rng);
	for (int i = 0; i < 200; i++)
		tok[i] = test_rng_int(&rng, 0, f.c.vocab - 1);
	a = open_session(&f, 0);
	assert_int_equal(kvmem_session_append(a, tok, 200, 0), 0);
	kvmem_session_get_stats(a, &st);
	assert_int_equal(st.forwards, 13);
	assert_int_equal(st.page_forwards, 0);
	assert_true(st.forward_ns > 0 && st.begin_ns > 0 && st.reserve_ns > 0);
	assert_true(st.writer_start_ns > 0 && st.last_wait_ns > 0);
	assert_true(st.last_wait_ns <= st.writer_wait_ns);
	assert_true(st.writer_index_ns > 0 && st.writer_pages_ns > 0);
	assert_true(st.writer_index_ns + st.writer_pages_ns <= st.writer_ns);
	assert_int_equal(st.store_ns, 0);	/* nothing in line */
	kvmem_session_free(a);
	fx_close(&f);
	unsetenv("KVMEM_WRITER_MIN");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_last_chunk_logits),
		cmocka_unit_test(test_failed_chunk),
		cmocka_unit_test(test_split),
	};

	g_seed = test_rng_fresh_seed("test_ws_append");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

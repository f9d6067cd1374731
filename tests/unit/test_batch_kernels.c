// SPDX-License-Identifier: MIT
/*
 * Batch invariance below the session: the pieces of a batched forward give
 * each row, query and sequence the bits it gets alone (memcmp), at 1, 2
 * and 3 threads, on fresh random inputs (KVMEM_TEST_SEED replays them).
 *
 *  - kvmem_matmul: a row of y is the same whether computed alone, in any
 *    group of rows, or in the whole batch; for every instruction set the
 *    CPU has; within 1e-5 * sum |x w| of a double reference; and every
 *    element bit for bit the lanes and tree the kernel's comment promises.
 *  - kvmem_attention_batch: each sequence (its own view, length, stride)
 *    equals kvmem_attention over it alone.
 *  - kvmem_pool_run, which runs a batched decode step's matmuls and
 *    attention: every chunk exactly once (also with callers on several
 *    threads at once and inside OpenMP regions), on a worker as well as
 *    the caller at 2 threads, on the caller alone at 1.
 *  - kvmem_forward_batch: sequences of different view lengths, prefill
 *    chunks beside one-token steps, some wanting every row's logits and
 *    queries: logits, raw rows, queries and the views themselves equal
 *    kvmem_forward of each sequence alone.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "kernels/kernels.h"
#include "helpers/test_model.h"

static uint64_t g_seed;

static uint64_t rng_for(const char *name)
{
	return test_rng_named(g_seed, name);
}


/* ---- matmul ------------------------------------------------------------- */

/* Every row of one product of n rows against the same rows computed in
 * random groups (alone among them), at thread count `threads`. */
static void matmul_case(uint64_t *r, int n, int in, int out, const char *isa)
{
	float *x = test_rand_floats(r, (size_t)n * in, -2, 2);
	float *w = test_rand_floats(r, (size_t)out * in, -1, 1);
	float *all = test_rand_floats(r, (size_t)n * out, -9, 9);
	float *part = test_rand_floats(r, (size_t)n * out, 7, 9);
	int saved = omp_get_max_threads();

	omp_set_num_threads(1);
	kvmem_matmul(all, x, w, n, in, out);
	/* Against the reference, every row. */
	for (int i = 0; i < n; i++)
		for (int o = 0; o < out; o++) {
			double ref = 0, mag = 0;

			for (int k = 0; k < in; k++) {
				double t = (double)x[(size_t)i * in + k] * w[(size_t)o * in + k];

				ref += t;
				mag += fabs(t);
			}
			if (fabs(all[(size_t)i * out + o] - ref) > 1e-5 * mag + 1e-30)
				fail_msg("matmul %s n=%d in=%d out=%d [%d][%d]: %g vs %g", isa, n, in, out,
					 i, o, all[(size_t)i * out + o], ref);
		}
	for (int threads = 1; threads <= 3; threads++) {
		omp_set_num_threads(threads);
		/* The rows in groups of random sizes, each group a call. */
		for (int i = 0; i < n;) {
			int g = test_rng_int(r, 1, n - i);

			kvmem_matmul(part + (size_t)i * out, x + (size_t)i * in, w, g, in, out);
			i += g;
		}
		for (int i = 0; i < n; i++)
			if (memcmp(part + (size_t)i * out, all + (size_t)i * out, sizeof(float) * out))
				fail_msg("matmul %s n=%d in=%d out=%d: row %d differs in a smaller batch "
					 "at %d threads", isa, n, in, out, i, threads);
		/* The whole batch again at this thread count. */
		kvmem_matmul(part, x, w, n, in, out);
		assert_memory_equal(part, all, sizeof(float) * n * out);
	}
	omp_set_num_threads(saved);
	free(x);
	free(w);
	free(all);
	free(part);
}

static void test_matmul_rows_invariant(void **state)
{
	static const char *const isas[] = { "avx512", "avx2", "c" };
	const char *best = kvmem_matmul_isa();
	uint64_t r = rng_for("matmul-rows");
	int tried = 0;

	for (int v = 0; v < 3; v++) {
		if (kvmem_matmul_use(isas[v]) == -ENOTSUP)
			continue;
		assert_string_equal(kvmem_matmul_isa(), isas[v]);
		tried++;
		/* Odd sizes (tails of every tile and vector), and a product large
		 * enough that the threads split it. */
		matmul_case(&r, test_rng_int(&r, 1, 9), test_rng_int(&r, 1, 70), test_rng_int(&r, 1, 40),
			    isas[v]);
		matmul_case(&r, test_rng_int(&r, 5, 70), test_rng_int(&r, 100, 300),
			    test_rng_int(&r, 30, 200), isas[v]);
		matmul_case(&r, 67, 259, 150, isas[v]);
	}
	assert_true(tried >= 1);
	assert_int_equal(kvmem_matmul_use("nonsense"), -EINVAL);
	assert_int_equal(kvmem_matmul_use(best), 0);
}

/* One element as the kernels promise to sum it, at every instruction set:
 * one chain of fused multiply-adds over k, in order, from zero. */
static float chain_as_promised(const float *x, const float *w, int in)
{
	float s = 0.0f;

	for (int k = 0; k < in; k++)
		s = fmaf(x[k], w[k], s);
	return s;
}

static void expect_promised(const float *y, const float *x, const float *w, int n, int in, int out,
			    const char *what, const char *isa)
{
	for (int i = 0; i < n; i++)
		for (int o = 0; o < out; o++) {
			float want = chain_as_promised(x + (size_t)i * in, w + (size_t)o * in, in);
			float got = y[(size_t)i * out + o];

			if (memcmp(&got, &want, sizeof(float)))
				fail_msg("%s %s n=%d in=%d out=%d [%d][%d]: %a, promised %a", what, isa,
					 n, in, out, i, o, got, want);
		}
}

/* Every element of one product of n rows, bit for bit against
 * chain_as_promised: kvmem_matmul and kvmem_matmul_panels_f32 over fp32
 * weights, and kvmem_matmul_bf16w and kvmem_matmul_panels over bf16 ones
 * (against the widened values). Any
 * tile shape that regroups a sum fails here, and since the promise is the
 * same at every instruction set, so does any set whose bits differ. */
static void matmul_exact_case(uint64_t *r, int n, int in, int out, const char *isa)
{
	float *x = test_rand_floats(r, (size_t)n * in, -2, 2);
	float *w = test_rand_floats(r, (size_t)out * in, -1, 1);
	float *y = test_rand_floats(r, (size_t)n * out, -9, 9);
	uint16_t *w16 = malloc(sizeof(uint16_t) * (size_t)out * in);
	uint16_t *p = malloc(sizeof(uint16_t) * (kvmem_panels_count(in, out) + 1));
	float *pf = malloc(sizeof(float) * (kvmem_panels_count(in, out) + 1));

	assert_true(w16 && p && pf);
	kvmem_matmul(y, x, w, n, in, out);
	expect_promised(y, x, w, n, in, out, "matmul", isa);
	kvmem_panels_pack_f32(pf, w, in, out);
	kvmem_matmul_panels_f32(y, x, pf, n, in, out);
	expect_promised(y, x, w, n, in, out, "matmul_panels_f32", isa);
	for (size_t i = 0; i < (size_t)out * in; i++) {
		w16[i] = kvmem_f32_to_bf16(w[i]);
		w[i] = kvmem_bf16_to_f32(w16[i]);
	}
	kvmem_matmul_bf16w(y, x, w16, n, in, out);
	expect_promised(y, x, w, n, in, out, "matmul_bf16w", isa);
	kvmem_panels_pack(p, w16, in, out);
	kvmem_matmul_panels(y, x, p, n, in, out);
	expect_promised(y, x, w, n, in, out, "matmul_panels", isa);
	free(x);
	free(w);
	free(y);
	free(w16);
	free(p);
	free(pf);
}

static void test_matmul_arithmetic_exact(void **state)
{
	static const char *const isas[] = { "avx512", "avx2", "c" };
	/* Row counts at and around each tile's height (a lane a row: 8, 16
	 * and 32 rows; a lane a column: 1, 2 and 8 rows), the 8 of a batched
	 * decode step, a prefill chunk's odd 65. */
	static const int rows[] = { 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 65 };
	const char *best = kvmem_matmul_isa();
	uint64_t r = rng_for("matmul-exact");
	int tried = 0;

	(void)state;
	for (int v = 0; v < 3; v++) {
		if (kvmem_matmul_use(isas[v]) == -ENOTSUP)
			continue;
		tried++;
		for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
			matmul_exact_case(&r, rows[i], test_rng_int(&r, 1, 300),
					  test_rng_int(&r, 1, 140), isas[v]);
		/* The decode step's shapes at 8 rows and 1, with column tails
		 * (a panel is 32 columns; a pool chunk 4 panels). */
		matmul_exact_case(&r, 8, 256, 130, isas[v]);
		matmul_exact_case(&r, 8, 768, 257, isas[v]);
		matmul_exact_case(&r, 1, 256, 1536, isas[v]);
	}
	assert_true(tried >= 2);	/* c, and what this CPU has */
	assert_int_equal(kvmem_matmul_use(best), 0);
}

/* ---- attention ---------------------------------------------------------- */

static void test_attention_batch_equals_alone(void **state)
{
	uint64_t r = rng_for("attention-batch");

	for (int trial = 0; trial < 4; trial++) {
		int n_seqs = test_rng_int(&r, 1, 9), heads = 8, kvh = test_rng_int(&r, 1, 2) * 2;
		int d = 2 * test_rng_int(&r, 4, 40), rows = 0;
		kvmem_att_seq *seqs = calloc((size_t)n_seqs, sizeof(*seqs));
		int32_t *pos = malloc(sizeof(int32_t) * 4096);
		float *q, *out, *alone;

		for (int t = 0; t < 4096; t++)
			pos[t] = t;
		for (int s = 0; s < n_seqs; s++) {
			int n_kv = test_rng_int(&r, 0, 400), n_q = test_rng_int(&r, 1, 6);
			size_t stride = (size_t)n_kv + test_rng_int(&r, 0, 50);

			seqs[s] = (kvmem_att_seq){ .q0 = rows, .n_q = n_q, .n_kv = n_kv,
						   .kv_stride = stride, .kv_pos = pos };
			seqs[s].k = test_rand_floats(&r, (size_t)kvh * stride * d, -1, 1);
			seqs[s].v = test_rand_floats(&r, (size_t)kvh * stride * d, -1, 1);
			int32_t *qp = malloc(sizeof(int32_t) * n_q);

			/* Queries at the end of their view (decode, a chunk), or
			 * short of it (a causal mask inside the view). */
			for (int i = 0; i < n_q; i++)
				qp[i] = n_kv - n_q + i >= 0 ? n_kv - n_q + i : test_rng_int(&r, 0, 5);
			seqs[s].q_pos = qp;
			rows += n_q;
		}
		q = test_rand_floats(&r, (size_t)rows * heads * d, -1, 1);
		out = test_rand_floats(&r, (size_t)rows * heads * d, 5, 6);
		alone = test_rand_floats(&r, (size_t)rows * heads * d, 7, 8);
		for (int s = 0; s < n_seqs; s++) {
			const kvmem_att_seq *a = &seqs[s];
			size_t at = (size_t)a->q0 * heads * d;

			kvmem_attention(alone + at, q + at, a->q_pos, a->n_q, a->k, a->v, a->kv_pos, a->n_kv,
					a->kv_stride, heads, kvh, d, 0.125f);
		}
		for (int threads = 1; threads <= 3; threads++) {
			int saved = omp_get_max_threads();

			omp_set_num_threads(threads);
			kvmem_attention_batch(out, q, seqs, n_seqs, heads, kvh, d, 0.125f);
			omp_set_num_threads(saved);
			assert_memory_equal(out, alone, sizeof(float) * rows * heads * d);
		}
		for (int s = 0; s < n_seqs; s++) {
			free((void *)seqs[s].k);
			free((void *)seqs[s].v);
			free((void *)seqs[s].q_pos);
		}
		free(seqs);
		free(pos);
		free(q);
		free(out);
		free(alone);
	}
}

/* ---- the kernels' pool ---------------------------------------------------- */

struct pool_count {
	atomic_int *ran;	/* [n] times chunk c ran */
	atomic_int off_caller;	/* chunks run on another thread than the caller */
	pthread_t caller;
	int wait_for_peer;	/* chunk 0 waits (up to 20 ms) for a chunk run elsewhere */
	long hold_ns;		/* the first chunk run elsewhere sleeps this long */
	atomic_int held;
};

static void count_chunk(void *arg, int c)
{
	struct pool_count *p = arg;

	atomic_fetch_add(&p->ran[c], 1);
	if (!pthread_equal(pthread_self(), p->caller)) {
		atomic_fetch_add(&p->off_caller, 1);
		if (p->hold_ns && !atomic_exchange(&p->held, 1))	/* as if descheduled */
			nanosleep(&(struct timespec){ .tv_sec = p->hold_ns / 1000000000L,
						      .tv_nsec = p->hold_ns % 1000000000L }, NULL);
	}
	if (c == 0 && p->wait_for_peer)
		for (int i = 0; i < 200 && !atomic_load(&p->off_caller); i++)
			nanosleep(&(struct timespec){ .tv_nsec = 100000 }, NULL);
}

/* kvmem_pool_run(n) on this thread: each chunk ran once; returns how many
 * ran on other threads. */
static int pool_once_held(int n, int wait_for_peer, long hold_ns)
{
	struct pool_count p = { .caller = pthread_self(), .wait_for_peer = wait_for_peer,
				.hold_ns = hold_ns };
	int off;

	p.ran = calloc((size_t)(n > 0 ? n : 1), sizeof(*p.ran));
	assert_non_null(p.ran);
	kvmem_pool_run(n, count_chunk, &p);
	for (int c = 0; c < n; c++)
		if (atomic_load(&p.ran[c]) != 1)
			fail_msg("pool job of %d chunks: chunk %d ran %d times", n, c,
				 atomic_load(&p.ran[c]));
	off = atomic_load(&p.off_caller);
	free(p.ran);
	return off;
}

static int pool_once_each(int n, int wait_for_peer)
{
	return pool_once_held(n, wait_for_peer, 0);
}

static void *pool_caller(void *arg)
{
	uint64_t r = *(uint64_t *)arg;

	for (int i = 0; i < 300; i++)
		pool_once_each(test_rng_int(&r, 0, 200), 0);
	return NULL;
}

static void test_pool_each_chunk_once(void **state)
{
	static const int sizes[] = { 0, 1, 2, 3, 7, 64, 1000, 5000 };
	uint64_t r = rng_for("pool"), seeds[3];
	int saved = omp_get_max_threads();
	pthread_t t[3];

	(void)state;
	for (int threads = 1; threads <= 3; threads++) {
		omp_set_num_threads(threads);
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
			for (int k = 0; k < 20; k++) {
				int off = pool_once_each(sizes[i], 0);

				if (threads == 1 && off)
					fail_msg("1 thread: %d chunks of %d ran off the caller", off,
						 sizes[i]);
			}
	}
	omp_set_num_threads(saved > 1 ? saved : 2);
	/* Callers on several threads at once: one has the pool, the others
	 * run their own chunks; nothing is lost or run twice. */
	for (int i = 0; i < 3; i++) {
		seeds[i] = test_rng_next(&r);
		assert_int_equal(pthread_create(&t[i], NULL, pool_caller, &seeds[i]), 0);
	}
	pool_caller(&(uint64_t){ test_rng_next(&r) });
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	/* Inside an OpenMP region each thread's job stays on that thread. */
	#pragma omp parallel num_threads(2)
	{
		int off = pool_once_each(100, 0);

		if (off)
			fail_msg("inside an OpenMP region %d chunks ran off their caller", off);
	}
	omp_set_num_threads(saved);
}

/* At 2 threads a worker takes chunks: the caller's first chunk waits for
 * one to run elsewhere. Tried again for up to 10 s, since a caller whose
 * workers cost more than they saved runs alone for a while (up to 256 ms). */
static void test_pool_worker_takes_chunks(void **state)
{
	int saved = omp_get_max_threads(), off = 0;
	struct timespec t0, t;

	(void)state;
	omp_set_num_threads(2);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		off = pool_once_each(64, 1);
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while (!off && t.tv_sec - t0.tv_sec < 10);
	omp_set_num_threads(saved);
	if (!off)
		fail_msg("no pool worker took a chunk in 10 s at 2 threads");
}

static long mono_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* A worker that holds its chunk for 150 ms (as one descheduled by another
 * process would) costs the caller more than the pool saved in its window
 * (100 ms): the caller's next job, right after, runs alone (for 8 ms at
 * least). Tried again where the worker took no chunk or this thread was
 * away for more than 4 ms between the two jobs. */
static void test_pool_backs_off_after_a_loss(void **state)
{
	int saved = omp_get_max_threads(), tries = 0, checked = 0;

	(void)state;
	omp_set_num_threads(2);
	while (!checked && tries++ < 50) {
		long t;

		if (!pool_once_held(64, 1, 150000000L))
			continue;
		t = mono_ns();
		int off = pool_once_each(64, 0);

		if (mono_ns() - t > 4000000L)
			continue;
		if (off)
			fail_msg("after a 150 ms wait for its worker the caller's next job ran "
				 "%d chunks off it", off);
		checked = 1;
	}
	omp_set_num_threads(saved);
	if (!checked)
		fail_msg("no job with a worker's chunk held in %d tries", tries - 1);
}

/* ---- the engine's batched forward ---------------------------------------- */

struct seq_case {
	kvmem_kvcache kv, twin;
	int32_t tok[16];
	int n, all, q_last, want_logits, want_out;
	float *logits, *logits_twin;
	float *raw_k, *v, *q, *raw_k_twin, *v_twin, *q_twin;
	kvmem_fwd_out out, out_twin;
};

static void expect_views_equal(const kvmem_kvcache *a, const kvmem_kvcache *b, int s)
{
	assert_int_equal(a->len, b->len);
	for (int l = 0; l < a->n_layers; l++)
		for (int h = 0; h < a->n_kv_heads; h++)
			if (memcmp(kvmem_kv_k(a, l, h, 0), kvmem_kv_k(b, l, h, 0),
				   sizeof(float) * a->len * a->head_dim) ||
			    memcmp(kvmem_kv_v(a, l, h, 0), kvmem_kv_v(b, l, h, 0),
				   sizeof(float) * a->len * a->head_dim))
				fail_msg("sequence %d: its view differs at layer %d, KV head %d", s, l, h);
}

static void test_forward_batch_equals_alone(void **state)
{
	uint64_t r = rng_for("forward-batch");
	const int chunk = 16;

	for (int trial = 0; trial < 3; trial++) {
		kvmem_config c = test_model_config(test_rng_int(&r, 1, 3), 64, 4,
						   2 * test_rng_int(&r, 1, 2), 16, 96, 97, trial & 1);
		kvmem_model *m = test_model_random(&c, test_rng_next(&r));
		kvmem_engine *e = kvmem_engine_create(m, chunk), *e1 = kvmem_engine_create(m, chunk);
		const int n_seqs = test_rng_int(&r, 2, 12);
		struct seq_case *sc = calloc((size_t)n_seqs, sizeof(*sc));
		kvmem_fwd_seq *seqs = calloc((size_t)n_seqs, sizeof(*seqs));
		const size_t kw = (size_t)c.n_kv_heads * c.head_dim, qw = (size_t)c.n_heads * c.head_dim;

		assert_non_null(e);
		assert_non_null(e1);
		for (int s = 0; s < n_seqs; s++) {
			struct seq_case *x = &sc[s];
			int len = test_rng_int(&r, 0, 60), cap = len + chunk + test_rng_int(&r, 0, 9);

			assert_int_equal(kvmem_kvcache_init(&x->kv, &c, cap), 0);
			assert_int_equal(kvmem_kvcache_init(&x->twin, &c, cap), 0);
			/* A history of its own length, grown the same in both. */
			for (int at = 0; at < len;) {
				int k = len - at < chunk ? len - at : chunk;
				int32_t t[16];

				for (int i = 0; i < k; i++)
					t[i] = test_rng_int(&r, 0, c.vocab - 1);
				assert_int_equal(kvmem_forward(e1, &x->kv, t, k, NULL, 0, NULL), 0);
				assert_int_equal(kvmem_forward(e1, &x->twin, t, k, NULL, 0, NULL), 0);
				at += k;
			}
			/* A decode step or a prefill chunk. */
			x->n = test_rng_uniform(&r) < 0.5 ? 1 : test_rng_int(&r, 2, chunk);
			for (int i = 0; i < x->n; i++)
				x->tok[i] = test_rng_int(&r, 0, c.vocab - 1);
			x->all = test_rng_uniform(&r) < 0.3;
			x->want_logits = test_rng_uniform(&r) < 0.9;
			x->want_out = test_rng_uniform(&r) < 0.7;
			x->q_last = test_rng_int(&r, 0, 4);
			size_t lg = (size_t)(x->all ? x->n : 1) * c.vocab;
			size_t rows = (size_t)c.n_layers * x->n * kw;
			size_t qrows = (size_t)c.n_layers * kvmem_fwd_q_rows(&(kvmem_fwd_out){ .q_last = x->q_last }, x->n) * qw;

			x->logits = test_rand_floats(&r, lg, 1, 2);
			x->logits_twin = test_rand_floats(&r, lg, 3, 4);
			x->raw_k = test_rand_floats(&r, rows, 0, 1);
			x->v = test_rand_floats(&r, rows, 0, 1);
			x->q = test_rand_floats(&r, qrows, 0, 1);
			x->raw_k_twin = test_rand_floats(&r, rows, 2, 3);
			x->v_twin = test_rand_floats(&r, rows, 2, 3);
			x->q_twin = test_rand_floats(&r, qrows, 2, 3);
			x->out = (kvmem_fwd_out){ .raw_k = x->raw_k, .v = x->v, .q_raw = x->q,
						  .q_last = x->q_last };
			x->out_twin = (kvmem_fwd_out){ .raw_k = x->raw_k_twin, .v = x->v_twin,
						       .q_raw = x->q_twin, .q_last = x->q_last };
			seqs[s] = (kvmem_fwd_seq){ .kv = &x->kv, .tokens = x->tok, .n = x->n,
						   .logits = x->want_logits ? x->logits : NULL,
						   .all_logits = x->all,
						   .out = x->want_out ? &x->out : NULL };
		}
		for (int s = 0; s < n_seqs; s++) {	/* alone, one thread */
			struct seq_case *x = &sc[s];
			int saved = omp_get_max_threads();

			omp_set_num_threads(1);
			assert_int_equal(kvmem_forward(e1, &x->twin, x->tok, x->n,
						       x->want_logits ? x->logits_twin : NULL, x->all,
						       x->want_out ? &x->out_twin : NULL), 0);
			omp_set_num_threads(saved);
		}
		{
			int saved = omp_get_max_threads();

			omp_set_num_threads(test_rng_int(&r, 1, 3));
			assert_int_equal(kvmem_forward_batch(e, seqs, n_seqs), 0);
			omp_set_num_threads(saved);
		}
		for (int s = 0; s < n_seqs; s++) {
			struct seq_case *x = &sc[s];
			size_t lg = (size_t)(x->all ? x->n : 1) * c.vocab;

			expect_views_equal(&x->kv, &x->twin, s);
			if (x->want_logits && memcmp(x->logits, x->logits_twin, sizeof(float) * lg))
				fail_msg("sequence %d (%d tokens): logits differ in the batch", s, x->n);
			if (x->want_out) {
				size_t rows = (size_t)c.n_layers * x->n * kw;
				size_t qrows = (size_t)c.n_layers * kvmem_fwd_q_rows(&x->out, x->n) * qw;

				assert_memory_equal(x->raw_k, x->raw_k_twin, sizeof(float) * rows);
				assert_memory_equal(x->v, x->v_twin, sizeof(float) * rows);
				assert_memory_equal(x->q, x->q_twin, sizeof(float) * qrows);
			}
		}
		/* A batch that cannot run changes nothing: a token outside the
		 * vocabulary in the last sequence; two sequences on one view. */
		{
			int32_t bad = c.vocab;
			kvmem_fwd_seq keep = seqs[n_seqs - 1];
			int len0 = sc[0].kv.len;

			seqs[n_seqs - 1].tokens = &bad;
			seqs[n_seqs - 1].n = 1;
			assert_true(kvmem_forward_batch(e, seqs, n_seqs) < 0);
			assert_int_equal(sc[0].kv.len, len0);
			seqs[n_seqs - 1] = keep;
			seqs[n_seqs - 1].kv = seqs[0].kv;
			assert_int_equal(kvmem_forward_batch(e, seqs, n_seqs), -EINVAL);
			assert_int_equal(sc[0].kv.len, len0);
			assert_int_equal(kvmem_forward_batch(e, seqs, 0), -EINVAL);
		}
		for (int s = 0; s < n_seqs; s++) {
			struct seq_case *x = &sc[s];

			kvmem_kvcache_free(&x->kv);
			kvmem_kvcache_free(&x->twin);
			free(x->logits);
			free(x->logits_twin);
			free(x->raw_k);
			free(x->v);
			free(x->q);
			free(x->raw_k_twin);
			free(x->v_twin);
			free(x->q_twin);
		}
		free(sc);
		free(seqs);
		kvmem_engine_free(e);
		kvmem_engine_free(e1);
		test_model_free(m);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_matmul_rows_invariant),
		cmocka_unit_test(test_matmul_arithmetic_exact),
		cmocka_unit_test(test_attention_batch_equals_alone),
		cmocka_unit_test(test_pool_each_chunk_once),
		cmocka_unit_test(test_pool_worker_takes_chunks),
		cmocka_unit_test(test_pool_backs_off_after_a_loss),
		cmocka_unit_test(test_forward_batch_equals_alone),
	};

	g_seed = test_rng_fresh_seed("test_batch_kernels");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

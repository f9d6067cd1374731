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
 * is filled in. The index's summaries made by a backend (index_rows, as
 * the cuda one makes them on the device; played here by the cpu backend
 * and the CPU twin of the device kernel) give the index, the plans and the
 * logits of the host summing the same bf16 rows, bit for bit; with
 * KVMEM_TEST_BACKEND=cuda the same with the GPU's kernel, and the pinned
 * rows the backend keeps for the next session (tests/gpu/prefill24.sh).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "backend/backend_impl.h"
#include "kvmem/kvmem.h"
#include "kernels/kernels_bf16.h"
#include "kvmem/session.h"
#include "select/select.h"
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

static void fx_open(struct fixture *f, uint64_t *rng, int max_chunk)
{
	f->c = test_model_config(2, 32, 4, 2, 16, 48, 61, 0);
	f->m = test_model_random(&f->c, test_rng_next(rng));
	f->e = kvmem_backend_cpu(f->m, max_chunk);
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

	fx_open(&f, &rng, 16);
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

	fx_open(&f, &rng, 16);
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
	fx_open(&f, &rng, 16);
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

/* ---- the backend under test (KVMEM_TEST_BACKEND) ------------------------ */
static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The backend under test on a small model whose geometry cuda takes, or
 * NULL (the test skipped) on the cpu backend. */
static kvmem_backend *open_test_backend(kvmem_config *c, kvmem_model **m, uint64_t *rng)
{
	kvmem_backend *e;

	if (!strcmp(test_backend_name(), "cpu"))
		return NULL;
	*c = test_model_config(2, 24, 4, 2, 64, 40, 53, 0);
	*m = test_model_random(c, test_rng_next(rng));
	if (kvmem_backend_open(test_backend_name(), *m, &(kvmem_backend_opts){ .max_chunk = 32 },
			       &e) < 0)
		fail_msg("backend: %s", kvmem_last_error());
	return e;
}

/*
 * The backend's pinned rows kept for the next session (cuda: user/backend/
 * cuda_host.c): a 64 MiB buffer freed and asked for again comes back, the
 * same one, in a tenth of the time pinning one took (about 10 ms at the
 * H200 host's 6 GB/s); one asked for while the first is in use, or of
 * another size, is another. With KVMEM_CUDA_HOST_KEEP=0 (every buffer
 * pinned anew, as before) it fails. Skipped on the cpu backend.
 */
/* The test backend when it keeps pinned rows (host_alloc), else NULL with
 * everything given back (the caller skips). */
static kvmem_backend *rows_backend(uint64_t seed, kvmem_model **m)
{
	uint64_t rng = seed;
	kvmem_config c;
	kvmem_backend *e = open_test_backend(&c, m, &rng);

	if (e && e->ops->host_alloc)
		return e;
	if (e)
		kvmem_backend_close(e);
	test_model_free(*m);
	*m = NULL;
	return NULL;
}

static void test_rows_kept(void **state)
{
	const size_t S = (size_t)64 << 20;
	kvmem_model *m = NULL;
	kvmem_backend *e = rows_backend(g_seed ^ 0x6e7, &m);
	void *a = NULL, *b = NULL, *a2 = NULL, *d = NULL;
	double t0, fresh, again;

	if (!e) {
		skip();
		return;
	}
	assert_int_equal(e->ops->host_alloc(e->ctx, S, &a), 0);
	t0 = now_s();
	assert_int_equal(e->ops->host_alloc(e->ctx, S, &b), 0);
	fresh = now_s() - t0;
	assert_ptr_not_equal(a, b);
	memset(a, 1, S);
	e->ops->host_free(e->ctx, a);
	t0 = now_s();
	assert_int_equal(e->ops->host_alloc(e->ctx, S, &a2), 0);
	again = now_s() - t0;
	assert_int_equal(e->ops->host_alloc(e->ctx, S + 4096, &d), 0);
	print_message("rows kept: 64 MiB pinned in %.3f ms, handed again in %.3f ms\n",
		      fresh * 1e3, again * 1e3);
	assert_ptr_equal(a2, a);
	assert_true(again * 10 < fresh);
	assert_true(d != a2 && d != b);
	e->ops->host_free(e->ctx, a2);
	e->ops->host_free(e->ctx, b);
	e->ops->host_free(e->ctx, d);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* More buffers than a session holds: a server's running turns hold four
 * each (64 at 16 turns); every one freed is handed back, none pinned anew. */
static void test_rows_kept_many(void **state)
{
	enum { N = 40 };
	const size_t S = (size_t)8 << 20;
	kvmem_model *m = NULL;
	kvmem_backend *e = rows_backend(g_seed ^ 0x6e8, &m);
	void *a[N], *b[N];
	int back = 0;

	(void)state;
	if (!e) {
		skip();
		return;
	}
	for (int i = 0; i < N; i++)
		assert_int_equal(e->ops->host_alloc(e->ctx, S, &a[i]), 0);
	for (int i = 0; i < N; i++)
		e->ops->host_free(e->ctx, a[i]);
	for (int i = 0; i < N; i++) {
		assert_int_equal(e->ops->host_alloc(e->ctx, S, &b[i]), 0);
		for (int k = 0; k < N; k++)
			back += b[i] == a[k];
	}
	print_message("rows kept: %d of %d buffers of 8 MiB handed back\n", back, N);
	assert_int_equal(back, N);
	for (int i = 0; i < N; i++)
		e->ops->host_free(e->ctx, b[i]);
	kvmem_backend_close(e);
	test_model_free(m);
}

/* ---- a backend that makes the index's summaries ---------------------- */
static kvmem_config g_cfg;
static struct {
	float *win, *st;	/* the "device's" window and running state */
	uint32_t key;
	int64_t upto;
	int calls, fresh;
} g_dev;

static int heap_alloc(void *ctx, size_t bytes, void **p)
{
	*p = malloc(bytes);
	return *p ? 0 : -ENOMEM;
}

static void heap_free(void *ctx, void *p)
{
	free(p);
}

/* What user/backend/cuda_fwd_index.c does, with the kernel's CPU twin: the
 * window starts as NaN, so an entry the session copies that the sums did
 * not write shows in the index. */
static int dev_index(const uint16_t *rk, int n, const kvmem_fwd_index *ix)
{
	const size_t runs = (size_t)g_cfg.n_layers * g_cfg.n_kv_heads, D = g_cfg.head_dim;
	const int B = ix->block, t0 = (int)(ix->first % B), nb = (t0 + n - 1) / B + 1;
	const int mm = ix->kmin != NULL, sub = ix->sub != NULL;
	const size_t win = runs * nb * D;
	const kvmem_score_geom g = { .n_layers = g_cfg.n_layers, .n_kv_heads = g_cfg.n_kv_heads,
				     .head_dim = g_cfg.head_dim, .block = B, .cap_blocks = nb,
				     .index_dtype = KVMEM_DTYPE_F32 };
	float *wm, *wlo, *whi, *wsub, *osum = g_dev.st, *osub = osum + runs * D;
	float *plo = osub + runs * D, *phi = plo + runs * D;

	if (!ix->fresh && (g_dev.key != ix->key || g_dev.upto != ix->first))
		return kvmem_error(EINVAL, "fake index: no state for tokens from %lld",
				   (long long)ix->first);
	g_dev.calls++;
	g_dev.fresh += ix->fresh;
	memset(g_dev.win, 0xff, win * 7 * sizeof(float));
	wm = g_dev.win;
	wlo = wm + win;
	whi = wlo + win;
	wsub = whi + win;
	if (ix->fresh) {
		memcpy(osum, ix->in_sum, runs * D * sizeof(float));
		if (sub)
			memcpy(osub, ix->in_sub, runs * D * sizeof(float));
		if (mm && t0) {
			memcpy(plo, ix->in_min, runs * D * sizeof(float));
			memcpy(phi, ix->in_max, runs * D * sizeof(float));
		}
	}
	for (size_t r = 0; mm && t0 && r < runs; r++) {
		memcpy(wlo + r * nb * D, plo + r * D, D * sizeof(float));
		memcpy(whi + r * nb * D, phi + r * D, D * sizeof(float));
	}
	if (kvmem_index_append_bf16(wm, mm ? wlo : NULL, mm ? whi : NULL, sub ? wsub : NULL, osum,
				    sub ? osub : NULL, rk, t0, n, &g))
		return -EINVAL;
	for (size_t r = 0; mm && (t0 + n) % B && r < runs; r++) {
		memcpy(plo + r * D, wlo + (r * nb + nb - 1) * D, D * sizeof(float));
		memcpy(phi + r * D, whi + (r * nb + nb - 1) * D, D * sizeof(float));
	}
	memcpy(ix->meank, wm, win * sizeof(float));
	if (mm) {
		memcpy(ix->kmin, wlo, win * sizeof(float));
		memcpy(ix->kmax, whi, win * sizeof(float));
	}
	if (sub) {
		memcpy(ix->sub, wsub, 4 * win * sizeof(float));
		memcpy(ix->open_sub, osub, runs * D * sizeof(float));
	}
	memcpy(ix->open_sum, osum, runs * D * sizeof(float));
	g_dev.key = ix->key;
	g_dev.upto = ix->first + n;
	return 0;
}

/* The cpu forward, its rows handed over in bf16 (as a GPU's), and the
 * index's summaries made "on the device" when asked. */
static int index_forward(void *ctx, kvmem_view *v, const int32_t *tok, int n, float *logits,
			 int all, const kvmem_fwd_out *out)
{
	const size_t m = (size_t)g_cfg.n_layers * n * g_cfg.n_kv_heads * g_cfg.head_dim;
	float *k = malloc(4 * m), *vv = malloc(4 * m);
	uint16_t *kb = malloc(2 * m);
	kvmem_fwd_out o = { .raw_k = k, .v = vv };
	int rc;

	assert_true(k && vv && kb);
	if (out) {
		o.q_raw = out->q_raw;
		o.q_last = out->q_last;
	}
	rc = g_real->forward(ctx, v, tok, n, logits, all, out ? &o : NULL);
	if (!rc && out) {
		kvmem_f32_to_bf16_n(kb, k, m);
		if (out->raw_k_bf16)
			memcpy(out->raw_k_bf16, kb, 2 * m);
		if (out->v_bf16)
			kvmem_f32_to_bf16_n(out->v_bf16, vv, m);
		if (out->index)
			rc = dev_index(kb, n, out->index);
	}
	free(k);
	free(vv);
	free(kb);
	return rc;
}

/* Every summary of every block, and the open sums, bit for bit. */
static void same_index(const kvmem_index *a, const kvmem_index *b)
{
	const size_t runs = (size_t)a->n_layers * a->n_kv_heads, D = a->head_dim;

	assert_int_equal(a->n_tokens, b->n_tokens);
	assert_int_equal(a->cap_blocks, b->cap_blocks);
	for (size_t r = 0; r < runs; r++) {
		const size_t at = r * a->cap_blocks * D, len = a->n_blocks * D;

		assert_memory_equal(a->meank + at, b->meank + at, len * sizeof(float));
		if (a->sums & KVMEM_SUM_MINMAX) {
			assert_memory_equal(a->kmin + at, b->kmin + at, len * sizeof(float));
			assert_memory_equal(a->kmax + at, b->kmax + at, len * sizeof(float));
		}
		if (a->sums & KVMEM_SUM_SUBBLOCK)
			assert_memory_equal(a->sub + at * 4, b->sub + at * 4, 4 * len * sizeof(float));
	}
	assert_memory_equal(a->open_sum, b->open_sum, runs * D * sizeof(float));
	if (a->sums & KVMEM_SUM_SUBBLOCK)
		assert_memory_equal(a->open_sub, b->open_sub, runs * D * sizeof(float));
}

/*
 * Two sessions, the index summed by the "device" and on the host
 * (KVMEM_DEVICE_INDEX=0), for a policy of each kind of summary (once with
 * the writer thread on every job): chunks of
 * 24 over blocks of 16 (every other chunk starts inside a block), a budget
 * that selects mid-append, decode steps summed on the host between appends
 * (the next append hands the device the host's state: a block's min/max
 * so far, the open sums). The same index, plans (the same view length),
 * logits and tokens; the device made every chunk's summaries.
 */
/* Two sessions on e, the index summed by the backend and on the host
 * (KVMEM_DEVICE_INDEX=0), for a policy of each kind of summary (once with
 * the writer thread on every job): chunks of 24 over blocks of 16 (every
 * other chunk starts inside a block), a budget that selects mid-append,
 * decode steps summed on the host between appends (the next append hands
 * the backend the host's state: a block's min/max so far, the open sums).
 * The same index, view length, logits and tokens; the backend made every
 * chunk's summaries (fake: it counted them, fresh at each append). */
static void same_as_host_index(kvmem_backend *e, const kvmem_config *c, uint64_t *rng, int fake)
{
	static const char *const pol[] = { "quest", "subblock", "meank" };
	int32_t tok[300], out[2][8];

	for (int i = 0; i < 300; i++)
		tok[i] = test_rng_int(rng, 0, c->vocab - 1);
	for (size_t p = 0; p < sizeof(pol) / sizeof(pol[0]); p++) {
		kvmem_session *s[2];
		kvmem_session_stats st;

		if (p == 1)
			setenv("KVMEM_WRITER_MIN", "1", 1);
		for (int k = 0; k < 2; k++) {
			kvmem_session_opts o;

			kvmem_session_opts_default(&o);
			o.block = 16;
			o.chunk = 24;
			o.budget = 96;
			o.policy = pol[p];
			if (k)
				setenv("KVMEM_DEVICE_INDEX", "0", 1);
			s[k] = kvmem_session_create(e, &o);
			unsetenv("KVMEM_DEVICE_INDEX");
			if (!s[k])
				fail_msg("session: %s", kvmem_last_error());
			g_dev.calls = g_dev.fresh = 0;
			assert_int_equal(kvmem_session_append(s[k], tok, 150, 0), 0);
			assert_int_equal(kvmem_session_decode(s[k], 5, NULL, out[k]), 0);
			assert_int_equal(kvmem_session_append(s[k], tok + 150, 120, 0), 0);
			assert_int_equal(kvmem_session_decode(s[k], 3, NULL, out[k] + 5), 0);
			kvmem_session_get_stats(s[k], &st);
			/* 6 + 5 chunks of 24 (150's last 6 summed on the host) */
			assert_int_equal(st.index_forwards, k ? 0 : 11);
			if (fake) {
				assert_int_equal(g_dev.calls, k ? 0 : 11);
				assert_int_equal(g_dev.fresh, k ? 0 : 2);
			}
			assert_true(st.selections > 0);
		}
		same_index(kvmem_session_index(s[0]), kvmem_session_index(s[1]));
		assert_memory_equal(out[0], out[1], sizeof(out[0]));
		assert_memory_equal(kvmem_session_logits(s[0]), kvmem_session_logits(s[1]),
				    sizeof(float) * c->vocab);
		assert_int_equal(kvmem_session_view_len(s[0]), kvmem_session_view_len(s[1]));
		kvmem_session_free(s[0]);
		kvmem_session_free(s[1]);
		unsetenv("KVMEM_WRITER_MIN");
	}
}

/* The cpu backend as a device that makes the summaries (the CPU twin). */
static void test_device_index(void **state)
{
	uint64_t rng = g_seed ^ 0x1dec;
	struct fixture f;

	fx_open(&f, &rng, 32);
	g_cfg = f.c;
	f.ops.rows_dtype = KVMEM_DTYPE_BF16;
	f.ops.index_rows = 1;
	f.ops.host_alloc = heap_alloc;
	f.ops.host_free = heap_free;
	f.ops.forward = index_forward;
	g_dev.win = malloc(sizeof(float) * 7 * f.c.n_layers * f.c.n_kv_heads * 4 * f.c.head_dim);
	g_dev.st = malloc(sizeof(float) * 4 * f.c.n_layers * f.c.n_kv_heads * f.c.head_dim);
	assert_true(g_dev.win && g_dev.st);
	same_as_host_index(f.e, &f.c, &rng, 1);
	free(g_dev.win);
	free(g_dev.st);
	fx_close(&f);
}

/* The backend under test (KVMEM_TEST_BACKEND=cuda: the summaries made on
 * the GPU by kernels/cuda/index.cu); skipped on the cpu backend, which
 * makes none. */
static void test_device_index_backend(void **state)
{
	uint64_t rng = g_seed ^ 0xbac;
	kvmem_config c;
	kvmem_model *m = NULL;
	kvmem_backend *e = open_test_backend(&c, &m, &rng);

	if (!e || !e->ops->index_rows) {
		if (e)
			kvmem_backend_close(e);
		test_model_free(m);
		skip();
		return;
	}
	same_as_host_index(e, &c, &rng, 0);
	kvmem_backend_close(e);
	test_model_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_last_chunk_logits),
		cmocka_unit_test(test_failed_chunk),
		cmocka_unit_test(test_split),
		cmocka_unit_test(test_device_index),
		cmocka_unit_test(test_device_index_backend),
		cmocka_unit_test(test_rows_kept),
		cmocka_unit_test(test_rows_kept_many),
	};

	g_seed = test_rng_fresh_seed("test_ws_append");
	if (getenv("KVMEM_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KVMEM_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}

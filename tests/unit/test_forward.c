// SPDX-License-Identifier: MIT
/*
 * The engine's forward pass against an independent naive Qwen3 written here
 * in double precision (own loops, no library kernels), on small random
 * models built in memory: tied and untied, several geometries, one-shot and
 * chunked prefill, decode after prefill, the raw K / V / q handed back, and
 * the K the view holds being exactly kvmem_rope of that raw K.
 *
 * Tolerance: logits of a row agree to ||a - b|| / ||b|| < 2e-5 and every
 * element to 1e-4 * max|b| (fp32 engine vs double reference).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "helpers/test_model.h"

#define ROW_REL_TOL 2e-5
#define ELEM_TOL 1e-4

static uint64_t g_seed;

/* ---- the naive reference ---------------------------------------------- */

struct ref_out {
	double *logits;	/* [n][vocab] */
	double *raw_k;	/* [L][n][Hkv][D] */
	double *v;	/* [L][n][Hkv][D] */
	double *q_raw;	/* [L][n][Hq][D] */
};

static double *dalloc(size_t n)
{
	double *p = calloc(n ? n : 1, sizeof(double));

	assert_non_null(p);
	return p;
}

static void ref_rmsnorm(double *x, const float *w, int dim, double eps)
{
	double ss = 0;

	for (int i = 0; i < dim; i++)
		ss += x[i] * x[i];
	double r = 1.0 / sqrt(ss / dim + eps);

	for (int i = 0; i < dim; i++)
		x[i] = x[i] * r * w[i];
}

/* y[out] = W[out][in] x[in] */
static void ref_linear(double *y, const float *w, const double *x, int in, int out)
{
	for (int o = 0; o < out; o++) {
		double s = 0;

		for (int i = 0; i < in; i++)
			s += (double)w[(size_t)o * in + i] * x[i];
		y[o] = s;
	}
}

static void ref_rope(double *x, int pos, int d, double theta)
{
	for (int i = 0; i < d / 2; i++) {
		double inv = 1.0 / pow(theta, (double)(2 * i) / d);
		double c = cos(pos * inv), s = sin(pos * inv);
		double a = x[i], b = x[i + d / 2];

		x[i] = a * c - b * s;
		x[i + d / 2] = b * c + a * s;
	}
}

/* The whole sequence at once, positions 0..n-1, plain causal attention. */
static void ref_forward(const kvmem_model *m, const int32_t *tok, int n, struct ref_out *ro)
{
	const kvmem_config *c = &m->cfg;
	int H = c->hidden, Hq = c->n_heads, Hk = c->n_kv_heads, D = c->head_dim;
	int I = c->intermediate, V = c->vocab, grp = Hq / Hk;
	double *x = dalloc((size_t)n * H), *h = dalloc(H), *q = dalloc((size_t)n * Hq * D);
	double *k = dalloc((size_t)n * Hk * D), *v = dalloc((size_t)n * Hk * D);
	double *att = dalloc((size_t)Hq * D), *o = dalloc(H), *g = dalloc(I), *u = dalloc(I);
	double *sc = dalloc(n);

	for (int t = 0; t < n; t++)
		for (int i = 0; i < H; i++)
			x[(size_t)t * H + i] = m->embed[(size_t)tok[t] * H + i];
	for (int l = 0; l < c->n_layers; l++) {
		const kvmem_layer *L = &m->layers[l];

		for (int t = 0; t < n; t++) {
			memcpy(h, x + (size_t)t * H, sizeof(double) * H);
			ref_rmsnorm(h, L->attn_norm, H, c->rms_eps);
			ref_linear(q + (size_t)t * Hq * D, L->wq, h, H, Hq * D);
			ref_linear(k + (size_t)t * Hk * D, L->wk, h, H, Hk * D);
			ref_linear(v + (size_t)t * Hk * D, L->wv, h, H, Hk * D);
			for (int a = 0; a < Hq; a++)
				ref_rmsnorm(q + ((size_t)t * Hq + a) * D, L->q_norm, D, c->rms_eps);
			for (int a = 0; a < Hk; a++)
				ref_rmsnorm(k + ((size_t)t * Hk + a) * D, L->k_norm, D, c->rms_eps);
			size_t kb = ((size_t)l * n + t) * Hk * D, qb = ((size_t)l * n + t) * Hq * D;

			if (ro->raw_k)
				memcpy(ro->raw_k + kb, k + (size_t)t * Hk * D, sizeof(double) * Hk * D);
			if (ro->v)
				memcpy(ro->v + kb, v + (size_t)t * Hk * D, sizeof(double) * Hk * D);
			if (ro->q_raw)
				memcpy(ro->q_raw + qb, q + (size_t)t * Hq * D, sizeof(double) * Hq * D);
			for (int a = 0; a < Hq; a++)
				ref_rope(q + ((size_t)t * Hq + a) * D, t, D, c->rope_theta);
			for (int a = 0; a < Hk; a++)
				ref_rope(k + ((size_t)t * Hk + a) * D, t, D, c->rope_theta);
		}
		for (int t = 0; t < n; t++) {
			for (int a = 0; a < Hq; a++) {
				const double *qa = q + ((size_t)t * Hq + a) * D;
				int kh = a / grp;
				double mx = -INFINITY, sum = 0;

				for (int j = 0; j <= t; j++) {
					double s = 0;

					for (int e = 0; e < D; e++)
						s += qa[e] * k[((size_t)j * Hk + kh) * D + e];
					sc[j] = s / sqrt((double)D);
					mx = fmax(mx, sc[j]);
				}
				for (int e = 0; e < D; e++)
					att[a * D + e] = 0;
				for (int j = 0; j <= t; j++) {
					double p = exp(sc[j] - mx);

					sum += p;
					for (int e = 0; e < D; e++)
						att[a * D + e] += p * v[((size_t)j * Hk + kh) * D + e];
				}
				for (int e = 0; e < D; e++)
					att[a * D + e] /= sum;
			}
			ref_linear(o, L->wo, att, Hq * D, H);
			for (int i = 0; i < H; i++)
				x[(size_t)t * H + i] += o[i];
			memcpy(h, x + (size_t)t * H, sizeof(double) * H);
			ref_rmsnorm(h, L->mlp_norm, H, c->rms_eps);
			ref_linear(g, L->w_gate, h, H, I);
			ref_linear(u, L->w_up, h, H, I);
			for (int i = 0; i < I; i++)
				g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
			ref_linear(o, L->w_down, g, I, H);
			for (int i = 0; i < H; i++)
				x[(size_t)t * H + i] += o[i];
		}
	}
	for (int t = 0; t < n; t++) {
		memcpy(h, x + (size_t)t * H, sizeof(double) * H);
		ref_rmsnorm(h, m->final_norm, H, c->rms_eps);
		ref_linear(ro->logits + (size_t)t * V, m->lm_head, h, H, V);
	}
	free(x);
	free(h);
	free(q);
	free(k);
	free(v);
	free(att);
	free(o);
	free(g);
	free(u);
	free(sc);
}

/* ---- comparisons ------------------------------------------------------ */

static void expect_close(const float *got, const double *want, size_t n, const char *what,
			 int row)
{
	double num = 0, den = 0, mx = 0;

	for (size_t i = 0; i < n; i++) {
		num += (got[i] - want[i]) * (got[i] - want[i]);
		den += want[i] * want[i];
		mx = fmax(mx, fabs(want[i]));
	}
	if (!(sqrt(num) <= ROW_REL_TOL * sqrt(den)))
		fail_msg("%s row %d: relative error %.3g (limit %g)", what, row,
			 sqrt(num / den), ROW_REL_TOL);
	for (size_t i = 0; i < n; i++)
		if (!(fabs(got[i] - want[i]) <= ELEM_TOL * mx))
			fail_msg("%s row %d [%zu]: %.7g vs %.7g", what, row, i, got[i], want[i]);
}

static int32_t *random_tokens(uint64_t *r, int n, int vocab)
{
	int32_t *t = malloc(sizeof(int32_t) * n);

	assert_non_null(t);
	for (int i = 0; i < n; i++)
		t[i] = test_rng_int(r, 0, vocab - 1);
	return t;
}

struct geom {
	const char *name;
	int layers, hidden, heads, kv_heads, head_dim, inter, vocab, tied;
	double theta;
};

static const struct geom geoms[] = {
	{ "tied gqa 4:2", 2, 32, 4, 2, 8, 48, 61, 1, 10000 },
	{ "untied gqa 8:2 head_dim!=hidden/heads", 3, 48, 8, 2, 16, 64, 50, 0, 1e6 },
	{ "untied mha 3:3", 2, 24, 3, 3, 10, 40, 37, 0, 10000 },
	{ "tied mqa 6:1", 2, 36, 6, 1, 4, 30, 45, 1, 5e5 },
};

static kvmem_model *make_model(const struct geom *g, uint64_t seed)
{
	kvmem_config c = test_model_config(g->layers, g->hidden, g->heads, g->kv_heads,
					 g->head_dim, g->inter, g->vocab, g->tied);

	c.rope_theta = g->theta;
	return test_model_random(&c, seed);
}

/* One-shot prefill of every geometry, all logits plus raw K, V and q. */
static void test_forward_oneshot(void **state)
{
	uint64_t r = g_seed ^ 0x1111;

	for (size_t gi = 0; gi < sizeof(geoms) / sizeof(geoms[0]); gi++) {
		const struct geom *g = &geoms[gi];
		kvmem_model *m = make_model(g, r + gi);
		const kvmem_config *c = &m->cfg;
		int n = test_rng_int(&r, 20, 40), V = c->vocab;
		int32_t *tok = random_tokens(&r, n, V);
		size_t kw = (size_t)c->n_kv_heads * c->head_dim;
		size_t qw = (size_t)c->n_heads * c->head_dim;
		struct ref_out ro = { dalloc((size_t)n * V), dalloc(c->n_layers * n * kw),
				      dalloc(c->n_layers * n * kw), dalloc(c->n_layers * n * qw) };
		float *logits = malloc(sizeof(float) * n * V);
		float *rk = malloc(sizeof(float) * c->n_layers * n * kw);
		float *vv = malloc(sizeof(float) * c->n_layers * n * kw);
		float *rq = malloc(sizeof(float) * c->n_layers * n * qw);
		kvmem_fwd_out fo = { .raw_k = rk, .v = vv, .q_raw = rq };
		kvmem_kvcache kv;
		kvmem_engine *e = kvmem_engine_create(m, n);

		assert_non_null(e);
		assert_ptr_equal(kvmem_engine_model(e), m);
		assert_int_equal(kvmem_kvcache_init(&kv, c, n + 3), 0);
		assert_int_equal(kvmem_forward(e, &kv, tok, n, logits, 1, &fo), 0);
		assert_int_equal(kv.len, n);
		ref_forward(m, tok, n, &ro);
		for (int t = 0; t < n; t++)
			expect_close(logits + (size_t)t * V, ro.logits + (size_t)t * V, V, g->name, t);
		for (int l = 0; l < c->n_layers; l++)
			for (int t = 0; t < n; t++) {
				size_t kb = ((size_t)l * n + t) * kw, qb = ((size_t)l * n + t) * qw;

				expect_close(rk + kb, ro.raw_k + kb, kw, "raw K", t);
				expect_close(vv + kb, ro.v + kb, kw, "V", t);
				expect_close(rq + qb, ro.q_raw + qb, qw, "raw q", t);
			}
		/* The view holds kvmem_rope(raw K) at the slot, bit for bit, and V as is. */
		for (int l = 0; l < c->n_layers; l++)
			for (int t = 0; t < n; t++) {
				float krot[256];
				int32_t pos = t;

				memcpy(krot, rk + ((size_t)l * n + t) * kw, sizeof(float) * kw);
				kvmem_rope(krot, &pos, 1, c->n_kv_heads, c->head_dim, c->rope_theta);
				for (int h = 0; h < c->n_kv_heads; h++) {
					assert_memory_equal(kvmem_kv_k(&kv, l, h, t), krot + h * c->head_dim,
							    sizeof(float) * c->head_dim);
					assert_memory_equal(kvmem_kv_v(&kv, l, h, t),
							    vv + ((size_t)l * n + t) * kw + h * c->head_dim,
							    sizeof(float) * c->head_dim);
				}
			}
		kvmem_engine_free(e);
		kvmem_kvcache_free(&kv);
		free(logits);
		free(rk);
		free(vv);
		free(rq);
		free(ro.logits);
		free(ro.raw_k);
		free(ro.v);
		free(ro.q_raw);
		free(tok);
		test_model_free(m);
	}
}

/* Chunked prefill (chunks of 1, 3, 7, 16) gives the one-shot logits. */
static void test_forward_chunked(void **state)
{
	uint64_t r = g_seed ^ 0x2222;
	static const int chunks[] = { 1, 3, 7, 16 };

	for (size_t gi = 0; gi < 2; gi++) {
		kvmem_model *m = make_model(&geoms[gi], r + gi);
		const kvmem_config *c = &m->cfg;
		int n = 33, V = c->vocab;
		int32_t *tok = random_tokens(&r, n, V);
		struct ref_out ro = { dalloc((size_t)n * V), NULL, NULL, NULL };
		float *logits = malloc(sizeof(float) * n * V);

		ref_forward(m, tok, n, &ro);
		for (int ci = 0; ci < 4; ci++) {
			int ch = chunks[ci];
			kvmem_engine *e = kvmem_engine_create(m, ch);
			kvmem_kvcache kv;

			assert_non_null(e);
			assert_int_equal(kvmem_kvcache_init(&kv, c, n), 0);
			for (int at = 0; at < n; at += ch) {
				int k = n - at < ch ? n - at : ch;

				assert_int_equal(kvmem_forward(e, &kv, tok + at, k,
							     logits + (size_t)at * V, 1, NULL), 0);
			}
			assert_int_equal(kv.len, n);
			for (int t = 0; t < n; t++)
				expect_close(logits + (size_t)t * V, ro.logits + (size_t)t * V, V,
					     "chunked", t);
			kvmem_engine_free(e);
			kvmem_kvcache_free(&kv);
		}
		free(logits);
		free(ro.logits);
		free(tok);
		test_model_free(m);
	}
}

/* Prefill with last-token logits, then greedy decode one token at a time:
 * every step's logits match the reference over the whole sequence so far. */
static void test_forward_decode(void **state)
{
	uint64_t r = g_seed ^ 0x3333;

	for (size_t gi = 0; gi < sizeof(geoms) / sizeof(geoms[0]); gi += 3) {
		kvmem_model *m = make_model(&geoms[gi], r + gi);
		const kvmem_config *c = &m->cfg;
		int n0 = 12, steps = 10, n = n0 + steps, V = c->vocab;
		int32_t *tok = random_tokens(&r, n, V);
		float *logits = malloc(sizeof(float) * V);
		kvmem_engine *e = kvmem_engine_create(m, 16);
		kvmem_kvcache kv;
		kvmem_sampler greedy = { 0 };
		uint64_t st = 0;

		assert_int_equal(kvmem_kvcache_init(&kv, c, n), 0);
		assert_int_equal(kvmem_forward(e, &kv, tok, n0, logits, 0, NULL), 0);
		for (int s = 0; s < steps; s++) {
			tok[n0 + s] = kvmem_sample(logits, V, &greedy, &st);
			assert_int_equal(kvmem_forward(e, &kv, tok + n0 + s, 1, logits, 0, NULL), 0);
		}
		struct ref_out ro = { dalloc((size_t)n * V), NULL, NULL, NULL };

		ref_forward(m, tok, n, &ro);
		expect_close(logits, ro.logits + (size_t)(n - 1) * V, V, "decode", n - 1);
		kvmem_engine_free(e);
		kvmem_kvcache_free(&kv);
		free(logits);
		free(ro.logits);
		free(tok);
		test_model_free(m);
	}
}

/*
 * What the workspace layer will do: rebuild the view from stored raw K
 * (rotated again at the same slots) and V, then run the next token. The
 * logits are bit-identical to those of the cache the engine grew itself.
 */
static void test_forward_view_rebuilt(void **state)
{
	uint64_t r = g_seed ^ 0x4444;
	kvmem_model *m = make_model(&geoms[1], r);
	const kvmem_config *c = &m->cfg;
	int n = 20, V = c->vocab, L = c->n_layers, Hk = c->n_kv_heads, D = c->head_dim;
	size_t kw = (size_t)Hk * D;
	int32_t *tok = random_tokens(&r, n + 1, V);
	float *rk = malloc(sizeof(float) * L * n * kw), *vv = malloc(sizeof(float) * L * n * kw);
	float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
	kvmem_fwd_out fo = { .raw_k = rk, .v = vv };
	kvmem_engine *e = kvmem_engine_create(m, n);
	kvmem_kvcache kv, view;

	assert_int_equal(kvmem_kvcache_init(&kv, c, n + 1), 0);
	assert_int_equal(kvmem_kvcache_init(&view, c, n + 5), 0);
	assert_int_equal(kvmem_forward(e, &kv, tok, n, NULL, 0, &fo), 0);
	for (int l = 0; l < L; l++)
		for (int t = 0; t < n; t++) {
			float *row = rk + ((size_t)l * n + t) * kw;
			int32_t pos = t;

			kvmem_rope(row, &pos, 1, Hk, D, c->rope_theta);
			for (int h = 0; h < Hk; h++) {
				memcpy(kvmem_kv_k(&view, l, h, t), row + h * D, sizeof(float) * D);
				memcpy(kvmem_kv_v(&view, l, h, t), vv + ((size_t)l * n + t) * kw + h * D,
				       sizeof(float) * D);
			}
		}
	view.len = n;
	assert_int_equal(kvmem_forward(e, &kv, tok + n, 1, a, 0, NULL), 0);
	assert_int_equal(kvmem_forward(e, &view, tok + n, 1, b, 0, NULL), 0);
	assert_memory_equal(a, b, sizeof(float) * V);
	kvmem_engine_free(e);
	kvmem_kvcache_free(&kv);
	kvmem_kvcache_free(&view);
	free(rk);
	free(vv);
	free(a);
	free(b);
	free(tok);
	test_model_free(m);
}

/* A longer prompt with head_dim 64: attention takes its threaded path. */
static void test_forward_long(void **state)
{
	uint64_t r = g_seed ^ 0x6666;
	struct geom g = { "long gqa 8:2 d64", 2, 64, 8, 2, 64, 96, 80, 0, 1e6 };
	kvmem_model *m = make_model(&g, r);
	int n = 160, V = g.vocab;
	int32_t *tok = random_tokens(&r, n, V);
	struct ref_out ro = { dalloc((size_t)n * V), NULL, NULL, NULL };
	float *logits = malloc(sizeof(float) * n * V);

	ref_forward(m, tok, n, &ro);
	for (int ch = n; ch >= 50; ch -= 110) {	/* one shot, then chunks of 50 */
		kvmem_engine *e = kvmem_engine_create(m, ch);
		kvmem_kvcache kv;

		assert_int_equal(kvmem_kvcache_init(&kv, &m->cfg, n), 0);
		for (int at = 0; at < n; at += ch) {
			int k = n - at < ch ? n - at : ch;

			assert_int_equal(kvmem_forward(e, &kv, tok + at, k, logits + (size_t)at * V, 1,
						     NULL), 0);
		}
		for (int t = 0; t < n; t++)
			expect_close(logits + (size_t)t * V, ro.logits + (size_t)t * V, V, g.name, t);
		kvmem_engine_free(e);
		kvmem_kvcache_free(&kv);
	}
	free(logits);
	free(ro.logits);
	free(tok);
	test_model_free(m);
}

/* Bad calls fail with a message and leave the cache as it was. */
static void test_forward_errors(void **state)
{
	uint64_t r = g_seed ^ 0x5555;
	kvmem_model *m = make_model(&geoms[0], r);
	const kvmem_config *c = &m->cfg;
	int32_t tok[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	kvmem_engine *e = kvmem_engine_create(m, 4);
	kvmem_kvcache kv, other;
	kvmem_config c2 = *c;

	assert_int_equal(kvmem_kvcache_init(&kv, c, 6), 0);
	assert_true(kvmem_forward(e, &kv, tok, 5, NULL, 0, NULL) < 0);	/* > max_chunk */
	assert_non_null(strstr(kvmem_last_error(), "tokens in one call"));
	assert_true(kvmem_forward(e, &kv, tok, 0, NULL, 0, NULL) < 0);
	tok[2] = c->vocab;
	assert_true(kvmem_forward(e, &kv, tok, 3, NULL, 0, NULL) < 0);
	assert_non_null(strstr(kvmem_last_error(), "outside the vocabulary"));
	tok[2] = -1;
	assert_true(kvmem_forward(e, &kv, tok, 3, NULL, 0, NULL) < 0);
	tok[2] = 3;
	assert_int_equal(kv.len, 0);
	assert_int_equal(kvmem_forward(e, &kv, tok, 4, NULL, 0, NULL), 0);
	assert_true(kvmem_forward(e, &kv, tok, 3, NULL, 0, NULL) < 0);	/* 4 + 3 > 6 */
	assert_non_null(strstr(kvmem_last_error(), "no room"));
	assert_int_equal(kv.len, 4);
	c2.n_kv_heads = c->n_kv_heads * 2;
	c2.n_heads = c->n_heads * 2;
	assert_int_equal(kvmem_kvcache_init(&other, &c2, 6), 0);
	assert_true(kvmem_forward(e, &other, tok, 1, NULL, 0, NULL) < 0);
	assert_non_null(strstr(kvmem_last_error(), "geometry"));
	kvmem_kvcache_free(&other);
	assert_true(kvmem_kvcache_init(&other, c, 0) < 0);
	assert_null(kvmem_engine_create(m, 0));
	c2 = *c;
	c2.n_kv_heads = 3;	/* 4 heads are no multiple of 3 */
	m->cfg = c2;
	assert_null(kvmem_engine_create(m, 4));
	assert_non_null(strstr(kvmem_last_error(), "multiple"));
	m->cfg = *c;
	kvmem_engine_free(e);
	kvmem_kvcache_free(&kv);
	test_model_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_forward_oneshot),
		cmocka_unit_test(test_forward_chunked),
		cmocka_unit_test(test_forward_decode),
		cmocka_unit_test(test_forward_view_rebuilt),
		cmocka_unit_test(test_forward_long),
		cmocka_unit_test(test_forward_errors),
	};

	g_seed = test_rng_fresh_seed("test_forward");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

// SPDX-License-Identifier: MIT
/*
 * Tensor parallelism on the CPU (user/tp/): the split plan and the TP=N
 * reference forward pass.
 *
 * Plan: on the published 8B and 32B geometries and small ones, every rank's
 * heads, rows and columns are contiguous, disjoint and cover the model; the
 * ranks' parameters add up to the model's plus the replicated tensors'
 * copies; a split that does not divide is refused with a message naming
 * the sizes and the rank counts that would do.
 *
 * Forward: TP=1 is the engine's forward bit for bit (logits, raw K, V, raw
 * queries, the view's K and V), over a chunked prefill and decode steps.
 * TP=N (N = 2, 4, 8 where the KV heads allow) against TP=1 on random
 * models (GQA 2:1 and 4:1, MHA, MQA refused past 1 rank): every logit row
 * to ||a - b|| / ||b|| < 2e-5 and every element to 1e-4 * max|b| (the
 * engine's tolerance against its double reference, test_forward.c; the
 * split changes only the order of fp32 sums), raw K / V / queries gathered
 * from the ranks the same, and each rank's view holding exactly its heads
 * of the TP=1 view to the same tolerance.
 *
 * Scores: meank and subblock over N ranks' shards of a random index, the
 * partial scores summed (the all-reduce), against the whole index's: TP=1
 * memcmp-equal, TP=2/4/8 within 1e-5 of the largest score, and the same
 * top 8 blocks wherever the 8th and 9th differ by more than that.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "kernels/kernels_bf16.h"
#include "kvmem/kvmem.h"
#include "tp/tp.h"
#include "helpers/test_model.h"

#define ROW_REL_TOL 2e-5
#define ELEM_TOL 1e-4

static uint64_t g_seed;
static double g_worst[9];	/* worst logit row's relative L2 by rank count */

/* ---- the plan ----------------------------------------------------------- */

/* Every rank's runs tile the model's, in rank order. */
static void check_tiling(const kvmem_config *c, int n)
{
	int kv = 0, q = 0, qr = 0, kvr = 0, ff = 0;
	uint64_t params = 0;
	const uint64_t h = (uint64_t)c->hidden;
	const uint64_t replicated = (uint64_t)c->n_layers * (2 * h + 2 * (uint64_t)c->head_dim) +
				    (uint64_t)c->vocab * h * (c->tie_embeddings ? 1 : 2) + h;

	for (int r = 0; r < n; r++) {
		kvmem_tp_rank p;

		assert_int_equal(kvmem_tp_plan(c, n, r, &p), 0);
		assert_int_equal(p.rank, r);
		assert_int_equal(p.n_ranks, n);
		assert_int_equal(p.kv_head0, kv);
		assert_int_equal(p.head0, q);
		assert_int_equal(p.q_row0, qr);
		assert_int_equal(p.kv_row0, kvr);
		assert_int_equal(p.ff0, ff);
		assert_int_equal(p.o_col0, p.q_row0);
		assert_int_equal(p.o_cols, p.q_rows);
		assert_int_equal(p.q_rows, p.n_heads * c->head_dim);
		assert_int_equal(p.kv_rows, p.n_kv_heads * c->head_dim);
		/* GQA: its query heads read only its KV heads. */
		assert_int_equal(p.head0 / (c->n_heads / c->n_kv_heads), p.kv_head0);
		assert_int_equal((p.head0 + p.n_heads - 1) / (c->n_heads / c->n_kv_heads),
				 p.kv_head0 + p.n_kv_heads - 1);
		assert_int_equal(p.kv_bytes_per_token * n, kvmem_config_kv_bytes_per_token(c, 2));
		kv += p.n_kv_heads;
		q += p.n_heads;
		qr += p.q_rows;
		kvr += p.kv_rows;
		ff += p.n_ff;
		params += p.params;
	}
	assert_int_equal(kv, c->n_kv_heads);
	assert_int_equal(q, c->n_heads);
	assert_int_equal(qr, c->n_heads * c->head_dim);
	assert_int_equal(kvr, c->n_kv_heads * c->head_dim);
	assert_int_equal(ff, c->intermediate);
	assert_true(params == kvmem_config_params(c) + (uint64_t)(n - 1) * replicated);
}

static void test_plan_presets(void **state)
{
	const char *names[] = { "tiny", "0.6b", "8b", "32b" };

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		const kvmem_preset *p = kvmem_preset_find(names[i]);

		assert_non_null(p);
		for (int n = 1; n <= KVMEM_TP_MAX; n++)
			if (!kvmem_tp_check(&p->cfg, n))
				check_tiling(&p->cfg, n);
	}
	/* The published 8B: 8 KV heads, 32 query heads, intermediate 12288. */
	const kvmem_config *c8 = &kvmem_preset_find("8b")->cfg;
	kvmem_tp_rank r;

	assert_int_equal(kvmem_tp_plan(c8, 4, 3, &r), 0);
	assert_int_equal(r.kv_head0, 6);
	assert_int_equal(r.n_kv_heads, 2);
	assert_int_equal(r.head0, 24);
	assert_int_equal(r.n_heads, 8);
	assert_int_equal(r.q_row0, 24 * 128);
	assert_int_equal(r.ff0, 3 * 3072);
	assert_int_equal(r.n_ff, 3072);
	/* The 32B geometry's weights at TP=2: 65.52 GB of bf16 in all; each
	 * GPU holds half the layers' and its own copy of the embedding and
	 * lm_head (1.56 GB each): 34.32 GB. */
	const kvmem_config *c32 = &kvmem_preset_find("32b")->cfg;

	assert_int_equal(kvmem_tp_plan(c32, 2, 1, &r), 0);
	assert_true(2 * kvmem_config_params(c32) == 65524246528ull);
	assert_true(2 * r.params == 34318624768ull);
}

static void expect_refusal(const kvmem_config *c, int n, const char *needle, const char *needle2)
{
	kvmem_tp_rank r;

	assert_int_equal(kvmem_tp_check(c, n), -EINVAL);
	assert_int_equal(kvmem_tp_plan(c, n, 0, &r), -EINVAL);
	if (!strstr(kvmem_last_error(), needle) || !strstr(kvmem_last_error(), needle2))
		fail_msg("refusal of %d ranks says \"%s\", not \"%s\" and \"%s\"", n,
			 kvmem_last_error(), needle, needle2);
	assert_null(kvmem_tp_engine_create(&(kvmem_model){ .cfg = *c }, n, 8));
}

static void test_plan_refusals(void **state)
{
	const kvmem_config *c8 = &kvmem_preset_find("8b")->cfg;
	kvmem_config odd = test_model_config(1, 32, 4, 4, 8, 102, 50, 0);
	kvmem_tp_rank r;

	expect_refusal(c8, 3, "8 KV heads do not split into 3 ranks", "1, 2, 4, 8");
	expect_refusal(c8, 16, "8 KV heads", "1, 2, 4, 8");
	expect_refusal(c8, 0, "0 ranks", "1, 2, 4, 8");
	expect_refusal(c8, -2, "-2 ranks", "1..64");
	expect_refusal(c8, KVMEM_TP_MAX + 1, "65 ranks", "1..64");
	/* 4 KV heads would take 4 ranks, the intermediate size 102 only 2. */
	expect_refusal(&odd, 4, "intermediate size 102 does not split into 4", "1, 2");
	assert_int_equal(kvmem_tp_check(&odd, 2), 0);
	assert_int_equal(kvmem_tp_plan(c8, 2, 2, &r), -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "rank 2 outside 0..1"));
	assert_int_equal(kvmem_tp_plan(c8, 2, -1, &r), -EINVAL);
}

/* ---- the forward pass ------------------------------------------------- */

struct run {
	int n_ranks;
	kvmem_tp_engine *tp;	/* NULL: the engine */
	kvmem_engine *e;
	kvmem_kvcache kv[8];
	kvmem_kvcache *kvp[8];
};

static void run_open(struct run *r, const kvmem_model *m, int n_ranks, int cap, int chunk)
{
	memset(r, 0, sizeof(*r));
	r->n_ranks = n_ranks;
	if (!n_ranks) {
		assert_non_null(r->e = kvmem_engine_create(m, chunk));
		assert_int_equal(kvmem_kvcache_init(&r->kv[0], &m->cfg, cap), 0);
		return;
	}
	assert_non_null(r->tp = kvmem_tp_engine_create(m, n_ranks, chunk));
	assert_int_equal(kvmem_tp_engine_ranks(r->tp), n_ranks);
	for (int i = 0; i < n_ranks; i++) {
		kvmem_config rc = kvmem_tp_rank_config(&m->cfg, kvmem_tp_engine_rank(r->tp, i));

		assert_int_equal(kvmem_kvcache_init(&r->kv[i], &rc, cap), 0);
		r->kvp[i] = &r->kv[i];
	}
}

static void run_close(struct run *r)
{
	kvmem_engine_free(r->e);
	kvmem_tp_engine_free(r->tp);
	for (int i = 0; i < 8; i++)
		kvmem_kvcache_free(&r->kv[i]);
}

static int run_fwd(struct run *r, const int32_t *tok, int n, float *logits, const kvmem_fwd_out *o)
{
	if (!r->n_ranks)
		return kvmem_forward(r->e, &r->kv[0], tok, n, logits, 1, o);
	return kvmem_tp_forward(r->tp, r->kvp, tok, n, logits, 1, o);
}

struct outs {
	float *logits, *raw_k, *v, *q;
	kvmem_fwd_out o;
};

static void outs_alloc(struct outs *s, const kvmem_config *c, int n, int q_last)
{
	size_t kw = (size_t)c->n_kv_heads * c->head_dim, qw = (size_t)c->n_heads * c->head_dim;

	s->logits = calloc((size_t)n * c->vocab, sizeof(float));
	s->raw_k = calloc((size_t)c->n_layers * n * kw, sizeof(float));
	s->v = calloc((size_t)c->n_layers * n * kw, sizeof(float));
	s->q = calloc((size_t)c->n_layers * n * qw, sizeof(float));
	assert_true(s->logits && s->raw_k && s->v && s->q);
	s->o = (kvmem_fwd_out){ .raw_k = s->raw_k, .v = s->v, .q_raw = s->q, .q_last = q_last };
}

static void outs_free(struct outs *s)
{
	free(s->logits);
	free(s->raw_k);
	free(s->v);
	free(s->q);
}

/* got against want: rows of `width`, each to ROW_REL_TOL relative L2, every
 * element to ELEM_TOL of the largest |want|. */
static void expect_close(const float *got, const float *want, size_t rows, size_t width,
			 const char *what, int n_ranks)
{
	double maxw = 0, worst = 0;

	for (size_t i = 0; i < rows * width; i++)
		maxw = fmax(maxw, fabs(want[i]));
	for (size_t r = 0; r < rows; r++) {
		double num = 0, den = 0;

		for (size_t j = 0; j < width; j++) {
			double a = got[r * width + j], b = want[r * width + j];

			if (!(fabs(a - b) <= ELEM_TOL * maxw))
				fail_msg("TP=%d %s[%zu][%zu] = %.9g, TP=1 %.9g (seed %llu)", n_ranks, what, r,
					 j, a, b, (unsigned long long)g_seed);
			num += (a - b) * (a - b);
			den += b * b;
		}
		double rel = den > 0 ? sqrt(num / den) : sqrt(num);

		worst = fmax(worst, rel);
		if (!(rel < ROW_REL_TOL))
			fail_msg("TP=%d %s row %zu: relative L2 %.3g (seed %llu)", n_ranks, what, r, rel,
				 (unsigned long long)g_seed);
	}
	if (!strcmp(what, "logits") && worst > g_worst[n_ranks])
		g_worst[n_ranks] = worst;
}

/* Rank i's view against its heads of the TP=1 view. */
static void expect_views(const struct run *tp, const kvmem_kvcache *full, int exact)
{
	const int d = full->head_dim, len = full->len;

	for (int i = 0; i < tp->n_ranks; i++) {
		const kvmem_kvcache *k = &tp->kv[i];
		const kvmem_tp_rank *p = kvmem_tp_engine_rank(tp->tp, i);

		assert_int_equal(k->len, len);
		for (int l = 0; l < full->n_layers; l++)
			for (int h = 0; h < k->n_kv_heads; h++) {
				const float *a = kvmem_kv_k(k, l, h, 0), *b = kvmem_kv_k(full, l, p->kv_head0 + h, 0);
				const float *av = kvmem_kv_v(k, l, h, 0), *bv = kvmem_kv_v(full, l, p->kv_head0 + h, 0);

				if (exact) {
					assert_memory_equal(a, b, sizeof(float) * len * d);
					assert_memory_equal(av, bv, sizeof(float) * len * d);
				} else {
					expect_close(a, b, len, d, "view K", tp->n_ranks);
					expect_close(av, bv, len, d, "view V", tp->n_ranks);
				}
			}
	}
}

/*
 * The same token run through the engine and through TP=n_ranks: a prefill
 * in chunks of `chunk`, then `decode` one-token steps, comparing every
 * call's outputs.
 */
static void compare_runs(const kvmem_config *c, int n_ranks, int prompt, int chunk, int decode)
{
	kvmem_model *m = test_model_random(c, g_seed ^ (uint64_t)n_ranks * 0x9e37u);
	struct run ref, tp;
	struct outs a, b;
	const int cap = prompt + decode, exact = n_ranks == 1;
	uint64_t s = g_seed + 7;
	int32_t *tok = malloc(sizeof(int32_t) * cap);

	assert_non_null(m);
	assert_non_null(tok);
	for (int i = 0; i < cap; i++)
		tok[i] = test_rng_int(&s, 0, c->vocab - 1);
	run_open(&ref, m, 0, cap, chunk);
	run_open(&tp, m, n_ranks, cap, chunk);
	outs_alloc(&a, c, chunk, 3);
	outs_alloc(&b, c, chunk, 3);
	for (int at = 0; at < cap;) {
		int n = at < prompt ? (prompt - at < chunk ? prompt - at : chunk) : 1;
		int qr = kvmem_fwd_q_rows(&a.o, n);
		size_t kw = (size_t)c->n_kv_heads * c->head_dim, qw = (size_t)c->n_heads * c->head_dim;

		assert_int_equal(run_fwd(&ref, tok + at, n, a.logits, &a.o), 0);
		assert_int_equal(run_fwd(&tp, tok + at, n, b.logits, &b.o), 0);
		if (exact) {
			assert_memory_equal(b.logits, a.logits, sizeof(float) * n * c->vocab);
			assert_memory_equal(b.raw_k, a.raw_k, sizeof(float) * c->n_layers * n * kw);
			assert_memory_equal(b.v, a.v, sizeof(float) * c->n_layers * n * kw);
			assert_memory_equal(b.q, a.q, sizeof(float) * c->n_layers * qr * qw);
		} else {
			expect_close(b.logits, a.logits, n, c->vocab, "logits", n_ranks);
			expect_close(b.raw_k, a.raw_k, (size_t)c->n_layers * n * c->n_kv_heads,
				     c->head_dim, "raw K", n_ranks);
			expect_close(b.v, a.v, (size_t)c->n_layers * n * c->n_kv_heads, c->head_dim,
				     "V", n_ranks);
			expect_close(b.q, a.q, (size_t)c->n_layers * qr * c->n_heads, c->head_dim,
				     "raw q", n_ranks);
		}
		at += n;
	}
	expect_views(&tp, &ref.kv[0], exact);
	outs_free(&a);
	outs_free(&b);
	run_close(&ref);
	run_close(&tp);
	free(tok);
	test_model_free(m);
}

static void test_forward_tp1_bitexact(void **state)
{
	/* GQA 4:1, untied; MHA, tied; chunks that do not divide the prompt. */
	kvmem_config gqa = test_model_config(3, 64, 8, 2, 16, 96, 97, 0);
	kvmem_config mha = test_model_config(2, 48, 4, 4, 12, 80, 61, 1);

	compare_runs(&gqa, 1, 19, 7, 5);
	compare_runs(&mha, 1, 16, 16, 4);
}

static void test_forward_tpn(void **state)
{
	kvmem_config gqa = test_model_config(3, 64, 16, 8, 16, 128, 97, 0);	/* 2:1 */
	kvmem_config gqa4 = test_model_config(2, 96, 16, 4, 24, 192, 83, 1);	/* 4:1, tied */
	kvmem_config mha = test_model_config(2, 64, 4, 4, 16, 64, 71, 0);

	for (int n = 2; n <= 8; n *= 2)
		compare_runs(&gqa, n, 21, 8, 4);
	compare_runs(&gqa4, 2, 12, 5, 3);
	compare_runs(&gqa4, 4, 12, 12, 3);
	compare_runs(&mha, 4, 9, 4, 3);
	print_message("worst logit row, relative L2 to TP=1: TP=2 %.3g, TP=4 %.3g, TP=8 %.3g\n",
		      g_worst[2], g_worst[4], g_worst[8]);
}

/* An MQA model (one KV head) splits into one rank only; a cache of the
 * wrong share or ranks out of step are refused with nothing changed. */
static void test_forward_refusals(void **state)
{
	kvmem_config mqa = test_model_config(1, 32, 4, 1, 8, 64, 40, 0);
	kvmem_config gqa = test_model_config(1, 32, 4, 2, 8, 64, 40, 0);
	kvmem_model *m = test_model_random(&mqa, g_seed);
	kvmem_model *g = test_model_random(&gqa, g_seed);
	struct run r;
	int32_t tok[2] = { 1, 2 }, bad = 40;

	assert_null(kvmem_tp_engine_create(m, 2, 4));
	assert_non_null(strstr(kvmem_last_error(), "1 KV heads do not split into 2 ranks"));
	run_open(&r, g, 2, 4, 4);
	assert_int_equal(kvmem_tp_forward(r.tp, r.kvp, &bad, 1, NULL, 0, NULL), -EINVAL);
	assert_int_equal(kvmem_tp_forward(r.tp, r.kvp, tok, 5, NULL, 0, NULL), -EINVAL);
	r.kv[1].len = 1;
	assert_int_equal(kvmem_tp_forward(r.tp, r.kvp, tok, 1, NULL, 0, NULL), -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "rank 1's kv cache holds 1 tokens, rank 0's 0"));
	r.kv[1].len = 0;
	r.kvp[1] = &r.kv[0];	/* rank 0's share handed to rank 1: same size, so fine */
	r.kvp[0] = &r.kv[1];
	assert_int_equal(kvmem_tp_forward(r.tp, r.kvp, tok, 2, NULL, 0, NULL), 0);
	assert_int_equal(r.kv[0].len, 2);
	assert_int_equal(r.kv[1].len, 2);
	assert_int_equal(kvmem_tp_forward(r.tp, r.kvp, tok, 2, NULL, 0, NULL), 0);
	assert_int_equal(kvmem_tp_forward(r.tp, r.kvp, tok, 1, NULL, 0, NULL), -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "no room"));
	run_close(&r);
	test_model_free(m);
	test_model_free(g);
}

/* ---- selection scores -------------------------------------------------- */

static int cmp_desc(const void *a, const void *b, void *s)
{
	const float *sc = s;
	float x = sc[*(const int *)a], y = sc[*(const int *)b];

	return x < y ? 1 : x > y ? -1 : *(const int *)a - *(const int *)b;
}

static int cmp_int(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

/* The top k blocks of scores, ascending by block; 0 when the k-th and the
 * next are within tol (a near tie: either selection is right). */
static int top_k(int *out, const float *scores, int n, int k, double tol)
{
	int *ix = malloc(sizeof(int) * n);

	assert_non_null(ix);
	for (int i = 0; i < n; i++)
		ix[i] = i;
	qsort_r(ix, n, sizeof(int), cmp_desc, (void *)scores);
	int clear = fabs((double)scores[ix[k - 1]] - scores[ix[k]]) > tol;

	for (int i = 0; i < k; i++)
		out[i] = ix[i];
	qsort(out, k, sizeof(int), cmp_int);
	free(ix);
	return clear;
}

static void test_scores_split(void **state)
{
	kvmem_config c = test_model_config(3, 64, 16, 8, 64, 128, 97, 0);
	const int64_t cap = 45, nb = 41;
	kvmem_score_geom g = { .n_layers = c.n_layers, .n_heads = c.n_heads,
			       .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim, .block = 32,
			       .n_blocks = nb, .cap_blocks = cap, .last_len = 11,
			       .last_sub = { 8, 3, 0, 0 }, .index_dtype = KVMEM_DTYPE_F32 };
	const size_t pairs = (size_t)c.n_layers * c.n_kv_heads;
	float *idx = malloc(sizeof(float) * pairs * cap * KVMEM_SUBBLOCKS * c.head_dim);
	float *gq = malloc(sizeof(float) * pairs * c.head_dim);
	float whole[64], split[64];
	uint64_t s = g_seed + 99;
	const char *scorers[] = { "meank", "subblock" };
	int clear = 0, tried = 0;

	assert_true(idx && gq);
	for (size_t i = 0; i < pairs * cap * KVMEM_SUBBLOCKS * c.head_dim; i++)
		idx[i] = (float)test_rng_range(&s, -1, 1);
	for (size_t i = 0; i < pairs * c.head_dim; i++)
		gq[i] = (float)test_rng_range(&s, -3, 3);
	for (int k = 0; k < 2; k++) {
		if (k)
			assert_int_equal(kvmem_score_subblock(whole, idx, gq, &g), 0);
		else
			assert_int_equal(kvmem_score_meank(whole, idx, gq, &g), 0);
		double mx = 0;

		for (int64_t b = 0; b < nb; b++)
			mx = fmax(mx, fabs(whole[b]));
		for (int n = 1; n <= 8; n *= 2) {
			int a[8], b8[8];

			assert_int_equal(kvmem_tp_score(split, scorers[k], idx, gq, &g, &c, n), 0);
			if (n == 1) {
				assert_memory_equal(split, whole, sizeof(float) * nb);
				continue;
			}
			for (int64_t b = 0; b < nb; b++)
				if (!(fabs((double)split[b] - whole[b]) <= 1e-5 * mx))
					fail_msg("%s, TP=%d: block %lld scores %.9g, whole %.9g (seed %llu)",
						 scorers[k], n, (long long)b, split[b], whole[b],
						 (unsigned long long)g_seed);
			tried++;
			if (top_k(a, whole, (int)nb, 8, 1e-5 * mx) && top_k(b8, split, (int)nb, 8, 1e-5 * mx)) {
				clear++;
				assert_memory_equal(a, b8, sizeof(a));
			}
		}
	}
	print_message("scores over 2/4/8 ranks: top 8 compared in %d of %d cases (the rest near "
		      "ties)\n", clear, tried);
	assert_int_equal(kvmem_tp_score(split, "quest", idx, gq, &g, &c, 2), -EINVAL);
	assert_int_equal(kvmem_tp_score(split, "meank", idx, gq, &g, &c, 3), -EINVAL);
	free(idx);
	free(gq);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plan_presets),
		cmocka_unit_test(test_plan_refusals),
		cmocka_unit_test(test_forward_tp1_bitexact),
		cmocka_unit_test(test_forward_tpn),
		cmocka_unit_test(test_forward_refusals),
		cmocka_unit_test(test_scores_split),
	};

	g_seed = test_rng_fresh_seed("test_tp");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

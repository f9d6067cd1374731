// SPDX-License-Identifier: MIT
/*
 * Selection policies: each against a slow double-precision restatement of
 * its documented formula, planted-signal tests (meank finds an aligned
 * block, subblock finds a diluted one that meank misses), quest's bound,
 * oracle against exact attention, the registry.
 */
#include <math.h>
#include <omp.h>
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

/* A synthetic history: raw keys, their index and pages, and queries. */
struct hist {
	int L, Hq, Hkv, D, B, T;
	int64_t N, nb;
	float *k;		/* [N][L][Hkv][D] */
	float *q;		/* [L][T][Hq][D] */
	int64_t *qpos;
	kvmem_index ix;
	kvmem_page_source src;
	kvmem_select_ctx c;
};

static float *hkey(struct hist *h, int64_t p, int l, int g)
{
	return h->k + (((size_t)p * h->L + l) * h->Hkv + g) * h->D;
}

static void hist_random(struct hist *h, uint64_t *rng, int64_t N, int B)
{
	memset(h, 0, sizeof(*h));
	h->L = test_rng_int(rng, 1, 3);
	h->Hkv = test_rng_int(rng, 1, 3);
	h->Hq = h->Hkv * test_rng_int(rng, 1, 3);
	h->D = 2 * test_rng_int(rng, 2, 12);
	h->B = B;
	h->T = test_rng_int(rng, 1, 4);
	h->N = N;
	h->nb = (N + B - 1) / B;
	h->k = malloc(sizeof(float) * N * h->L * h->Hkv * h->D);
	h->q = malloc(sizeof(float) * h->L * h->T * h->Hq * h->D);
	h->qpos = malloc(sizeof(int64_t) * h->T);
	for (size_t i = 0; i < (size_t)N * h->L * h->Hkv * h->D; i++)
		h->k[i] = (float)test_rng_range(rng, -1, 1);
	for (size_t i = 0; i < (size_t)h->L * h->T * h->Hq * h->D; i++)
		h->q[i] = (float)test_rng_range(rng, -2, 2);
	for (int t = 0; t < h->T; t++)
		h->qpos[t] = N - h->T + t;
}

/* Index and pages from h->k; needs = the policy's summaries. */
static void hist_commit(struct hist *h, unsigned needs)
{
	size_t kw = (size_t)h->Hkv * h->D;
	float *pk = malloc(sizeof(float) * h->L * kw);

	assert_int_equal(kvmem_index_init(&h->ix, h->L, h->Hkv, h->D, h->B, needs), 0);
	assert_int_equal(kvmem_page_source_mem(&h->src, h->L, h->Hkv, h->D, h->B), 0);
	for (int64_t p = 0; p < h->N; p++) {
		for (int l = 0; l < h->L; l++) {
			memcpy(pk + l * kw, hkey(h, p, l, 0), sizeof(float) * kw);
			assert_int_equal(h->src.ops->write(h->src.ctx, p / h->B, l, (int)(p % h->B), 1,
							   pk + l * kw, pk + l * kw), 0);
		}
		assert_int_equal(kvmem_index_append(&h->ix, pk, 1), 0);
	}
	free(pk);
	h->c = (kvmem_select_ctx){
		.index = &h->ix, .keys = &h->src, .n_tokens = h->N, .n_blocks = h->nb,
		.block = h->B, .n_layers = h->L, .n_heads = h->Hq, .n_kv_heads = h->Hkv,
		.head_dim = h->D, .rope_theta = 10000.0, .n_q = h->T, .q = h->q,
		.q_pos = h->qpos, .seed = 42, .step = 0,
	};
}

static void hist_free(struct hist *h)
{
	kvmem_index_free(&h->ix);
	kvmem_page_source_destroy(&h->src);
	free(h->k);
	free(h->q);
	free(h->qpos);
}

static float *run_policy(struct hist *h, const char *name)
{
	const kvmem_policy_ops *p = kvmem_policy_find(name);
	int sets;
	float *sc, *again;

	assert_non_null(p);
	sets = p->per_layer ? h->L : 1;
	sc = malloc(sizeof(float) * sets * h->nb);
	again = malloc(sizeof(float) * sets * h->nb);
	assert_int_equal(p->score(&h->c, sc), 0);
	assert_int_equal(p->score(&h->c, again), 0);
	assert_memory_equal(sc, again, sizeof(float) * sets * h->nb);	/* deterministic */
	for (int64_t i = 0; i < sets * h->nb; i++)
		assert_true(isfinite(sc[i]));
	free(again);
	return sc;
}

static const float *hq(const struct hist *h, int l, int t, int head)
{
	return h->q + (((size_t)l * h->T + t) * h->Hq + head) * h->D;
}

static void ref_rope(double *x, int64_t pos, int d, double theta)
{
	for (int i = 0; i < d / 2; i++) {
		double a = (double)pos * pow(theta, -2.0 * i / d), u = x[i], v = x[i + d / 2];

		x[i] = u * cos(a) - v * sin(a);
		x[i + d / 2] = v * cos(a) + u * sin(a);
	}
}

/*
 * The query whose dot with a raw key is the logit averaged over the key
 * sitting 0..span-1 tokens before it, from real rotations: q at P against
 * k at P - t scores R(P)q . R(P-t)k = (R(t)q) . k, so the mean over t of
 * R(t)q (span 0: q itself).
 */
static void ref_span_query(double *out, const float *q, int d, int64_t span)
{
	double x[64];

	for (int i = 0; i < d; i++)
		out[i] = span > 0 ? 0 : q[i];
	for (int64_t t = 0; t < span; t++) {
		for (int i = 0; i < d; i++)
			x[i] = q[i];
		ref_rope(x, t, d, 10000.0);
		for (int i = 0; i < d; i++)
			out[i] += x[i] / (double)span;
	}
}

/* Softmax of z[n] (log-weights) added to acc per `per` items. */
static void ref_mass(double *acc, const double *z, int64_t n, int per)
{
	double mx = -INFINITY, tot = 0;

	for (int64_t i = 0; i < n; i++)
		mx = z[i] > mx ? z[i] : mx;
	for (int64_t i = 0; i < n; i++)
		tot += exp(z[i] - mx);
	for (int64_t i = 0; i < n; i++)
		acc[i / per] += exp(z[i] - mx) / tot;
}

/* meank (per = 1) or subblock (per = KVMEM_SUBBLOCKS) from the raw keys. */
static void ref_meank(const struct hist *h, double *acc, int per)
{
	int grp = h->Hq / h->Hkv, span = h->B / per;
	double *z = malloc(sizeof(double) * h->nb * per), *qm = malloc(sizeof(double) * h->D);

	memset(acc, 0, sizeof(double) * h->nb);
	for (int l = 0; l < h->L; l++)
		for (int g = 0; g < h->Hkv; g++) {
			float qf[64];

			for (int i = 0; i < h->D; i++) {
				qm[i] = 0;
				for (int t = 0; t < h->T; t++)
					for (int x = g * grp; x < (g + 1) * grp; x++)
						qm[i] += hq(h, l, t, x)[i] / (grp * h->T);
				qf[i] = (float)qm[i];
			}
			ref_span_query(qm, qf, h->D, h->c.span);
			for (int64_t it = 0; it < h->nb * per; it++) {
				int64_t a = it * span, e = a + span < h->N ? a + span : h->N;
				double dot = 0;

				if (a >= h->N) {
					z[it] = -INFINITY;
					continue;
				}
				for (int i = 0; i < h->D; i++) {
					double m = 0;

					for (int64_t p = a; p < e; p++)
						m += hkey((struct hist *)h, p, l, g)[i];
					dot += qm[i] * m / (double)(e - a);
				}
				z[it] = dot / sqrt((double)h->D) + log((double)(e - a));
			}
			ref_mass(acc, z, h->nb * per, per);
		}
	free(z);
	free(qm);
}

static void expect_near(const float *got, const double *want, int64_t n, double tol)
{
	for (int64_t i = 0; i < n; i++)
		if (fabs(got[i] - want[i]) > tol * (1 + fabs(want[i])))
			fail_msg("item %lld: got %.8g, want %.8g", (long long)i, got[i], want[i]);
}

static void test_registry(void **state)
{
	const char *names[] = { "meank", "subblock", "refine", "quest", "recency", "random",
				"oracle" };
	int n = 0;

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		const kvmem_policy_ops *p = kvmem_policy_find(names[i]);

		assert_non_null(p);
		assert_string_equal(p->name, names[i]);
		assert_non_null(p->score);
		assert_true(p->needs & KVMEM_SUM_MEANK);
		assert_int_equal(p->per_layer, !strcmp(names[i], "quest"));
	}
	for (; kvmem_policies[n]; n++)
		;
	assert_true(n >= 7);	/* the shipped ones, and any added since */
	assert_string_equal(kvmem_policy_find(NULL)->name, "meank");
	assert_string_equal(kvmem_policy_find("")->name, "meank");
	assert_null(kvmem_policy_find("lru"));
	assert_non_null(strstr(kvmem_last_error(), "'lru'"));
	assert_non_null(strstr(kvmem_last_error(), "oracle"));
	assert_true(kvmem_policy_find("subblock")->needs & KVMEM_SUM_SUBBLOCK);
	assert_true(kvmem_policy_find("quest")->needs & KVMEM_SUM_MINMAX);
	assert_true(kvmem_policy_find("oracle")->needs & KVMEM_NEED_KEYS);
	assert_true(kvmem_policy_find("refine")->needs & KVMEM_NEED_KEYS);
	assert_int_equal(kvmem_policy_find("meank_neighbour")->needs, KVMEM_SUM_MEANK);	/* no page */
	assert_int_equal(kvmem_policy_find("subblock_neighbour")->needs,
			 KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK);
	assert_int_equal(kvmem_policy_find("subblock_newest")->needs,	/* the text, no page */
			 KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK | KVMEM_NEED_TEXT);
}

static void test_meank_formula(void **state)
{
	uint64_t rng = g_seed;

	for (int it = 0; it < 10; it++) {
		struct hist h;
		double *want, sum = 0;
		float *got;

		hist_random(&h, &rng, test_rng_int(&rng, 1, 700), 16 << test_rng_int(&rng, 0, 4));
		hist_commit(&h, KVMEM_SUM_MEANK);
		h.c.span = it % 2 ? test_rng_int(&rng, 1, 3000) : 0;
		got = run_policy(&h, "meank");
		want = malloc(sizeof(double) * h.nb);
		ref_meank(&h, want, 1);
		expect_near(got, want, h.nb, 1e-4);
		for (int64_t b = 0; b < h.nb; b++)
			sum += got[b];
		/* One unit of attention per (layer, KV head). */
		assert_true(fabs(sum - h.L * h.Hkv) < 1e-3 * h.L * h.Hkv);
		free(got);
		free(want);
		hist_free(&h);
	}
}

/*
 * got expanded as ws_expand_neighbours(.., k, raise_top) must expand it:
 * each block raised to just below its best neighbour among the top k of got
 * (the newer block first among equals), when that is above its own score;
 * with raise_top 0 a block among the top k itself is left as it is.
 */
static void expect_expanded(const float *exp_, const float *got, int64_t nb, int64_t k,
			    int raise_top)
{
	for (int64_t b = 0; b < nb; b++) {
		float want_b = got[b];
		int64_t over_b = 0;

		for (int64_t o = 0; o < nb; o++)
			over_b += got[o] > got[b] || (got[o] == got[b] && o > b);
		for (int d = -1; d <= 1 && (raise_top || over_b >= k); d += 2) {
			int64_t n = b + d, above = 0;

			if (n < 0 || n >= nb)
				continue;
			for (int64_t o = 0; o < nb; o++)
				above += got[o] > got[n] || (got[o] == got[n] && o > n);
			if (above < k && nextafterf(got[n], -INFINITY) > want_b)
				want_b = nextafterf(got[n], -INFINITY);
		}
		if (exp_[b] != want_b)
			fail_msg("block %lld of %lld: %.9g, want %.9g (unexpanded %.9g, k %lld)",
				 (long long)b, (long long)nb, exp_[b], want_b, got[b], (long long)k);
	}
}

/*
 * neighbour, meank_neighbour and subblock_neighbour without a budget are
 * refine, meank and subblock, bit for bit; with one, each of their
 * ranking's top budget / B blocks brings its two neighbours right behind
 * it (meank's and subblock's: those in the top already too; refine's: not,
 * neighbour's rule) and nothing else moves.
 */
static void test_neighbour_expansions(void **state)
{
	static const struct {
		const char *base, *expanded;
		int raise_top;
	} pol[] = { { "meank", "meank_neighbour", 1 }, { "subblock", "subblock_neighbour", 1 },
		    { "refine", "neighbour", 0 } };
	uint64_t rng = g_seed ^ 0x2b;

	for (int it = 0; it < 24; it++) {
		const int p = it % 3, wide = it % 6 < 3;
		struct hist h;
		float *plain, *got;
		int64_t k;

		hist_random(&h, &rng, test_rng_int(&rng, 1, 700), 16 << test_rng_int(&rng, 0, 2));
		hist_commit(&h, KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK);
		h.c.span = wide ? test_rng_int(&rng, 1, 3000) : 0;
		if (pol[p].raise_top) {	/* refine has no ranking without a budget */
			plain = run_policy(&h, pol[p].base);
			got = run_policy(&h, pol[p].expanded);
			assert_memory_equal(got, plain, sizeof(float) * h.nb);
			free(plain);
			free(got);
		}
		h.c.budget = h.B * test_rng_int(&rng, 1, wide ? 8 : (int)h.nb);
		plain = run_policy(&h, pol[p].base);	/* refine's shortlist is the budget's */
		got = run_policy(&h, pol[p].expanded);
		k = h.c.budget / h.B < h.nb ? h.c.budget / h.B : h.nb;
		expect_expanded(got, plain, h.nb, k, pol[p].raise_top);
		free(plain);
		free(got);
		hist_free(&h);
	}
}

static void test_subblock_formula(void **state)
{
	uint64_t rng = g_seed ^ 0x51;

	for (int it = 0; it < 10; it++) {
		struct hist h;
		double *want;
		float *got;

		/* Any length: partial last block with sub-blocks not yet begun. */
		hist_random(&h, &rng, test_rng_int(&rng, 1, 700), 16 << test_rng_int(&rng, 0, 4));
		hist_commit(&h, KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK);
		h.c.span = it % 2 ? test_rng_int(&rng, 1, 3000) : 0;
		got = run_policy(&h, "subblock");
		want = malloc(sizeof(double) * h.nb);
		ref_meank(&h, want, KVMEM_SUBBLOCKS);
		expect_near(got, want, h.nb, 1e-4);
		free(got);
		free(want);
		hist_free(&h);
	}
}

/* Rank of block b under scores (0 = best). */
static int rank_of(const float *sc, int64_t n, int64_t b)
{
	int r = 0;

	for (int64_t i = 0; i < n; i++)
		r += sc[i] > sc[b];
	return r;
}

/*
 * One block's keys lean along the query direction u (meank must rank it
 * first); another block has one quarter strongly along u and three quarters
 * against it, so its mean points away: meank ranks it low, subblock first.
 */
static void test_planted(void **state)
{
	uint64_t rng = g_seed ^ 0x77;

	for (int it = 0; it < 6; it++) {
		struct hist h;
		int64_t aligned, diluted;
		float *mk, *sb;

		hist_random(&h, &rng, 64 * 32, 32);
		aligned = test_rng_int(&rng, 0, (int)h.nb - 1);
		do
			diluted = test_rng_int(&rng, 0, (int)h.nb - 1);
		while (diluted == aligned);
		for (int l = 0; l < h.L; l++)
			for (int t = 0; t < h.T; t++)
				for (int x = 0; x < h.Hq; x++)
					for (int i = 0; i < h.D; i++)
						h.q[(((size_t)l * h.T + t) * h.Hq + x) * h.D + i] =
							(i % 2 ? 1.5f : -1.5f);
		for (int64_t p = 0; p < h.N; p++)
			for (int l = 0; l < h.L; l++)
				for (int g = 0; g < h.Hkv; g++) {
					float *k = hkey(&h, p, l, g), sign = 0;

					if (p / h.B == aligned)
						sign = 0.6f;
					else if (p / h.B == diluted)
						sign = (p % h.B) < h.B / 4 ? 2.5f : -1.5f;
					for (int i = 0; i < h.D; i++)
						k[i] += sign * (i % 2 ? 1.0f : -1.0f);
				}
		hist_commit(&h, KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK);
		mk = run_policy(&h, "meank");
		sb = run_policy(&h, "subblock");
		assert_int_equal(rank_of(mk, h.nb, aligned), 0);
		assert_true(rank_of(mk, h.nb, diluted) > h.nb / 2);
		assert_int_equal(rank_of(sb, h.nb, diluted), 0);
		free(mk);
		free(sb);
		hist_free(&h);
	}
}

static void test_quest(void **state)
{
	uint64_t rng = g_seed ^ 0x99;

	for (int it = 0; it < 8; it++) {
		struct hist h;
		double *want, *z;
		float *got;
		int grp;

		hist_random(&h, &rng, test_rng_int(&rng, 1, 600), 16 << test_rng_int(&rng, 0, 4));
		hist_commit(&h, KVMEM_SUM_MEANK | KVMEM_SUM_MINMAX);
		got = run_policy(&h, "quest");
		grp = h.Hq / h.Hkv;
		want = calloc(h.L * h.nb, sizeof(double));
		z = malloc(sizeof(double) * h.nb);
		for (int l = 0; l < h.L; l++)
			for (int x = 0; x < h.Hq; x++)
				for (int t = 0; t < h.T; t++) {
					const float *q = hq(&h, l, t, x);

					for (int64_t b = 0; b < h.nb; b++) {
						int64_t a = b * h.B, e = a + h.B < h.N ? a + h.B : h.N;
						double u = 0, best = -INFINITY;

						for (int i = 0; i < h.D; i++) {
							double lo = INFINITY, hi = -INFINITY;

							for (int64_t p = a; p < e; p++) {
								double v = hkey(&h, p, l, x / grp)[i];

								lo = v < lo ? v : lo;
								hi = v > hi ? v : hi;
							}
							u += fmax(q[i] * lo, q[i] * hi);
						}
						/* It is a bound: no key in the block beats it. */
						for (int64_t p = a; p < e; p++) {
							double dot = 0;

							for (int i = 0; i < h.D; i++)
								dot += (double)q[i] * hkey(&h, p, l, x / grp)[i];
							best = dot > best ? dot : best;
						}
						if (!(best <= u + 1e-9)) fail_msg("best %.17g u %.17g b %lld a %lld e %lld", best, u, (long long)b, (long long)a, (long long)e);
						z[b] = u / sqrt((double)h.D) + log((double)(e - a));
					}
					ref_mass(want + l * h.nb, z, h.nb, 1);
				}
		expect_near(got, want, h.L * h.nb, 1e-4);
		free(got);
		free(want);
		free(z);
		hist_free(&h);
	}
}

static void test_recency_random(void **state)
{
	uint64_t rng = g_seed ^ 0x31;
	struct hist h;
	float *r1, *r2, *r3;

	hist_random(&h, &rng, 777, 16);
	hist_commit(&h, KVMEM_SUM_MEANK);
	r1 = run_policy(&h, "recency");
	for (int64_t b = 1; b < h.nb; b++)
		assert_true(r1[b] > r1[b - 1]);
	free(r1);
	r1 = run_policy(&h, "random");
	h.c.step = 1;
	r2 = run_policy(&h, "random");
	h.c.step = 0;
	r3 = run_policy(&h, "random");
	assert_memory_equal(r1, r3, sizeof(float) * h.nb);
	assert_memory_not_equal(r1, r2, sizeof(float) * h.nb);
	h.c.seed = 43;
	free(r3);
	r3 = run_policy(&h, "random");
	assert_memory_not_equal(r1, r3, sizeof(float) * h.nb);
	for (int64_t b = 0; b < h.nb; b++)
		assert_true(r1[b] >= 0 && r1[b] < 1);
	free(r1);
	free(r2);
	free(r3);
	hist_free(&h);
}

/*
 * Per-token masses over the blocks list[0..n) (want[i] for list[i]): every
 * (layer, query head, query token) softmaxes its distance-averaged query
 * against every listed key it may see (causal), shares summed per block.
 */
static void ref_token_mass(const struct hist *h, const int64_t *list, int64_t n, double *want)
{
	int grp = h->Hq / h->Hkv;
	double *lg = malloc(sizeof(double) * n * h->B), q[64];

	memset(want, 0, sizeof(double) * n);
	for (int l = 0; l < h->L; l++)
		for (int x = 0; x < h->Hq; x++)
			for (int t = 0; t < h->T; t++) {
				double mx = -INFINITY, tot = 0;

				ref_span_query(q, hq(h, l, t, x), h->D, h->c.span);
				for (int64_t i = 0; i < n; i++)
					for (int j = 0; j < h->B; j++) {
						int64_t p = list[i] * h->B + j;
						double dot = 0;

						lg[i * h->B + j] = -INFINITY;
						if (p >= h->N || p > h->qpos[t])
							continue;
						for (int e = 0; e < h->D; e++)
							dot += q[e] * hkey((struct hist *)h, p, l, x / grp)[e];
						lg[i * h->B + j] = dot / sqrt((double)h->D);
						mx = fmax(mx, lg[i * h->B + j]);
					}
				if (mx == -INFINITY)
					continue;
				for (int64_t k = 0; k < n * h->B; k++)
					tot += exp(lg[k] - mx);
				for (int64_t k = 0; k < n * h->B; k++)
					want[k / h->B] += exp(lg[k] - mx) / tot;
			}
	free(lg);
}

static void test_oracle(void **state)
{
	uint64_t rng = g_seed ^ 0x0c;

	for (int it = 0; it < 6; it++) {
		struct hist h;
		double *want, sum = 0;
		int64_t *all;
		float *got;

		hist_random(&h, &rng, test_rng_int(&rng, 5, 500), 16 << test_rng_int(&rng, 0, 3));
		/* Query tokens not at the end: causality must cut the keys. */
		for (int t = 0; t < h.T; t++)
			h.qpos[t] = test_rng_int(&rng, 0, (int)h.N - 1);
		hist_commit(&h, KVMEM_SUM_MEANK);
		h.c.span = it % 2 ? test_rng_int(&rng, 1, 2000) : 0;
		got = run_policy(&h, "oracle");
		want = malloc(sizeof(double) * h.nb);
		all = malloc(sizeof(int64_t) * h.nb);
		for (int64_t b = 0; b < h.nb; b++)
			all[b] = b;
		ref_token_mass(&h, all, h.nb, want);
		expect_near(got, want, h.nb, 1e-4);
		for (int64_t b = 0; b < h.nb; b++)
			sum += got[b];
		assert_true(fabs(sum - h.L * h.Hq * h.T) < 1e-3 * h.L * h.Hq * h.T);
		free(got);
		free(want);
		free(all);
		hist_free(&h);
	}
}

/*
 * refine: the 4 x budget best blocks by subblock are scored by their keys
 * (1 + the per-token mass over the shortlist), every other block keeps
 * subblock's order below 1; no budget: subblock's scores.
 */
static void test_refine(void **state)
{
	uint64_t rng = g_seed ^ 0x2f;

	for (int it = 0; it < 6; it++) {
		struct hist h;
		float *sb, *rf;
		double *want;
		int64_t *list, m = 0;

		hist_random(&h, &rng, test_rng_int(&rng, 200, 1500), 16 << test_rng_int(&rng, 0, 2));
		hist_commit(&h, KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK);
		h.c.span = test_rng_int(&rng, 1, 2000);
		h.c.budget = h.B * test_rng_int(&rng, 1, (int)(h.nb / 6) + 1);
		sb = run_policy(&h, "subblock");
		rf = run_policy(&h, "refine");
		list = malloc(sizeof(int64_t) * h.nb);
		want = malloc(sizeof(double) * h.nb);
		/* The shortlist: subblock's best 4 x budget blocks (ties to the later). */
		for (int64_t b = 0; b < h.nb; b++) {
			int64_t better = 0;

			for (int64_t o = 0; o < h.nb; o++)
				better += sb[o] > sb[b] || (sb[o] == sb[b] && o > b);
			if (better < 4 * h.c.budget / h.B)
				list[m++] = b;
		}
		assert_int_equal(m, 4 * h.c.budget / h.B < h.nb ? 4 * h.c.budget / h.B : h.nb);
		ref_token_mass(&h, list, m, want);
		for (int64_t i = 0; i < m; i++)
			if (fabs(rf[list[i]] - (1 + want[i])) > 1e-4 * (2 + want[i]))
				fail_msg("shortlisted block %lld: %.8g, want 1 + %.8g",
					 (long long)list[i], rf[list[i]], want[i]);
		for (int64_t a = 0, i = 0; a < h.nb; a++) {
			if (i < m && list[i] == a) {
				i++;
				continue;
			}
			assert_true(rf[a] < 1);
			for (int64_t b = 0; b < h.nb; b++)
				if (rf[b] < 1 && sb[a] > sb[b])
					assert_true(rf[a] >= rf[b]);
		}
		h.c.budget = 0;
		free(rf);
		rf = run_policy(&h, "refine");
		assert_memory_equal(rf, sb, sizeof(float) * h.nb);
		free(sb);
		free(rf);
		free(list);
		free(want);
		hist_free(&h);
	}
}

/*
 * One key strongly along the query among block-mates leaning against it:
 * every mean of its block points away, so subblock ranks the block low;
 * refine (shortlist of everything) scores the key itself and ranks it first.
 */
static void test_refine_planted(void **state)
{
	uint64_t rng = g_seed ^ 0x3d;

	for (int it = 0; it < 4; it++) {
		struct hist h;
		int64_t star;
		float *sb, *rf;

		hist_random(&h, &rng, 64 * 32, 32);
		star = test_rng_int(&rng, 0, (int)h.nb - 2);
		for (size_t i = 0; i < (size_t)h.L * h.T * h.Hq * h.D; i++)
			h.q[i] = (i % 2 ? 1.5f : -1.5f);
		for (int64_t p = star * h.B; p < (star + 1) * h.B; p++)
			for (int l = 0; l < h.L; l++)
				for (int g = 0; g < h.Hkv; g++) {
					float *k = hkey(&h, p, l, g), w = p % h.B == 5 ? 4.0f : -1.5f;

					for (int i = 0; i < h.D; i++)
						k[i] += w * (i % 2 ? 1.0f : -1.0f);
				}
		hist_commit(&h, KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK);
		h.c.span = 1;	/* no rotation: the planted direction counts as is */
		h.c.budget = h.N;
		sb = run_policy(&h, "subblock");
		rf = run_policy(&h, "refine");
		assert_true(rank_of(sb, h.nb, star) > h.nb / 2);
		assert_int_equal(rank_of(rf, h.nb, star), 0);
		free(sb);
		free(rf);
		hist_free(&h);
	}
}

/* ---- lexical -------------------------------------------------------------- */
/*
 * BM25 over blocks restated slowly (lexical.h): the query's distinct
 * unigrams and adjacent ordered pairs of its last LEX_MAX_TEXT (256)
 * tokens; a pair belongs to the block of its second token; k1 1.2, b 0.75.
 */
static void ref_lexical(const int32_t *tok, int64_t N, int B, const int32_t *text, int64_t nt,
			double *want)
{
	int64_t nb = (N + B - 1) / B, m = 0;
	int64_t (*terms)[2] = malloc(sizeof(*terms) * 2 * (size_t)(nt > 0 ? nt : 1));	/* {a, b}; a -1: unigram b */

	if (nt > 256) {
		text += nt - 256;
		nt = 256;
	}
	for (int64_t i = 0; i < nt; i++)
		for (int k = 0; k < 2; k++) {
			int64_t a = k ? (i ? text[i - 1] : -2) : -1, b = text[i], dup = 0;

			if (a == -2)
				continue;
			for (int64_t j = 0; j < m; j++)
				dup |= terms[j][0] == a && terms[j][1] == b;
			if (!dup)
				terms[m][0] = a, terms[m][1] = b, m++;
		}
	for (int64_t b = 0; b < nb; b++)
		want[b] = 0;
	for (int64_t t = 0; t < m; t++) {
		double *tf = calloc(nb, sizeof(double)), df = 0, idf;

		for (int64_t p = 0; p < N; p++)
			if (tok[p] == terms[t][1] && (terms[t][0] == -1 || (p > 0 && tok[p - 1] == terms[t][0])))
				tf[p / B] += 1;
		for (int64_t b = 0; b < nb; b++)
			df += tf[b] > 0;
		idf = log(1 + (nb - df + 0.5) / (df + 0.5));
		for (int64_t b = 0; b < nb; b++) {
			double len = b < nb - 1 ? B : N - (nb - 1) * B;

			want[b] += idf * tf[b] * 2.2 / (tf[b] + 1.2 * (0.25 + 0.75 * len / ((double)N / nb)));
		}
		free(tf);
	}
	free(terms);
}

/*
 * The superseded blocks, slowly: the longest suffix of the text's last 256
 * tokens that ends somewhere before `end` (the text's own place when it is
 * in the history), and when it is 3 tokens or more, the blocks of its
 * occurrences but the newest one's. Scales want[] by factor there (lexical's
 * 0.1).
 */
static void ref_supersede(const int32_t *tok, int64_t end, int B, const int32_t *text, int64_t nt,
			  double *want, double factor)
{
	int64_t best = 0, newest = -1;

	if (nt > 256) {
		text += nt - 256;
		nt = 256;
	}
	for (int64_t len = 1; len <= nt; len++)
		for (int64_t p = len - 1; p < end; p++)
			if (!memcmp(tok + p - len + 1, text + nt - len, sizeof(int32_t) * len))
				best = len, newest = p;
	if (best < 3)
		return;
	for (int64_t b = 0; b <= (end - 1) / B; b++)
		for (int64_t p = b * B; p < (b + 1) * B && p < newest; p++)
			if (p >= best - 1 && b != newest / B &&
			    !memcmp(tok + p - best + 1, text + nt - best, sizeof(int32_t) * best)) {
				want[b] *= factor;
				break;
			}
}

static kvmem_select_ctx lex_ctx(const int32_t *tok, int64_t N, int B, const int32_t *text,
				int64_t nt, int64_t budget)
{
	return (kvmem_select_ctx){ .n_tokens = N, .n_blocks = (N + B - 1) / B, .block = B,
				   .budget = budget, .tokens = tok, .text = text, .n_text = nt };
}

/*
 * lexical without a budget is BM25 itself; with one, each of the top
 * budget / B matched blocks brings its two neighbours right behind it
 * (those in the top already too) and nothing else moves. Texts are random, the history's own tokens and
 * longer than the 256 the query keeps.
 */
static void test_lexical_formula(void **state)
{
	uint64_t rng = g_seed ^ 0x1e;
	const kvmem_policy_ops *p = kvmem_policy_find("lexical");

	assert_non_null(p);
	for (int it = 0; it < 12; it++) {
		int B = 16 << test_rng_int(&rng, 0, 2), vocab = test_rng_int(&rng, 3, 60);
		int64_t N = test_rng_int(&rng, 1, 3000), nt = test_rng_int(&rng, 0, it % 4 ? 12 : 400);
		int64_t nb = (N + B - 1) / B, k, matched = 0;
		int32_t *tok = malloc(sizeof(int32_t) * N), *text = malloc(sizeof(int32_t) * (nt + 1));
		double *want = malloc(sizeof(double) * nb);
		float *got = malloc(sizeof(float) * nb), *exp_ = malloc(sizeof(float) * nb);
		kvmem_select_ctx c;

		for (int64_t i = 0; i < N; i++)
			tok[i] = test_rng_int(&rng, 0, vocab - 1);
		for (int64_t i = 0; i < nt; i++)
			text[i] = it % 3 == 0 && nt <= N ? tok[N - nt + i] : test_rng_int(&rng, 0, vocab + 5);
		ref_lexical(tok, N, B, text, nt, want);
		ref_supersede(tok, N, B, text, nt, want, 0.1);
		c = lex_ctx(tok, N, B, text, nt, 0);
		assert_int_equal(p->score(&c, got), 0);
		expect_near(got, want, nb, 1e-5);
		if (it % 3 == 0 && nt <= N && nt > 0) {
			/* The text is the history's tail, as after an append: its
			 * own place does not count as an occurrence. */
			int64_t qpos = N - 1;

			ref_lexical(tok, N, B, text, nt, want);
			ref_supersede(tok, N - (nt < 256 ? nt : 256), B, text, nt, want, 0.1);
			c.n_q = 1;
			c.q_pos = &qpos;
			assert_int_equal(p->score(&c, exp_), 0);
			expect_near(exp_, want, nb, 1e-5);
			c.n_q = 0;
			c.q_pos = NULL;
		}
		/* With a budget: the expansion of the BM25 order. Budgets up to
		 * the whole history: where the top k are most blocks, a top
		 * block's neighbour that is in the top k but low in it is raised
		 * too (else the raised blocks push it out). */
		c.budget = B * test_rng_int(&rng, 1, it % 2 ? 8 : (int)nb);
		assert_int_equal(p->score(&c, exp_), 0);
		for (int64_t b = 0; b < nb; b++)
			matched += got[b] > 0;
		k = c.budget / B < matched ? c.budget / B : matched;
		expect_expanded(exp_, got, nb, k, 1);
		free(tok);
		free(text);
		free(want);
		free(got);
		free(exp_);
	}
}

/*
 * subblock_newest is subblock_neighbour's scores with the blocks of the
 * text's older occurrences (ref_supersede's) scaled by 1e-3, bit for bit,
 * with and without a budget; without a text it is subblock_neighbour;
 * without token ids it refuses.
 */
static void test_subblock_newest(void **state)
{
	uint64_t rng = g_seed ^ 0x2c;
	int64_t superseded = 0;

	for (int it = 0; it < 16; it++) {
		struct hist h;
		int vocab = test_rng_int(&rng, 3, 6);
		int64_t nt = test_rng_int(&rng, 3, 8), old = 0;
		int32_t *tok, text[8];
		double *flag;
		float *plain, *got;

		/* every fourth time at least 100 tokens: room for the planted pair below */
		hist_random(&h, &rng, test_rng_int(&rng, it % 4 == 1 ? 100 : 16, 700),
			    16 << test_rng_int(&rng, 0, 1));
		hist_commit(&h, KVMEM_SUM_MEANK | KVMEM_SUM_SUBBLOCK);
		tok = malloc(sizeof(int32_t) * h.N);
		flag = malloc(sizeof(double) * h.nb);
		for (int64_t i = 0; i < h.N; i++)	/* a small vocabulary: endings recur */
			tok[i] = test_rng_int(&rng, 0, vocab - 1);
		{	/* the tokens ending somewhere in the history; every fourth
			 * time a token no history holds: nothing superseded */
			const int64_t at = test_rng_int(&rng, (int)nt - 1, (int)h.N - 1);

			for (int64_t i = 0; i < nt; i++)
				text[i] = it % 4 == 3 ? vocab + 1 : tok[at - nt + 1 + i];
			if (it % 4 == 1)	/* the whole text in block 0 and again ending
						 * just before the query's place (a later block):
						 * block 0 is superseded whatever the draw */
				for (int64_t i = 0; i < nt; i++)
					tok[i] = tok[h.N - 2 * nt - 1 + i] = text[i];
		}
		h.c.tokens = tok;	/* the queries' places end the history (hist_random's):
					 * the text is taken to be its last nt tokens */
		if (it % 2)
			h.c.budget = h.B * test_rng_int(&rng, 1, (int)h.nb);
		plain = run_policy(&h, "subblock_neighbour");
		h.c.text = text;
		h.c.n_text = nt;
		got = run_policy(&h, "subblock_newest");
		for (int64_t b = 0; b < h.nb; b++)
			flag[b] = 1.0;
		ref_supersede(tok, h.N - nt, h.B, text, nt, flag, 0.0);
		for (int64_t b = 0; b < h.nb; b++) {
			const float want = flag[b] == 0.0 ? plain[b] * 1e-3f : plain[b];

			assert_memory_equal(&got[b], &want, sizeof(float));
			old += flag[b] == 0.0;
		}
		if (it % 4 == 3)
			assert_int_equal(old, 0);
		if (it % 4 == 1)
			assert_true(flag[0] == 0.0);
		superseded += old;
		free(got);
		h.c.text = NULL;	/* no text: subblock_neighbour */
		h.c.n_text = 0;
		got = run_policy(&h, "subblock_newest");
		assert_memory_equal(got, plain, sizeof(float) * h.nb);
		free(got);
		h.c.text = text;
		h.c.n_text = nt;
		h.c.tokens = NULL;
		got = malloc(sizeof(float) * h.nb);
		assert_int_equal(kvmem_policy_find("subblock_newest")->score(&h.c, got), -EINVAL);
		assert_non_null(strstr(kvmem_last_error(), "token ids"));
		free(got);
		free(plain);
		free(flag);
		free(tok);
		hist_free(&h);
	}
	assert_true(superseded > 0);	/* the rule was exercised */
}

/*
 * A fact line, a look-alike that holds every word of the question but one
 * more token inside the file name (`api 2 .conf` against `api .conf`) and,
 * every other time, an older value of the same key: the pairs rank the
 * fact's block above the look-alike's (unigrams alone do not: it holds
 * every one of them), and the fact, the newest occurrence of the
 * question's ending, supersedes the older value. Without token ids the
 * policy refuses; without a text every block scores 0.
 */
static void test_lexical_planted(void **state)
{
	enum { B = 32, N = 40 * B, API = 101, TWO = 102, CONF = 103, DB = 104, PORT = 105, EQ = 4,
	       NL = 6 };
	const int32_t fact[] = { API, CONF, DB, PORT, EQ, 54, 32, NL };
	const int32_t look[] = { API, TWO, CONF, DB, PORT, EQ, 77, 12, NL };
	const int32_t stale[] = { API, CONF, DB, PORT, EQ, 11, 22, NL };
	const int32_t question[] = { 3, API, CONF, DB, PORT, EQ };
	uint64_t rng = g_seed ^ 0x1f;
	int32_t tok[N];
	float sc[N / B];
	kvmem_select_ctx c;
	const kvmem_policy_ops *p = kvmem_policy_find("lexical");

	for (int it = 0; it < 8; it++) {
		int64_t at = test_rng_int(&rng, 8, 15) * B + test_rng_int(&rng, 0, B - 10);
		int64_t st = test_rng_int(&rng, 1, 6) * B + test_rng_int(&rng, 0, B - 10);
		int64_t lk = test_rng_int(&rng, 20, 38) * B + test_rng_int(&rng, 0, B - 10);
		int64_t best = 0;

		for (int i = 0; i < N; i++)
			tok[i] = test_rng_int(&rng, 7, 100);	/* filler: no term of the question but = */
		for (int i = 0; i < N; i += test_rng_int(&rng, 5, 12))
			tok[i] = EQ;
		memcpy(tok + at, fact, sizeof(fact));
		memcpy(tok + lk, look, sizeof(look));
		if (it % 2)
			memcpy(tok + st, stale, sizeof(stale));
		c = lex_ctx(tok, N, B, question, 6, 0);
		assert_int_equal(p->score(&c, sc), 0);
		for (int64_t b = 1; b < N / B; b++)
			best = sc[b] >= sc[best] ? b : best;
		/* The fact's block (the pairs: the look-alike holds every
		 * token); the older value of the same key, as strong a match,
		 * is superseded: a tenth. */
		assert_int_equal(best, at / B);
		if (it % 2)
			assert_true(sc[st / B] < 0.2f * sc[at / B]);
		/* The same after appending the question (a plain selection):
		 * its own place at the end is not the newest occurrence. */
		{
			int64_t qpos = N - 1;

			memcpy(tok + N - 6, question, sizeof(question));
			c = lex_ctx(tok, N, B, tok + N - 6, 6, 0);
			c.n_q = 1;
			c.q_pos = &qpos;
			assert_int_equal(p->score(&c, sc), 0);
			assert_true(sc[at / B] > sc[st / B] && sc[at / B] > sc[lk / B]);
		}
	}
	c.tokens = NULL;
	assert_int_equal(p->score(&c, sc), -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "token ids"));
	c = lex_ctx(tok, N, B, question, 0, 4 * B);
	assert_int_equal(p->score(&c, sc), 0);
	for (int b = 0; b < N / B; b++)
		assert_true(sc[b] == 0);
}

/*
 * The token ids and the query text (kvmem_select_ctx's last fields) change
 * nothing for a policy that does not ask for them (no KVMEM_NEED_TEXT):
 * every registered policy but the text ones scores the same bits with
 * them as without, on the same history, queries and budget. What holds
 * every policy of before the fields came to what it measured.
 */
static void test_text_blind(void **state)
{
	uint64_t rng = g_seed ^ 0x7b;
	const kvmem_policy_ops *p;
	int checked = 0;

	for (int i = 0; (p = kvmem_policy_at(i)); i++) {
		struct hist h;
		int32_t *tok, text[9];
		float *plain, *with;
		int sets;

		if (p->needs & KVMEM_NEED_TEXT)
			continue;
		hist_random(&h, &rng, test_rng_int(&rng, 40, 400), 16);
		hist_commit(&h, KVMEM_SUM_MEANK | KVMEM_SUM_MINMAX | KVMEM_SUM_SUBBLOCK);
		h.c.budget = 16 * test_rng_int(&rng, 1, (int)h.nb);
		plain = run_policy(&h, p->name);
		tok = malloc(sizeof(int32_t) * h.N);
		for (int64_t t = 0; t < h.N; t++)
			tok[t] = test_rng_int(&rng, 0, 50);
		for (int t = 0; t < 9; t++)
			text[t] = tok[h.N - 9 + t];
		h.c.tokens = tok;
		h.c.text = text;
		h.c.n_text = 9;
		with = run_policy(&h, p->name);
		sets = p->per_layer ? h.L : 1;
		if (memcmp(plain, with, sizeof(float) * sets * h.nb))
			fail_msg("policy %s scores differently with the token ids given", p->name);
		checked++;
		free(plain);
		free(with);
		free(tok);
		hist_free(&h);
	}
	assert_true(checked >= 10);
}

/* Policies whose summaries are missing say so instead of reading garbage. */
static void test_missing_summaries(void **state)
{
	uint64_t rng = g_seed ^ 0x4;
	struct hist h;
	float sc[64];

	hist_random(&h, &rng, 100, 16);
	hist_commit(&h, KVMEM_SUM_MEANK);
	assert_true(kvmem_policy_find("quest")->score(&h.c, sc) < 0);
	assert_non_null(strstr(kvmem_last_error(), "min/max"));
	assert_true(kvmem_policy_find("subblock")->score(&h.c, sc) < 0);
	assert_non_null(strstr(kvmem_last_error(), "sub-block"));
	h.c.keys = NULL;
	assert_true(kvmem_policy_find("oracle")->score(&h.c, sc) < 0);
	hist_free(&h);
}

/*
 * Scores do not depend on the thread count: an index of 40000 blocks
 * (several work chunks, parallel regions engaged), scored with 1, 2 and 3
 * threads, gives the same bits for every index policy.
 */
static void test_thread_independent(void **state)
{
	uint64_t rng = g_seed ^ 0x7e;
	const char *names[] = { "meank", "subblock", "quest" };
	const int64_t nb = 40000;
	kvmem_index ix;
	float q[2 * 2 * 4 * 16];
	int64_t qpos[2] = { nb * 16 - 2, nb * 16 - 1 };
	kvmem_select_ctx c = {
		.index = &ix, .n_tokens = nb * 16 - 5, .n_blocks = nb, .block = 16, .n_layers = 2,
		.n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .rope_theta = 1e4, .n_q = 2,
		.q = q, .q_pos = qpos,
	};

	for (size_t i = 0; i < sizeof(q) / sizeof(q[0]); i++)
		q[i] = (float)test_rng_range(&rng, -2, 2);
	assert_int_equal(kvmem_index_init(&ix, 2, 2, 16, 16, KVMEM_SUM_MINMAX | KVMEM_SUM_SUBBLOCK), 0);
	assert_int_equal(kvmem_index_reserve(&ix, nb), 0);
	ix.n_tokens = c.n_tokens;
	ix.n_blocks = nb;
	for (size_t i = 0; i < (size_t)4 * ix.cap_blocks * 16; i++) {
		ix.meank[i] = (float)test_rng_range(&rng, -1, 1);
		ix.kmin[i] = ix.meank[i] - (float)test_rng_range(&rng, 0, 1);
		ix.kmax[i] = ix.meank[i] + (float)test_rng_range(&rng, 0, 1);
	}
	for (size_t i = 0; i < (size_t)4 * ix.cap_blocks * 16 * KVMEM_SUBBLOCKS; i++)
		ix.sub[i] = (float)test_rng_range(&rng, -1, 1);
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		const kvmem_policy_ops *p = kvmem_policy_find(names[k]);
		size_t n = (size_t)(p->per_layer ? 2 : 1) * nb;
		float *ref = malloc(sizeof(float) * n), *sc = malloc(sizeof(float) * n);

		omp_set_num_threads(1);
		assert_int_equal(p->score(&c, ref), 0);
		for (int t = 2; t <= 3; t++) {
			omp_set_num_threads(t);
			assert_int_equal(p->score(&c, sc), 0);
			assert_memory_equal(ref, sc, sizeof(float) * n);
		}
		free(ref);
		free(sc);
	}
	kvmem_index_free(&ix);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_registry),
		cmocka_unit_test(test_meank_formula),
		cmocka_unit_test(test_neighbour_expansions),
		cmocka_unit_test(test_subblock_formula),
		cmocka_unit_test(test_planted),
		cmocka_unit_test(test_quest),
		cmocka_unit_test(test_recency_random),
		cmocka_unit_test(test_oracle),
		cmocka_unit_test(test_refine),
		cmocka_unit_test(test_refine_planted),
		cmocka_unit_test(test_lexical_formula),
		cmocka_unit_test(test_lexical_planted),
		cmocka_unit_test(test_subblock_newest),
		cmocka_unit_test(test_text_blind),
		cmocka_unit_test(test_missing_summaries),
		cmocka_unit_test(test_thread_independent),
	};

	g_seed = test_rng_fresh_seed("test_ws_policy");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

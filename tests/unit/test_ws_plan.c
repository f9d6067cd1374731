// SPDX-License-Identifier: MIT
/*
 * The view planner over random step sequences: plans are chronological, at
 * compact positions, within budget, hold every pin, the newest block, sink
 * and recent when they fit, the best-scored of the rest (checked against a
 * plain sort), the same token count in every set, and a right diff. The
 * stable layout: the same blocks, tiling the view; a kept block keeps its
 * slot, entering ones take freed slots, the recent run last (hand-made
 * cases, and the rule over the random sequences).
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
#include "session/inspect.h"
#include "helpers/test_model.h"

static uint64_t g_seed;

static const float *g_sort_scores;

/* Best first: higher score, then the later block; NaN lowest. */
static int by_score(const void *pa, const void *pb)
{
	int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
	float x = g_sort_scores[a], y = g_sort_scores[b];

	x = isnan(x) ? -INFINITY : x;
	y = isnan(y) ? -INFINITY : y;
	if (x != y)
		return x > y ? -1 : 1;
	return a > b ? -1 : (a < b);
}

/* The planner's rules written out the slow way: mark[b] = 1 if chosen. */
static int ref_plan(const kvmem_blocks *r, const float *sc, const kvmem_plan_params *pp,
		    unsigned char *mark)
{
	int64_t N = r->n_tokens, nb = kvmem_blocks_count(r), room = pp->budget, k, n = 0;
	int64_t *cand = malloc(sizeof(int64_t) * (nb + 1));

	memset(mark, 0, (size_t)nb);
	for (int64_t b = 0; b < nb; b++)
		for (int i = 0; i < r->n_pins; i++)
			if (r->pins[i].start < (b + 1) * r->block && r->pins[i].end > b * r->block &&
			    r->pins[i].start < N)
				mark[b] = 1;
	for (int64_t b = 0; b < nb; b++)
		room -= mark[b] ? kvmem_block_len(r, b) : 0;
	if (room < 0) {
		free(cand);
		return -1;
	}
#define TAKE(b) do { if (!mark[b] && kvmem_block_len(r, b) <= room) { mark[b] = 1; \
		room -= kvmem_block_len(r, b); } } while (0)
	if (!mark[nb - 1]) {
		if (kvmem_block_len(r, nb - 1) <= room)
			TAKE(nb - 1);
		else
			mark[nb - 1] = 2;
	}
	for (int64_t b = 0; b * r->block < pp->sink && b < nb; b++)
		TAKE(b);
	for (int64_t b = nb - 1; b >= 0 && (b + 1) * r->block > N - pp->recent; b--)
		TAKE(b);
#undef TAKE
	for (int64_t b = 0; b < nb; b++)
		if (!mark[b])
			cand[n++] = b;
	g_sort_scores = sc;
	qsort(cand, (size_t)n, sizeof(int64_t), by_score);
	k = room / r->block;
	for (int64_t i = 0; i < k && i < n; i++)
		mark[cand[i]] = 1;
	for (int64_t b = 0; b < nb; b++)
		mark[b] = mark[b] == 1;
	free(cand);
	return 0;
}

/* Where block b's tokens are now (the planner's rule, written out): its
 * old start when it was whole then, its tail slot when appended since,
 * else -1. */
static int64_t now_at(const kvmem_plan *prev, int set, const kvmem_blocks *r, int64_t b)
{
	const int64_t B = r->block, sel = prev ? prev->n_tokens : 0;
	const int64_t end = prev ? prev->view_tokens : 0;

	if (b * B >= sel)
		return end + b * B - sel;
	if (b * B + B > sel || !prev)
		return -1;	/* partial then: only the session's walk knows */
	for (int j = 0; j < prev->n_view; j++)
		if (prev->blocks[(size_t)set * prev->n_view + j] == b)
			return prev->start[(size_t)set * prev->n_view + j];
	return -1;
}

/*
 * Stable starts of set s: the recent run (the newest block and those
 * before it, consecutive, holding tokens of the last `recent`) in order
 * from A, the body's tokens; every body block full, at its own aligned
 * slot below A, and at its old one when that was aligned and below A.
 */
static void check_stable(const kvmem_plan *p, int s, const kvmem_plan *prev,
			 const kvmem_blocks *r, const kvmem_plan_params *pp)
{
	const int64_t *b = p->blocks + (size_t)s * p->n_view;
	const int64_t *st = p->start + (size_t)s * p->n_view;
	const int64_t B = r->block, N = r->n_tokens, nb = kvmem_blocks_count(r);
	int ps = prev && prev->n_sets == p->n_sets ? s : 0, run = p->n_view;
	int64_t A = 0, at;
	unsigned char *used = calloc((size_t)p->n_view + 1, 1);

	while (run > 0 && b[run - 1] == (run == p->n_view ? nb - 1 : b[run] - 1) &&
	       (run == p->n_view || b[run - 1] * B + B > N - pp->recent))
		run--;
	for (int i = 0; i < run; i++)
		A += kvmem_block_len(r, b[i]);
	for (int i = 0; i < run; i++) {
		int64_t v = prev && prev->n_view ? now_at(prev, ps, r, b[i]) : b[i] * B;

		assert_int_equal(kvmem_block_len(r, b[i]), B);
		assert_true(st[i] % B == 0 && st[i] + B <= A);
		assert_false(used[st[i] / B]);
		used[st[i] / B] = 1;
		if (v >= 0 && v % B == 0 && v + B <= A)
			assert_int_equal(st[i], v);
	}
	at = A;
	for (int i = run; i < p->n_view; i++) {
		assert_int_equal(st[i], at);
		at += kvmem_block_len(r, b[i]);
	}
	assert_int_equal(at, p->view_tokens);
	free(used);
}

static void check_plan(const kvmem_plan *p, const kvmem_plan *prev, const kvmem_blocks *r,
		       const float *scores, const kvmem_plan_params *pp)
{
	int64_t nb = kvmem_blocks_count(r);
	unsigned char *want = malloc((size_t)nb + 1);
	int64_t reused = 0, entering = 0, born = 0, left = 0;

	assert_true(p->view_tokens <= pp->budget);
	assert_int_equal(p->n_tokens, r->n_tokens);
	assert_int_equal(p->ws_blocks, nb);
	for (int s = 0; s < p->n_sets; s++) {
		const int64_t *b = p->blocks + (size_t)s * p->n_view;
		const int64_t *st = p->start + (size_t)s * p->n_view;
		int64_t pos = 0;

		/* The same blocks as the slow reference, in order, at prefix sums. */
		assert_int_equal(ref_plan(r, scores + (size_t)s * nb, pp, want), 0);
		for (int i = 0; i < p->n_view; i++) {
			assert_true(b[i] >= 0 && b[i] < nb);
			if (i)
				assert_true(b[i - 1] < b[i]);
			if (pp->layout != KVMEM_LAYOUT_STABLE)
				assert_int_equal(st[i], pos);
			assert_true(want[b[i]]);
			want[b[i]] = 0;
			pos += kvmem_block_len(r, b[i]);
		}
		for (int64_t x = 0; x < nb; x++)
			assert_false(want[x]);
		assert_int_equal(pos, p->view_tokens);
		if (pp->layout == KVMEM_LAYOUT_STABLE)
			check_stable(p, s, prev, r, pp);
		/* Pins are all there. */
		for (int i = 0; i < r->n_pins && r->pins[i].start < r->n_tokens; i++) {
			int64_t e = r->pins[i].end < r->n_tokens ? r->pins[i].end : r->n_tokens;

			for (int64_t x = kvmem_block_of(r, r->pins[i].start); x <= kvmem_block_of(r, e - 1); x++) {
				int found = 0;

				for (int j = 0; j < p->n_view; j++)
					found |= b[j] == x;
				assert_true(found);
			}
		}
		/* Newest present unless the plan says it could not fit. */
		if (!p->newest_dropped)
			assert_int_equal(b[p->n_view - 1], nb - 1);
		else
			assert_true(kvmem_blocks_pinned_tokens(r, r->n_tokens) +
				    kvmem_block_len(r, nb - 1) > pp->budget);
		/* Diff against the previous plan. */
		const int64_t *ob = prev && prev->n_view ? prev->blocks +
			(size_t)(prev->n_sets == p->n_sets ? s : 0) * prev->n_view : NULL;
		int on = ob ? prev->n_view : 0;

		for (int i = 0; i < p->n_view; i++) {
			int in_old = 0;

			for (int j = 0; j < on; j++)
				in_old |= ob[j] == b[i];
			int want_state = in_old ? KVMEM_VIEW_REUSED :
				(prev && b[i] < prev->ws_blocks ? KVMEM_VIEW_ENTERING : KVMEM_VIEW_NEW);

			assert_int_equal(p->state[(size_t)s * p->n_view + i], want_state);
			reused += want_state == KVMEM_VIEW_REUSED;
			entering += want_state == KVMEM_VIEW_ENTERING;
			born += want_state == KVMEM_VIEW_NEW;
		}
		int nl = 0;

		for (int j = 0; j < on; j++) {
			int in_new = 0;

			for (int i = 0; i < p->n_view; i++)
				in_new |= ob[j] == b[i];
			if (!in_new) {
				assert_true(nl < p->n_left[s]);
				assert_int_equal(p->left[(size_t)s * on + nl], ob[j]);
				nl++;
			}
		}
		assert_int_equal(nl, p->n_left[s]);
		left += nl;
	}
	assert_int_equal(p->reused, reused);
	assert_int_equal(p->entering, entering);
	assert_int_equal(p->born, born);
	assert_int_equal(p->n_left_total, left);
	free(want);
}

static void random_scores(uint64_t *rng, float *sc, int64_t n)
{
	int mode = test_rng_int(rng, 0, 3);

	for (int64_t i = 0; i < n; i++) {
		if (mode == 0)		/* many ties */
			sc[i] = (float)test_rng_int(rng, 0, 3);
		else if (mode == 1 && test_rng_int(rng, 0, 9) == 0)
			sc[i] = NAN;
		else
			sc[i] = (float)test_rng_range(rng, -5, 5);
	}
}

/* Random step sequences: growing history, pins, per-layer sets, chained. */
static void test_plan_sequences(void **state)
{
	uint64_t rng = g_seed;

	for (int it = 0; it < 150; it++) {
		int B = 16 << test_rng_int(&rng, 0, 4), n_sets = test_rng_int(&rng, 0, 1) ? 1 :
			test_rng_int(&rng, 2, 5);
		kvmem_plan_params pp = {
			.budget = B * test_rng_int(&rng, 1, 40) + test_rng_int(&rng, 0, B - 1),
			.sink = test_rng_int(&rng, 0, 3) * test_rng_int(&rng, 0, 70),
			.recent = test_rng_int(&rng, 0, 3) * test_rng_int(&rng, 0, 200),
			.layout = it % 2 ? KVMEM_LAYOUT_STABLE : KVMEM_LAYOUT_COMPACT,
		};
		kvmem_blocks r;
		kvmem_plan prev = { 0 }, p = { 0 };

		assert_int_equal(kvmem_blocks_init(&r, B), 0);
		for (int step = 0; step < 12; step++) {
			r.n_tokens += test_rng_int(&rng, 1, 6 * B);
			if (test_rng_int(&rng, 0, 2) == 0) {
				int64_t s0 = test_rng_int(&rng, 0, (int)r.n_tokens - 1);

				kvmem_blocks_pin(&r, s0, s0 + test_rng_int(&rng, 1, 2 * B));
				if (kvmem_blocks_pinned_tokens(&r, r.n_tokens) > pp.budget)
					kvmem_blocks_unpin(&r, s0, s0 + 2 * B);
			}
			if (kvmem_blocks_pinned_tokens(&r, r.n_tokens) > pp.budget)
				kvmem_blocks_unpin(&r, 0, r.n_tokens);
			int64_t nb = kvmem_blocks_count(&r);
			float *sc = malloc(sizeof(float) * n_sets * nb);

			random_scores(&rng, sc, n_sets * nb);
			assert_int_equal(kvmem_plan_build(&p, &r, sc, n_sets, &prev, &pp), 0);
			check_plan(&p, &prev, &r, sc, &pp);
			kvmem_plan_free(&prev);
			prev = p;
			memset(&p, 0, sizeof(p));
			free(sc);
		}
		kvmem_plan_free(&prev);
		kvmem_blocks_free(&r);
	}
}

/* Budget over the history: every block, identity layout, all new at first. */
static void test_plan_identity(void **state)
{
	uint64_t rng = g_seed ^ 0x1234;

	for (int it = 0; it < 50; it++) {
		int B = 16 << test_rng_int(&rng, 0, 4);
		kvmem_blocks r;
		kvmem_plan p = { 0 };

		assert_int_equal(kvmem_blocks_init(&r, B), 0);
		r.n_tokens = test_rng_int(&rng, 1, 3000);
		/* either layout: with every block in, stable is compact */
		kvmem_plan_params pp = { r.n_tokens + test_rng_int(&rng, 0, 100), 4, 10,
					  it % 2 ? KVMEM_LAYOUT_STABLE : KVMEM_LAYOUT_COMPACT };
		int64_t nb = kvmem_blocks_count(&r);
		float *sc = malloc(sizeof(float) * nb);

		random_scores(&rng, sc, nb);
		assert_int_equal(kvmem_plan_build(&p, &r, sc, 1, NULL, &pp), 0);
		assert_int_equal(p.n_view, nb);
		assert_int_equal(p.view_tokens, r.n_tokens);
		for (int i = 0; i < p.n_view; i++) {
			assert_int_equal(p.blocks[i], i);
			assert_int_equal(p.start[i], (int64_t)i * B);
			assert_int_equal(p.state[i], KVMEM_VIEW_NEW);
		}
		assert_int_equal(p.born, nb);
		free(sc);
		kvmem_plan_free(&p);
		kvmem_blocks_free(&r);
	}
}

static void test_plan_pins_over_budget(void **state)
{
	kvmem_blocks r;
	kvmem_plan p = { 0 }, keep;
	kvmem_plan_params pp = { 100, 0, 1, KVMEM_LAYOUT_COMPACT };
	float sc[20] = { 0 };

	assert_int_equal(kvmem_blocks_init(&r, 16), 0);
	r.n_tokens = 320;
	/* Seven blocks pinned: 112 tokens > 100. */
	assert_int_equal(kvmem_blocks_pin(&r, 20, 20 + 6 * 16 + 2), 0);
	assert_int_equal(kvmem_plan_build(&p, &r, sc, 1, NULL, &pp), -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "budget"));
	assert_non_null(strstr(kvmem_last_error(), "112"));
	assert_int_equal(p.n_view, 0);
	/* Fits exactly: pins and nothing else, newest dropped. */
	pp.budget = 112;
	assert_int_equal(kvmem_plan_build(&p, &r, sc, 1, NULL, &pp), 0);
	assert_int_equal(p.view_tokens, 112);
	assert_true(p.newest_dropped);
	keep = p;
	/* A failing build leaves the old plan as it was. */
	pp.budget = 50;
	assert_true(kvmem_plan_build(&p, &r, sc, 1, NULL, &pp) < 0);
	assert_ptr_equal(p.blocks, keep.blocks);
	kvmem_plan_free(&p);
	kvmem_blocks_free(&r);
}

/* Plan with the given blocks scored 1, the rest 0. */
static void plan_these(kvmem_plan *p, const kvmem_plan *prev, const kvmem_blocks *r,
		       const kvmem_plan_params *pp, const int64_t *want, int n)
{
	float sc[64] = { 0 };

	assert_true(kvmem_blocks_count(r) <= 64);
	for (int i = 0; i < n; i++)
		sc[want[i]] = 1;
	assert_int_equal(kvmem_plan_build(p, r, sc, 1, prev, pp), 0);
	check_plan(p, prev, r, sc, pp);
}

static void expect(const kvmem_plan *p, const int64_t *blocks, const int64_t *start, int n)
{
	assert_int_equal(p->n_view, n);
	for (int i = 0; i < n; i++) {
		assert_int_equal(p->blocks[i], blocks[i]);
		assert_int_equal(p->start[i], start[i]);
	}
}

/*
 * Stable by hand (B 16, a budget of 6 blocks, the last 16 tokens recent):
 * the first plan keeps the blocks the tail holds where they fit; a block
 * swapped for another leaves its slot to it and nothing else moves; an
 * append grows the recent run, which moves with the block it pushes out of
 * the body, and the rest stays.
 */
static void test_plan_stable_by_hand(void **state)
{
	const kvmem_plan_params pp = { 96, 0, 16, KVMEM_LAYOUT_STABLE };
	kvmem_blocks r;
	kvmem_plan a = { 0 }, b = { 0 }, c = { 0 };

	(void)state;
	assert_int_equal(kvmem_blocks_init(&r, 16), 0);
	r.n_tokens = 160;
	/* All in the tail at slot = position: 1 and 3 fit below the body's
	 * end (80) and stay, 5, 7, 8 take the free slots, 9 (the run) last. */
	plan_these(&a, NULL, &r, &pp, (int64_t[]){ 1, 3, 5, 7, 8 }, 5);
	expect(&a, (int64_t[]){ 1, 3, 5, 7, 8, 9 }, (int64_t[]){ 16, 48, 0, 32, 64, 80 }, 6);
	/* 3 leaves, 2 enters: 2 takes 3's slot, everything else stays. */
	plan_these(&b, &a, &r, &pp, (int64_t[]){ 1, 2, 5, 7, 8 }, 5);
	expect(&b, (int64_t[]){ 1, 2, 5, 7, 8, 9 }, (int64_t[]){ 16, 48, 0, 32, 64, 80 }, 6);
	assert_int_equal(b.entering, 1);
	assert_int_equal(b.n_left_total, 1);
	/* 8 tokens appended (block 10, in the tail at 96): the run is 9, 10
	 * from 64; 8 sat there and takes the slot 2 left; 1, 5, 7 stay. */
	r.n_tokens = 168;
	plan_these(&c, &b, &r, &pp, (int64_t[]){ 1, 5, 7, 8 }, 4);
	expect(&c, (int64_t[]){ 1, 5, 7, 8, 9, 10 }, (int64_t[]){ 16, 0, 32, 48, 64, 80 }, 6);
	assert_int_equal(c.view_tokens, 88);
	/* The same plan laid compact moves every block but 7. */
	{
		kvmem_plan_params cp = pp;
		kvmem_plan d = { 0 };

		cp.layout = KVMEM_LAYOUT_COMPACT;
		plan_these(&d, &b, &r, &cp, (int64_t[]){ 1, 5, 7, 8 }, 4);
		expect(&d, (int64_t[]){ 1, 5, 7, 8, 9, 10 },
		       (int64_t[]){ 0, 16, 32, 48, 64, 80 }, 6);
		kvmem_plan_free(&d);
	}
	kvmem_plan_free(&a);
	kvmem_plan_free(&b);
	kvmem_plan_free(&c);
	kvmem_blocks_free(&r);
}

/* Large history: the selection path stays right at many blocks. */
static void test_plan_many_blocks(void **state)
{
	uint64_t rng = g_seed ^ 0x999;
	kvmem_blocks r;
	kvmem_plan p = { 0 };
	kvmem_plan_params pp = { 32 * 3000, 32 * 10, 32 * 40, KVMEM_LAYOUT_COMPACT };
	int64_t nb;
	float *sc;

	assert_int_equal(kvmem_blocks_init(&r, 32), 0);
	r.n_tokens = 32 * 100000 - 7;
	nb = kvmem_blocks_count(&r);
	sc = malloc(sizeof(float) * nb);
	random_scores(&rng, sc, nb);
	kvmem_blocks_pin(&r, 5000, 9000);
	assert_int_equal(kvmem_plan_build(&p, &r, sc, 1, NULL, &pp), 0);
	check_plan(&p, NULL, &r, sc, &pp);
	assert_true(p.view_tokens > pp.budget - 32);
	free(sc);
	kvmem_plan_free(&p);
	kvmem_blocks_free(&r);
}

/* kvmem_plan_holds_span: the share of sets holding every block of a span. */
static void test_plan_holds_span(void **state)
{
	int64_t blocks[2][3] = { { 0, 3, 4 }, { 1, 3, 5 } };
	kvmem_plan p = { .n_sets = 2, .n_view = 3, .blocks = &blocks[0][0] };

	assert_true(kvmem_plan_holds_span(&p, 32, 96, 128) == 1.0);	/* block 3: both */
	assert_true(kvmem_plan_holds_span(&p, 32, 100, 140) == 0.5);	/* 3..4: set 0 only */
	assert_true(kvmem_plan_holds_span(&p, 32, 160, 161) == 0.5);	/* block 5: set 1 */
	assert_true(kvmem_plan_holds_span(&p, 32, 64, 96) == 0.0);	/* block 2: none */
	assert_true(kvmem_plan_holds_span(&p, 16, 96, 128) == 0.0);	/* blocks 6, 7 at B=16 */
	p.n_sets = 0;
	assert_true(kvmem_plan_holds_span(&p, 32, 96, 128) == 0.0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plan_sequences),
		cmocka_unit_test(test_plan_identity),
		cmocka_unit_test(test_plan_stable_by_hand),
		cmocka_unit_test(test_plan_pins_over_budget),
		cmocka_unit_test(test_plan_many_blocks),
		cmocka_unit_test(test_plan_holds_span),
	};

	g_seed = test_rng_fresh_seed("test_ws_plan");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

// SPDX-License-Identifier: MIT
/*
 * View layouts (issue 24): what each way of laying out a plan's blocks
 * would move per selection. include/kvmem/lab.h says what the layouts are.
 *
 * The model is the session's (view.c, ws_plan_walk): per layer, the view's
 * history holds the previous plan's blocks at their positions, and the
 * tokens appended since that selection sit in its tail at E + (p - sel),
 * where E is where the history ended and sel the tokens it was planned
 * over. A new plan gives each of its blocks a position; a block's tokens
 * that were in the view (history or tail) at another position are moved,
 * the others that were not in it are placed from pages. For compact this
 * is exactly what the session moves (test_lab_layout checks it against the
 * walk).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "kvmem/lab.h"

/* One set's view in force: blocks (chronological) at positions. */
struct lay_set {
	int64_t *blocks, *pos;
	int n, cap;
	int64_t end;		/* E: the tail's first position */
};

struct kvmem_lab_layout_sim {
	kvmem_lab_layout lay;
	int B, L, n_sets;
	int64_t budget, recent;
	int64_t sel;		/* history tokens at the previous selection */
	struct lay_set *sets;
	/* Scratch for one set of one step, n_view long: where each block's
	 * tokens are now (vp, old, t: where_now), its length, its new position;
	 * gaps_keep's key, best weight and back-link. */
	int64_t *vp, *old, *t, *len, *np, *key, *best, *from;
	uint8_t *keep;
	int cap;
};

int kvmem_lab_layout_parse(const char *s, kvmem_lab_layout *out)
{
	char *end = NULL;
	double f;

	memset(out, 0, sizeof(*out));
	if (!s)
		return kvmem_error(EINVAL, "layout: none given (compact, stable or gaps:F)");
	snprintf(out->name, sizeof(out->name), "%s", s);
	if (!strcmp(s, "compact"))
		return out->kind = KVMEM_LAB_COMPACT, 0;
	if (!strcmp(s, "stable"))
		return out->kind = KVMEM_LAB_STABLE, 0;
	if (strncmp(s, "gaps:", 5))
		return kvmem_error(EINVAL, "unknown layout '%s' (compact, stable, gaps:F)", s);
	f = strtod(s + 5, &end);
	if (end == s + 5 || *end || !isfinite(f) || f < 1 || f > 64)
		return kvmem_error(EINVAL, "layout '%s': gaps wants a span factor F from 1 to 64 "
				   "(gaps:1.5)", s);
	out->kind = KVMEM_LAB_GAPS;
	out->span = f;
	return 0;
}

int kvmem_lab_layout_open(const kvmem_lab_layout *lay, int block, int64_t budget, int64_t recent,
			  int n_layers, kvmem_lab_layout_sim **out)
{
	kvmem_lab_layout_sim *s;

	*out = NULL;
	if (block < 1 || n_layers < 1 || budget < 0 || recent < 0)
		return kvmem_error(EINVAL, "layout: block %d, %d layers, budget %lld, recent %lld",
				   block, n_layers, (long long)budget, (long long)recent);
	if (lay->kind < KVMEM_LAB_COMPACT || lay->kind > KVMEM_LAB_GAPS ||
	    (lay->kind == KVMEM_LAB_GAPS && !(lay->span >= 1)))
		return kvmem_error(EINVAL, "layout '%s': not a layout", lay->name);
	if (!(s = calloc(1, sizeof(*s))))
		return kvmem_error(ENOMEM, "layout: out of memory");
	s->lay = *lay;
	s->B = block;
	s->L = n_layers;
	s->budget = budget;
	s->recent = recent;
	*out = s;
	return 0;
}

void kvmem_lab_layout_close(kvmem_lab_layout_sim *s)
{
	if (!s)
		return;
	for (int i = 0; s->sets && i < s->n_sets; i++) {
		free(s->sets[i].blocks);
		free(s->sets[i].pos);
	}
	free(s->sets);
	free(s->vp), free(s->old), free(s->t), free(s->len), free(s->np);
	free(s->key), free(s->best), free(s->from);
	free(s->keep);
	free(s);
}

static int scratch(kvmem_lab_layout_sim *s, int n)
{
	int64_t **v[] = { &s->vp, &s->old, &s->t, &s->len, &s->np, &s->key, &s->best, &s->from };

	if (n <= s->cap)
		return 0;
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		int64_t *p = realloc(*v[i], (size_t)n * sizeof(int64_t));

		if (!p)
			return kvmem_error(ENOMEM, "layout: out of memory for %d blocks", n);
		*v[i] = p;
	}
	{
		uint8_t *k = realloc(s->keep, (size_t)n);

		if (!k)
			return kvmem_error(ENOMEM, "layout: out of memory for %d blocks", n);
		s->keep = k;
	}
	s->cap = n;
	return 0;
}

/* ---- where a block's tokens are now ----------------------------------------- */
/*
 * Block b's tokens before `sel` are in the old history at old(b) + u when
 * the old set held b, else out of the view; those from sel on are in the
 * tail at E + (bB + u - sel). *t: how many are before sel. The position
 * all its in-view tokens share, when they do (the block could stay whole
 * where it is), else -1.
 */
static int64_t where_now(const kvmem_lab_layout_sim *s, const struct lay_set *o, int64_t old,
			 int64_t b, int64_t len, int64_t *t)
{
	int64_t first = b * s->B, tail0 = o->end + first - s->sel;

	*t = s->sel - first > len ? len : s->sel - first;
	if (*t < 0)
		*t = 0;
	if (*t == 0)
		return tail0;		/* all of it in the tail */
	if (old < 0)
		return -1;		/* partly out of the view */
	if (*t == len || old == tail0)
		return old;		/* the tail continues it */
	return -1;
}

/* The old position of each new block (-1: not in the old set): both lists
 * are chronological. */
static void old_positions(const struct lay_set *o, const int64_t *nb, int n, int64_t *old)
{
	for (int i = 0, j = 0; i < n; i++) {
		while (j < o->n && o->blocks[j] < nb[i])
			j++;
		old[i] = j < o->n && o->blocks[j] == nb[i] ? o->pos[j] : -1;
	}
}

/* ---- the layouts ---------------------------------------------------------------- */
static void lay_compact(kvmem_lab_layout_sim *s, int n)
{
	int64_t at = 0;

	for (int i = 0; i < n; i++) {
		s->np[i] = at;
		at += s->len[i];
	}
}

/*
 * Stable: the recent run (the plan's last blocks while they hold tokens of
 * the last `recent`, the newest among them) is laid chronologically from A,
 * the largest block multiple that leaves it room under the capacity C;
 * every other block keeps a block-aligned position below A if it has one,
 * else takes the lowest free hole. Returns the end of the history.
 */
static int64_t lay_stable(kvmem_lab_layout_sim *s, const int64_t *nb, int n, int64_t n_tokens,
			  int64_t total)
{
	const int64_t B = s->B, C = s->budget > total ? s->budget : total;
	int64_t run_len = 0, A, holes, at;
	int r = n;
	uint8_t *used;

	/* the newest, then the blocks before it while they are consecutive
	 * and hold tokens of the last `recent` */
	while (r > 0 && nb[r - 1] == (r == n ? (n_tokens - 1) / B : nb[r] - 1) &&
	       (r == n || nb[r - 1] * B + s->len[r - 1] > n_tokens - s->recent))
		run_len += s->len[--r];
	A = (C - run_len) / B * B;
	holes = A / B;
	if (!(used = calloc((size_t)(holes ? holes : 1), 1)))
		return -1;
	for (int i = 0; i < r; i++) {
		int64_t v = s->vp[i];

		s->np[i] = -1;
		if (v >= 0 && v % B == 0 && v + B <= A && s->len[i] == B && !used[v / B]) {
			used[v / B] = 1;
			s->np[i] = v;
		}
	}
	at = 0;
	for (int i = 0; i < r; i++) {
		if (s->np[i] >= 0)
			continue;
		while (at < holes && used[at])
			at++;
		if (at == holes) {	/* cannot be: the body's full blocks fit below A */
			free(used);
			return -1;
		}
		used[at] = 1;
		s->np[i] = at * B;
	}
	free(used);
	at = A;
	for (int i = r; i < n; i++) {
		s->np[i] = at;
		at += s->len[i];
	}
	return r < n ? at : A;
}

/* Fenwick tree over ranks 1..m for the prefix maximum of (weight, index). */
static void fw_put(int64_t *w, int64_t *ix, int m, int k, int64_t val, int64_t i)
{
	for (; k <= m; k += k & -k)
		if (val > w[k]) {
			w[k] = val;
			ix[k] = i;
		}
}

static void fw_max(const int64_t *w, const int64_t *ix, int k, int64_t *val, int64_t *i)
{
	*val = 0;
	*i = -1;
	for (; k > 0; k -= k & -k)
		if (w[k] > *val) {
			*val = w[k];
			*i = ix[k];
		}
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

/*
 * Gaps, the kept set: a block may stay at its position v when the blocks
 * before it fit under v, those after it above v + len within the span S,
 * and each pair of kept neighbours leaves room for the blocks between.
 * With u = v - (compact position), that is 0 <= u <= S - total and u
 * non-decreasing along the kept blocks: the heaviest such run (weighted
 * by tokens) keeps the most, found with a Fenwick tree over the ranks of u.
 */
static int gaps_keep(kvmem_lab_layout_sim *s, int n, int64_t S, int64_t total)
{
	int64_t *u = s->key, *w = NULL, *ix = NULL, *sorted = NULL, at = 0, bestw = 0, besti = -1;
	int m = 0;

	sorted = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
	w = calloc((size_t)n + 1, sizeof(int64_t));
	ix = calloc((size_t)n + 1, sizeof(int64_t));
	if (!sorted || !w || !ix) {
		free(sorted), free(w), free(ix);
		return kvmem_error(ENOMEM, "layout: out of memory for %d blocks", n);
	}
	for (int i = 0; i < n; i++) {
		u[i] = s->vp[i] >= 0 ? s->vp[i] - at : -1;
		if (u[i] > S - total)
			u[i] = -1;
		if (u[i] >= 0)
			sorted[m++] = u[i];
		at += s->len[i];
		s->keep[i] = 0;
	}
	qsort(sorted, (size_t)m, sizeof(int64_t), cmp_i64);
	for (int i = 0; i < n; i++) {
		int64_t *p, val, from;
		int k;

		s->best[i] = 0;
		if (u[i] < 0)
			continue;
		p = bsearch(&u[i], sorted, (size_t)m, sizeof(int64_t), cmp_i64);
		while (p > sorted && p[-1] == u[i])
			p--;
		k = (int)(p - sorted) + 1;
		/* ties in u: every equal one is allowed before, so the upper end */
		while (k < m && sorted[k] == u[i])
			k++;
		fw_max(w, ix, k, &val, &from);
		s->best[i] = val + s->len[i];
		s->from[i] = from;
		fw_put(w, ix, m, k, s->best[i], i);
		if (s->best[i] > bestw) {
			bestw = s->best[i];
			besti = i;
		}
	}
	for (int64_t i = besti; i >= 0; i = s->from[i])
		s->keep[i] = 1;
	free(sorted), free(w), free(ix);
	return 0;
}

/*
 * The blocks i0..i1-1 (none kept) in [lo, hi), which lies between kept
 * blocks whose tokens end at t0 and start at t1: each where the straight
 * map of [t0, t1) onto [lo, hi) puts its first token, pushed right past
 * the one before and left so that the rest fit. Where the room is at
 * least the tokens' distance, this keeps every pair of neighbours as far
 * apart as their tokens are, so a block entering between them later fits.
 * After the last kept block (last), no wider than the tokens: the room
 * left after the newest is the tail's, which then stays where it is.
 */
static void spread(kvmem_lab_layout_sim *s, const int64_t *nb, int i0, int i1, int64_t lo,
		   int64_t hi, int64_t t0, int64_t t1, int last)
{
	int64_t sum = 0, at = lo;

	for (int i = i0; i < i1; i++)
		sum += s->len[i];
	if (last && hi - lo > t1 - t0)
		hi = lo + (t1 - t0);
	for (int i = i0; i < i1; i++) {
		/* in integers: a float's rounding would shift a block off the
		 * token distance it must keep */
		int64_t want = t1 > t0 ? lo + (nb[i] * s->B - t0) * (hi - lo) / (t1 - t0) : lo;

		sum -= s->len[i];
		want = want < at ? at : want;
		want = want > hi - sum - s->len[i] ? hi - sum - s->len[i] : want;
		s->np[i] = want;
		at = want + s->len[i];
	}
}

/*
 * Gaps: the kept set stays, the rest spread between. The first layout
 * (fresh: the history is all in the tail, at 0..n-1) keeps nothing where
 * it was: kept at their tokens' positions, the oldest blocks would take
 * all the spare room for themselves and leave none between the others.
 * Returns the end.
 */
static int64_t lay_gaps(kvmem_lab_layout_sim *s, const int64_t *nb, int n, int64_t n_tokens,
			int64_t total, int fresh)
{
	const double base = (double)(s->budget ? s->budget : total);
	const int64_t S = total + (int64_t)llround((s->lay.span - 1) * base);
	int64_t lo = 0, t0 = 0;
	int i0 = 0;

	if (fresh)
		memset(s->keep, 0, (size_t)n);
	else if (gaps_keep(s, n, S, total))
		return -1;
	for (int i = 0; i <= n; i++) {
		if (i < n && !s->keep[i])
			continue;
		spread(s, nb, i0, i, lo, i < n ? s->vp[i] : S, t0, i < n ? nb[i] * s->B : n_tokens,
		       i == n);
		if (i < n) {
			s->np[i] = s->vp[i];
			lo = s->vp[i] + s->len[i];
			t0 = nb[i] * s->B + s->len[i];
		}
		i0 = i + 1;
	}
	return n ? s->np[n - 1] + s->len[n - 1] : 0;
}

/* ---- a step ------------------------------------------------------------------ */
static int check_plan(const kvmem_lab_layout_sim *s, const int64_t *blocks, int n_sets, int n_view,
		      int64_t n_tokens)
{
	const int64_t nb = (n_tokens + s->B - 1) / s->B;

	if (n_sets != 1 && n_sets != s->L)
		return kvmem_error(EINVAL, "layout: %d block sets for %d layers (1 or %d)", n_sets,
				   s->L, s->L);
	if (s->sets && n_sets != s->n_sets)
		return kvmem_error(EINVAL, "layout: %d block sets after %d", n_sets, s->n_sets);
	if (n_tokens < s->sel)
		return kvmem_error(EINVAL, "layout: %lld history tokens after %lld",
				   (long long)n_tokens, (long long)s->sel);
	for (int k = 0; k < n_sets; k++)
		for (int i = 0; i < n_view; i++) {
			int64_t b = blocks[(size_t)k * n_view + i];

			if (b < 0 || b >= nb || (i && b <= blocks[(size_t)k * n_view + i - 1]))
				return kvmem_error(EINVAL, "layout: set %d, entry %d: block %lld is not "
						   "chronological in 0..%lld", k, i, (long long)b,
						   (long long)nb - 1);
		}
	return 0;
}

/* The layout's positions for one set's blocks (s->np); the history's end,
 * or -1 out of memory. */
static int64_t lay_out(kvmem_lab_layout_sim *s, const int64_t *nb, int n, int64_t n_tokens,
		       int64_t total, int fresh)
{
	if (s->lay.kind == KVMEM_LAB_COMPACT) {
		lay_compact(s, n);
		return total;
	}
	if (s->lay.kind == KVMEM_LAB_STABLE)
		return lay_stable(s, nb, n, n_tokens, total);
	return lay_gaps(s, nb, n, n_tokens, total, fresh);
}

/* Count one set's tokens (per: layers the set stands for), then make its
 * new layout the one in force. */
static int count_set(kvmem_lab_layout_sim *s, struct lay_set *o, const int64_t *nb, int n,
		     int64_t n_tokens, int64_t per, kvmem_lab_layout_count *c)
{
	int64_t total = 0, end;

	old_positions(o, nb, n, s->old);
	for (int i = 0; i < n; i++) {
		s->len[i] = n_tokens - nb[i] * s->B < s->B ? n_tokens - nb[i] * s->B : s->B;
		s->vp[i] = where_now(s, o, s->old[i], nb[i], s->len[i], &s->t[i]);
		total += s->len[i];
	}
	if ((end = lay_out(s, nb, n, n_tokens, total, !o->n && !o->end)) < 0)
		return kvmem_error(ENOMEM, "layout %s: out of memory, or no room for %d blocks of "
				   "%lld tokens", s->lay.name, n, (long long)total);
	for (int i = 0; i < n; i++) {
		int64_t t = s->t[i], in_tail = o->end + nb[i] * s->B + t - s->sel;

		/* tokens before sel: in the old history, or from pages */
		if (s->old[i] < 0)
			c->entered += t * per;
		else if (s->old[i] == s->np[i])
			c->kept += t * per;
		else
			c->moved += t * per;
		/* the rest: in the tail */
		if (in_tail == s->np[i] + t)
			c->kept += (s->len[i] - t) * per;
		else
			c->moved += (s->len[i] - t) * per;
	}
	c->view += total * per;
	c->span = end > c->span ? end : c->span;
	if (n > o->cap) {
		int64_t *b = realloc(o->blocks, (size_t)n * sizeof(int64_t));
		int64_t *p = b ? realloc(o->pos, (size_t)n * sizeof(int64_t)) : NULL;

		if (b)
			o->blocks = b;
		if (!b || !p)
			return kvmem_error(ENOMEM, "layout: out of memory");
		o->pos = p;
		o->cap = n;
	}
	memcpy(o->blocks, nb, (size_t)n * sizeof(int64_t));
	memcpy(o->pos, s->np, (size_t)n * sizeof(int64_t));
	o->n = n;
	o->end = end;
	return 0;
}

int kvmem_lab_layout_step(kvmem_lab_layout_sim *s, const int64_t *blocks, int n_sets, int n_view,
			  int64_t n_tokens, kvmem_lab_layout_count *c)
{
	memset(c, 0, sizeof(*c));
	if (check_plan(s, blocks, n_sets, n_view, n_tokens) || scratch(s, n_view))
		return kvmem_fail();
	if (!s->sets) {
		if (!(s->sets = calloc((size_t)n_sets, sizeof(*s->sets))))
			return kvmem_error(ENOMEM, "layout: out of memory");
		s->n_sets = n_sets;
	}
	for (int k = 0; k < n_sets; k++)
		if (count_set(s, &s->sets[k], blocks + (size_t)k * n_view, n_view, n_tokens,
			      s->L / n_sets, c))
			return kvmem_fail();
	s->sel = n_tokens;
	return 0;
}

int kvmem_lab_layout_replay(const kvmem_lab_result *r, int n_layers, const kvmem_lab_layout *lay,
			    kvmem_lab_layout_count *out)
{
	kvmem_lab_layout_sim *s;
	int rc = 0;

	if (kvmem_lab_layout_open(lay, r->block, r->budget, r->recent, n_layers, &s))
		return kvmem_fail();
	for (int64_t k = 0; k < r->n_steps && !rc; k++) {
		const kvmem_lab_step *st = &r->steps[k];

		if (st->n_view && !st->blocks) {
			rc = kvmem_error(EINVAL, "layout: the replay kept no plans (keep_plans)");
			break;
		}
		if (st->n_view)
			rc = kvmem_lab_layout_step(s, st->blocks, st->n_sets, st->n_view, st->n_tokens,
						   &out[k]);
		else
			memset(&out[k], 0, sizeof(out[k]));
		if (rc)
			rc = kvmem_error_prefix("layout %s, step %lld", lay->name, (long long)st->step);
	}
	kvmem_lab_layout_close(s);
	return rc;
}

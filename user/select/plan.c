// SPDX-License-Identifier: MIT
/*
 * The view planner: from block scores, pins, sink and recent sizes and the
 * budget, the blocks of the next execution view in chronological order at
 * compact positions, and the diff against the previous view.
 *
 * Order of claims on the budget (each block whole, counted at its length):
 *   1. pins: all of them, or the plan fails;
 *   2. the newest block (the one being filled), if it fits;
 *   3. sink: the blocks of the first `sink` tokens, oldest first, if they fit;
 *   4. recent: the blocks of the last `recent` tokens, newest first, if they fit;
 *   5. the best-scored remaining blocks, as many as fit (ties: later first).
 * 1-4 are the same for every layer; 5 is per set. Every candidate in 5 is a
 * full block (the only partial block is the newest), so each set holds the
 * same number of tokens.
 *
 * Layouts (where each block starts in the view; the list stays
 * chronological either way): compact lays the blocks out in order, so a
 * block that enters or leaves shifts every later one; stable (issue 24,
 * Documentation/lab.md "View layouts") keeps a block at the slot it has
 * now and lays only the recent run at the end, in order.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "select/select.h"
#include "select/plan_walk.h"
#include "select/score.h"

enum { FREE = 0, TAKEN = 1, BARRED = 2 };

void kvmem_plan_free(kvmem_plan *p)
{
	free(p->blocks);
	free(p->start);
	free(p->state);
	free(p->left);
	free(p->n_left);
	memset(p, 0, sizeof(*p));
}

/* Try to take block b: 1 if taken now, 0 if it does not fit or is taken. */
static int claim(uint8_t *mark, const kvmem_blocks *r, int64_t b, int64_t *room)
{
	int len = kvmem_block_len(r, b);

	if (mark[b] != FREE || len > *room)
		return 0;
	mark[b] = TAKEN;
	*room -= len;
	return 1;
}

/* Steps 1-4: the part every set shares. Returns -1 when pins do not fit. */
static int mandatory(uint8_t *mark, const kvmem_blocks *r, const kvmem_plan_params *pp,
		     int64_t *room, kvmem_plan *p)
{
	const int64_t N = r->n_tokens, nb = kvmem_blocks_count(r);
	int64_t pinned = kvmem_blocks_pinned_tokens(r, N), b, first;

	if (pinned > pp->budget)
		return kvmem_error(EINVAL, "plan: pinned spans need %lld tokens (whole blocks of %d) but the budget is %lld",
				 (long long)pinned, r->block, (long long)pp->budget);
	*room = pp->budget - pinned;
	for (int i = 0; i < r->n_pins && r->pins[i].start < N; i++) {
		int64_t e = r->pins[i].end < N ? r->pins[i].end : N;

		for (b = kvmem_block_of(r, r->pins[i].start); b <= kvmem_block_of(r, e - 1); b++)
			if (mark[b] == FREE) {
				mark[b] = TAKEN;
				p->n_pinned++;
			}
	}
	if (mark[nb - 1] == FREE) {
		if (claim(mark, r, nb - 1, room)) {
			p->n_recent++;
		} else {
			mark[nb - 1] = BARRED;
			p->newest_dropped = 1;
		}
	}
	if (pp->sink > 0)
		for (b = 0; b <= kvmem_block_of(r, (pp->sink < N ? pp->sink : N) - 1); b++)
			p->n_sink += claim(mark, r, b, room);
	first = pp->recent > 0 ? kvmem_block_of(r, pp->recent < N ? N - pp->recent : 0) : nb;
	for (b = nb - 1; b >= first; b--)
		p->n_recent += claim(mark, r, b, room);
	return 0;
}

static int alloc_plan(kvmem_plan *p, int n_sets, int n_view, int n_left_max)
{
	size_t cells = (size_t)n_sets * (n_view ? n_view : 1);

	p->blocks = malloc(cells * sizeof(int64_t));
	p->start = malloc(cells * sizeof(int64_t));
	p->state = malloc(cells);
	p->left = malloc((size_t)n_sets * (n_left_max ? n_left_max : 1) * sizeof(int64_t));
	p->n_left = calloc((size_t)n_sets, sizeof(int));
	if (!p->blocks || !p->start || !p->state || !p->left || !p->n_left)
		return kvmem_error(ENOMEM, "plan: out of memory for %d sets of %d blocks", n_sets, n_view);
	return 0;
}

/* Diff set s of p against set ps of prev, both chronological. */
static void diff_set(kvmem_plan *p, int s, const kvmem_plan *prev, int ps, int n_left_max)
{
	const int64_t *nb = p->blocks + (size_t)s * p->n_view;
	uint8_t *st = p->state + (size_t)s * p->n_view;
	int on = prev ? prev->n_view : 0, i = 0, j = 0;
	const int64_t *ob = on ? prev->blocks + (size_t)ps * prev->n_view : NULL;
	int64_t *left = p->left + (size_t)s * n_left_max;
	int64_t born = prev ? prev->ws_blocks : 0;

	while (i < p->n_view || j < on) {
		if (j >= on || (i < p->n_view && nb[i] < ob[j])) {
			st[i] = nb[i] >= born ? KVMEM_VIEW_NEW : KVMEM_VIEW_ENTERING;
			if (st[i] == KVMEM_VIEW_NEW)
				p->born++;
			else
				p->entering++;
			i++;
		} else if (i >= p->n_view || ob[j] < nb[i]) {
			left[p->n_left[s]++] = ob[j++];
		} else {
			st[i++] = KVMEM_VIEW_REUSED;
			p->reused++;
			j++;
		}
	}
	p->n_left_total += p->n_left[s];
}

/* Where block b's tokens are in the view now (prev: the plan in force, or
 * NULL: the whole history in the tail at its positions): the slot they all
 * start from when the block sits whole at one place (in prev's view, in
 * the tail, or its start in prev's view continued by the tail), else -1.
 * old: b's start in prev (-1: not there). The session's walk
 * (ws_plan_walk) puts them at the same slots. */
static int64_t where_now(const kvmem_plan *prev, const kvmem_blocks *r, int64_t b, int64_t old)
{
	const int64_t sel = prev ? prev->n_tokens : 0, end = prev ? prev->view_tokens : 0;
	const int64_t first = kvmem_block_start(r, b), tail0 = end + first - sel;
	int64_t t = sel - first, len = kvmem_block_len(r, b);

	t = t < 0 ? 0 : t > len ? len : t;
	if (t == 0)
		return tail0;	/* all of it appended since prev */
	if (old < 0)
		return -1;	/* partly out of the view */
	return t == len || old == tail0 ? old : -1;
}

/*
 * Stable starts for the n chronological blocks nb of one set (pb, pn: the
 * same set of prev, chronological, or NULL, 0). The recent run (the newest
 * block, and the ones before it while consecutive and holding tokens of
 * the last pp->recent) is laid last, in order, so that new tokens append
 * after the newest; the body, all full blocks, fills [0, A) exactly: a
 * block keeps its slot when it lies block-aligned in [0, A), the others
 * take the lowest free slots. So no hole is ever left, and with the whole
 * history in view every block keeps its position (the identity layout).
 * Returns 0, 1 when the body is not whole blocks (the caller lays compact;
 * cannot be for a plan of this planner), -1 out of memory.
 */
static int lay_stable(const kvmem_plan *prev, const int64_t *pb, const int64_t *ps, int pn,
		      const kvmem_blocks *r, const kvmem_plan_params *pp, const int64_t *nb, int n,
		      int64_t *start)
{
	const int64_t B = r->block, N = r->n_tokens, newest = kvmem_blocks_count(r) - 1;
	int64_t A = 0, at, holes;
	int run = n;
	uint8_t *used;

	while (run > 0 && nb[run - 1] == (run == n ? newest : nb[run] - 1) &&
	       (run == n || kvmem_block_start(r, nb[run - 1]) + B > N - pp->recent))
		run--;
	for (int i = 0; i < run; i++) {
		if (kvmem_block_len(r, nb[i]) != B)
			return 1;
		A += B;
	}
	holes = A / B;
	if (!(used = calloc((size_t)(holes ? holes : 1), 1)))
		return -1;
	for (int i = 0, j = 0; i < run; i++) {
		int64_t v;

		while (j < pn && pb[j] < nb[i])
			j++;
		v = where_now(prev, r, nb[i], j < pn && pb[j] == nb[i] ? ps[j] : -1);
		start[i] = -1;
		if (v >= 0 && v % B == 0 && v + B <= A && !used[v / B]) {
			used[v / B] = 1;
			start[i] = v;
		}
	}
	at = 0;
	for (int i = 0; i < run; i++) {
		if (start[i] >= 0)
			continue;
		while (used[at])	/* a free slot is left: as many slots as blocks */
			at++;
		used[at] = 1;
		start[i] = at * B;
	}
	free(used);
	for (int i = run; i < n; i++) {
		start[i] = A;
		A += kvmem_block_len(r, nb[i]);
	}
	return 0;
}

/* Set s's starts: compact, or stable when asked (and possible). */
static int lay_out(kvmem_plan *p, int s, const kvmem_plan *prev, const kvmem_blocks *r,
		   const kvmem_plan_params *pp)
{
	const int64_t *nb = p->blocks + (size_t)s * p->n_view;
	int64_t *st = p->start + (size_t)s * p->n_view, pos = 0;
	int ps = prev && prev->n_sets == p->n_sets ? s : 0, pn = prev ? prev->n_view : 0;

	if (pp->layout == KVMEM_LAYOUT_STABLE) {
		int rc = lay_stable(prev, pn ? prev->blocks + (size_t)ps * pn : NULL,
				    pn ? prev->start + (size_t)ps * pn : NULL, pn, r, pp, nb,
				    p->n_view, st);

		if (rc <= 0)
			return rc;
	}
	for (int i = 0; i < p->n_view; i++) {
		st[i] = pos;
		pos += kvmem_block_len(r, nb[i]);
	}
	return 0;
}

int kvmem_plan_build(kvmem_plan *out, const kvmem_blocks *r, const float *scores, int n_sets,
		   const kvmem_plan *prev, const kvmem_plan_params *pp)
{
	const int64_t nb = kvmem_blocks_count(r);
	kvmem_plan p = { .n_sets = n_sets, .n_tokens = r->n_tokens, .ws_blocks = nb };
	uint8_t *base = NULL, *mark = NULL;
	int64_t *cand = NULL, room = 0, n_cand = 0, k;
	int n_left_max = prev ? prev->n_view : 0, n_mand = 0;

	if (n_sets < 1)
		return kvmem_error(EINVAL, "plan: %d block sets", n_sets);
	if (pp->budget < 0)
		return kvmem_error(EINVAL, "plan: negative budget %lld", (long long)pp->budget);
	if (prev && prev->n_view && prev->n_sets != 1 && prev->n_sets != n_sets)
		return kvmem_error(EINVAL, "plan: previous plan has %d sets, this one %d", prev->n_sets, n_sets);
	base = calloc((size_t)(nb ? nb : 1), 1);
	mark = malloc((size_t)(nb ? nb : 1));
	if (!base || !mark)
		goto oom;
	if (nb && mandatory(base, r, pp, &room, &p))
		goto fail;
	for (int64_t b = 0; b < nb; b++) {
		n_mand += base[b] == TAKEN;
		n_cand += base[b] == FREE;
	}
	cand = malloc((size_t)(n_cand ? n_cand : 1) * sizeof(int64_t));
	if (!cand)
		goto oom;
	k = room / r->block;
	if (k > n_cand)
		k = n_cand;
	p.n_scored = (int)k;
	p.n_view = n_mand + (int)k;
	p.left_stride = n_left_max;
	if (alloc_plan(&p, n_sets, p.n_view, n_left_max))
		goto fail;
	for (int s = 0; s < n_sets; s++) {
		const float *sc = scores + (size_t)s * nb;
		int64_t c = 0, at = 0, pos = 0;

		memcpy(mark, base, (size_t)nb);
		for (int64_t b = 0; b < nb; b++)
			if (base[b] == FREE)
				cand[c++] = b;
		if (k < n_cand)
			kvmem_top_k_select(cand, n_cand, k, sc);
		for (int64_t i = 0; i < k; i++)
			mark[cand[i]] = TAKEN;
		for (int64_t b = 0; b < nb; b++) {
			if (mark[b] != TAKEN)
				continue;
			p.blocks[(size_t)s * p.n_view + at++] = b;
			pos += kvmem_block_len(r, b);
		}
		p.view_tokens = pos;
		if (lay_out(&p, s, prev, r, pp))
			goto oom;
		diff_set(&p, s, prev, prev && prev->n_sets == n_sets ? s : 0, n_left_max);
	}
	free(base);
	free(mark);
	free(cand);
	kvmem_plan_free(out);
	*out = p;
	return 0;
oom:
	kvmem_error(ENOMEM, "plan: out of memory for %lld blocks", (long long)nb);
fail:
	free(base);
	free(mark);
	free(cand);
	kvmem_plan_free(&p);
	return kvmem_fail();
}

int ws_plan_walk(const kvmem_plan *op, const kvmem_plan *np, const kvmem_blocks *bl, int n_layers,
		 int64_t sel_tokens, int64_t view_len, ws_place_fn place, void *arg)
{
	const int64_t B = bl->block;
	int rc;

	for (int l = 0; l < n_layers; l++) {
		int set = np->n_sets == 1 ? 0 : l, oset = op->n_sets <= 1 ? 0 : l, j = 0;
		const int64_t *nb = np->blocks + (size_t)set * np->n_view;
		const int64_t *ns = np->start + (size_t)set * np->n_view;
		const int64_t *ob = op->blocks ? op->blocks + (size_t)oset * op->n_view : NULL;
		const int64_t *os = op->start ? op->start + (size_t)oset * op->n_view : NULL;

		for (int i = 0; i < np->n_view; i++) {
			int64_t b = nb[i], p0 = b * B;
			int len = kvmem_block_len(bl, b), t;
			int64_t tail_at = view_len - sel_tokens + p0;

			while (j < op->n_view && ob[j] < b)
				j++;
			/* Tokens before sel_tokens: in the old view or not at all. */
			t = sel_tokens - p0 > len ? len : (int)(sel_tokens - p0);
			if (t < 0)
				t = 0;
			if ((rc = place(arg, l, b, 0, t, j < op->n_view && ob[j] == b ? os[j] : -1, ns[i])) ||
			    (rc = place(arg, l, b, t, len, tail_at, ns[i])))
				return rc;
		}
	}
	return 0;
}

/* ws_plan_walk_changed's runs of one layer, kept for the others. */
struct walk_runs {
	struct walk_run {
		int64_t b, have, want;
		int u0, u1;
	} *run;
	size_t n, cap;
	int64_t kept;
	ws_place_fn place;	/* the caller's, for a layer walked alone */
	void *arg;
};

static int keep_run(void *arg, int l, int64_t b, int u0, int u1, int64_t have, int64_t want)
{
	struct walk_runs *w = arg;

	if (u1 <= u0)
		return 0;
	if (have == want) {
		w->kept += u1 - u0;
		return 0;
	}
	if (w->place)	/* a layer of its own: straight to the caller */
		return w->place(w->arg, l, b, u0, u1, have, want);
	if (w->n == w->cap) {
		size_t cap = w->cap ? 2 * w->cap : 256;
		struct walk_run *r = realloc(w->run, cap * sizeof(*r));

		if (!r)
			return kvmem_error(ENOMEM, "plan walk: out of memory for %zu runs", cap);
		w->run = r;
		w->cap = cap;
	}
	w->run[w->n++] = (struct walk_run){ .b = b, .have = have, .want = want, .u0 = u0, .u1 = u1 };
	return 0;
}

int ws_plan_walk_changed(const kvmem_plan *op, const kvmem_plan *np, const kvmem_blocks *bl,
			 int n_layers, int64_t sel_tokens, int64_t view_len, ws_place_fn place,
			 void *arg, int64_t *kept)
{
	struct walk_runs w = { 0 };
	int rc = 0;

	if (np->n_sets == 1 && op->n_sets <= 1 && n_layers > 0) {
		/* Every layer has the same runs: found once, replayed, a run's
		 * layers one after another (the same slots back to back: the
		 * cuda fp8 gather computes their rotary angles once). */
		if ((rc = ws_plan_walk(op, np, bl, 1, sel_tokens, view_len, keep_run, &w)) == 0)
			for (size_t i = 0; i < w.n && !rc; i++)
				for (int l = 0; l < n_layers && !rc; l++)
					rc = place(arg, l, w.run[i].b, w.run[i].u0, w.run[i].u1,
						   w.run[i].have, w.run[i].want);
		w.kept *= n_layers;
	} else {
		w.place = place;
		w.arg = arg;
		rc = ws_plan_walk(op, np, bl, n_layers, sel_tokens, view_len, keep_run, &w);
	}
	free(w.run);
	if (kept)
		*kept = w.kept;
	return rc;
}

int64_t ws_plan_hints(const kvmem_plan *np, const float *sc, int n_sets, int64_t nb, int64_t *idx,
		      int64_t *n_in)
{
	float *best = malloc((size_t)(nb ? nb : 1) * sizeof(*best));
	uint8_t *in = calloc((size_t)(nb ? nb : 1), 1);
	int64_t n_out = 0, k;

	*n_in = 0;
	if (!best || !in) {
		free(best);
		free(in);
		return -ENOMEM;
	}
	for (int set = 0; set < np->n_sets; set++)
		for (int i = 0; i < np->n_view; i++)
			in[np->blocks[(size_t)set * np->n_view + i]] = 1;
	for (int64_t b = 0; b < nb; b++) {
		best[b] = sc[b];
		for (int set = 1; set < n_sets; set++)
			if (sc[(size_t)set * nb + b] > best[b])
				best[b] = sc[(size_t)set * nb + b];
		*n_in += in[b];
		if (in[b])
			idx[n_out++] = b;
	}
	for (int64_t b = 0; b < nb; b++)
		if (!in[b])
			idx[n_out++] = b;
	k = *n_in < nb - *n_in ? *n_in : nb - *n_in;
	kvmem_top_k_select(idx + *n_in, nb - *n_in, k, best);
	free(best);
	free(in);
	return *n_in + k;
}

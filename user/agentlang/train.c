// SPDX-License-Identifier: MIT
/*
 * Training sequences, each exactly seq_len tokens.
 *
 * Stream sequences teach retrieval inside the native window: questions come
 * every ~50 tokens about any fact shown earlier in the sequence, near or far,
 * so the loss on answers is dense.
 *
 * View sequences teach what kvmem will actually show the model: a workspace
 * several times longer than the window, cut to a sink, some 32-token blocks
 * and the recent tokens, glued together in order (lines cut at block edges
 * included), then questions about the needles. The blocks kept besides the
 * needles' are half those richest in the questions' key tokens (what a
 * scoring policy tends to pick by mistake) and half random.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "agentlang/lang.h"

#define VIEW_BLOCK 32
#define Q_LINE_MAX (AGENTLANG_MAX_QUESTION + AGENTLANG_MAX_ANSWER + 1)

static int count_questions(const int32_t *t, int n)
{
	int q = 0;

	for (int i = 0; i < n; i++)
		q += t[i] == AGENTLANG_Q;
	return q;
}

/* A stream sequence asks at least this many questions (one per 150 tokens,
 * at least one): a sequence below it teaches little, and a short one can
 * draw none at the lower question rates. */
static int stream_min_questions(int L)
{
	return L / 150 > 1 ? L / 150 : 1;
}

/* Draws of a stream sequence before one that asks enough is given up on. */
#define STREAM_TRIES 64

static int stream_draw(uint64_t seed, uint64_t index, int L, int nbg, double q_rate, int32_t *out,
		       agentlang_seq_info *info)
{
	struct al_gen g;

	if (al_gen_init(&g, seed, index, L, nbg < 6 ? 6 : nbg, q_rate))
		return kvmem_fail();
	int rc = al_push(&g, AGENTLANG_BOS);
	while (!rc && g.limit - g.len >= AL_EP_MAX)
		rc = al_ep_background(&g);
	while (!rc && g.limit - g.len >= AL_SMALL_MAX)
		rc = al_ep_small(&g);
	if (!rc) {
		memcpy(out, g.tok, (size_t)g.len * sizeof(*out));
		for (int i = (int)g.len; i < L; i++)
			out[i] = AGENTLANG_PAD;
		info->kind = AGENTLANG_SEQ_STREAM;
		info->lookalikes = -1;
		info->n_tokens = (int)g.len;
		info->n_questions = count_questions(out, L);
	}
	al_gen_free(&g);
	return rc;
}

/* The first draw is the sequence every earlier corpus held; one that asks
 * too few questions is drawn again from another stream of the same seed
 * and index (4 in 100,000 at 256 tokens, none of as many at 512 or 777). */
static int stream_seq(uint64_t seed, uint64_t index, int L, struct al_rng *r, int32_t *out,
		      agentlang_seq_info *info)
{
	int nbg = L / 128 - 4 + (int)al_below(r, 9);
	double q_rate = (14 + al_below(r, 15)) / 1000.0;
	uint64_t base = al_mix64(seed) ^ 0x5851f42d4c957f2dull;

	for (uint64_t t = 0; t < STREAM_TRIES; t++) {
		if (stream_draw(t ? base ^ al_mix64(t) : base, index, L, nbg, q_rate, out, info))
			return kvmem_fail();
		if (info->n_questions >= stream_min_questions(L))
			break;
	}
	return 0;
}

/* Keep [a, b); returns how many tokens were newly kept. */
static int64_t mark(uint8_t *keep, int64_t a, int64_t b)
{
	int64_t n = 0;

	for (int64_t i = a; i < b; i++) {
		n += !keep[i];
		keep[i] = 1;
	}
	return n;
}

struct cand {
	int64_t block;
	uint64_t key;	/* score in the high bits, a random tie-break below */
};

static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;

	return x->key < y->key ? 1 : x->key > y->key ? -1 : 0;
}

/* Choose what the view keeps of the workspace; returns the kept count. */
static int64_t choose_view(const agentlang_transcript *ws, int64_t H, int L, struct al_rng *r,
			   uint8_t *keep, struct cand *cand)
{
	int64_t N = ws->n_ids, count = 0, nc = 0;
	int64_t sink = VIEW_BLOCK * (1 + al_below(r, 2));
	int64_t recent = 64 + al_below(r, (uint32_t)(L / 4 - 63));
	uint8_t inq[1024] = { 0 };

	count += mark(keep, 0, sink);
	for (int i = 0; i < ws->n_q; i++) {
		const agentlang_question *q = &ws->q[i];
		int64_t a = q->needle_pos / VIEW_BLOCK * VIEW_BLOCK;
		int64_t b = ((q->needle_end - 1) / VIEW_BLOCK + 1) * VIEW_BLOCK;

		count += mark(keep, a, b < N ? b : N);
		for (int j = 1; j < q->n_ids - 1; j++)
			inq[q->ids[j] & 1023] = 1;
	}
	if (count + recent > H)
		recent = H - count;
	if (recent < 16)
		return kvmem_error(EINVAL, "agentlang: view of %d tokens has no room for recent tokens", L);
	count += mark(keep, N - recent, N);

	for (int64_t b = 0; b * VIEW_BLOCK < N - recent; b++) {
		int64_t a = b * VIEW_BLOCK, e = a + VIEW_BLOCK < N ? a + VIEW_BLOCK : N;
		uint64_t score = 0, kept = 0;

		for (int64_t i = a; i < e; i++) {
			score += inq[ws->ids[i] & 1023];
			kept += keep[i];
		}
		if (kept < (uint64_t)(e - a))
			cand[nc++] = (struct cand){ b, (score << 32) | (al_next(r) >> 32) };
	}
	qsort(cand, (size_t)nc, sizeof(*cand), cand_cmp);
	/* Half the free room to the best-scored blocks, the rest at random. */
	int64_t half = count + (H - count) / 2, i = 0;
	for (; i < nc && count + VIEW_BLOCK <= half && (cand[i].key >> 32); i++) {
		int64_t a = cand[i].block * VIEW_BLOCK;

		count += mark(keep, a, a + VIEW_BLOCK < N ? a + VIEW_BLOCK : N);
	}
	for (int64_t j = nc - 1; j > i; j--) {
		int64_t k = i + (int64_t)(al_unit(r) * (double)(j - i + 1));
		struct cand t = cand[j];

		cand[j] = cand[k];
		cand[k] = t;
	}
	for (; i < nc && count + VIEW_BLOCK <= H; i++) {
		int64_t a = cand[i].block * VIEW_BLOCK;

		count += mark(keep, a, a + VIEW_BLOCK < N ? a + VIEW_BLOCK : N);
	}
	return count;
}

/* The questions asked[n] after the view's n_view tokens, in random order
 * (put[i]: the i-th one's index into ws->q, when put is not NULL);
 * returns the sequence's length before padding. */
static int64_t put_questions(const agentlang_transcript *ws, const int *asked, int n,
			     struct al_rng *r, int32_t *out, int64_t n_view, int *put)
{
	int order[64];

	for (int i = 0; i < n; i++)
		order[i] = asked[i];
	for (int i = n - 1; i > 0; i--) {
		int j = (int)al_below(r, (uint32_t)i + 1), t = order[i];

		order[i] = order[j];
		order[j] = t;
	}
	for (int i = 0; i < n; i++) {
		const agentlang_question *q = &ws->q[order[i]];

		if (put)
			put[i] = order[i];
		memcpy(out + n_view, q->ids, (size_t)q->n_ids * sizeof(*out));
		n_view += q->n_ids;
		memcpy(out + n_view, q->answer, (size_t)q->n_answer * sizeof(*out));
		n_view += q->n_answer;
		out[n_view++] = AGENTLANG_NL;
	}
	return n_view;
}

/* The fewest look-alike lines a needle of ws got (agentlang_seq_info). */
static int fewest_lookalikes(const agentlang_transcript *ws)
{
	int k = ws->n_q ? ws->q[0].lookalikes : 0;

	for (int i = 1; i < ws->n_q; i++)
		k = ws->q[i].lookalikes < k ? ws->q[i].lookalikes : k;
	return k;
}

static int view_seq(uint64_t seed, uint64_t index, int L, const agentlang_view_opts *vo,
		    struct al_rng *r, int32_t *out, agentlang_seq_info *info)
{
	int max_ratio = vo ? vo->max_ratio : 0;
	int ratio = 1 << al_below(r, max_ratio >= 64 ? 7 : max_ratio >= 32 ? 6 : 5);
	int mmax = L / 160 < 1 ? 1 : L / 160;
	int M = (mmax + 1) / 2 + (int)al_below(r, (uint32_t)mmax / 2 + 1);
	agentlang_params p;
	agentlang_transcript ws;

	agentlang_params_default(&p);
	p.seed = al_mix64(seed ^ al_mix64(index ^ 0x2545f4914f6cdd1dull));
	p.lookalikes = (int)al_below(r, 7);
	if (vo && vo->lookalikes > 0)
		p.lookalikes = vo->lookalikes;
	/* No questions inside: theirs facts may fall in dropped blocks, and a
	 * question whose answer is not in view would teach guessing. */
	p.bg_questions = 0;
	if (vo && vo->stale > 0)
		p.stale = vo->stale;
	p.n_tokens = ratio == 1 ? L - (int64_t)M * Q_LINE_MAX : (int64_t)L * ratio;
	int fit = (int)(p.n_tokens / (2 * (AL_EP_MAX + 16 * (p.lookalikes + 1))));
	M = M < fit ? M : fit < 1 ? 1 : fit;
	p.n_questions = M;
	if (ratio == 1)
		p.n_tokens = L - (int64_t)M * Q_LINE_MAX;
	double depths[64];
	for (int i = 0; i < M && i < 64; i++)
		depths[i] = al_unit(r);
	p.depths = depths;
	if (M > 64 || agentlang_transcript_build(&p, &ws))
		return M > 64 ? kvmem_error(EINVAL, "agentlang: %d needles in one view", M) : kvmem_fail();

	int64_t tail = 0, n = 0;
	for (int i = 0; i < ws.n_q; i++)
		tail += ws.q[i].n_ids + ws.q[i].n_answer + 1;
	if (ratio == 1) {
		memcpy(out, ws.ids, (size_t)ws.n_ids * sizeof(*out));
		n = ws.n_ids;
	} else {
		uint8_t *keep = calloc((size_t)ws.n_ids, 1);
		struct cand *cand = malloc(((size_t)ws.n_ids / VIEW_BLOCK + 1) * sizeof(*cand));

		if (!keep || !cand || choose_view(&ws, L - tail, L, r, keep, cand) < 0) {
			if (!keep || !cand)
				kvmem_error(ENOMEM, "agentlang: out of memory for a view");
			free(keep);
			free(cand);
			agentlang_transcript_free(&ws);
			return kvmem_fail();
		}
		for (int64_t i = 0; i < ws.n_ids; i++)
			if (keep[i])
				out[n++] = ws.ids[i];
		free(keep);
		free(cand);
	}
	/* The questions, in random order. */
	int all[64];
	for (int i = 0; i < ws.n_q; i++)
		all[i] = i;
	n = put_questions(&ws, all, ws.n_q, r, out, n, NULL);
	for (int64_t i = n; i < L; i++)
		out[i] = AGENTLANG_PAD;
	info->kind = AGENTLANG_SEQ_VIEW;
	info->n_tokens = (int)n;
	info->n_questions = ws.n_q;
	info->lookalikes = fewest_lookalikes(&ws);
	agentlang_transcript_free(&ws);
	return 0;
}

/*
 * Drop the blocks before a needle's value (the file and key of its line)
 * where a block boundary cuts the line, but never the sink's or the recent
 * tokens' blocks: what a view at inference sometimes holds of a line.
 * Returns 1 when something was dropped.
 */
static int drop_head(const agentlang_question *q, int64_t N, int64_t recent_from, uint8_t *keep)
{
	int64_t a = q->needle_pos / VIEW_BLOCK, v = q->value_pos / VIEW_BLOCK;
	int dropped = 0;

	for (int64_t b = a > 0 ? a : 1; b < v; b++) {
		int64_t e = (b + 1) * VIEW_BLOCK < N ? (b + 1) * VIEW_BLOCK : N;

		if (e > recent_from)
			break;
		memset(keep + b * VIEW_BLOCK, 0, (size_t)(e - b * VIEW_BLOCK));
		dropped = 1;
	}
	return dropped;
}

static int all_kept(const uint8_t *keep, int64_t a, int64_t e)
{
	for (int64_t i = a; i < e; i++)
		if (!keep[i])
			return 0;
	return 1;
}

/* The kept tokens' arrays and room for max_windows windows (< 0: one a
 * kept token). */
static int pages_alloc(agentlang_pages *pg, const uint8_t *keep, int64_t N, int W,
		       int64_t max_windows)
{
	int64_t nv = 0;

	for (int64_t i = 0; i < N; i++)
		nv += keep[i];
	pg->window = W;
	pg->ws_tokens = N;
	pg->n_view = (int)nv;
	if (max_windows < 0)
		max_windows = nv;
	pg->pos = malloc(sizeof(*pg->pos) * (size_t)(nv + 1));
	pg->win = malloc(sizeof(*pg->win) * (size_t)(nv + 1));
	pg->off = malloc(sizeof(*pg->off) * (size_t)(nv + 1));
	pg->win_start = malloc(sizeof(*pg->win_start) * (size_t)(max_windows + 1));
	pg->win_end = malloc(sizeof(*pg->win_end) * (size_t)(max_windows + 1));
	if (!pg->pos || !pg->win || !pg->off || !pg->win_start || !pg->win_end)
		return kvmem_error(ENOMEM, "agentlang: out of memory for the pages of a view");
	for (int64_t i = 0, j = 0; i < N; i++)
		if (keep[i])
			pg->pos[j++] = i;
	return 0;
}

static int pages_fill_ids(const agentlang_transcript *ws, agentlang_pages *pg, int nw)
{
	int W = pg->window;

	pg->ids = malloc(sizeof(*pg->ids) * (size_t)nw * (size_t)W);
	if (!pg->ids)
		return kvmem_error(ENOMEM, "agentlang: out of memory for %d page windows", nw);
	for (int w = 0; w < nw; w++) {
		int64_t a = pg->win_start[w], e = pg->win_end[w];
		int32_t *d = pg->ids + (size_t)w * W;

		memcpy(d, ws->ids + a, (size_t)(e - a) * sizeof(*d));
		for (int64_t i = e - a; i < W; i++)
			d[i] = AGENTLANG_PAD;
	}
	pg->n_windows = nw;
	return 0;
}

/*
 * The page windows of a paged view sequence (agentlang_pages in
 * agentlang.h): for each run of kept tokens, in order, a window of at most
 * W workspace tokens that ends where a run ends; one window serves the
 * following runs too while it can still start W / 2 tokens before the
 * first one's start (or at the workspace's start). Runs are cut into
 * pieces of W / 2 so that the first run always fits its window.
 */
static int build_pages(const agentlang_transcript *ws, const uint8_t *keep, int W,
		       agentlang_pages *pg)
{
	int64_t N = ws->n_ids, half = W / 2, nv, k = 0;
	int nw = 0;

	/* At most a window per kept token. */
	if (pages_alloc(pg, keep, N, W, -1))
		return kvmem_fail();
	nv = pg->n_view;
	while (k < nv) {
		const int64_t *pos = pg->pos;
		int64_t smax = pos[k] > half ? pos[k] - half : 0, end = -1, last = k;

		for (int64_t t = k; t < nv;) {
			int64_t u = t;

			while (u + 1 < nv && pos[u + 1] == pos[u] + 1 && pos[u + 1] - pos[t] < half)
				u++;
			if (pos[u] + 1 > smax + W)
				break;
			end = pos[u] + 1;
			last = t = u + 1;
		}
		if (end < 0 || nw >= 65535)	/* cannot be: the first piece always fits */
			return kvmem_error(EINVAL, "agentlang: no page window for token %lld",
					   (long long)pos[k]);
		int64_t start = end > W ? end - W : 0;

		for (int64_t m = k; m < last; m++) {
			pg->win[m] = (uint16_t)nw;
			pg->off[m] = (uint16_t)(pos[m] - start);
		}
		pg->win_start[nw] = start;
		pg->win_end[nw++] = end;
		k = last;
	}
	return pages_fill_ids(ws, pg, nw);
}

/*
 * The page windows of a whole paged sequence (agentlang.h): windows of W
 * that tile the workspace, a new one every W / 2 tokens after the first,
 * each owning the tokens after its predecessor's end, so that train.py
 * computes every block of the workspace (for Mean-K's softmax over all of
 * them, as kvmem's prefill computes their summaries) from a window that
 * gives it at least W / 2 tokens of context. The kept tokens map to their
 * owners. About 2N / W windows: a 64x workspace of W = 2048 costs 127.
 */
static int build_whole_pages(const agentlang_transcript *ws, const uint8_t *keep, int W,
			     agentlang_pages *pg)
{
	int64_t N = ws->n_ids, half = W / 2;
	int64_t nw = N <= W ? 1 : 1 + (N - W + half - 1) / half;

	if (nw > 65535)
		return kvmem_error(EINVAL, "agentlang: %lld page windows for a workspace of %lld",
				   (long long)nw, (long long)N);
	if (pages_alloc(pg, keep, N, W, nw))
		return kvmem_fail();
	for (int64_t k = 0; k < nw; k++) {
		int64_t e = W + k * half < N ? W + k * half : N;

		pg->win_end[k] = e;
		pg->win_start[k] = e > W ? e - W : 0;
	}
	for (int64_t i = 0, k = 0; i < pg->n_view; i++) {
		while (pg->pos[i] >= pg->win_end[k])
			k++;
		pg->win[i] = (uint16_t)k;
		pg->off[i] = (uint16_t)(pg->pos[i] - pg->win_start[k]);
	}
	pg->whole = 1;
	return pages_fill_ids(ws, pg, (int)nw);
}

/* Whether sequence `index` is paged: its own draw, apart from the
 * sequence's random stream, so that the ids do not depend on the share. */
static int is_paged(uint64_t seed, uint64_t index, double share)
{
	uint64_t h = al_mix64(al_mix64(seed ^ 0x9e3779b97f4a7c15ull) ^ index);

	return share > 0 && (double)(h >> 11) * 0x1p-53 < share;
}

/* Whether a paged sequence is whole: a draw of its own, like is_paged's. */
static int is_whole(uint64_t seed, uint64_t index, double share)
{
	uint64_t h = al_mix64(al_mix64(seed ^ 0x3c6ef372fe94f82bull) ^ index);

	return share > 0 && (double)(h >> 11) * 0x1p-53 < share;
}

/*
 * A view sequence whose view the policy vo->policy chose, as at inference
 * (agentlang_view_select): 1-8 questions, 0-8 look-alikes a needle (the
 * benchmark's targets use 8), a workspace 1..max_ratio windows long. A
 * question is asked when its needle line is in view, or, dropped on
 * purpose, its value is.
 */
static int policy_view_seq(uint64_t seed, uint64_t index, int L, const agentlang_view_opts *vo,
			   struct al_rng *r, int32_t *out, agentlang_seq_info *info,
			   agentlang_pages *pg)
{
	int n_ratios = vo->max_ratio >= 64 ? 7 : vo->max_ratio >= 32 ? 6 : 5;
	int ratio = 1 << al_below(r, (uint32_t)n_ratios);
	int M = 1 + (int)al_below(r, 8), asked[64], n_asked = 0;
	/* kvmem bench recall's budget for a window of L (without the chunk). */
	int64_t budget = (L - 32 - L / 8) / VIEW_BLOCK * VIEW_BLOCK, n = 0;
	agentlang_params p;
	agentlang_transcript ws;
	double depths[8];

	agentlang_params_default(&p);
	p.seed = al_mix64(seed ^ al_mix64(index ^ 0x6a09e667f3bcc909ull));
	p.lookalikes = (int)al_below(r, 9);
	if (vo->lookalikes > 0)
		p.lookalikes = vo->lookalikes;
	p.bg_questions = 0;	/* see view_seq */
	if (vo->stale > 0)
		p.stale = vo->stale;
	p.n_tokens = ratio == 1 ? L - (int64_t)M * Q_LINE_MAX : (int64_t)L * ratio;
	int fit = (int)(p.n_tokens / (2 * (AL_EP_MAX + 16 * (p.lookalikes + 1))));
	M = M < fit ? M : fit < 1 ? 1 : fit;
	p.n_questions = M;
	if (ratio == 1)
		p.n_tokens = L - (int64_t)M * Q_LINE_MAX;
	for (int i = 0; i < M; i++)
		depths[i] = al_unit(r);
	p.depths = depths;
	if (agentlang_transcript_build(&p, &ws))
		return kvmem_fail();
	for (int i = 0; i < ws.n_q; i++)
		asked[i] = i;
	if (ratio == 1) {
		memcpy(out, ws.ids, (size_t)ws.n_ids * sizeof(*out));
		n = ws.n_ids;
		n_asked = ws.n_q;
	} else {
		uint8_t *keep = malloc((size_t)ws.n_ids);
		int64_t recent_from = ws.n_ids - (budget / 12 > 1 ? budget / 12 : 1);

		if (!keep || agentlang_view_select(&ws, asked, ws.n_q, budget, vo->policy, keep) < 0) {
			if (!keep)
				kvmem_error(ENOMEM, "agentlang: out of memory for a view");
			free(keep);
			agentlang_transcript_free(&ws);
			return kvmem_fail();
		}
		uint8_t cut[8] = { 0 };

		/* Every drop first: one may take another question's line. */
		for (int i = 0; i < ws.n_q; i++)
			cut[i] = vo->drop > 0 && al_chance(r, vo->drop) &&
				 drop_head(&ws.q[i], ws.n_ids, recent_from, keep);
		for (int i = 0; i < ws.n_q; i++) {
			const agentlang_question *q = &ws.q[i];

			if (all_kept(keep, cut[i] ? q->value_pos : q->needle_pos, q->needle_end))
				asked[n_asked++] = i;
		}
		for (int64_t i = 0; i < ws.n_ids; i++)
			if (keep[i])
				out[n++] = ws.ids[i];
		/* A view that kept no question's needle asks nothing: its pages
		 * would teach nothing and its record would have no question after
		 * the view, so it stays a plain view sequence. */
		int W = vo->window > 0 ? vo->window : L;
		int whole = ratio >= (vo->whole_min_ratio > 0 ? vo->whole_min_ratio : 16) &&
			    is_whole(seed, index, vo->whole);

		if (pg && n_asked > 0 && is_paged(seed, index, vo->paged) &&
		    (whole ? build_whole_pages(&ws, keep, W, pg) : build_pages(&ws, keep, W, pg))) {
			free(keep);
			agentlang_transcript_free(&ws);
			return kvmem_fail();
		}
		free(keep);
	}
	int64_t tail = 0;
	for (int i = 0; i < n_asked; i++)
		tail += ws.q[asked[i]].n_ids + ws.q[asked[i]].n_answer + 1;
	if (n + tail > L) {
		agentlang_transcript_free(&ws);
		return kvmem_error(EINVAL, "agentlang: a view of %lld tokens and %lld of questions "
				   "pass the sequence's %d", (long long)n, (long long)tail, L);
	}
	int put[64];

	n = put_questions(&ws, asked, n_asked, r, out, n, put);
	if (pg && pg->n_view) {
		pg->n_q = n_asked;
		for (int i = 0; i < n_asked; i++)
			pg->needle[i] = ws.q[put[i]].value_pos - 1;	/* the fact line's '=' */
	}
	for (int64_t i = n; i < L; i++)
		out[i] = AGENTLANG_PAD;
	info->kind = AGENTLANG_SEQ_VIEW;
	info->n_tokens = (int)n;
	info->n_questions = n_asked;
	info->lookalikes = fewest_lookalikes(&ws);
	if (pg && pg->n_view && pg->want_workspace) {
		pg->ws = malloc(sizeof(*pg->ws));
		if (!pg->ws) {
			agentlang_transcript_free(&ws);
			return kvmem_error(ENOMEM, "agentlang: out of memory");
		}
		*pg->ws = ws;	/* handed over: agentlang_pages_free frees it */
		return 0;
	}
	agentlang_transcript_free(&ws);
	return 0;
}

void agentlang_pages_free(agentlang_pages *pg)
{
	if (!pg)
		return;
	free(pg->win_start);
	free(pg->win_end);
	free(pg->ids);
	free(pg->win);
	free(pg->off);
	free(pg->pos);
	if (pg->ws) {
		agentlang_transcript_free(pg->ws);
		free(pg->ws);
	}
	int want = pg->want_workspace;

	memset(pg, 0, sizeof(*pg));
	pg->want_workspace = want;
}

int agentlang_train_seq(uint64_t seed, uint64_t index, int seq_len, double view_share,
		       int32_t *out, agentlang_seq_info *info)
{
	return agentlang_train_seq_opts(seed, index, seq_len, view_share, NULL, out, info);
}

int agentlang_train_seq_opts(uint64_t seed, uint64_t index, int seq_len, double view_share,
			    const agentlang_view_opts *vo, int32_t *out, agentlang_seq_info *info)
{
	return agentlang_train_seq_paged(seed, index, seq_len, view_share, vo, out, info, NULL);
}

int agentlang_train_seq_paged(uint64_t seed, uint64_t index, int seq_len, double view_share,
			      const agentlang_view_opts *vo, int32_t *out, agentlang_seq_info *info,
			      agentlang_pages *pg)
{
	struct al_rng r;
	agentlang_seq_info dummy;

	if (seq_len < 256 || seq_len > (1 << 20))
		return kvmem_error(EINVAL, "agentlang: sequence length %d: need 256 .. 2^20", seq_len);
	if (!(view_share >= 0 && view_share <= 1))
		return kvmem_error(EINVAL, "agentlang: view share %g is not in 0..1", view_share);
	if (!info)
		info = &dummy;
	if (pg) {
		int want = pg->want_workspace;

		memset(pg, 0, sizeof(*pg));
		pg->want_workspace = want;
	}
	if (pg && vo && vo->paged > 0 &&
	    (vo->window < 0 || vo->window % 2 || (vo->window && vo->window < 64) || vo->window > 32768))
		return kvmem_error(EINVAL, "agentlang: page window %d: an even count in 64..32768",
				   vo->window);
	if (pg && vo && vo->paged > 0 && vo->whole > 0 && (vo->window ? vo->window : seq_len) % 64)
		return kvmem_error(EINVAL, "agentlang: whole paged sequences need a page window "
				   "divisible by 64 (whole blocks of 32 in each half), not %d",
				   vo->window ? vo->window : seq_len);
	al_rng_seed(&r, seed, index);
	/* Views need room for a few needles and their blocks. */
	if (seq_len >= 512 && al_chance(&r, view_share))
		return vo && vo->policy && vo->policy[0] ?
			policy_view_seq(seed, index, seq_len, vo, &r, out, info, pg) :
			view_seq(seed, index, seq_len, vo, &r, out, info);
	return stream_seq(seed, index, seq_len, &r, out, info);
}

// SPDX-License-Identifier: MIT
/*
 * Selection and rematerialisation: score every block with the step's last
 * queries, plan the next view, and rebuild the execution view from raw K.
 *
 * Every token of the new view lands at its slot (compact, or where the
 * stable layout keeps it: the plan's start, user/select/plan.c). Its K there is
 * kvmem_rope(raw K, slot), computed from the page source's raw K. A token that
 * already sits at that very slot (a block kept in place, or the tail that
 * the engine rotated at that slot) is left alone: the engine rotates a copy
 * of the same raw K at the same slot with the same kernel, so the bits are
 * those a rebuild would write. Nothing is ever rotated from a rotated copy.
 *
 * A token that stays in the view but changes slots (every block after one
 * that entered or left shifts) is moved on the backend when it keeps raw K
 * beside the view (keep_raw, move): K rotated at the new slot from that
 * raw K, V moved, at the device's memory speed, no page read. Only what
 * enters the view is got from the page source: a step reads the pages of
 * the blocks that entered (kvmem_session_stats.source_pages).
 */
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "select/plan_walk.h"
#include "select/score.h"
#include "session/session_int.h"

int ws_view_reserve(kvmem_session *s, int64_t need)
{
	int64_t cap = s->be->ops->capacity(s->be->ctx, s->view);

	if (need <= cap)
		return 0;
	if (need > s->cap_limit || need > INT_MAX)
		return kvmem_error(EINVAL, "session: the view needs %lld slots, more than its limit %lld",
				   (long long)need, (long long)s->cap_limit);
	cap = cap ? 2 * cap : 256;
	while (cap < need)
		cap *= 2;
	if (cap > s->cap_limit)
		cap = s->cap_limit;
	if (cap > INT_MAX)
		cap = INT_MAX;
	if (s->be->ops->reserve(s->be->ctx, s->view, cap))
		return kvmem_error_prefix("session");
	return 0;
}

/* Items queued before the backend places them: the pages stay held (got,
 * not put) until then, so a batch is bounded (by the host pool too: a get
 * that finds it full of held pages places the batch early). Large batches
 * make few large transfers: on a GPU one place() call is one kernel over
 * all its pages (1024 pages of Qwen3-8B are 128 MiB of bf16). Items of
 * pages the backend keeps (page_cached) hold nothing of the source's, so a
 * batch of them grows to PLACE_BATCH_CACHED: a warm step at 64K over 256K
 * tokens is 51K of them, and at 1024 a call the H200's gather ran 50
 * kernels of about 70 us each, with their starts and tails, and a block's
 * 36 layers split over 7-item runs (one rotary angle table a run). */
#define PLACE_BATCH 1024
#define PLACE_BATCH_CACHED 8192

/* PLACE_BATCH_CACHED, or KVMEM_PLACE_BATCH_CACHED's (PLACE_BATCH up to 1M
 * items; benchmarks set 1024 to compare with the batches before). */
static int cached_batch(void)
{
	static int n;

	if (!n) {
		const char *e = getenv("KVMEM_PLACE_BATCH_CACHED");
		const long v = e && *e ? strtol(e, NULL, 10) : PLACE_BATCH_CACHED;

		n = v < PLACE_BATCH ? PLACE_BATCH : v > (1 << 20) ? (1 << 20) : (int)v;
	}
	return n;
}

uint32_t ws_new_owner(void)
{
	static atomic_uint next;
	uint32_t o;

	do	/* 0 names no owner: skipped when the count wraps */
		o = (uint32_t)atomic_fetch_add(&next, 1) + 1;
	while (!o);
	return o;
}

/* The backend's device page pool took or dropped pages of this session's:
 * the source hears of it (a store records its GPU tier). */
static void device_report(void *arg, const kvmem_device_page *pages, int n)
{
	kvmem_session *s = arg;

	s->src->ops->device(s->src->ctx, pages, n);
}

void ws_register(kvmem_session *s)
{
	void *base = NULL;
	size_t len = 0;
	int rc;

	if (s->reg_tried || !s->src->ops->region || !s->be->ops->host_register)
		return;
	rc = s->src->ops->region(s->src->ctx, &base, &len);
	/* -ENOENT: no region yet (the module's window before the first
	 * commit): asked again at the next selection. */
	if (rc == -ENOENT)
		return;
	s->reg_tried = 1;
	if (rc < 0 || !base || !len)
		return;
	/* A refusal only means pages are staged: not an error. */
	if (s->be->ops->host_register(s->be->ctx, base, len) == 0)
		s->reg_base = base;
	/* Without a watch the store only misses the GPU tier: not an error. */
	if (s->reg_base && s->be->ops->pool_watch && s->src->ops->device)
		s->be->ops->pool_watch(s->be->ctx, base, s->owner, device_report, s);
}

void ws_unregister(kvmem_session *s)
{
	/* Unregistered first: the pages the pool drops with it are still
	 * reported to the source. */
	if (s->reg_base && s->be->ops->host_unregister)
		s->be->ops->host_unregister(s->be->ctx, s->reg_base);
	if (s->reg_base && s->be->ops->pool_watch)
		s->be->ops->pool_watch(s->be->ctx, s->reg_base, s->owner, NULL, NULL);
	s->reg_base = NULL;
}

/* Place the queued items (unless dropping them after a failure), then let
 * their pages go. */
static int flush_or_drop(kvmem_session *s, int drop)
{
	int rc = 0;

	if (s->n_items && !drop)
		rc = s->be->ops->place(s->be->ctx, s->view, s->items, s->n_items);
	for (int i = 0; i < s->n_items; i++) {
		const kvmem_place *it = &s->items[i];

		if (it->page.mem != KVMEM_MEM_BACKEND)
			s->src->ops->put(s->src->ctx, it->block, it->layer);
	}
	s->n_items = 0;
	s->n_held = 0;
	return rc ? kvmem_error_prefix("session: rematerialising") : 0;
}

static int flush(kvmem_session *s)
{
	return flush_or_drop(s, 0);
}

/* Tokens u0..u1-1 of block b, layer l: raw K rotated at slot0.., V copied
 * (queued; flush() makes it so). */
static int rebuild(kvmem_session *s, int l, int64_t b, int u0, int u1, int64_t slot0)
{
	kvmem_place *it;
	int rc;

	if (u1 <= u0)
		return 0;
	if ((s->n_held == PLACE_BATCH || s->n_items == cached_batch()) && flush(s))
		return kvmem_fail();
	if (s->n_items == s->cap_items) {
		const int cap = s->cap_items ? 2 * s->cap_items : PLACE_BATCH;
		kvmem_place *p = realloc(s->items, (size_t)cap * sizeof(*p));

		if (!p)
			return kvmem_error(ENOMEM, "session: out of memory");
		s->items = p;
		s->cap_items = cap;
	}
	it = &s->items[s->n_items];
	/* A page the backend keeps itself (a GPU's page pool) is not asked
	 * of the source: no host fetch, no pin. */
	it->cached = 0;
	if (s->reg_base && s->be->ops->page_cached &&
	    s->be->ops->page_cached(s->be->ctx, s->reg_base, s->owner, b, l, &it->cached) == 1) {
		it->page = (kvmem_page){ .k = s->reg_base, .dtype = KVMEM_DTYPE_BF16,
					 .mem = KVMEM_MEM_BACKEND };
		rc = 0;
	} else {
		rc = s->src->ops->get(s->src->ctx, b, l, &it->page);
	}
	if (rc == -ENOBUFS && s->n_items) {
		/* The held pages fill the host pool: place them, try again. */
		if (flush(s))
			return kvmem_fail();
		it = &s->items[0];
		it->cached = 0;
		rc = s->src->ops->get(s->src->ctx, b, l, &it->page);
	}
	if (rc)
		return kvmem_error_prefix("session: rematerialising block %lld", (long long)b);
	it->layer = l;
	it->u0 = u0;
	it->n = u1 - u0;
	it->stride = s->blocks.block;
	it->slot = slot0;
	it->block = b;
	it->owner = s->owner;
	s->n_items++;
	s->n_held += it->page.mem != KVMEM_MEM_BACKEND;
	s->st.rebuilt_tokens += u1 - u0;
	s->st.source_pages += it->page.mem != KVMEM_MEM_BACKEND;
	return 0;
}

/* Tokens of layer l at slots have.. go to want..: queued for one move. */
static int queue_move(void *arg, int l, int64_t b, int u0, int u1, int64_t have, int64_t want)
{
	kvmem_session *s = arg;

	if (u1 <= u0 || have < 0 || have == want)
		return 0;
	if (s->n_moves == s->cap_moves) {
		size_t cap = s->cap_moves ? 2 * s->cap_moves : 1024;
		kvmem_move *m = realloc(s->moves, cap * sizeof(*m));

		if (!m)
			return kvmem_error(ENOMEM, "session: out of memory for %zu moves", cap);
		s->moves = m;
		s->cap_moves = cap;
	}
	s->moves[s->n_moves++] = (kvmem_move){ .layer = l, .n = u1 - u0, .from = have + u0,
					       .to = want + u0 };
	return 0;
}

/*
 * Everything that stays in the view but changes slots (blocks after one
 * that entered or left, the tail becoming history) in one move on the
 * backend: K rotated at the new slot from the raw K the backend keeps, V
 * moved, no page read. 1 when done (the placements then leave those
 * tokens alone), 0 when the backend cannot (it keeps no raw K, or gave it
 * up): they are placed from their pages as before.
 */
static int move_kept(kvmem_session *s, const kvmem_plan *np)
{
	int64_t tokens = 0;
	int rc;

	if (!s->move_ok || s->o.rebuild_all)
		return 0;
	s->n_moves = 0;
	if (ws_plan_walk_changed(&s->plan, np, &s->blocks, s->cfg.n_layers, s->sel_tokens,
				 s->view_len, queue_move, s, NULL))
		return kvmem_fail();
	if (!s->n_moves)
		return 1;
	if (s->n_moves > INT_MAX)
		return kvmem_error(EINVAL, "session: %zu moves in one step", s->n_moves);
	rc = s->be->ops->move(s->be->ctx, s->view, s->moves, (int)s->n_moves);
	if (rc == -ENOTSUP || rc == -ENOMEM) {
		/* Nothing moved: the pages do it, from now on. */
		s->move_ok = 0;
		return 0;
	}
	if (rc)
		return kvmem_error_prefix("session: moving %zu runs inside the view", s->n_moves);
	for (size_t i = 0; i < s->n_moves; i++)
		tokens += s->moves[i].n;
	s->st.moved_tokens += tokens;
	s->st.rebuilt_tokens += tokens;
	return 1;
}

/* Tokens u0..u1-1 now sit at slot `have` + u (have < 0: not in the view);
 * they belong at `want` + u. */
static int place(void *arg, int l, int64_t b, int u0, int u1, int64_t have, int64_t want)
{
	kvmem_session *s = arg;

	if (u1 <= u0)
		return 0;
	if (have == want && !s->o.rebuild_all) {
		s->st.kept_tokens += u1 - u0;
		return 0;
	}
	if (have >= 0 && s->moving)
		return 0;	/* moved already (move_kept) */
	return rebuild(s, l, b, u0, u1, want + u0);
}

static void hint_entering(kvmem_session *s, const kvmem_plan *np)
{
	int64_t *list;
	int n = 0;

	if (!s->src->ops->prefetch)
		return;
	list = malloc((size_t)(np->n_view ? np->n_view : 1) * sizeof(int64_t));
	if (!list)
		return;	/* only a hint */
	for (int i = 0; i < np->n_view; i++)
		for (int set = 0; set < np->n_sets; set++)
			if (np->state[(size_t)set * np->n_view + i] == KVMEM_VIEW_ENTERING) {
				list[n++] = np->blocks[(size_t)set * np->n_view + i];
				break;
			}
	if (n)
		s->src->ops->prefetch(s->src->ctx, list, n);
	free(list);
}

/* A rematerialisation's start: the view's room, the source's region and
 * prefetch hint, then the moves (every layer's at once). */
static int remat_begin(kvmem_session *s, const kvmem_plan *np)
{
	int64_t t0;

	if (ws_view_reserve(s, np->view_tokens))
		return kvmem_fail();
	ws_register(s);
	hint_entering(s, np);
	t0 = (int64_t)kvmem_now_ns();
	/* Moves first: every one reads the view as it was, before a page
	 * lands on a slot a moved token leaves. */
	if ((s->moving = move_kept(s, np)) < 0) {
		s->moving = 0;
		return kvmem_fail();
	}
	s->st.move_ns += (int64_t)kvmem_now_ns() - t0;
	return 0;
}

/* place() for the layers l0..l1-1 of a walk over all of them. */
struct layer_range {
	kvmem_session *s;
	int l0, l1;
};

static int place_in(void *arg, int l, int64_t b, int u0, int u1, int64_t have, int64_t want)
{
	const struct layer_range *r = arg;

	return l < r->l0 || l >= r->l1 ? 0 : place(r->s, l, b, u0, u1, have, want);
}

/* The placements of layers l0..l1-1, made. Each walk sees every layer's
 * runs; the kept tokens (all layers') are counted by the first. */
static int remat_layers(kvmem_session *s, const kvmem_plan *np, int l0, int l1)
{
	const int L = s->cfg.n_layers, all = l0 == 0 && l1 >= L;
	struct layer_range r = { s, l0, l1 };
	ws_place_fn fn = all ? place : place_in;
	void *arg = all ? (void *)s : (void *)&r;
	int64_t t0 = (int64_t)kvmem_now_ns();
	int rc;

	if (s->o.rebuild_all) {
		rc = ws_plan_walk(&s->plan, np, &s->blocks, L, s->sel_tokens, s->view_len, fn, arg);
	} else {	/* what stays put is only counted */
		int64_t kept = 0;

		rc = ws_plan_walk_changed(&s->plan, np, &s->blocks, L, s->sel_tokens, s->view_len,
					  fn, arg, &kept);
		if (l0 == 0)
			s->st.kept_tokens += kept;
	}
	rc = rc ? kvmem_fail() : flush(s);
	s->st.place_ns += (int64_t)kvmem_now_ns() - t0;
	return rc;
}

/*
 * Tell the source what the selector thinks (a cache may keep accordingly):
 * 1 for every block in the new view, 0.5 for as many runners-up: the best
 * of the rest by score (for a per-layer policy, by its best layer's).
 */
static void hint_selected(kvmem_session *s, const kvmem_plan *np)
{
	const int64_t nb = kvmem_blocks_count(&s->blocks);
	int64_t *idx, n_in, n;
	float *h;

	if (!s->src->ops->hint || !np->n_view || nb > INT_MAX)
		return;
	idx = malloc((size_t)nb * sizeof(*idx));
	h = malloc((size_t)nb * sizeof(*h));
	if (idx && h && (n = ws_plan_hints(np, s->scores, s->n_sets, nb, idx, &n_in)) >= 0) {
		for (int64_t i = 0; i < n; i++)
			h[i] = i < n_in ? 1.0f : 0.5f;
		s->src->ops->hint(s->src->ctx, idx, h, (int)n);
	}
	free(idx);	/* only a hint: nothing said when memory is short */
	free(h);
}

int ws_select(kvmem_session *s, int forced)
{
	return ws_select_text(s, forced, NULL, 0);
}

/* A failure while the view was half rebuilt: nothing can run on it any
 * more. */
static int remat_failed(kvmem_session *s, kvmem_plan *np)
{
	flush_or_drop(s, 1);
	s->moving = 0;
	s->broken = 1;
	kvmem_plan_free(np);
	return kvmem_fail();
}

int ws_select_begin(kvmem_session *s, int forced, const int32_t *ahead, int n_ahead, kvmem_plan *np)
{
	const int64_t nb = kvmem_blocks_count(&s->blocks);
	kvmem_plan_params pp = { s->budget, s->o.sink, s->o.recent, s->o.layout };
	kvmem_select_ctx c;
	kvmem_score_device dev;
	const int64_t *q_pos;
	const float *q;
	size_t need = (size_t)s->n_sets * (nb ? nb : 1);
	int64_t t0, t1;

	memset(np, 0, sizeof(*np));
	/* The source is read below: the rows in flight first. */
	if (ws_writer_wait(s))
		return kvmem_fail();
	if (nb == 0)
		return 1;
	if (s->o.tap && s->o.tap->begin)
		s->o.tap->begin(s->o.tap->arg, s);
	if ((int64_t)need > s->cap_scores) {
		float *sc = realloc(s->scores, need * sizeof(float));

		if (!sc)
			return kvmem_error(ENOMEM, "session: out of memory for %lld block scores",
					 (long long)need);
		s->scores = sc;
		s->cap_scores = (int64_t)need;
	}
	q = ws_queries(s, &q_pos);
	c = (kvmem_select_ctx){
		.index = &s->index,
		.keys = s->src,
		.n_tokens = s->blocks.n_tokens,
		.n_blocks = nb,
		.block = s->blocks.block,
		.n_layers = s->cfg.n_layers,
		.n_heads = s->cfg.n_heads,
		.n_kv_heads = s->cfg.n_kv_heads,
		.head_dim = s->cfg.head_dim,
		.rope_theta = s->cfg.rope_theta,
		.n_q = s->n_q,
		.q = q,
		.q_pos = q_pos,
		.seed = s->o.seed,
		.step = s->st.selections,
		.span = s->o.budget ? s->cap_limit : 0,
		.budget = s->o.budget,
		.device = ws_score_device(s, &dev),
		.tokens = s->tokens,
	};
	/* The query text (session.h): the tokens about to be appended, else
	 * the history's from the first query position to the last. */
	if (ahead) {
		c.text = ahead;
		c.n_text = n_ahead;
	} else if (s->n_q && q_pos[s->n_q - 1] >= q_pos[0] && q_pos[s->n_q - 1] < c.n_tokens) {
		c.text = s->tokens + q_pos[0];
		c.n_text = q_pos[s->n_q - 1] - q_pos[0] + 1;
	}
	s->scored_blocks = 0;
	t0 = (int64_t)kvmem_now_ns();
	if (s->pol->score(&c, s->scores))
		return kvmem_error_prefix("session: policy %s", s->pol->name);
	s->scored_blocks = nb;
	t1 = (int64_t)kvmem_now_ns();
	s->st.score_ns += t1 - t0;
	if (s->o.tap && s->o.tap->scored)
		s->o.tap->scored(s->o.tap->arg, s, &c, s->scores, forced);
	t0 = (int64_t)kvmem_now_ns();
	if (kvmem_plan_build(np, &s->blocks, s->scores, s->n_sets, &s->plan, &pp))
		return kvmem_error_prefix("session");
	s->st.plan_ns += (int64_t)kvmem_now_ns() - t0;
	return remat_begin(s, np) ? remat_failed(s, np) : 0;
}

int ws_select_layers(kvmem_session *s, kvmem_plan *np, int l0, int l1)
{
	return remat_layers(s, np, l0, l1) ? remat_failed(s, np) : 0;
}

int ws_select_end(kvmem_session *s, kvmem_plan *np, int forced)
{
	int64_t t0;

	s->moving = 0;
	kvmem_plan_free(&s->plan);
	s->plan = *np;
	memset(np, 0, sizeof(*np));
	s->view_len = s->plan.view_tokens;
	s->sel_tokens = s->blocks.n_tokens;
	t0 = (int64_t)kvmem_now_ns();
	if (s->be->ops->set_length(s->be->ctx, s->view, s->view_len)) {
		s->broken = 1;
		return kvmem_error_prefix("session");
	}
	hint_selected(s, &s->plan);
	s->st.select_after_ns += (int64_t)kvmem_now_ns() - t0;
	s->st.selections++;
	s->st.forced += forced;
	if (s->o.on_select)
		s->o.on_select(s->o.arg, &s->plan, forced);
	if (s->o.tap && s->o.tap->planned)
		s->o.tap->planned(s->o.tap->arg, s, &s->plan, forced);
	return 0;
}

int ws_select_text(kvmem_session *s, int forced, const int32_t *ahead, int n_ahead)
{
	kvmem_plan np;
	int rc = ws_select_begin(s, forced, ahead, n_ahead, &np);

	if (rc)
		return rc > 0 ? 0 : kvmem_fail();
	if (ws_select_layers(s, &np, 0, s->cfg.n_layers))
		return kvmem_fail();
	return ws_select_end(s, &np, forced);
}

/* Prefetch hint for a restored view: its history blocks (set 0) and the
 * blocks the tail spans. */
static void hint_restore(kvmem_session *s)
{
	const kvmem_plan *p = &s->plan;
	const int64_t B = s->blocks.block, n = s->blocks.n_tokens;
	int64_t first = s->sel_tokens / B, last = n ? (n - 1) / B : -1, *list;
	int m = 0;

	if (!s->src->ops->prefetch)
		return;
	list = malloc((size_t)(p->n_view + (last >= first ? last - first + 1 : 0) + 1) *
		      sizeof(int64_t));
	if (!list)
		return;	/* only a hint */
	for (int i = 0; i < p->n_view; i++)
		list[m++] = p->blocks[i];
	for (int64_t b = first; n > s->sel_tokens && b <= last; b++)
		if (!m || list[m - 1] != b)
			list[m++] = b;
	if (m)
		s->src->ops->prefetch(s->src->ctx, list, m);
	free(list);
}

int ws_view_restore(kvmem_session *s)
{
	int next = 0;

	return ws_view_restore_layers(s, &next, s->cfg.n_layers);
}

int ws_view_restore_layers(kvmem_session *s, int *next, int layers)
{
	const kvmem_plan *p = &s->plan;
	const int64_t B = s->blocks.block, n = s->blocks.n_tokens, sel = s->sel_tokens;
	const int64_t len = s->view_len + (n - sel);
	const int end = *next + layers < s->cfg.n_layers ? *next + layers : s->cfg.n_layers;

	if (*next == 0) {
		if (ws_view_reserve(s, len))
			return kvmem_fail();
		ws_register(s);
		hint_restore(s);
	}
	for (int l = *next; l < end; l++) {
		int set = p->n_sets <= 1 ? 0 : l;
		/* An empty plan (nothing selected yet) has no arrays at all. */
		const int64_t *nb = p->n_view ? p->blocks + (size_t)set * p->n_view : NULL;
		const int64_t *ns = p->n_view ? p->start + (size_t)set * p->n_view : NULL;

		/* The history part: each block as long as it was when planned. */
		for (int i = 0; i < p->n_view; i++) {
			int64_t b = nb[i], have = sel - b * B;

			if (rebuild(s, l, b, 0, have < B ? (int)have : (int)B, ns[i]))
				return kvmem_fail();
		}
		/* The tail: token q >= sel at slot view_len + (q - sel). */
		for (int64_t q = sel; q < n;) {
			int u0 = (int)(q % B), u1 = n - q < B - u0 ? u0 + (int)(n - q) : (int)B;

			if (rebuild(s, l, q / B, u0, u1, s->view_len + (q - sel)))
				return kvmem_fail();
			q += u1 - u0;
		}
	}
	if (flush(s))
		return kvmem_fail();
	*next = end;
	if (end < s->cfg.n_layers)
		return 1;
	return s->be->ops->set_length(s->be->ctx, s->view, len) ? kvmem_error_prefix("session") : 0;
}

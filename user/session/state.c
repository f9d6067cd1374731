// SPDX-License-Identifier: MIT
/*
 * Session state: everything beyond the history (token ids and pages) that
 * decides what a session computes next, saved at a commit point and
 * restored on adopt, so a session run in two parts with a reopen between
 * them computes, bit for bit, what it computes in one go.
 *
 * What decides the next outputs, and where it goes:
 *   the view            plan in force + view_len + sel_tokens (the tail is
 *                       token q >= sel_tokens at slot view_len + q - sel):
 *                       rebuilt from raw K / V pages slot for slot
 *   the next selection  pins, the plan in force (the planner diffs against
 *                       it), the raw-query window, the selection count
 *                       (the random policy's draw), the index (rebuilt from
 *                       the pages: sums run in token order, the same bits)
 *   the next token      the last logits and the sampling RNG
 * The options that shape all this must be the same on both sides.
 *
 * Layout (host byte order; Documentation/workspace.md): a 24-byte header
 * {magic, version, total bytes, XXH3-64 of the bytes after the header},
 * then the fields in the order of save() below. Every count is checked
 * against what is left before it is used.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kvmem/kvmem.h"
#include "session/session_int.h"
#include "util/grow.h"

#define STATE_MAGIC 0x5353564bu		/* "KVSS" in little-endian bytes */
#define STATE_VERSION 1u		/* the compact view layout */
#define STATE_VERSION_LAYOUT 2u	/* 1 + the layout after the seed (a stable view) */
#define STATE_HEADER 24
#define POLICY_NAME 32

/* ---- writing ------------------------------------------------------------ */
struct wbuf {
	uint8_t *p;
	size_t len, cap;
	int oom;
};

static void put(struct wbuf *w, const void *x, size_t n)
{
	if (w->oom || !n)
		return;
	if (kvmem_grow(&w->p, 1, w->len + n, &w->cap, 4096)) {
		w->oom = 1;
		return;
	}
	memcpy(w->p + w->len, x, n);
	w->len += n;
}

static void put_u32(struct wbuf *w, uint32_t v)
{
	put(w, &v, sizeof(v));
}

static void put_u64(struct wbuf *w, uint64_t v)
{
	put(w, &v, sizeof(v));
}

static void put_i64(struct wbuf *w, int64_t v)
{
	put(w, &v, sizeof(v));
}

/* ---- reading ------------------------------------------------------------ */
struct rbuf {
	const uint8_t *p;
	size_t len, at;
	int bad;		/* ran past the end */
};

static int get(struct rbuf *r, void *x, size_t n)
{
	if (r->bad || n > r->len - r->at) {
		r->bad = 1;
		memset(x, 0, n);
		return -1;
	}
	memcpy(x, r->p + r->at, n);
	r->at += n;
	return 0;
}

static uint32_t get_u32(struct rbuf *r)
{
	uint32_t v;

	get(r, &v, sizeof(v));
	return v;
}

static uint64_t get_u64(struct rbuf *r)
{
	uint64_t v;

	get(r, &v, sizeof(v));
	return v;
}

static int64_t get_i64(struct rbuf *r)
{
	int64_t v;

	get(r, &v, sizeof(v));
	return v;
}

/* n elements of `size` bytes into a new array; NULL (bad set) when they are
 * not all there. */
static void *get_array(struct rbuf *r, uint64_t n, size_t size)
{
	void *a;

	if (r->bad || (size && n > (r->len - r->at) / size)) {
		r->bad = 1;
		return NULL;
	}
	if (!(a = malloc(n && size ? n * size : 1))) {
		r->bad = 2;
		return NULL;
	}
	get(r, a, n * size);
	return a;
}

/* ---- what identifies a compatible session --------------------------------- */
static uint64_t model_print(const kvmem_session *s)
{
	return s->be->model->fingerprint;
}

static uint64_t tokens_hash(const int32_t *t, int64_t n)
{
	return XXH3_64bits(t, (size_t)n * sizeof(int32_t));
}

static void save_identity(struct wbuf *w, const kvmem_session *s)
{
	const kvmem_config *c = &s->cfg;
	const kvmem_session_opts *o = &s->o;
	char pol[POLICY_NAME] = { 0 };

	put_u32(w, c->n_layers);
	put_u32(w, c->n_heads);
	put_u32(w, c->n_kv_heads);
	put_u32(w, c->head_dim);
	put_u32(w, c->vocab);
	put_u64(w, kvmem_config_fingerprint(c));
	put_u64(w, model_print(s));
	put_u32(w, o->block);
	put_i64(w, o->budget);
	put_i64(w, o->sink);
	put_i64(w, o->recent);
	put_i64(w, o->reserve);
	put_u32(w, o->chunk);
	put_u32(w, o->query_tokens);
	snprintf(pol, sizeof(pol), "%s", o->policy);
	put(w, pol, sizeof(pol));
	put_u64(w, o->seed);
	/* Compact states keep version 1's bytes: older kvmems read them. */
	if (o->layout != KVMEM_LAYOUT_COMPACT)
		put_u32(w, (uint32_t)o->layout);
}

static const char *layout_name(uint32_t layout)
{
	return layout == KVMEM_LAYOUT_COMPACT ? "compact" :
	       layout == KVMEM_LAYOUT_STABLE ? "stable" : "unknown";
}

/* Append "name saved / here" to msg when they differ. */
static void differs(char *msg, size_t cap, const char *name, long long saved, long long here)
{
	size_t at = strlen(msg);

	if (saved != here && at + 1 < cap)
		snprintf(msg + at, cap - at, "%s%s %lld (this session: %lld)", at ? ", " : "",
			 name, saved, here);
}

/* The model and the options must be this session's (the layout too: it
 * decides the positions the next steps run at; a session that left it to
 * the default takes the saved one, into *layout_out). */
static int check_identity(struct rbuf *r, const kvmem_session *s, uint32_t version,
			  uint32_t *layout_out)
{
	const kvmem_config *c = &s->cfg;
	const kvmem_session_opts *o = &s->o;
	uint32_t L = get_u32(r), Hq = get_u32(r), Hkv = get_u32(r), D = get_u32(r);
	uint32_t V = get_u32(r);
	uint64_t cfp = get_u64(r), mfp = get_u64(r);
	char msg[512] = "", pol[POLICY_NAME];
	uint32_t block = get_u32(r);
	int64_t budget = get_i64(r), sink = get_i64(r), recent = get_i64(r), reserve = get_i64(r);
	uint32_t chunk = get_u32(r), qt = get_u32(r);
	uint64_t seed;
	uint32_t layout = KVMEM_LAYOUT_COMPACT;

	get(r, pol, sizeof(pol));
	seed = get_u64(r);
	if (version == STATE_VERSION_LAYOUT)
		layout = get_u32(r);
	if (r->bad)
		return kvmem_error(ESTALE, "session state: truncated");
	pol[POLICY_NAME - 1] = 0;
	if (L != (uint32_t)c->n_layers || Hq != (uint32_t)c->n_heads ||
	    Hkv != (uint32_t)c->n_kv_heads || D != (uint32_t)c->head_dim ||
	    V != (uint32_t)c->vocab || cfp != kvmem_config_fingerprint(c) || mfp != model_print(s))
		return kvmem_error(ESTALE, "session state: saved for another model (L=%u Hq=%u Hkv=%u D=%u "
				 "vocab=%u fingerprint %016llx), this one is L=%d Hq=%d Hkv=%d D=%d "
				 "vocab=%d fingerprint %016llx", L, Hq, Hkv, D, V,
				 (unsigned long long)(mfp ? mfp : cfp), c->n_layers, c->n_heads,
				 c->n_kv_heads, c->head_dim, c->vocab,
				 (unsigned long long)(model_print(s) ? model_print(s) :
						      kvmem_config_fingerprint(c)));
	differs(msg, sizeof(msg), "block", block, o->block);
	differs(msg, sizeof(msg), "budget", budget, o->budget);
	differs(msg, sizeof(msg), "sink", sink, o->sink);
	differs(msg, sizeof(msg), "recent", recent, o->recent);
	differs(msg, sizeof(msg), "reserve", reserve, o->reserve);
	differs(msg, sizeof(msg), "chunk", chunk, o->chunk);
	differs(msg, sizeof(msg), "query tokens", qt, o->query_tokens);
	if (strcmp(pol, o->policy)) {
		size_t at = strlen(msg);

		snprintf(msg + at, sizeof(msg) - at, "%spolicy %s (this session: %s)",
			 at ? ", " : "", pol, o->policy);
	}
	if (seed != o->seed) {
		size_t at = strlen(msg);

		snprintf(msg + at, sizeof(msg) - at, "%sseed %llu (this session: %llu)",
			 at ? ", " : "", (unsigned long long)seed, (unsigned long long)o->seed);
	}
	*layout_out = layout;
	if (layout != (uint32_t)o->layout && !s->layout_auto) {
		size_t at = strlen(msg);

		snprintf(msg + at, sizeof(msg) - at, "%slayout %s (this session: %s)",
			 at ? ", " : "", layout_name(layout), layout_name((uint32_t)o->layout));
	}
	if (*msg)
		return kvmem_error(ESTALE, "session state: saved with other options: %s", msg);
	return 0;
}

/* ---- save --------------------------------------------------------------- */
static void save_plan(struct wbuf *w, const kvmem_plan *p)
{
	size_t cells = (size_t)p->n_sets * p->n_view;

	put_u32(w, p->n_sets);
	put_u32(w, p->n_view);
	put_u32(w, p->left_stride);
	put_i64(w, p->n_tokens);
	put_i64(w, p->ws_blocks);
	put_i64(w, p->view_tokens);
	put_i64(w, p->reused);
	put_i64(w, p->entering);
	put_i64(w, p->born);
	put_i64(w, p->n_left_total);
	put_u32(w, p->n_pinned);
	put_u32(w, p->n_sink);
	put_u32(w, p->n_recent);
	put_u32(w, p->n_scored);
	put_u32(w, p->newest_dropped);
	if (!p->n_view)
		return;
	put(w, p->blocks, cells * sizeof(int64_t));
	put(w, p->start, cells * sizeof(int64_t));
	put(w, p->state, cells);
	for (int set = 0; set < p->n_sets; set++) {
		int nl = p->n_left ? p->n_left[set] : 0;

		put_u32(w, nl);
		put(w, p->left + (size_t)set * p->left_stride, (size_t)nl * sizeof(int64_t));
	}
}

int kvmem_session_save_state(const kvmem_session *s, void **buf, size_t *len)
{
	const size_t qw = (size_t)s->cfg.n_heads * s->cfg.head_dim;
	struct wbuf w = { 0 };
	uint64_t sum;

	*buf = NULL;
	*len = 0;
	/* The last step's rows first: the state holds the query ring, and a
	 * commit that follows must find every row written. */
	if (ws_writer_settle(s) || ws_writer_failed(s))
		return kvmem_fail();
	if (s->broken)
		return kvmem_error(ESTALE, "session state: the session is unusable after an earlier failure");
	/* Logits a batched step left on the backend are saved as any others
	 * (last_logits is only their host copy: nothing the caller sees). */
	if (ws_logits_host((kvmem_session *)s))
		return kvmem_fail();
	put_u32(&w, STATE_MAGIC);
	put_u32(&w, s->o.layout == KVMEM_LAYOUT_COMPACT ? STATE_VERSION : STATE_VERSION_LAYOUT);
	put_u64(&w, 0);		/* total bytes, filled in below */
	put_u64(&w, 0);		/* checksum */
	save_identity(&w, s);
	put_i64(&w, s->blocks.n_tokens);
	put_u64(&w, tokens_hash(s->tokens, s->blocks.n_tokens));
	put_i64(&w, s->sel_tokens);
	put_i64(&w, s->view_len);
	put_u32(&w, s->blocks.n_pins);
	for (int i = 0; i < s->blocks.n_pins; i++) {
		put_i64(&w, s->blocks.pins[i].start);
		put_i64(&w, s->blocks.pins[i].end);
	}
	save_plan(&w, &s->plan);
	/* The query ring, oldest first: [n_q] positions, [L][n_q][qw] rows. */
	put_u32(&w, s->n_q);
	for (int i = 0; i < s->n_q; i++)
		put(&w, &s->qpos[(s->q_head + i) % s->o.query_tokens], sizeof(int64_t));
	for (int l = 0; l < s->cfg.n_layers; l++)
		for (int i = 0; i < s->n_q; i++)
			put(&w, ws_qrow(s, l, (s->q_head + i) % s->o.query_tokens),
			    qw * sizeof(float));
	put_u32(&w, s->have_logits);
	if (s->have_logits)
		put(&w, s->last_logits, (size_t)s->cfg.vocab * sizeof(float));
	put_u64(&w, s->rng);
	put_i64(&w, s->st.forwards);
	put_i64(&w, s->st.selections);
	put_i64(&w, s->st.forced);
	put_i64(&w, s->st.rebuilt_tokens);
	put_i64(&w, s->st.kept_tokens);
	if (w.oom) {
		free(w.p);
		return kvmem_error(ENOMEM, "session state: out of memory");
	}
	memcpy(w.p + 8, &(uint64_t){ w.len }, 8);
	sum = XXH3_64bits(w.p + STATE_HEADER, w.len - STATE_HEADER);
	memcpy(w.p + 16, &sum, 8);
	*buf = w.p;
	*len = w.len;
	return 0;
}

/* ---- restore ------------------------------------------------------------ */
/* What a state holds beyond the identity, read and checked before the
 * session is touched. */
struct saved {
	int64_t n_tokens, sel_tokens, view_len;
	uint64_t tokens_hash;
	uint32_t n_pins;
	kvmem_span *pins;
	kvmem_plan plan;
	uint32_t n_q, have_logits;
	int64_t *qpos;
	float *qring, *logits;
	uint64_t rng;
	kvmem_session_stats st;
};

static void saved_free(struct saved *v)
{
	free(v->pins);
	kvmem_plan_free(&v->plan);
	free(v->qpos);
	free(v->qring);
	free(v->logits);
}

static int read_plan(struct rbuf *r, const kvmem_session *s, int64_t n, kvmem_plan *p)
{
	const int64_t max_blocks = (n + s->blocks.block - 1) / s->blocks.block;
	uint64_t cells;

	p->n_sets = (int)get_u32(r);
	p->n_view = (int)get_u32(r);
	p->left_stride = (int)get_u32(r);
	p->n_tokens = get_i64(r);
	p->ws_blocks = get_i64(r);
	p->view_tokens = get_i64(r);
	p->reused = get_i64(r);
	p->entering = get_i64(r);
	p->born = get_i64(r);
	p->n_left_total = get_i64(r);
	p->n_pinned = (int)get_u32(r);
	p->n_sink = (int)get_u32(r);
	p->n_recent = (int)get_u32(r);
	p->n_scored = (int)get_u32(r);
	p->newest_dropped = (int)get_u32(r);
	if (r->bad)
		return kvmem_error(ESTALE, "session state: truncated in the plan");
	if (!p->n_view)
		return 0;
	/* Bounds first: the arrays below are sized by these. */
	if (p->n_sets != s->n_sets || p->n_view < 0 || p->left_stride < 0 ||
	    p->ws_blocks > max_blocks || p->n_view > p->ws_blocks ||
	    p->left_stride > p->ws_blocks)
		return kvmem_error(ESTALE, "session state: a plan of %d sets of %d blocks (of %lld) does not fit "
				 "this session (%d sets)", p->n_sets, p->n_view,
				 (long long)p->ws_blocks, s->n_sets);
	cells = (uint64_t)p->n_sets * p->n_view;
	p->blocks = get_array(r, cells, sizeof(int64_t));
	p->start = get_array(r, cells, sizeof(int64_t));
	p->state = get_array(r, cells, 1);
	p->n_left = calloc((size_t)p->n_sets, sizeof(int));
	p->left = calloc((size_t)p->n_sets * (p->left_stride ? p->left_stride : 1),
			 sizeof(int64_t));
	if (!p->n_left || !p->left)
		r->bad = 2;
	for (int set = 0; set < p->n_sets && !r->bad; set++) {
		uint32_t nl = get_u32(r);

		if (nl > (uint32_t)p->left_stride) {
			r->bad = 1;
			break;
		}
		p->n_left[set] = (int)nl;
		get(r, p->left + (size_t)set * p->left_stride, (size_t)nl * sizeof(int64_t));
	}
	if (r->bad == 2)
		return kvmem_error(ENOMEM, "session state: out of memory");
	if (r->bad)
		return kvmem_error(ESTALE, "session state: truncated in the plan");
	return 0;
}

/* Set `set` of p tiles [0, view_tokens) (either layout): each block starts
 * at its own block-aligned slot, and one shorter than a block (the newest
 * when planned) ends the view. With the lengths summing to view_tokens,
 * the slots are then all taken. */
static int check_tiles(const kvmem_plan *p, int set, int64_t sel, int64_t B)
{
	const int64_t *b = p->blocks + (size_t)set * p->n_view;
	const int64_t *st = p->start + (size_t)set * p->n_view;
	const int64_t slots = (p->view_tokens + B - 1) / B;
	uint8_t *used = calloc((size_t)(slots ? slots : 1), 1);
	int rc = 0;

	if (!used)
		return kvmem_error(ENOMEM, "session state: out of memory");
	for (int i = 0; i < p->n_view && !rc; i++) {
		int64_t have = sel - b[i] * B, len = have < B ? have : B;

		if (st[i] < 0 || st[i] % B || st[i] + len > p->view_tokens || used[st[i] / B] ||
		    (len < B && st[i] + len != p->view_tokens))
			rc = kvmem_error(ESTALE, "session state: plan set %d, block %d at slot "
					 "%lld overlaps another or leaves a hole", set, i,
					 (long long)st[i]);
		else
			used[st[i] / B] = 1;
	}
	free(used);
	return rc;
}

/* The plan must lay out a view of this history: sets of blocks in
 * chronological order tiling the view's slots, as long as when planned. */
static int check_plan(const kvmem_session *s, const struct saved *v)
{
	const kvmem_plan *p = &v->plan;
	const int64_t B = s->blocks.block;

	if (v->sel_tokens < 0 || v->sel_tokens > v->n_tokens || v->view_len != p->view_tokens ||
	    v->view_len < 0 || v->view_len > s->budget)
		return kvmem_error(ESTALE, "session state: a view of %lld tokens planned at %lld of %lld tokens "
				 "does not fit (budget %lld)", (long long)v->view_len,
				 (long long)v->sel_tokens, (long long)v->n_tokens,
				 (long long)s->budget);
	if (v->view_len + (v->n_tokens - v->sel_tokens) > s->cap_limit)
		return kvmem_error(ESTALE, "session state: a view of %lld + a tail of %lld tokens passes the "
				 "limit %lld", (long long)v->view_len,
				 (long long)(v->n_tokens - v->sel_tokens), (long long)s->cap_limit);
	if (!p->n_view)
		return v->view_len ? kvmem_error(ESTALE, "session state: an empty plan with a view") : 0;
	if (p->n_tokens != v->sel_tokens || p->ws_blocks != (v->sel_tokens + B - 1) / B)
		return kvmem_error(ESTALE, "session state: the plan was made at %lld tokens, the view says %lld",
				 (long long)p->n_tokens, (long long)v->sel_tokens);
	for (int set = 0; set < p->n_sets; set++) {
		const int64_t *b = p->blocks + (size_t)set * p->n_view;
		int64_t at = 0;

		for (int i = 0; i < p->n_view; i++) {
			int64_t have = v->sel_tokens - b[i] * B;

			if (b[i] < 0 || b[i] >= p->ws_blocks || (i && b[i] <= b[i - 1]))
				return kvmem_error(ESTALE, "session state: plan set %d, block %d is out of order",
						 set, i);
			at += have < B ? have : B;
		}
		if (at != p->view_tokens)
			return kvmem_error(ESTALE, "session state: plan set %d holds %lld tokens, not %lld", set,
					 (long long)at, (long long)p->view_tokens);
		if (check_tiles(p, set, v->sel_tokens, B))
			return kvmem_fail();
	}
	return 0;
}

static int read_saved(struct rbuf *r, const kvmem_session *s, int64_t n, struct saved *v)
{
	const size_t qw = (size_t)s->cfg.n_heads * s->cfg.head_dim;

	v->n_tokens = get_i64(r);
	if (!r->bad && v->n_tokens != n)
		return kvmem_error(ESTALE, "session state: saved at %lld tokens, the history holds %lld",
				 (long long)v->n_tokens, (long long)n);
	v->tokens_hash = get_u64(r);
	v->sel_tokens = get_i64(r);
	v->view_len = get_i64(r);
	v->n_pins = get_u32(r);
	v->pins = get_array(r, (uint64_t)v->n_pins * 2, sizeof(int64_t));
	if (r->bad)
		return kvmem_error(r->bad == 2 ? ENOMEM : ESTALE, r->bad == 2 ? "session state: out of memory" :
				 "session state: truncated in the pins");
	if (read_plan(r, s, n, &v->plan))
		return kvmem_fail();
	v->n_q = get_u32(r);
	if (v->n_q > (uint32_t)s->o.query_tokens)
		return kvmem_error(ESTALE, "session state: %u query tokens, the session keeps %d", v->n_q,
				 s->o.query_tokens);
	v->qpos = get_array(r, v->n_q, sizeof(int64_t));
	v->qring = get_array(r, (uint64_t)s->cfg.n_layers * v->n_q * qw, sizeof(float));
	v->have_logits = get_u32(r);
	if (v->have_logits)
		v->logits = get_array(r, s->cfg.vocab, sizeof(float));
	v->rng = get_u64(r);
	v->st.forwards = get_i64(r);
	v->st.selections = get_i64(r);
	v->st.forced = get_i64(r);
	v->st.rebuilt_tokens = get_i64(r);
	v->st.kept_tokens = get_i64(r);
	if (r->bad)
		return kvmem_error(r->bad == 2 ? ENOMEM : ESTALE, r->bad == 2 ? "session state: out of memory" :
				 "session state: truncated");
	/* Counters come from a file: in range, or the session's own adds
	 * (forwards++, rebuilt_tokens += n) would overflow. */
	{
		static const char *const name[] = { "forwards", "selections", "forced",
						    "rebuilt tokens", "kept tokens" };
		const int64_t val[] = { v->st.forwards, v->st.selections, v->st.forced,
					v->st.rebuilt_tokens, v->st.kept_tokens };

		for (int i = 0; i < 5; i++)
			if (val[i] < 0 || val[i] > (INT64_C(1) << 62))
				return kvmem_error(ESTALE, "session state: counter of %s is %lld, outside "
						 "0..2^62: forged or corrupt", name[i],
						 (long long)val[i]);
	}
	if (r->at != r->len)
		return kvmem_error(ESTALE, "session state: %zu bytes past its end", r->len - r->at);
	return 0;
}

/* The rest must describe this history. */
static int check_saved(const kvmem_session *s, const struct saved *v, const int32_t *tokens,
		       int64_t n)
{
	if (v->tokens_hash != tokens_hash(tokens, n))
		return kvmem_error(ESTALE, "session state: saved for other token ids than the history's");
	for (uint32_t i = 0; i < v->n_pins; i++)
		if (v->pins[i].start < 0 || v->pins[i].end <= v->pins[i].start ||
		    (i && v->pins[i].start <= v->pins[i - 1].end))
			return kvmem_error(ESTALE, "session state: pin %u [%lld, %lld) is out of order", i,
					 (long long)v->pins[i].start, (long long)v->pins[i].end);
	for (uint32_t i = 0; i < v->n_q; i++)
		if (v->qpos[i] < 0 || v->qpos[i] >= n)
			return kvmem_error(ESTALE, "session state: query %u at position %lld of %lld", i,
					 (long long)v->qpos[i], (long long)n);
	if ((v->n_q && !v->n_tokens) || (v->have_logits && !n) || v->have_logits > 1)
		return kvmem_error(ESTALE, "session state: queries or logits without a history");
	return check_plan(s, v);
}

/* Header and checksum: a state at all, of a version read here (*version),
 * not torn. */
static int check_header(const void *state, size_t len, uint32_t *version_out)
{
	uint32_t magic, version;
	uint64_t total, sum;

	if (!state || len < STATE_HEADER)
		return kvmem_error(ESTALE, "session state: %zu bytes, too short to be one", len);
	memcpy(&magic, state, 4);
	memcpy(&version, (const uint8_t *)state + 4, 4);
	memcpy(&total, (const uint8_t *)state + 8, 8);
	memcpy(&sum, (const uint8_t *)state + 16, 8);
	if (magic != STATE_MAGIC)
		return kvmem_error(ESTALE, "session state: not a session state (magic %08x, want %08x)", magic,
				 STATE_MAGIC);
	if (version != STATE_VERSION && version != STATE_VERSION_LAYOUT)
		return kvmem_error(ESTALE, "session state: version %u, this kvmem reads "
				   "versions %u and %u", version, STATE_VERSION,
				   STATE_VERSION_LAYOUT);
	*version_out = version;
	if (total != len)
		return kvmem_error(ESTALE, "session state: says %llu bytes, %zu are there (torn)",
				 (unsigned long long)total, len);
	if (sum != XXH3_64bits((const uint8_t *)state + STATE_HEADER, len - STATE_HEADER))
		return kvmem_error(ESTALE, "session state: checksum mismatch (corrupt)");
	return 0;
}

int kvmem_session_adopt_state(kvmem_session *s, const int32_t *tokens, int64_t n,
			    const void *state, size_t len)
{
	struct rbuf r = { state, len, STATE_HEADER, 0 };
	struct saved v = { 0 };
	uint32_t version = 0, layout = 0;

	if (ws_adopt_check(s, tokens, n) || check_header(state, len, &version) ||
	    check_identity(&r, s, version, &layout) ||
	    read_saved(&r, s, n, &v) || check_saved(s, &v, tokens, n)) {
		saved_free(&v);
		return kvmem_fail();
	}
	s->o.layout = (int)layout;	/* this session's, or the default's choice of it */
	/* A released session takes the history's index in later, a group of
	 * blocks a kvmem_session_restore_view_step, before its layers. */
	if (s->released ? ws_adopt_history_begin(s, tokens, n) : ws_adopt_history(s, tokens, n))
		goto broken;
	s->blocks.n_pins = 0;	/* the saved pins, not any made before */
	for (uint32_t i = 0; i < v.n_pins; i++)
		if (kvmem_blocks_pin(&s->blocks, v.pins[i].start, v.pins[i].end))
			goto broken;
	kvmem_plan_free(&s->plan);
	s->plan = v.plan;
	memset(&v.plan, 0, sizeof(v.plan));
	s->sel_tokens = v.sel_tokens;
	s->view_len = v.view_len;
	s->n_q = (int)v.n_q;
	s->q_head = 0;
	memcpy(s->qpos, v.qpos, (size_t)v.n_q * sizeof(int64_t));
	for (int l = 0; l < s->cfg.n_layers; l++)
		for (uint32_t i = 0; i < v.n_q; i++)
			memcpy(ws_qrow(s, l, (int)i),
			       v.qring + ((size_t)l * v.n_q + i) * s->cfg.n_heads * s->cfg.head_dim,
			       (size_t)s->cfg.n_heads * s->cfg.head_dim * sizeof(float));
	s->have_logits = (int)v.have_logits;
	s->logits_dev = 0;
	if (v.have_logits)
		memcpy(s->last_logits, v.logits, (size_t)s->cfg.vocab * sizeof(float));
	s->rng = v.rng;
	/* The counters go on from the saved ones; the rebuild below is
	 * counted as rebuilt tokens. */
	s->st = v.st;
	saved_free(&v);
	/* A session whose view was given up before (a server reopening a
	 * conversation) keeps it so: kvmem_session_restore_view_step takes
	 * the index in and lays the view out, a part a call, where this
	 * would in one. */
	if (s->released)
		return 0;
	if (ws_view_restore(s)) {
		s->broken = 1;
		return kvmem_error_prefix("session: restoring the view");
	}
	return 0;
broken:
	s->broken = 1;
	saved_free(&v);
	return kvmem_fail();
}

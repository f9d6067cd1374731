// SPDX-License-Identifier: MIT
/*
 * Recording a session for the lab: the session's tap (kvmem_session_tap)
 * gives every selection's context, scores and plan; a wrapper of its page
 * source sees every page read, and the pager's counters around each read
 * say which tier served it. Records stream to the file as the session runs
 * (a selection's record is written once its view is in place); the header,
 * which holds the live options, is written last, over the zeros that keep
 * its place, so a trace cut short has no valid header and no end record.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "kvmem/kvmem.h"
#include "kvmem/lab.h"
#include "lab/trace.h"
#include "session/inspect.h"

enum { IDLE, SCORING, PLANNING };

struct runs {
	struct lab_run *v;
	size_t n, cap;
};

struct kvmem_lab_recorder {
	char path[4096];
	FILE *f;
	int err;			/* the first failure, -errno */
	kvmem_config cfg;
	uint64_t fingerprint;
	char label[64];
	kvmem_pager *pager;

	kvmem_session_tap tap;
	kvmem_page_source wrap, own;
	const kvmem_page_source *inner;
	kvmem_session_opts at_attach;	/* the options as given */
	kvmem_session_opts live;	/* resolved, from the first event */
	int have_live, attached, state_done;

	int phase;
	struct runs sel_runs, other;
	/* The selection being recorded (between scored and planned). */
	struct lab_select_head sh;
	int64_t *q_pos, *pins;
	float *q;
	size_t cap_q, cap_pos, cap_pins;
	/* select-ahead queries waiting for their selection */
	float *ahead_q;
	size_t cap_ahead;
	int ahead_n;
	int64_t ahead_pos0;

	uint64_t bytes, query_bytes;
	int64_t steps, spans, n_runs, reads, max_tokens;
};

uint64_t lab_record_checksum(uint32_t type, const void *payload, uint32_t bytes)
{
	return XXH3_64bits_withSeed(payload, bytes, (uint64_t)type << 32 | bytes);
}

uint64_t lab_header_checksum(const struct lab_header *h)
{
	return XXH3_64bits(h, offsetof(struct lab_header, checksum));
}

static void fail_io(kvmem_lab_recorder *r, const char *what)
{
	int e = errno ? errno : EIO;

	if (!r->err)
		r->err = kvmem_error(e == ENOSPC ? ENOSPC : EIO, "%s: %s: %s", r->path, what,
				     strerror(e));
}

/* One record: head, the payload's pieces, padding to 8 bytes. */
struct piece {
	const void *p;
	size_t n;
};

static void put_record(kvmem_lab_recorder *r, uint32_t type, const struct piece *pc, int n)
{
	static const char zeros[8];
	XXH3_state_t *st;
	struct lab_record_head h = { .type = type };
	size_t total = 0;

	if (r->err || !r->f)
		return;
	for (int i = 0; i < n; i++)
		total += pc[i].n;
	if (total >= LAB_RECORD_MAX) {
		r->err = kvmem_error(EINVAL, "%s: a record of %zu bytes is too large", r->path, total);
		return;
	}
	h.bytes = (uint32_t)total;
	if (!(st = XXH3_createState())) {
		r->err = kvmem_error(ENOMEM, "%s: out of memory", r->path);
		return;
	}
	XXH3_64bits_reset_withSeed(st, (uint64_t)type << 32 | h.bytes);
	for (int i = 0; i < n; i++)
		if (pc[i].n)
			XXH3_64bits_update(st, pc[i].p, pc[i].n);
	h.checksum = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	errno = 0;
	if (fwrite(&h, sizeof(h), 1, r->f) != 1)
		return fail_io(r, "writing a record");
	for (int i = 0; i < n; i++)
		if (pc[i].n && fwrite(pc[i].p, 1, pc[i].n, r->f) != pc[i].n)
			return fail_io(r, "writing a record");
	if (total % 8 && fwrite(zeros, 1, 8 - total % 8, r->f) != 8 - total % 8)
		return fail_io(r, "writing a record");
	r->bytes += sizeof(h) + (total + 7) / 8 * 8;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
	void *q;
	size_t c = *cap ? *cap : 16;

	if (need <= *cap)
		return 0;
	while (c < need)
		c *= 2;
	if (!(q = realloc(*p, c * elem)))
		return -ENOMEM;	/* the caller says what it was growing */
	*p = q;
	*cap = c;
	return 0;
}

static void add_run(kvmem_lab_recorder *r, struct runs *rs, int64_t b, int layer, int tier, int why)
{
	struct lab_run *last = rs->n ? &rs->v[rs->n - 1] : NULL;

	r->reads++;
	if (last && last->layer == layer && last->tier == tier && last->why == why &&
	    (int64_t)last->block + last->count == b && last->count < UINT32_MAX) {
		last->count++;
		return;
	}
	if (grow((void **)&rs->v, &rs->cap, rs->n + 1, sizeof(*rs->v))) {
		if (!r->err)
			r->err = kvmem_error(ENOMEM, "%s: out of memory for page reads", r->path);
		return;
	}
	rs->v[rs->n++] = (struct lab_run){ .block = (uint32_t)b, .count = 1, .layer = (uint16_t)layer,
					   .tier = (uint8_t)tier, .why = (uint8_t)why };
}

static void flush_other(kvmem_lab_recorder *r)
{
	uint32_t n = (uint32_t)r->other.n, zero = 0;
	struct piece pc[] = { { &n, 4 }, { &zero, 4 }, { r->other.v, r->other.n * sizeof(struct lab_run) } };

	if (!r->other.n)
		return;
	put_record(r, LAB_REC_READS, pc, 3);
	r->n_runs += r->other.n;
	r->other.n = 0;
}

/* ---- the page source wrapper ---------------------------------------------- */
static int w_write(void *ctx, int64_t b, int l, int t0, int n, const float *k, const float *v)
{
	kvmem_lab_recorder *r = ctx;

	return r->inner->ops->write(r->inner->ctx, b, l, t0, n, k, v);
}

static int w_get(void *ctx, int64_t b, int l, kvmem_page *pg)
{
	kvmem_lab_recorder *r = ctx;
	kvmem_pager_stats a, z;
	int rc, tier = KVMEM_LAB_MEM;

	if (r->pager)
		kvmem_pager_stats_get(r->pager, &a);
	if ((rc = r->inner->ops->get(r->inner->ctx, b, l, pg)))
		return rc;
	if (r->pager) {
		kvmem_pager_stats_get(r->pager, &z);
		if (z.host_hits > a.host_hits)
			tier = KVMEM_LAB_HOST;
		else if (z.staging_hits > a.staging_hits)
			tier = KVMEM_LAB_STAGE;
		else if (z.host_misses > a.host_misses)
			tier = KVMEM_LAB_NVME;
	}
	if (r->phase == SCORING)
		add_run(r, &r->sel_runs, b, l, tier, KVMEM_LAB_SCORE);
	else if (r->phase == PLANNING)
		add_run(r, &r->sel_runs, b, l, tier, KVMEM_LAB_VIEW);
	else
		add_run(r, &r->other, b, l, tier, KVMEM_LAB_OTHER);
	return 0;
}

static void w_put(void *ctx, int64_t b, int l)
{
	kvmem_lab_recorder *r = ctx;

	r->inner->ops->put(r->inner->ctx, b, l);
}

static void w_prefetch(void *ctx, const int64_t *blocks, int n)
{
	kvmem_lab_recorder *r = ctx;

	if (r->inner->ops->prefetch)
		r->inner->ops->prefetch(r->inner->ctx, blocks, n);
}

static void w_hint(void *ctx, const int64_t *blocks, const float *scores, int n)
{
	kvmem_lab_recorder *r = ctx;

	if (r->inner->ops->hint)
		r->inner->ops->hint(r->inner->ctx, blocks, scores, n);
}

static int w_sync(void *ctx, int64_t n_tokens)
{
	kvmem_lab_recorder *r = ctx;

	return r->inner->ops->sync ? r->inner->ops->sync(r->inner->ctx, n_tokens) : 0;
}

static int w_region(void *ctx, void **base, size_t *len)
{
	kvmem_lab_recorder *r = ctx;

	return r->inner->ops->region ? r->inner->ops->region(r->inner->ctx, base, len) : -ENOENT;
}

/* The recorder owns neither source: kvmem_lab_record_close frees its own. */
static void w_destroy(void *ctx)
{
	(void)ctx;
}

static const kvmem_page_source_ops wrap_ops = {
	.name = "lab", .write = w_write, .get = w_get, .put = w_put, .prefetch = w_prefetch,
	.hint = w_hint, .sync = w_sync, .destroy = w_destroy, .region = w_region,
};

/* ---- the tap ------------------------------------------------------------- */
static void take_live(kvmem_lab_recorder *r, const struct kvmem_session *s)
{
	if (r->have_live)
		return;
	r->live = *kvmem_session_options(s);
	r->have_live = 1;
}

/* The plan in force before the first recorded selection (a restored
 * session state), so a replay diffs the first plan as the session did. */
static void put_state(kvmem_lab_recorder *r, const struct kvmem_session *s)
{
	const kvmem_plan *p = kvmem_session_plan(s);
	struct lab_state_head sh;
	uint32_t *b;
	size_t n;

	r->state_done = 1;
	n = p->blocks ? (size_t)p->n_sets * p->n_view : 0;
	if (!(b = malloc((n ? n : 1) * sizeof(*b)))) {
		if (!r->err)
			r->err = kvmem_error(ENOMEM, "%s: out of memory", r->path);
		return;
	}
	for (size_t i = 0; i < n; i++)
		b[i] = (uint32_t)p->blocks[i];
	/* The tail is every token since the last selection: view_len - view_tokens. */
	sh = (struct lab_state_head){
		.n_tokens = kvmem_session_tokens(s),
		.sel_tokens = kvmem_session_tokens(s) - (kvmem_session_view_len(s) - p->view_tokens),
		.plan_tokens = p->n_tokens, .view_tokens = p->view_tokens,
		.block = (uint32_t)kvmem_session_blocks(s)->block,
		.n_sets = (uint32_t)(p->n_sets ? p->n_sets : 1), .n_view = (uint32_t)(n ? p->n_view : 0) };
	{
		struct piece pc[] = { { &sh, sizeof(sh) }, { b, n * sizeof(*b) } };

		put_record(r, LAB_REC_STATE, pc, 2);
	}
	free(b);
}

/* A selection that failed before its plan: its reads stay (with their
 * reasons), its record does not. */
static void abandon(kvmem_lab_recorder *r)
{
	if (r->phase == IDLE)
		return;
	if (grow((void **)&r->other.v, &r->other.cap, r->other.n + r->sel_runs.n,
		 sizeof(struct lab_run)) == 0) {
		memcpy(r->other.v + r->other.n, r->sel_runs.v, r->sel_runs.n * sizeof(struct lab_run));
		r->other.n += r->sel_runs.n;
	} else if (!r->err) {
		r->err = kvmem_error(ENOMEM, "%s: out of memory for page reads", r->path);
	}
	r->sel_runs.n = 0;
	r->phase = IDLE;
}

static void t_begin(void *arg, const struct kvmem_session *s)
{
	kvmem_lab_recorder *r = arg;

	take_live(r, s);
	if (!r->state_done)
		put_state(r, s);
	abandon(r);
	flush_other(r);
	r->phase = SCORING;
}

static void t_ahead(void *arg, const struct kvmem_session *s, const float *q, int n, int64_t pos0)
{
	kvmem_lab_recorder *r = arg;
	const size_t per = (size_t)r->cfg.n_heads * r->cfg.head_dim;
	size_t need = (size_t)r->cfg.n_layers * n * per;

	take_live(r, s);
	r->ahead_n = 0;
	if (grow((void **)&r->ahead_q, &r->cap_ahead, need, sizeof(float))) {
		if (!r->err)
			r->err = kvmem_error(ENOMEM, "%s: out of memory for queries", r->path);
		return;
	}
	memcpy(r->ahead_q, q, need * sizeof(float));
	r->ahead_n = n;
	r->ahead_pos0 = pos0;
}

/* The ahead queries are the selection's when its last n_q are the ctx's. */
static int ahead_matches(const kvmem_lab_recorder *r, const kvmem_select_ctx *c)
{
	const size_t per = (size_t)c->n_heads * c->head_dim;
	const int n = r->ahead_n;

	if (!n || c->n_q <= 0 || c->n_q > n)
		return 0;
	for (int i = 0; i < c->n_q; i++)
		if (c->q_pos[i] != r->ahead_pos0 + n - c->n_q + i)
			return 0;
	for (int l = 0; l < c->n_layers; l++)
		if (memcmp(r->ahead_q + ((size_t)l * n + (n - c->n_q)) * per,
			   c->q + (size_t)l * c->n_q * per, c->n_q * per * sizeof(float)))
			return 0;
	return 1;
}

static void t_scored(void *arg, const struct kvmem_session *s, const kvmem_select_ctx *c,
		     const float *scores, int forced)
{
	kvmem_lab_recorder *r = arg;
	const kvmem_session_opts *o = kvmem_session_options(s);
	const kvmem_blocks *bl = kvmem_session_blocks(s);
	const size_t per = (size_t)c->n_heads * c->head_dim;
	int ahead = ahead_matches(r, c);
	int n_store = ahead ? r->ahead_n : c->n_q;
	size_t nq = (size_t)c->n_layers * n_store * per;

	(void)scores;
	r->phase = PLANNING;
	r->sh = (struct lab_select_head){
		.step = c->step, .n_tokens = c->n_tokens, .budget = c->budget, .sink = o->sink,
		.recent = o->recent, .reserve = o->reserve, .span = c->span, .seed = c->seed,
		.block = (uint32_t)c->block, .forced = (uint32_t)forced, .n_q = (uint32_t)c->n_q,
		.n_store = (uint32_t)n_store, .n_pins = (uint32_t)bl->n_pins,
	};
	if (grow((void **)&r->q, &r->cap_q, nq ? nq : 1, sizeof(float)) ||
	    grow((void **)&r->q_pos, &r->cap_pos, n_store ? n_store : 1, sizeof(int64_t)) ||
	    grow((void **)&r->pins, &r->cap_pins, 2 * (bl->n_pins ? bl->n_pins : 1), sizeof(int64_t))) {
		if (!r->err)
			r->err = kvmem_error(ENOMEM, "%s: out of memory for a selection", r->path);
		return;
	}
	if (ahead) {
		memcpy(r->q, r->ahead_q, nq * sizeof(float));
		for (int i = 0; i < n_store; i++)
			r->q_pos[i] = r->ahead_pos0 + i;
	} else {
		if (nq)
			memcpy(r->q, c->q, nq * sizeof(float));
		if (n_store)
			memcpy(r->q_pos, c->q_pos, n_store * sizeof(int64_t));
	}
	for (int i = 0; i < bl->n_pins; i++) {
		r->pins[2 * i] = bl->pins[i].start;
		r->pins[2 * i + 1] = bl->pins[i].end;
	}
}

static void t_planned(void *arg, const struct kvmem_session *s, const kvmem_plan *p, int forced)
{
	kvmem_lab_recorder *r = arg;
	size_t n = (size_t)p->n_sets * p->n_view, nq;
	uint32_t *b = malloc((n ? n : 1) * sizeof(*b));

	(void)s;
	(void)forced;
	if (!b) {
		if (!r->err)
			r->err = kvmem_error(ENOMEM, "%s: out of memory", r->path);
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		b[i] = (uint32_t)p->blocks[i];
	r->sh.n_sets = (uint32_t)p->n_sets;
	r->sh.n_view = (uint32_t)p->n_view;
	r->sh.n_runs = (uint32_t)r->sel_runs.n;
	nq = (size_t)r->cfg.n_layers * r->sh.n_store * r->cfg.n_heads * r->cfg.head_dim;
	{
		struct piece pc[] = {
			{ &r->sh, sizeof(r->sh) },
			{ r->q_pos, r->sh.n_store * sizeof(int64_t) },
			{ r->pins, 2 * r->sh.n_pins * sizeof(int64_t) },
			{ r->q, nq * sizeof(float) },
			{ b, n * sizeof(*b) },
			{ r->sel_runs.v, r->sel_runs.n * sizeof(struct lab_run) },
		};

		put_record(r, LAB_REC_SELECT, pc, 6);
	}
	r->query_bytes += nq * sizeof(float);
	r->n_runs += r->sel_runs.n;
	r->steps++;
	if (r->sh.n_tokens > r->max_tokens)
		r->max_tokens = r->sh.n_tokens;
	free(b);
out:
	r->sel_runs.n = 0;
	r->ahead_n = 0;
	r->phase = IDLE;
}

/* ---- the API --------------------------------------------------------------- */
int kvmem_lab_record_open(const char *path, const kvmem_model *m, const kvmem_lab_record_opts *o,
			  kvmem_lab_recorder **out)
{
	static const char zeros[LAB_HEADER_BYTES];
	kvmem_lab_recorder *r;

	*out = NULL;
	if (!path || !m)
		return kvmem_error(EINVAL, "lab: a trace needs a path and a model");
	if (strlen(path) >= sizeof(r->path))
		return kvmem_error(EINVAL, "lab: trace path too long");
	if (!(r = calloc(1, sizeof(*r))))
		return kvmem_error(ENOMEM, "%s: out of memory", path);
	snprintf(r->path, sizeof(r->path), "%s", path);
	r->cfg = m->cfg;
	r->fingerprint = m->fingerprint ? m->fingerprint : kvmem_config_fingerprint(&m->cfg);
	if (o && o->label)
		snprintf(r->label, sizeof(r->label), "%s", o->label);
	r->pager = o ? o->pager : NULL;
	if (!(r->f = fopen(path, "wb"))) {
		int rc = kvmem_error(errno == ENOENT ? ENOENT : EIO, "%s: cannot create the trace: %s",
				     path, strerror(errno));

		free(r);
		return rc;
	}
	/* The header's place; its bytes come at close. */
	if (fwrite(zeros, 1, sizeof(zeros), r->f) != sizeof(zeros)) {
		fail_io(r, "writing the header");
		int rc = r->err;

		fclose(r->f);
		free(r);
		return rc;
	}
	r->bytes = LAB_HEADER_BYTES;
	r->tap = (kvmem_session_tap){ .begin = t_begin, .scored = t_scored, .planned = t_planned,
				      .ahead = t_ahead, .arg = r };
	*out = r;
	return 0;
}

int kvmem_lab_record_attach(kvmem_lab_recorder *r, kvmem_session_opts *o)
{
	if (r->attached)
		return kvmem_error(EINVAL, "%s: the recorder is attached to a session already", r->path);
	if (o->tap)
		return kvmem_error(EINVAL, "%s: the session options carry another tap", r->path);
	if (!o->source) {
		int rc = kvmem_page_source_mem(&r->own, r->cfg.n_layers, r->cfg.n_kv_heads,
					       r->cfg.head_dim, o->block ? o->block : KVMEM_BLOCK_DEFAULT);

		if (rc)
			return rc;
		r->inner = &r->own;
	} else {
		r->inner = o->source;
	}
	r->wrap = (kvmem_page_source){ &wrap_ops, r };
	r->at_attach = *o;
	o->source = &r->wrap;
	o->tap = &r->tap;
	r->attached = 1;
	return 0;
}

int kvmem_lab_record_span(kvmem_lab_recorder *r, int kind, int64_t start, int64_t end,
			  const char *label)
{
	struct lab_span_head h;
	size_t len = label ? strlen(label) : 0;

	if ((kind != KVMEM_LAB_SPAN_NEEDLE && kind != KVMEM_LAB_SPAN_QUERY) || start < 0 || end <= start)
		return kvmem_error(EINVAL, "%s: bad span [%lld, %lld) of kind %d", r->path,
				   (long long)start, (long long)end, kind);
	if (len > 255)
		len = 255;
	h = (struct lab_span_head){ .kind = (uint32_t)kind, .label_len = (uint32_t)len,
				    .start = start, .end = end };
	{
		struct piece pc[] = { { &h, sizeof(h) }, { label, len } };

		put_record(r, LAB_REC_SPAN, pc, 2);
	}
	r->spans++;
	return r->err;
}

uint64_t kvmem_lab_record_bytes(const kvmem_lab_recorder *r)
{
	return r->bytes;
}

int64_t kvmem_lab_record_steps(const kvmem_lab_recorder *r)
{
	return r->steps;
}

static void fill_header(const kvmem_lab_recorder *r, struct lab_header *h)
{
	const kvmem_session_opts *o = r->have_live ? &r->live : &r->at_attach;
	const kvmem_config *c = &r->cfg;

	memset(h, 0, sizeof(*h));
	memcpy(h->magic, LAB_MAGIC, 8);
	h->version = KVMEM_LAB_TRACE_VERSION;
	h->header_bytes = LAB_HEADER_BYTES;
	h->fingerprint = r->fingerprint;
	h->n_layers = (uint32_t)c->n_layers;
	h->n_heads = (uint32_t)c->n_heads;
	h->n_kv_heads = (uint32_t)c->n_kv_heads;
	h->head_dim = (uint32_t)c->head_dim;
	h->vocab = (uint32_t)c->vocab;
	h->window = (uint32_t)c->max_position;
	h->rope_theta = c->rope_theta;
	h->block = (uint32_t)(o->block ? o->block : KVMEM_BLOCK_DEFAULT);
	h->chunk = (uint32_t)o->chunk;
	h->query_tokens = (uint32_t)o->query_tokens;
	h->budget = o->budget;
	h->sink = o->sink;
	h->recent = o->recent;
	h->reserve = o->reserve;
	h->seed = o->seed;
	snprintf(h->policy, sizeof(h->policy), "%s", o->policy ? o->policy : "meank");
	memcpy(h->label, r->label, sizeof(h->label));
	h->checksum = lab_header_checksum(h);
}

int kvmem_lab_record_close(kvmem_lab_recorder *r)
{
	struct lab_header h;
	struct lab_end e;
	int rc;

	if (!r)
		return 0;
	abandon(r);	/* a selection cut short */
	flush_other(r);
	e = (struct lab_end){ .steps = r->steps, .spans = r->spans, .runs = r->n_runs,
			      .reads = r->reads, .bytes = r->bytes, .query_bytes = r->query_bytes,
			      .max_tokens = r->max_tokens };
	{
		struct piece pc[] = { { &e, sizeof(e) } };

		put_record(r, LAB_REC_END, pc, 1);
	}
	fill_header(r, &h);
	errno = 0;
	if (!r->err && (fflush(r->f) || pwrite(fileno(r->f), &h, sizeof(h), 0) != (ssize_t)sizeof(h) ||
			fsync(fileno(r->f))))
		fail_io(r, "finishing the trace");
	if (fclose(r->f) && !r->err)
		fail_io(r, "closing the trace");
	rc = r->err;
	if (r->own.ops)
		kvmem_page_source_destroy(&r->own);
	free(r->sel_runs.v);
	free(r->other.v);
	free(r->q);
	free(r->q_pos);
	free(r->pins);
	free(r->ahead_q);
	free(r);
	return rc;
}

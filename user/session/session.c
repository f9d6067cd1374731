// SPDX-License-Identifier: MIT
/*
 * Agent sessions on the engine: append (chunked prefill), select at the
 * step boundary, decode with the view frozen. Every token run goes to the
 * history (token ids, raw K / V pages, the index) as soon as the engine
 * returns it. When the tail would outgrow budget + reserve, the session
 * selects again with the latest queries and goes on.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "session/session_int.h"
#include "util/grow.h"

#define CHUNK_DEFAULT 128
#define QUERY_TOKENS_DEFAULT 4
#define UNLIMITED ((int64_t)INT_MAX / 2)

void kvmem_session_opts_default(kvmem_session_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->sink = -1;
	o->recent = -1;
	o->reserve = -1;
}

static int64_t round_up(int64_t x, int64_t m)
{
	return (x + m - 1) / m * m;
}

/* The view layout: the option, else KVMEM_LAYOUT (compact or stable; a
 * measurement's switch for programs that have no flag), else stable, which
 * moves a fraction of compact's tokens a step (a follow-up at 8B: 20-22 ms
 * against 43-49 on the H200) at the same recall. Left to the default, a
 * session that adopts a saved state takes the layout it was saved with
 * (state.c): sessions saved compact before stable was the default reopen. */
static int resolve_layout(kvmem_session *s, kvmem_session_opts *o)
{
	const char *e = getenv("KVMEM_LAYOUT");

	s->layout_auto = 0;
	if (o->layout == KVMEM_LAYOUT_DEFAULT) {
		s->layout_auto = !e || !*e;
		if (!e || !*e)
			o->layout = KVMEM_LAYOUT_STABLE;
		else if (!strcmp(e, "compact"))
			o->layout = KVMEM_LAYOUT_COMPACT;
		else if (!strcmp(e, "stable"))
			o->layout = KVMEM_LAYOUT_STABLE;
		else
			return kvmem_error(EINVAL, "session: KVMEM_LAYOUT=%s is not a layout "
					   "(compact or stable)", e);
	}
	if (o->layout != KVMEM_LAYOUT_COMPACT && o->layout != KVMEM_LAYOUT_STABLE)
		return kvmem_error(EINVAL, "session: layout %d is not a layout "
				   "(KVMEM_LAYOUT_COMPACT or KVMEM_LAYOUT_STABLE)", o->layout);
	return 0;
}

/* Fill in defaults and check the options against each other. */
static int resolve(kvmem_session *s, const kvmem_session_opts *in)
{
	kvmem_session_opts *o = &s->o;

	*o = *in;
	if (resolve_layout(s, o))
		return kvmem_fail();
	if (!o->block)
		o->block = KVMEM_BLOCK_DEFAULT;
	if (!o->chunk)
		o->chunk = CHUNK_DEFAULT;
	if (!o->query_tokens)
		o->query_tokens = QUERY_TOKENS_DEFAULT;
	if (o->chunk < 0 || o->query_tokens < 0 || o->budget < 0)
		return kvmem_error(EINVAL, "session: chunk %d, query tokens %d and budget %lld must not be negative",
				 o->chunk, o->query_tokens, (long long)o->budget);
	if (o->budget && o->budget < o->block)
		return kvmem_error(EINVAL, "session: budget %lld is smaller than one block (%d tokens)",
				 (long long)o->budget, o->block);
	if (!o->budget) {
		/* Unlimited: the view is always the whole history. */
		s->budget = UNLIMITED;
		o->sink = o->sink < 0 ? 0 : o->sink;
		o->recent = o->recent < 0 ? 0 : o->recent;
		o->reserve = o->reserve < 0 ? 0 : o->reserve;
		s->cap_limit = UNLIMITED;
		return 0;
	}
	s->budget = o->budget;
	if (o->sink < 0)
		o->sink = o->budget / 100 > 1 ? o->budget / 100 : 1;
	if (o->recent < 0)
		o->recent = o->budget / 12 > 1 ? o->budget / 12 : 1;
	if (o->reserve < 0) {
		o->reserve = round_up(o->budget / 8, o->block);
		if (o->reserve < o->chunk)
			o->reserve = o->chunk;
	}
	if (o->reserve < o->chunk)
		return kvmem_error(EINVAL, "session: a reserve of %lld tail slots cannot take a chunk of %d tokens",
				 (long long)o->reserve, o->chunk);
	if (o->budget > UNLIMITED - o->reserve)
		return kvmem_error(EINVAL, "session: budget %lld + reserve %lld is too large",
				 (long long)o->budget, (long long)o->reserve);
	s->cap_limit = o->budget + o->reserve;
	return 0;
}

/* Bytes of one forward pass's raw K (or V) rows. */
static size_t rows_bytes(const kvmem_session *s)
{
	const kvmem_config *c = &s->cfg;

	return (size_t)c->n_layers * s->o.chunk * c->n_kv_heads * c->head_dim *
	       (s->rows_dtype == KVMEM_DTYPE_BF16 ? 2 : 4);
}

void *ws_rows_alloc(kvmem_session *s)
{
	void *p = NULL;

	if (s->rows_dtype != KVMEM_DTYPE_BF16)
		return malloc(rows_bytes(s));
	return s->be->ops->host_alloc(s->be->ctx, rows_bytes(s), &p) < 0 ? NULL : p;
}

void ws_rows_free(kvmem_session *s, void *p)
{
	if (s->rows_dtype != KVMEM_DTYPE_BF16)
		free(p);
	else if (p)
		s->be->ops->host_free(s->be->ctx, p);
}

/*
 * Rows of queries a forward pass brings back per layer: the last
 * query_tokens (all the selection reads; ws_fwd_out's q_last), so the
 * buffer holds that many, not a chunk's. A chunk's worth at the 8B
 * geometry is 590 KB a token in fp32 (36 layers x 32 heads x 128): 75 MB
 * at 128 tokens, 302 MB at 512, and again for the writer's second set.
 * Only the rows written become resident (malloc'd, not pinned), so an
 * append cost the few it wrote; kvmem_session_select_ahead wrote all n of
 * its tokens' rows, and now writes the last query_tokens too unless a tap
 * wants them all (a buffer of its own, for that call).
 */
float *ws_q_alloc(const kvmem_session *s)
{
	const size_t rows = s->o.query_tokens < s->o.chunk ? s->o.query_tokens : s->o.chunk;

	return malloc(sizeof(float) * s->cfg.n_layers * rows * s->cfg.n_heads * s->cfg.head_dim);
}

kvmem_fwd_out ws_fwd_out(const kvmem_session *s, int q_last)
{
	kvmem_fwd_out o = { .q_raw = s->q_raw, .q_last = q_last };

	if (s->rows_dtype == KVMEM_DTYPE_BF16) {
		o.raw_k_bf16 = s->raw_k;
		o.v_bf16 = s->v;
	} else {
		o.raw_k = s->raw_k;
		o.v = s->v;
	}
	return o;
}

int ws_scratch_alloc(kvmem_session *s)
{
	if (!s->raw_k)
		s->raw_k = ws_rows_alloc(s);
	if (!s->v)
		s->v = ws_rows_alloc(s);
	if (!s->q_raw)
		s->q_raw = ws_q_alloc(s);
	if (!s->raw_k || !s->v || !s->q_raw)
		return kvmem_error(ENOMEM, "session: out of memory for chunks of %d tokens", s->o.chunk);
	return 0;
}

void ws_scratch_free(kvmem_session *s)
{
	ws_rows_free(s, s->raw_k);
	ws_rows_free(s, s->v);
	free(s->q_raw);
	s->raw_k = s->v = NULL;
	s->q_raw = NULL;
}

static int alloc_buffers(kvmem_session *s)
{
	const kvmem_config *c = &s->cfg;
	size_t C = s->o.chunk, T = s->o.query_tokens;
	size_t kw = (size_t)c->n_kv_heads * c->head_dim, qw = (size_t)c->n_heads * c->head_dim;

	/* A backend whose rows are bf16 and can pin memory for them hands
	 * them over as they are (its host_alloc); else fp32. */
	s->rows_dtype = s->be->ops->rows_dtype == KVMEM_DTYPE_BF16 && s->be->ops->host_alloc ?
			KVMEM_DTYPE_BF16 : KVMEM_DTYPE_F32;
	if (ws_scratch_alloc(s))
		return kvmem_fail();
	s->rows_f32 = malloc(sizeof(float) * 2 * (size_t)s->o.block * kw);
	s->logits = malloc(sizeof(float) * (s->o.all_logits ? C : 1) * c->vocab);
	s->last_logits = malloc(sizeof(float) * c->vocab);
	s->qring = malloc(sizeof(float) * c->n_layers * T * qw);
	s->qtmp = malloc(sizeof(float) * c->n_layers * T * qw);
	s->qpos = malloc(sizeof(int64_t) * T);
	s->qpos_packed = malloc(sizeof(int64_t) * T);
	s->page_f32 = malloc(sizeof(float) * (size_t)s->o.block * kw);
	if (!s->raw_k || !s->v || !s->rows_f32 || !s->q_raw || !s->logits || !s->last_logits || !s->qring ||
	    !s->qtmp || !s->qpos || !s->qpos_packed || !s->page_f32)
		return kvmem_error(ENOMEM, "session: out of memory for chunks of %zu tokens", C);
	return 0;
}

kvmem_session *kvmem_session_create(kvmem_backend *b, const kvmem_session_opts *o)
{
	kvmem_session_opts def;
	kvmem_session *s = calloc(1, sizeof(*s));

	if (!s) {
		kvmem_error(ENOMEM, "session: out of memory");
		return NULL;
	}
	if (!o) {
		kvmem_session_opts_default(&def);
		o = &def;
	}
	s->be = b;
	s->cfg = b->model->cfg;
	s->owner = ws_new_owner();
	if (resolve(s, o) || !(s->pol = kvmem_policy_find(o->policy)))
		goto fail;
	if (b->ops->view_create(b->ctx, &s->view))
		goto fail;
	/* Raw K beside the view, so a selection moves what stays in it on the
	 * backend instead of reading its pages again (view.c). A backend that
	 * cannot keep it (no op, no memory) places from pages as before;
	 * KVMEM_MOVE=0 asks for that (a measurement's peer). */
	{
		const char *e = getenv("KVMEM_MOVE");

		s->move_ok = b->ops->keep_raw && b->ops->move && !(e && !strcmp(e, "0")) &&
			     b->ops->keep_raw(b->ctx, s->view) == 0;
		/* A prefill's pages written by the backend (ask_pages), unless
		 * KVMEM_PAGE_ROWS=0 (a measurement's peer: rows copied on the host). */
		e = getenv("KVMEM_PAGE_ROWS");
		s->pages_off = e && !strcmp(e, "0");
		/* The index summed by the backend (ask_index) unless
		 * KVMEM_DEVICE_INDEX=0 (the peer: the host sums raw K). */
		e = getenv("KVMEM_DEVICE_INDEX");
		s->dev_index = e && !strcmp(e, "0") ? -1 : 0;
	}
	s->o.policy = s->pol->name;
	s->n_sets = s->pol->per_layer ? s->cfg.n_layers : 1;
	s->rng = kvmem_rng_seed(s->o.seed);
	if (kvmem_blocks_init(&s->blocks, s->o.block) ||
	    kvmem_index_init(&s->index, s->cfg.n_layers, s->cfg.n_kv_heads, s->cfg.head_dim,
			   s->o.block, s->pol->needs) ||
	    alloc_buffers(s))
		goto fail;
	if (s->o.chunk > b->opts.max_chunk) {
		kvmem_error(EINVAL, "session: chunk %d is larger than the %s backend's %d", s->o.chunk,
			    b->ops->name, b->opts.max_chunk);
		goto fail;
	}
	if (s->o.source) {
		s->src = s->o.source;
	} else {
		/* In the rows' own dtype: a bf16 backend's history in bf16
		 * pages, the same values in half the host memory. */
		if (kvmem_page_source_mem_dtype(&s->own_src, s->cfg.n_layers, s->cfg.n_kv_heads,
						s->cfg.head_dim, s->o.block, s->rows_dtype))
			goto fail;
		s->src = &s->own_src;
	}
	return s;
fail:
	kvmem_error_prefix("kvmem_session_create");
	kvmem_session_free(s);
	return NULL;
}

void kvmem_session_free(kvmem_session *s)
{
	if (!s)
		return;
	ws_writer_free(s);
	ws_unregister(s);
	kvmem_page_source_destroy(&s->own_src);
	kvmem_blocks_free(&s->blocks);
	if (s->mirror)	/* before the index: it may hold the index's memory */
		s->be->ops->mirror_destroy(s->be->ctx, s->mirror);
	kvmem_index_free(&s->index);
	kvmem_plan_free(&s->plan);
	kvmem_plan_free(&s->step_plan);
	ws_adopt_history_free(s);
	if (s->view)
		s->be->ops->view_destroy(s->be->ctx, s->view);
	free(s->tokens);
	ws_scratch_free(s);
	free(s->rows_f32);
	free(s->logits);
	free(s->last_logits);
	free(s->qring);
	free(s->qtmp);
	free(s->qpos);
	free(s->qpos_packed);
	free(s->scores);
	free(s->items);
	free(s->moves);
	free(s->page_f32);
	free(s->pages);
	ws_ix_free(s, s->ixw);
	free(s);
}

/* Keep the raw queries of the last query_tokens tokens in the ring. The
 * forward pass over tokens [p0, p0 + n) returned those of the last `rows`
 * ([L][rows][qw] in q; rows >= the ones kept). A decode step writes one
 * row a layer: nothing older moves. */
static void keep_queries(kvmem_session *s, const float *q, int64_t p0, int n, int rows)
{
	const int T = s->o.query_tokens, L = s->cfg.n_layers;
	const size_t qw = (size_t)s->cfg.n_heads * s->cfg.head_dim;
	const int from_new = n < T ? n : T;
	const int64_t first = p0 + n - from_new;	/* the first new one kept */

	for (int i = 0; i < from_new; i++) {
		int slot;

		if (s->n_q < T) {
			slot = (s->q_head + s->n_q) % T;
			s->n_q++;
		} else {	/* full: the oldest makes room */
			slot = s->q_head;
			s->q_head = (s->q_head + 1) % T;
		}
		for (int l = 0; l < L; l++)
			memcpy(ws_qrow(s, l, slot), q + ((size_t)l * rows + (rows - from_new + i)) * qw,
			       qw * sizeof(float));
		s->qpos[slot] = first + i;
	}
}

const float *ws_queries(kvmem_session *s, const int64_t **pos)
{
	const int T = s->o.query_tokens, L = s->cfg.n_layers;
	const size_t qw = (size_t)s->cfg.n_heads * s->cfg.head_dim;

	for (int i = 0; i < s->n_q; i++)
		s->qpos_packed[i] = s->qpos[(s->q_head + i) % T];
	*pos = s->qpos_packed;
	if (s->q_head == 0 && s->n_q == T)
		return s->qring;	/* already in order */
	for (int l = 0; l < L; l++)
		for (int i = 0; i < s->n_q; i++)
			memcpy(s->qtmp + ((size_t)l * s->n_q + i) * qw,
			       ws_qrow(s, l, (s->q_head + i) % T), qw * sizeof(float));
	return s->qtmp;
}

/* Write n tokens' raw K / V rows ([L][n][H_kv][D] of the session's
 * rows_dtype) to their pages, all layers: in one call when the source
 * takes typed rows, else fp32 through write, a block's piece at a time
 * (bf16 rows widened first, which is exact). */
static int store_pages(kvmem_session *s, int64_t p0, int n, const void *k, const void *v,
		       int in_pages)
{
	const size_t kw = (size_t)s->cfg.n_kv_heads * s->cfg.head_dim;
	const int B = s->blocks.block, bf16 = s->rows_dtype == KVMEM_DTYPE_BF16;
	int rc;

	if (s->src->ops->write_rows) {
		rc = s->src->ops->write_rows(s->src->ctx, p0, n, in_pages ? NULL : k,
					     in_pages ? NULL : v, s->rows_dtype);
		if (rc != -ENOTSUP || in_pages)	/* V is not here as rows then */
			return rc ? kvmem_error_prefix("session: storing tokens %lld..%lld",
						      (long long)p0, (long long)p0 + n - 1) : 0;
	}
	for (int l = 0; l < s->cfg.n_layers; l++)
		for (int j = 0; j < n;) {
			int64_t p = p0 + j;
			int t0 = (int)(p % B), m = B - t0 < n - j ? B - t0 : n - j;
			size_t at = ((size_t)l * n + j) * kw;
			const float *pk = (const float *)k + at, *pv = (const float *)v + at;

			if (bf16) {
				kvmem_bf16_to_f32_n(s->rows_f32, (const uint16_t *)k + at, m * kw);
				kvmem_bf16_to_f32_n(s->rows_f32 + (size_t)B * kw,
						    (const uint16_t *)v + at, m * kw);
				pk = s->rows_f32;
				pv = s->rows_f32 + (size_t)B * kw;
			}
			if (s->src->ops->write(s->src->ctx, p / B, l, t0, m, pk, pv))
				return kvmem_error_prefix("session: storing block %lld",
							(long long)(p / B));
			j += m;
		}
	return 0;
}

int ws_put_rows(kvmem_session *s, const struct ws_rows *r, int64_t ns[2])
{
	const int64_t t0 = (int64_t)kvmem_now_ns();
	int64_t t1;

	kvmem_fwd_index f;

	/* Room in the index for the whole append at its first job: one
	 * re-lay instead of one at every doubling on the way (a 16K prefill
	 * from empty re-laid it four times). */
	if (r->upto > r->p0 + r->n &&
	    kvmem_index_reserve(&s->index, (r->upto + s->o.block - 1) / s->o.block))
		return kvmem_fail();
	if (r->ixw) {	/* summed by the backend: copied in */
		ws_ix_parts(s, (float *)r->ixw, &f);
		if (kvmem_index_put(&s->index, f.meank, f.kmin, f.kmax, f.sub, f.open_sum,
				    f.open_sub, r->n))
			return kvmem_fail();
	} else if (kvmem_index_append_rows(&s->index, r->k, s->rows_dtype, r->n)) {
		return kvmem_fail();
	}
	t1 = (int64_t)kvmem_now_ns();
	if (store_pages(s, r->p0, r->n, r->k, r->v, r->in_pages))
		return kvmem_fail();
	if (ns) {
		ns[0] += t1 - t0;
		ns[1] += (int64_t)kvmem_now_ns() - t1;
	}
	keep_queries(s, r->q, r->p0, r->n, r->q_rows);
	return 0;
}

int ws_usable(const kvmem_session *s)
{
	/* A step's rows that failed on the writer after its call returned:
	 * nobody was told yet, so the writer's own message. */
	if (s->broken)
		return ws_writer_failed(s) ? kvmem_fail() :
		       kvmem_error(EINVAL, "session: unusable after an earlier failure (see the first error)");
	if (s->released)
		return kvmem_error(EINVAL, "session: its view was given up (kvmem_session_release_view); "
				   "kvmem_session_restore_view lays it out again");
	if (s->stepping)
		return kvmem_error(EBUSY, "session: a selection is being laid out in steps: call "
				   "kvmem_session_select_step until it returns 0");
	return 0;
}

int ws_run_begin(kvmem_session *s, int n, kvmem_fwd_out *out)
{
	const int64_t p0 = s->blocks.n_tokens;

	/* Buffers an idle session gave back (kvmem_session_idle). */
	if (ws_scratch_alloc(s))
		return kvmem_fail();
	/* Only the queries keep_queries keeps come back. */
	*out = ws_fwd_out(s, n < s->o.query_tokens ? n : s->o.query_tokens);
	s->dev_argmax = KVMEM_ARGMAX_NONE;
	s->run_draw = 0;
	if (ws_view_len(s) + (int64_t)n > s->cap_limit && ws_select(s, 1))
		return kvmem_fail();
	if (ws_view_reserve(s, ws_view_len(s) + (int64_t)n))
		return kvmem_fail();
	if (kvmem_grow(&s->tokens, sizeof(int32_t), (size_t)(p0 + n), &s->cap_tokens, 1024))
		return kvmem_error(ENOMEM, "session: out of memory for %lld token ids",
				   (long long)(p0 + n));
	return 0;
}

int ws_run_end(kvmem_session *s, const int32_t *tok, int n, const kvmem_fwd_out *out,
	       int64_t forward_ns)
{
	const int64_t p0 = s->blocks.n_tokens, store0 = s->st.store_ns;
	const int64_t t1 = (int64_t)kvmem_now_ns();

	s->st.forward_ns += forward_ns;
	s->st.forwards++;
	/* The backend's index state follows its summaries only. */
	s->in_index = out->index != NULL;
	s->ix_next = out->index ? p0 + n + 1 : 0;
	s->st.index_forwards += out->index != NULL;
	memcpy(s->tokens + p0, tok, (size_t)n * sizeof(int32_t));
	if (ws_writer_rows(s, p0, n, kvmem_fwd_q_rows(out, n))) {
		/* The view holds tokens the history lacks. */
		s->broken = 1;
		return kvmem_fail();
	}
	s->blocks.n_tokens = p0 + n;
	if (!s->run_no_logits)
		s->logits_asked = 0;	/* new logits: nobody has asked yet */
	if (!s->run_no_logits && s->dev_argmax != KVMEM_ARGMAX_NONE) {
		/* A batched decode step's logits, left on the backend: the
		 * greedy draw is here already, the rest comes when asked. */
		s->argmax_tok = s->dev_argmax;
		s->logits_dev = 1;
		s->dev_drawn = s->run_draw;
		if (s->run_draw)	/* the token of a draw at a temperature */
			s->drawn_with = s->next_draw;
		s->st.lazy_logits++;
		s->have_logits = 1;
	} else if (!s->run_no_logits) {
		s->logits_dev = 0;
		if (s->o.all_logits) {
			memcpy(s->last_logits, s->logits + (size_t)(n - 1) * s->cfg.vocab,
			       (size_t)s->cfg.vocab * sizeof(float));
		} else {	/* one row each: swapped, not copied (a decode step) */
			float *t = s->last_logits;

			s->last_logits = s->logits;
			s->logits = t;
		}
		s->have_logits = 1;
	}
	s->run_no_logits = 0;
	if (s->src->ops->sync && s->src->ops->sync(s->src->ctx, s->blocks.n_tokens))
		return kvmem_error_prefix("session: committing %lld tokens",
					(long long)s->blocks.n_tokens);
	s->st.own_ns += (int64_t)kvmem_now_ns() - t1 - (s->st.store_ns - store0);
	if (s->o.on_forward)	/* every row, or the one now in last_logits */
		s->o.on_forward(s->o.arg, tok, n, s->o.all_logits ? s->logits : s->last_logits);
	return 0;
}

/*
 * The pages of a forward over tokens p0..p0+n-1, for the backend to write
 * its K and V rows into directly (kvmem_fwd_out.pages): when it can
 * (page_rows, bf16 rows; page_rows_fp8 for an fp8 source's pages, which it
 * quantises), the source can give them (row_pages: blocks made in its
 * pool) and that pool is pinned on the backend already. The
 * host then copies no rows into pages: the GPU lays them out as pages and
 * copies them into the pool slots (cuda_fwd.c). A prefill chunk's only: a
 * decode step's one token keeps its rows (and its CUDA graph). Asked while
 * the writer may be putting the forward before away (row_pages allows
 * that). KVMEM_PAGE_ROWS=0 turns it off (a measurement's peer).
 */
static void ask_pages(kvmem_session *s, int64_t p0, int n, kvmem_fwd_out *out)
{
	const int B = s->blocks.block, L = s->cfg.n_layers;
	uint32_t dtype;

	s->in_pages = 0;
	if (s->pages_off || n < B || !s->be->ops->page_rows || s->rows_dtype != KVMEM_DTYPE_BF16 ||
	    !s->src->ops->row_pages)
		return;
	dtype = s->src->ops->page_dtype ? s->src->ops->page_dtype(s->src->ctx) : KVMEM_DTYPE_BF16;
	if (dtype != KVMEM_DTYPE_BF16 && (dtype != KVMEM_DTYPE_FP8 || !s->be->ops->page_rows_fp8))
		return;	/* rows, as before */
	if (!s->pages) {
		const int most = (s->o.chunk + B - 1) / B + 1;

		if (!(s->pages = malloc((size_t)L * most * sizeof(void *)))) {
			s->pages_off = 1;	/* rows, as before */
			return;
		}
	}
	if (!s->reg_base) {
		void *base = NULL;
		size_t len = 0;

		/* The chunk's pages alone do not pay for pinning the pool (0.43 s
		 * for 2.7 GB on the H200's host, against 0.01 s they saved in a
		 * 16K prefill there): only a pool pinned already (by a server,
		 * by an earlier selection of this session, which pins it
		 * anyway) is used, its registration then a count. */
		if (!s->be->ops->host_pinned || !s->src->ops->region ||
		    s->src->ops->region(s->src->ctx, &base, &len) < 0 || !base ||
		    s->be->ops->host_pinned(s->be->ctx, base) != 1)
			return;
		ws_register(s);
	}
	if (!s->reg_base || s->src->ops->row_pages(s->src->ctx, p0, n, s->pages) < 0)
		return;	/* rows as before */
	out->pages = s->pages;
	out->page_t0 = (int)(p0 % B);
	out->page_block = B;
	out->page_dtype = dtype;
	out->v_bf16 = NULL;
	s->in_pages = 1;
}

/*
 * One engine call over n tokens at the end of the view, then the history.
 * logits 0: nobody reads this call's logits (an append's inner chunk with
 * no on_forward and no all_logits), so the backend computes none: on a
 * GPU at Qwen3-8B the final norm and the 152K-row head read 1.2 GB of
 * weights a chunk, 5 ms of a 16K prefill on the H200.
 */
static int run_tokens(kvmem_session *s, const int32_t *tok, int n, int logits)
{
	const int64_t tb = (int64_t)kvmem_now_ns();
	kvmem_fwd_out out;
	int64_t t0;

	if (ws_run_begin(s, n, &out))
		return kvmem_fail();
	ask_pages(s, s->blocks.n_tokens, n, &out);
	s->st.page_forwards += out.pages != NULL;
	if (ws_ask_index(s, s->blocks.n_tokens, n, &out)) {
		s->in_pages = 0;
		return kvmem_fail();
	}
	t0 = (int64_t)kvmem_now_ns();
	s->st.begin_ns += t0 - tb;
	if (s->be->ops->forward(s->be->ctx, s->view, tok, n, logits ? s->logits : NULL,
				s->o.all_logits, &out)) {
		s->in_pages = 0;
		s->ix_next = 0;	/* its state may have moved */
		return kvmem_error_prefix("session");
	}
	s->run_no_logits = !logits;
	return ws_run_end(s, tok, n, &out, (int64_t)kvmem_now_ns() - t0);
}

/* The wait for the writer at the end of an append or a decode (timed
 * apart: the last job is the one nothing overlaps). */
static int last_wait(kvmem_session *s)
{
	const int64_t t0 = (int64_t)kvmem_now_ns();
	int rc = ws_writer_wait(s);

	s->st.last_wait_ns += (int64_t)kvmem_now_ns() - t0;
	return rc;
}

/* Pins may never need more than the budget; on refusal they stay as they were. */
static int pin_checked(kvmem_session *s, int64_t start, int64_t end)
{
	kvmem_span *saved = NULL;
	int n = s->blocks.n_pins;
	/* Charged as whole blocks: a pinned partial block fills up later. */
	int64_t upto = end > s->blocks.n_tokens ? end : s->blocks.n_tokens, need;

	upto = round_up(upto, s->blocks.block);

	if (n && !(saved = malloc((size_t)n * sizeof(*saved))))
		return kvmem_error(ENOMEM, "session: out of memory pinning");
	if (n)
		memcpy(saved, s->blocks.pins, (size_t)n * sizeof(*saved));
	if (kvmem_blocks_pin(&s->blocks, start, end)) {
		free(saved);
		return kvmem_fail();
	}
	need = kvmem_blocks_pinned_tokens(&s->blocks, upto);
	if (need > s->budget) {
		if (n)
			memcpy(s->blocks.pins, saved, (size_t)n * sizeof(*saved));
		s->blocks.n_pins = n;
		free(saved);
		return kvmem_error(EINVAL, "session: pinning [%lld, %lld) would need %lld tokens of pinned (whole) blocks; the budget is %lld",
				 (long long)start, (long long)end, (long long)need,
				 (long long)s->budget);
	}
	free(saved);
	return 0;
}

int kvmem_session_pin(kvmem_session *s, int64_t start, int64_t end)
{
	return pin_checked(s, start, end);
}

int kvmem_session_unpin(kvmem_session *s, int64_t start, int64_t end)
{
	return kvmem_blocks_unpin(&s->blocks, start, end);
}

int kvmem_session_append(kvmem_session *s, const int32_t *tokens, int64_t n, int pin)
{
	const int64_t p0 = s->blocks.n_tokens;

	if (ws_usable(s))
		return kvmem_fail();
	if (n < 0)
		return kvmem_error(EINVAL, "session: cannot append %lld tokens", (long long)n);
	if (pin && n && pin_checked(s, p0, p0 + n))
		return kvmem_fail();
	/* Room for the whole append at once, as far as the view may grow:
	 * reserved chunk by chunk, the view was reallocated and copied at
	 * every doubling on the way (five times in a 16K prefill from empty,
	 * each a device allocation, copy and free while the pipeline waits). */
	if (n > s->o.chunk) {
		const int64_t t0 = (int64_t)kvmem_now_ns();
		int64_t want = ws_view_len(s) + n;

		if (ws_view_reserve(s, want < s->cap_limit ? want : s->cap_limit))
			return kvmem_fail();
		s->st.reserve_ns += (int64_t)kvmem_now_ns() - t0;
	}
	s->append_upto = p0 + n;
	for (int64_t i = 0; i < n;) {
		int c = n - i < s->o.chunk ? (int)(n - i) : s->o.chunk;
		/* Only the last chunk's logits are read, unless every forward's
		 * are (on_forward, all_logits). */
		int logits = i + c == n || s->o.on_forward || s->o.all_logits;

		if (run_tokens(s, tokens + i, c, logits)) {
			s->append_upto = 0;
			/* The last logits are not the history's last token's
			 * when the chunks before skipped theirs. */
			if (i && !s->o.on_forward && !s->o.all_logits)
				s->have_logits = 0;
			ws_writer_drain(s);
			return kvmem_fail();
		}
		i += c;
	}
	s->append_upto = 0;
	/* The caller may read or commit the source now. */
	return last_wait(s);
}

int kvmem_session_select(kvmem_session *s)
{
	return ws_usable(s) ? -1 : ws_select(s, 0);
}

/* The first logit that is NaN or infinite, or -1. Groups of 16 with no
 * early exit inside, which the compiler vectorises: a decode step scans
 * Qwen3's 152K logits in a few microseconds. */
static int first_nonfinite(const float *x, int n)
{
	int i = 0;

	for (; i + 16 <= n; i += 16) {
		uint32_t bad = 0;

		for (int j = 0; j < 16; j++) {
			uint32_t u;

			memcpy(&u, x + i + j, sizeof(u));
			bad |= (u & 0x7f800000u) == 0x7f800000u;
		}
		if (bad)
			break;
	}
	for (; i < n; i++)
		if (!isfinite(x[i]))
			return i;
	return -1;
}

/* Whether the draw the last forward made beside its logits (at a
 * temperature) is this one: the same settings, banned ids and state. */
static int dev_draw_is(const kvmem_session *s, const kvmem_sampler *smp, uint64_t rng,
		       const int32_t *banned, int n_banned)
{
	const kvmem_draw_spec *d = &s->drawn_with;

	if (!s->logits_dev || !s->dev_drawn || s->argmax_tok < 0 || d->rng != rng ||
	    d->temperature != smp->temperature || d->top_k != smp->top_k ||
	    d->top_p != smp->top_p || d->n_banned != n_banned)
		return 0;
	return n_banned == 0 || !memcmp(d->banned, banned, sizeof(*banned) * (size_t)n_banned);
}

/* The next batched decode step draws as this draw did, beside its logits:
 * the settings, the banned ids and the state this draw left. */
static void plan_next(kvmem_session *s, const kvmem_sampler *smp, uint64_t rng,
		      const int32_t *banned, int n_banned)
{
	s->plan_on = n_banned <= KVMEM_DRAW_BANNED_MAX && s->cfg.vocab <= KVMEM_DRAW_VOCAB_MAX;
	if (!s->plan_on)
		return;
	s->next_draw = (kvmem_draw_spec){ .temperature = smp->temperature, .top_k = smp->top_k,
				     .top_p = smp->top_p, .n_banned = n_banned, .rng = rng };
	if (n_banned)
		memcpy(s->next_draw.banned, banned, sizeof(*banned) * (size_t)n_banned);
}

int ws_sample_with(kvmem_session *s, const kvmem_sampler *smp, const kvmem_draw_opts *o,
		   int32_t *out)
{
	static const kvmem_sampler greedy = { 0 };
	uint64_t *rng = o && o->rng ? o->rng : &s->rng;
	const int n_banned = o && o->n_banned > 0 ? o->n_banned : 0;
	const int32_t *banned = n_banned ? o->banned : NULL;
	int32_t tok;
	int v;

	if (!s->have_logits)
		return kvmem_error(EINVAL, "session: nothing to decode from: append tokens first");
	if (n_banned && !banned)
		return kvmem_error(EINVAL, "session: draw: %d banned ids and no array", n_banned);
	if (!smp)
		smp = &greedy;
	s->draw_greedy = smp->temperature <= 0.0f;
	s->plan_on = 0;
	/* A batched step's draw was made beside its logits: greedy, or at a
	 * temperature as this one draws. */
	if (ws_draw_at_hand(s, smp)) {
		tok = s->argmax_tok;
		for (int i = 0; i < n_banned; i++)
			if (banned[i] == tok)
				goto host;	/* a banned best: the logits decide */
		*out = tok;
		return 0;
	}
	if (smp->temperature > 0.0f && dev_draw_is(s, smp, *rng, banned, n_banned)) {
		*out = s->argmax_tok;
		kvmem_rng_next(rng);	/* the value the device took */
		s->st.lazy_draws++;
		plan_next(s, smp, *rng, banned, n_banned);
		return 0;
	}
host:
	if (ws_logits_host(s))
		return kvmem_fail();
	/* NaN would never be drawn and infinities would always win: either
	 * way the model's arithmetic has overflowed, and a token sampled
	 * from it is no answer. A greedy draw checks in its own pass. */
	if (smp->temperature <= 0.0f && !n_banned) {
		tok = kvmem_argmax_finite(s->last_logits, s->cfg.vocab, &v);
	} else {
		const kvmem_sampler *use = smp;
		kvmem_sampler g1;

		v = first_nonfinite(s->last_logits, s->cfg.vocab);
		if (smp->temperature <= 0.0f) {	/* greedy with ids left out: top-k 1 */
			g1 = (kvmem_sampler){ .temperature = 1.0f, .top_k = 1 };
			use = &g1;
		}
		if (v < 0) {
			uint64_t spare = *rng;

			tok = kvmem_sample_without(s->last_logits, s->cfg.vocab, use,
						   smp->temperature > 0.0f ? rng : &spare,
						   banned, n_banned);
		} else {
			tok = -1;
		}
	}
	if (v >= 0)
		return kvmem_error(ERANGE, "session: the logits hold NaN or infinite values (logit "
				   "%d is %g): the model's arithmetic overflowed; nothing sampled",
				   v, (double)s->last_logits[v]);
	if (tok < 0)
		return kvmem_error(-tok, "sampling: out of memory");
	if (smp->temperature > 0.0f)
		plan_next(s, smp, *rng, banned, n_banned);
	*out = tok;
	return 0;
}

int ws_sample(kvmem_session *s, const kvmem_sampler *smp, int32_t *out)
{
	return ws_sample_with(s, smp, NULL, out);
}

int kvmem_session_decode(kvmem_session *s, int n, const kvmem_sampler *smp, int32_t *out)
{
	if (ws_usable(s))
		return kvmem_fail();
	if (n > 0 && !s->have_logits)
		return kvmem_error(EINVAL, "session: nothing to decode from: append tokens first");
	for (int i = 0; i < n; i++) {
		int32_t tok;

		if (ws_sample(s, smp, &tok)) {
			ws_writer_drain(s);
			return kvmem_fail();
		}
		if (out)
			out[i] = tok;
		if (run_tokens(s, &tok, 1, 1)) {
			ws_writer_drain(s);
			return kvmem_fail();
		}
	}
	/* The last token's rows may still be on the writer: the next step
	 * waits for them after its forward, and everything that reads the
	 * history before (writer.c) waits first. */
	return ws_step_end(s);
}

int kvmem_session_draw(kvmem_session *s, const kvmem_sampler *smp, int32_t *out)
{
	return kvmem_session_draw_with(s, smp, NULL, out);
}

int kvmem_session_draw_with(kvmem_session *s, const kvmem_sampler *smp, const kvmem_draw_opts *o,
			    int32_t *out)
{
	if (!out)
		return kvmem_error(EINVAL, "session: draw: nowhere to put the token");
	if (o && o->n_banned < 0)
		return kvmem_error(EINVAL, "session: draw: %d banned ids", o->n_banned);
	if (ws_usable(s) || ws_sample_with(s, smp, o, out))
		return kvmem_fail();
	return 0;
}

int kvmem_session_sync(kvmem_session *s)
{
	if (s->broken)
		return ws_usable(s);
	return ws_writer_wait(s);
}

int64_t kvmem_session_tokens(const kvmem_session *s)
{
	return s->blocks.n_tokens;
}

const int32_t *kvmem_session_token_ids(const kvmem_session *s)
{
	return s->tokens;
}

const kvmem_plan *kvmem_session_plan(const kvmem_session *s)
{
	return &s->plan;
}

const float *kvmem_session_scores(const kvmem_session *s, int *n_sets, int64_t *n_blocks)
{
	if (n_sets)
		*n_sets = s->n_sets;
	if (n_blocks)
		*n_blocks = s->scored_blocks;
	return s->scored_blocks ? s->scores : NULL;
}

const kvmem_kvcache *kvmem_session_view(const kvmem_session *s)
{
	return s->be->ops->host_view ? s->be->ops->host_view(s->be->ctx, s->view) : NULL;
}

int kvmem_session_reserve(kvmem_session *s, int64_t more)
{
	int64_t want;

	if (more < 0)
		return kvmem_error(EINVAL, "session: room for %lld more tokens", (long long)more);
	if (ws_usable(s))
		return kvmem_fail();
	want = ws_view_len(s) + (more < s->cap_limit ? more : s->cap_limit);
	return ws_view_reserve(s, want < s->cap_limit ? want : s->cap_limit) ? kvmem_fail() : 0;
}

int64_t kvmem_session_view_len(const kvmem_session *s)
{
	return ws_view_len(s);
}

const kvmem_backend *kvmem_session_backend(const kvmem_session *s)
{
	return s->be;
}

int ws_draw_at_hand(const kvmem_session *s, const kvmem_sampler *smp)
{
	return s->logits_dev && s->argmax_tok >= 0 && !s->dev_drawn &&
	       (!smp || smp->temperature <= 0.0f);
}

int ws_logits_host(kvmem_session *s)
{
	if (!s->logits_dev)
		return 0;
	if (s->be->ops->logits_fetch(s->be->ctx, s->view, s->last_logits))
		return kvmem_error_prefix("session: the last logits from the backend");
	s->logits_dev = 0;
	s->st.lazy_fetches++;
	return 0;
}

const float *kvmem_session_logits(const kvmem_session *s)
{
	/* last_logits is a cache of what the backend may still hold: filling
	 * it changes nothing the caller can see but this answer. */
	((kvmem_session *)s)->logits_asked = 1;
	if (!s->have_logits || ws_logits_host((kvmem_session *)s))
		return NULL;
	return s->last_logits;
}

const kvmem_index *kvmem_session_index(const kvmem_session *s)
{
	ws_writer_settle(s);	/* a failure breaks the session: its next call says so */
	return &s->index;
}

const kvmem_blocks *kvmem_session_blocks(const kvmem_session *s)
{
	return &s->blocks;
}

const kvmem_policy_ops *kvmem_session_policy(const kvmem_session *s)
{
	return s->pol;
}

const kvmem_session_opts *kvmem_session_options(const kvmem_session *s)
{
	return &s->o;
}

void kvmem_session_get_stats(const kvmem_session *s, kvmem_session_stats *st)
{
	*st = s->st;
	st->index_device_bytes = s->mirror && s->be->ops->mirror_bytes ?
		s->be->ops->mirror_bytes(s->be->ctx, s->mirror) : 0;
}

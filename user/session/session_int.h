/* SPDX-License-Identifier: MIT */
/* A session's state, shared by session.c (steps) and view.c (selection and
 * rematerialisation). Private to user/session. */
#ifndef KVMEM_WORKSPACE_SESSION_INT_H
#define KVMEM_WORKSPACE_SESSION_INT_H

#include "select/select.h"
#include "util/clock.h"
#include "backend/backend_impl.h"
#include "session/inspect.h"

struct kvmem_session {
	kvmem_backend *be;
	kvmem_view *view;		/* this session's view on the backend */
	kvmem_config cfg;
	kvmem_session_opts o;		/* defaults resolved */
	int layout_auto;		/* o.layout was left to the default: a saved
					 * state's layout is taken (state.c) */
	const kvmem_policy_ops *pol;
	int n_sets;			/* 1, or n_layers for a per-layer policy */
	int64_t budget;			/* resolved: huge when unlimited */
	int64_t cap_limit;		/* budget + reserve: most slots the view takes */

	kvmem_blocks blocks;
	kvmem_index index;
	kvmem_page_source own_src;	/* used when the caller gives none */
	const kvmem_page_source *src;

	int32_t *tokens;
	size_t cap_tokens;

	/* The execution view, held by the backend: plan.view_tokens history
	 * tokens at slots 0..view_len-1, then the tail: token p >= sel_tokens
	 * at slot view_len + (p - sel_tokens). */
	kvmem_plan plan;
	int64_t view_len, sel_tokens;

	/* Per forward pass: [L][chunk][...] as the engine returns them: raw
	 * K and V as rows of rows_dtype (the backend's: fp32, or bf16 in
	 * pinned memory from its host_alloc), the queries fp32. */
	void *raw_k, *v;
	uint32_t rows_dtype;
	/* Pages a forward writes itself (kvmem_fwd_out.pages, from the
	 * source's row_pages): [L][nb], room for a chunk's blocks; in_pages:
	 * the forward just run wrote its rows there (V did not come down as
	 * rows). pages_off: refused (KVMEM_PAGE_ROWS=0, or no room for it). */
	void **pages;
	int in_pages, pages_off;
	float *rows_f32;		/* one piece of rows widened for a source
					 * without write_rows: [2][block][kw] */
	float *q_raw, *logits, *last_logits;
	int have_logits;
	/* The last logits stayed beside the view (a batched decode step's:
	 * kvmem_fwd_item.argmax): last_logits is stale until ws_logits_host
	 * fetches them. argmax_tok: their greedy draw, or -1 (a NaN or an
	 * infinity: the draw fetches them to say which). dev_argmax: what the
	 * backend writes in the forward (KVMEM_ARGMAX_NONE: it did not). */
	int logits_dev;
	int32_t argmax_tok, dev_argmax;
	/* Whether the next batched step may leave its logits: the last draw
	 * was greedy (ws_sample) and nobody asked for the last logits
	 * (kvmem_session_logits). A session whose caller reads every step's
	 * logits (logprobs, its own sampler) keeps them on the host, rather
	 * than fetching each one alone. */
	int draw_greedy, logits_asked;
	/* A draw at a temperature made beside the logits (kvmem_fwd_item.draw):
	 * next_draw is the next one's (the last draw's settings, banned ids and
	 * the random state it left), on while the last draw was such a draw;
	 * run_draw: the forward under way was given it; dev_drawn: argmax_tok
	 * is that draw's token, made with drawn_with (greedy draws then fetch
	 * the logits). */
	kvmem_draw_spec next_draw, drawn_with;
	int plan_on, run_draw, dev_drawn;
	/* The forward about to end computed no logits (an append's inner
	 * chunk, nobody asking for them): ws_run_end leaves last_logits. */
	int run_no_logits;
	/* During an append: its last token + 1 (ws_rows.upto), else 0. */
	int64_t append_upto;
	/* The index's summaries made by the backend (index_rows; dev_index,
	 * decided at the first prefill chunk: 1 it does, -1 not, as with
	 * KVMEM_DEVICE_INDEX=0): ixw is a set of pinned buffers the forward
	 * writes them into (ws_ix_parts lays it out), ix_floats its size;
	 * in_index: the forward just run did; ix_next: 1 + the token after
	 * those the backend's running state covers (0: none; the next call
	 * hands it the host index's). */
	int dev_index, in_index;
	float *ixw;
	size_t ix_floats;
	int64_t ix_next;
	kvmem_fwd_index fix;

	/* Raw queries of the last n_q tokens: a ring of query_tokens (T) slots,
	 * [L][T][n_heads][D], the oldest at slot q_head, and their positions
	 * qpos[T] alike; a decode step writes one row a layer. ws_queries packs
	 * them ([L][n_q][..], oldest first) into qtmp / qpos_packed for a
	 * selection. */
	float *qring, *qtmp;
	int64_t *qpos, *qpos_packed;
	int n_q, q_head;

	float *scores;
	int64_t cap_scores;
	int64_t scored_blocks;	/* blocks the last selection scored */
	/* Rematerialisation queued for the backend's place(): items whose
	 * pages are held (got from the source) until the batch is placed. */
	kvmem_place *items;
	int n_items, cap_items;
	int n_held;		/* of them, pages got from the source (not cached) */
	/* Tokens that stay in the view but change slots, moved by the
	 * backend from the raw K it keeps (keep_raw; move_ok: it does), all
	 * before anything is placed from pages: moving says the walk's
	 * second pass leaves them alone. */
	kvmem_move *moves;
	size_t n_moves, cap_moves;
	int move_ok, moving;
	float *page_f32;		/* one page's K as f32 (adopt, a non-f32 source) */
	void *reg_base;			/* the source's region, registered on the backend */
	uint32_t owner;			/* this session's tag in place items (kvmem_place.owner) */
	int reg_tried;			/* registration asked for (done or refused; not
					 * while the source has no region yet) */
	/* The backend's copy of the index for scoring on its device (NULL:
	 * not made yet); off: refused once (no score op, no room), the host
	 * scores from then on. */
	void *mirror;
	int mirror_off;
	/* A forward's rows on their way to the history (writer.c); NULL
	 * until the first job it takes. raw_k, v and q_raw above and its
	 * spare set swap. */
	struct ws_writer *writer;
	int writer_min;			/* the smallest job it takes (0: not decided) */
	int defer;			/* a decode step returns with its rows in flight:
					 * 1, or -1 with KVMEM_WRITER_DEFER=0 (0: not
					 * decided; writer.c) */
	uint64_t rng;
	kvmem_session_stats st;
	int broken;			/* a failure left the view inconsistent */
	/* The view was given up (release.c): s->view is an empty one and
	 * raw_k, v, q_raw are NULL until kvmem_session_restore_view. */
	int released;
	int restore_next;		/* layers laid out again so far (restore_view_step) */
	/* A stored history's index still being taken in (adopt.c): a
	 * released session adopting a state leaves it to restore_view_step. */
	struct ws_adopting *adopting;
	/* A selection laid out in steps (select_step.c): its plan, and the
	 * layers placed so far; `stepping` while one is under way. */
	kvmem_plan step_plan;
	int step_next;
	int stepping;
};

/* The view's length on the backend. */
static inline int64_t ws_view_len(const kvmem_session *s)
{
	return s->be->ops->length(s->be->ctx, s->view);
}

/* view.c */
int ws_view_reserve(kvmem_session *s, int64_t need);
/* Let the backend read the source's pages where they live (view.c); undone
 * by ws_unregister when the session is freed. */
void ws_register(kvmem_session *s);
/* After the first view: the device page pool takes the best of the rest
 * (pool_fill.c). */
int ws_pool_fill(kvmem_session *s);
/* A session's owner tag (kvmem_place.owner): a new one each call, never 0,
 * not reused in the process (until 2^32 sessions). */
uint32_t ws_new_owner(void);
void ws_unregister(kvmem_session *s);
int ws_select(kvmem_session *s, int forced);
/* The same for kvmem_session_select_ahead: the query text is ahead[n_ahead],
 * the tokens about to be appended (ws_select: the history's tokens at the
 * query positions). */
int ws_select_text(kvmem_session *s, int forced, const int32_t *ahead, int n_ahead);
/* ws_select_text in parts (select_step.c lays a selection out in steps):
 * begin scores, plans into *np and makes the moves (1: no blocks, nothing
 * to do); layers places layers l0..l1-1; end puts *np in force. A failure
 * after the plan leaves the session broken and *np freed. */
int ws_select_begin(kvmem_session *s, int forced, const int32_t *ahead, int n_ahead,
		    kvmem_plan *np);
int ws_select_layers(kvmem_session *s, kvmem_plan *np, int l0, int l1);
int ws_select_end(kvmem_session *s, kvmem_plan *np, int forced);
/* session.c: the queries packed for a selection (see qring). */
const float *ws_queries(kvmem_session *s, const int64_t **pos);
/* Row of ring slot `slot`, layer l. */
static inline float *ws_qrow(const kvmem_session *s, int l, int slot)
{
	return s->qring + ((size_t)l * s->o.query_tokens + slot) * s->cfg.n_heads * s->cfg.head_dim;
}

/* The scorer ws_select hands the policy when the backend can score (NULL
 * when it cannot or was told not to); dev is filled in. */
const kvmem_score_device *ws_score_device(kvmem_session *s, kvmem_score_device *dev);
/* Lay out the whole view from the plan in force, sel_tokens and view_len
 * (a restored state): every slot rebuilt from the pages. */
int ws_view_restore(kvmem_session *s);
/* Layers [*next, *next + layers) of it (the first call reserves the view,
 * the last sets its length): 1 while layers are left, 0 when done, -errno. */
int ws_view_restore_layers(kvmem_session *s, int *next, int layers);

/* What a forward over tokens [p0, p0 + n) gave the history: raw K and V
 * ([L][n][kw]) and the queries of its last q_rows tokens ([L][q_rows][qw]). */
struct ws_rows {
	int64_t p0;
	int n, q_rows;
	int in_pages;		/* the pages hold the rows already: v unused */
	int64_t upto;		/* the append's last token + 1: the index made
				 * room for it at once (0: only these rows) */
	const float *ixw;	/* the index's summaries of these rows, made by
				 * the backend (a set like kvmem_session.ixw), or
				 * NULL: k is summed here */
	const void *k, *v;	/* rows of the session's rows_dtype */
	const float *q;
};

/* session.c: put them away: the index appended, the pages written, the
 * queries kept in the ring. ns (may be NULL): the time the index and the
 * pages took, added to ns[0] and ns[1]. */
int ws_put_rows(kvmem_session *s, const struct ws_rows *r, int64_t ns[2]);

/* writer.c: ws_put_rows for the forward just run (s->raw_k, s->v,
 * s->q_raw), on the writer thread (the session then holds the other
 * buffers) or in line. The index, the pages and the query ring are the
 * job's until ws_writer_wait. */
int ws_writer_rows(kvmem_session *s, int64_t p0, int n, int q_rows);
/* Wait for the rows in flight: 0, or the job's error (the session is then
 * broken). Before anything that reads or commits the source, or reads the
 * index or the query ring. */
int ws_writer_wait(kvmem_session *s);
/* The same, leaving the error state alone (after another failure). */
void ws_writer_drain(kvmem_session *s);
/* ws_writer_wait for the readers of a const session (save_state,
 * kvmem_session_index): a decode step returns with its rows in flight. */
int ws_writer_settle(const kvmem_session *s);
/* The error of a job that broke the session and no call has reported yet
 * (kvmem_error: its code, the worker's message; reported once), or 0. */
int ws_writer_failed(const kvmem_session *s);
/* The end of a decode step (kvmem_session_decode, the batched calls): 0 at
 * once, the rows left in flight; or, with KVMEM_WRITER_DEFER=0 (a
 * measurement's peer), ws_writer_wait as before issue #26. */
int ws_step_end(kvmem_session *s);
/* Wait, stop the thread, free its buffers. */
void ws_writer_free(kvmem_session *s);

/* session.c: buffers for one forward pass's raw K or V rows of the
 * session's rows_dtype (pinned through the backend when its rows are
 * bf16); ws_rows_free undoes. */
void *ws_rows_alloc(kvmem_session *s);
void ws_rows_free(kvmem_session *s, void *p);
/* session.c: raw_k, v and q_raw, one forward pass's rows, made where they
 * are NULL; ws_scratch_free frees them (an idle session's view given up,
 * release.c). */
int ws_scratch_alloc(kvmem_session *s);
void ws_scratch_free(kvmem_session *s);
/* The forward's outputs into the rows and queries the session holds now,
 * the queries of the last q_last tokens (1 .. query_tokens; 0: all of
 * them, into a buffer the caller sets). */
kvmem_fwd_out ws_fwd_out(const kvmem_session *s, int q_last);
/* A buffer for those queries, [L][query_tokens][n_heads * head_dim]: the
 * session's q_raw and the writer's second one (they swap). */
float *ws_q_alloc(const kvmem_session *s);
/* dev_index.c: a set of the index's summary buffers (pinned through the
 * backend), and where each array of set lies (f's pointers); the
 * summaries of a forward over tokens p0..p0+n-1 asked of the backend in
 * *out when it makes them (0, or the writer's error). */
float *ws_ix_alloc(kvmem_session *s);
void ws_ix_free(kvmem_session *s, float *p);
void ws_ix_parts(const kvmem_session *s, float *set, kvmem_fwd_index *f);
int ws_ask_index(kvmem_session *s, int64_t p0, int n, kvmem_fwd_out *out);

/* session.c: 0, or -EINVAL when an earlier failure broke the session. */
int ws_usable(const kvmem_session *s);
/*
 * session.c: one token run in three parts, so that a batch (batch.c) runs
 * the forward of many sessions in one pass between the first and the
 * last. ws_run_begin makes room for n tokens (selecting first when the
 * tail is full) and fills in the forward's outputs; the caller runs the
 * forward over s->view into s->logits; ws_run_end puts the tokens and the
 * rows away (the writer thread may take them: ws_writer_wait before
 * anything reads the source, the index or the query ring; the next
 * ws_run_end waits for them before it hands its own rows over) and keeps
 * the last logits.
 */
int ws_run_begin(kvmem_session *s, int n, kvmem_fwd_out *out);
int ws_run_end(kvmem_session *s, const int32_t *tok, int n, const kvmem_fwd_out *out,
	       int64_t forward_ns);

/* session.c: the next token drawn from the last logits with smp (NULL:
 * greedy) and the session's random state; -ERANGE for logits that are not
 * finite (nothing drawn). */
int ws_sample(kvmem_session *s, const kvmem_sampler *smp, int32_t *out);
/* The same with the caller's random state and banned ids (o may be NULL:
 * the session's state, none banned). */
int ws_sample_with(kvmem_session *s, const kvmem_sampler *smp, const kvmem_draw_opts *o,
		   int32_t *out);
/* 1 when smp's draw needs no pass over logits: a greedy one whose token
 * came back with a batched step (logits_dev). */
int ws_draw_at_hand(const kvmem_session *s, const kvmem_sampler *smp);
/* The last logits into last_logits when they stayed on the backend
 * (logits_dev); 0 when they are there already. */
int ws_logits_host(kvmem_session *s);

/* adopt.c */
int ws_adopt_check(const kvmem_session *s, const int32_t *tokens, int64_t n);
int ws_adopt_history(kvmem_session *s, const int32_t *tokens, int64_t n);
/* The same in parts: begin takes the token ids (the session's token count
 * is n from then on); each step takes up to `groups` groups of blocks into
 * the index (1 while blocks are left, 0 when done or none was under way;
 * a failure leaves the session broken); free drops an unfinished one. */
int ws_adopt_history_begin(kvmem_session *s, const int32_t *tokens, int64_t n);
int ws_adopt_history_step(kvmem_session *s, int64_t groups);
void ws_adopt_history_free(kvmem_session *s);

#endif

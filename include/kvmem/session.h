/* SPDX-License-Identifier: MIT */
/*
 * Agent sessions: the step loop over a compute backend (kvmem/backend.h)
 * and a page source (kvmem/source.h), and the selection policies it runs.
 * Documentation/workspace.md and Documentation/policies.md tell the story;
 * this header is the contract.
 *
 *   session   append (chunked prefill), select at a step boundary,
 *             rematerialise the view from raw K, decode with it frozen
 *   policy    scores every block from the step's raw queries (ops struct;
 *             a program may register its own)
 *   index     per (block, layer, KV head) the Mean-K of raw K in fp32, and
 *             min/max and sub-block means when the policy asks for them
 *   plan      what a selection chose: sink + pins + recent + top-scored
 *             blocks up to the budget, in chronological order at compact
 *             positions, and the diff against the previous plan
 */
#ifndef KVMEM_SESSION_H
#define KVMEM_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "kvmem/backend.h"
#include "kvmem/sample.h"
#include "kvmem/source.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with -fvisibility=hidden: what is declared here is its API. */
#pragma GCC visibility push(default)

/* Block sizes (tokens per block, a power of two). */
#define KVMEM_BLOCK_MIN 16
#define KVMEM_BLOCK_MAX 256
#define KVMEM_BLOCK_DEFAULT 32

/* ---- index ------------------------------------------------------------ */
/* Summaries a policy may need; Mean-K is always kept. */
#define KVMEM_SUM_MEANK		1u	/* mean of raw K per (block, layer, KV head) */
#define KVMEM_SUM_MINMAX		2u	/* per-dimension min and max of raw K */
#define KVMEM_SUM_SUBBLOCK	4u	/* Mean-K of each quarter block */
#define KVMEM_NEED_KEYS		8u	/* the raw keys themselves (oracle) */
#define KVMEM_NEED_TEXT		16u	/* the token ids: kvmem_select_ctx.tokens, text (lexical) */
#ifndef KVMEM_SUBBLOCKS
#define KVMEM_SUBBLOCKS		4	/* sub-blocks per block */
#endif

/* The block summaries a policy scores (opaque; the session owns it). Vectors
 * are fp32 [head_dim]; l a layer, h a KV head, b a block, s a sub-block. */
typedef struct kvmem_index kvmem_index;
int64_t kvmem_index_blocks(const kvmem_index *ix);
int kvmem_index_block_size(const kvmem_index *ix);	/* B */
unsigned kvmem_index_sums(const kvmem_index *ix);	/* KVMEM_SUM_* kept */
const float *kvmem_index_meank(const kvmem_index *ix, int l, int h, int64_t b);
/* KVMEM_SUM_MINMAX: per-dimension min and max of the block's raw K. */
const float *kvmem_index_min(const kvmem_index *ix, int l, int h, int64_t b);
const float *kvmem_index_max(const kvmem_index *ix, int l, int h, int64_t b);
/* KVMEM_SUM_SUBBLOCK: the mean of sub-block s of block b. */
const float *kvmem_index_sub(const kvmem_index *ix, int l, int h, int64_t b, int s);
/* Tokens in block b / in its sub-block s (0 for a sub-block not yet begun). */
int kvmem_index_block_len(const kvmem_index *ix, int64_t b);
int kvmem_index_sub_len(const kvmem_index *ix, int64_t b, int s);

/* ---- selection policies ----------------------------------------------- */
/* Where the shipped scorers may run instead of the host: the session's
 * backend (internal; NULL for the lab's replays). */
struct kvmem_score_device;

/* What a policy is given at a step boundary. */
typedef struct kvmem_select_ctx {
	const kvmem_index *index;
	const kvmem_page_source *keys;	/* raw K of every block (KVMEM_NEED_KEYS) */
	int64_t n_tokens, n_blocks;
	int block;
	int n_layers, n_heads, n_kv_heads, head_dim;
	double rope_theta;
	int n_q;			/* query tokens: the step's last tokens */
	const float *q;			/* [n_layers][n_q][n_heads][head_dim], raw */
	const int64_t *q_pos;		/* [n_q] their workspace positions */
	uint64_t seed;
	int64_t step;			/* selections so far: varies random draws */
	/*
	 * The view's capacity in tokens (budget + reserve; 0: unlimited).
	 * A selected key will sit somewhere in the view, at a distance from
	 * the query the policy cannot know yet; the shipped policies score the
	 * expected logit over distances 0..span-1 (kvmem_rope_mean in kernels/cpu/score.c:
	 * RoPE averaged, which keeps the slow, position-stable dimensions and
	 * fades the fast ones). 0: raw q.k.
	 */
	int64_t span;
	int64_t budget;			/* history tokens the view holds; 0: unlimited */
	/* Optional: where the shipped scorers may run instead of the host
	 * (NULL: the host; the lab's replays and bench select). */
	const struct kvmem_score_device *device;
	/*
	 * The text, for policies that match tokens: the history's
	 * token ids, tokens[n_tokens]; and the step's query text,
	 * text[n_text]: the history's tokens from the first query position to
	 * the last (q_pos[0] .. q_pos[n_q - 1]; none when n_q is 0), or, in a
	 * kvmem_session_select_ahead, every token about to be appended (q and
	 * q_pos are the queries of its last n_q). The lab rebuilds the same
	 * text from the recorded positions and the saved history. Both NULL
	 * where a caller has no token ids (bench select's synthetic index):
	 * a policy that needs them fails there with -EINVAL.
	 */
	const int32_t *tokens;
	const int32_t *text;
	int64_t n_text;
} kvmem_select_ctx;

typedef struct kvmem_policy_ops {
	const char *name;
	const char *what;	/* one line for --help */
	unsigned needs;		/* KVMEM_SUM_* / KVMEM_NEED_KEYS / KVMEM_NEED_TEXT */
	int per_layer;		/* 1: one block set per layer, else one for all */
	/* Fill scores[per_layer ? n_layers : 1][n_blocks]; higher is kept
	 * first. Ties go to the later block. Returns 0 or -errno with kvmem_error. */
	int (*score)(const kvmem_select_ctx *c, float *scores);
} kvmem_policy_ops;

/* NULL + kvmem_error naming the known policies when `name` is unknown.
 * Registered policies are found too. */
const kvmem_policy_ops *kvmem_policy_find(const char *name);
/*
 * Register a policy defined outside the library (a test, a research
 * program): kvmem_policy_find() and kvmem_policy_at() see it from then on,
 * so sessions, the lab (kvmem/lab.h) and the CLI's lists take it by name.
 * The ops must outlive every use. At most KVMEM_POLICY_EXTRA of them; call
 * before sessions run (not thread-safe). -EINVAL for incomplete ops,
 * -EEXIST for a name already taken, -ENOSPC when the table is full.
 */
#define KVMEM_POLICY_EXTRA 32
int kvmem_policy_register(const kvmem_policy_ops *ops);
/* Every policy, the shipped ones then the registered ones: i from 0 up
 * until NULL. */
const kvmem_policy_ops *kvmem_policy_at(int i);

/* ---- plans: what a selection chose --------------------------------------- */
enum kvmem_view_state {
	KVMEM_VIEW_REUSED = 0,	/* was in the previous view */
	KVMEM_VIEW_ENTERING = 1,	/* existed before, was not in the previous view */
	KVMEM_VIEW_NEW = 2,	/* born since the previous plan (its KV is in the tail) */
};

/*
 * One plan: per set (1 for all layers, or one per layer) n_view blocks in
 * chronological order. Block i of set s starts at view slot (its position)
 * start[s * n_view + i]; every set holds view_tokens tokens, and the
 * blocks tile slots [0, view_tokens) without a hole. The compact layout
 * puts them there in chronological order; the stable layout
 * (KVMEM_LAYOUT_STABLE) keeps a block at the slot it had, so its starts
 * are not in order, but the newest block is always last.
 */
typedef struct kvmem_plan {
	int n_sets;
	int64_t n_tokens;	/* history tokens when planned */
	int64_t ws_blocks;	/* history blocks when planned */
	int n_view;		/* blocks per set */
	int64_t view_tokens;	/* tokens per set, <= budget */
	int64_t *blocks;	/* [n_sets][n_view] */
	int64_t *start;		/* [n_sets][n_view] */
	uint8_t *state;		/* [n_sets][n_view] enum kvmem_view_state */
	int64_t *left;		/* [n_sets][left_stride]: blocks that left, chronological */
	int *n_left;		/* [n_sets] */
	int left_stride;	/* the previous plan's n_view */
	/* Totals over sets. */
	int64_t reused, entering, born, n_left_total;
	/* What the mandatory part took (per set): blocks. */
	int n_pinned, n_sink, n_recent, n_scored;
	int newest_dropped;	/* the newest block did not fit the budget */
} kvmem_plan;

/* Share of the plan's sets (1 for a global policy, one per layer otherwise)
 * that hold every block of the token span [start, end); block is B. */
double kvmem_plan_holds_span(const kvmem_plan *p, int block, int64_t start, int64_t end);

/* ---- sessions --------------------------------------------------------- */
struct kvmem_session;

/*
 * Research hooks on the selection path (kvmem/lab.h records a session's
 * selections with them). Each may be NULL; none may call back into the
 * session beyond its const accessors. Per selection: begin, then scored
 * (what the policy was given and the scores it returned, [n_sets][n_blocks],
 * before planning), then planned (the new plan, after the view was
 * rematerialised). ahead: kvmem_session_select_ahead's tokens were run,
 * with the raw queries of all n of them, [n_layers][n][n_heads][head_dim],
 * at positions pos0..pos0+n-1 (the selection that follows uses the last
 * query_tokens of them).
 */
typedef struct kvmem_session_tap {
	void (*begin)(void *arg, const struct kvmem_session *s);
	void (*scored)(void *arg, const struct kvmem_session *s, const kvmem_select_ctx *c,
		       const float *scores, int forced);
	void (*planned)(void *arg, const struct kvmem_session *s, const kvmem_plan *p, int forced);
	void (*ahead)(void *arg, const struct kvmem_session *s, const float *q, int n,
		      int64_t pos0);
	void *arg;
} kvmem_session_tap;

/* How a plan lays its blocks out in the view (kvmem_session_opts.layout). */
enum kvmem_layout {
	KVMEM_LAYOUT_DEFAULT = 0,	/* the KVMEM_LAYOUT environment variable, else
					 * stable; a saved state's own when one is
					 * adopted (kvmem_session_adopt_state) */
	KVMEM_LAYOUT_COMPACT = 1,	/* chronological: every block after one that enters
					 * or leaves shifts */
	KVMEM_LAYOUT_STABLE = 2,	/* a kept block keeps its slot; entering blocks take
					 * freed ones; the recent run last, in order */
};

typedef struct kvmem_session_opts {
	int block;		/* B: power of two 16..256; 0: 32 */
	int64_t budget;		/* history tokens in the view; 0: unlimited */
	int64_t sink;		/* -1: default, max(1, budget / 100) (0 when unlimited) */
	int64_t recent;		/* -1: default, max(1, budget / 12) */
	int64_t reserve;	/* tail slots between selections; -1: default,
				 * max(chunk, budget / 8) rounded up to a block */
	int chunk;		/* prefill chunk; 0: 128; <= the backend's max_chunk */
	int query_tokens;	/* last tokens whose queries drive selection; 0: 4 */
	const char *policy;	/* NULL: "meank" */
	uint64_t seed;		/* random policy, sampling */
	int all_logits;		/* on_forward gets every token's logits */
	/* Rematerialise every view token from raw K at each selection. By
	 * default a token whose slot does not change stays where it is (its K
	 * was rotated from raw K at that very slot: the same bits). */
	int rebuild_all;
	/* Score selections on the host even when the backend can score on
	 * its device (the cuda backend scores meank and subblock there): for
	 * comparisons. */
	int host_scoring;
	/* NULL: pages in host memory. The session does not destroy it. */
	const kvmem_page_source *source;
	/* Called after every forward pass with the tokens run and their
	 * logits ([n][vocab] when all_logits, else the last token's [vocab]):
	 * how a caller runs a full-context twin with the same chunking. The
	 * session's writer thread may still be putting this forward's rows
	 * away: the callback must not call into the session (its index, pages
	 * and query window are the thread's until the session waits for it:
	 * kvmem_session_sync). */
	void (*on_forward)(void *arg, const int32_t *tokens, int n, const float *logits);
	/* Called after every selection with the new plan (forced: the tail was
	 * full mid-append or mid-decode). */
	void (*on_select)(void *arg, const kvmem_plan *plan, int forced);
	void *arg;
	/* Optional research hooks (kvmem_session_tap); not part of the session
	 * state: they change no result. */
	const kvmem_session_tap *tap;
	/* enum kvmem_layout. Stable moves fewer tokens per step; the body's
	 * positions are then no longer chronological. With a budget that
	 * holds the workspace both are the identity layout. (Last: before
	 * 1.0 the public structs grow at their end.) */
	int layout;
} kvmem_session_opts;

void kvmem_session_opts_default(kvmem_session_opts *o);

typedef struct kvmem_session_stats {
	int64_t forwards;	/* forward passes */
	int64_t selections;	/* plans made */
	int64_t forced;		/* of which: the tail was full mid-append/decode */
	int64_t rebuilt_tokens;	/* tokens re-rotated from raw K (moved_tokens included) */
	int64_t kept_tokens;	/* tokens left in place (same slot, same block) */
	int64_t device_scored;	/* selections scored on the backend's device */
	uint64_t index_device_bytes;	/* the backend's copy of the index now */
	/* Where the session's token runs spent their time (not saved with the
	 * state): in the backend's forward (on a GPU: launch, wait, outputs
	 * down); putting a forward's rows away on the session's thread (index
	 * sums, pages, the query window: the writer thread does it instead
	 * for the jobs it takes); and the rest of the session's own work
	 * (the hand-off, commits). A decode step's budget is all three. */
	int64_t forward_ns, store_ns, own_ns;
	/* Rematerialisation's traffic (not saved with the state either):
	 * tokens that stayed in the view but changed slots, moved on the
	 * backend from the raw K it keeps beside the view (no page read; the
	 * rest of rebuilt_tokens came from pages), and the pages got from the
	 * page source to place tokens (a page the backend holds itself, in a
	 * GPU's page pool, is not got). */
	int64_t moved_tokens;
	int64_t source_pages;
	/* The writer thread (not saved either): time it spent putting rows
	 * away, and time the session waited for it (the next forward was
	 * done first: the rows are what bounds the pace). */
	int64_t writer_ns, writer_wait_ns;
	/* The rest of a token run's time, split (not saved either): before
	 * each forward (room in the view, the pages asked for: begin_ns); the
	 * view reserved for a whole append at its start (reserve_ns); the
	 * wait for the last job at the end of an append or a decode, which
	 * nothing overlaps (last_wait_ns, also in writer_wait_ns); starting
	 * the writer thread and its second set of buffers (writer_start_ns).
	 * Of writer_ns: the index sums and the pages (writer_index_ns,
	 * writer_pages_ns). Forwards whose K and V the backend wrote into
	 * their pages itself (page_forwards), whose index summaries it made
	 * (index_forwards). */
	int64_t begin_ns, reserve_ns, last_wait_ns, writer_start_ns;
	int64_t writer_index_ns, writer_pages_ns;
	int64_t page_forwards;
	/* Forwards whose index summaries the backend made (on the device),
	 * not the host from raw K. */
	int64_t index_forwards;
	/* Where selections spent their time (not saved either): scoring every
	 * block, planning the view, moving kept tokens inside it, placing the
	 * rest from pages (the session's walk, the source's pages, the
	 * backend's place calls), and what follows (the view's length, the
	 * source's hints). */
	int64_t score_ns, plan_ns, move_ns, place_ns, select_after_ns;
	/* Batched decode steps whose logits stayed on the backend (a greedy
	 * draw needs only their argmax, which came back), and how many of
	 * them were fetched later (kvmem_session_logits, a sampled draw, a
	 * saved state, the view given up). Not saved either. */
	int64_t lazy_logits, lazy_fetches;
	/* Draws at a temperature that a batched step made beside its logits
	 * and a draw took (kvmem_session_draw_with). Not saved either. */
	int64_t lazy_draws;
} kvmem_session_stats;

typedef struct kvmem_session kvmem_session;

/* NULL + kvmem_error on bad options. The backend (and the model under it)
 * must outlive the session; one session uses a backend at a time. */
kvmem_session *kvmem_session_create(kvmem_backend *b, const kvmem_session_opts *o);
void kvmem_session_free(kvmem_session *s);

/* Prefill tokens in chunks, each chunk attending to the current view (the
 * selected history and the tail so far) plus itself. pin: pin the span.
 * When the tail is full the session selects again and goes on. */
int kvmem_session_append(kvmem_session *s, const int32_t *tokens, int64_t n, int pin);
int kvmem_session_pin(kvmem_session *s, int64_t start, int64_t end);
int kvmem_session_unpin(kvmem_session *s, int64_t start, int64_t end);
/*
 * Take over a history already in the page source (a reopened workspace):
 * n token ids whose raw K / V pages the source holds. Only on a session
 * that has run nothing. The index is rebuilt from the pages and a first
 * selection (no queries yet: sink, recent and the latest blocks) lays out
 * the view, so the next append attends to it. Decoding needs an append
 * first (there are no logits yet).
 */
int kvmem_session_adopt(kvmem_session *s, const int32_t *tokens, int64_t n);
/*
 * Session state: what the running session had at a commit point beyond its
 * history (token ids and pages): the plan in force, pins, where the tail
 * sits, the window of recent raw queries, the last logits, the sampling RNG
 * and the counters. kvmem_session_save_state() writes it into a malloc'd
 * buffer (free() it): versioned, checksummed, with the model geometry and
 * the options that shape results (block, budget, sink, recent, reserve,
 * chunk, query tokens, policy, seed). Fails on a broken session.
 *
 * kvmem_session_adopt_state() is kvmem_session_adopt() that restores that state
 * instead of making a fresh selection: the view is rebuilt from the pages
 * slot for slot (K rotated from raw K at the same slots, V copied, the tail
 * too), so the session goes on bit for bit as the one that saved it did. A
 * state that is corrupt, of another version, of another model, of other
 * options or of another history is refused with -ESTALE (the message names
 * what differs, beginning "session state:") before anything is touched: the
 * session is still fresh and may kvmem_session_adopt() instead. A page that
 * cannot be read (another code: -EIO, -EBADMSG) leaves it broken.
 *
 * A fresh session whose view was given up first (kvmem_session_release_view
 * right after kvmem_session_create) adopts a state and stays given up: the
 * token ids and the state are taken in (kvmem_session_tokens is the
 * history's length at once), but the index (from every page's raw K) and
 * the view wait for kvmem_session_restore_view or its steps (below), so
 * that a server reopening a conversation spreads that work over several
 * rounds. kvmem_session_adopt() on such a session lays its (empty) view
 * out first.
 */
int kvmem_session_save_state(const kvmem_session *s, void **buf, size_t *len);
int kvmem_session_adopt_state(kvmem_session *s, const int32_t *tokens, int64_t n,
			    const void *state, size_t len);
/*
 * An idle session's view given up and laid out again (kvmem serve's idle
 * conversations). kvmem_session_release_view frees the view on the
 * backend (its device or host memory) and the session's buffers of one
 * forward pass; the pages stay in the page source (host pool, disk) and
 * the session keeps where every token of the view sat. Until
 * kvmem_session_restore_view, a call that runs the session (append,
 * select, decode, the batched calls) fails with -EINVAL; reading it
 * (tokens, plan, logits, save_state) works, and kvmem_session_view_len is
 * 0. kvmem_session_restore_view rebuilds every slot from the pages (K
 * rotated from raw K at its slot, V copied), as kvmem_session_adopt_state
 * does, never by running the model: the session then goes on bit for bit
 * as one that kept its view. Both are no-ops when there is nothing to do;
 * a page that cannot be read leaves the session broken.
 */
int kvmem_session_release_view(kvmem_session *s);
int kvmem_session_restore_view(kvmem_session *s);
/*
 * A lighter rest between turns: the session's host buffers of one forward
 * pass (its raw K, V and query rows) and its writer thread with the
 * writer's second set go back to the backend, once the rows in flight are
 * put away; the view stays. At the 8B geometry with chunks of 1024 that is
 * four pinned buffers of 75 MB, which an open conversation otherwise keeps
 * between its turns (the cuda backend hands them to the next session that
 * asks, unpinned only past KVMEM_CUDA_HOST_KEEP). The next call that runs
 * the session takes them again, and it goes on bit for bit as one that
 * kept them. A no-op on a session without them (idle already, view given
 * up) and on one laying a selection out in steps (kvmem_session_select_step);
 * -errno when the rows in flight could not be put away or the session is
 * unusable after an earlier failure.
 */
int kvmem_session_idle(kvmem_session *s);
/*
 * The same, `layers` layers a call (every slot of a layer from its pages;
 * after an adoption into a released session, first its history's index,
 * 32 blocks a call): 1 while work is left, 0 once the view is whole (and a
 * no-op then), or -errno (-EINVAL for layers < 1). The session stays given up until
 * the last call, so a server lays one conversation's view out over several
 * rounds while the others decode in between; the result is
 * kvmem_session_restore_view's, bit for bit.
 */
int kvmem_session_restore_view_step(kvmem_session *s, int layers);
/* 1 while the view is given up. */
int kvmem_session_view_released(const kvmem_session *s);
/*
 * Room in the view for `more` tokens beyond those it holds, as far as the
 * view may grow (budget + reserve), made now: a server claims a turn's
 * memory before it runs the turn, where appends in chunks grow the view
 * chunk by chunk. -ENOMEM when the backend cannot (its memory cap, or the
 * device full); the session is then as it was.
 */
int kvmem_session_reserve(kvmem_session *s, int64_t more);
/* Step boundary: score with the last query tokens, plan, rematerialise. */
int kvmem_session_select(kvmem_session *s);
/*
 * The same selection laid out over several calls: the first scores, plans
 * and makes the moves inside the view, and each places `layers` layers of
 * the blocks that enter (read from the page source, K rotated at its
 * slot); the last puts the plan in force. 1 while layers are left, 0 once
 * the selection is made (at once when there is nothing to select), or
 * -errno (-EINVAL for layers < 1). Until then a call that runs the session
 * (append, select, decode, release_view, the batched calls) fails with
 * -EBUSY, and kvmem_session_view_len is the old view's. A server makes one
 * conversation's selection a slice a round while the others decode in
 * between; the result is kvmem_session_select's, bit for bit. A failure
 * part way leaves the session broken, as kvmem_session_select's does.
 */
int kvmem_session_select_step(kvmem_session *s, int layers);
/*
 * Step boundary for tokens about to be appended (a question): run them over
 * the current view only to take their queries (their K/V are dropped), select
 * with the last query_tokens of them, rematerialise. The caller then appends
 * the same tokens, whose logits are then computed over the new view.
 * n is 1..chunk.
 */
int kvmem_session_select_ahead(kvmem_session *s, const int32_t *tokens, int n);
/* Generate n tokens into out (sampler NULL: greedy) with the view frozen;
 * when the tail is full, select again and go on. Logits holding NaN or an
 * infinity are refused (-ERANGE), never sampled. The last token's rows may
 * still be on their way to the history (the session's writer thread) when
 * it returns: see kvmem_session_sync. */
int kvmem_session_decode(kvmem_session *s, int n, const kvmem_sampler *smp, int32_t *out);
/* The next token drawn from the last logits as kvmem_session_decode draws
 * it (smp NULL: greedy; a sampled draw advances the session's random
 * state), without running it: for a caller that looks at the token (a stop,
 * a stop string) before it appends it, as a server does. Prefer it to
 * kvmem_session_logits and a sampler of one's own: a batched step's greedy
 * draw is made beside its logits, where they stay (see the batched steps
 * below). -ERANGE for NaN or infinite logits, -EINVAL before any. */
int kvmem_session_draw(kvmem_session *s, const kvmem_sampler *smp, int32_t *out);
/* What a draw takes beyond its sampler (kvmem_session_draw_with). */
typedef struct kvmem_draw_opts {
	uint64_t *rng;		/* the random state a draw at a temperature advances by
				 * one value; NULL: the session's own */
	const int32_t *banned;	/* ids never drawn, as if their logits were -inf (a
				 * benchmark's ignore_eos: the stop tokens); may be NULL */
	int n_banned;
} kvmem_draw_opts;
/* kvmem_session_draw with the caller's random state and ids never drawn (o
 * NULL: the session's state, none): the token kvmem_sample draws from the
 * last logits with the banned ids at -inf. A session remembers its last
 * draw at a temperature: its next batched decode step, on a backend that
 * keeps logits beside the view (cuda), draws there with the same settings,
 * banned ids and the state this draw left, and the next call with those
 * takes that token (the same one: kernels/draw_fixed.h) with no pass over
 * logits on the host. KVMEM_SESSION_DEVICE_DRAW=0 turns that off. */
int kvmem_session_draw_with(kvmem_session *s, const kvmem_sampler *smp, const kvmem_draw_opts *o,
			    int32_t *out);
/*
 * A decode step (kvmem_session_decode, and the batched calls below) returns
 * while its last rows may still be on their way to the history (page
 * source, index, query window) on the session's writer thread, so that
 * they are put away while the next step's forward computes. The session
 * waits for them itself wherever it reads the history: the next step,
 * kvmem_session_select, kvmem_session_save_state (so
 * kvmem_workspace_commit: nothing is committed before its rows are
 * written), kvmem_session_index, kvmem_session_release_view,
 * kvmem_session_free. kvmem_session_append waits at its end. A caller
 * that reads or commits the page source itself calls this first: 0, or
 * the error that broke the session (a write that failed after the step
 * returned is reported here, or by the next call).
 */
int kvmem_session_sync(kvmem_session *s);

/*
 * Batched steps: many sessions on one backend run their next tokens in one
 * forward pass, each over its own view (the tokens of one session attend
 * only to its own selected history and tail). Every weight is read once
 * for the batch, which is what makes serving many conversations faster
 * than one after another (Documentation/serve.md, "Batching").
 *
 * Batch invariance: each session gets the tokens, logits, views and
 * history bits it would get from the same calls made alone
 * (kvmem_session_append of the same tokens, kvmem_session_decode of one
 * token), whatever else is in the batch and at any thread count. So
 * replay, persistence and the exactness invariant hold in a batch too.
 *
 * Each session's state machine stays its own: a session whose tail is
 * full selects first (its own cost, in the call), its rows go to its own
 * writer (and may still be on their way when the call returns:
 * kvmem_session_sync), a failure is its item's alone (rc, err) and leaves
 * the others' results standing. A backend without a batched forward
 * runs the items one after another: the same results, no speed-up.
 *
 * A session that draws greedily (kvmem_session_decode_batch, or
 * kvmem_session_draw with no sampler) and did not ask for its last logits
 * (kvmem_session_logits) has a batched decode step's logits left on the
 * backend (the cuda backend: beside the view on the device), with only
 * their greedy draw brought back; they come to the host when something
 * asks for them (kvmem_session_logits, a sampled draw, a saved state, the
 * view given up): the same bits, later. At 64 sessions of Qwen3's
 * vocabulary a step then moves 256 bytes of draws instead of 39 MB of
 * logits (issue #26). KVMEM_SESSION_LAZY_LOGITS=0 turns it off;
 * kvmem_session_stats.lazy_logits counts it.
 */
typedef struct kvmem_batch_item {
	kvmem_session *s;
	const int32_t *tokens;	/* the tokens to append */
	int n;			/* 1..the session's chunk: one forward pass */
	/* results */
	int rc;			/* 0, or -errno */
	char err[256];		/* kvmem_last_error() of a failed item */
} kvmem_batch_item;

/*
 * Append each item's tokens to its session, all in one forward pass (as
 * kvmem_session_append(s, tokens, n, 0) would, one after another). The
 * sessions must be distinct and on one backend (else -EINVAL and nothing
 * runs). Returns how many items failed (each says why), 0 when none did.
 */
int kvmem_session_append_batch(kvmem_batch_item *items, int n);
/*
 * One decode step of each of n distinct sessions on one backend, in one
 * forward pass: session i draws its next token from its last logits with
 * smp[i] (smp NULL or smp[i] NULL: greedy) and its own random state, as
 * kvmem_session_decode(s[i], 1, smp[i], &out[i]) does, and runs it. rc
 * (may be NULL) gets each session's 0 or -errno. Returns how many failed
 * (kvmem_last_error() says why the last one did), or -EINVAL for bad
 * arguments (nothing runs).
 */
int kvmem_session_decode_batch(kvmem_session *const *s, int n, const kvmem_sampler *const *smp,
			       int32_t *out, int *rc);

int64_t kvmem_session_tokens(const kvmem_session *s);
const int32_t *kvmem_session_token_ids(const kvmem_session *s);
/* The plan in force (n_view 0 before the first selection). */
const kvmem_plan *kvmem_session_plan(const kvmem_session *s);
/* The scores of the last selection, [n_sets][n_blocks] (n_sets: 1, or the
 * layers for a per-layer policy); NULL before any. For research tools: how
 * a block ranked, whether or not the budget let it in. */
const float *kvmem_session_scores(const kvmem_session *s, int *n_sets, int64_t *n_blocks);
/* Slots of the view in use: the selected history and the tail (every
 * backend). */
int64_t kvmem_session_view_len(const kvmem_session *s);
const kvmem_backend *kvmem_session_backend(const kvmem_session *s);
/* Logits of the last token run, [vocab]; NULL before any, or when they
 * could not be fetched from the backend (a batched greedy decode step
 * leaves them beside the view until they are asked for; kvmem_error says
 * why). Valid until the session's next call. */
const float *kvmem_session_logits(const kvmem_session *s);
const kvmem_index *kvmem_session_index(const kvmem_session *s);
const kvmem_policy_ops *kvmem_session_policy(const kvmem_session *s);
/* The options in force, defaults resolved (budget 0 stays 0: unlimited). */
const kvmem_session_opts *kvmem_session_options(const kvmem_session *s);
void kvmem_session_get_stats(const kvmem_session *s, kvmem_session_stats *st);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif

/* SPDX-License-Identifier: MIT */
/*
 * The policy lab: record a session's selections once, replay any selection
 * and replacement policy over them offline. Documentation/lab.md tells the
 * story, Documentation/formats.md ("Lab trace") has the file format.
 *
 *   record   a recorder hooks a session (kvmem_session_tap) and its page
 *            source: per selection the raw queries (fp32), the select
 *            context's parameters, the pins, the plan, and every page read
 *            with its tier; span annotations (a needle) from the caller.
 *   replay   over the workspace directory the session left (its raw K) and
 *            the trace, with no model: rebuild the index at any block size,
 *            run any policy at any budget, plan, compare with the
 *            attention-mass oracle, simulate any replacement policy at any
 *            host-pool size, model the step time from bandwidths.
 *
 * Replay with the live policy, budget and block size gives the live plans
 * bit for bit (the index is rebuilt from the same fp32 raw K in the same
 * token order; an f32 workspace is needed for that, the CPU default).
 * Replay is open loop: the queries are those the live session computed over
 * its own views, whatever policy is replayed.
 */
#ifndef KVMEM_LAB_H
#define KVMEM_LAB_H

#include <stdint.h>

#include "kvmem/model.h"
#include "kvmem/pager.h"
#include "kvmem/session.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with -fvisibility=hidden: what is declared here is its API. */
#pragma GCC visibility push(default)

#define KVMEM_LAB_TRACE_VERSION 1

/* Span annotations a recorder may attach to the next selection. */
enum kvmem_lab_span_kind {
	KVMEM_LAB_SPAN_NEEDLE = 1,	/* what the step must bring into view (a needle line) */
	KVMEM_LAB_SPAN_QUERY = 2,	/* tokens of the step's own input whose queries a
					 * replay may select with (a question's key) */
};

/* Where a page read was served from. */
enum kvmem_lab_tier {
	KVMEM_LAB_MEM = 0,	/* the source's memory: a memory source, or a partial block */
	KVMEM_LAB_HOST = 1,	/* the pager's host pool (a hit) */
	KVMEM_LAB_STAGE = 2,	/* a miss served from the stage-out buffer */
	KVMEM_LAB_NVME = 3,	/* a miss read from the workspace's pages file */
	KVMEM_LAB_TIERS = 4,
};

/* Why a page was read. */
enum kvmem_lab_why {
	KVMEM_LAB_SCORE = 0,	/* the policy read keys to score (refine, oracle) */
	KVMEM_LAB_VIEW = 1,	/* rematerialising the view */
	KVMEM_LAB_OTHER = 2,	/* anything else: adopting a history, restoring a view */
};

/* ---- recording ----------------------------------------------------------- */
typedef struct kvmem_lab_recorder kvmem_lab_recorder;

typedef struct kvmem_lab_record_opts {
	const char *label;	/* free text stored in the header (what made it); NULL: "" */
	/* The pager behind the session's source, when there is one: each page
	 * read's tier comes from its counters. NULL: every read is KVMEM_LAB_MEM. */
	kvmem_pager *pager;
} kvmem_lab_record_opts;

/*
 * Create the trace file `path` (replacing one that is there) for sessions of
 * model m. The recorder is attached to a session's options before the
 * session is created; one session per recorder.
 */
int kvmem_lab_record_open(const char *path, const kvmem_model *m, const kvmem_lab_record_opts *o,
			  kvmem_lab_recorder **out);
/*
 * Hook the session options o: o->tap becomes the recorder's and o->source
 * the recorder's wrapper of it (reads counted with their tier; NULL: the
 * recorder makes the in-memory source itself, as a session would). The
 * live options (budget, block, policy...) are stored with the first record.
 */
int kvmem_lab_record_attach(kvmem_lab_recorder *r, kvmem_session_opts *o);
/* Annotate [start, end) (token positions) for the next selection. label may
 * be NULL (up to 255 bytes kept). */
int kvmem_lab_record_span(kvmem_lab_recorder *r, int kind, int64_t start, int64_t end,
			  const char *label);
/*
 * Write the end record and close the file (made durable). Returns 0, or the
 * first error since open (-EIO, -ENOSPC: the trace is then incomplete and
 * a replay refuses it). Frees r either way; the session must be gone.
 */
int kvmem_lab_record_close(kvmem_lab_recorder *r);
/* Bytes written so far and selections recorded. */
uint64_t kvmem_lab_record_bytes(const kvmem_lab_recorder *r);
int64_t kvmem_lab_record_steps(const kvmem_lab_recorder *r);

/*
 * Write the history a page source holds (tokens ids[0..n), their raw K/V
 * pages) into dir as a new workspace (absent or empty), committed, in the
 * dtype of dtype (0: f32): how a session over host memory (the recall
 * bench) leaves a workspace a replay reads.
 */
int kvmem_lab_save_workspace(const char *dir, const kvmem_model *m, int block, uint32_t dtype,
			     const kvmem_page_source *src, const int32_t *ids, int64_t n);

/* ---- the trace ------------------------------------------------------------ */
/* What the header and the end record of a trace say. */
typedef struct kvmem_lab_trace_info {
	uint32_t version;
	uint64_t fingerprint;
	int n_layers, n_heads, n_kv_heads, head_dim, vocab, window;
	double rope_theta;
	/* The live session's options (resolved). */
	int block, chunk, query_tokens;
	int64_t budget, sink, recent, reserve;
	uint64_t seed;
	char policy[32];
	char label[64];
	/* Counts. */
	int64_t steps;		/* selections */
	int64_t spans, reads;	/* annotations; page reads */
	uint64_t bytes;		/* the file */
	uint64_t query_bytes;	/* of which raw queries */
	int64_t max_tokens;	/* history tokens at the last selection */
} kvmem_lab_trace_info;

/* Read and check a whole trace: -EBADMSG (corrupt, truncated, not a trace),
 * -ESTALE (another format version), naming the file. */
int kvmem_lab_trace_info_read(const char *path, kvmem_lab_trace_info *ti);

/* ---- replay --------------------------------------------------------------- */
typedef struct kvmem_lab kvmem_lab;

/*
 * A workspace directory and a trace recorded over it, loaded for replay:
 * token ids and every token's raw K (fp32, L·Hkv·D·4 bytes a token) in
 * memory, the trace checked whole. -ESTALE when the trace belongs to another
 * model or geometry than the workspace (naming both), -EBADMSG for a corrupt
 * or truncated trace, -ENOENT/-EBADMSG/... from the workspace. The trace
 * may refer to at most the workspace's tokens.
 */
int kvmem_lab_open(const char *ws_dir, const char *trace_path, kvmem_lab **out);
void kvmem_lab_close(kvmem_lab *lab);
const kvmem_lab_trace_info *kvmem_lab_info(const kvmem_lab *lab);
int64_t kvmem_lab_tokens(const kvmem_lab *lab);
const int32_t *kvmem_lab_token_ids(const kvmem_lab *lab);

/* Bandwidths of the step-time model, bytes per second. */
typedef struct kvmem_lab_bw {
	double nvme;	/* pages file -> host pool */
	double link;	/* host -> the view (PCIe to a GPU; a memory copy for the CPU) */
	double mem;	/* host memory read by scoring (index, keys) */
} kvmem_lab_bw;

/* Measure this machine: memory copy bandwidth, and reads of `file` (a
 * workspace's pages; NULL: none, nvme = 0) with O_DIRECT where it works,
 * at most `max_bytes`. link = mem. Not deterministic: give fixed values
 * for reproducible step times. */
int kvmem_lab_measure_bw(const char *file, uint64_t max_bytes, kvmem_lab_bw *bw);

typedef struct kvmem_lab_params {
	const char *policy;	/* NULL: the live one */
	int block;		/* 0: the live one; any power of two 16..256 */
	int64_t budget;		/* 0: the live one; -1: unlimited */
	/* -1: the live value at the live budget, the session's default
	 * (budget/100, budget/12) at another; reserve -1: the live one. */
	int64_t sink, recent, reserve;
	/* Queries that drive the replayed selection: 0, the recorded ones;
	 * N > 0: the last N of those recorded (a select-ahead records all of
	 * its tokens); query_span 1: the tokens of the step's
	 * KVMEM_LAB_SPAN_QUERY annotation (the recorded ones where there is none). */
	int query_tokens, query_span;
	const char *cache_policy;	/* replacement policy; NULL: "lru" */
	uint64_t host_cap;		/* host pool bytes; 0: 256 MiB (the pager's default) */
	kvmem_lab_bw bw;		/* for the step time (0: that term is left out) */
	int no_oracle;			/* skip the oracle comparison (it reads every key) */
	int rank_top;			/* keep the rank_top best blocks per step (0: none) */
	int keep_plans;			/* keep every step's plan and scores */
} kvmem_lab_params;

void kvmem_lab_params_default(kvmem_lab_params *p);

/* One replayed selection. Block counts are at the replay's block size. */
typedef struct kvmem_lab_step {
	int64_t step;		/* the live selection count */
	int64_t n_tokens, n_blocks;
	int forced;
	int n_sets, n_view;	/* block sets and blocks per set */
	int64_t view_tokens;
	/* Against the oracle's plan at the same budget (NaN when not computed):
	 * share of the oracle's blocks selected (mean over sets), share of the
	 * oracle's attention mass the selection holds, and the oracle's own. */
	double overlap, mass, oracle_mass;
	/* The step's needle annotation, if any: share of sets holding all of
	 * it, and its rank (blocks scored above its worst block, mean over
	 * sets); -1 when there is none. */
	double needle_in_view;
	int64_t needle_rank, needle_start, needle_end;
	/* Page reads, per why (KVMEM_LAB_SCORE, KVMEM_LAB_VIEW) and tier,
	 * simulated with the replacement policy; bytes are whole pages. */
	int64_t pages[2][KVMEM_LAB_TIERS];
	double bytes[2][KVMEM_LAB_TIERS];
	int64_t reused, entering, born;	/* the plan's diff, summed over sets */
	double time_s;			/* modelled */
	int live_equal;		/* 1: the plan is the recorded one, 0: it differs,
				 * -1: not comparable (other policy, budget, block, queries) */
	int64_t *top;		/* [rank_top] best blocks, best first (set 0), or NULL */
	int64_t *blocks;	/* keep_plans: [n_sets][n_view] the plan, chronological */
	float *scores;		/* keep_plans: [n_sets][n_blocks] the policy's scores */
} kvmem_lab_step;

typedef struct kvmem_lab_result {
	int64_t n_steps;
	kvmem_lab_step *steps;
	const kvmem_policy_ops *policy;
	int block;
	int64_t budget, sink, recent, reserve;
	double page_bytes;	/* one page at the replay's block size, K+V, the workspace's dtype */
	/* Over all steps. */
	double overlap, mass, oracle_mass;	/* means over steps (NaN: not computed) */
	int64_t needles;			/* steps with a needle */
	double needle_in_view;			/* share of those */
	int64_t needle_rank_median;		/* -1: no needle */
	int64_t pages[2][KVMEM_LAB_TIERS];
	double bytes[2][KVMEM_LAB_TIERS];
	int64_t hits, misses;			/* host pool, over full-block reads */
	double hit_rate;			/* hits / (hits + misses); NaN when none */
	double time_s;				/* modelled, summed */
	int64_t live_compared, live_equal;	/* steps compared with the recording, equal */
	int64_t first_diff;			/* first step whose plan differs, -1: none */
	/* The recording's own page reads, per why and tier (what the live
	 * pager said). */
	int64_t live_pages[3][KVMEM_LAB_TIERS];
} kvmem_lab_result;

/*
 * Replay every recorded selection with p. Deterministic: the same inputs
 * give the same numbers (the step time too, for the same bandwidths).
 * -EINVAL for bad parameters (an unknown policy names the known ones), a
 * plan the budget cannot hold (pins), naming the step.
 */
int kvmem_lab_replay(kvmem_lab *lab, const kvmem_lab_params *p, kvmem_lab_result *r);
void kvmem_lab_result_free(kvmem_lab_result *r);

/*
 * Where a needle (tokens [start, end)) ranks in a selection's block scores
 * (n_sets rows of n_blocks, as kvmem_session_scores gives them; block
 * tokens per block): per set, the blocks scored above the needle's
 * worst-scored block; the mean over sets, rounded. 0: first, whatever the
 * budget. A needle partly past the scored blocks ranks by its scored part;
 * -1 when none of it is scored.
 */
int64_t kvmem_lab_needle_rank(const float *scores, int n_sets, int64_t n_blocks, int block,
			      int64_t start, int64_t end);

/* ---- view layouts: what a step would move (issue 24) ----------------------- */
/*
 * How a view could lay out the blocks a plan selects, and what each layout
 * costs per selection: the token-layers already in the view (its history or
 * its tail) whose RoPE position changes, which a backend must move and
 * rotate again, against those placed from pages. Documentation/lab.md says
 * what each layout does and what the traces measured.
 *
 *   compact  today: positions 0..n-1 in chronological order, slot ==
 *            position (user/select/plan.c); a block entering or leaving
 *            shifts every later one.
 *   stable   a kept block keeps its position; entering blocks (and kept
 *            blocks that can not stay) take freed block-aligned holes, in
 *            no order; the recent blocks (the plan's run of blocks in the
 *            last `recent` tokens, the newest with them) are laid last,
 *            chronologically, so the tail follows them. Positions in
 *            [0, budget).
 *   gaps     chronological positions in a span of view + (F - 1) x budget:
 *            the most tokens that can keep their positions (a kept set
 *            whose neighbours' entering blocks fit between them: the
 *            heaviest non-decreasing run of old minus compact position,
 *            exact per step), the others where a straight map of their
 *            tokens onto the free room between their kept neighbours puts
 *            them (the room after the last kept block left to the tail).
 *            F = 1 is compact.
 *
 * Positions are what count: a layout other than compact needs view slots
 * apart from positions (gaps) or positions out of order (stable).
 */
enum kvmem_lab_layout_kind {
	KVMEM_LAB_COMPACT = 0,
	KVMEM_LAB_STABLE = 1,
	KVMEM_LAB_GAPS = 2,
};

typedef struct kvmem_lab_layout {
	int kind;
	double span;		/* gaps: F >= 1 */
	char name[32];		/* as parsed: "compact", "stable", "gaps:1.5" */
} kvmem_lab_layout;

/* "compact", "stable" or "gaps:F" (F >= 1, a number); -EINVAL naming s. */
int kvmem_lab_layout_parse(const char *s, kvmem_lab_layout *out);

/* One selection under one layout, in token-layers (a token of one layer). */
typedef struct kvmem_lab_layout_count {
	int64_t moved;		/* in the view before, at another position now */
	int64_t entered;	/* not in the view before: placed from its pages */
	int64_t kept;		/* left where it was */
	int64_t view;		/* the new view's history: moved + entered + kept */
	int64_t span;		/* positions the history spans (largest over sets) */
} kvmem_lab_layout_count;

typedef struct kvmem_lab_layout_sim kvmem_lab_layout_sim;

/*
 * A view laid out with lay, starting empty (the first selection finds its
 * history in the view's tail at positions 0..n-1, as a session's first
 * does). block: tokens per block; budget: the plan's budget in tokens (0:
 * unlimited); recent: the plan's recent tokens; n_layers: the model's.
 */
int kvmem_lab_layout_open(const kvmem_lab_layout *lay, int block, int64_t budget, int64_t recent,
			  int n_layers, kvmem_lab_layout_sim **out);
/*
 * The next selection: its plan's blocks ([n_sets][n_view], chronological
 * per set, as kvmem_plan.blocks) over n_tokens history tokens. Tokens
 * appended since the previous selection are in the view's tail, after the
 * previous history. n_sets is 1 (every layer alike) or n_layers, the same
 * at every step. -EINVAL when the plan is not one (naming what is wrong).
 */
int kvmem_lab_layout_step(kvmem_lab_layout_sim *s, const int64_t *blocks, int n_sets, int n_view,
			  int64_t n_tokens, kvmem_lab_layout_count *c);
void kvmem_lab_layout_close(kvmem_lab_layout_sim *s);

/* Every step of a replay kept with keep_plans, under lay: out[r->n_steps]. */
int kvmem_lab_layout_replay(const kvmem_lab_result *r, int n_layers, const kvmem_lab_layout *lay,
			    kvmem_lab_layout_count *out);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif

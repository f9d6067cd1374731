/* SPDX-License-Identifier: MIT */
/*
 * Selection from the inside: the block registry, the index's layout, the
 * policy table and the view planner (user/select/). Private to the library
 * and the in-tree programs; what a policy author sees is kvmem/session.h.
 *
 *   blocks    the registry over the token history: block size B, the partial
 *             last block, pinned spans
 *   index     per (block, layer, KV head) the Mean-K of raw K in fp32, kept
 *             right at every token (the partial block too); min/max and
 *             sub-block means when the policy asks for them
 *   plan      the planner: sink + pins + recent + top-scored blocks up to
 *             the budget, and the diff against the previous plan
 */
#ifndef KVMEM_SELECT_H
#define KVMEM_SELECT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "kernels/kernels_bf16.h"
#include "kvmem/session.h"

/* ---- blocks ----------------------------------------------------------- */
typedef struct kvmem_span {
	int64_t start, end;	/* token positions [start, end) */
} kvmem_span;

typedef struct kvmem_blocks {
	int block;		/* tokens per block B, a power of two 16..256 */
	int shift;		/* log2(B) */
	int64_t n_tokens;	/* tokens in the history */
	kvmem_span *pins;		/* sorted, disjoint, non-adjacent */
	int n_pins, cap_pins;
} kvmem_blocks;

/* block 0 means KVMEM_BLOCK_DEFAULT. */
int kvmem_blocks_init(kvmem_blocks *r, int block);
void kvmem_blocks_free(kvmem_blocks *r);
/* Pin [start, end): every view holds the blocks it overlaps. The span may
 * reach past n_tokens (an append in progress); the part past the history is
 * ignored until the tokens exist. Overlapping pins merge. */
int kvmem_blocks_pin(kvmem_blocks *r, int64_t start, int64_t end);
/* Remove [start, end) from the pinned spans. */
int kvmem_blocks_unpin(kvmem_blocks *r, int64_t start, int64_t end);
/* Tokens the pinned blocks hold when the history has n_tokens tokens
 * (whole blocks, the partial last one at its length). */
int64_t kvmem_blocks_pinned_tokens(const kvmem_blocks *r, int64_t n_tokens);

static inline int64_t kvmem_blocks_count(const kvmem_blocks *r)
{
	return (r->n_tokens + r->block - 1) >> r->shift;
}
static inline int64_t kvmem_block_start(const kvmem_blocks *r, int64_t b)
{
	return b << r->shift;
}
/* Tokens in block b now: B, or fewer for the partial last block. */
static inline int kvmem_block_len(const kvmem_blocks *r, int64_t b)
{
	int64_t left = r->n_tokens - (b << r->shift);

	return left >= r->block ? r->block : (left > 0 ? (int)left : 0);
}
static inline int64_t kvmem_block_of(const kvmem_blocks *r, int64_t pos)
{
	return pos >> r->shift;
}

/* ---- index ------------------------------------------------------------ */
struct kvmem_index {
	int n_layers, n_kv_heads, head_dim, block;
	int sub_len;		/* tokens per sub-block: block / KVMEM_SUBBLOCKS */
	unsigned sums;		/* KVMEM_SUM_* kept */
	int64_t n_tokens, n_blocks, cap_blocks;
	/* Layer-major so that one (layer, KV head) is one contiguous run over
	 * all blocks: scoring streams it once. */
	float *meank;		/* [L][H][cap_blocks][D] */
	float *kmin, *kmax;	/* [L][H][cap_blocks][D]   (KVMEM_SUM_MINMAX) */
	float *sub;		/* [L][H][cap_blocks][KVMEM_SUBBLOCKS][D] (KVMEM_SUM_SUBBLOCK) */
	float *open_sum;	/* [L][H][D] running sum of the block being filled */
	float *open_sub;	/* [L][H][D] running sum of the sub-block being filled */
};

int kvmem_index_init(kvmem_index *ix, int n_layers, int n_kv_heads, int head_dim, int block,
		   unsigned sums);
void kvmem_index_free(kvmem_index *ix);
/* Make room for n_blocks (used by the benchmark to synthesise an index). */
int kvmem_index_reserve(kvmem_index *ix, int64_t n_blocks);
/* Account n new tokens: raw_k is [n_layers][n][n_kv_heads][head_dim] (the
 * engine's kvmem_fwd_out layout). Sums run in token order in fp32, so the
 * result does not depend on how tokens were split into calls. */
int kvmem_index_append(kvmem_index *ix, const float *raw_k, int n);
/* The same from typed rows: raw_k in dtype KVMEM_DTYPE_F32 or
 * KVMEM_DTYPE_BF16 (a GPU's rows, widened one head row at a time, which
 * is exact: the bits of kvmem_index_append over the widened rows). */
int kvmem_index_append_rows(kvmem_index *ix, const void *raw_k, uint32_t dtype, int n);
/* Account n new tokens whose summaries were made elsewhere (a GPU's, the
 * same arithmetic: kvmem_fwd_index), laid out as the arrays with nb blocks
 * a run from the first new token's block; kmin / kmax and sub are read only
 * when the index keeps them. Only what those tokens wrote is copied (a
 * partial first block's earlier quarter-block means stay). */
int kvmem_index_put(kvmem_index *ix, const float *meank, const float *kmin, const float *kmax,
		    const float *sub, const float *open_sum, const float *open_sub, int n);
/* The running state before the next token, for a backend that goes on
 * summing: the open sums ([L][H][D]) and, when the last block is partial
 * and min/max are kept, its min / max so far (lo, hi may be NULL). */
void kvmem_index_state(const kvmem_index *ix, float *sum, float *sub, float *lo, float *hi);

/* ---- policies ---------------------------------------------------------- */
/* A device that scores with the host scorers' arithmetic (the session's
 * backend, through its score op): fills scores[g->n_blocks] for `scorer`
 * ("meank", "subblock") with the group queries gq, or returns -ENOTSUP
 * (score on the host) or another -errno with kvmem_error. */
struct kvmem_score_device {
	int (*score)(void *arg, const char *scorer, const float *gq, const kvmem_score_geom *g,
		     float *scores);
	void *arg;
};
typedef struct kvmem_score_device kvmem_score_device;

/* NULL-terminated table of every shipped policy (user/select/policy.c). */
extern const kvmem_policy_ops *const kvmem_policies[];

/* ---- view planner ----------------------------------------------------- */
typedef struct kvmem_plan_params {
	int64_t budget;		/* history tokens the view may hold */
	int64_t sink;		/* the first `sink` tokens' blocks */
	int64_t recent;		/* the last `recent` tokens' blocks (the newest
				 * block is claimed first in any case) */
	int layout;		/* enum kvmem_layout: KVMEM_LAYOUT_STABLE, else compact */
} kvmem_plan_params;

/* scores: [n_sets][kvmem_blocks_count(r)]; prev may be NULL or an empty plan.
 * Fails (plan untouched) when the pinned blocks alone pass the budget.
 * The stable layout reads where the view's tokens are now from prev, as a
 * session keeps them: prev's blocks at their starts, the tokens appended
 * since (from prev->n_tokens on) in the tail at prev->view_tokens +
 * (position - prev->n_tokens); prev NULL: all of them in the tail. */
int kvmem_plan_build(kvmem_plan *p, const kvmem_blocks *r, const float *scores, int n_sets,
		   const kvmem_plan *prev, const kvmem_plan_params *pp);
void kvmem_plan_free(kvmem_plan *p);
#endif

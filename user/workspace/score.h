/* SPDX-License-Identifier: MIT */
/*
 * Helpers shared by the selection policies (private to user/workspace).
 *
 * Scores that combine over heads, layers and query tokens are estimated
 * attention masses: for one "pair" (a layer and a head, and for some
 * policies a query token) each item (a block or sub-block) gets a logit z
 * with the log of its token count added; softmax(z) over all items is that
 * pair's unit of attention shared out, and shares add up over pairs.
 * Documentation/policies.md explains why.
 */
#ifndef KVMEM_WORKSPACE_SCORE_H
#define KVMEM_WORKSPACE_SCORE_H

#include <stdint.h>

#include "kvmem/workspace.h"

/* out[i] = q . m[i*d .. i*d+d-1] for i < n, serially, in a fixed summation
 * order: the same bits on every machine and for every vector width. */
void ws_dots(float *out, const float *q, const float *m, int64_t n, int d);

/*
 * Distance-averaged RoPE. A query at position p and a key at p - t score
 * q_rot(p) . k_rot(p - t) = q . R(-t) k on the raw vectors. With t uniform
 * over 0..span-1 (where the key may land in the view) the expected logit
 * is q . M k, M = mean of R(-t): per rotary pair i a scaled rotation with
 *   C_i = mean cos(w_i t),  S_i = mean sin(w_i t),  w_i = theta^(-2i/D).
 * ws_rope_mean(c, x) replaces x by M^T x (in place, one head_dim vector),
 * so that x . k is that expected logit for any raw key k. Slow pairs keep
 * C ~ 1 (they barely turn within a window: the position-stable, content
 * dimensions); fast pairs average to ~0 and stop adding noise to scores.
 * span 0: identity.
 */
void ws_rope_mean(const kvmem_select_ctx *c, float *x);

/* out[d] = the mean, over the step's query tokens and the query heads of KV
 * head g's group, of the queries of layer l, distance-averaged
 * (ws_rope_mean): the logit is linear in the query, so the mean query's
 * logit is the mean of the heads' and tokens' logits. */
void ws_group_query(const kvmem_select_ctx *c, int l, int g, float *out);

/*
 * Exact per-token scoring from the real keys: for each layer, query head
 * and query token, the query (distance-averaged) against every key of the
 * n blocks `blocks` (any order, each once), a softmax over those keys, and
 * each block's share added to mass[i] (i: the block's place in `blocks`).
 * mass must hold n zeros or earlier sums. Reads K pages through c->keys.
 * Deterministic for any thread count. Returns 0 or -1 + kvmem_error.
 */
int ws_token_mass(const kvmem_select_ctx *c, const int64_t *blocks, int64_t n, double *mass);

/*
 * Rearrange the block numbers idx[0..n) so that the k best by scores sc
 * come first, in no particular order: higher score first, ties to the
 * later block, NaN lowest. The planner's order (plan.c), for a policy that
 * needs the blocks the planner would take.
 */
void ws_top_k(int64_t *idx, int64_t n, int64_t k, const float *sc);

/* Fill z[0 .. i1-i0) with the log-weights of items i0..i1-1 of `pair`
 * (-INFINITY: no weight). Called from several threads at once. */
typedef void (*ws_logit_fn)(const void *arg, int pair, int64_t i0, int64_t i1, float *z);

/*
 * For each of n_pairs pairs, softmax over n_items items (per items per
 * block) of the logits fn gives, summed per block and added, pair by pair
 * in order, to scores[row[pair] * (n_items / per) + block] (row NULL: 0).
 * Work runs in fixed chunks of items in a few parallel regions, so the
 * result does not depend on the thread count. Returns 0 or -1 (memory).
 */
int ws_mass(float *scores, int64_t n_items, int per, int n_pairs, const int *row,
	    ws_logit_fn fn, const void *arg);

/* Softmax scale of the model's attention: 1/sqrt(head_dim). */
float ws_scale(const kvmem_select_ctx *c);

/* log(len), or -INFINITY for an empty item. */
float ws_log_len(int len);

#endif

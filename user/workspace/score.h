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

/* out[d] = the mean, over the step's query tokens and the query heads of KV
 * head g's group, of the raw queries of layer l. */
void ws_group_query(const kvm_select_ctx *c, int l, int g, float *out);

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
float ws_scale(const kvm_select_ctx *c);

/* log(len), or -INFINITY for an empty item. */
float ws_log_len(int len);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * Helpers shared by the selection policies (private to user/select and its users).
 *
 * The arithmetic of scoring (dots in a fixed order, distance-averaged RoPE
 * on the queries, softmax masses over blocks) lives in kernels/cpu/score.c,
 * the CPU twins of the GPU scorers (kernels/kernels_bf16.h); the
 * policies here gather their inputs from the session's index and page source
 * and call it. Documentation/policies.md explains the scores.
 */
#ifndef KVMEM_WORKSPACE_SCORE_H
#define KVMEM_WORKSPACE_SCORE_H

#include <stdint.h>

#include "kernels/kernels_bf16.h"
#include "select/select.h"

/* The scorers' geometry of a selection context: the index's blocks (fp32),
 * the newest block's length and its quarters'. */
void ws_score_geom(const kvmem_select_ctx *c, kvmem_score_geom *g);

/* Score on c->device when there is one: 0 (scores filled), -ENOTSUP (score
 * on the host) or another -errno with kvmem_error. */
int ws_device_score(const kvmem_select_ctx *c, const char *scorer, const float *gq,
		    const kvmem_score_geom *g, float *scores);

/* The group queries of every (layer, KV head), [L * H_kv][head_dim],
 * distance-averaged (kvmem_group_queries); malloc'd, NULL + kvmem_error. */
float *ws_group_queries(const kvmem_select_ctx *c);

/*
 * Exact per-token scoring from the real keys: for each layer, query head
 * and query token, the query (distance-averaged) against every key of the
 * n blocks `blocks` (any order, each once), a softmax over those keys, and
 * each block's share added to mass[i] (i: the block's place in `blocks`).
 * mass must hold n zeros or earlier sums. Reads K pages through c->keys and
 * hands each layer to kvmem_token_mass. Deterministic for any thread count.
 */
int ws_token_mass(const kvmem_select_ctx *c, const int64_t *blocks, int64_t n, double *mass);

/*
 * Neighbour expansion: each of the top k blocks of scores[nb] (the
 * planner's order) has its predecessor and successor raised to just below
 * its own score, unless they rank higher already. raise_top 0 (neighbour's
 * rule) also leaves alone a neighbour that is among the top k itself,
 * which the raised blocks may then push out of the top k when k is a large
 * share of nb; raise_top 1 (lexical's) raises it too. k <= 0: nothing. 0,
 * or -ENOMEM with kvmem_error.
 */
int ws_expand_neighbours(float *scores, int64_t nb, int64_t k, int raise_top);

/*
 * base's scores, expanded: each of its top budget / B blocks brings its two
 * neighbours (ws_expand_neighbours with raise_top); no budget: base's scores
 * as they are. The policies neighbour, meank_neighbour and subblock_neighbour
 * are this over refine, meank and subblock. Errors name `name`.
 */
int ws_score_with_neighbours(const kvmem_policy_ops *base, const kvmem_select_ctx *c,
			     float *scores, int raise_top, const char *name);


#endif

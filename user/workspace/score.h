/* SPDX-License-Identifier: MIT */
/*
 * Helpers shared by the selection policies (private to user/workspace).
 *
 * Scores that combine over heads, layers and query tokens are estimated
 * attention masses: for one (layer, head) a block's logit z (with the log of
 * its token count added) becomes softmax(z) over all blocks, a share of one
 * unit of attention; shares then add up over heads, layers and tokens.
 * Documentation/policies.md explains why.
 */
#ifndef KVMEM_WORKSPACE_SCORE_H
#define KVMEM_WORKSPACE_SCORE_H

#include <stdint.h>

#include "kvmem/workspace.h"

/* out[i] = q . m[i*d .. i*d+d-1] for i < n (fixed summation order, so the
 * result is the same on every machine and thread count). */
void ws_dots(float *out, const float *q, const float *m, int64_t n, int d);

/* out[d] = the mean, over the step's query tokens and the query heads of KV
 * head g's group, of the raw queries of layer l. */
void ws_group_query(const kvm_select_ctx *c, int l, int g, float *out);

/* z[i] holds log-weights of n items (-INFINITY: no weight), `per`
 * consecutive items per block; adds softmax(z) summed per block to
 * scores[n / per]. z is overwritten. Deterministic for any thread count. */
void ws_add_mass(float *scores, float *z, int64_t n, int per);

/* Softmax scale of the model's attention: 1/sqrt(head_dim). */
float ws_scale(const kvm_select_ctx *c);

/* log(tokens) of block b, or of sub-block s of it (-INFINITY when empty). */
float ws_log_len(int len);

#endif

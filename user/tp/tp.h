/* SPDX-License-Identifier: MIT */
/*
 * Tensor parallelism: a model split by KV heads across N ranks (GPUs), and
 * a CPU reference of the split forward pass.
 *
 * The split (Megatron's, as vLLM, SGLang and TensorRT-LLM lay it out for a
 * GQA decoder) gives rank r of N a contiguous run of KV heads and the query
 * heads that attend to them, and a contiguous run of the MLP's intermediate
 * units:
 *
 *   q_proj, k_proj, v_proj   column-parallel: rank r holds the output rows
 *                            of its heads ([rows][hidden] in the model's
 *                            [out][in] layout: a contiguous block);
 *   o_proj                   row-parallel: the input columns of its query
 *                            heads ([hidden][cols]: a strided block);
 *   gate_proj, up_proj       column-parallel: intermediate rows ff0..;
 *   down_proj                row-parallel: intermediate columns ff0..;
 *   norms, embedding, lm_head replicated.
 *
 * Each rank computes a partial o_proj (and down_proj) output over the whole
 * hidden width from its own heads (units); a sum all-reduce of those
 * partials gives every rank the same residual update, so the residual
 * stream, the norms and the logits are the same on every rank. A rank's
 * view holds only its KV heads, and so do its pages and its share of the
 * Mean-K index: block scores are sums over heads, so a sum all-reduce of
 * the ranks' partial scores gives every rank the same selection.
 *
 * Refused, with a message saying which N would do: N < 1, N > KVMEM_TP_MAX,
 * KV heads or intermediate size not divisible by N.
 */
#ifndef KVMEM_TP_H
#define KVMEM_TP_H

#include <stdint.h>

#include "engine/engine.h"
#include "kvmem/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVMEM_TP_MAX 64		/* ranks: more GPUs than any one host has */

/* What rank `rank` of `n_ranks` holds. Rows and columns are in elements of
 * the model's [out][in] matrices (kvmem_layer). */
typedef struct kvmem_tp_rank {
	int rank, n_ranks;
	int kv_head0, n_kv_heads;	/* KV heads kv_head0.. (its view's heads) */
	int head0, n_heads;		/* query heads head0.. (GQA: the ones
					 * reading its KV heads) */
	int q_row0, q_rows;		/* q_proj rows: head0 * head_dim.. */
	int kv_row0, kv_rows;		/* k_proj, v_proj rows */
	int o_col0, o_cols;		/* o_proj columns (= the q rows) */
	int ff0, n_ff;			/* gate_proj, up_proj rows; down_proj columns */
	/* Parameters the rank holds: its slices plus every replicated tensor
	 * (embedding, norms, lm_head once when tied). */
	uint64_t params;
	/* Its view's KV bytes per token at elem_bytes 2 (bf16 raw K + V):
	 * the model's divided by n_ranks. */
	uint64_t kv_bytes_per_token;
} kvmem_tp_rank;

/* Check that c splits into n_ranks: 0, or -EINVAL with a message naming
 * what does not divide and the n that would. */
int kvmem_tp_check(const kvmem_config *c, int n_ranks);
/* Fill *out for rank `rank` of n_ranks: 0 or -EINVAL (as kvmem_tp_check, or
 * a rank outside 0..n_ranks-1). */
int kvmem_tp_plan(const kvmem_config *c, int n_ranks, int rank, kvmem_tp_rank *out);

/*
 * The CPU reference of a TP=N forward pass: N simulated ranks, each with
 * its slices of the weights and its own KV cache (its KV heads only), and
 * a sum all-reduce between them, in one thread of control.
 *
 * The all-reduce sums the ranks' partials in rank order, 0 first, into
 * rank 0's buffer, and the sum is then added to the residual stream:
 * x += ((p0 + p1) + p2) + ... . With one rank that is x += p0, the engine's
 * kvmem_add, and every other op is the engine's call on the same
 * arguments, so TP=1 is bit-identical to kvmem_forward(). With N > 1 the
 * projections sum over a rank's slice only and the partials are summed
 * afterwards: fp32 rounding differs from TP=1 (tests/unit/test_tp_forward.c
 * states the tolerance). NCCL's ring and tree all-reduce sum in orders of
 * their own, so GPU ranks agree with this reference to that tolerance, not
 * bit for bit.
 */
typedef struct kvmem_tp_engine kvmem_tp_engine;

/* An engine of n_ranks ranks for m (which must outlive it), for chunks of
 * up to max_chunk tokens. NULL + kvmem_error on a refused split or no
 * memory. Row-parallel slices (o_proj, down_proj) are packed copies; the
 * rest point into m. With one rank nothing is copied. */
kvmem_tp_engine *kvmem_tp_engine_create(const kvmem_model *m, int n_ranks, int max_chunk);
void kvmem_tp_engine_free(kvmem_tp_engine *e);
int kvmem_tp_engine_ranks(const kvmem_tp_engine *e);
const kvmem_tp_rank *kvmem_tp_engine_rank(const kvmem_tp_engine *e, int r);

/* The model's config with rank r's KV heads and query heads: what its
 * kvmem_kvcache_init() takes. */
kvmem_config kvmem_tp_rank_config(const kvmem_config *c, const kvmem_tp_rank *r);

/*
 * kvmem_forward() over the ranks: kv[r] is rank r's cache (made from
 * kvmem_tp_rank_config; the same len in every rank), and each grows by n.
 * logits, all_logits and out as kvmem_forward's, in the full model's
 * layout: raw K, V and raw queries of every rank gathered at their heads.
 * Fails (-EINVAL, nothing changed) as kvmem_forward does, or when the
 * ranks' caches disagree in length.
 */
int kvmem_tp_forward(kvmem_tp_engine *e, kvmem_kvcache *const *kv, const int32_t *tokens,
		     int n, float *logits, int all_logits, const kvmem_fwd_out *out);

/*
 * Selection under the split (tp_score.c): rank r's rows of an index array
 * laid out [n_layers][n_kv_heads][run] (run floats per (layer, KV head):
 * cap_blocks * head_dim for Mean-K, 4x that for sub-block means; gq is
 * the same with run = head_dim) into dst [n_layers][r->n_kv_heads][run].
 */
void kvmem_tp_index_shard(float *dst, const float *src, const kvmem_tp_rank *r, int n_layers,
			  int n_kv_heads, size_t run);
/*
 * The reference of device scoring over N ranks: each rank scores its shard
 * of the fp32 index (scorer "meank" or "subblock", the host scorers of
 * kernels_bf16.h), then the partial scores are summed in rank order (the
 * all-reduce that makes every rank select the same blocks). g and gq are
 * the whole model's, as for kvmem_score_meank. 0, -EINVAL, -ENOMEM.
 */
struct kvmem_score_geom;
int kvmem_tp_score(float *scores, const char *scorer, const float *index, const float *gq,
		   const struct kvmem_score_geom *g, const kvmem_config *c, int n_ranks);

#ifdef __cplusplus
}
#endif
#endif

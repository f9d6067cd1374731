/* SPDX-License-Identifier: MIT */
/*
 * The CPU reference engine: a Qwen3 decoder forward pass over a KV view.
 *
 * The engine does not own history. The caller hands it a kvmem_kvcache — the
 * execution view: per layer, K (rotated) and V of the tokens the new ones may
 * attend to, at compact positions 0..len-1 — and the forward pass appends the
 * new tokens at positions len..len+n-1. For a plain run the cache simply
 * grows; the workspace layer instead rebuilds it each step from raw K.
 *
 * What the workspace needs back from each forward pass is returned in
 * kvmem_fwd_out: the raw K (after k-norm, before RoPE) and V of the new tokens
 * per layer, and optionally their queries (after q-norm, before RoPE), of
 * every new token or of the last few.
 */
#ifndef KVMEM_ENGINE_H
#define KVMEM_ENGINE_H

#include <stdint.h>

#include "kvmem/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvmem_kvcache {
	int n_layers, n_kv_heads, head_dim;
	int cap;		/* token slots per layer and head */
	int len;		/* tokens present (same in every layer) */
	float *k;		/* [n_layers][n_kv_heads][cap][head_dim], rotated at slot index */
	float *v;		/* [n_layers][n_kv_heads][cap][head_dim] */
} kvmem_kvcache;

int kvmem_kvcache_init(kvmem_kvcache *kv, const kvmem_config *c, int cap);
void kvmem_kvcache_free(kvmem_kvcache *kv);
/* Pointer to K (or V) of layer l, KV head h, slot t. */
static inline float *kvmem_kv_k(const kvmem_kvcache *kv, int l, int h, int t)
{
	return kv->k + (((size_t)l * kv->n_kv_heads + h) * kv->cap + t) * kv->head_dim;
}
static inline float *kvmem_kv_v(const kvmem_kvcache *kv, int l, int h, int t)
{
	return kv->v + (((size_t)l * kv->n_kv_heads + h) * kv->cap + t) * kv->head_dim;
}

/* Optional outputs of a forward pass; any pointer may be NULL. */
/*
 * Where a forward pass puts the index's summaries of its n tokens
 * (kvmem_fwd_out.index; a backend whose ops have index_rows: cuda, the
 * sums made on the device from its own raw K by kernels/cuda/index.cu, the
 * twin of the host index's arithmetic, so the same bits). Host memory
 * (pinned: the backend's host_alloc), for the nb = (first % block + n - 1)
 * / block + 1 blocks from first's: meank, and kmin / kmax and sub when not
 * NULL, laid out as the index's arrays with nb blocks a run ([L][H][nb][D];
 * sub [L][H][nb][4][D]); and the running sums after the last token
 * (open_sum; open_sub with sub; [L][H][D]). The backend keeps the running
 * state (the sums, the partial block's min/max) from one call to the next
 * of one key (the caller: a session's owner); a call with fresh set takes
 * it from in_sum, in_sub and, when first % block, in_min / in_max ([L][H][D]
 * each) instead. A call that is not fresh must follow the key's last call.
 */
typedef struct kvmem_fwd_index {
	float *meank, *kmin, *kmax, *sub, *open_sum, *open_sub;
	const float *in_sum, *in_sub, *in_min, *in_max;
	int64_t first;
	int block, fresh;
	uint32_t key;
} kvmem_fwd_index;

typedef struct kvmem_fwd_out {
	float *raw_k;	/* [n_layers][n][n_kv_heads][head_dim]: after k-norm, before RoPE */
	float *v;	/* [n_layers][n][n_kv_heads][head_dim] */
	float *q_raw;	/* [n_layers][rows][n_heads][head_dim]: after q-norm, before RoPE */
	/* Queries of the last q_last tokens only (rows = q_last, packed, the
	 * first of them at row 0 of each layer): a session keeps only a few,
	 * and a chunk's queries are most of what a forward pass returns
	 * (Qwen3-8B: 32 query heads to 8 KV heads). 0 or >= n: every
	 * token's (rows = n). Negative: the call fails. */
	int q_last;
	/* Typed rows (a backend whose rows_dtype is bf16: cuda): raw K and V
	 * as the device computed them, [n_layers][n][n_kv_heads][head_dim]
	 * bf16, in place of raw_k / v (which must then be NULL). Host memory
	 * from the backend's host_alloc, so the device copies straight into
	 * it; nothing is widened. The cpu engine takes only raw_k / v. */
	uint16_t *raw_k_bf16, *v_bf16;
	/* Pages (a backend whose ops have page_rows: cuda): every layer's raw
	 * K and V written, bf16, straight into the pages of the blocks the n
	 * tokens fall in, host memory (pinned: a pager's host pool slots):
	 * pages[l * page_blocks + i] is layer l's page of the i-th of those
	 * blocks ([2][n_kv_heads][page_block][head_dim], formats.md), the
	 * first token at page_t0 of block 0; page_blocks = (page_t0 + n - 1)
	 * / page_block + 1. Nothing else of a page changes. v_bf16 may then be
	 * NULL (V is not wanted as rows), raw_k_bf16 too. NULL: no pages.
	 * page_dtype KVMEM_DTYPE_FP8 (a backend whose ops have page_rows_fp8
	 * too): fp8 pages instead (K bytes, V bytes, K and V scales: formats.md),
	 * each row quantised as kvmem_fp8_quant_row does; else bf16. */
	void *const *pages;
	int page_t0, page_block;
	uint32_t page_dtype;
	/* The index's summaries, made by the backend (see kvmem_fwd_index):
	 * raw K need not come down for them (raw_k_bf16 may then be NULL when
	 * pages are written too). NULL: none. */
	const kvmem_fwd_index *index;
} kvmem_fwd_out;

/* Rows of q_raw per layer that a forward pass of n tokens writes. */
static inline int kvmem_fwd_q_rows(const kvmem_fwd_out *o, int n)
{
	return o && o->q_last > 0 && o->q_last < n ? o->q_last : n;
}

typedef struct kvmem_engine kvmem_engine;

/* An engine for `m` with scratch for chunks of up to max_chunk tokens. */
kvmem_engine *kvmem_engine_create(const kvmem_model *m, int max_chunk);
void kvmem_engine_free(kvmem_engine *e);
const kvmem_model *kvmem_engine_model(const kvmem_engine *e);
/* How each new token's raw K and V are rounded (enum kvmem_kv_round,
 * kernels_fp8.h) before K is rotated and both are stored and attended to.
 * KVMEM_KV_ROUND_FP8: the view holds fp8 KV, rounded through e4m3 with
 * their row scales (kvmem_fp8_roundtrip_rows); the others are the cpu
 * backend's research knob KVMEM_CPU_KV_ROUND. The raw rows handed back in
 * kvmem_fwd_out stay unrounded (the index is built from them, the page
 * source quantises them into the same bytes). */
void kvmem_engine_set_kv_round(kvmem_engine *e, int mode);
/* Multiply by bf16 copies of the model's matmul weights (on, the default:
 * made once, where every such weight is a bf16 value, as a bf16
 * checkpoint's fp32 copies are) or by fp32 copies (off, or weights that
 * are not bf16), both packed in panels (kernels/cpu/matmul_panels.c) where
 * they take at most an eighth of the machine's memory, else the model's
 * row-major weights. The same bits every way; bf16 reads half the bytes.
 * Returns whether bf16 copies are used. */
int kvmem_engine_use_bf16_weights(kvmem_engine *e, int on);
/* Whether the matmuls read the bf16 copies now (1) or fp32 weights (0). */
int kvmem_engine_bf16_weights(const kvmem_engine *e);

/*
 * Run n (<= max_chunk) tokens through the model. They take slots
 * kv->len..kv->len+n-1 (their positions) and kv->len grows by n; fails if
 * that would pass kv->cap. logits: [n][vocab] when all_logits, else [vocab]
 * for the last token only; may be NULL.
 *
 * The new tokens attend to slots 0..kv->len+n-1 causally (slot index is the
 * position). The K stored at slot s is kvmem_rope() of a copy of the raw K at
 * position s, so a caller that rebuilds a view from stored raw K (rotating
 * each at its new slot with kvmem_rope) and V gets bit-identical results to
 * the cache the engine grew itself. Slots at and past kv->len are never
 * read. Fails (-1, nothing changed) on a token outside the vocabulary, a
 * cache of another geometry, n out of range, a negative out->q_last or no
 * room.
 * One engine serves one caller at a time (its scratch is shared); the
 * matmuls and attention inside use several threads. It is
 * kvmem_forward_batch() of one sequence.
 */
int kvmem_forward(kvmem_engine *e, kvmem_kvcache *kv, const int32_t *tokens, int n,
		float *logits, int all_logits, const kvmem_fwd_out *out);

/*
 * A batched forward: one pass over several sequences, each its n tokens
 * (1..max_chunk) at the end of its own view, as kvmem_forward would run
 * them alone. The rows of every sequence go through each matmul together
 * (every weight read once for the batch); each sequence attends only to
 * its own view. A sequence's views, logits and outputs have the very bits
 * that kvmem_forward gives it alone (batch invariance: kvmem_matmul's rows
 * and kvmem_attention's queries do not depend on their neighbours), so
 * batching changes timing, never results. Two sequences must not share a
 * view. Fails (nothing changed) as kvmem_forward does, on any sequence.
 */
typedef struct kvmem_fwd_seq {
	kvmem_kvcache *kv;
	const int32_t *tokens;
	int n;
	float *logits;			/* as kvmem_forward's; NULL: not wanted */
	int all_logits;
	const kvmem_fwd_out *out;	/* NULL: none */
} kvmem_fwd_seq;

int kvmem_forward_batch(kvmem_engine *e, const kvmem_fwd_seq *seqs, int n_seqs);

#ifdef __cplusplus
}
#endif
#endif

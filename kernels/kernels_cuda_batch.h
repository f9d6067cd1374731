/* SPDX-License-Identifier: MIT */
/*
 * The batched attention on CUDA (kernels/cuda/attention_batch.cu): several
 * sequences' queries in one launch, each over its own bf16 view, as a
 * batched forward runs a layer for many sessions. The CPU twin is
 * kvmem_attention_bf16 of each sequence alone (kernels_bf16.h), which
 * widens and runs kvmem_attention; the CPU engine's own batched op is
 * kvmem_attention_batch (kernels.h), with the same kind of argument.
 *
 * Batch invariance: a sequence's output bits depend only on its own
 * queries, keys, values and positions, never on the other sequences, their
 * number or order: its keys are split into runs of a fixed length
 * (KVMEM_CUDA_ATT_BATCH_KEYS) whatever the batch, each run's partial
 * softmax is computed by one warp in key order, and the runs are combined
 * in order. tests/gpu/check_attn_batch.c checks it bit for bit (a sequence
 * alone against the same in a batch) and against the twin.
 *
 * The cuda backend's batched forward (user/backend/cuda_fwd_batch.c) runs
 * its decode items' attention through it, a launch per layer.
 */
#ifndef KVMEM_KERNELS_CUDA_BATCH_H
#define KVMEM_KERNELS_CUDA_BATCH_H

#include "kernels/kernels_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Keys of one split: a sequence of n_kv keys takes ceil(n_kv / this)
 * warps per (query, head). */
#define KVMEM_CUDA_ATT_BATCH_KEYS 256

/* One sequence: rows q0..q0+n_q-1 of q and out ([rows][n_heads][head_dim]),
 * every array a device pointer. */
typedef struct kvmem_cuda_att_seq {
	int q0, n_q;
	const int32_t *q_pos;		/* [n_q] */
	const uint16_t *k, *v;		/* bf16 [n_kv_heads][kv_stride][head_dim] */
	const int32_t *kv_pos;		/* [n_kv], or NULL: slot j is position j */
	int n_kv;
	long long kv_stride;
	/* fp8 views (kvmem_cuda_att_dec_batch only): k and v hold e4m3 bytes
	 * [n_kv_heads][kv_stride][head_dim], these their row scales
	 * [n_kv_heads][kv_stride]; NULL for bf16. */
	const float *k_scale, *v_scale;
} kvmem_cuda_att_seq;

/*
 * out = attention of every sequence's queries over its own view (query i
 * sees key j iff kv_pos[j] <= q_pos[i]; a query that sees no key gets
 * zeros). seqs is a host array (copied into the context's scratch, so the
 * call is not for a stream capture); head_dim a multiple of 32 up to 256.
 * -EINVAL for a bad shape, -ENOMEM / -EBUSY for scratch.
 */
int kvmem_cuda_attention_batch(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
			       const kvmem_cuda_att_seq *seqs, int n_seqs, int n_heads,
			       int n_kv_heads, int head_dim, float scale);

/*
 * The main path's decode kernel (attention.cu, v5) over n sequences in
 * one launch (per DEC_CNT / n_kv_heads sequences), each with n_q * group
 * <= 16 and n_q > 0; seqs: n host pointers; head_dim 64 or 128
 * (-ENOTSUP otherwise). Each sequence's bits are those of
 * kvmem_cuda_attention_bf16_v(c, 5, ...) on it alone. Called by
 * kvmem_cuda_attention_batch, which checks the shapes.
 *
 * fp8 views (every sequence with k_scale and v_scale; a mix is -EINVAL):
 * the register form of kvmem_cuda_attention_decode_fp8, each sequence's
 * bits those of that call on it alone (its key count on the host here);
 * -ENOTSUP where that call would not take the form (KVMEM_CUDA_FP8_REG=0,
 * or n_q * group over 8). The cuda backend's batched forward over fp8
 * views calls it directly.
 */
int kvmem_cuda_att_dec_batch(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
			     const kvmem_cuda_att_seq *const *seqs, int n, int n_heads,
			     int n_kv_heads, int head_dim, float scale);
/* 1 when the main path's decode attention is v5 (not overridden by
 * KVMEM_CUDA_DECODE): a batched decode then has a lone decode's bits. */
int kvmem_cuda_att_decode_is_v5(const kvmem_cuda_ctx *c);
/* 1 when a decode over fp8 views of `rows` rows a KV head (queries x
 * group) takes the register form, as kvmem_cuda_att_dec_batch runs it for
 * fp8 sequences. */
int kvmem_cuda_att_decode_fp8_reg(const kvmem_cuda_ctx *c, int rows);

#ifdef __cplusplus
}
#endif

#endif

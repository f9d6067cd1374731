/* SPDX-License-Identifier: MIT */
/*
 * The batched attention (kernels/cuda/attention_batch.cu) in
 * kvmem_gpu_check: against its twin and against itself (batch invariance),
 * then its time beside the one-sequence decode called once per sequence
 * (--attn-batch: the checks, then the timing).
 */
#ifndef KVMEM_TESTS_GPU_CHECK_ATTN_BATCH_H
#define KVMEM_TESTS_GPU_CHECK_ATTN_BATCH_H

/* Random batches (1 to 12 sequences; 0 to 4 queries each; 0 to 3000 keys
 * of odd strides, some at split boundaries; shuffled key positions in some;
 * head_dim 64 and 128; GQA 1, 4, 8): every sequence within the twin's
 * tolerance, and bit for bit the same alone, in the batch and in the batch
 * reversed. */
void check_attn_batch(void);
/* check_attn_batch(), then decode (one query per sequence) at the Qwen3-8B
 * geometry at 1, 8 and 64 sequences of 4096 keys and of mixed lengths:
 * the batched launch against one main-path decode call per sequence, and
 * the K/V bytes read per second. */
void attn_batch_sweep(void);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * Prefill attention (kernels/cuda/attention.cu v4, attention_wgmma.cu v6)
 * in kvmem_gpu_check: both against the CPU twin, and the timing sweep that
 * tests/gpu/attn_prefill.sh runs (--attn-prefill).
 */
#ifndef KVMEM_TESTS_GPU_CHECK_ATTN_PREFILL_H
#define KVMEM_TESTS_GPU_CHECK_ATTN_PREFILL_H

/* v4 and v6 against the twin on fresh random inputs: a chunk at the start
 * of the view (n == keys, causal), chunks at the end of longer views,
 * row and key counts that are not tile multiples, a warpgroup with no
 * rows, GQA 32/8 and 64/8, MHA, a sharp softmax, and shapes v6 hands to
 * v4 (head_dim 64, explicit key positions); within Documentation/
 * kernels.md's tolerance and a relative L2 error under 1e-2; v6 run again
 * gives the same bits; each again with the split combine a block a row
 * ("combine_block", the form before 2026-12-06): the same bits as its warp
 * a row (a short prompt's chunk, 33 splits among the shapes). */
void check_attn_prefill(void);
/* check_attn_prefill(), then (not under --quick) the bf16 GEMM rate and
 * v4 against v6 at 4096 x 4096 causal, 16384 x 16384 causal, a 4096 and a
 * 512 chunk at the end of a 32768-key view (Qwen3-8B: 32/8 heads, head_dim
 * 128): milliseconds, TFLOP/s and the fraction of the GEMM rate, with v6's
 * output checked against v4's at each. */
void attn_prefill_sweep(void);

/* Both check v6 in each of its forms that KVMEM_V6_FORMS lists ("0,2,4":
 * indices of kernels/cuda/attention_wgmma.cu's v6_forms; the main form
 * alone when unset), switched by this hook of attention_wgmma.cu. */
int kvmem_cuda_attention_v6_form(int form);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * The one-row GEMM (kernels/cuda/gemv.cu) in kvmem_gpu_check: its checks
 * against the CPU twin for each kernel (the first one and the split-K one),
 * and the decode sweep that tests/gpu/gemv_sweep.sh runs (--gemv).
 */
#ifndef KVMEM_TESTS_GPU_CHECK_GEMV_H
#define KVMEM_TESTS_GPU_CHECK_GEMV_H

/* Odd and Qwen3 shapes, every mode, each kernel: "ok"/"FAIL" lines. */
void check_gemv(void);
/* check_gemv(), then (not under --quick) the decode shapes of Qwen3-8B
 * (qkv, o_proj, gate|up, down, lm_head):
 * every kernel and split against the twin on fresh random inputs, the
 * bit-for-bit relations between them, a graph replay, then their times
 * (graphs of 36 launches over weights larger than the L2, and single
 * launches) against the copy rate measured in the same run. */
void gemv_sweep(void);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * The GEMM of a batched decode step (kvmem_cuda_gemv_rows_bf16, gemv.cu)
 * in kvmem_gpu_check --attn-batch: each row bit for bit the one-row GEMM
 * on it alone, then its time beside n one-row calls.
 */
#ifndef KVMEM_TESTS_GPU_CHECK_GEMV_ROWS_H
#define KVMEM_TESTS_GPU_CHECK_GEMV_ROWS_H

/* Random x, w (and y for the add mode) at Qwen3-8B's layer shapes and odd
 * ones, 1 to 64 rows, the three output modes: every row's bits equal
 * kvmem_cuda_gemm_bf16 of that row alone; an unaligned input refused. */
void check_gemv_rows(void);
/* A layer's four GEMMs at the 8B geometry for 1, 16 and 64 rows: the rows
 * kernel against one lone call per row, and the weight bytes per second. */
void gemv_rows_sweep(void);
/* The tensor-core GEMM alone at each 8B layer shape, 1/16/64 rows, every
 * split ks and tiles a warp mt forced in turn: weights GB/s (a rule's
 * measurement, kvmem_gpu_check --gemm-tc-shapes). */
void gemm_tc_shape_sweep(void);
/* The batched decode's q/k norm + RoPE + scatter over rows of many views
 * (1-24 rows, 32/8 x 128, 8/2 x 64, 4/4 x 128, random slots and
 * capacities, raw K kept or not): bit for bit the one-row entry per row
 * (check_qk_rows.c). */
void check_qk_rows(void);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * The tensor-core GEMM for few rows (kvmem_cuda_gemm_tc_bf16, gemm_tc.cu)
 * in kvmem_gpu_check --gemm-tc: against its CPU twin within a stated
 * tolerance, its rows bit for bit whatever the batch, then the decode
 * GEMMs' timings with it and with the CUDA-core kernels it replaces.
 */
#ifndef KVMEM_TESTS_GPU_CHECK_GEMM_TC_H
#define KVMEM_TESTS_GPU_CHECK_GEMM_TC_H

/* Fresh random x, w (and y for the add mode) at the 8B layer shapes and
 * odd ones (inputs not a multiple of 32, outputs not of 16), 1-72 rows,
 * the three modes: every element within |d| <= 1e-4 sum|x w| (+ one bf16
 * ulp in the bf16 mode) of kvmem_gemm_bf16 (the CPU twin: OpenBLAS fp32);
 * row r bit for bit the same for n = 1, 7, 16, 64, 72, with the rows
 * reversed and with one weight tile a warp forced; with "gemm_tc" on, kvmem_cuda_gemv_rows_bf16's rows bit for bit
 * the lone one-row GEMM's (check_gemv_rows); bad arguments refused; the
 * fused norm + GEMM (+ SwiGLU) of a lone step on it bit for bit the unfused
 * ops at every split (check_gemm_tc_fused). */
void check_gemm_tc(void);
void check_gemm_tc_fused(void);
/* A layer's four 8B GEMMs at 1/16/64 rows, "gemm_tc" off, on with one
 * weight tile a warp, on by n (gemv_rows_sweep three times). */
void gemm_tc_sweep(void);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * GEMMs of many rows on one algorithm (kvmem_cuda_tune "gemm_pin",
 * gemm.cu) in kvmem_gpu_check --gemm-pin: what batched prefill across
 * conversations needs (issue #26). At the 8B layer shapes, a GEMM of 1024
 * rows, then slices of it (a prompt's 206 rows, 300, 2, 3, 513) each
 * alone: every row bit for bit the same as among the 1024, with the
 * algorithm pinned (checked; cuBLASLt's pick for each n is reported
 * beside it, as information: it may differ), then the four GEMMs' times
 * at 32, 206 and 1024 rows pinned at 256 and 1024 rows and unpinned.
 */
#ifndef KVMEM_TESTS_GPU_CHECK_GEMM_PIN_H
#define KVMEM_TESTS_GPU_CHECK_GEMM_PIN_H

void check_gemm_pin(void);

#endif

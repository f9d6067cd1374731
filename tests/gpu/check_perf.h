/* SPDX-License-Identifier: MIT */
/*
 * The checks and timings of the engine's fast paths (check_perf.c), run by
 * kvmem_gpu_check: decode attention with the key count on the device and
 * its CUDA graph replays (bit for bit the plain calls), attention v4, the
 * fused q/k norm + RoPE, the one-row GEMV, the GPU index append and the
 * 16-byte-load scorer.
 */
#ifndef KVMEM_TESTS_GPU_CHECK_PERF_H
#define KVMEM_TESTS_GPU_CHECK_PERF_H

#include <stdint.h>

#include "kvmem/cuda.h"

/* One "ok"/"FAIL" line per case; counts into *pass / *fail. */
void check_perf(kvmem_cuda_ctx *c, int quick, uint64_t seed, int *pass, int *fail);
/* Timing rows against the ceilings measured by the caller. */
void bench_perf(kvmem_cuda_ctx *c, double copy_gbs, double gemm_tfs);

#endif

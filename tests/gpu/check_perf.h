/* SPDX-License-Identifier: MIT */
/*
 * The checks and timings of the engine's fast paths (check_perf.c), run by
 * kvmem_gpu_check: decode attention with the key count on the device and
 * its CUDA graph replays (bit for bit the plain calls), attention v4, the
 * fused q/k norm + RoPE, the one-row GEMV (check_gemv.c), the GPU index
 * append and the 16-byte-load scorer.
 */
#ifndef KVMEM_TESTS_GPU_CHECK_PERF_H
#define KVMEM_TESTS_GPU_CHECK_PERF_H

/* One "ok"/"FAIL" line per case, on check_util.h's context and counts. */
void check_perf(void);
/* Timing rows against the ceilings measured by the caller. */
void bench_perf(double copy_gbs, double gemm_tfs);

/* check.c: one attention shape at one version (2, 3, 4) against the CPU
 * twin, fresh random inputs; check_perf.c runs v4 through it. */
struct att_shape {
	const char *name;
	int n_q, n_kv, heads, kvh, hd, explicit_pos;
};
void check_attention_one(const struct att_shape *s, int version);

#endif

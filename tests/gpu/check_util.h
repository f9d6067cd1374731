/* SPDX-License-Identifier: MIT */
/*
 * What every part of kvmem_gpu_check shares (check.c, check_perf.c): the
 * context, the pass/fail counts, the seeded random numbers, host and device
 * buffers, the "ok"/"FAIL" line, the tolerance comparison and the timer.
 * The rule of a comparison: |gpu - cpu| <= atol + rtol |cpu| per element; a
 * NaN where the twin wrote a number counts as unwritten (outputs are
 * poisoned with 0xff bytes first).
 */
#ifndef KVMEM_TESTS_GPU_CHECK_UTIL_H
#define KVMEM_TESTS_GPU_CHECK_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels_cuda.h"

#define ULP1 0x1p-7	/* one bf16 ulp, relative to the value */

extern kvmem_cuda_ctx *g_c;
extern int g_pass, g_fail, g_quick;
extern uint64_t g_rng;	/* the seed; --seed replays a run */

uint64_t rnext(void);
double runi(double lo, double hi);
int rint_in(int lo, int hi);

/* Print what failed with kvmem's last error and exit 2. */
void die(const char *what);
void *hmalloc(size_t n);
float *rand_f32(size_t n, double lo, double hi);
uint16_t *rand_bf16(size_t n, double lo, double hi);

/* Device copy of a host array; a device array of 0xff bytes (NaN as fp32,
 * bf16 and double); a host copy of a device array (after a sync). */
void *dput(const void *h, size_t bytes);
void *dpoison(size_t bytes);
void *dget(const void *d, size_t bytes);
/* One byte of device memory set to v (after the stream's work); its old value. */
uint8_t dpoke(void *d, uint8_t v);
/* Device memory filled with random values in [-a, a]. */
void dfill_bf16(void *d, size_t n, double a);

/* The device buffers of an attention timing: q and out [maxq][heads][hd],
 * K and V [kvh][maxkv][hd], random bf16 (scale 1), qp room for maxq
 * positions. Dies when the device is out of memory. */
struct att_bufs {
	void *q, *k, *v, *out, *qp;
};
void att_bufs_alloc(struct att_bufs *b, int maxq, size_t maxkv, int heads, int kvh, int hd);
void att_bufs_free(struct att_bufs *b);
void dfill_f32(void *d, size_t n, double a);

/* One "ok  "/"FAIL" line; counts into g_pass / g_fail. */
void report(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Elementwise comparison, one element at a time, then one report line. */
struct cmp {
	size_t n, bad, unwritten, diff;
	double max_abs, l2n, l2d;
};
void cmp_one(struct cmp *c, double g, double r, double atol, double rtol);
void cmp_report(const struct cmp *c, const char *what, double atol, double rtol);
double bf(uint16_t h);	/* a bf16 as a double */
void cmp_bf16(const char *what, const uint16_t *g, const uint16_t *r, size_t n, double atol,
	      double rtol);
void cmp_f32(const char *what, const float *g, const float *r, size_t n, double atol, double rtol);

/* Median milliseconds of `reps` (at most 64) runs after `warm` warm-ups,
 * by CUDA events around each run on the context's stream. */
typedef int (*bench_fn)(void *arg);
double time_ms(bench_fn fn, void *arg, int warm, int reps);
/* Mean milliseconds a run over `held_s` seconds of runs back to back, after
 * `warm_s` seconds of them: the rate the GPU holds at its power limit (a
 * short burst of time_ms runs at a clock a long prefill does not keep). */
double held_ms(bench_fn fn, void *arg, double warm_s, double held_s);
/* With KVMEM_GPU_PROF set (to anything): one run of fn inside a profiler
 * range (cudaProfilerStart/Stop), so that `ncu --profile-from-start off`
 * sees that call alone (tests/gpu/prof27.sh); without it, nothing. */
void prof_once(bench_fn fn, void *arg);

#endif

// SPDX-License-Identifier: MIT
/*
 * kvmem_gpu_check's shared pieces (check_util.h): counts, random numbers,
 * buffers, the comparison and the timer, for check.c and check_perf.c.
 */
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "check_util.h"
#include "util/clock.h"

kvmem_cuda_ctx *g_c;
int g_pass, g_fail, g_quick;
uint64_t g_rng;

uint64_t rnext(void)
{
	uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

double runi(double lo, double hi)
{
	return lo + (hi - lo) * ((double)(rnext() >> 11) * 0x1p-53);
}

int rint_in(int lo, int hi)
{
	return lo + (int)(runi(0, 1) * (hi - lo + 1));
}

void die(const char *what)
{
	fprintf(stderr, "kvmem_gpu_check: %s: %s\n", what, kvmem_last_error());
	exit(2);
}

void *hmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p) {
		fprintf(stderr, "kvmem_gpu_check: out of host memory (%zu bytes)\n", n);
		exit(2);
	}
	return p;
}

float *rand_f32(size_t n, double lo, double hi)
{
	float *p = hmalloc(4 * n);

	for (size_t i = 0; i < n; i++)
		p[i] = (float)runi(lo, hi);
	return p;
}

uint16_t *rand_bf16(size_t n, double lo, double hi)
{
	uint16_t *p = hmalloc(2 * n);

	for (size_t i = 0; i < n; i++)
		p[i] = kvmem_f32_to_bf16((float)runi(lo, hi));
	return p;
}

/* Device copy of a host array. */
void *dput(const void *h, size_t bytes)
{
	void *d;

	if (kvmem_cuda_malloc(&d, bytes) || kvmem_cuda_upload(g_c, d, h, bytes))
		die("upload");
	return d;
}

/* Device array filled with 0xff bytes: NaN as fp32, bf16 and double. */
void *dpoison(size_t bytes)
{
	void *d;

	/* On the context's stream (non-blocking: it does not wait for the
	 * legacy default stream), then waited for. */
	if (kvmem_cuda_malloc(&d, bytes) ||
	    cudaMemsetAsync(d, 0xff, bytes, (cudaStream_t)kvmem_cuda_stream(g_c)) != cudaSuccess ||
	    kvmem_cuda_sync(g_c))
		die("poisoned allocation");
	return d;
}

void *dget(const void *d, size_t bytes)
{
	void *h = hmalloc(bytes);

	if (kvmem_cuda_sync(g_c) || kvmem_cuda_download(g_c, h, d, bytes))
		die("download");
	return h;
}

uint8_t dpoke(void *d, uint8_t v)
{
	uint8_t was;

	if (kvmem_cuda_sync(g_c) || cudaMemcpy(&was, d, 1, cudaMemcpyDeviceToHost) != cudaSuccess ||
	    cudaMemcpy(d, &v, 1, cudaMemcpyHostToDevice) != cudaSuccess)
		die("a byte of device memory");
	return was;
}

double bf(uint16_t h)
{
	return kvmem_bf16_to_f32(h);
}

void report(int ok, const char *fmt, ...)
{
	va_list ap;

	printf("%s ", ok ? "ok  " : "FAIL");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	if (ok)
		g_pass++;
	else
		g_fail++;
}

void cmp_one(struct cmp *c, double g, double r, double atol, double rtol)
{
	double e;

	c->n++;
	if (isnan(r) && isnan(g))
		return;	/* neither wrote it (poison kept) */
	if (isnan(g) && !isnan(r)) {
		c->unwritten++;
		c->bad++;
		return;
	}
	e = fabs(g - r);
	if (g != r)
		c->diff++;
	if (!(e <= atol + rtol * fabs(r)))
		c->bad++;
	if (e > c->max_abs || isnan(e))
		c->max_abs = e;
	c->l2n += e * e;
	c->l2d += r * r;
}

void cmp_report(const struct cmp *c, const char *what, double atol, double rtol)
{
	report(c->bad == 0, "%-34s n=%-9zu max|d|=%-9.3g relL2=%-9.3g differ=%-7zu bad=%zu "
	       "unwritten=%zu (atol %.3g rtol %.3g)", what, c->n, c->max_abs,
	       c->l2d > 0 ? sqrt(c->l2n / c->l2d) : 0.0, c->diff, c->bad, c->unwritten, atol, rtol);
}

void cmp_bf16(const char *what, const uint16_t *g, const uint16_t *r, size_t n, double atol,
		     double rtol)
{
	struct cmp c = { 0 };

	for (size_t i = 0; i < n; i++)
		cmp_one(&c, bf(g[i]), bf(r[i]), atol, rtol);
	cmp_report(&c, what, atol, rtol);
}

void cmp_f32(const char *what, const float *g, const float *r, size_t n, double atol,
		    double rtol)
{
	struct cmp c = { 0 };

	for (size_t i = 0; i < n; i++)
		cmp_one(&c, g[i], r[i], atol, rtol);
	cmp_report(&c, what, atol, rtol);
}

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

void prof_once(bench_fn fn, void *arg)
{
	if (!getenv("KVMEM_GPU_PROF"))
		return;
	if (kvmem_cuda_sync(g_c) || cudaProfilerStart() != cudaSuccess || fn(arg) ||
	    kvmem_cuda_sync(g_c) || cudaProfilerStop() != cudaSuccess)
		die("profiled run");
}

/* Median milliseconds of `reps` runs after `warm` warm-ups, by CUDA events
 * around each run on the context's stream. */
double time_ms(bench_fn fn, void *arg, int warm, int reps)
{
	cudaStream_t st = (cudaStream_t)kvmem_cuda_stream(g_c);
	cudaEvent_t a, b;
	double t[64];

	if (reps > 64)
		reps = 64;
	cudaEventCreate(&a);
	cudaEventCreate(&b);
	for (int i = 0; i < warm; i++)
		if (fn(arg))
			die("bench warm-up");
	for (int i = 0; i < reps; i++) {
		float ms;

		cudaEventRecord(a, st);
		if (fn(arg))
			die("bench run");
		cudaEventRecord(b, st);
		cudaEventSynchronize(b);
		cudaEventElapsedTime(&ms, a, b);
		t[i] = ms;
	}
	if (kvmem_cuda_sync(g_c))
		die("bench");
	cudaEventDestroy(a);
	cudaEventDestroy(b);
	qsort(t, reps, sizeof(double), cmp_dbl);
	return t[reps / 2];
}

double held_ms(bench_fn fn, void *arg, double warm_s, double held_s)
{
	double t0 = kvmem_now_s(), t1 = 0, t;
	long runs = 0;

	for (;;) {
		for (int i = 0; i < 4; i++)
			if (fn(arg))
				die("bench run");
		if (kvmem_cuda_sync(g_c))
			die("bench");
		t = kvmem_now_s();
		if (t1 == 0 && t - t0 >= warm_s)
			t1 = t;	/* the window opens at a batch's end */
		else if (t1 > 0 && (runs += 4, t - t1 >= held_s))
			return (t - t1) * 1e3 / runs;
	}
}

/* Fill n elements of es bytes at d from the host chunk h of m + 1024
 * random elements, repeated with a shift (not zeros, not one repeated
 * value); h is freed. */
static void dfill(void *d, size_t n, size_t es, void *h, size_t m)
{
	for (size_t at = 0, s = 0; at < n; at += m, s = (s + 7) % 1024) {
		size_t k = n - at < m ? n - at : m;

		if (cudaMemcpy((char *)d + at * es, (char *)h + s * es, es * k,
			       cudaMemcpyHostToDevice) != cudaSuccess)
			die("fill");
	}
	/* The ops' stream does not wait for the default stream's copies. */
	if (cudaDeviceSynchronize() != cudaSuccess)
		die("fill");
	free(h);
}

/* Fill device memory with n random values in [-a, a]. */
void dfill_bf16(void *d, size_t n, double a)
{
	size_t m = n < (1u << 22) ? n : (1u << 22);

	dfill(d, n, 2, rand_bf16(m + 1024, -a, a), m);
}

void att_bufs_alloc(struct att_bufs *b, int maxq, size_t maxkv, int heads, int kvh, int hd)
{
	const size_t qn = (size_t)maxq * heads * hd, kn = maxkv * kvh * hd;

	if (kvmem_cuda_malloc(&b->q, 2 * qn) || kvmem_cuda_malloc(&b->k, 2 * kn) ||
	    kvmem_cuda_malloc(&b->v, 2 * kn) || kvmem_cuda_malloc(&b->out, 2 * qn) ||
	    kvmem_cuda_malloc(&b->qp, 4 * (size_t)maxq))
		die("attention buffers");
	dfill_bf16(b->q, qn, 1);
	dfill_bf16(b->k, kn, 1);
	dfill_bf16(b->v, kn, 1);
}

void att_bufs_free(struct att_bufs *b)
{
	kvmem_cuda_free(b->q);
	kvmem_cuda_free(b->k);
	kvmem_cuda_free(b->v);
	kvmem_cuda_free(b->out);
	kvmem_cuda_free(b->qp);
	memset(b, 0, sizeof(*b));
}

void dfill_f32(void *d, size_t n, double a)
{
	size_t m = n < (1u << 22) ? n : (1u << 22);

	dfill(d, n, 4, rand_f32(m + 1024, -a, a), m);
}

// SPDX-License-Identifier: MIT
/*
 * kvmem_cuda_gemv_rows_bf16 against the one-row GEMM of each row alone
 * (check_gemv_rows.h): bit for bit, since a conversation in a batched
 * decode step must get the bits it gets decoding alone. Inputs are fresh
 * random numbers from the seed; outputs poisoned first.
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_cuda.h"
#include "kvmem/kvmem.h"
#include "check_gemv_rows.h"
#include "check_util.h"

static size_t ysize(int mode)
{
	return mode == KVMEM_GEMM_BF16 ? 2 : 4;
}

/* dw: the weights (device, random, [out][in]). */
static void rows_case(int n, int in, int out, int mode, const void *dw)
{
	const size_t yb = (size_t)n * out * ysize(mode);
	uint16_t *x = rand_bf16((size_t)n * in, -1, 1);
	float *y0 = rand_f32((size_t)n * out, -2, 2);	/* the add mode's starting y */
	void *dx = dput(x, (size_t)n * in * 2);
	void *dy = mode == KVMEM_GEMM_F32_ADD ? dput(y0, yb) : dpoison(yb);
	unsigned char *g, *r;
	size_t differ = 0;

	if (kvmem_cuda_gemv_rows_bf16(g_c, dy, mode, dx, dw, n, in, out))
		die("gemv rows");
	g = dget(dy, yb);
	if (mode == KVMEM_GEMM_F32_ADD) {
		kvmem_cuda_free(dy);
		dy = dput(y0, yb);
	} else {
		/* on the ops' stream, ahead of the lone calls */
		if (cudaMemsetAsync(dy, 0xff, yb, (cudaStream_t)kvmem_cuda_stream(g_c)) != cudaSuccess)
			die("poison");
	}
	for (int b = 0; b < n; b++)
		if (kvmem_cuda_gemm_bf16(g_c, (char *)dy + (size_t)b * out * ysize(mode), mode,
					 (const uint16_t *)dx + (size_t)b * in, dw, 1, in, out))
			die("gemm, one row");
	r = dget(dy, yb);
	for (size_t e = 0; e < yb; e++)
		differ += g[e] != r[e];
	report(!differ, "gemv rows %2d x %5d -> %5d (mode %d): %zu of %zu bytes differ from "
	       "each row alone", n, in, out, mode, differ, yb);
	free(x);
	free(y0);
	free(g);
	free(r);
	kvmem_cuda_free(dx);
	kvmem_cuda_free(dy);
}

void check_gemv_rows(void)
{
	static const int shapes[][2] = { { 4096, 6144 }, { 4096, 4096 }, { 12288, 4096 },
					 { 4096, 24576 }, { 264, 37 }, { 1024, 151 } };
	static const int counts[] = { 1, 3, 8, 13, 64 };

	printf("\nthe batched decode GEMM (gemv.cu, kvmem_cuda_gemv_rows_bf16) vs each row alone\n");
	for (int s = 0; s < 6; s++) {
		const int in = g_quick && s < 4 ? shapes[s][0] / 8 : shapes[s][0];
		const int out = g_quick && s < 4 ? shapes[s][1] / 8 : shapes[s][1];

		uint16_t *w = rand_bf16((size_t)out * in, -1, 1);
		void *dw = dput(w, (size_t)out * in * 2);

		rows_case(counts[rint_in(0, 4)], in, out, s % 3, dw);
		rows_case(counts[rint_in(0, 4)], in, out, (s + 1) % 3, dw);
		free(w);
		kvmem_cuda_free(dw);
	}
	{
		uint16_t *d = dpoison(4096);

		report(kvmem_cuda_gemv_rows_bf16(g_c, d, KVMEM_GEMM_BF16, d + 1, d, 1, 64, 8) ==
		       -ENOTSUP, "gemv rows: an unaligned input refused (a lone row would not take "
		       "the GEMV)");
		kvmem_cuda_free(d);
	}
}

/* ---- timing ---------------------------------------------------------------- */
struct tg {
	int n;
	void *x, *y, *w[4];
};

static const int g_sh[4][2] = { { 4096, 6144 }, { 4096, 4096 }, { 4096, 24576 }, { 12288, 4096 } };

static int run_rows(void *arg)
{
	struct tg *t = arg;

	for (int k = 0; k < 4; k++)
		if (kvmem_cuda_gemv_rows_bf16(g_c, t->y, KVMEM_GEMM_BF16, t->x, t->w[k], t->n,
					      g_sh[k][0], g_sh[k][1]))
			return -1;
	return 0;
}

static int run_lone(void *arg)
{
	struct tg *t = arg;

	for (int k = 0; k < 4; k++)
		for (int b = 0; b < t->n; b++)
			if (kvmem_cuda_gemm_bf16(g_c, (uint16_t *)t->y + (size_t)b * g_sh[k][1],
						 KVMEM_GEMM_BF16,
						 (const uint16_t *)t->x + (size_t)b * g_sh[k][0],
						 t->w[k], 1, g_sh[k][0], g_sh[k][1]))
				return -1;
	return 0;
}

void gemv_rows_sweep(void)
{
	static const int counts[] = { 1, 16, 32, 64 };
	double wbytes = 0;
	struct tg t;

	printf("\na layer's four GEMMs at the Qwen3-8B geometry (qkv, o, gate|up, down): the rows "
	       "kernel against one lone GEMV per row\n(median of 20, CUDA events)\n");
	printf("%-6s %10s %10s %8s %12s\n", "rows", "rows ms", "lone ms", "lone/r", "weights GB/s");
	for (int k = 0; k < 4; k++) {
		const size_t e = (size_t)g_sh[k][0] * g_sh[k][1];

		if (kvmem_cuda_malloc(&t.w[k], 2 * e))
			die("timing: device memory");
		dfill_bf16(t.w[k], e, 1);
		wbytes += 2.0 * e;
	}
	for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
		double mr, ml;

		t.n = counts[ci];
		if (kvmem_cuda_malloc(&t.x, (size_t)t.n * 12288 * 2) ||
		    kvmem_cuda_malloc(&t.y, (size_t)t.n * 24576 * 2))
			die("timing: device memory");
		dfill_bf16(t.x, (size_t)t.n * 12288, 1);
		mr = time_ms(run_rows, &t, 3, 20);
		ml = time_ms(run_lone, &t, 2, 10);
		printf("%-6d %10.4f %10.4f %7.2fx %12.1f\n", t.n, mr, ml, ml / mr, wbytes / (mr * 1e6));
		kvmem_cuda_free(t.x);
		kvmem_cuda_free(t.y);
	}
	for (int k = 0; k < 4; k++)
		kvmem_cuda_free(t.w[k]);
}

/* ---- the tensor-core GEMM's split and tiles, shape by shape ----------------- */
struct tshape {
	int n, in, out;
	void *x, *y, *w;
};

static int run_shape(void *arg)
{
	struct tshape *t = arg;

	return kvmem_cuda_gemm_tc_bf16(g_c, t->y, KVMEM_GEMM_BF16, t->x, t->w, t->n, t->in, t->out);
}

/* The lone decode's GEMV ("gemm_tc" off): the peer of a row alone. */
static int run_gemv(void *arg)
{
	struct tshape *t = arg;

	return kvmem_cuda_gemm_bf16(g_c, t->y, KVMEM_GEMM_BF16, t->x, t->w, 1, t->in, t->out);
}

void gemm_tc_shape_sweep(void)
{
	static const int counts[] = { 1, 16, 64 }, kss[] = { 0, 1, 2, 4, 8 }, mts[] = { 1, 2 };
	static const char *const names[4] = { "qkv", "o", "gate|up", "down" };
	struct tshape t;

	printf("\nthe tensor-core GEMM (gemm_tc.cu) at each 8B layer shape: weights GB/s by the split "
	       "ks (0: the rule) and weight tiles a warp mt (median of 20, CUDA events; ks changes "
	       "the sums, mt does not)\n");
	printf("%-8s %5s %3s %9s %9s %9s %9s %9s\n", "shape", "rows", "mt", "ks rule", "ks 1", "ks 2",
	       "ks 4", "ks 8");
	int was = kvmem_cuda_tune(g_c, "gemm_tc", 0);
	for (int k = 0; k < 4; k++) {
		const size_t e = (size_t)g_sh[k][0] * g_sh[k][1];

		t.in = g_sh[k][0];
		t.out = g_sh[k][1];
		if (kvmem_cuda_malloc(&t.w, 2 * e) || kvmem_cuda_malloc(&t.x, (size_t)64 * t.in * 2) ||
		    kvmem_cuda_malloc(&t.y, (size_t)64 * t.out * 2))
			die("timing: device memory");
		dfill_bf16(t.w, e, 1);
		dfill_bf16(t.x, (size_t)64 * t.in, 1);
		t.n = 1;
		if (!k)
			prof_once(run_gemv, &t);	/* ncu: tests/gpu/prof27.sh */
		printf("%-8s %5d GEMV (gemv.cu, the lone decode's default) %9.1f\n", names[k], 1,
		       2.0 * e / (time_ms(run_gemv, &t, 3, 20) * 1e6));
		for (int ci = 0; ci < 3; ci++)
			for (int mi = 0; mi < 2; mi++) {
				t.n = counts[ci];
				printf("%-8s %5d %3d", names[k], t.n, mts[mi]);
				kvmem_cuda_tune(g_c, "gemm_tc_mt", mts[mi]);
				for (int ki = 0; ki < 5; ki++) {
					kvmem_cuda_tune(g_c, "gemm_tc_ks", kss[ki]);
					if (!k && ci && !mi && !ki)
						prof_once(run_shape, &t);	/* qkv, the rule */
					printf(" %9.1f", 2.0 * e / (time_ms(run_shape, &t, 3, 20) * 1e6));
				}
				printf("\n");
			}
		kvmem_cuda_tune(g_c, "gemm_tc_ks", 0);
		kvmem_cuda_tune(g_c, "gemm_tc_mt", 0);
		kvmem_cuda_free(t.w);
		kvmem_cuda_free(t.x);
		kvmem_cuda_free(t.y);
	}
	kvmem_cuda_tune(g_c, "gemm_tc", was);
}

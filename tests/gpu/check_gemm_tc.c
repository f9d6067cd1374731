// SPDX-License-Identifier: MIT
/*
 * kvmem_cuda_gemm_tc_bf16 (check_gemm_tc.h). The sums inside an mma are
 * the hardware's, so the twin is held to a tolerance scaled by each
 * element's sum of |x w| (fp32 sums in any order stay within K u of it;
 * 1e-4 is about 20x that at K = 4096 and still far below what a wrong
 * fragment layout or a lost tail block gives: one misplaced product of
 * ~0.25 against 1e-4 * K * 0.25); batch invariance is checked bit for bit
 * on the GPU itself.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_bf16.h"
#include "kernels/kernels_cuda.h"
#include "kvmem/kvmem.h"
#include "check_gemm_tc.h"
#include "check_gemv_rows.h"
#include "check_util.h"

#define TC_RTOL 1e-4	/* of sum |x w| */


static size_t ysize(int mode)
{
	return mode == KVMEM_GEMM_BF16 ? 2 : 4;
}

static double yval(const void *y, int mode, size_t i)
{
	return mode == KVMEM_GEMM_BF16 ? bf(((const uint16_t *)y)[i]) : ((const float *)y)[i];
}

/* n rows of random x against the device weights w (host copy hw). */
static void twin_case(int n, int in, int out, int mode, const uint16_t *hw, const void *dw)
{
	const size_t yb = (size_t)n * out * ysize(mode);
	uint16_t *x = rand_bf16((size_t)n * in, -1, 1);
	float *y0 = rand_f32((size_t)n * out, -2, 2);
	void *dx = dput(x, (size_t)n * in * 2);
	void *dy = mode == KVMEM_GEMM_F32_ADD ? dput(y0, yb) : dpoison(yb);
	void *ry = hmalloc(yb);
	unsigned char *g;
	size_t bad = 0, nan = 0;
	double worst = 0;

	if (mode == KVMEM_GEMM_F32_ADD)
		memcpy(ry, y0, yb);
	if (kvmem_cuda_gemm_tc_bf16(g_c, dy, mode, dx, dw, n, in, out))
		die("gemm tc");
	if (kvmem_gemm_bf16(ry, mode, x, hw, n, in, out))
		die("gemm twin");
	g = dget(dy, yb);
	for (int r = 0; r < n; r++)
		for (int o = 0; o < out; o++) {
			const size_t i = (size_t)r * out + o;
			double sabs = 0, tol, d;

			for (int k = 0; k < in; k++)
				sabs += fabs(bf(x[(size_t)r * in + k]) * bf(hw[(size_t)o * in + k]));
			tol = TC_RTOL * sabs + 1e-6;
			if (mode == KVMEM_GEMM_BF16)
				tol += ULP1 * fabs(yval(ry, mode, i));
			else if (mode == KVMEM_GEMM_F32_ADD)
				tol += 0x1p-23 * (fabs(y0[i]) + sabs);
			d = fabs(yval(g, mode, i) - yval(ry, mode, i));
			if (isnan(yval(g, mode, i)))
				nan++;
			else if (d > tol)
				bad++;
			if (tol > 0 && d / tol > worst)
				worst = d / tol;
		}
	report(!bad && !nan, "gemm tc %2d x %5d -> %5d (mode %d) vs the CPU twin: %zu beyond "
	       "%.0e sum|xw|, %zu unwritten, worst |d| / tol %.3f", n, in, out, mode, bad, TC_RTOL,
	       nan, worst);
	free(x);
	free(y0);
	free(ry);
	free(g);
	kvmem_cuda_free(dx);
	kvmem_cuda_free(dy);
}

/* Row r's bits for n = 1, 7, 16, 64 and 72 (the first n rows of one x),
 * at 64 with the rows reversed (row r at place 63 - r), at 64 with one
 * weight tile a warp forced ("gemm_tc_mt" 1; by n, 9 rows on take two),
 * at 1 with 8 blocks of loads in flight ("gemm_tc_u" 8), and at 16 and 64
 * with x's loads issued with the weights' always and never ("gemm_tc_xpre"
 * 1 and 2; by rows, 9-32 take them early). */
static void invariance_case(int in, int out, int mode, const void *dw)
{
	static const int ns[] = { 1, 7, 16, 64, 72 };
	const int N = 72;
	const size_t rb = (size_t)out * ysize(mode);
	uint16_t *x = rand_bf16((size_t)N * in, -1, 1), *xr = hmalloc((size_t)N * in * 2);
	void *dx = dput(x, (size_t)N * in * 2), *dxr, *dy;
	void *zeros = memset(hmalloc(N * rb), 0, N * rb);
	unsigned char *all, *g;
	size_t differ = 0, rows = 0;

	for (int r = 0; r < 64; r++)
		memcpy(xr + (size_t)r * in, x + (size_t)(63 - r) * in, (size_t)in * 2);
	dxr = dput(xr, (size_t)64 * in * 2);
	/* The add mode starts from zeros here: the bits compared are the sums'. */
	dy = dput(zeros, N * rb);
	if (kvmem_cuda_gemm_tc_bf16(g_c, dy, mode, dx, dw, N, in, out))
		die("gemm tc, 72 rows");
	all = dget(dy, N * rb);
	for (int s = 0; s < 12; s++) {
		/* 8-11: 16 and 64 rows with x's loads early always, then never */
		const int n = s < 5 ? ns[s] : s < 7 ? 64 : s == 7 ? 1 : s % 2 ? 64 : 16;

		kvmem_cuda_free(dy);
		dy = dput(zeros, n * rb);
		if ((s == 6 && kvmem_cuda_tune(g_c, "gemm_tc_mt", 1) < 0) ||
		    (s == 7 && kvmem_cuda_tune(g_c, "gemm_tc_u", 8) < 0) ||
		    (s >= 8 && kvmem_cuda_tune(g_c, "gemm_tc_xpre", s < 10 ? 1 : 2) < 0))
			die("tune gemm_tc_mt / gemm_tc_u / gemm_tc_xpre");
		if (kvmem_cuda_gemm_tc_bf16(g_c, dy, mode, s != 5 ? dx : dxr, dw, n, in, out))
			die("gemm tc, n rows");
		kvmem_cuda_tune(g_c, "gemm_tc_mt", 0);
		kvmem_cuda_tune(g_c, "gemm_tc_u", 0);
		kvmem_cuda_tune(g_c, "gemm_tc_xpre", 0);
		g = dget(dy, n * rb);
		for (int r = 0; r < n; r++) {
			const int src = s != 5 ? r : 63 - r;

			differ += memcmp(g + (size_t)r * rb, all + (size_t)src * rb, rb) != 0;
			rows++;
		}
		free(g);
	}
	report(!differ, "gemm tc %5d -> %5d (mode %d): %zu of %zu rows differ between n = 1, 7, "
	       "16, 64, 72, reversed, one tile a warp, 8 blocks in flight, x's loads early or not",
	       in, out, mode, differ, rows);
	free(x);
	free(xr);
	free(zeros);
	free(all);
	kvmem_cuda_free(dx);
	kvmem_cuda_free(dxr);
	kvmem_cuda_free(dy);
}

void check_gemm_tc(void)
{
	static const int shapes[][2] = { { 4096, 6144 }, { 4096, 4096 }, { 12288, 4096 },
					 { 4096, 24576 }, { 264, 37 }, { 1024, 151 }, { 40, 17 },
					 { 8, 5 } };
	static const int counts[] = { 1, 3, 8, 13, 64, 72 };
	int was;

	printf("\nthe tensor-core GEMM for few rows (gemm_tc.cu, kvmem_cuda_gemm_tc_bf16)\n");
	for (int s = 0; s < 8; s++) {
		const int big = s < 4;
		const int in = g_quick && big ? shapes[s][0] / 8 : shapes[s][0];
		const int out = g_quick && big ? shapes[s][1] / 8 : shapes[s][1];
		uint16_t *w = rand_bf16((size_t)out * in, -1, 1);
		void *dw = dput(w, (size_t)out * in * 2);

		/* The twin's reference is O(n in out) on the host: few rows at
		 * the big shapes. */
		twin_case(big ? 1 + rint_in(0, 3) : counts[rint_in(0, 5)], in, out, s % 3, w, dw);
		twin_case(big ? counts[rint_in(0, 2)] : counts[rint_in(0, 5)], in, out, (s + 1) % 3,
			  w, dw);
		invariance_case(in, out, (s + 2) % 3, dw);
		free(w);
		kvmem_cuda_free(dw);
	}
	{
		uint16_t *d = dpoison(4096);

		report(kvmem_cuda_gemm_tc_bf16(g_c, d, KVMEM_GEMM_BF16, d + 1, d, 1, 64, 8) ==
			       -ENOTSUP &&
			       kvmem_cuda_gemm_tc_bf16(g_c, d, KVMEM_GEMM_BF16, d, d, 1, 12, 8) ==
				       -ENOTSUP &&
			       kvmem_cuda_gemm_tc_bf16(g_c, d, 7, d, d, 1, 64, 8) == -EINVAL,
		       "gemm tc: an unaligned input, 12 inputs and mode 7 refused");
		kvmem_cuda_free(d);
	}
	/* The decode paths with it on: the batched GEMM's rows against the
	 * lone one-row GEMM (both on gemm_tc.cu now). */
	if ((was = kvmem_cuda_tune(g_c, "gemm_tc", 1)) < 0)
		die("tune gemm_tc");
	printf("(with \"gemm_tc\" on:)");
	check_gemv_rows();
	kvmem_cuda_tune(g_c, "gemm_tc", was);
	check_gemm_tc_fused();
}

void gemm_tc_sweep(void)
{
	/* Each form: its setting (the others at their defaults), and a line
	 * naming it. "gemm_tc" 0 is the CUDA-core GEMV and rows kernels. */
	static const struct {
		const char *knob;
		int value;
		const char *what;
	} forms[] = {
		{ "gemm_tc", 0, "\"gemm_tc\" off: gemv.cu (CUDA cores)" },
		{ "gemm_tc_mt", 1, "\"gemm_tc\" on, one weight tile a warp (gemm_tc_mt 1)" },
		{ NULL, 0, "\"gemm_tc\" on: gemm_tc.cu (tensor cores; two tiles a warp from 9 rows "
			   "on, x's loads early at 9-32)" },
		{ "gemm_tc_u", 8, "\"gemm_tc\" on, a lone row with 8 blocks of loads in flight "
				  "(gemm_tc_u 8)" },
		{ "gemm_tc_xpre", 1, "\"gemm_tc\" on, x's loads issued with the weights' at every "
				     "row count (gemm_tc_xpre 1)" },
		{ "gemm_tc_xpre", 2, "\"gemm_tc\" on, x's loads after the weights' at every row "
				     "count (gemm_tc_xpre 2, the form before 2026-12-04)" },
	};
	const int was = kvmem_cuda_tune(g_c, "gemm_tc", 1);

	if (was < 0)
		die("tune gemm_tc");
	for (size_t f = 0; f < sizeof(forms) / sizeof(forms[0]); f++) {
		const int old = forms[f].knob ? kvmem_cuda_tune(g_c, forms[f].knob, forms[f].value) : 0;

		if (old < 0)
			die(forms[f].knob);
		printf("\n%s", forms[f].what);
		gemv_rows_sweep();
		if (forms[f].knob)
			kvmem_cuda_tune(g_c, forms[f].knob, old);
	}
	kvmem_cuda_tune(g_c, "gemm_tc", was);
}

/*
 * A lone decode step's fused ops with "gemm_tc" on (gemv.cu's fused entries
 * send them to gemm_tc.cu): bit for bit the unfused rmsnorm, GEMM (and
 * SwiGLU) at every split, and the poisoned scratch h / gu left untouched
 * (the fused kernel ran, not the fallback).
 */
static void fused_case(int in, int out, int swiglu, int mode)
{
	static const int kss[] = { 0, 1, 2, 4, 8 };
	const int rows = swiglu ? 2 * out : out;
	const size_t yb = (size_t)out * (swiglu || mode == KVMEM_GEMM_BF16 ? 2 : 4);
	float *x = rand_f32(in, -4, 4), *y0 = rand_f32(out, -3, 3);
	uint16_t *nrm = rand_bf16(in, 0.5, 1.5), *w = rand_bf16((size_t)rows * in, -1, 1);
	void *dx = dput(x, 4 * (size_t)in), *dnw = dput(nrm, 2 * (size_t)in);
	void *dw = dput(w, 2 * (size_t)rows * in);
	size_t differ = 0;
	int ran = 1;

	for (size_t k = 0; k < sizeof(kss) / sizeof(kss[0]); k++) {
		unsigned char *got[2];
		int untouched[2];

		if (kvmem_cuda_tune(g_c, "gemm_tc_ks", kss[k]) < 0)
			die("tune gemm_tc_ks");
		for (int fz = 0; fz < 2; fz++) {
			void *dy = mode == KVMEM_GEMM_F32_ADD && !swiglu ? dput(y0, yb) : dpoison(yb);
			void *dh = dpoison(2 * (size_t)in), *dgu = dpoison(2 * (size_t)rows);
			uint16_t *hh, *hgu;
			int rc;

			kvmem_cuda_tune(g_c, "fuse", fz);
			rc = swiglu ? kvmem_cuda_norm_gemv_swiglu_bf16(g_c, dy, dx, dnw, 1e-6f, dw, dh,
								       dgu, 1, in, out)
				    : kvmem_cuda_norm_gemv_bf16(g_c, dy, mode, dx, dnw, 1e-6f, dw, dh, 1,
								in, out);
			if (rc)
				die("fused op, gemm_tc");
			got[fz] = dget(dy, yb);
			hh = dget(dh, 2 * (size_t)in);
			hgu = dget(dgu, 2 * (size_t)rows);
			untouched[fz] = 1;
			for (int i = 0; i < in; i++)
				untouched[fz] &= hh[i] == 0xffff;
			for (int i = 0; swiglu && i < rows; i++)
				untouched[fz] &= hgu[i] == 0xffff;
			free(hh);
			free(hgu);
			kvmem_cuda_free(dy);
			kvmem_cuda_free(dh);
			kvmem_cuda_free(dgu);
		}
		differ += memcmp(got[0], got[1], yb) != 0;
		ran &= untouched[1] && !untouched[0];
		{	/* the fused kernel with 8 blocks in flight: the same bits */
			void *dy = mode == KVMEM_GEMM_F32_ADD && !swiglu ? dput(y0, yb) : dpoison(yb);
			void *dh = dpoison(2 * (size_t)in), *dgu = dpoison(2 * (size_t)rows);
			unsigned char *g8;

			kvmem_cuda_tune(g_c, "gemm_tc_u", 8);
			if (swiglu ? kvmem_cuda_norm_gemv_swiglu_bf16(g_c, dy, dx, dnw, 1e-6f, dw, dh,
								      dgu, 1, in, out)
				   : kvmem_cuda_norm_gemv_bf16(g_c, dy, mode, dx, dnw, 1e-6f, dw, dh, 1, in,
							       out))
				die("fused op, gemm_tc_u 8");
			kvmem_cuda_tune(g_c, "gemm_tc_u", 0);
			g8 = dget(dy, yb);
			differ += memcmp(got[0], g8, yb) != 0;
			free(g8);
			kvmem_cuda_free(dy);
			kvmem_cuda_free(dh);
			kvmem_cuda_free(dgu);
		}
		free(got[0]);
		free(got[1]);
	}
	kvmem_cuda_tune(g_c, "gemm_tc_ks", 0);
	report(!differ && ran, "gemm tc fused rmsnorm + %d -> %d%s (mode %d) == unfused bits at ks "
	       "0,1,2,4,8 (and 8 blocks in flight): %zu of 10 differ; fused kernel ran: %s", in,
	       out, swiglu ? " + swiglu" : "", mode, differ, ran ? "yes" : "NO");
	free(x);
	free(y0);
	free(nrm);
	free(w);
	kvmem_cuda_free(dx);
	kvmem_cuda_free(dnw);
	kvmem_cuda_free(dw);
}

void check_gemm_tc_fused(void)
{
	int was_tc = kvmem_cuda_tune(g_c, "gemm_tc", 1), was_fuse = kvmem_cuda_tune(g_c, "fuse", 1);

	if (was_tc < 0 || was_fuse < 0)
		die("tune gemm_tc / fuse");
	if (!g_quick) {	/* the 8B shapes (--quick: compute-sanitizer's run) */
		fused_case(4096, 6144, 0, KVMEM_GEMM_BF16);
		fused_case(4096, 12288, 1, KVMEM_GEMM_BF16);
	}
	fused_case(1000, 333, 0, KVMEM_GEMM_F32);
	fused_case(1000, 333, 0, KVMEM_GEMM_F32_ADD);
	fused_case(4104, 37, 0, KVMEM_GEMM_BF16);
	fused_case(1000, 333, 1, KVMEM_GEMM_BF16);
	fused_case(64, 3, 1, KVMEM_GEMM_BF16);
	kvmem_cuda_tune(g_c, "gemm_tc", was_tc);
	kvmem_cuda_tune(g_c, "fuse", was_fuse);
}

// SPDX-License-Identifier: MIT
/*
 * The one-row GEMM (n == 1: kernels/cuda/gemv.cu) against its twin
 * kvmem_gemm_bf16 and against itself (see check_gemv.h). The tolerance of
 * Documentation/kernels.md: |gpu - cpu| <= 1e-5 Σ|x·w| per output, plus one
 * bf16 ulp of the value for bf16 out, plus 1e-6 |y| for fp32 +=. Outputs are
 * poisoned (NaN) first; inputs are fresh random numbers from the seed (the
 * weights from the device's kvmem_cuda_random_bf16, downloaded for the twin).
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_cuda.h"
#include "kvmem/kvmem.h"
#include "check_gemv.h"
#include "check_util.h"

/* A way to run n == 1: cuBLASLt, the first kernel, the split kernel with
 * the split it picks (ks 0) or a forced one. */
struct gemv_var {
	const char *name;
	int gemv, split, ks;
};

static const struct gemv_var vars[] = {
	{ "cuBLASLt", 0, 0, 0 },
	{ "first", 1, 0, 0 },
	{ "split", 1, 1, 0 },
	{ "split ks1", 1, 1, 1 },
	{ "split ks2", 1, 1, 2 },
	{ "split ks4", 1, 1, 4 },
	{ "split ks8", 1, 1, 8 },
};
enum { V_LT, V_FIRST, V_SPLIT, V_KS1, N_VARS = 7 };	/* V_KS1 + i: ks 1 << i */

static int saved[3];

static void gemv_set(const struct gemv_var *v)
{
	if (kvmem_cuda_tune(g_c, "gemv", v->gemv) < 0 ||
	    kvmem_cuda_tune(g_c, "gemv_split", v->split) < 0 ||
	    kvmem_cuda_tune(g_c, "gemv_ks", v->ks) < 0)
		die("kvmem_cuda_tune (gemv)");
}

/* The context's settings before a check, and back. */
static void gemv_save(void)
{
	saved[0] = kvmem_cuda_tune(g_c, "gemv", 1);
	saved[1] = kvmem_cuda_tune(g_c, "gemv_split", 0);
	saved[2] = kvmem_cuda_tune(g_c, "gemv_ks", 0);
	if (saved[0] < 0 || saved[1] < 0 || saved[2] < 0)
		die("kvmem_cuda_tune (gemv)");
}

static void gemv_restore(void)
{
	const struct gemv_var v = { "saved", saved[0], saved[1], saved[2] };

	gemv_set(&v);
}

/* Σ|x·w| per output: the scale of the tolerance. */
static float *gemv_abs(const uint16_t *x, const uint16_t *w, int in, int out)
{
	float *a = hmalloc(4 * (size_t)out);

	for (int o = 0; o < out; o++) {
		const uint16_t *wo = w + (size_t)o * in;
		double s = 0;

		for (int i = 0; i < in; i++)
			s += fabs(kvmem_bf16_to_f32(x[i]) * kvmem_bf16_to_f32(wo[i]));
		a[o] = (float)s;
	}
	return a;
}

static size_t out_bytes(int mode, int out)
{
	return (mode == KVMEM_GEMM_BF16 ? 2 : 4) * (size_t)out;
}

/* One n == 1 GEMM by the context's current settings into a fresh output
 * (y0 for +=, else poisoned); its host copy. */
static void *gemv_run(int mode, const void *dx, const void *dw, const float *y0, int in, int out)
{
	void *dy = mode == KVMEM_GEMM_F32_ADD ? dput(y0, 4 * (size_t)out) :
		   dpoison(out_bytes(mode, out)), *got;

	if (kvmem_cuda_gemm_bf16(g_c, dy, mode, dx, dw, 1, in, out))
		die("gemv");
	got = dget(dy, out_bytes(mode, out));
	kvmem_cuda_free(dy);
	return got;
}

static void gemv_cmp(const char *what, int mode, const void *got, const void *ref,
		     const float *abs_, const float *y0, int out)
{
	size_t bad = 0;
	double mx = 0;

	for (int o = 0; o < out; o++) {
		double g, r, tol = 1e-5 * abs_[o];

		if (mode == KVMEM_GEMM_BF16) {
			g = bf(((const uint16_t *)got)[o]);
			r = bf(((const uint16_t *)ref)[o]);
			tol += ULP1 * fabs(r);
		} else {
			g = ((const float *)got)[o];
			r = ((const float *)ref)[o];
			if (mode == KVMEM_GEMM_F32_ADD)
				tol += 1e-6 * fabs(y0[o]);
		}
		if (!(fabs(g - r) <= tol))
			bad++;
		if (fabs(g - r) > mx || isnan(g))
			mx = fabs(g - r);
	}
	report(!bad, "%-50s max|d|=%-9.3g bad=%zu", what, mx, bad);
}

static const char *mode_name(int mode)
{
	return mode == KVMEM_GEMM_BF16 ? "bf16" : mode == KVMEM_GEMM_F32 ? "f32" : "f32+=";
}

void check_gemv(void)
{
	/* The last two run under --quick; 4104 -> 37: 513 chunks, not a
	 * multiple of 32, and splits past the end at ks 8. */
	static const int shapes[][2] = { { 12288, 4096 }, { 1000, 333 }, { 4096, 4100 },
					 { 64, 7 }, { 4104, 37 } };
	static const int which[] = { V_FIRST, V_SPLIT, V_KS1 + 1, V_KS1 + 3 };

	gemv_save();
	for (int s = g_quick ? 3 : 0; s < 5; s++) {
		const int in = shapes[s][0], out = shapes[s][1];
		uint16_t *x = rand_bf16(in, -2, 2), *w = rand_bf16((size_t)out * in, -1, 1);
		float *y0 = rand_f32(out, -3, 3), *abs_ = gemv_abs(x, w, in, out);
		void *dx = dput(x, 2 * (size_t)in), *dw = dput(w, 2 * (size_t)out * in);

		for (int mode = 0; mode < 3; mode++) {
			void *ref = hmalloc(out_bytes(mode, out));

			if (mode == KVMEM_GEMM_F32_ADD)
				memcpy(ref, y0, 4 * (size_t)out);
			if (kvmem_gemm_bf16(ref, mode, x, w, 1, in, out))
				die("gemv twin");
			for (size_t v = 0; v < sizeof(which) / sizeof(which[0]); v++) {
				char what[96];
				void *got;

				gemv_set(&vars[which[v]]);
				got = gemv_run(mode, dx, dw, y0, in, out);
				snprintf(what, sizeof(what), "gemv 1x%d->%d %s, %s vs twin", in, out,
					 mode_name(mode), vars[which[v]].name);
				gemv_cmp(what, mode, got, ref, abs_, y0, out);
				free(got);
			}
			free(ref);
		}
		free(x);
		free(w);
		free(y0);
		free(abs_);
		kvmem_cuda_free(dx);
		kvmem_cuda_free(dw);
	}
	gemv_restore();
}

/* ---- the decode sweep (--gemv) ------------------------------------------------------ */

static const struct dshape {
	const char *name;
	int in, out, mode;
} dshapes[] = {
	{ "qkv 4096->6144 bf16", 4096, 6144, KVMEM_GEMM_BF16 },
	{ "o_proj 4096->4096 f32+=", 4096, 4096, KVMEM_GEMM_F32_ADD },
	{ "gate|up 4096->24576 bf16", 4096, 24576, KVMEM_GEMM_BF16 },
	{ "down 12288->4096 f32+=", 12288, 4096, KVMEM_GEMM_F32_ADD },
	{ "lm_head 4096->151936 f32", 4096, 151936, KVMEM_GEMM_F32 },
};
#define N_DSHAPES 5
#define W_MAX ((size_t)151936 * 4096)	/* weights buffer: lm_head's, 1.2 GB */
#define N_LAUNCH 36			/* launches per timed graph: a layer each */

static size_t differ(const void *a, const void *b, size_t bytes)
{
	const uint16_t *x = a, *y = b;
	size_t d = 0;

	for (size_t i = 0; i < bytes / 2; i++)
		d += x[i] != y[i];
	return d;
}

/* The split kernel captured in a graph, replayed twice: the plain call's bits. */
static void gemv_graph_check(const struct dshape *s, const void *dx, const void *dw,
			     const float *y0, const void *plain)
{
	cudaStream_t st = (cudaStream_t)kvmem_cuda_stream(g_c);
	const size_t ob = out_bytes(s->mode, s->out);
	void *dy = dpoison(ob);
	cudaGraph_t graph;
	cudaGraphExec_t exec;
	size_t bad = 0;
	char what[96];

	gemv_set(&vars[V_SPLIT]);
	if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
		die("gemv graph: begin capture");
	if (kvmem_cuda_gemm_bf16(g_c, dy, s->mode, dx, dw, 1, s->in, s->out)) {
		cudaStreamEndCapture(st, &graph);
		die("gemv graph: captured call");
	}
	if (cudaStreamEndCapture(st, &graph) != cudaSuccess ||
	    cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
		die("gemv graph: capture");
	for (int rep = 0; rep < 2; rep++) {
		void *got;

		if (s->mode == KVMEM_GEMM_F32_ADD) {
			if (kvmem_cuda_upload(g_c, dy, y0, ob))
				die("gemv graph: upload");
		} else if (cudaMemsetAsync(dy, 0xff, ob, st) != cudaSuccess) {
			die("gemv graph: poison");
		}
		if (cudaGraphLaunch(exec, st) != cudaSuccess)
			die("gemv graph: launch");
		got = dget(dy, ob);
		bad += differ(got, plain, ob);
		free(got);
	}
	snprintf(what, sizeof(what), "gemv %s, split: graph replays", s->name);
	report(!bad, "%-50s %zu of %zu 16-bit words differ from the plain call", what, bad, ob);
	cudaGraphExecDestroy(exec);
	cudaGraphDestroy(graph);
	kvmem_cuda_free(dy);
}

/* Every variant against the twin, the relations between them, a graph. */
static void sweep_check(const struct dshape *s, void *dw)
{
	const size_t n = (size_t)s->in * s->out, ob = out_bytes(s->mode, s->out);
	uint16_t *x = rand_bf16(s->in, -2, 2), *w;
	float *y0 = rand_f32(s->out, -3, 3), *abs_;
	void *dx = dput(x, 2 * (size_t)s->in), *ref = hmalloc(ob), *got[N_VARS];
	char what[96];
	int ks = 0;

	if (kvmem_cuda_random_bf16(g_c, dw, n, rnext(), 0.5f))
		die("gemv sweep: random weights");
	w = dget(dw, 2 * n);
	abs_ = gemv_abs(x, w, s->in, s->out);
	if (s->mode == KVMEM_GEMM_F32_ADD)
		memcpy(ref, y0, ob);
	if (kvmem_gemm_bf16(ref, s->mode, x, w, 1, s->in, s->out))
		die("gemv twin");
	for (int v = 0; v < N_VARS; v++) {
		gemv_set(&vars[v]);
		got[v] = gemv_run(s->mode, dx, dw, y0, s->in, s->out);
		snprintf(what, sizeof(what), "gemv %s, %s vs twin", s->name, vars[v].name);
		gemv_cmp(what, s->mode, got[v], ref, abs_, y0, s->out);
	}
	/* ks 1 is the first kernel's order; the split it picks is one of the forced ones */
	snprintf(what, sizeof(what), "gemv %s, split ks1 = first", s->name);
	report(!differ(got[V_KS1], got[V_FIRST], ob), "%-50s %zu of %zu 16-bit words differ", what,
	       differ(got[V_KS1], got[V_FIRST], ob), ob / 2);
	for (int i = 0; i < 4 && !ks; i++)
		if (!differ(got[V_SPLIT], got[V_KS1 + i], ob))
			ks = 1 << i;
	snprintf(what, sizeof(what), "gemv %s, split = a forced split", s->name);
	report(ks > 0, "%-50s the bits of ks%d", what, ks);
	gemv_graph_check(s, dx, dw, y0, got[V_SPLIT]);
	for (int v = 0; v < N_VARS; v++)
		free(got[v]);
	free(x);
	free(w);
	free(y0);
	free(abs_);
	free(ref);
	kvmem_cuda_free(dx);
}

struct gemv_time {
	const struct dshape *s;
	void *y, *x, *w;
	size_t slices, next;
	cudaGraphExec_t exec;
};

static int run_exec(void *p)
{
	struct gemv_time *t = p;

	return cudaGraphLaunch(t->exec, (cudaStream_t)kvmem_cuda_stream(g_c)) != cudaSuccess;
}

/* One launch on the next slice of the weights (cold in the L2, as in decode). */
static int run_single(void *p)
{
	struct gemv_time *t = p;
	const size_t n = (size_t)t->s->in * t->s->out;
	const uint16_t *w = (const uint16_t *)t->w + (t->next++ % t->slices) * n;

	return kvmem_cuda_gemm_bf16(g_c, t->y, t->s->mode, t->x, w, 1, t->s->in, t->s->out);
}

/* Microseconds a launch inside a graph of N_LAUNCH launches over
 * min(N_LAUNCH, buffer / size) different weights, and as single launches.
 * A capture that fails (cuBLASLt's, say) leaves NAN in the graph column
 * rather than ending the run. */
static void sweep_time(struct gemv_time *t, double *graph_us, double *single_us)
{
	cudaStream_t st = (cudaStream_t)kvmem_cuda_stream(g_c);
	cudaGraph_t graph = NULL;
	int bad = 0;

	t->next = 0;
	if (run_single(t) || kvmem_cuda_sync(g_c))	/* plans, outside the capture */
		die("gemv sweep: warm-up");
	*single_us = time_ms(run_single, t, 3, 30) * 1e3;
	*graph_us = NAN;
	if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
		cudaGetLastError();
		return;
	}
	for (int i = 0; i < N_LAUNCH && !bad; i++)
		bad = run_single(t);
	if (cudaStreamEndCapture(st, &graph) != cudaSuccess || bad ||
	    cudaGraphInstantiate(&t->exec, graph, 0) != cudaSuccess) {
		printf("(%s: the graph could not be captured: %s)\n", t->s->name, kvmem_last_error());
		cudaGetLastError();
		if (graph)
			cudaGraphDestroy(graph);
		return;
	}
	*graph_us = time_ms(run_exec, t, 2, 10) * 1e3 / N_LAUNCH;
	cudaGraphExecDestroy(t->exec);
	cudaGraphDestroy(graph);
}

void gemv_sweep(void)
{
	double us[N_DSHAPES][N_VARS], single[N_DSHAPES][N_VARS], copy_gbs;
	void *dw, *dy, *dx;

	printf("== gemv checks: odd shapes, every mode (%s, %d SMs)\n", kvmem_cuda_device_name(g_c),
	       kvmem_cuda_sm_count(g_c));
	check_gemv();
	if (g_quick)		/* the sanitizers' run: those alone */
		return;
	gemv_save();
	printf("\n== gemv checks: Qwen3-8B's decode shapes against the twin\n");
	if (kvmem_cuda_malloc(&dw, 2 * W_MAX) || kvmem_cuda_malloc(&dy, 4 * (size_t)151936) ||
	    kvmem_cuda_malloc(&dx, 2 * 12288))
		die("gemv sweep: alloc");
	for (int s = 0; s < N_DSHAPES; s++)
		sweep_check(&dshapes[s], dw);

	copy_gbs = kvmem_cuda_copy_gbps(g_c, (size_t)2 << 30);
	if (copy_gbs <= 0)
		die("gemv sweep: copy rate");
	printf("\n== gemv timing (weights bytes read / time, against the copy rate %.0f GB/s, "
	       "read + write, 2 GiB d2d, best of 5)\n", copy_gbs);
	printf("graph: a launch of a captured graph of %d over different weights (median of 10 "
	       "replays); single: one launch between events (median of 30)\n", N_LAUNCH);
	printf("%-26s %-10s %9s %7s %7s %10s %7s\n", "shape", "kernel", "graph us", "GB/s", "of copy",
	       "single us", "of copy");
	if (kvmem_cuda_random_bf16(g_c, dw, W_MAX, 0x67656d76ull, 0.5f) ||
	    kvmem_cuda_random_bf16(g_c, dx, 12288, 0x78ull, 1.0f) ||
	    cudaMemsetAsync(dy, 0, 4 * (size_t)151936, (cudaStream_t)kvmem_cuda_stream(g_c)) ||
	    kvmem_cuda_sync(g_c))
		die("gemv sweep: fill");
	for (int s = 0; s < N_DSHAPES; s++) {
		const struct dshape *d = &dshapes[s];
		const double bytes = 2.0 * d->in * d->out;
		struct gemv_time t = { .s = d, .y = dy, .x = dx, .w = dw };

		t.slices = W_MAX / ((size_t)d->in * d->out);
		if (t.slices > N_LAUNCH)
			t.slices = N_LAUNCH;
		for (int v = 0; v < N_VARS; v++) {
			double gbs, gbs1;

			gemv_set(&vars[v]);
			sweep_time(&t, &us[s][v], &single[s][v]);
			gbs = bytes / (us[s][v] * 1e-6) / 1e9;
			gbs1 = bytes / (single[s][v] * 1e-6) / 1e9;
			printf("%-26s %-10s %9.2f %7.0f %7.2f %10.2f %7.2f\n", d->name, vars[v].name,
			       us[s][v], gbs, gbs / copy_gbs, single[s][v], gbs1 / copy_gbs);
		}
		fflush(stdout);
	}

	/* Per shape: the first kernel against the split one, and the best split. */
	printf("\n%-26s %9s %9s %8s %9s %12s %10s\n", "graph us per launch", "first", "split",
	       "speedup", "best ks", "best ks us", "at copy rate");
	{
		double tok[3] = { 0, 0, 0 };

		for (int s = 0; s < N_DSHAPES; s++) {
			const int layers = s == N_DSHAPES - 1 ? 1 : 36;
			int best = V_KS1;

			for (int v = V_KS1; v < N_VARS; v++)
				if (us[s][v] < us[s][best])
					best = v;
			printf("%-26s %9.2f %9.2f %8.2f %9d %12.2f %10.2f\n", dshapes[s].name, us[s][V_FIRST],
			       us[s][V_SPLIT], us[s][V_FIRST] / us[s][V_SPLIT], 1 << (best - V_KS1),
			       us[s][best], 2.0 * dshapes[s].in * dshapes[s].out / (copy_gbs * 1e3));
			tok[0] += layers * us[s][V_FIRST];
			tok[1] += layers * us[s][V_SPLIT];
			tok[2] += layers * us[s][best];
		}
		printf("%-26s %9.3f %9.3f %8.2f %9s %12.3f   (ms: 36 layers + lm_head)\n",
		       "one decode token's GEMVs", tok[0] / 1e3, tok[1] / 1e3, tok[0] / tok[1], "", tok[2] / 1e3);
	}
	gemv_restore();
	kvmem_cuda_free(dw);
	kvmem_cuda_free(dy);
	kvmem_cuda_free(dx);
}

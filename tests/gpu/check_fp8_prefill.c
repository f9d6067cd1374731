// SPDX-License-Identifier: MIT
/*
 * Prefill attention over an fp8 view's layer (kvmem_cuda_attention_fp8,
 * v4's flash kernel reading e4m3 tiles) against
 *  - v4 over the same rows dequantised to bf16 (kvmem_cuda_fp8_view_bf16):
 *    bit for bit, which is what lets an fp8 view's prefill chunks skip the
 *    bf16 scratch and keep the bits they had;
 *  - the CPU twin (kvmem_attention_kv_bf16, fp32), within bf16's rounding;
 *  - a NaN code in K or V: the rows that see it NaN, the others numbers.
 * With --bench, at Qwen3-8B's geometry, what a warm step's question costs
 * a layer: v4 over a bf16 view (bf16's way), the fp8 kernel, and the way
 * fp8 took before (the layer dequantised into the scratch, then v4).
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_bf16.h"
#include "kernels/kernels_cuda.h"
#include "kernels/kernels_cuda_fp8.h"
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"
#include "check_fp8.h"
#include "check_util.h"

/* n_q query tokens, the chunk's last at the key count's end (a prefill
 * chunk appended to a view), over one fp8 layer and its bf16 form. */
struct pre8 {
	struct flayer f;
	void *q, *out, *qp, *k16, *v16;
	uint16_t *hq;
	int32_t *hqp;
	int n_q, n_kv, cap, heads, H, D;
};

static void pre8_make(struct pre8 *p, int n_q, int n_kv, int heads, int H, int D)
{
	p->n_q = n_q, p->n_kv = n_kv, p->cap = n_kv + 9, p->heads = heads, p->H = H, p->D = D;
	flayer_make(&p->f, H, p->cap, D);
	p->hq = rand_bf16((size_t)n_q * heads * D, -2, 2);
	p->hqp = hmalloc(sizeof(int32_t) * n_q);
	for (int i = 0; i < n_q; i++)
		p->hqp[i] = n_kv - n_q + i;
	p->q = dput(p->hq, 2 * (size_t)n_q * heads * D);
	p->qp = dput(p->hqp, sizeof(int32_t) * n_q);
	p->out = dpoison(2 * (size_t)n_q * heads * D);
	p->k16 = dpoison(2 * (size_t)H * p->cap * D), p->v16 = dpoison(2 * (size_t)H * p->cap * D);
	if (kvmem_cuda_fp8_view_bf16(g_c, p->k16, p->v16, p->cap, p->f.k8, p->f.v8, p->f.ks,
				     p->f.vs, H, n_kv, p->cap, D))
		die("fp8 layer as bf16");
}

static void pre8_free(struct pre8 *p)
{
	flayer_free(&p->f);
	free(p->hq), free(p->hqp);
	kvmem_cuda_free(p->q), kvmem_cuda_free(p->qp), kvmem_cuda_free(p->out);
	kvmem_cuda_free(p->k16), kvmem_cuda_free(p->v16);
}

static int run_pre8(void *a)
{
	struct pre8 *p = a;

	return kvmem_cuda_attention_fp8(g_c, p->out, p->q, p->qp, p->n_q, p->f.k8, p->f.v8,
					p->f.ks, p->f.vs, p->n_kv, p->cap, p->heads, p->H, p->D,
					1.0f / sqrtf((float)p->D));
}

/* v4 over the bf16 rows (the dequantised layer, or a bf16 view's). */
static int run_pre16(void *a)
{
	struct pre8 *p = a;

	return kvmem_cuda_attention_bf16_v(g_c, 4, p->out, p->q, p->qp, p->n_q, p->k16, p->v16,
					   NULL, p->n_kv, p->cap, p->heads, p->H, p->D,
					   1.0f / sqrtf((float)p->D));
}

/* The way fp8 views took before: the layer into the bf16 scratch, then v4. */
static int run_deq16(void *a)
{
	struct pre8 *p = a;
	int rc = kvmem_cuda_fp8_view_bf16(g_c, p->k16, p->v16, p->cap, p->f.k8, p->f.v8, p->f.ks,
					  p->f.vs, p->H, p->n_kv, p->cap, p->D);

	return rc ? rc : run_pre16(p);
}

static void check_pre8(int n_q, int n_kv, int heads, int H, int D)
{
	const size_t n = (size_t)n_q * heads * D;
	struct pre8 p;
	uint16_t *a, *b, *ref = hmalloc(2 * n);
	int rc;
	char what[128];

	pre8_make(&p, n_q, n_kv, heads, H, D);
	rc = run_pre16(&p);
	a = dget(p.out, 2 * n);
	rc = rc ? rc : run_pre8(&p);
	b = dget(p.out, 2 * n);
	if (rc) {
		report(0, "prefill over fp8, %d tokens over %d keys: %s", n_q, n_kv,
		       kvmem_last_error());
		goto out;
	}
	report(!memcmp(a, b, 2 * n), "prefill v4 over fp8 K/V: %d tokens over %d keys, %d/%d heads "
	       "x %d, bit for bit v4 over the rows dequantised", n_q, n_kv, heads, H, D);
	if (kvmem_attention_kv_bf16(ref, p.hq, p.hqp, n_q, p.f.hk8, p.f.hv8, p.f.hks, p.f.hvs,
				    KVMEM_DTYPE_FP8, n_kv, p.cap, heads, H, D,
				    1.0f / sqrtf((float)D)))
		die("prefill twin");
	snprintf(what, sizeof(what), "prefill over fp8 K/V against the CPU twin: %d tokens, %d keys, "
		 "%d/%d x %d", n_q, n_kv, heads, H, D);
	/* P rounded to bf16 (v4) against fp32: check_attn_prefill's bounds with
	 * its atol scaled by the rows' largest magnitude here (2^4, flayer_make),
	 * where an output's bf16 ulp is up to 2^-4 */
	cmp_bf16(what, b, ref, n, 0x1p-4 + 4e-3, 0x1p-6);
out:
	free(a), free(b), free(ref);
	pre8_free(&p);
}

/* A NaN code in K of KV head 1 at the last key (only the chunk's last token
 * sees it: its rows of that group NaN), then in V of KV head 2 at key 0,
 * dim 5 (every token sees it: dim 5 of that group's rows NaN); the rest
 * numbers, as v4 gives over the rows dequantised (their code 0x7fc0). */
static void check_pre8_nan(int n_q, int n_kv, int heads, int H, int D)
{
	const int G = heads / H;
	const uint8_t nan_code[2] = { 0x7f, 0xff };
	struct pre8 p;
	int ok = 1, rc = 0;

	pre8_make(&p, n_q, n_kv, heads, H, D);
	for (int kv = 0; kv < 2 && !rc; kv++) {
		const int h = 1 + kv, key = kv ? 0 : n_kv - 1;
		uint8_t *dev = (uint8_t *)(kv ? p.f.v8 : p.f.k8) + ((size_t)h * p.cap + key) * D + 5;
		uint8_t was;
		uint16_t *out;

		was = dpoke(dev, nan_code[kv]);
		rc = run_pre8(&p);
		out = dget(p.out, 2 * (size_t)n_q * heads * D);
		for (int t = 0; t < n_q && !rc; t++)
			for (int qh = 0; qh < heads; qh++)
				for (int i = 0; i < D; i++) {
					const uint16_t x = out[((size_t)t * heads + qh) * D + i];
					const int is_nan = (x & 0x7f80) == 0x7f80 && (x & 0x7f);

					/* K's code: every dim of the row; V's: its own */
					ok &= is_nan == (qh / G == h && (kv ? i == 5 : t == n_q - 1));
				}
		free(out);
		dpoke(dev, was);
	}
	if (rc)
		report(0, "prefill over fp8, a NaN code: %s", kvmem_last_error());
	else
		report(ok, "prefill over fp8: a NaN code in K (head 1, the last key), then in V (head "
		       "2, key 0, dim 5): NaN exactly where it reaches (%d tokens, %d keys)", n_q, n_kv);
	pre8_free(&p);
}

/* A warm step's question (32 tokens; 512) over a 32K / 128K-key layer. */
static void bench_pre8(void)
{
	const int heads = 32, H = 8, D = 128;
	const int shapes[4][2] = { { 32, 32768 }, { 512, 32768 }, { 32, 131072 }, { 512, 131072 } };

	printf("\n== prefill attention over fp8 at Qwen3-8B's geometry, one layer\n");
	for (int s = 0; s < 4; s++) {
		struct pre8 p;
		double t16, t8, td;

		pre8_make(&p, shapes[s][0], shapes[s][1], heads, H, D);
		if (!s) {	/* ncu: tests/gpu/prof27.sh */
			prof_once(run_pre16, &p);
			prof_once(run_pre8, &p);
		}
		t16 = time_ms(run_pre16, &p, 3, 21);
		t8 = time_ms(run_pre8, &p, 3, 21);
		td = time_ms(run_deq16, &p, 3, 21);
		printf("%d tokens over %dK keys: v4 over a bf16 view %.1f us; over fp8: e4m3 tiles "
		       "%.1f us (fp8 / bf16 speed %.2f), dequantised into bf16 then v4 %.1f us "
		       "(%.2f)%s\n", p.n_q, p.n_kv / 1024, t16 * 1e3, t8 * 1e3, t16 / t8, td * 1e3,
		       t16 / td, kvmem_cuda_attention_fp8_same(g_c, p.n_q, heads, H, D) ? "" :
		       " [the main path runs v6 here]");
		pre8_free(&p);
	}
}

void check_fp8_prefill(int bench)
{
	/* decode shapes (<= 16 rows a KV head): v4's decode splits, the fp8
	 * views' way when the scratch has no room */
	check_pre8(4, 700, 32, 8, 128);
	check_pre8(2, 33, 16, 2, 128);
	check_pre8(5, 70, 32, 8, 128);	/* 20 rows a KV head: one m-tile, split keys */
	check_pre8(32, 1000, 32, 8, 128);
	check_pre8(37, 300, 16, 8, 64);
	check_pre8(100, 4100, 8, 8, 128);
	check_pre8(200, 2000, 16, 2, 128);
	check_pre8(300, 300, 32, 8, 128);	/* a first chunk: keys = tokens */
	check_pre8_nan(24, 600, 32, 8, 128);
	if (!g_quick)
		check_pre8(32, 32768, 32, 8, 128);
	if (bench)
		bench_pre8();
}

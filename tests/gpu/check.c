// SPDX-License-Identifier: MIT
/*
 * kvmem_gpu_check: every CUDA op (kernels/kernels_cuda.h) against its CPU twin
 * on fresh random inputs, then (--bench) the timing table. Runs on a GPU
 * machine only; tests/gpu/run.sh drives it, compute-sanitizer included.
 *
 * Each check draws new inputs (the seed is printed; --seed replays it),
 * fills the GPU output with NaN (0xff bytes) first, runs the twin and the
 * op, and compares every element: |gpu - cpu| <= atol + rtol |cpu|, a NaN
 * left where the twin wrote a number counts as unwritten. The tolerances
 * are listed in Documentation/kernels.md. It prints one line per check and
 * closes with "N passed, N failed" (the bench prints its table instead).
 *
 *   kvmem_gpu_check [--quick] [--bench] [--profile] [--gather] [--sample] [--gemv] [--fuse] [--seed N]
 *     --quick   small shapes only (the compute-sanitizer runs)
 *     --bench   the timing table instead of the checks: copy rate, GEMM
 *               rate, attention, GEMMs of Qwen3-8B, selection, sampling,
 *               each with its ratio to the ceiling measured in the run
 *     --profile two runs of each attention configuration (v2, v3; prefill
 *               4096, decode at 32768), nothing else: for ncu
 *     --sample  the draws alone: kvmem_cuda_sample_token and a batched
 *               decode's greedy draws (kvmem_cuda_argmax_rows) against
 *               their twins
 *     --gemv    the one-row GEMM's decode shapes alone: each kernel and
 *               split against the twin, then their times against the copy
 *               rate (check_gemv.c; tests/gpu/gemv_sweep.sh)
 *     --fuse    decode's fused ops alone (check_fuse.c; tests/gpu/decode_fuse.sh)
 *     --attn-decode  decode attention alone: every version against the twin,
 *               then their times (check_attn_decode.c; tests/gpu/attn_decode.sh)
 *     --attn-prefill  prefill attention alone: v4 and v6 against the twin,
 *               then their times (check_attn_prefill.c; tests/gpu/attn_prefill.sh)
 *     --fp8     fp8 KV alone: quantising, the fp8 gather, decode attention over
 *               fp8 K/V against their twins; with --bench, the fp8 / bf16
 *               timings (check_fp8.c; tests/gpu/fp8.sh)
 *     --attn-batch  the batched attention alone: against the twin and
 *               itself alone, then its time beside a decode call per
 *               sequence (check_attn_batch.c)
 *     --gemm-tc  the tensor-core GEMM for few rows alone: against its twin,
 *               bit for bit whatever the batch, then a layer's GEMMs with it
 *               and without (check_gemm_tc.c; tests/gpu/batch26h.sh)
 *     --gemm-pin  GEMMs of many rows on one algorithm alone: a row's bits
 *               among others, then the times pinned and not
 *               (check_gemm_pin.c; tests/gpu/prefill26.sh)
 *     --pages   a forward's rows into pages in host memory alone, against
 *               the twin (check_pages.c; tests/gpu/gpu24c.sh)
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels_cuda.h"
#include "kvmem/kvmem.h"
#include "check_attn_batch.h"
#include "check_gemm_tc.h"
#include "check_gemm_pin.h"
#include "check_attn_decode.h"
#include "check_attn_prefill.h"
#include "check_fp8.h"
#include "check_fuse.h"
#include "check_gather.h"
#include "check_pages.h"
#include "check_gemv.h"
#include "check_gemv_rows.h"
#include "check_perf.h"
#include "check_util.h"

/* ---- dense ops -------------------------------------------------------------- */

static void check_convert(void)
{
	size_t n = g_quick ? 1000 : 1 << 20;
	float *f = rand_f32(n, -1e5, 1e5);
	uint16_t *h = hmalloc(2 * n), *ref = hmalloc(2 * n), *got;
	void *df, *dh, *dout = dpoison(2 * n);

	for (size_t i = 0; i < n; i++)
		h[i] = kvmem_f32_to_f16(f[i] / 16);
	df = dput(f, 4 * n);
	dh = dput(h, 2 * n);
	kvmem_convert_to_bf16(ref, f, KVMEM_DTYPE_F32, n);
	if (kvmem_cuda_convert_to_bf16(g_c, dout, df, KVMEM_DTYPE_F32, n))
		die("convert");
	got = dget(dout, 2 * n);
	cmp_bf16("convert f32->bf16 (exact)", got, ref, n, 0, 0);
	free(got);
	kvmem_convert_to_bf16(ref, h, KVMEM_DTYPE_F16, n);
	if (kvmem_cuda_convert_to_bf16(g_c, dout, dh, KVMEM_DTYPE_F16, n))
		die("convert");
	got = dget(dout, 2 * n);
	cmp_bf16("convert f16->bf16 (exact)", got, ref, n, 0, 0);
	free(got);
	free(f);
	free(h);
	free(ref);
	kvmem_cuda_free(df);
	kvmem_cuda_free(dh);
	kvmem_cuda_free(dout);
}

static void check_embedding(void)
{
	int vocab = 1000, dim = g_quick ? 64 : 4096, n = 37;
	uint16_t *table = rand_bf16((size_t)vocab * dim, -1, 1);
	int32_t ids[37];
	float *ref = hmalloc(4 * (size_t)n * dim), *got;
	void *dt, *di, *dout = dpoison(4 * (size_t)n * dim);
	char what[64];

	for (int i = 0; i < n; i++)
		ids[i] = rint_in(0, vocab - 1);
	dt = dput(table, 2 * (size_t)vocab * dim);
	di = dput(ids, sizeof(ids));
	kvmem_embedding_bf16(ref, table, ids, n, dim);
	if (kvmem_cuda_embedding_bf16(g_c, dout, dt, di, n, dim))
		die("embedding");
	got = dget(dout, 4 * (size_t)n * dim);
	snprintf(what, sizeof(what), "embedding %dx%d (exact)", n, dim);
	cmp_f32(what, got, ref, (size_t)n * dim, 0, 0);
	free(table);
	free(ref);
	free(got);
	kvmem_cuda_free(dt);
	kvmem_cuda_free(di);
	kvmem_cuda_free(dout);
}

static void check_norms(void)
{
	static const int shapes[][2] = { { 1, 4096 }, { 7, 1000 }, { 64, 4096 } };

	for (int s = 0; s < (g_quick ? 1 : 3); s++) {
		int n = shapes[s][0], dim = g_quick ? 256 : shapes[s][1];
		size_t len = (size_t)n * dim;
		float *x = rand_f32(len, -4, 4);
		uint16_t *w = rand_bf16(dim, 0.5, 1.5), *ref = hmalloc(2 * len), *got;
		void *dx = dput(x, 4 * len), *dw = dput(w, 2 * dim), *dout = dpoison(2 * len);
		char what[64];

		kvmem_rmsnorm_bf16(ref, x, w, n, dim, 1e-6f);
		if (kvmem_cuda_rmsnorm_bf16(g_c, dout, dx, dw, n, dim, 1e-6f))
			die("rmsnorm");
		got = dget(dout, 2 * len);
		snprintf(what, sizeof(what), "rmsnorm %dx%d", n, dim);
		cmp_bf16(what, got, ref, len, 0, ULP1);
		free(x);
		free(w);
		free(ref);
		free(got);
		kvmem_cuda_free(dx);
		kvmem_cuda_free(dw);
		kvmem_cuda_free(dout);
	}
	{
		int rows = g_quick ? 64 : 64 * 32, hd = 128;
		size_t len = (size_t)rows * hd;
		uint16_t *x = rand_bf16(len, -3, 3), *w = rand_bf16(hd, 0.5, 1.5), *got;
		void *dx = dput(x, 2 * len), *dw = dput(w, 2 * hd);

		kvmem_headnorm_bf16(x, w, rows, hd, 1e-6f);
		if (kvmem_cuda_headnorm_bf16(g_c, dx, dw, rows, hd, 1e-6f))
			die("headnorm");
		got = dget(dx, 2 * len);
		cmp_bf16("headnorm 2048 heads x 128", got, x, len, 0, ULP1);
		free(x);
		free(w);
		free(got);
		kvmem_cuda_free(dx);
		kvmem_cuda_free(dw);
	}
}

static void check_swiglu_add(void)
{
	/* dim % 8 == 0: the 16-byte kernel; 300: the element one */
	const int n = 17, dims[] = { g_quick ? 296 : 12288, 300 };

	for (int k = 0; k < 4; k++) {
		const int fused = k & 1, dim = dims[k >> 1], ld = fused ? 2 * dim : dim;
		size_t in = (size_t)n * ld, on = (size_t)n * dim;
		uint16_t *gate = rand_bf16(in, -8, 8), *up = fused ? NULL : rand_bf16(in, -3, 3);
		uint16_t *ref = hmalloc(2 * on), *got;
		void *dg = dput(gate, 2 * in), *du = fused ? (uint16_t *)dg + dim : dput(up, 2 * in);
		void *dout = dpoison(2 * on);

		kvmem_swiglu_bf16(ref, gate, fused ? gate + dim : up, n, dim, ld);
		if (kvmem_cuda_swiglu_bf16(g_c, dout, dg, du, n, dim, ld))
			die("swiglu");
		got = dget(dout, 2 * on);
		cmp_bf16(fused ? "swiglu fused [gate|up]" : "swiglu", got, ref, on, 0, ULP1);
		free(gate);
		free(up);
		free(ref);
		free(got);
		kvmem_cuda_free(dg);
		if (!fused)
			kvmem_cuda_free(du);
		kvmem_cuda_free(dout);
	}
	{
		size_t len = g_quick ? 1000 : 3 << 20;
		float *y = rand_f32(len, -5, 5), *x = rand_f32(len, -5, 5), *got;
		void *dy = dput(y, 4 * len), *dx = dput(x, 4 * len);

		kvmem_add(y, x, len);
		if (kvmem_cuda_add(g_c, dy, dx, len))
			die("add");
		got = dget(dy, 4 * len);
		cmp_f32("add (exact)", got, y, len, 0, 0);
		free(y);
		free(x);
		free(got);
		kvmem_cuda_free(dy);
		kvmem_cuda_free(dx);
	}
}

/* ---- GEMM --------------------------------------------------------------------- */

static void check_gemm(void)
{
	static const int shapes[][3] = { { 1, 4096, 6144 }, { 7, 1000, 333 }, { 128, 4096, 4096 },
					 { 3, 64, 100 } };
	static const char *modes[] = { "bf16", "f32", "f32+=" };

	for (int s = g_quick ? 3 : 0; s < 4; s++) {
		int n = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
		uint16_t *x = rand_bf16((size_t)n * in, -2, 2), *w = rand_bf16((size_t)out * in, -1, 1);
		uint16_t *xa = hmalloc(2 * (size_t)n * in), *wa = hmalloc(2 * (size_t)out * in);
		float *y0 = rand_f32((size_t)n * out, -3, 3), *abs_ = hmalloc(4 * (size_t)n * out);
		void *dx = dput(x, 2 * (size_t)n * in), *dw = dput(w, 2 * (size_t)out * in);

		/* sum |x w| per output: the twin on |x|, |w| */
		for (size_t i = 0; i < (size_t)n * in; i++)
			xa[i] = x[i] & 0x7fff;
		for (size_t i = 0; i < (size_t)out * in; i++)
			wa[i] = w[i] & 0x7fff;
		kvmem_gemm_bf16(abs_, KVMEM_GEMM_F32, xa, wa, n, in, out);
		for (int mode = 0; mode < 3; mode++) {
			size_t on = (size_t)n * out, eb = mode == KVMEM_GEMM_BF16 ? 2 : 4;
			void *ref = hmalloc(eb * on), *got, *dy;
			struct cmp c = { 0 };
			char what[80];

			if (mode == KVMEM_GEMM_F32_ADD) {
				memcpy(ref, y0, 4 * on);
				dy = dput(y0, 4 * on);
			} else {
				dy = dpoison(eb * on);
			}
			if (kvmem_gemm_bf16(ref, mode, x, w, n, in, out))
				die("gemm twin");
			if (kvmem_cuda_gemm_bf16(g_c, dy, mode, dx, dw, n, in, out))
				die("gemm");
			got = dget(dy, eb * on);
			for (size_t i = 0; i < on; i++) {
				double tol = 1e-5 * abs_[i];

				if (mode == KVMEM_GEMM_BF16)
					cmp_one(&c, bf(((uint16_t *)got)[i]), bf(((uint16_t *)ref)[i]), tol, ULP1);
				else
					cmp_one(&c, ((float *)got)[i], ((float *)ref)[i],
						tol + (mode == KVMEM_GEMM_F32_ADD ? 1e-6 * fabs(y0[i]) : 0), 0);
			}
			snprintf(what, sizeof(what), "gemm %dx%d->%d %s", n, in, out, modes[mode]);
			cmp_report(&c, what, 1e-5, mode == KVMEM_GEMM_BF16 ? ULP1 : 0);
			free(ref);
			free(got);
			kvmem_cuda_free(dy);
		}
		free(x);
		free(w);
		free(xa);
		free(wa);
		free(y0);
		free(abs_);
		kvmem_cuda_free(dx);
		kvmem_cuda_free(dw);
	}
	{	/* logits: final norm + lm_head, fp32 out */
		int n = 2, hidden = g_quick ? 64 : 4096, vocab = g_quick ? 100 : 32000;
		float *x = rand_f32((size_t)n * hidden, -3, 3), *ref = hmalloc(4 * (size_t)n * vocab), *got;
		uint16_t *nw = rand_bf16(hidden, 0.5, 1.5), *lm = rand_bf16((size_t)vocab * hidden, -0.05, 0.05);
		uint16_t *tmp = hmalloc(2 * (size_t)n * hidden);
		void *dx = dput(x, 4 * (size_t)n * hidden), *dn = dput(nw, 2 * hidden);
		void *dl = dput(lm, 2 * (size_t)vocab * hidden), *dt = dpoison(2 * (size_t)n * hidden);
		void *dout = dpoison(4 * (size_t)n * vocab);

		kvmem_logits_bf16(ref, x, nw, lm, tmp, n, hidden, vocab, 1e-6f);
		if (kvmem_cuda_logits_bf16(g_c, dout, dx, dn, dl, dt, n, hidden, vocab, 1e-6f))
			die("logits");
		got = dget(dout, 4 * (size_t)n * vocab);
		/* |h| <= ~4 (bf16 of a unit-RMS row times w), |w| <= 0.05 */
		cmp_f32("logits (norm + lm_head)", got, ref, (size_t)n * vocab, 1e-5 * hidden * 0.05, 0);
		free(x);
		free(ref);
		free(got);
		free(nw);
		free(lm);
		free(tmp);
		kvmem_cuda_free(dx);
		kvmem_cuda_free(dn);
		kvmem_cuda_free(dl);
		kvmem_cuda_free(dt);
		kvmem_cuda_free(dout);
	}
}

/* ---- RoPE, view scatter ----------------------------------------------------- */

static void check_rope(void)
{
	int n = g_quick ? 4 : 64, heads = 32, hd = 128;
	size_t len = (size_t)n * heads * hd;
	uint16_t *x = rand_bf16(len, -2, 2), *got;
	int32_t *pos = hmalloc(4 * n);
	void *dx, *dp;

	for (int t = 0; t < n; t++)
		pos[t] = t % 3 == 0 ? t : rint_in(0, t % 3 == 1 ? 40000 : 4000000);
	dx = dput(x, 2 * len);
	dp = dput(pos, 4 * n);
	kvmem_rope_bf16(x, pos, n, heads, hd, 1e6);
	if (kvmem_cuda_rope_bf16(g_c, dx, dp, n, heads, hd, 1e6))
		die("rope");
	got = dget(dx, 2 * len);
	cmp_bf16("rope 32x128, pos to 4M (1 ulp)", got, x, len, 0, ULP1);
	free(x);
	free(pos);
	free(got);
	kvmem_cuda_free(dx);
	kvmem_cuda_free(dp);
}

static void check_scatter(void)
{
	const int L = 4, H = 8, hd = 128, B = 32, cap = g_quick ? 512 : 4096;
	const int pages = g_quick ? 4 : 100, news = g_quick ? 20 : 500;
	size_t vn = (size_t)L * H * cap * hd;
	size_t sn = (size_t)pages * H * B * hd + (size_t)news * H * hd;
	uint16_t *sk = rand_bf16(sn, -2, 2), *sv = rand_bf16(sn, -2, 2);
	uint16_t *vk = hmalloc(2 * vn), *vv = hmalloc(2 * vn), *gk, *gv;
	kvmem_scatter_item *it = hmalloc(sizeof(*it) * (pages + 2));
	int n_items = 0, nslots = cap / B;
	int *used = calloc((size_t)L * nslots, sizeof(int));
	void *dk = dpoison(2 * vn), *dv = dpoison(2 * vn), *dsk = dput(sk, 2 * sn);
	void *dsv = dput(sv, 2 * sn), *dit;

	memset(vk, 0xff, 2 * vn);
	memset(vv, 0xff, 2 * vn);
	/* Pages (some partial, from u0) at distinct block-aligned slots, the
	 * last layer's tail for the new tokens. */
	for (int p = 0; p < pages; p++) {
		int l, s, u0 = rint_in(0, 8), nt = rint_in(1, B - u0);

		do {
			l = rint_in(0, L - 1);
			s = rint_in(0, nslots - 1 - (news + B - 1) / B);
		} while (used[l * nslots + s]);
		used[l * nslots + s] = 1;
		it[n_items++] = (kvmem_scatter_item){ .layer = l, .slot = s * B + u0, .n = nt,
						      .tok_stride = hd,
						      .src = (int64_t)p * H * B * hd + (int64_t)u0 * hd,
						      .head_stride = B * hd };
	}
	it[n_items++] = (kvmem_scatter_item){ .layer = L - 1, .slot = cap - news, .n = news,
					      .tok_stride = H * hd,
					      .src = (int64_t)pages * H * B * hd, .head_stride = hd };
	it[n_items++] = (kvmem_scatter_item){ .layer = 0, .slot = cap - 3, .n = 10,
					      .tok_stride = hd, .src = 0, .head_stride = B * hd };
	dit = dput(it, sizeof(*it) * n_items);
	kvmem_view_scatter_bf16(vk, vv, sk, sv, it, n_items, L, H, hd, cap, 1e6);	/* -EINVAL: the last */
	if (kvmem_cuda_view_scatter_bf16(g_c, dk, dv, dsk, dsv, dit, n_items, L, H, hd, cap, 1e6))
		die("view scatter");
	gk = dget(dk, 2 * vn);
	gv = dget(dv, 2 * vn);
	cmp_bf16("view scatter K (re-RoPE, 1 ulp)", gk, vk, vn, 0, ULP1);
	cmp_bf16("view scatter V (exact)", gv, vv, vn, 0, 0);
	free(sk);
	free(sv);
	free(vk);
	free(vv);
	free(gk);
	free(gv);
	free(it);
	free(used);
	kvmem_cuda_free(dk);
	kvmem_cuda_free(dv);
	kvmem_cuda_free(dsk);
	kvmem_cuda_free(dsv);
	kvmem_cuda_free(dit);
}

/* ---- attention ---------------------------------------------------------------- */

void check_attention_one(const struct att_shape *s, int version)
{
	const int n_q = s->n_q, n_kv = s->n_kv, heads = s->heads, kvh = s->kvh, hd = s->hd;
	const size_t stride = n_kv + 17, qn = (size_t)n_q * heads * hd, kn = (size_t)kvh * stride * hd;
	uint16_t *q = rand_bf16(qn, -1, 1), *k = rand_bf16(kn, -1, 1), *v = rand_bf16(kn, -1, 1);
	uint16_t *ref = hmalloc(2 * qn), *got;
	int32_t *qp = hmalloc(4 * n_q), *kp = hmalloc(4 * (n_kv ? n_kv : 1));
	void *dq, *dk, *dv, *dqp, *dkp = NULL, *dout = dpoison(2 * qn);
	char what[96];
	int rc;

	/* Rows past n_kv: NaN, never to be read. */
	for (int g = 0; g < kvh; g++)
		for (size_t j = n_kv; j < stride; j++)
			for (int e = 0; e < hd; e++)
				k[((size_t)g * stride + j) * hd + e] = v[((size_t)g * stride + j) * hd + e] = 0xffff;
	if (s->explicit_pos) {
		/* Positions with gaps, not in slot order; some queries see nothing. */
		for (int j = 0; j < n_kv; j++)
			kp[j] = rint_in(0, 3 * n_kv);
		for (int i = 0; i < n_q; i++)
			qp[i] = i % 7 == 0 ? -1 : rint_in(0, 3 * n_kv);
	} else {
		for (int i = 0; i < n_q; i++)	/* the chunk at the end of the view */
			qp[i] = n_kv - n_q + i;
	}
	dq = dput(q, 2 * qn);
	dk = dput(k, 2 * kn);
	dv = dput(v, 2 * kn);
	dqp = dput(qp, 4 * n_q);
	if (s->explicit_pos)
		dkp = dput(kp, 4 * n_kv);
	if (kvmem_attention_bf16(ref, q, qp, n_q, k, v, s->explicit_pos ? kp : NULL, n_kv, stride,
				 heads, kvh, hd, 1.0f / sqrtf((float)hd)))
		die("attention twin");
	rc = kvmem_cuda_attention_bf16_v(g_c, version, dout, dq, dqp, n_q, dk, dv, dkp, n_kv, stride,
					 heads, kvh, hd, 1.0f / sqrtf((float)hd));
	snprintf(what, sizeof(what), "attention v%d %s", version, s->name);
	if (rc) {
		report(0, "%s: %s", what, kvmem_last_error());
	} else {
		got = dget(dout, 2 * qn);
		/* P rounded to bf16 for P.V (about 2^-9 of each weight) and the
		 * bf16 output: V in [-1, 1]. */
		cmp_bf16(what, got, ref, qn, 4e-3, ULP1);
		free(got);
	}
	free(q);
	free(k);
	free(v);
	free(ref);
	free(qp);
	free(kp);
	kvmem_cuda_free(dq);
	kvmem_cuda_free(dk);
	kvmem_cuda_free(dv);
	kvmem_cuda_free(dqp);
	kvmem_cuda_free(dkp);
	kvmem_cuda_free(dout);
}

static void check_attention(void)
{
	static const struct att_shape full[] = {
		{ "8B prefill chunk 128 @ 1000", 128, 1000, 32, 8, 128, 0 },
		{ "8B prefill 512x512 causal", 512, 512, 32, 8, 128, 0 },
		{ "8B decode 1 @ 20000 (split-K)", 1, 20000, 32, 8, 128, 0 },
		{ "8B decode 3 @ 5000", 3, 5000, 32, 8, 128, 0 },
		{ "MHA 4/4 hd128 70x70", 70, 70, 4, 4, 128, 0 },
		{ "hd64 8/2 kv_pos shuffled", 37, 300, 8, 2, 64, 1 },
		{ "hd64 agentlang decode 1 @ 2048", 1, 2048, 8, 2, 64, 0 },
		{ "hd128 64/8 group 8 chunk 16 @ 9000", 16, 9000, 64, 8, 128, 0 },
	};
	static const struct att_shape quick[] = {
		{ "quick prefill 40x100", 40, 100, 8, 2, 128, 0 },
		{ "quick decode 1 @ 700", 1, 700, 8, 2, 64, 0 },
		{ "quick kv_pos 9x70", 9, 70, 4, 2, 64, 1 },
	};
	const struct att_shape *sh = g_quick ? quick : full;
	int ns = g_quick ? 3 : 8;

	for (int i = 0; i < ns; i++)
		for (int v = 1; v <= 3; v++)
			if (!(v == 1 && g_quick && i > 0))
				check_attention_one(&sh[i], v);
}

/* ---- sampling ---------------------------------------------------------------- */

static void check_sample(void)
{
	const int vocab = g_quick ? 3000 : 151936;
	static const struct {
		const char *name;
		float t, p;
		int k, ties;
	} cfg[] = {
		{ "greedy", 0, 1, 0, 0 },         { "greedy ties", 0, 1, 0, 1 },
		{ "T0.7 k20 p0.95", 0.7f, 0.95f, 20, 0 }, { "T1 k50 ties", 1, 1, 50, 1 },
		{ "T0.5 k1024", 0.5f, 1, 1024, 0 }, { "T1 p0.9 (sort)", 1, 0.9f, 0, 0 },
		{ "T1.3 k2000 p0.8 (sort, ties)", 1.3f, 0.8f, 2000, 1 },
	};
	float *lg = hmalloc(4 * vocab);
	void *dl = dpoison(4 * vocab), *dtok = dpoison(4), *drng = dpoison(8);

	for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
		kvmem_sampler s = { .temperature = cfg[c].t, .top_k = cfg[c].k, .top_p = cfg[c].p,
				    .seed = rnext() };
		uint64_t rng = kvmem_rng_seed(s.seed), grng;
		int draws = g_quick ? 2 : 25, same = 0;

		if (kvmem_cuda_upload(g_c, drng, &rng, 8))
			die("upload");
		for (int d = 0; d < draws; d++) {
			int32_t want, got;

			for (int i = 0; i < vocab; i++) {
				double u = runi(-1, 1);

				lg[i] = cfg[c].ties ? (float)rint_in(-4, 4) : (float)(3 * u * u * u + runi(-1, 1));
				if (i % 9973 == 5)
					lg[i] = NAN;
				if (i % 7919 == 3)
					lg[i] = -INFINITY;
			}
			if (kvmem_cuda_upload(g_c, dl, lg, 4 * vocab))
				die("upload");
			if (kvmem_sample_token(&want, lg, vocab, &s, &rng))
				die("sample twin");
			if (kvmem_cuda_sample_token(g_c, dtok, dl, vocab, &s, drng))
				die("sample");
			if (kvmem_cuda_download(g_c, &got, dtok, 4) || kvmem_cuda_download(g_c, &grng, drng, 8))
				die("sample download");
			same += got == want && grng == rng;
		}
		report(same == draws, "sample %-30s vocab %d: %d of %d draws the same token and RNG state",
		       cfg[c].name, vocab, same, draws);
	}
	free(lg);
	kvmem_cuda_free(dl);
	kvmem_cuda_free(dtok);
	kvmem_cuda_free(drng);
}

/*
 * A batched decode's greedy draws (kvmem_cuda_argmax_rows) against the
 * twin, kvmem_argmax_finite, row by row: rows of random logits, of few
 * values (ties: the first must win), with -0 before +0 at the top, with a
 * NaN or an infinity (-1), with the last id the best; each row copied
 * where its pointer is set, nothing written where it is not.
 */
static void check_argmax_rows(void)
{
	const int vocab = g_quick ? 3001 : 151936, n = g_quick ? 10 : 64;
	float *lg = hmalloc(4 * (size_t)n * vocab), *back = hmalloc(4 * (size_t)vocab);
	void *dl = dpoison(4 * (size_t)n * vocab), *dout = dpoison(4 * (size_t)n);
	void *drows = dpoison(4 * (size_t)n * vocab), *dptr;
	float **ptr = hmalloc(sizeof(float *) * (size_t)n);
	int32_t *got = hmalloc(4 * (size_t)n);
	int same = 0, copies = 0, copied = 0, stray = 0, bad_rows = 0;

	for (int i = 0; i < n; i++) {
		float *row = lg + (size_t)i * vocab;
		const int kind = i % 5;

		for (int j = 0; j < vocab; j++) {
			const double u = runi(-1, 1);

			row[j] = kind == 1 ? (float)rint_in(-3, 3) : (float)(4 * u * u * u + runi(-1, 1));
		}
		if (kind == 2) {	/* the top is a zero: -0 first, +0 later */
			for (int j = 0; j < vocab; j++)
				row[j] = -fabsf(row[j]) - 0.5f;
			row[rint_in(0, vocab / 2)] = -0.0f;
			row[rint_in(vocab / 2 + 1, vocab - 1)] = 0.0f;
		}
		if (kind == 3)
			row[rint_in(0, vocab - 1)] = i & 1 ? NAN : INFINITY;
		if (kind == 4)
			row[vocab - 1] = 1e30f;	/* the last id wins */
		ptr[i] = i % 3 ? (float *)drows + (size_t)i * vocab : NULL;
		copies += ptr[i] != NULL;
	}
	if (kvmem_cuda_upload(g_c, dl, lg, 4 * (size_t)n * vocab))
		die("upload");
	dptr = dput(ptr, sizeof(float *) * (size_t)n);
	if (kvmem_cuda_argmax_rows(g_c, dout, (float *const *)dptr, dl, n, vocab) ||
	    kvmem_cuda_download(g_c, got, dout, 4 * (size_t)n))
		die("argmax rows");
	for (int i = 0; i < n; i++) {
		int bad, want = kvmem_argmax_finite(lg + (size_t)i * vocab, vocab, &bad);
		uint32_t word;

		same += got[i] == want;
		bad_rows += want < 0;
		if (got[i] != want)
			printf("  row %d: %d, the twin %d\n", i, got[i], want);
		if (kvmem_cuda_download(g_c, back, (float *)drows + (size_t)i * vocab, 4 * (size_t)vocab))
			die("download");
		memcpy(&word, back, 4);
		if (ptr[i])
			copied += !memcmp(back, lg + (size_t)i * vocab, 4 * (size_t)vocab);
		else
			stray += word != 0xffffffffu;
	}
	report(same == n && copied == copies && !stray && bad_rows > 0,
	       "argmax rows %d x %d: %d of %d the twin's draw (%d rows with NaN/inf), %d of %d rows "
	       "copied whole, %d written without a pointer", n, vocab, same, n, bad_rows, copied,
	       copies, stray);
	free(lg);
	free(back);
	free(ptr);
	free(got);
	kvmem_cuda_free(dl);
	kvmem_cuda_free(dout);
	kvmem_cuda_free(drows);
	kvmem_cuda_free(dptr);
}

/*
 * A batched step's rows drawn at a temperature (kvmem_cuda_draw_rows, after
 * kvmem_cuda_argmax_rows as the cuda backend runs them) against the twin,
 * kvmem_sample over each row with its banned ids at -inf, from a copy of
 * the row's random state (and kvmem_sample_spec, the cpu backend's form): every top-k path (none, past 1024, 1024 and
 * less), top-p from none to 1e-6, ties, every logit equal, a peaked row,
 * -0 beside +0, NaN rows (-1, left for the host), greedy rows among them
 * (the argmax's), stops banned.
 */
static void check_draw_rows(void)
{
	const int vocab = g_quick ? 3001 : 151936, n = g_quick ? 12 : 40, rounds = g_quick ? 1 : 3;
	static const int ks[] = { 0, 0, 20, 1024, 2000, 50 };
	static const float ps[] = { 1, 0.9f, 0.95f, 1, 0.8f, 1e-6f };
	float *lg = hmalloc(4 * (size_t)n * vocab);
	void *dl = dpoison(4 * (size_t)n * vocab), *dout = dpoison(4 * (size_t)n);
	void *drows = dpoison(4 * (size_t)n * vocab), *dptr, *dspec = dpoison(sizeof(kvmem_draw_spec) * n);
	float **ptr = hmalloc(sizeof(float *) * (size_t)n), *masked = hmalloc(4 * (size_t)vocab);
	kvmem_draw_spec *spec = hmalloc(sizeof(kvmem_draw_spec) * (size_t)n);
	int32_t *got = hmalloc(4 * (size_t)n);
	int same = 0, rows = 0, drawn = 0, left = 0;

	for (int i = 0; i < n; i++)
		ptr[i] = (float *)drows + (size_t)i * vocab;
	dptr = dput(ptr, sizeof(float *) * (size_t)n);
	for (int r = 0; r < rounds; r++) {
		int small = 0, narrowed = 0;

		for (int i = 0; i < n; i++) {
			float *row = lg + (size_t)i * vocab;
			const int kind = (i + r) % 7;
			const double spread = kind == 2 ? 40 : kind == 5 ? 0.3 : 4;

			for (int j = 0; j < vocab; j++) {
				const double u = runi(-1, 1);

				row[j] = kind == 1 ? (float)rint_in(-3, 3)
						   : (float)(spread * u * u * u + runi(-1, 1));
			}
			if (kind == 3)
				row[rint_in(0, vocab - 1)] = NAN;	/* the host refuses it: -1 */
			if (kind == 4) {
				row[rint_in(0, vocab / 2)] = -0.0f;
				row[rint_in(vocab / 2 + 1, vocab - 1)] = 0.0f;
			}
			if (kind == 6)	/* one value: every key equal */
				for (int j = 0; j < vocab; j++)
					row[j] = 0.5f;
			if (i % 11 == 10) {	/* peaked: a few ids far above a mass */
				for (int j = 0; j < vocab; j++)
					row[j] = (float)(-20 + runi(-1, 1));
				for (int j = 0; j < 5; j++)
					row[rint_in(0, vocab - 1)] = (float)runi(2, 4);
			}
			spec[i] = (kvmem_draw_spec){ .temperature = i % 9 == 8 ? 0.0f : (float)runi(0.3, 1.5),
						     .top_k = ks[i % 6], .top_p = ps[(i / 6 + r) % 6],
						     .rng = kvmem_rng_seed(rnext()) };
			if (i % 4 == 1) {	/* stops never drawn, the best among them */
				spec[i].n_banned = 1 + i % KVMEM_DRAW_BANNED_MAX;
				for (int b = 0; b < spec[i].n_banned; b++)
					spec[i].banned[b] = rint_in(0, vocab - 1);
				spec[i].banned[0] = kvmem_argmax_finite(row, vocab, &(int){ 0 });
				if (spec[i].banned[0] < 0)
					spec[i].banned[0] = 0;
			}
			if (spec[i].temperature > 0) {
				const int k = spec[i].top_k > 0 && spec[i].top_k < vocab ? spec[i].top_k : vocab;

				small |= k < vocab && k <= 1024;
				narrowed |= !(k < vocab && k <= 1024);
			}
		}
		if (kvmem_cuda_upload(g_c, dl, lg, 4 * (size_t)n * vocab) ||
		    kvmem_cuda_upload(g_c, dspec, spec, sizeof(kvmem_draw_spec) * n))
			die("upload");
		if (kvmem_cuda_argmax_rows(g_c, dout, (float *const *)dptr, dl, n, vocab) ||
		    kvmem_cuda_draw_rows(g_c, dout, dl, n, vocab, dspec, small, narrowed) ||
		    kvmem_cuda_download(g_c, got, dout, 4 * (size_t)n))
			die("draw rows");
		for (int i = 0; i < n; i++) {
			float *row = lg + (size_t)i * vocab;
			kvmem_sampler s = { .temperature = spec[i].temperature, .top_k = spec[i].top_k,
					    .top_p = spec[i].top_p };
			uint64_t st = spec[i].rng;
			int bad, want = kvmem_argmax_finite(row, vocab, &bad);

			if (want >= 0 && s.temperature > 0) {
				memcpy(masked, row, 4 * (size_t)vocab);
				for (int b = 0; b < spec[i].n_banned; b++)
					masked[spec[i].banned[b]] = -INFINITY;
				want = kvmem_sample(masked, vocab, &s, &st);
				drawn++;
				/* the cpu backend's form of the same draw */
				if (kvmem_sample_spec(row, vocab, &spec[i]) != want)
					printf("  round %d row %d: kvmem_sample_spec differs from the "
					       "masked draw\n", r, i), same--;
			}
			left += got[i] < 0;
			same += got[i] == want;
			rows++;
			if (got[i] != want)
				printf("  round %d row %d (T %.3f k %d p %g, %d banned): %d, the twin %d\n", r,
				       i, s.temperature, s.top_k, (double)s.top_p, spec[i].n_banned, got[i],
				       want);
		}
	}
	report(same == rows && left > 0 && drawn > rows / 2,
	       "draw rows %d x %d, %d rounds: %d of %d the twin's token (%d drawn at a temperature, "
	       "%d left to the host)", n, vocab, rounds, same, rows, drawn, left);
	/* What a round of 16 streams at T 0.8 with no top-k costs (the narrowed
	 * path over every key that can weigh), and a lone stream's draw, beside
	 * the argmax alone. */
	if (!g_quick)
		for (int m = 16; m >= 1; m -= 15) {
			double t_arg = 0, t_all = 0;

			for (int i = 0; i < m; i++) {
				spec[i] = (kvmem_draw_spec){ .temperature = 0.8f,
							     .rng = kvmem_rng_seed(i) };
				for (int j = 0; j < vocab; j++) {	/* every row drawn: no NaN */
					const double u = runi(-1, 1);

					lg[(size_t)i * vocab + j] = (float)(4 * u * u * u + runi(-1, 1));
				}
			}
			if (kvmem_cuda_upload(g_c, dspec, spec, sizeof(kvmem_draw_spec) * m))
				die("upload");
			for (int it = 0; it < 6; it++) {
				struct timespec a, b, c;

				kvmem_cuda_upload(g_c, dl, lg, 4 * (size_t)m * vocab);
				kvmem_cuda_sync(g_c);
				clock_gettime(CLOCK_MONOTONIC, &a);
				if (kvmem_cuda_argmax_rows(g_c, dout, (float *const *)dptr, dl, m, vocab) ||
				    kvmem_cuda_sync(g_c))
					die("argmax rows");
				clock_gettime(CLOCK_MONOTONIC, &b);
				if (kvmem_cuda_draw_rows(g_c, dout, dl, m, vocab, dspec, 0, 1) ||
				    kvmem_cuda_sync(g_c))
					die("draw rows");
				clock_gettime(CLOCK_MONOTONIC, &c);
				if (it) {	/* the first grows the scratch */
					t_arg += (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) * 1e-6;
					t_all += (c.tv_sec - a.tv_sec) * 1e3 + (c.tv_nsec - a.tv_nsec) * 1e-6;
				}
			}
			printf("  draw rows, %d row%s x %d at T 0.8 (no top-k): %.3f ms with the argmax's "
			       "copy (the argmax alone %.3f ms), mean of 5\n", m, m > 1 ? "s" : "", vocab,
			       t_all / 5, t_arg / 5);
		}
	free(lg);
	free(ptr);
	free(masked);
	free(spec);
	free(got);
	kvmem_cuda_free(dl);
	kvmem_cuda_free(dout);
	kvmem_cuda_free(drows);
	kvmem_cuda_free(dptr);
	kvmem_cuda_free(dspec);
}

/* ---- selection scorers ------------------------------------------------------- */

static void check_scores(void)
{
	const int L = g_quick ? 2 : 36, heads = 32, kvh = 8, d = 128, B = 32, n_q = 2;
	const int64_t nb = g_quick ? 300 : 2000, cap = nb + 48;
	const double theta = 1e6;
	const int64_t span = 8192;
	kvmem_score_geom g = { .n_layers = L, .n_heads = heads, .n_kv_heads = kvh, .head_dim = d,
			       .block = B, .n_blocks = nb, .cap_blocks = cap, .last_len = 21,
			       .last_sub = { 8, 8, 5, 0 }, .index_dtype = KVMEM_DTYPE_F32 };
	size_t rows = (size_t)L * kvh * cap * d, qn = (size_t)L * n_q * heads * d;
	float *mean = rand_f32(rows, -1, 1), *sub = rand_f32(rows * 4, -1, 1);
	float *lo = rand_f32(rows, -2, 0), *hi = rand_f32(rows, 0, 2), *q = rand_f32(qn, -1, 1);
	float *gq = hmalloc(4 * (size_t)L * kvh * d), *ref = hmalloc(4 * L * nb), *got;
	uint16_t *mean16 = hmalloc(2 * rows);
	float *mean16w = hmalloc(4 * rows);
	void *dmean = dput(mean, 4 * rows), *dsub = dput(sub, 16 * rows), *dlo = dput(lo, 4 * rows);
	void *dhi = dput(hi, 4 * rows), *dq = dput(q, 4 * qn), *dgq = dpoison(4 * (size_t)L * kvh * d);
	void *dsc = dpoison(4 * L * nb), *dm16;

	for (size_t i = 0; i < qn; i++)
		if (i % d < 6)
			q[i] += 0.7f;	/* a shared direction: scores spread */
	kvmem_cuda_upload(g_c, dq, q, 4 * qn);
	for (size_t i = 0; i < rows; i++) {
		mean16[i] = kvmem_f32_to_bf16(mean[i]);
		mean16w[i] = kvmem_bf16_to_f32(mean16[i]);
	}
	dm16 = dput(mean16, 2 * rows);
	kvmem_group_queries(gq, q, L, n_q, heads, kvh, d, theta, span);
	if (kvmem_cuda_group_queries(g_c, dgq, dq, L, n_q, heads, kvh, d, theta, span))
		die("group queries");
	got = dget(dgq, 4 * (size_t)L * kvh * d);
	cmp_f32("group queries (rope-mean)", got, gq, (size_t)L * kvh * d, 1e-7, 4e-7);
	free(got);
	/* From here the GPU scores use the twin's group queries, so each
	 * scorer is compared on the same input. */
	kvmem_cuda_upload(g_c, dgq, gq, 4 * (size_t)L * kvh * d);

	if (kvmem_score_meank(ref, mean, gq, &g) || kvmem_cuda_score_meank(g_c, dsc, dmean, dgq, &g))
		die("meank");
	got = dget(dsc, 4 * nb);
	cmp_f32("score meank", got, ref, nb, 1e-6, 1e-5);
	free(got);
	{
		kvmem_score_geom g2 = g;

		g2.index_dtype = KVMEM_DTYPE_BF16;
		if (kvmem_score_meank(ref, mean16w, gq, &g) ||
		    kvmem_cuda_score_meank(g_c, dsc, dm16, dgq, &g2))
			die("meank bf16");
		got = dget(dsc, 4 * nb);
		cmp_f32("score meank, bf16 index", got, ref, nb, 1e-6, 1e-5);
		free(got);
	}
	if (kvmem_score_subblock(ref, sub, gq, &g) || kvmem_cuda_score_subblock(g_c, dsc, dsub, dgq, &g))
		die("subblock");
	got = dget(dsc, 4 * nb);
	cmp_f32("score subblock", got, ref, nb, 1e-6, 1e-5);
	free(got);
	if (kvmem_score_quest(ref, lo, hi, q, n_q, &g) ||
	    kvmem_cuda_score_quest(g_c, dsc, dlo, dhi, dq, n_q, &g))
		die("quest");
	got = dget(dsc, 4 * L * nb);
	cmp_f32("score quest (per layer)", got, ref, (size_t)L * nb, 1e-6, 1e-5);
	free(got);

	{	/* refine's per-key pass over a shortlist of blocks, one layer */
		int64_t n = g_quick ? 20 : 256, *blocks = hmalloc(8 * n), qpos[2];
		int32_t *len = hmalloc(4 * n);
		size_t kn = (size_t)kvh * n * B * d;
		float *keys = rand_f32(kn, -2, 2), *hq = hmalloc(4 * (size_t)heads * n_q * d), *hg;
		double *mref = calloc(n, 8), *mgot, *m0 = calloc(n, 8);
		void *dkeys = dput(keys, 4 * kn), *dhq = dpoison(4 * (size_t)heads * n_q * d);
		void *dlen, *dbl, *dqpos, *dmass;

		for (int64_t i = 0; i < n; i++) {
			blocks[i] = i * (nb / n);
			len[i] = i == n - 1 ? 21 : B;
			mref[i] = m0[i] = runi(0, 3);	/* the mass adds to earlier sums */
		}
		qpos[0] = blocks[n - 1] * B + 10;	/* does not see the last block's end */
		qpos[1] = blocks[n - 1] * B + 20;
		dlen = dput(len, 4 * n);
		dbl = dput(blocks, 8 * n);
		dqpos = dput(qpos, 16);
		dmass = dput(m0, 8 * n);
		kvmem_head_queries(hq, q, 5 % L, n_q, heads, d, theta, span);
		if (kvmem_cuda_head_queries(g_c, dhq, dq, 5 % L, n_q, heads, d, theta, span))
			die("head queries");
		hg = dget(dhq, 4 * (size_t)heads * n_q * d);
		cmp_f32("head queries (rope-mean)", hg, hq, (size_t)heads * n_q * d, 1e-7, 4e-7);
		free(hg);
		kvmem_cuda_upload(g_c, dhq, hq, 4 * (size_t)heads * n_q * d);
		if (kvmem_token_mass(mref, keys, len, blocks, n, hq, qpos, n_q, &g) ||
		    kvmem_cuda_token_mass(g_c, dmass, dkeys, dlen, dbl, n, dhq, dqpos, n_q, &g))
			die("token mass");
		mgot = dget(dmass, 8 * n);
		{
			struct cmp c = { 0 };

			for (int64_t i = 0; i < n; i++)
				cmp_one(&c, mgot[i], mref[i], 1e-12, 1e-9);
			cmp_report(&c, "refine token mass (one layer)", 1e-12, 1e-9);
		}
		free(blocks);
		free(len);
		free(keys);
		free(hq);
		free(mref);
		free(mgot);
		free(m0);
		kvmem_cuda_free(dkeys);
		kvmem_cuda_free(dhq);
		kvmem_cuda_free(dlen);
		kvmem_cuda_free(dbl);
		kvmem_cuda_free(dqpos);
		kvmem_cuda_free(dmass);
	}
	{	/* top-k: the same set, ties to the later block, NaN lowest */
		int64_t n = g_quick ? 5000 : 31250, ks[] = { 1, 100, 1000, n - 1, n + 5 };
		float *sc = hmalloc(4 * n);
		int64_t *want = hmalloc(8 * (n + 5)), *gotk;
		void *dscores, *dout = dpoison(8 * (n + 5));

		for (int64_t i = 0; i < n; i++) {
			int u = rint_in(0, 19);

			sc[i] = u == 0 ? NAN : u == 1 ? -0.0f : u < 10 ? (float)rint_in(0, 30) : (float)runi(0, 30);
		}
		dscores = dput(sc, 4 * n);
		for (int j = 0; j < 5; j++) {
			int64_t k = ks[j], a = kvmem_top_k_blocks(want, sc, n, k);
			int64_t b = kvmem_cuda_top_k_blocks(g_c, dout, dscores, n, k);

			gotk = dget(dout, 8 * (a > 0 ? a : 1));
			report(a == b && !memcmp(gotk, want, 8 * a), "top-k blocks n=%lld k=%lld: %lld / %lld, %s",
			       (long long)n, (long long)k, (long long)b, (long long)a,
			       memcmp(gotk, want, 8 * a) ? "different sets" : "same set");
			free(gotk);
		}
		free(sc);
		free(want);
		kvmem_cuda_free(dscores);
		kvmem_cuda_free(dout);
	}
	free(mean);
	free(sub);
	free(lo);
	free(hi);
	free(q);
	free(gq);
	free(ref);
	free(mean16);
	free(mean16w);
	kvmem_cuda_free(dmean);
	kvmem_cuda_free(dsub);
	kvmem_cuda_free(dlo);
	kvmem_cuda_free(dhi);
	kvmem_cuda_free(dq);
	kvmem_cuda_free(dgq);
	kvmem_cuda_free(dsc);
	kvmem_cuda_free(dm16);
}

/* ---- timing ---------------------------------------------------------------------- */

struct copy_arg {
	void *a, *b;
	size_t bytes;
};

static int run_copy(void *p)
{
	struct copy_arg *c = p;

	return cudaMemcpyAsync(c->b, c->a, c->bytes, cudaMemcpyDeviceToDevice,
			       (cudaStream_t)kvmem_cuda_stream(g_c)) != cudaSuccess;
}

struct gemm_arg {
	void *y;
	const void *x, *w;
	int n, in, out, mode;
};

static int run_gemm(void *p)
{
	struct gemm_arg *g = p;

	return kvmem_cuda_gemm_bf16(g_c, g->y, g->mode, g->x, g->w, g->n, g->in, g->out);
}

struct att_arg {
	int version;
	void *out, *q, *k, *v, *qp;
	int n_q, n_kv, heads, kvh, hd;
	size_t stride;
};

static int run_att(void *p)
{
	struct att_arg *a = p;

	return kvmem_cuda_attention_bf16_v(g_c, a->version, a->out, a->q, a->qp, a->n_q, a->k, a->v,
					   NULL, a->n_kv, a->stride, a->heads, a->kvh, a->hd,
					   1.0f / sqrtf((float)a->hd));
}

struct score_arg {
	void *sc, *rows, *gq;
	kvmem_score_geom g;
	int sub;
};

static int run_score(void *p)
{
	struct score_arg *s = p;

	return s->sub ? kvmem_cuda_score_subblock(g_c, s->sc, s->rows, s->gq, &s->g)
		      : kvmem_cuda_score_meank(g_c, s->sc, s->rows, s->gq, &s->g);
}

struct sample_arg {
	void *tok, *lg, *rng;
	kvmem_sampler s;
	int vocab;
};

static int run_sample(void *p)
{
	struct sample_arg *s = p;

	return kvmem_cuda_sample_token(g_c, s->tok, s->lg, s->vocab, &s->s, s->rng);
}

/* One run of each flash configuration after a warm-up, for ncu. */
static void profile(void)
{
	const int heads = 32, kvh = 8, hd = 128;
	const size_t maxkv = 32768;
	struct att_bufs b;
	int32_t *pos = hmalloc(4 * 4096);

	att_bufs_alloc(&b, 4096, maxkv, heads, kvh, hd);
	for (int ver = 2; ver <= 3; ver++)
		for (int dec = 0; dec < 2; dec++) {
			struct att_arg a = { .version = ver, .out = b.out, .q = b.q, .k = b.k, .v = b.v, .qp = b.qp,
					     .n_q = dec ? 1 : 4096, .n_kv = dec ? 32768 : 4096, .heads = heads,
					     .kvh = kvh, .hd = hd, .stride = maxkv };

			for (int t = 0; t < a.n_q; t++)
				pos[t] = a.n_kv - a.n_q + t;
			kvmem_cuda_upload(g_c, b.qp, pos, 4 * a.n_q);
			if (run_att(&a) || run_att(&a) || kvmem_cuda_sync(g_c))
				die("profile");
		}
	free(pos);
	att_bufs_free(&b);
}

static void bench(void)
{
	const int hid = 4096, heads = 32, kvh = 8, hd = 128, inter = 12288, vocab = 151936;
	double copy_gbs, gemm_tfs;

	printf("\n== timing (%s, %d SMs; median of CUDA-event timings) ==\n",
	       kvmem_cuda_device_name(g_c), kvmem_cuda_sm_count(g_c));
	{	/* HBM: a 2 GiB device-to-device copy, bytes read + written */
		struct copy_arg c = { .bytes = (size_t)2 << 30 };

		if (kvmem_cuda_malloc(&c.a, c.bytes) || kvmem_cuda_malloc(&c.b, c.bytes))
			die("bench alloc");
		dfill_bf16(c.a, c.bytes / 2, 1);
		double ms = time_ms(run_copy, &c, 2, 10);

		copy_gbs = 2.0 * c.bytes / (ms * 1e-3) / 1e9;
		printf("%-44s %9.3f ms  %8.0f GB/s (read + write)\n", "HBM copy 2 GiB d2d", ms, copy_gbs);
		kvmem_cuda_free(c.a);
		kvmem_cuda_free(c.b);
	}
	{	/* the bf16 GEMM rate: 8192^3 through kvmem_cuda_gemm_bf16 */
		struct gemm_arg g = { .n = 8192, .in = 8192, .out = 8192, .mode = KVMEM_GEMM_BF16 };
		void *x, *w, *y;
		size_t e = (size_t)8192 * 8192;

		if (kvmem_cuda_malloc(&x, 2 * e) || kvmem_cuda_malloc(&w, 2 * e) || kvmem_cuda_malloc(&y, 2 * e))
			die("bench alloc");
		dfill_bf16(x, e, 1);
		dfill_bf16(w, e, 0.05);
		g.x = x;
		g.w = w;
		g.y = y;
		double ms = time_ms(run_gemm, &g, 3, 10);

		gemm_tfs = 2.0 * 8192.0 * 8192 * 8192 / (ms * 1e-3) / 1e12;
		printf("%-44s %9.3f ms  %8.1f TFLOP/s\n", "GEMM bf16 8192^3 (cuBLASLt)", ms, gemm_tfs);
		kvmem_cuda_free(x);
		kvmem_cuda_free(w);
		kvmem_cuda_free(y);
	}
	printf("\n%-44s %9s  %10s  %s\n", "GEMM, Qwen3-8B shapes", "ms", "rate", "of ceiling");
	{
		static const struct { const char *name; int n, in, out, mode; } gs[] = {
			{ "qkv 4096 tok 4096->6144 bf16", 4096, 4096, 6144, KVMEM_GEMM_BF16 },
			{ "o_proj 4096 tok 4096->4096 f32+=", 4096, 4096, 4096, KVMEM_GEMM_F32_ADD },
			{ "gate|up 4096 tok 4096->24576 bf16", 4096, 4096, 24576, KVMEM_GEMM_BF16 },
			{ "down 4096 tok 12288->4096 f32+=", 4096, 12288, 4096, KVMEM_GEMM_F32_ADD },
			{ "qkv decode 1 tok 4096->6144", 1, 4096, 6144, KVMEM_GEMM_BF16 },
			{ "gate|up decode 1 tok 4096->24576", 1, 4096, 24576, KVMEM_GEMM_BF16 },
			{ "down decode 1 tok 12288->4096 f32+=", 1, 12288, 4096, KVMEM_GEMM_F32_ADD },
			{ "lm_head decode 1 tok 4096->151936 f32", 1, 4096, 151936, KVMEM_GEMM_F32 },
		};
		void *x, *w, *y;

		if (kvmem_cuda_malloc(&x, 2 * (size_t)4096 * inter) ||
		    kvmem_cuda_malloc(&w, 2 * (size_t)vocab * hid) ||
		    kvmem_cuda_malloc(&y, 4 * (size_t)4096 * 2 * inter))
			die("bench alloc");
		dfill_bf16(x, (size_t)4096 * inter, 1);
		dfill_bf16(w, (size_t)vocab * hid, 0.05);
		cudaMemset(y, 0, 4 * (size_t)4096 * 2 * inter);
		cudaDeviceSynchronize();
		for (size_t i = 0; i < sizeof(gs) / sizeof(gs[0]); i++) {
			struct gemm_arg g = { .y = y, .x = x, .w = w, .n = gs[i].n, .in = gs[i].in,
					      .out = gs[i].out, .mode = gs[i].mode };
			double ms = time_ms(run_gemm, &g, 3, 20);

			if (gs[i].n > 1) {
				double tf = 2.0 * gs[i].n * gs[i].in * gs[i].out / (ms * 1e-3) / 1e12;

				printf("%-44s %9.3f  %6.1f TF/s  %5.2f of GEMM rate\n", gs[i].name, ms, tf, tf / gemm_tfs);
			} else {
				double gbs = 2.0 * gs[i].in * gs[i].out / (ms * 1e-3) / 1e9;

				printf("%-44s %9.3f  %6.0f GB/s  %5.2f of copy rate\n", gs[i].name, ms, gbs,
				       gbs / copy_gbs);
			}
		}
		kvmem_cuda_free(x);
		kvmem_cuda_free(w);
		kvmem_cuda_free(y);
	}
	printf("\n%-44s %9s  %10s  %s\n", "attention, Qwen3-8B (32/8 heads, 128)", "ms", "rate",
	       "of ceiling");
	{
		static const struct { const char *name; int n_q, n_kv, version; } as[] = {
			{ "prefill 4096 x 4096 causal v2", 4096, 4096, 2 },
			{ "prefill 16384 x 16384 causal v2", 16384, 16384, 2 },
			{ "chunk 4096 @ 32768 view v2", 4096, 32768, 2 },
			{ "chunk 512 @ 32768 view v2", 512, 32768, 2 },
			{ "decode 1 @ 4096 v2", 1, 4096, 2 },
			{ "decode 1 @ 32768 v2", 1, 32768, 2 },
			{ "decode 1 @ 131072 v2", 1, 131072, 2 },
			{ "prefill 4096 x 4096 causal v3", 4096, 4096, 3 },
			{ "prefill 16384 x 16384 causal v3", 16384, 16384, 3 },
			{ "chunk 4096 @ 32768 view v3", 4096, 32768, 3 },
			{ "decode 1 @ 4096 v3", 1, 4096, 3 },
			{ "decode 1 @ 32768 v3", 1, 32768, 3 },
			{ "decode 1 @ 131072 v3", 1, 131072, 3 },
			{ "decode 1 @ 32768 v1 (simple)", 1, 32768, 1 },
		};
		const size_t maxkv = 131072;
		struct att_bufs b;
		int32_t *pos = hmalloc(4 * 16384);

		att_bufs_alloc(&b, 16384, maxkv, heads, kvh, hd);
		for (size_t i = 0; i < sizeof(as) / sizeof(as[0]); i++) {
			struct att_arg a = { .version = as[i].version, .out = b.out, .q = b.q, .k = b.k,
					     .v = b.v, .qp = b.qp, .n_q = as[i].n_q, .n_kv = as[i].n_kv, .heads = heads,
					     .kvh = kvh, .hd = hd, .stride = maxkv };
			double vis = 0;

			for (int t = 0; t < a.n_q; t++) {
				pos[t] = a.n_kv - a.n_q + t;
				vis += pos[t] + 1;	/* keys query t sees */
			}
			kvmem_cuda_upload(g_c, b.qp, pos, 4 * a.n_q);
			double ms = time_ms(run_att, &a, 2, a.n_q > 1 ? 5 : 20);

			if (a.n_q > 1) {
				double tf = 4.0 * hd * heads * vis / (ms * 1e-3) / 1e12;

				printf("%-44s %9.3f  %6.1f TF/s  %5.2f of GEMM rate\n", as[i].name, ms, tf, tf / gemm_tfs);
			} else {
				double gbs = 2.0 * 2.0 * a.n_kv * kvh * hd / (ms * 1e-3) / 1e9;

				printf("%-44s %9.3f  %6.0f GB/s  %5.2f of copy rate\n", as[i].name, ms, gbs, gbs / copy_gbs);
			}
		}
		free(pos);
		att_bufs_free(&b);
	}
	printf("\n%-44s %9s  %10s  %s\n", "selection, Qwen3-8B (36 layers, block 32)", "ms", "index read",
	       "of copy rate");
	{	/* 1M tokens: 31250 blocks */
		const int L = 36;
		const int64_t nb = 31250;
		size_t rows = (size_t)L * kvh * nb * hd;
		struct score_arg s = { .g = { .n_layers = L, .n_heads = heads, .n_kv_heads = kvh, .head_dim = hd,
					      .block = 32, .n_blocks = nb, .cap_blocks = nb, .last_len = 32,
					      .last_sub = { 8, 8, 8, 8 } } };
		float *gq = rand_f32((size_t)L * kvh * hd, -1, 1);

		if (kvmem_cuda_malloc(&s.rows, 4 * rows * 4) || kvmem_cuda_malloc(&s.sc, 4 * nb))
			die("bench alloc");
		dfill_f32(s.rows, 4 * rows, 1);
		s.gq = dput(gq, 4 * (size_t)L * kvh * hd);
		s.g.index_dtype = KVMEM_DTYPE_F32;
		double ms = time_ms(run_score, &s, 2, 10);
		double gbs = 4.0 * rows / (ms * 1e-3) / 1e9;

		printf("%-44s %9.3f  %6.0f GB/s  %5.2f\n", "meank 1M tokens, fp32 index (4.6 GB)", ms, gbs, gbs / copy_gbs);
		s.sub = 1;
		ms = time_ms(run_score, &s, 1, 5);
		gbs = 16.0 * rows / (ms * 1e-3) / 1e9;
		printf("%-44s %9.3f  %6.0f GB/s  %5.2f\n", "subblock 1M tokens, fp32 index (18 GB)", ms, gbs, gbs / copy_gbs);
		dfill_bf16(s.rows, 4 * rows, 1);	/* the same buffer as bf16 rows */
		s.g.index_dtype = KVMEM_DTYPE_BF16;
		s.sub = 0;
		ms = time_ms(run_score, &s, 2, 10);
		gbs = 2.0 * rows / (ms * 1e-3) / 1e9;
		printf("%-44s %9.3f  %6.0f GB/s  %5.2f\n", "meank 1M tokens, bf16 index (2.3 GB)", ms, gbs, gbs / copy_gbs);
		s.sub = 1;
		ms = time_ms(run_score, &s, 1, 5);
		gbs = 8.0 * rows / (ms * 1e-3) / 1e9;
		printf("%-44s %9.3f  %6.0f GB/s  %5.2f\n", "subblock 1M tokens, bf16 index (9.2 GB)", ms, gbs, gbs / copy_gbs);
		{
			void *dout;
			int64_t k = 4096;

			if (kvmem_cuda_malloc(&dout, 8 * k))
				die("bench alloc");
			cudaStream_t st = (cudaStream_t)kvmem_cuda_stream(g_c);
			cudaEvent_t a, b;
			float t;

			cudaEventCreate(&a);
			cudaEventCreate(&b);
			kvmem_cuda_top_k_blocks(g_c, dout, s.sc, nb, k);
			cudaEventRecord(a, st);
			for (int i = 0; i < 10; i++)
				kvmem_cuda_top_k_blocks(g_c, dout, s.sc, nb, k);
			cudaEventRecord(b, st);
			cudaEventSynchronize(b);
			cudaEventElapsedTime(&t, a, b);
			printf("%-44s %9.3f\n", "top-k 4096 of 31250 blocks", t / 10);
			kvmem_cuda_free(dout);
		}
		free(gq);
		kvmem_cuda_free(s.rows);
		kvmem_cuda_free(s.sc);
		kvmem_cuda_free(s.gq);
	}
	{
		struct sample_arg s = { .vocab = vocab,
					.s = { .temperature = 0.7f, .top_k = 20, .top_p = 0.95f, .seed = 1 } };
		float *lg = rand_f32(vocab, -10, 10);
		uint64_t r0 = 12345;

		s.lg = dput(lg, 4 * vocab);
		s.tok = dpoison(4);
		s.rng = dput(&r0, 8);
		double ms = time_ms(run_sample, &s, 2, 20);

		printf("\n%-44s %9.3f\n", "sample T0.7 k20 p0.95, vocab 151936", ms);
		s.s.temperature = 0;
		ms = time_ms(run_sample, &s, 2, 20);
		printf("%-44s %9.3f\n", "sample greedy, vocab 151936", ms);
		s.s = (kvmem_sampler){ .temperature = 1, .top_k = 0, .top_p = 0.9f };
		ms = time_ms(run_sample, &s, 1, 5);
		printf("%-44s %9.3f\n", "sample T1 p0.9 (full sort), vocab 151936", ms);
		free(lg);
		kvmem_cuda_free(s.lg);
		kvmem_cuda_free(s.tok);
		kvmem_cuda_free(s.rng);
	}
	bench_perf(copy_gbs, gemm_tfs);
}

/* A device allocation past the device's memory: -ENOMEM, a message that
 * names the bytes asked and what the device has free, and the context
 * still usable (the error is not left sticky). */
static void check_oom(void)
{
	const size_t huge = (size_t)1 << 50;	/* 1 PiB */
	void *p = NULL, *q = NULL;
	int rc = kvmem_cuda_malloc(&p, huge);
	const char *msg = kvmem_last_error();

	report(rc == -ENOMEM && !p && strstr(msg, "1073741824.0 MiB of device memory") &&
	       strstr(msg, "GiB free"), "device allocation of 1 PiB: %d, '%s'", rc, msg);
	rc = kvmem_cuda_malloc(&q, 1 << 20);
	report(!rc && q, "a 1 MiB allocation after it: %d", rc);
	kvmem_cuda_free(q);
}

int main(int argc, char **argv)
{
	int do_bench = 0, do_profile = 0, only_gather = 0, only_gemv = 0, only_fuse = 0;
	int only_sample = 0;
	int only_attn_decode = 0, only_attn_prefill = 0, only_attn_batch = 0, only_fp8 = 0;
	int only_pages = 0, only_gemm_tc = 0, gemm_tc_shapes = 0, only_gemm_pin = 0;
	uint64_t seed = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick"))
			g_quick = 1;
		else if (!strcmp(argv[i], "--bench"))
			do_bench = 1;
		else if (!strcmp(argv[i], "--profile"))
			do_profile = 1;
		else if (!strcmp(argv[i], "--gather"))
			only_gather = 1;	/* the gather kernel's checks alone */
		else if (!strcmp(argv[i], "--sample"))
			only_sample = 1;	/* the draws' checks alone */
		else if (!strcmp(argv[i], "--gemv"))
			only_gemv = 1;		/* the one-row GEMM's decode sweep alone */
		else if (!strcmp(argv[i], "--fuse"))
			only_fuse = 1;		/* decode's fused ops alone (check_fuse.c) */
		else if (!strcmp(argv[i], "--attn-decode"))
			only_attn_decode = 1;	/* decode attention alone (check_attn_decode.c) */
		else if (!strcmp(argv[i], "--attn-batch"))
			only_attn_batch = 1;	/* batched attention alone (check_attn_batch.c) */
		else if (!strcmp(argv[i], "--attn-prefill"))
			only_attn_prefill = 1;	/* prefill attention alone (check_attn_prefill.c) */
		else if (!strcmp(argv[i], "--fp8"))
			only_fp8 = 1;		/* fp8 KV alone (check_fp8.c) */
		else if (!strcmp(argv[i], "--gemm-tc"))
			only_gemm_tc = 1;	/* the tensor-core GEMM alone (check_gemm_tc.c) */
		else if (!strcmp(argv[i], "--gemm-tc-shapes"))
			gemm_tc_shapes = 1;	/* its split and tiles shape by shape, timed */
		else if (!strcmp(argv[i], "--gemm-pin"))
			only_gemm_pin = 1;	/* GEMMs on one algorithm (check_gemm_pin.c) */
		else if (!strcmp(argv[i], "--pages"))
			only_pages = 1;		/* rows into pages alone (check_pages.c) */
		else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
			seed = strtoull(argv[++i], NULL, 0);
		else {
			fprintf(stderr, "usage: kvmem_gpu_check [--quick] [--bench] [--profile] [--gather] [--sample] [--gemv] [--fuse] [--attn-decode] [--attn-prefill] [--attn-batch] [--gemm-tc] [--gemm-tc-shapes] [--gemm-pin] [--fp8] [--pages] [--seed N]\n");
			return 2;
		}
	}
	if (!seed) {
		FILE *f = fopen("/dev/urandom", "rb");

		if (!f || fread(&seed, sizeof(seed), 1, f) != 1)
			seed = (uint64_t)time(NULL);
		if (f)
			fclose(f);
	}
	g_rng = seed;
	printf("kvmem_gpu_check: seed %llu%s\n", (unsigned long long)seed, g_quick ? " (quick)" : "");
	if (kvmem_cuda_device_count() < 1) {
		printf("no CUDA device: nothing to check\n0 passed, 1 failed\n");
		return 1;
	}
	if (kvmem_cuda_ctx_create(&g_c, 0))
		die("context");
	if (only_fp8) {
		check_fp8(do_bench);
	} else if (only_pages) {
		check_pages();
	} else if (only_gemm_pin) {
		check_gemm_pin();
	} else if (gemm_tc_shapes) {
		gemm_tc_shape_sweep();
	} else if (only_gemm_tc) {
		check_gemm_tc();
		if (!g_quick)	/* --quick: the checks alone (for compute-sanitizer) */
			gemm_tc_sweep();
	} else if (only_gather) {
		check_gather();
	} else if (only_sample) {
		check_sample();
		check_argmax_rows();
		check_draw_rows();
	} else if (only_gemv) {
		gemv_sweep();
	} else if (only_fuse) {
		check_fuse();
	} else if (only_attn_decode) {
		attn_decode_sweep();
	} else if (only_attn_prefill) {
		attn_prefill_sweep();
	} else if (only_attn_batch) {
		attn_batch_sweep();
	} else if (do_profile) {
		profile();
	} else if (do_bench) {
		bench();
	} else {
		check_oom();
		check_convert();
		check_embedding();
		check_norms();
		check_swiglu_add();
		check_gemm();
		check_fuse();
		check_rope();
		check_scatter();
		check_gather();
		check_pages();
		check_fp8(0);
		check_attention();
		check_attn_decode();
		check_attn_prefill();
		check_attn_batch();
		check_gemm_tc();	/* checked on the H200 in call 1 (batch26h.sh) */
		check_perf();
		check_sample();
		check_argmax_rows();
		check_draw_rows();
		check_scores();
	}
	if (kvmem_cuda_sync(g_c))
		die("final sync");
	kvmem_cuda_ctx_destroy(g_c);
	printf("\n%d passed, %d failed\n", g_pass, g_fail);
	return g_fail ? 1 : 0;
}

// SPDX-License-Identifier: MIT
/*
 * The engine's fast paths against their twins and against the plain paths
 * they replace (see check_perf.h). Bit-for-bit cases compare every 16-bit
 * element; tolerance cases use kvmem_gpu_check's rule |gpu - cpu| <= atol +
 * rtol |cpu| with the tolerances of Documentation/kernels.md. Outputs are
 * poisoned (NaN) first; inputs are fresh random numbers from the seed.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_cuda.h"
#include "kvmem/kvmem.h"
#include "check_attn_decode.h"
#include "check_gemv.h"
#include "check_perf.h"
#include "check_util.h"

/* Bit-for-bit equality of two device results (n 16-bit elements). */
static void same_bits(const char *what, const void *a, const void *b, size_t bytes)
{
	const uint16_t *x = a, *y = b;
	size_t diff = 0, nan = 0;

	for (size_t i = 0; i < bytes / 2; i++) {
		diff += x[i] != y[i];
		nan += x[i] == 0xffff;
	}
	report(!diff && nan < bytes / 2, "%-44s %zu of %zu elements differ (bit for bit)", what, diff,
	       bytes / 2);
}

/* ---- attention v4 against the twin ------------------------------------------ */
static void check_v4(void)
{
	static const struct att_shape full[] = {
		{ "8B prefill chunk 128 @ 1000", 128, 1000, 32, 8, 128, 0 },
		{ "8B prefill 512x512 causal", 512, 512, 32, 8, 128, 0 },
		{ "MHA 4/4 hd128 70x70", 70, 70, 4, 4, 128, 0 },
		{ "hd64 8/2 kv_pos shuffled", 37, 300, 8, 2, 64, 1 },
		{ "hd128 64/8 chunk 16 @ 9000", 16, 9000, 64, 8, 128, 0 },
		{ "8B chunk 300 @ 20000 (split-K)", 300, 20000, 32, 8, 128, 0 },
	}, quick[] = {
		{ "quick prefill 40x100", 40, 100, 8, 2, 128, 0 },
		{ "quick hd64 kv_pos 9x70", 9, 70, 4, 2, 64, 1 },
	};
	const struct att_shape *sh = g_quick ? quick : full;
	const size_t ns = g_quick ? sizeof(quick) / sizeof(quick[0]) : sizeof(full) / sizeof(full[0]);

	for (size_t i = 0; i < ns; i++)
		check_attention_one(&sh[i], 4);
}

/* ---- fused q/k norm + RoPE ------------------------------------------------------ */
/* pad: the row's slack past its heads; 64 takes the kernel's 16-byte moves,
 * 4 (rows that are no multiple of 8 elements) its 2-byte ones. */
#define QKN_NAME(what) \
	(snprintf(nm, sizeof(nm), "qk norm+rope%s%s", pad % 8 ? " (2-byte moves)" : "", what), nm)
static void check_qk_norm_rope(int pad)
{
	const int n = g_quick ? 3 : 37, heads = g_quick ? 8 : 32, kvh = g_quick ? 2 : 8;
	const int hd = g_quick ? 64 : 128, ld = (heads + 2 * kvh) * hd + pad;
	char nm[100];
	const size_t qn = (size_t)n * heads * hd, kn = (size_t)n * kvh * hd;
	uint16_t *qkv = rand_bf16((size_t)n * ld, -3, 3), *qw = rand_bf16(hd, 0.5, 1.5);
	uint16_t *kw = rand_bf16(hd, 0.5, 1.5), *q = hmalloc(2 * qn), *qraw = hmalloc(2 * qn);
	uint16_t *k = hmalloc(2 * kn), *v = hmalloc(2 * kn), *g_q, *g_qr, *g_kr, *g_v, *g_qkv, *g_sep;
	int32_t *pos = hmalloc(4 * n);
	void *dqkv, *dqw, *dkw, *dpos, *dq, *dqr, *dkr, *dv, *dsep;

	for (int t = 0; t < n; t++) {
		pos[t] = t % 3 == 0 ? t : (int32_t)runi(0, 4000000);
		memcpy(q + (size_t)t * heads * hd, qkv + (size_t)t * ld, 2 * (size_t)heads * hd);
		memcpy(k + (size_t)t * kvh * hd, qkv + (size_t)t * ld + heads * hd, 2 * (size_t)kvh * hd);
		memcpy(v + (size_t)t * kvh * hd, qkv + (size_t)t * ld + (heads + kvh) * hd,
		       2 * (size_t)kvh * hd);
	}
	dqkv = dput(qkv, 2 * (size_t)n * ld);
	dqw = dput(qw, 2 * hd);
	dkw = dput(kw, 2 * hd);
	dpos = dput(pos, 4 * n);
	dsep = dput(q, 2 * qn);	/* raw q for the separate ops */
	dq = dpoison(2 * qn);
	dqr = dpoison(2 * qn);
	dkr = dpoison(2 * kn);
	dv = dpoison(2 * kn);
	kvmem_headnorm_bf16(q, qw, n * heads, hd, 1e-6f);
	memcpy(qraw, q, 2 * qn);
	kvmem_rope_bf16(q, pos, n, heads, hd, 1e6);
	kvmem_headnorm_bf16(k, kw, n * kvh, hd, 1e-6f);
	if (kvmem_cuda_qk_norm_rope_bf16(g_c, dqkv, ld, dqw, dkw, n, heads, kvh, hd, 1e-6f, dpos, 1e6,
					 dq, dqr, dkr, dv) ||
	    kvmem_cuda_headnorm_bf16(g_c, dsep, dqw, n * heads, hd, 1e-6f) ||
	    kvmem_cuda_rope_bf16(g_c, dsep, dpos, n, heads, hd, 1e6))
		die("q/k norm + rope");
	g_q = dget(dq, 2 * qn);
	g_qr = dget(dqr, 2 * qn);
	g_kr = dget(dkr, 2 * kn);
	g_v = dget(dv, 2 * kn);
	g_qkv = dget(dqkv, 2 * (size_t)n * ld);
	g_sep = dget(dsep, 2 * qn);
	cmp_bf16(QKN_NAME(": q rotated (1 ulp)"), g_q, q, qn, 0, ULP1);
	cmp_bf16(QKN_NAME(": raw q (1 ulp)"), g_qr, qraw, qn, 0, ULP1);
	cmp_bf16(QKN_NAME(": raw K copy (1 ulp)"), g_kr, k, kn, 0, ULP1);
	cmp_bf16(QKN_NAME(": V copy (exact)"), g_v, v, kn, 0, 0);
	{	/* K normalised in place, other columns untouched */
		uint16_t *want = hmalloc(2 * (size_t)n * ld);

		memcpy(want, qkv, 2 * (size_t)n * ld);
		for (int t = 0; t < n; t++)
			memcpy(want + (size_t)t * ld + heads * hd, k + (size_t)t * kvh * hd,
			       2 * (size_t)kvh * hd);
		for (int t = 0; t < n; t++)	/* q columns: the kernel leaves them */
			memcpy(g_qkv + (size_t)t * ld, want + (size_t)t * ld, 2 * (size_t)heads * hd);
		cmp_bf16(QKN_NAME(": K in place, rest kept"), g_qkv, want, (size_t)n * ld, 0, ULP1);
		free(want);
	}
	same_bits(QKN_NAME(" = headnorm + rope on the GPU"), g_q, g_sep, 2 * qn);
	free(qkv);
	free(qw);
	free(kw);
	free(q);
	free(qraw);
	free(k);
	free(v);
	free(pos);
	free(g_q);
	free(g_qr);
	free(g_kr);
	free(g_v);
	free(g_qkv);
	free(g_sep);
	kvmem_cuda_free(dqkv);
	kvmem_cuda_free(dqw);
	kvmem_cuda_free(dkw);
	kvmem_cuda_free(dpos);
	kvmem_cuda_free(dq);
	kvmem_cuda_free(dqr);
	kvmem_cuda_free(dkr);
	kvmem_cuda_free(dv);
	kvmem_cuda_free(dsep);
}

/* ---- the index on the GPU ------------------------------------------------------------- */
static void check_index(void)
{
	const int L = g_quick ? 2 : 4, H = g_quick ? 2 : 8, D = g_quick ? 64 : 128, B = 32;
	const int64_t cap = 40;
	const size_t run = (size_t)L * H * cap * D, open = (size_t)L * H * D;

	for (int dt = 0; dt < 2; dt++) {
		const int dtype = dt ? KVMEM_DTYPE_BF16 : KVMEM_DTYPE_F32, eb = dt ? 2 : 4;
		kvmem_score_geom g = { .n_layers = L, .n_kv_heads = H, .n_heads = H, .head_dim = D,
				       .block = B, .cap_blocks = cap, .index_dtype = dtype };
		void *hm = hmalloc(eb * run), *hlo = hmalloc(eb * run), *hhi = hmalloc(eb * run);
		void *hs = hmalloc(eb * run * 4);
		float *hos = calloc(open, 4), *hob = calloc(open, 4);
		void *dm = dpoison(eb * run), *dlo = dpoison(eb * run), *dhi = dpoison(eb * run);
		void *ds = dpoison(eb * run * 4), *dos, *dob;
		int64_t first = 0;
		int calls = 0, bad = 0;
		char what[96];

		memset(hm, 0xff, eb * run);
		memset(hlo, 0xff, eb * run);
		memset(hhi, 0xff, eb * run);
		memset(hs, 0xff, eb * run * 4);
		dos = dput(hos, 4 * open);
		dob = dput(hob, 4 * open);
		while (first < (cap - 1) * B) {
			int n = calls % 4 == 3 ? (int)runi(1, 100) : (calls % 4 == 1 ? (int)runi(1, 40) : 1);
			uint16_t *rk;
			void *drk;

			if (first + n > cap * B)
				n = (int)(cap * B - first);
			rk = rand_bf16((size_t)L * n * H * D, -4, 4);
			drk = dput(rk, 2 * (size_t)L * n * H * D);
			if (kvmem_index_append_bf16(hm, hlo, hhi, hs, hos, hob, rk, first, n, &g) ||
			    kvmem_cuda_index_append(g_c, dm, dlo, dhi, ds, dos, dob, drk, first, n, &g))
				die("index append");
			free(rk);
			kvmem_cuda_free(drk);
			first += n;
			calls++;
		}
		{
			void *gm = dget(dm, eb * run), *glo = dget(dlo, eb * run), *ghi = dget(dhi, eb * run);
			void *gs = dget(ds, eb * run * 4), *gos = dget(dos, 4 * open), *gob = dget(dob, 4 * open);

			bad = (memcmp(gm, hm, eb * run) != 0) + (memcmp(glo, hlo, eb * run) != 0) +
			      (memcmp(ghi, hhi, eb * run) != 0) + (memcmp(gs, hs, eb * run * 4) != 0) +
			      (memcmp(gos, hos, 4 * open) != 0) + (memcmp(gob, hob, 4 * open) != 0);
			free(gm);
			free(glo);
			free(ghi);
			free(gs);
			free(gos);
			free(gob);
		}
		snprintf(what, sizeof(what), "index append %s, %d calls, %lld tokens", dt ? "bf16" : "fp32",
			 calls, (long long)first);
		report(!bad, "%-44s mean, min, max, quarter means, open sums: %d arrays differ (bit for "
		       "bit)", what, bad);
		free(hm);
		free(hlo);
		free(hhi);
		free(hs);
		free(hos);
		free(hob);
		kvmem_cuda_free(dm);
		kvmem_cuda_free(dlo);
		kvmem_cuda_free(dhi);
		kvmem_cuda_free(ds);
		kvmem_cuda_free(dos);
		kvmem_cuda_free(dob);
	}
}

/* ---- the 16-byte-load scorer against the 2-byte one ------------------------------------ */
static void check_fast_scores(void)
{
	for (int d = 64; d <= 128; d += 64) {
		const int L = g_quick ? 2 : 36, H = 8;
		const int64_t nb = g_quick ? 300 : 2000, cap = nb + 48;
		kvmem_score_geom g = { .n_layers = L, .n_heads = 32, .n_kv_heads = H, .head_dim = d,
				       .block = 32, .n_blocks = nb, .cap_blocks = cap, .last_len = 19,
				       .last_sub = { 8, 8, 3, 0 }, .index_dtype = KVMEM_DTYPE_BF16 };
		const size_t rows = (size_t)L * H * cap * 4 * d;
		uint16_t *ix = rand_bf16(rows, -2, 2);
		float *gq = rand_f32((size_t)L * H * d, -1, 1);
		void *dix = dput(ix, 2 * rows), *dgq = dput(gq, 4 * (size_t)L * H * d);
		void *s1 = dpoison(4 * nb), *s2 = dpoison(4 * nb);

		for (int sub = 0; sub < 2; sub++) {
			void *a, *b;
			char what[80];
			int rc;

			kvmem_cuda_tune(g_c, "fast_scores", 1);
			rc = sub ? kvmem_cuda_score_subblock(g_c, s1, dix, dgq, &g)
				 : kvmem_cuda_score_meank(g_c, s1, dix, dgq, &g);
			kvmem_cuda_tune(g_c, "fast_scores", 0);
			rc = rc || (sub ? kvmem_cuda_score_subblock(g_c, s2, dix, dgq, &g)
					: kvmem_cuda_score_meank(g_c, s2, dix, dgq, &g));
			kvmem_cuda_tune(g_c, "fast_scores", 1);
			if (rc)
				die("scores");
			a = dget(s1, 4 * nb);
			b = dget(s2, 4 * nb);
			snprintf(what, sizeof(what), "%s bf16 d%d: 16-byte loads = 2-byte loads",
				 sub ? "subblock" : "meank", d);
			same_bits(what, a, b, 4 * nb);
			free(a);
			free(b);
		}
		free(ix);
		free(gq);
		kvmem_cuda_free(dix);
		kvmem_cuda_free(dgq);
		kvmem_cuda_free(s1);
		kvmem_cuda_free(s2);
	}
}

/* ---- the planner's choice on the device -------------------------------------------------- */
static void check_plan_blocks(void)
{
	const int64_t n = g_quick ? 3000 : 312500, head = 33, tail = 342, k = 3700;
	float *sc = rand_f32(n, -1, 1);
	int64_t *want = hmalloc(8 * n), *got, cnt, wcnt;
	void *dsc, *dout = dpoison(8 * n);

	for (int64_t i = 0; i < n; i += 97)	/* ties and NaNs */
		sc[i] = i % 2 ? sc[i / 2] : NAN;
	dsc = dput(sc, 4 * n);
	for (int64_t i = 0; i < head; i++)
		sc[i] = INFINITY;
	for (int64_t i = n - tail; i < n; i++)
		sc[i] = INFINITY;
	wcnt = kvmem_top_k_blocks(want, sc, n, head + tail + k);
	cnt = kvmem_cuda_plan_blocks(g_c, dout, dsc, n, head, tail, k);
	if (cnt < 0)
		die("plan blocks");
	got = dget(dout, 8 * (size_t)cnt);
	report(cnt == wcnt && !memcmp(got, want, 8 * (size_t)cnt),
	       "plan blocks: %lld of %lld blocks (%lld + %lld taken) = the twin's set", (long long)cnt,
	       (long long)n, (long long)head, (long long)tail);
	free(sc);
	free(want);
	free(got);
	kvmem_cuda_free(dsc);
	kvmem_cuda_free(dout);
}

void check_perf(void)
{
	/* Decode through the main path (and v3) as the engine calls it: the
	 * twin, again, and the key count on the device. */
	static const struct dshape full[] = {
		{ "8B 1 @ 1", 1, 1, 32, 8, 128, 0, 1 },
		{ "8B 1 @ 700", 1, 700, 32, 8, 128, 0, 1 },
		{ "8B 1 @ 4097", 1, 4097, 32, 8, 128, 0, 1 },
		{ "8B 1 @ 20000", 1, 20000, 32, 8, 128, 0, 1 },
		{ "8B 3 @ 5000", 3, 5000, 32, 8, 128, 0, 1 },
		{ "hd64 8/2 1 @ 2048", 1, 2048, 8, 2, 64, 0, 1 },
	}, small[] = {
		{ "quick 1 @ 700", 1, 700, 8, 2, 64, 0, 1 },
		{ "quick 8/2 hd128 2 @ 300", 2, 300, 8, 2, 128, 0, 1 },
	};
	static const int main_v3[] = { 0, 3 };

	for (int i = 0; i < (g_quick ? 2 : 6); i++)
		check_decode_shape(g_quick ? &small[i] : &full[i], main_v3, 2);
	check_decode_graph(0);
	check_v4();
	check_qk_norm_rope(64);
	check_qk_norm_rope(4);
	check_gemv();
	check_index();
	check_fast_scores();
	check_plan_blocks();
}

/* ---- timing ------------------------------------------------------------------------------ */

struct att_run {
	int version, n_q, n_kv, heads, kvh, hd, cap;
	void *out, *q, *k, *v, *qp, *dn;
	cudaGraphExec_t exec;
};

static int run_att(void *p)
{
	struct att_run *a = p;

	return kvmem_cuda_attention_bf16_v(g_c, a->version, a->out, a->q, a->qp, a->n_q, a->k, a->v, NULL,
					   a->n_kv, a->cap, a->heads, a->kvh, a->hd,
					   1.0f / sqrtf((float)a->hd));
}

static int run_graph(void *p)
{
	struct att_run *a = p;

	return cudaGraphLaunch(a->exec, (cudaStream_t)kvmem_cuda_stream(g_c)) != cudaSuccess;
}

struct gemm_run {
	void *y, *x, *w;
	int in, out, mode;
};

static int run_gemm(void *p)
{
	struct gemm_run *g = p;

	return kvmem_cuda_gemm_bf16(g_c, g->y, g->mode, g->x, g->w, 1, g->in, g->out);
}

struct qkn_run {
	void *qkv, *qw, *kw, *pos, *q, *sep;
	int n, ld, sep_mode;
};

static int run_qkn(void *p)
{
	struct qkn_run *r = p;

	if (!r->sep_mode)
		return kvmem_cuda_qk_norm_rope_bf16(g_c, r->qkv, r->ld, r->qw, r->kw, r->n, 32, 8, 128,
						    1e-6f, r->pos, 1e6, r->q, NULL, NULL, NULL);
	return kvmem_cuda_headnorm_bf16(g_c, r->sep, r->qw, r->n * 32, 128, 1e-6f) ||
	       kvmem_cuda_headnorm_bf16(g_c, r->sep, r->kw, r->n * 8, 128, 1e-6f) ||
	       kvmem_cuda_rope_bf16(g_c, r->sep, r->pos, r->n, 32, 128, 1e6);
}

struct ix_run {
	void *m, *os, *rk;
	int64_t first;
	int n;
	kvmem_score_geom g;
};

static int run_ix(void *p)
{
	struct ix_run *r = p;

	return kvmem_cuda_index_append(g_c, r->m, NULL, NULL, NULL, r->os, NULL, r->rk, r->first, r->n,
				       &r->g);
}

void bench_perf(double copy_gbs, double gemm_tfs)
{
	const int heads = 32, kvh = 8, hd = 128;

	g_rng = 0x62656e6368ull;	/* the same data every run */
	printf("\n%-44s %9s  %10s  %s\n", "fast paths (check_perf.c)", "ms", "rate", "of ceiling");
	{	/* attention v4 and v6 prefill, and decode: plain launches and graph replays */
		static const struct { const char *name; int n_q, n_kv; } pre[] = {
			{ "prefill 4096 x 4096 causal v4", 4096, 4096 },
			{ "prefill 16384 x 16384 causal v4", 16384, 16384 },
			{ "chunk 4096 @ 32768 view v4", 4096, 32768 },
			{ "chunk 512 @ 32768 view v4", 512, 32768 },
			{ "prefill 4096 x 4096 causal v6", 4096, 4096 },
			{ "prefill 16384 x 16384 causal v6", 16384, 16384 },
			{ "chunk 4096 @ 32768 view v6", 4096, 32768 },
			{ "chunk 512 @ 32768 view v6", 512, 32768 },
		};
		const int cap = 131072, dec[] = { 4096, 32768, 131072 };
		struct att_run a = { .heads = heads, .kvh = kvh, .hd = hd, .cap = cap };
		int32_t *pos = hmalloc(4 * 16384);

		if (kvmem_cuda_malloc(&a.q, 2 * (size_t)16384 * heads * hd) ||
		    kvmem_cuda_malloc(&a.k, 2 * (size_t)cap * kvh * hd) ||
		    kvmem_cuda_malloc(&a.v, 2 * (size_t)cap * kvh * hd) ||
		    kvmem_cuda_malloc(&a.out, 2 * (size_t)16384 * heads * hd) ||
		    kvmem_cuda_malloc(&a.qp, 4 * 16384) || kvmem_cuda_malloc(&a.dn, 4))
			die("bench alloc");
		dfill_bf16(a.q, (size_t)16384 * heads * hd, 1);
		dfill_bf16(a.k, (size_t)cap * kvh * hd, 1);
		dfill_bf16(a.v, (size_t)cap * kvh * hd, 1);
		for (size_t i = 0; i < sizeof(pre) / sizeof(pre[0]); i++) {
			double vis = 0, ms, tf;

			a.version = i < 4 ? 4 : 6;
			a.n_q = pre[i].n_q;
			a.n_kv = pre[i].n_kv;
			for (int t = 0; t < a.n_q; t++) {
				pos[t] = a.n_kv - a.n_q + t;
				vis += pos[t] + 1;
			}
			kvmem_cuda_upload(g_c, a.qp, pos, 4 * a.n_q);
			ms = time_ms(run_att, &a, 2, 5);
			tf = 4.0 * hd * heads * vis / (ms * 1e-3) / 1e12;
			printf("%-44s %9.3f  %6.1f TF/s  %5.2f of GEMM rate\n", pre[i].name, ms, tf,
			       tf / gemm_tfs);
		}
		for (int ver = 2; ver <= 3; ver++) {
			cudaStream_t st = (cudaStream_t)kvmem_cuda_stream(g_c);
			cudaGraph_t graph;

			a.version = ver;
			a.n_q = 1;
			if (kvmem_cuda_reserve(g_c, kvmem_cuda_attention_scratch(g_c, 1, heads, kvh, hd) * 2) ||
			    cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess ||
			    kvmem_cuda_attention_decode_bf16(g_c, ver, a.out, a.q, a.qp, 1, a.k, a.v, a.dn, cap,
							     cap, heads, kvh, hd, 1.0f / sqrtf(hd)) ||
			    cudaStreamEndCapture(st, &graph) != cudaSuccess ||
			    cudaGraphInstantiate(&a.exec, graph, 0) != cudaSuccess)
				die("decode graph");
			cudaGraphDestroy(graph);
			for (int i = 0; i < 3; i++) {
				int32_t n = dec[i], p = n - 1;
				double ms, msg, bytes = 2.0 * 2.0 * n * kvh * hd;
				char name[64];

				a.n_kv = n;
				kvmem_cuda_upload(g_c, a.qp, &p, 4);
				kvmem_cuda_upload(g_c, a.dn, &n, 4);
				ms = time_ms(run_att, &a, 2, 20);
				msg = time_ms(run_graph, &a, 2, 20);
				snprintf(name, sizeof(name), "decode 1 @ %d v%d, plain launch", n, ver);
				printf("%-44s %9.3f  %6.0f GB/s  %5.2f of copy rate\n", name, ms,
				       bytes / (ms * 1e-3) / 1e9, bytes / (ms * 1e-3) / 1e9 / copy_gbs);
				snprintf(name, sizeof(name), "decode 1 @ %d v%d, graph replay", n, ver);
				printf("%-44s %9.3f  %6.0f GB/s  %5.2f of copy rate\n", name, msg,
				       bytes / (msg * 1e-3) / 1e9, bytes / (msg * 1e-3) / 1e9 / copy_gbs);
			}
			cudaGraphExecDestroy(a.exec);
		}
		free(pos);
		kvmem_cuda_free(a.q);
		kvmem_cuda_free(a.k);
		kvmem_cuda_free(a.v);
		kvmem_cuda_free(a.out);
		kvmem_cuda_free(a.qp);
		kvmem_cuda_free(a.dn);
	}
	{	/* one-row GEMMs: our GEMV and cuBLASLt */
		static const struct { const char *name; int in, out, mode; } gs[] = {
			{ "qkv 1 tok 4096->6144 bf16", 4096, 6144, KVMEM_GEMM_BF16 },
			{ "o_proj 1 tok 4096->4096 f32+=", 4096, 4096, KVMEM_GEMM_F32_ADD },
			{ "gate|up 1 tok 4096->24576 bf16", 4096, 24576, KVMEM_GEMM_BF16 },
			{ "down 1 tok 12288->4096 f32+=", 12288, 4096, KVMEM_GEMM_F32_ADD },
			{ "lm_head 1 tok 4096->151936 f32", 4096, 151936, KVMEM_GEMM_F32 },
		};
		struct gemm_run g;

		if (kvmem_cuda_malloc(&g.x, 2 * 12288) || kvmem_cuda_malloc(&g.w, 2 * (size_t)151936 * 4096) ||
		    kvmem_cuda_malloc(&g.y, 4 * 151936))
			die("bench alloc");
		dfill_bf16(g.x, 12288, 1);
		dfill_bf16(g.w, (size_t)151936 * 4096, 1);
		cudaMemset(g.y, 0, 4 * 151936);
		cudaDeviceSynchronize();
		/* 0: the first GEMV kernel, 1: the split-K one (gemv.cu), 2: cuBLASLt;
		 * tests/gpu/gemv_sweep.sh times them over cold weights */
		const int was_split = kvmem_cuda_tune(g_c, "gemv_split", 0);

		for (size_t i = 0; i < sizeof(gs) / sizeof(gs[0]); i++)
			for (int k = 0; k < 3; k++) {
				static const char *const kname[] = { "gemv", "gemv split", "cuBLASLt" };
				double ms, gbs;
				char name[80];

				g.in = gs[i].in;
				g.out = gs[i].out;
				g.mode = gs[i].mode;
				kvmem_cuda_tune(g_c, "gemv", k < 2);
				kvmem_cuda_tune(g_c, "gemv_split", k == 1);
				ms = time_ms(run_gemm, &g, 3, 20);
				gbs = 2.0 * g.in * g.out / (ms * 1e-3) / 1e9;
				snprintf(name, sizeof(name), "%s, %s", gs[i].name, kname[k]);
				printf("%-44s %9.3f  %6.0f GB/s  %5.2f of copy rate\n", name, ms, gbs,
				       gbs / copy_gbs);
			}
		kvmem_cuda_tune(g_c, "gemv", 1);
		kvmem_cuda_tune(g_c, "gemv_split", was_split);
		kvmem_cuda_free(g.x);
		kvmem_cuda_free(g.w);
		kvmem_cuda_free(g.y);
	}
	{	/* q/k norm + rope, fused vs three ops */
		struct qkn_run r = { .ld = (heads + 2 * kvh) * hd };
		int32_t *pos = hmalloc(4 * 4096);

		for (int t = 0; t < 4096; t++)
			pos[t] = t;
		if (kvmem_cuda_malloc(&r.qkv, 2 * (size_t)4096 * r.ld) || kvmem_cuda_malloc(&r.q, 2 * (size_t)4096 * heads * hd) ||
		    kvmem_cuda_malloc(&r.sep, 2 * (size_t)4096 * heads * hd) || kvmem_cuda_malloc(&r.qw, 2 * hd) ||
		    kvmem_cuda_malloc(&r.kw, 2 * hd))
			die("bench alloc");
		dfill_bf16(r.qkv, (size_t)4096 * r.ld, 1);
		dfill_bf16(r.sep, (size_t)4096 * heads * hd, 1);
		dfill_bf16(r.qw, hd, 1);
		dfill_bf16(r.kw, hd, 1);
		r.pos = dput(pos, 4 * 4096);
		for (int n = 1; n <= 4096; n *= 4096)
			for (int sep = 0; sep < 2; sep++) {
				char name[80];

				r.n = n;
				r.sep_mode = sep;
				snprintf(name, sizeof(name), "q/k norm + rope, %d tok, %s", n,
					 sep ? "3 ops" : "fused");
				printf("%-44s %9.3f\n", name, time_ms(run_qkn, &r, 2, 20));
			}
		free(pos);
		kvmem_cuda_free(r.qkv);
		kvmem_cuda_free(r.q);
		kvmem_cuda_free(r.sep);
		kvmem_cuda_free(r.qw);
		kvmem_cuda_free(r.kw);
		kvmem_cuda_free(r.pos);
	}
	{	/* the index append: one token, a 4096-token chunk (bf16, Qwen3-8B) */
		struct ix_run r = { .g = { .n_layers = 36, .n_kv_heads = 8, .n_heads = 32, .head_dim = 128,
					   .block = 32, .cap_blocks = 4096,
					   .index_dtype = KVMEM_DTYPE_BF16 } };

		if (kvmem_cuda_malloc(&r.m, 2 * (size_t)36 * 8 * 4096 * 128) ||
		    kvmem_cuda_malloc(&r.os, 4 * 36 * 8 * 128) ||
		    kvmem_cuda_malloc(&r.rk, 2 * (size_t)36 * 4096 * 8 * 128))
			die("bench alloc");
		dfill_bf16(r.rk, (size_t)36 * 4096 * 8 * 128, 1);
		for (int n = 1; n <= 4096; n *= 4096) {
			char name[64];

			r.n = n;
			r.first = 1000;
			snprintf(name, sizeof(name), "index append (meank bf16), %d tok", n);
			printf("%-44s %9.3f\n", name, time_ms(run_ix, &r, 2, 10));
		}
		kvmem_cuda_free(r.m);
		kvmem_cuda_free(r.os);
		kvmem_cuda_free(r.rk);
	}
	{	/* the bf16 scorer at 1M tokens: 16-byte vs 2-byte loads */
		const int L = 36;
		const int64_t nb = 31250;
		const size_t rows = (size_t)L * kvh * nb * hd;
		kvmem_score_geom g = { .n_layers = L, .n_heads = heads, .n_kv_heads = kvh, .head_dim = hd,
				       .block = 32, .n_blocks = nb, .cap_blocks = nb, .last_len = 32,
				       .index_dtype = KVMEM_DTYPE_BF16 };
		float *gq = rand_f32((size_t)L * kvh * hd, -1, 1);
		void *ix, *sc, *dgq = dput(gq, 4 * (size_t)L * kvh * hd);
		cudaStream_t st = (cudaStream_t)kvmem_cuda_stream(g_c);

		if (kvmem_cuda_malloc(&ix, 2 * rows) || kvmem_cuda_malloc(&sc, 4 * nb))
			die("bench alloc");
		dfill_bf16(ix, rows, 1);
		for (int slow = 0; slow < 2; slow++) {
			cudaEvent_t a, b;
			float ms;
			double gbs;

			kvmem_cuda_tune(g_c, "fast_scores", !slow);
			kvmem_cuda_score_meank(g_c, sc, ix, dgq, &g);
			cudaEventCreate(&a);
			cudaEventCreate(&b);
			cudaEventRecord(a, st);
			for (int i = 0; i < 10; i++)
				kvmem_cuda_score_meank(g_c, sc, ix, dgq, &g);
			cudaEventRecord(b, st);
			cudaEventSynchronize(b);
			cudaEventElapsedTime(&ms, a, b);
			ms /= 10;
			gbs = 2.0 * rows / (ms * 1e-3) / 1e9;
			printf("%-44s %9.3f  %6.0f GB/s  %5.2f of copy rate\n",
			       slow ? "meank 1M tok bf16, 2-byte loads" : "meank 1M tok bf16, 16-byte loads", ms,
			       gbs, gbs / copy_gbs);
			cudaEventDestroy(a);
			cudaEventDestroy(b);
		}
		kvmem_cuda_tune(g_c, "fast_scores", 1);
		free(gq);
		kvmem_cuda_free(ix);
		kvmem_cuda_free(sc);
		kvmem_cuda_free(dgq);
	}
}

// SPDX-License-Identifier: MIT
/*
 * Decode attention (rows = queries x group <= 16) against its twin
 * kvmem_attention_bf16 and against itself, then its timing sweep (see
 * check_attn_decode.h). The tolerance of Documentation/kernels.md,
 * |gpu - cpu| <= 4e-3 + 2^-7 |cpu| per element (P rounded to bf16 for P V,
 * bf16 output, V in [-1, 1]); at long key counts the outputs are means of
 * many V rows, small next to 4e-3, so a relative L2 error under 1e-2 is
 * asked as well (an output of zeros would pass the first). Outputs are
 * poisoned (0xffff) first; inputs are fresh random numbers from the seed.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_cuda.h"
#include "kvmem/kvmem.h"
#include "check_attn_decode.h"
#include "check_util.h"

/* The decode versions: 2 and 3 (the flash kernel with a combine kernel),
 * 5 (one launch, the combine folded in). */
static const int vers[] = { 2, 3, 5 };
#define N_VERS ((int)(sizeof(vers) / sizeof(vers[0])))
#define RELL2_MAX 1e-2
#define KV_SCALE 0.57735f	/* kvmem_cuda_random_bf16: values in [-1, 1] */

static void poison(void *d, size_t bytes)
{
	if (cudaMemsetAsync(d, 0xff, bytes, (cudaStream_t)kvmem_cuda_stream(g_c)) != cudaSuccess)
		die("poison");
}

/* Elements that differ, and elements still poisoned (0xffff: no output
 * of the kernels has those bits) in a. */
static size_t ndiff(const uint16_t *a, const uint16_t *b, size_t n, size_t *unwritten)
{
	size_t d = 0, u = 0;

	for (size_t i = 0; i < n; i++) {
		d += a[i] != b[i];
		u += a[i] == 0xffff;
	}
	if (unwritten)
		*unwritten += u;
	return d;
}

static void cmp_twin(const char *what, const uint16_t *g, const uint16_t *r, size_t n)
{
	struct cmp c = { 0 };
	double rel;

	for (size_t i = 0; i < n; i++)
		cmp_one(&c, bf(g[i]), bf(r[i]), 4e-3, ULP1);
	rel = c.l2d > 0 ? sqrt(c.l2n / c.l2d) : (c.l2n > 0 ? INFINITY : 0.0);
	report(c.bad == 0 && rel <= RELL2_MAX,
	       "%-46s max|d|=%-9.3g relL2=%-9.3g bad=%zu unwritten=%zu (atol 4e-3, rtol 2^-7, "
	       "relL2 <= %.0e)", what, c.max_abs, rel, c.bad, c.unwritten, RELL2_MAX);
}

/* K or V of n_kv keys [kvh][n_kv][hd] at stride s, NaN past n_kv. */
static uint16_t *at_stride(const uint16_t *src, int kvh, int n_kv, size_t s, int hd)
{
	uint16_t *d = hmalloc(2 * (size_t)kvh * s * hd);

	memset(d, 0xff, 2 * (size_t)kvh * s * hd);
	for (int g = 0; g < kvh; g++)
		memcpy(d + (size_t)g * s * hd, src + (size_t)g * n_kv * hd, 2 * (size_t)n_kv * hd);
	return d;
}

/* One decode call: plain (host key count, kv_pos allowed), or with the key
 * count on the device (dn) over max_kv = stride. */
static void *run_plain(int ver, void *o, const void *q, const void *qp, int n_q, const void *k,
		       const void *v, const void *kp, int n_kv, size_t stride, const struct dshape *s,
		       size_t qn)
{
	const float sc = 1.0f / sqrtf((float)s->hd);

	poison(o, 2 * qn);
	/* version 0: the main path, as the engine calls it */
	if (ver ? kvmem_cuda_attention_bf16_v(g_c, ver, o, q, qp, n_q, k, v, kp, n_kv, stride,
					      s->heads, s->kvh, s->hd, sc)
		: kvmem_cuda_attention_bf16(g_c, o, q, qp, n_q, k, v, kp, n_kv, stride, s->heads,
					    s->kvh, s->hd, sc))
		return NULL;
	return dget(o, 2 * qn);
}

void check_decode_shape(const struct dshape *s, const int *vs, int nv)
{
	const int n_q = s->n_q, n_kv = s->n_kv, kvh = s->kvh, hd = s->hd;
	const size_t s1 = (size_t)n_kv + 17, s2 = (size_t)n_kv + 1000;
	const size_t qn = (size_t)n_q * s->heads * hd, kn = (size_t)kvh * n_kv * hd;
	uint16_t *q = rand_bf16(qn, -s->qa, s->qa), *k = rand_bf16(kn, -1, 1), *v = rand_bf16(kn, -1, 1);
	uint16_t *k1 = at_stride(k, kvh, n_kv, s1, hd), *v1 = at_stride(v, kvh, n_kv, s1, hd);
	uint16_t *k2 = at_stride(k, kvh, n_kv, s2, hd), *v2 = at_stride(v, kvh, n_kv, s2, hd);
	uint16_t *ref = hmalloc(2 * qn);
	int32_t *qp = hmalloc(4 * (size_t)n_q), *kp = hmalloc(4 * (size_t)n_kv), nk = n_kv;
	void *dq, *dqp, *dk1, *dv1, *dk2, *dv2, *dkp = NULL, *dn, *o;
	char what[128];

	if (s->kv_pos) {
		/* Positions with gaps, not in slot order; each query sees some. */
		for (int j = 0; j < n_kv; j++)
			kp[j] = rint_in(0, 3 * n_kv);
		for (int i = 0; i < n_q; i++)
			qp[i] = rint_in(n_kv, 3 * n_kv);
	} else {
		for (int i = 0; i < n_q; i++)	/* the last n_q tokens of the view */
			qp[i] = n_kv - n_q + i;
	}
	dq = dput(q, 2 * qn);
	dqp = dput(qp, 4 * (size_t)n_q);
	dk1 = dput(k1, 2 * (size_t)kvh * s1 * hd);
	dv1 = dput(v1, 2 * (size_t)kvh * s1 * hd);
	dk2 = dput(k2, 2 * (size_t)kvh * s2 * hd);
	dv2 = dput(v2, 2 * (size_t)kvh * s2 * hd);
	dn = dput(&nk, 4);
	if (s->kv_pos)
		dkp = dput(kp, 4 * (size_t)n_kv);
	o = dpoison(2 * qn);
	if (kvmem_attention_bf16(ref, q, qp, n_q, k1, v1, s->kv_pos ? kp : NULL, n_kv, s1, s->heads,
				 kvh, hd, 1.0f / sqrtf((float)hd)))
		die("attention twin");
	for (int vi = 0; vi < nv; vi++) {
		const int ver = vs[vi];
		uint16_t *g1, *g2 = NULL, *g3;
		size_t d2 = 0, d3, un = 0;
		char vn[16];

		snprintf(vn, sizeof(vn), ver ? "v%d" : "main", ver);
		snprintf(what, sizeof(what), "decode %s %s", vn, s->name);
		g1 = run_plain(ver, o, dq, dqp, n_q, dk1, dv1, dkp, n_kv, s1, s, qn);
		if (!g1) {
			report(0, "%s: %s", what, kvmem_last_error());
			continue;
		}
		cmp_twin(what, g1, ref, qn);
		/* Again (v5: the splits arrive in another order), and with the
		 * key count on the device over a view of another capacity. */
		g3 = run_plain(ver, o, dq, dqp, n_q, dk1, dv1, dkp, n_kv, s1, s, qn);
		if (!g3)
			die("decode again");
		d3 = ndiff(g1, g3, qn, &un);
		if (!s->kv_pos) {
			poison(o, 2 * qn);
			if (kvmem_cuda_attention_decode_bf16(g_c, ver, o, dq, dqp, n_q, dk2, dv2, dn, (int)s2,
							     s2, s->heads, kvh, hd,
							     1.0f / sqrtf((float)hd)))
				die("decode, device key count");
			g2 = dget(o, 2 * qn);
			d2 = ndiff(g1, g2, qn, &un);
		}
		report(!d2 && !d3 && !un, "  %s %-42s again: %zu differ; device count, capacity %zu: "
		       "%s%zu differ (of %zu)", vn, "bit for bit", d3, s2, s->kv_pos ? "(n/a) " : "",
		       d2, qn);
		free(g1);
		free(g2);
		free(g3);
	}
	free(q);
	free(k);
	free(v);
	free(k1);
	free(v1);
	free(k2);
	free(v2);
	free(ref);
	free(qp);
	free(kp);
	kvmem_cuda_free(dq);
	kvmem_cuda_free(dqp);
	kvmem_cuda_free(dk1);
	kvmem_cuda_free(dv1);
	kvmem_cuda_free(dk2);
	kvmem_cuda_free(dv2);
	kvmem_cuda_free(dkp);
	kvmem_cuda_free(dn);
	kvmem_cuda_free(o);
}

/*
 * A captured graph of NL decode calls over NL layers' K/V ([NL][kvh][cap]
 * [hd], the view's layout), each into its own output, replayed at several
 * key counts: every layer's output equals a plain call over the same keys
 * bit for bit (v5: the counters each launch leaves at zero serve the next).
 */
#define NL 4

void check_decode_graph(int ver)
{
	char vn[16];
	const int heads = g_quick ? 8 : 32, kvh = g_quick ? 2 : 8, hd = g_quick ? 64 : 128;
	const int cap = g_quick ? 2000 : 20000;
	const int counts[] = { 1, 63, 64, 65, 700, cap / 2 + 1, cap - 1, cap };
	/* --quick (the sanitizers' run): 1, 64, 700 and cap */
	const int n_counts = g_quick ? 4 : (int)(sizeof(counts) / sizeof(counts[0]));
	const size_t qn = (size_t)heads * hd, lay = (size_t)kvh * cap * hd;
	const float sc = 1.0f / sqrtf((float)hd);
	const struct dshape sh = { "graph", 1, 0, heads, kvh, hd, 0, 1 };
	cudaStream_t st = (cudaStream_t)kvmem_cuda_stream(g_c);
	uint16_t *q = rand_bf16(qn, -1, 1), *k = NULL, *v = NULL;	/* the last layer's, for the twin */
	void *dq = dput(q, 2 * qn), *dk = NULL, *dv = NULL;
	void *dn = dpoison(4), *dqp = dpoison(4), *og = dpoison(2 * NL * qn), *op = dpoison(2 * qn);
	cudaGraph_t graph = NULL;
	cudaGraphExec_t exec = NULL;
	size_t differ = 0, un = 0;
	int runs = 0, rc = 0;
	char what[96];

	snprintf(vn, sizeof(vn), ver ? "v%d" : "main", ver);
	if (kvmem_cuda_malloc(&dk, 2 * NL * lay) || kvmem_cuda_malloc(&dv, 2 * NL * lay) ||
	    kvmem_cuda_random_bf16(g_c, dk, NL * lay, rnext(), KV_SCALE) ||
	    kvmem_cuda_random_bf16(g_c, dv, NL * lay, rnext(), KV_SCALE))
		die("decode graph: alloc");
	k = dget((uint16_t *)dk + (NL - 1) * lay, 2 * lay);
	v = dget((uint16_t *)dv + (NL - 1) * lay, 2 * lay);
	if (kvmem_cuda_reserve(g_c, kvmem_cuda_attention_scratch(g_c, 1, heads, kvh, hd)))
		die("reserve");
	if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
		die("begin capture");
	for (int l = 0; l < NL && !rc; l++)
		rc = kvmem_cuda_attention_decode_bf16(g_c, ver, (uint16_t *)og + l * qn, dq, dqp, 1,
						      (uint16_t *)dk + l * lay, (uint16_t *)dv + l * lay,
						      dn, cap, cap, heads, kvh, hd, sc);
	if (cudaStreamEndCapture(st, &graph) != cudaSuccess || rc ||
	    cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
		report(0, "decode %s graph: capture failed: %s", vn, rc ? kvmem_last_error() : "CUDA");
		cudaGetLastError();
		goto out;
	}
	for (int i = 0; i < n_counts; i++) {
		static const int quick_at[] = { 0, 2, 4, 7 };
		int32_t n = counts[g_quick ? quick_at[i] : i], p = n - 1;
		uint16_t *a;

		poison(og, 2 * NL * qn);
		if (kvmem_cuda_upload(g_c, dn, &n, 4) || kvmem_cuda_upload(g_c, dqp, &p, 4) ||
		    cudaGraphLaunch(exec, st) != cudaSuccess)
			die("decode graph replay");
		a = dget(og, 2 * NL * qn);
		for (int l = 0; l < NL; l++) {
			uint16_t *b = run_plain(ver, op, dq, dqp, 1, (uint16_t *)dk + l * lay,
						(uint16_t *)dv + l * lay, NULL, n, cap, &sh, qn);

			if (!b)
				die("decode plain");
			differ += ndiff(a + l * qn, b, qn, &un) != 0;
			runs++;
			free(b);
		}
		if (n == 700) {
			uint16_t *ref = hmalloc(2 * qn);

			if (kvmem_attention_bf16(ref, q, &p, 1, k, v, NULL, n, cap, heads, kvh, hd, sc))
				die("attention twin");
			snprintf(what, sizeof(what), "decode %s graph, layer %d at 700 keys vs twin", vn, NL - 1);
			cmp_twin(what, a + (NL - 1) * qn, ref, qn);
			free(ref);
		}
		free(a);
	}
	report(!differ && !un, "decode %s graph of %d layers at %d key counts = plain calls "
	       "(%zu of %d differ, %zu unwritten)", vn, NL, n_counts, differ, runs, un);
out:
	if (exec)
		cudaGraphExecDestroy(exec);
	if (graph)
		cudaGraphDestroy(graph);
	free(q);
	free(k);
	free(v);
	kvmem_cuda_free(dq);
	kvmem_cuda_free(dk);
	kvmem_cuda_free(dv);
	kvmem_cuda_free(dn);
	kvmem_cuda_free(dqp);
	kvmem_cuda_free(og);
	kvmem_cuda_free(op);
}

void check_attn_decode(void)
{
	static const struct dshape full[] = {
		{ "8B 32/8 hd128, 1 key", 1, 1, 32, 8, 128, 0, 1 },
		{ "8B 32/8 hd128, 7 keys", 1, 7, 32, 8, 128, 0, 1 },
		{ "8B 32/8 hd128, 100 keys", 1, 100, 32, 8, 128, 0, 1 },
		{ "8B 32/8 hd128, 4096 keys", 1, 4096, 32, 8, 128, 0, 1 },
		{ "8B 32/8 hd128, 4097 keys, q x4", 1, 4097, 32, 8, 128, 0, 4 },
		{ "8B 32/8 hd128, 32768 keys", 1, 32768, 32, 8, 128, 0, 1 },
		{ "8B 32/8 hd128, 32771 keys, q x4", 1, 32771, 32, 8, 128, 0, 4 },
		{ "8B 3 queries (12 rows) @ 5000", 3, 5000, 32, 8, 128, 0, 1 },
		{ "8B 4 queries (16 rows) @ 777", 4, 777, 32, 8, 128, 0, 4 },
		{ "MHA 8/8 hd128, 100 keys", 1, 100, 8, 8, 128, 0, 1 },
		{ "MHA 8/8 hd128, 4099 keys, q x4", 1, 4099, 8, 8, 128, 0, 4 },
		{ "hd64 8/2 (agentlang), 7 keys", 1, 7, 8, 2, 64, 0, 1 },
		{ "hd64 8/2, 2053 keys", 1, 2053, 8, 2, 64, 0, 4 },
		{ "hd64 MHA 4/4, 333 keys", 1, 333, 4, 4, 64, 0, 1 },
		{ "hd64 16/2 group 8, 2 queries @ 1000", 2, 1000, 16, 2, 64, 0, 1 },
		{ "8B kv_pos shuffled, 3000 keys", 1, 3000, 32, 8, 128, 1, 4 },
		{ "hd64 8/2 kv_pos shuffled, 2 queries @ 500", 2, 500, 8, 2, 64, 1, 1 },
	}, quick[] = {
		{ "quick hd128 32/8, 1 key", 1, 1, 32, 8, 128, 0, 1 },
		{ "quick hd128 32/8, 7 keys", 1, 7, 32, 8, 128, 0, 1 },
		{ "quick hd128 32/8, 700 keys", 1, 700, 32, 8, 128, 0, 4 },
		{ "quick hd64 4/4, 100 keys", 1, 100, 4, 4, 64, 0, 1 },
		{ "quick hd64 8/2 kv_pos, 2 queries @ 300", 2, 300, 8, 2, 64, 1, 1 },
	};
	const struct dshape *sh = g_quick ? quick : full;
	const int ns = g_quick ? (int)(sizeof(quick) / sizeof(quick[0])) : (int)(sizeof(full) / sizeof(full[0]));

	for (int i = 0; i < ns; i++)
		check_decode_shape(&sh[i], vers, N_VERS);
	check_decode_graph(5);
	if (!g_quick) {	/* v5 many times at once-busy counters: the same bits each run */
		const struct dshape s = { "repeat", 1, 32768, 32, 8, 128, 0, 1 };
		const size_t qn = 32 * 128, kn = (size_t)8 * 32768 * 128;
		uint16_t *q = rand_bf16(qn, -1, 1), *first = NULL;
		int32_t p = 32767;
		void *dq = dput(q, 2 * qn), *dqp = dput(&p, 4), *dk, *dv, *o = dpoison(2 * qn);
		size_t differ = 0, un = 0;

		if (kvmem_cuda_malloc(&dk, 2 * kn) || kvmem_cuda_malloc(&dv, 2 * kn) ||
		    kvmem_cuda_random_bf16(g_c, dk, kn, rnext(), KV_SCALE) ||
		    kvmem_cuda_random_bf16(g_c, dv, kn, rnext(), KV_SCALE))
			die("repeat alloc");
		for (int r = 0; r < 20; r++) {
			uint16_t *g = run_plain(5, o, dq, dqp, 1, dk, dv, NULL, 32768, 32768, &s, qn);

			if (!g)
				die("decode v5 repeat");
			if (!first)
				first = g;
			else {
				differ += ndiff(first, g, qn, &un) != 0;
				free(g);
			}
		}
		report(!differ && !un, "decode v5 at 32768 keys, 20 runs: %zu differ from the first", differ);
		free(q);
		free(first);
		kvmem_cuda_free(dq);
		kvmem_cuda_free(dqp);
		kvmem_cuda_free(dk);
		kvmem_cuda_free(dv);
		kvmem_cuda_free(o);
	}
}

/* ---- timing -------------------------------------------------------------- */

#define T_LAYERS 36
#define T_CAP 131072

struct dec_time {
	int ver, n_kv, next;
	void *q, *qp, *k, *v, *out;
	size_t lay, qn;
	cudaGraphExec_t exec;
};

static int run_exec(void *p)
{
	struct dec_time *t = p;

	return cudaGraphLaunch(t->exec, (cudaStream_t)kvmem_cuda_stream(g_c)) != cudaSuccess;
}

/* One plain launch on the next layer (cold in the L2, as in decode). */
static int run_single(void *p)
{
	struct dec_time *t = p;
	const int l = t->next++ % T_LAYERS;

	return kvmem_cuda_attention_bf16_v(g_c, t->ver, (uint16_t *)t->out + l * t->qn, t->q, t->qp, 1,
					   (uint16_t *)t->k + l * t->lay, (uint16_t *)t->v + l * t->lay,
					   NULL, t->n_kv, T_CAP, 32, 8, 128, 1.0f / sqrtf(128.0f));
}

void attn_decode_sweep(void)
{
	const int counts[] = { 4096, 32768, 131072 };
	enum { NC = 3 };
	const int heads = 32, kvh = 8, hd = 128;
	const size_t qn = (size_t)heads * hd, lay = (size_t)kvh * T_CAP * hd;
	const float sc = 1.0f / sqrtf((float)hd);
	cudaStream_t st = (cudaStream_t)kvmem_cuda_stream(g_c);
	double gus[N_VERS][NC], sus[N_VERS][NC], copy_gbs;
	uint16_t *q = rand_bf16(qn, -1, 1), *hk = NULL, *hv = NULL, *ref = NULL;
	struct dec_time t = { .qn = qn, .lay = lay };
	void *dn;

	printf("== decode attention checks (%s, %d SMs)\n", kvmem_cuda_device_name(g_c),
	       kvmem_cuda_sm_count(g_c));
	check_attn_decode();
	if (g_quick)	/* the sanitizers' run: the checks alone */
		return;
	copy_gbs = kvmem_cuda_copy_gbps(g_c, (size_t)2 << 30);
	if (copy_gbs <= 0)
		die("decode sweep: copy rate");
	t.q = dput(q, 2 * qn);
	t.qp = dpoison(4);
	dn = dpoison(4);
	if (kvmem_cuda_malloc(&t.k, 2 * T_LAYERS * lay) || kvmem_cuda_malloc(&t.v, 2 * T_LAYERS * lay) ||
	    kvmem_cuda_malloc(&t.out, 2 * T_LAYERS * qn) ||
	    kvmem_cuda_random_bf16(g_c, t.k, T_LAYERS * lay, rnext(), KV_SCALE) ||
	    kvmem_cuda_random_bf16(g_c, t.v, T_LAYERS * lay, rnext(), KV_SCALE) ||
	    kvmem_cuda_sync(g_c) ||
	    kvmem_cuda_reserve(g_c, kvmem_cuda_attention_scratch(g_c, 1, heads, kvh, hd)))
		die("decode sweep: alloc");
	printf("\n== decode attention timing: Qwen3-8B (32/8 heads, head_dim 128), %d layers' K/V in "
	       "a view of %d slots ([L][Hkv][cap][D], %.1f GB each of K and V); copy rate %.0f GB/s "
	       "(read + write, 2 GiB d2d, best of 5)\n", T_LAYERS, T_CAP, 2.0 * T_LAYERS * lay / 1e9,
	       copy_gbs);
	printf("graph: one launch's share of a graph of %d, one per layer (median of 10 replays); "
	       "single: one launch on the next layer (median of 20); floor: K+V bytes at the copy rate\n",
	       T_LAYERS);
	printf("%-8s %-4s %10s %8s %8s %10s %8s %10s %10s\n", "keys", "ver", "graph us", "GB/s",
	       "of floor", "single us", "of floor", "floor us", "token ms");
	for (int vi = 0; vi < N_VERS; vi++) {
		cudaGraph_t graph = NULL;
		int rc = 0;

		t.ver = vers[vi];
		t.exec = NULL;
		if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
			die("begin capture");
		for (int l = 0; l < T_LAYERS && !rc; l++)
			rc = kvmem_cuda_attention_decode_bf16(g_c, t.ver, (uint16_t *)t.out + l * qn, t.q, t.qp,
							      1, (uint16_t *)t.k + l * lay,
							      (uint16_t *)t.v + l * lay, dn, T_CAP, T_CAP, heads,
							      kvh, hd, sc);
		if (cudaStreamEndCapture(st, &graph) != cudaSuccess || rc ||
		    cudaGraphInstantiate(&t.exec, graph, 0) != cudaSuccess) {
			report(0, "decode v%d: a graph of %d launches: %s", t.ver, T_LAYERS,
			       rc ? kvmem_last_error() : "CUDA");
			cudaGetLastError();
			if (graph)
				cudaGraphDestroy(graph);
			for (int c = 0; c < NC; c++)
				gus[vi][c] = sus[vi][c] = NAN;
			continue;
		}
		for (int c = 0; c < NC; c++) {
			const int32_t n = counts[c], p = n - 1;
			const double bytes = 2.0 * 2.0 * n * kvh * hd, floor_us = bytes / (copy_gbs * 1e3);
			size_t differ = 0, un = 0;
			uint16_t *a;

			t.n_kv = n;
			if (kvmem_cuda_upload(g_c, dn, &n, 4) || kvmem_cuda_upload(g_c, t.qp, &p, 4))
				die("decode sweep: upload");
			poison(t.out, 2 * T_LAYERS * qn);
			gus[vi][c] = time_ms(run_exec, &t, 2, 10) * 1e3 / T_LAYERS;
			/* The graph's outputs: layers 0 and 35 bit for bit plain calls. */
			a = dget(t.out, 2 * T_LAYERS * qn);
			for (int l = 0; l < T_LAYERS; l += T_LAYERS - 1) {
				uint16_t *b;

				t.next = l;
				if (run_single(&t))
					die("decode sweep: plain call");
				b = dget((uint16_t *)t.out + l * qn, 2 * qn);
				differ += ndiff(a + l * qn, b, qn, &un) != 0;
				free(b);
			}
			report(!differ && !un, "decode v%d graph of %d layers at %d keys: layers 0 and %d = "
			       "plain calls (%zu differ, %zu unwritten)", t.ver, T_LAYERS, n, T_LAYERS - 1,
			       differ, un);
			if (c == NC - 1) {	/* the longest against the twin (layer 0, host copy once) */
				char what[96];

				if (!hk) {
					hk = dget(t.k, 2 * lay);
					hv = dget(t.v, 2 * lay);
					ref = hmalloc(2 * qn);
					if (kvmem_attention_bf16(ref, q, &p, 1, hk, hv, NULL, n, T_CAP, heads, kvh,
								 hd, sc))
						die("attention twin");
				}
				snprintf(what, sizeof(what), "decode v%d graph, layer 0 at %d keys vs twin",
					 t.ver, n);
				cmp_twin(what, a, ref, qn);
			}
			free(a);
			t.next = 0;
			sus[vi][c] = time_ms(run_single, &t, 2, 20) * 1e3;
			printf("%-8d v%-3d %10.2f %8.0f %8.2f %10.2f %8.2f %10.2f %10.3f\n", n, t.ver,
			       gus[vi][c], bytes / (gus[vi][c] * 1e3), floor_us / gus[vi][c], sus[vi][c],
			       floor_us / sus[vi][c], floor_us, gus[vi][c] * T_LAYERS / 1e3);
			fflush(stdout);
		}
		cudaGraphExecDestroy(t.exec);
		cudaGraphDestroy(graph);
	}
	printf("\n%-34s", "per token (36 layers, graph), ms:");
	for (int vi = 0; vi < N_VERS; vi++)
		printf("   v%d", vers[vi]);
	printf("   floor   v5/v2 speedup   v5 of floor\n");
	for (int c = 0; c < NC; c++) {
		const double floor_ms = 2.0 * 2.0 * counts[c] * kvh * hd * T_LAYERS / (copy_gbs * 1e6);

		printf("%-34d", counts[c]);
		for (int vi = 0; vi < N_VERS; vi++)
			printf(" %6.3f", gus[vi][c] * T_LAYERS / 1e3);
		printf("  %6.3f   %13.2f   %11.2f\n", floor_ms, gus[0][c] / gus[N_VERS - 1][c],
		       floor_ms / (gus[N_VERS - 1][c] * T_LAYERS / 1e3));
	}
	free(q);
	free(hk);
	free(hv);
	free(ref);
	kvmem_cuda_free(t.q);
	kvmem_cuda_free(t.qp);
	kvmem_cuda_free(t.k);
	kvmem_cuda_free(t.v);
	kvmem_cuda_free(t.out);
	kvmem_cuda_free(dn);
}

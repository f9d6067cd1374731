// SPDX-License-Identifier: MIT
/*
 * Prefill attention v4 and v6 against the twin kvmem_attention_bf16, then
 * their timings (see check_attn_prefill.h). Tolerance of Documentation/
 * kernels.md, |gpu - cpu| <= 4e-3 + 2^-7 |cpu| per element (P rounded to
 * bf16 for P V, bf16 output, V in [-1, 1]), and a relative L2 error under
 * 1e-2 (an output of zeros would pass the first at long views). Outputs are
 * poisoned (0xffff) first; K/V rows past the key count are NaN, never to
 * be read; inputs are fresh random numbers from the seed.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_cuda.h"
#include "kvmem/kvmem.h"
#include "check_attn_prefill.h"
#include "check_util.h"

#define RELL2_MAX 1e-2
#define MAX_FORMS 16

/* v6's forms to check and time (KVMEM_V6_FORMS), -1: the main one. */
static int forms[MAX_FORMS] = { -1 }, n_forms = 1;

static void read_forms(void)
{
	const char *e = getenv("KVMEM_V6_FORMS");
	char *end;

	if (!e || !*e || n_forms != 1 || forms[0] != -1)
		return;
	n_forms = 0;
	while (*e && n_forms < MAX_FORMS) {
		long f = strtol(e, &end, 10);

		if (end == e)
			break;
		forms[n_forms++] = (int)f;
		e = *end == ',' ? end + 1 : end;
	}
	if (!n_forms)
		forms[n_forms++] = -1;
}

/* Switch v6 to forms[i]; its label ("" for the main form). */
static const char *use_form(int i, char *buf, size_t n)
{
	*buf = 0;
	if (forms[i] >= 0) {
		snprintf(buf, n, " f%d", forms[i]);
		if (kvmem_cuda_attention_v6_form(forms[i]) < 0)
			die(buf);
	}
	return buf;
}

struct pshape {
	const char *name;
	int n_q, n_kv, heads, kvh, hd;
	int kv_pos;	/* shuffled key positions (v6 hands these to v4) */
	double qa;	/* q in [-qa, qa]: 1, or 4 for a sharper softmax */
};

struct cmp_rel {
	size_t bad, unwritten;
	double max_abs, rel;
};

static struct cmp_rel compare(const uint16_t *g, const uint16_t *r, size_t n, double atol)
{
	struct cmp c = { 0 };
	struct cmp_rel o;

	for (size_t i = 0; i < n; i++)
		cmp_one(&c, bf(g[i]), bf(r[i]), atol, ULP1);
	o.bad = c.bad;
	o.unwritten = c.unwritten;
	o.max_abs = c.max_abs;
	o.rel = c.l2d > 0 ? sqrt(c.l2n / c.l2d) : (c.l2n > 0 ? INFINITY : 0.0);
	return o;
}

static void *run(int ver, void *o, const void *q, const void *qp, int n_q, const void *k,
		 const void *v, const void *kp, int n_kv, size_t stride, const struct pshape *s,
		 size_t qn)
{
	if (cudaMemsetAsync(o, 0xff, 2 * qn, (cudaStream_t)kvmem_cuda_stream(g_c)) != cudaSuccess)
		die("poison");
	if (kvmem_cuda_attention_bf16_v(g_c, ver, o, q, qp, n_q, k, v, kp, n_kv, stride, s->heads,
					s->kvh, s->hd, 1.0f / sqrtf((float)s->hd)))
		return NULL;
	return dget(o, 2 * qn);
}

static void check_shape(const struct pshape *s)
{
	const int n_q = s->n_q, n_kv = s->n_kv, kvh = s->kvh, hd = s->hd;
	const size_t stride = (size_t)n_kv + 17, qn = (size_t)n_q * s->heads * hd;
	const size_t kn = (size_t)kvh * stride * hd;
	uint16_t *q = rand_bf16(qn, -s->qa, s->qa), *k = rand_bf16(kn, -1, 1), *v = rand_bf16(kn, -1, 1);
	uint16_t *ref = hmalloc(2 * qn);
	int32_t *qp = hmalloc(4 * (size_t)n_q), *kp = hmalloc(4 * (size_t)n_kv);
	void *dq, *dqp, *dk, *dv, *dkp = NULL, *o;

	for (int g = 0; g < kvh; g++)	/* rows past the key count: NaN */
		for (size_t j = n_kv; j < stride; j++)
			for (int e = 0; e < hd; e++)
				k[((size_t)g * stride + j) * hd + e] = v[((size_t)g * stride + j) * hd + e] =
					0xffff;
	if (s->kv_pos) {
		for (int j = 0; j < n_kv; j++)
			kp[j] = rint_in(0, 3 * n_kv);
		for (int i = 0; i < n_q; i++)
			qp[i] = rint_in(0, 3 * n_kv);
	} else {
		for (int i = 0; i < n_q; i++)	/* the chunk at the end of the view */
			qp[i] = n_kv - n_q + i;
	}
	dq = dput(q, 2 * qn);
	dqp = dput(qp, 4 * (size_t)n_q);
	dk = dput(k, 2 * kn);
	dv = dput(v, 2 * kn);
	if (s->kv_pos)
		dkp = dput(kp, 4 * (size_t)n_kv);
	o = dpoison(2 * qn);
	if (kvmem_attention_bf16(ref, q, qp, n_q, k, v, s->kv_pos ? kp : NULL, n_kv, stride, s->heads,
				 kvh, hd, 1.0f / sqrtf((float)hd)))
		die("attention twin");
	for (int vi = 0; vi <= n_forms; vi++) {	/* v4, then v6 in each form */
		const int ver = vi ? 6 : 4;
		char fl[16] = "";
		uint16_t *g1, *g2 = NULL;
		struct cmp_rel c;

		if (vi)
			use_form(vi - 1, fl, sizeof(fl));
		g1 = run(ver, o, dq, dqp, n_q, dk, dv, dkp, n_kv, stride, s, qn);
		if (!g1) {
			report(0, "prefill v%d%s %s: %s", ver, fl, s->name, kvmem_last_error());
			continue;
		}
		c = compare(g1, ref, qn, 4e-3);
		report(c.bad == 0 && c.rel <= RELL2_MAX,
		       "prefill v%d%s %-44s max|d|=%-9.3g relL2=%-9.3g bad=%zu unwritten=%zu", ver,
		       fl, s->name, c.max_abs, c.rel, c.bad, c.unwritten);
		{	/* the split combine a warp a row: the block form's bits */
			size_t d = 0;

			if (kvmem_cuda_tune(g_c, "combine_block", 1) < 0 ||
			    !(g2 = run(ver, o, dq, dqp, n_q, dk, dv, dkp, n_kv, stride, s, qn)))
				die("prefill, the block combine");
			kvmem_cuda_tune(g_c, "combine_block", 0);
			for (size_t i = 0; i < qn; i++)
				d += g1[i] != g2[i];
			report(!d, "  v%d%s: the block combine's bits (%zu of %zu differ)", ver, fl, d,
			       qn);
			free(g2);
		}
		if (ver == 6) {
			size_t d = 0;

			if (!(g2 = run(ver, o, dq, dqp, n_q, dk, dv, dkp, n_kv, stride, s, qn)))
				die("prefill v6 again");
			for (size_t i = 0; i < qn; i++)
				d += g1[i] != g2[i];
			report(!d, "  v6%s again: the same bits (%zu of %zu differ)", fl, d, qn);
			free(g2);
		}
		free(g1);
	}
	free(q);
	free(k);
	free(v);
	free(ref);
	free(qp);
	free(kp);
	kvmem_cuda_free(dq);
	kvmem_cuda_free(dqp);
	kvmem_cuda_free(dk);
	kvmem_cuda_free(dv);
	kvmem_cuda_free(dkp);
	kvmem_cuda_free(o);
}

void check_attn_prefill(void)
{
	static const struct pshape full[] = {
		{ "8B 512 x 512 causal (chunk at the start)", 512, 512, 32, 8, 128, 0, 1 },
		{ "8B 777 x 777 causal (not tile multiples)", 777, 777, 32, 8, 128, 0, 1 },
		{ "8B chunk 128 @ 1000", 128, 1000, 32, 8, 128, 0, 1 },
		{ "8B chunk 200 @ 1337", 200, 1337, 32, 8, 128, 0, 1 },
		{ "8B chunk 16 @ 3000 (a warpgroup idle)", 16, 3000, 32, 8, 128, 0, 1 },
		{ "8B chunk 8 @ 32768 (33 splits)", 8, 32768, 32, 8, 128, 0, 1 },
		{ "8B chunk 256 @ 256 (a short prompt)", 256, 256, 32, 8, 128, 0, 1 },
		{ "8B chunk 300 @ 2000, q in [-4, 4]", 300, 2000, 32, 8, 128, 0, 4 },
		{ "8B chunk 1024 @ 4500", 1024, 4500, 32, 8, 128, 0, 1 },
		{ "GQA 64/8 chunk 100 @ 1500", 100, 1500, 64, 8, 128, 0, 1 },
		{ "MHA 4/4 70 x 70", 70, 70, 4, 4, 128, 0, 1 },
		{ "hd64 8/2 300 x 300 (v6: as v4)", 300, 300, 8, 2, 64, 0, 1 },
		{ "kv_pos shuffled 37 @ 300 (v6: as v4)", 37, 300, 8, 2, 128, 1, 1 },
	}, quick[] = {
		{ "quick 8/2 40 x 100", 40, 100, 8, 2, 128, 0, 1 },
		{ "quick 32/8 chunk 16 @ 300", 16, 300, 32, 8, 128, 0, 1 },
		{ "quick 32/8 200 x 200", 200, 200, 32, 8, 128, 0, 1 },
	};
	const struct pshape *sh = (read_forms(), g_quick ? quick : full);
	const size_t ns = g_quick ? sizeof(quick) / sizeof(quick[0]) : sizeof(full) / sizeof(full[0]);

	for (size_t i = 0; i < ns; i++)
		check_shape(&sh[i]);
}

/* ---- timing ------------------------------------------------------------------ */

struct att_arg {
	int version, n_q, n_kv;
	void *out, *q, *k, *v, *qp;
	size_t cap;
};

static int run_att(void *p)
{
	struct att_arg *a = p;

	return kvmem_cuda_attention_bf16_v(g_c, a->version, a->out, a->q, a->qp, a->n_q, a->k, a->v,
					   NULL, a->n_kv, a->cap, 32, 8, 128, 1.0f / sqrtf(128.0f));
}

struct gemm_arg {
	void *x, *w, *y;
};

static int run_gemm(void *p)
{
	struct gemm_arg *g = p;

	return kvmem_cuda_gemm_bf16(g_c, g->y, KVMEM_GEMM_BF16, g->x, g->w, 8192, 8192, 8192);
}

/* The bf16 GEMM rate: a burst (time_ms) or held for a second (held_ms). */
static double gemm_rate(int held)
{
	struct gemm_arg g;
	const size_t e = (size_t)8192 * 8192;
	double ms, tfs;

	if (kvmem_cuda_malloc(&g.x, 2 * e) || kvmem_cuda_malloc(&g.w, 2 * e) ||
	    kvmem_cuda_malloc(&g.y, 2 * e))
		die("bench alloc");
	dfill_bf16(g.x, e, 1);
	dfill_bf16(g.w, e, 0.05);
	ms = held ? held_ms(run_gemm, &g, 0.5, 1.0) : time_ms(run_gemm, &g, 3, 10);
	tfs = 2.0 * 8192.0 * 8192 * 8192 / (ms * 1e-3) / 1e12;
	printf("%-44s %9.3f ms  %8.1f TFLOP/s\n",
	       held ? "GEMM bf16 8192^3, held" : "GEMM bf16 8192^3 (cuBLASLt)", ms, tfs);
	kvmem_cuda_free(g.x);
	kvmem_cuda_free(g.w);
	kvmem_cuda_free(g.y);
	return tfs;
}

void attn_prefill_sweep(void)
{
	static const struct { const char *name; int n_q, n_kv; } pre[] = {
		{ "prefill 4096 x 4096 causal", 4096, 4096 },
		{ "prefill 16384 x 16384 causal", 16384, 16384 },
		{ "chunk 4096 @ 32768 view", 4096, 32768 },
		{ "chunk 512 @ 32768 view", 512, 32768 },
	};
	const int heads = 32, kvh = 8, hd = 128, maxq = 16384;
	const size_t cap = 32768 + 64, qn = (size_t)maxq * heads * hd;
	struct att_arg a = { .cap = cap };
	struct att_bufs b;
	int32_t *pos = hmalloc(4 * (size_t)maxq);
	double gemm_tfs;
	void *o4;

	check_attn_prefill();
	if (g_quick)
		return;
	g_rng ^= 0x7072656669ull;
	printf("\n== prefill attention timing (%s, %d SMs; Qwen3-8B 32/8 heads, head_dim 128; "
	       "median of CUDA-event timings) ==\n", kvmem_cuda_device_name(g_c),
	       kvmem_cuda_sm_count(g_c));
	gemm_tfs = gemm_rate(0);
	att_bufs_alloc(&b, maxq, cap, heads, kvh, hd);
	a.q = b.q;
	a.k = b.k;
	a.v = b.v;
	a.out = b.out;
	a.qp = b.qp;
	if (kvmem_cuda_malloc(&o4, 2 * qn))
		die("bench alloc");
	printf("%-44s %9s  %10s  %s\n", "attention", "ms", "rate", "of GEMM rate");
	for (size_t i = 0; i < sizeof(pre) / sizeof(pre[0]); i++) {
		double vis = 0, ms[2];
		const size_t n = (size_t)pre[i].n_q * heads * hd;

		a.n_q = pre[i].n_q;
		a.n_kv = pre[i].n_kv;
		for (int t = 0; t < a.n_q; t++) {
			pos[t] = a.n_kv - a.n_q + t;
			vis += pos[t] + 1;
		}
		if (kvmem_cuda_upload(g_c, a.qp, pos, 4 * (size_t)a.n_q))
			die("upload");
		for (int vi = 0; vi <= n_forms; vi++) {	/* v4, then v6 in each form */
			char name[80], fl[16] = "";
			double tf;

			a.version = vi ? 6 : 4;
			if (vi)
				use_form(vi - 1, fl, sizeof(fl));
			ms[!!vi] = time_ms(run_att, &a, 3, 11);
			tf = 4.0 * hd * heads * vis / (ms[!!vi] * 1e-3) / 1e12;
			snprintf(name, sizeof(name), "%s v%d%s", pre[i].name, a.version, fl);
			printf("%-44s %9.3f  %6.1f TF/s  %5.2f\n", name, ms[!!vi], tf, tf / gemm_tfs);
			if (!vi) {
				if (cudaMemcpyAsync(o4, a.out, 2 * n, cudaMemcpyDeviceToDevice,
						    (cudaStream_t)kvmem_cuda_stream(g_c)) != cudaSuccess)
					die("copy");
				continue;
			}
			{	/* v6's output against v4's (the twin is too slow here) */
				uint16_t *g4 = dget(o4, 2 * n), *g6 = dget(a.out, 2 * n);
				struct cmp_rel c = compare(g6, g4, n, 8e-3);

				report(c.bad == 0 && c.rel <= RELL2_MAX && c.unwritten == 0,
				       "  v6%s = v4 within 8e-3 + 2^-7: %-16s max|d|=%-9.3g relL2=%-9.3g "
				       "bad=%zu; v6 %.2fx v4", fl, pre[i].name, c.max_abs, c.rel, c.bad,
				       ms[0] / ms[1]);
				free(g4);
				free(g6);
			}
		}
	}
	{	/* At the power limit: the GEMM and v6 (the form timed last: the
		 * engine's unless KVMEM_V6_FORMS) at the 4096-query chunk over
		 * 32768 keys, each back to back for a second after half a
		 * second's warm-up. A long prefill runs here
		 * (tests/gpu/engine_figures.sh puts its bound together from these
		 * lines). */
		double held_gemm, ms, vis = 0;

		printf("\n== held for a second at the power limit ==\n");
		held_gemm = gemm_rate(1);
		a.version = 6;
		a.n_q = 4096;
		a.n_kv = 32768;
		for (int t = 0; t < a.n_q; t++) {
			pos[t] = a.n_kv - a.n_q + t;
			vis += pos[t] + 1;
		}
		if (kvmem_cuda_upload(g_c, a.qp, pos, 4 * (size_t)a.n_q))
			die("upload");
		ms = held_ms(run_att, &a, 0.5, 1.0);
		printf("%-44s %9.3f  %6.1f TF/s  %5.2f of the held GEMM rate\n",
		       "chunk 4096 @ 32768 view v6, held", ms, 4.0 * 128 * heads * vis / (ms * 1e-3) / 1e12,
		       4.0 * 128 * heads * vis / (ms * 1e-3) / 1e12 / held_gemm);
	}
	free(pos);
	att_bufs_free(&b);
	kvmem_cuda_free(o4);
}

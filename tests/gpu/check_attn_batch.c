// SPDX-License-Identifier: MIT
/*
 * The batched attention against its twin (kvmem_attention_bf16 of each
 * sequence alone) and against itself, then its timing (see
 * check_attn_batch.h). Tolerance as the decode checks': |gpu - cpu| <=
 * 4e-3 + 2^-7 |cpu| per element and a relative L2 error under 1e-2.
 * Outputs are poisoned (0xffff) first; inputs are fresh random numbers
 * from the seed.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_cuda_batch.h"
#include "kvmem/kvmem.h"
#include "check_attn_batch.h"
#include "check_gemv_rows.h"
#include "check_util.h"

#define RELL2_MAX 1e-2
#define MAX_SEQS 64

/* One sequence's host data and device copies. */
struct bseq {
	int n_q, n_kv, q0;
	size_t stride;
	uint16_t *k, *v;	/* host, [kvh][stride][hd], NaN past n_kv */
	int32_t *qp, *kp;	/* kp NULL: slot = position */
	void *dk, *dv, *dqp, *dkp;
};

static void poison(void *d, size_t bytes)
{
	if (cudaMemsetAsync(d, 0xff, bytes, (cudaStream_t)kvmem_cuda_stream(g_c)) != cudaSuccess)
		die("poison");
}

static void bseq_make(struct bseq *s, int n_q, int n_kv, int q0, int kvh, int hd, int shuffled)
{
	size_t kn;

	s->n_q = n_q;
	s->n_kv = n_kv;
	s->q0 = q0;
	s->stride = (size_t)n_kv + (size_t)rint_in(0, 40);
	kn = (size_t)kvh * s->stride * hd;
	s->k = rand_bf16(kn ? kn : 1, -1, 1);
	s->v = rand_bf16(kn ? kn : 1, -1, 1);
	for (int g = 0; g < kvh; g++) {	/* NaN past n_kv: never read */
		memset(s->k + ((size_t)g * s->stride + n_kv) * hd, 0xff, 2 * (s->stride - n_kv) * hd);
		memset(s->v + ((size_t)g * s->stride + n_kv) * hd, 0xff, 2 * (s->stride - n_kv) * hd);
	}
	s->qp = hmalloc(4 * (size_t)(n_q ? n_q : 1));
	s->kp = NULL;
	if (shuffled) {
		s->kp = hmalloc(4 * (size_t)(n_kv ? n_kv : 1));
		for (int j = 0; j < n_kv; j++)
			s->kp[j] = rint_in(0, 3 * n_kv + 1);
		for (int i = 0; i < n_q; i++)	/* each sees some keys, maybe none */
			s->qp[i] = rint_in(0, 3 * n_kv + 1);
	} else {
		for (int i = 0; i < n_q; i++)	/* the last n_q tokens of the view */
			s->qp[i] = n_kv - n_q + i;
	}
	s->dk = dput(s->k, 2 * (kn ? kn : 1));
	s->dv = dput(s->v, 2 * (kn ? kn : 1));
	s->dqp = dput(s->qp, 4 * (size_t)(n_q ? n_q : 1));
	s->dkp = s->kp ? dput(s->kp, 4 * (size_t)(n_kv ? n_kv : 1)) : NULL;
}

/* A decode sequence for the timing: device data only (one query, the
 * view's last token), K and V random on the device. */
static void bseq_dev(struct bseq *s, int n_kv, int q0, int kvh, int hd)
{
	const size_t kn = (size_t)kvh * n_kv * hd;

	memset(s, 0, sizeof(*s));
	s->n_q = 1;
	s->n_kv = n_kv;
	s->q0 = q0;
	s->stride = (size_t)n_kv;
	s->qp = hmalloc(4);
	s->qp[0] = n_kv - 1;
	if (kvmem_cuda_malloc(&s->dk, 2 * kn) || kvmem_cuda_malloc(&s->dv, 2 * kn))
		die("timing: device memory");
	dfill_bf16(s->dk, kn, 1);
	dfill_bf16(s->dv, kn, 1);
	s->dqp = dput(s->qp, 4);
}

static void bseq_free(struct bseq *s)
{
	free(s->k);
	free(s->v);
	free(s->qp);
	free(s->kp);
	kvmem_cuda_free(s->dk);
	kvmem_cuda_free(s->dv);
	kvmem_cuda_free(s->dqp);
	kvmem_cuda_free(s->dkp);
}

static kvmem_cuda_att_seq as_arg(const struct bseq *s)
{
	return (kvmem_cuda_att_seq){ .q0 = s->q0, .n_q = s->n_q, .q_pos = s->dqp, .k = s->dk,
				     .v = s->dv, .kv_pos = s->dkp, .n_kv = s->n_kv,
				     .kv_stride = (long long)s->stride };
}

/* One random batch. */
static void batch_case(int n, int heads, int kvh, int hd, double qa)
{
	struct bseq s[16];
	kvmem_cuda_att_seq a[16], r[16];
	int rows = 0, gqa = heads / kvh, boundary = 0, shuffled = 0;
	const float sc = 1.0f / sqrtf((float)hd);
	size_t qn, un = 0, d_alone = 0, d_rev = 0;
	uint16_t *q, *ref, *g1, *g2, *g3;
	void *dq, *o;
	struct cmp c = { 0 };
	double rel;

	for (int i = 0; i < n; i++) {
		static const int edges[] = { 0, 1, 255, 256, 257, 512, 2999 };
		int n_q = rint_in(0, 4), n_kv = rint_in(0, 1) ? edges[rint_in(0, 6)]
							       : rint_in(0, g_quick ? 900 : 3000);
		int sh = rint_in(0, 3) == 0;

		if (n_kv < n_q && !sh)
			n_kv = n_q;	/* the queries are the view's last tokens */
		boundary += n_kv % 256 == 0 && n_kv;
		shuffled += sh;
		bseq_make(&s[i], n_q, n_kv, rows, kvh, hd, sh);
		rows += n_q;
		a[i] = as_arg(&s[i]);
		r[n - 1 - i] = a[i];
	}
	qn = (size_t)(rows ? rows : 1) * heads * hd;
	q = rand_bf16(qn, -qa, qa);
	ref = hmalloc(2 * qn);
	memset(ref, 0xff, 2 * qn);
	for (int i = 0; i < n; i++)
		if (s[i].n_q &&
		    kvmem_attention_bf16(ref + (size_t)s[i].q0 * heads * hd,
					 q + (size_t)s[i].q0 * heads * hd, s[i].qp, s[i].n_q, s[i].k,
					 s[i].v, s[i].kp, s[i].n_kv, s[i].stride, heads, kvh, hd, sc))
			die("attention twin");
	dq = dput(q, 2 * qn);
	o = dpoison(2 * qn);
	if (kvmem_cuda_attention_batch(g_c, o, dq, a, n, heads, kvh, hd, sc)) {
		report(0, "attention batch: %s", kvmem_last_error());
		goto out_nog;
	}
	g1 = dget(o, 2 * qn);
	/* Each alone, into the same rows. */
	poison(o, 2 * qn);
	for (int i = 0; i < n; i++)
		if (kvmem_cuda_attention_batch(g_c, o, dq, &a[i], 1, heads, kvh, hd, sc))
			die("attention batch, alone");
	g2 = dget(o, 2 * qn);
	poison(o, 2 * qn);
	if (kvmem_cuda_attention_batch(g_c, o, dq, r, n, heads, kvh, hd, sc))
		die("attention batch, reversed");
	g3 = dget(o, 2 * qn);
	for (size_t e = 0; e < (size_t)rows * heads * hd; e++) {
		cmp_one(&c, bf(g1[e]), bf(ref[e]), 4e-3, ULP1);
		d_alone += g1[e] != g2[e];
		d_rev += g1[e] != g3[e];
		un += g1[e] == 0xffff || g2[e] == 0xffff || g3[e] == 0xffff;
	}
	rel = c.l2d > 0 ? sqrt(c.l2n / c.l2d) : (c.l2n > 0 ? INFINITY : 0.0);
	report(c.bad == 0 && rel <= RELL2_MAX && !un,
	       "batch of %2d (%2d rows, GQA %d, hd %3d, %d at a split edge, %d shuffled): "
	       "max|d|=%-8.3g relL2=%-8.3g bad=%zu unwritten=%zu", n, rows, gqa, hd, boundary,
	       shuffled, c.max_abs, rel, c.bad, un);
	report(!d_alone && !d_rev && !un, "  bit for bit: alone %zu differ, reversed %zu differ "
	       "(of %zu)", d_alone, d_rev, (size_t)rows * heads * hd);
	free(g1);
	free(g2);
	free(g3);
out_nog:
	free(q);
	free(ref);
	kvmem_cuda_free(dq);
	kvmem_cuda_free(o);
	for (int i = 0; i < n; i++)
		bseq_free(&s[i]);
}

void check_attn_batch(void)
{
	static const int shapes[][3] = { { 8, 2, 64 }, { 32, 8, 128 }, { 4, 4, 128 }, { 16, 2, 64 } };
	const int cases = g_quick ? 4 : 12;
	uint16_t dummy = 0;

	printf("\nbatched attention (kernels/cuda/attention_batch.cu) vs kvmem_attention_bf16, "
	       "each sequence alone\n");
	for (int t = 0; t < cases; t++) {
		const int *sh = shapes[t % 4];

		batch_case(rint_in(1, 12), sh[0], sh[1], sh[2], t % 3 == 2 ? 4.0 : 1.0);
	}
	/* Shapes it does not take. */
	report(kvmem_cuda_attention_batch(g_c, &dummy, &dummy, NULL, 0, 8, 3, 64, 1.0f) == -EINVAL &&
	       kvmem_cuda_attention_batch(g_c, &dummy, &dummy, NULL, 0, 8, 2, 48, 1.0f) == -EINVAL &&
	       kvmem_cuda_attention_batch(g_c, &dummy, &dummy, NULL, 0, 8, 2, 64, 1.0f) == 0,
	       "bad shapes refused (heads 8/3, head_dim 48); no sequences: nothing to do");
	check_gemv_rows();
	check_qk_rows();
}

/* ---- timing --------------------------------------------------------------- */
struct tb {
	int n, heads, kvh, hd;
	struct bseq *s;
	kvmem_cuda_att_seq *a;
	void *dq, *o;
};

static int run_batch(void *arg)
{
	struct tb *t = arg;

	return kvmem_cuda_attention_batch(g_c, t->o, t->dq, t->a, t->n, t->heads, t->kvh, t->hd,
					  1.0f / sqrtf((float)t->hd));
}

/* The main path's decode, one call per sequence (what the cuda backend
 * does for a batch today). */
static int run_loop(void *arg)
{
	struct tb *t = arg;
	const size_t row = (size_t)t->heads * t->hd * 2;

	for (int i = 0; i < t->n; i++)
		if (kvmem_cuda_attention_bf16(g_c, (uint16_t *)((char *)t->o + row * t->s[i].q0),
					      (const uint16_t *)((const char *)t->dq +
								 row * t->s[i].q0),
					      t->s[i].dqp, 1, t->s[i].dk, t->s[i].dv, NULL,
					      t->s[i].n_kv, t->s[i].stride, t->heads, t->kvh, t->hd,
					      1.0f / sqrtf((float)t->hd)))
			return -1;
	return 0;
}

void attn_batch_sweep(void)
{
	static const int counts[] = { 1, 8, 16, 64 };
	static const char *const keys[] = { "4096", "1024..8192", "32768" };
	const int heads = 32, kvh = 8, hd = 128;

	check_attn_batch();
	if (g_quick)
		return;
	printf("\nbatched decode attention, Qwen3-8B geometry (32/8 heads, head_dim 128), one "
	       "query per sequence:\nthe batched launch against one main-path decode call per "
	       "sequence (median of 20, CUDA events)\n");
	printf("%-9s %-12s %10s %10s %8s %10s\n", "sequences", "keys", "batch ms", "loop ms",
	       "loop/b", "batch GB/s");
	for (int mixed = 0; mixed < 3; mixed++)
		for (int ci = 0; ci < 4; ci++) {
			struct tb t = { .n = counts[ci], .heads = heads, .kvh = kvh, .hd = hd };
			double bytes = 0, mb, ml;
			uint16_t *qh;

			t.s = calloc((size_t)t.n, sizeof(*t.s));
			t.a = calloc((size_t)t.n, sizeof(*t.a));
			if (!t.s || !t.a)
				die("timing: out of memory");
			for (int i = 0; i < t.n; i++) {
				int n_kv = mixed == 1 ? 1024 + (i * 2531) % 7169 : mixed ? 32768 : 4096;

				bseq_dev(&t.s[i], n_kv, i, kvh, hd);
				t.a[i] = as_arg(&t.s[i]);
				bytes += 2.0 * 2 * kvh * (double)n_kv * hd;
			}
			qh = rand_bf16((size_t)t.n * heads * hd, -1, 1);
			t.dq = dput(qh, 2 * (size_t)t.n * heads * hd);
			t.o = dpoison(2 * (size_t)t.n * heads * hd);
			mb = time_ms(run_batch, &t, 3, 20);
			ml = time_ms(run_loop, &t, 3, 20);
			printf("%-9d %-12s %10.4f %10.4f %7.2fx %10.1f\n", t.n,
			       keys[mixed], mb, ml, ml / mb, bytes / (mb * 1e6));
			free(qh);
			kvmem_cuda_free(t.dq);
			kvmem_cuda_free(t.o);
			for (int i = 0; i < t.n; i++)
				bseq_free(&t.s[i]);
			free(t.s);
			free(t.a);
		}
	gemv_rows_sweep();
}

// SPDX-License-Identifier: MIT
/*
 * The cuda backend's batched forward over fp8 views (user/backend/
 * cuda_fwd_batch.c) runs two kernels a layer that a lone decode step runs
 * once per view; each must give every view the lone call's bits:
 *  - put_rows (kvmem_cuda_fp8_view_put_rows): n rows, each into its own
 *    view at its own layer and slot, against the CPU twin of the put
 *    (kvmem_fp8_view_put) of each row alone, byte for byte (K rotated, V,
 *    the raw K, the scales; the untouched slots keep their poison);
 *  - the register decode over many views (kvmem_cuda_att_dec_batch with
 *    scales) against kvmem_cuda_attention_decode_fp8 on each view alone,
 *    bit for bit, the views in order and reversed, key counts from 1 to
 *    32768; and against the CPU twin within kernels.md's bound for
 *    attention over fp8 rows up to 2^4 (2^-4 + 4e-3 + 2^-6 |ref| an
 *    element, and a relative L2 error under 1e-2, as check_attn_decode.c
 *    asks: an output of zeros passes the first). A call
 *    that mixes fp8 and bf16 views is refused.
 * With --bench, one layer at Qwen3-8B's geometry (32 query heads, 8 KV
 * heads, head_dim 128), 16 views of 4096 and of 32768 keys: the batched
 * fp8 decode against the bf16 batched decode over the same rows
 * dequantised and against 16 lone fp8 calls, each beside its byte floor.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_bf16.h"
#include "kernels/kernels_cuda.h"
#include "kernels/kernels_cuda_batch.h"
#include "kernels/kernels_cuda_fp8.h"
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"
#include "check_fp8.h"
#include "check_util.h"

#define THETA 1e6
#define MAX_SEQS 16
/* the register decode against its twin: kernels.md's bound for attention
 * over fp8 rows of magnitude up to 2^4 (flayer_make's): P rounded to bf16
 * for P V costs up to 2^-9 of a V element of 16 */
#define TWIN_ATOL (0x1p-4 + 4e-3)
#define TWIN_RTOL 0x1p-6
#define TWIN_RELL2 1e-2

/* ---- put_rows ------------------------------------------------------------ */
static void check_put_rows(int n, int H, int D)
{
	const int L = 3, ld = 3 * H * D + 8, k0 = H * D;
	struct fview v[MAX_SEQS];
	kvmem_scatter_item it[MAX_SEQS];
	kvmem_fp8_put_view pv[MAX_SEQS];
	uint16_t *rows = fwd_rows(n, H, D, ld);
	void *drows, *dit, *dpv;
	int ok;

	drows = dput(rows, 2 * (size_t)n * ld);
	for (int i = 0; i < n; i++) {
		const int cap = rint_in(1, 80);

		fview_make(&v[i], L, H, D, cap);
		it[i] = (kvmem_scatter_item){ .layer = rint_in(0, L - 1), .slot = rint_in(0, cap - 1),
					      .n = 1, .tok_stride = ld, .head_stride = D };
		kvmem_fp8_view_put(v[i].k8, v[i].v8, v[i].ks, v[i].vs, (i & 1) ? NULL : v[i].r8,
				   (i & 1) ? NULL : v[i].rs, rows + (size_t)i * ld + k0,
				   rows + (size_t)i * ld + k0 + H * D, ld, &it[i], 1, H, D, cap, THETA);
	}
	dit = dput(it, sizeof(it[0]) * n);
	for (int i = 0; i < n; i++)	/* odd rows keep no raw K */
		pv[i] = (kvmem_fp8_put_view){ .k8 = v[i].dk8, .v8 = v[i].dv8, .ks = v[i].dks,
					      .vs = v[i].dvs, .raw_k = (i & 1) ? NULL : v[i].dr8,
					      .raw_scale = (i & 1) ? NULL : v[i].drs,
					      .item = (const kvmem_scatter_item *)dit + i,
					      .cap = v[i].cap };
	dpv = dput(pv, sizeof(pv[0]) * n);
	ok = kvmem_cuda_fp8_view_put_rows(g_c, dpv, (uint16_t *)drows + k0,
					  (uint16_t *)drows + k0 + H * D, ld, n, H, D, THETA) == 0 &&
	     kvmem_cuda_sync(g_c) == 0;
	for (int i = 0; i < n; i++) {
		ok = ok && fview_same(&v[i]);
		fview_free(&v[i]);
	}
	report(ok, "fp8 view put, rows: %d rows x %d heads x %d, each into its own view at its "
	       "own layer and slot, bit for bit the twin's put of each alone", n, H, D);
	free(rows);
	kvmem_cuda_free(drows);
	kvmem_cuda_free(dit);
	kvmem_cuda_free(dpv);
}

/* ---- the decode over many views ------------------------------------------ */
struct bseq {
	struct flayer f;
	int n_kv, cap;
};

/* n views of n_kv[i] keys; queries [n][heads][D] at position n_kv - 1. */
static void check_dec_batch(const int *n_kv, int n, int heads, int H, int D)
{
	const size_t qrow = (size_t)heads * D;
	const float sc = 1.0f / sqrtf((float)D);
	struct bseq s[MAX_SEQS];
	kvmem_cuda_att_seq a[MAX_SEQS];
	const kvmem_cuda_att_seq *fw[MAX_SEQS], *bw[MAX_SEQS];
	int32_t pos[MAX_SEQS];
	uint16_t *q = rand_bf16(n * qrow, -2, 2), *alone, *got, *rev, *ref = hmalloc(2 * qrow);
	void *dq = dput(q, 2 * n * qrow), *dpos, *dnkv, *dalone = dpoison(2 * n * qrow);
	void *dgot = dpoison(2 * n * qrow), *drev = dpoison(2 * n * qrow);
	int ok = 1, rc, twin_ok = 1;
	struct cmp c = { 0 };
	double rel;
	char what[200];
	int len = 0;

	for (int i = 0; i < n; i++) {
		s[i].n_kv = n_kv[i], s[i].cap = n_kv[i] + rint_in(0, 40);
		flayer_make(&s[i].f, H, s[i].cap, D);
		pos[i] = n_kv[i] - 1;
	}
	dpos = dput(pos, sizeof(pos[0]) * n);
	dnkv = dput(n_kv, sizeof(n_kv[0]) * n);
	for (int i = 0; i < n && ok; i++)	/* each alone, as a lone decode step runs it */
		ok = kvmem_cuda_attention_decode_fp8(g_c, (uint16_t *)dalone + i * qrow,
						     (const uint16_t *)dq + i * qrow,
						     (const int32_t *)dpos + i, 1, s[i].f.k8, s[i].f.v8,
						     s[i].f.ks, s[i].f.vs, (const int32_t *)dnkv + i,
						     s[i].cap, s[i].cap, heads, H, D, sc) == 0;
	for (int i = 0; i < n; i++) {
		a[i] = (kvmem_cuda_att_seq){ .q0 = i, .n_q = 1, .q_pos = (const int32_t *)dpos + i,
					     .k = s[i].f.k8, .v = s[i].f.v8, .n_kv = n_kv[i],
					     .kv_stride = s[i].cap, .k_scale = s[i].f.ks,
					     .v_scale = s[i].f.vs };
		fw[i] = &a[i];
		bw[n - 1 - i] = &a[i];
	}
	rc = ok ? kvmem_cuda_att_dec_batch(g_c, dgot, dq, fw, n, heads, H, D, sc) : -1;
	if (!rc)
		rc = kvmem_cuda_att_dec_batch(g_c, drev, dq, bw, n, heads, H, D, sc);
	if (rc == -ENOTSUP) {
		report(1, "fp8 decode, batched: not run (%s)", kvmem_last_error());
		goto out;
	}
	ok = ok && !rc && kvmem_cuda_sync(g_c) == 0;
	alone = dget(dalone, 2 * n * qrow);
	got = dget(dgot, 2 * n * qrow);
	rev = dget(drev, 2 * n * qrow);
	for (int i = 0; i < n; i++) {
		ok = ok && !memcmp(got + i * qrow, alone + i * qrow, 2 * qrow) &&
		     !memcmp(rev + i * qrow, alone + i * qrow, 2 * qrow);
		/* the twin over the same fp8 rows (all n_kv keys visible) */
		if (kvmem_decode_kv_bf16(ref, q + i * qrow, s[i].f.hk8, s[i].f.hv8, s[i].f.hks,
					 s[i].f.hvs, KVMEM_DTYPE_FP8, n_kv[i], s[i].cap, heads, H, D,
					 sc)) {
			twin_ok = 0;
			continue;
		}
		for (size_t e = 0; e < qrow; e++)
			cmp_one(&c, bf(got[i * qrow + e]), bf(ref[e]), TWIN_ATOL, TWIN_RTOL);
	}
	for (int i = 0; i < n && len < 120; i++)
		len += snprintf(what + len, sizeof(what) - len, "%s%d", i ? "," : "", n_kv[i]);
	report(ok, "fp8 decode, batched: %d views of %s keys, %d/%d heads x %d, each bit for bit "
	       "its lone call, in order and reversed", n, what, heads, H, D);
	rel = c.l2d > 0 ? sqrt(c.l2n / c.l2d) : (c.l2n > 0 ? INFINITY : 0.0);
	report(twin_ok && !c.bad && !c.unwritten && rel <= TWIN_RELL2,
	       "fp8 decode, batched: %d views against the twin: max|d|=%.3g relL2=%.3g bad=%zu "
	       "unwritten=%zu (atol 2^-4 + 4e-3, rtol 2^-6, relL2 <= 1e-2)%s", n, c.max_abs, rel, c.bad,
	       c.unwritten, twin_ok ? "" : "; the twin refused");
	free(alone), free(got), free(rev);
out:
	for (int i = 0; i < n; i++)
		flayer_free(&s[i].f);
	free(q), free(ref);
	kvmem_cuda_free(dq), kvmem_cuda_free(dpos), kvmem_cuda_free(dnkv);
	kvmem_cuda_free(dalone), kvmem_cuda_free(dgot), kvmem_cuda_free(drev);
}

/* fp8 and bf16 views in one call: -EINVAL, nothing launched. */
static void check_dec_batch_mixed(void)
{
	kvmem_cuda_att_seq a[2] = {
		{ .n_q = 1, .n_kv = 1, .kv_stride = 1, .k_scale = (const float *)16,
		  .v_scale = (const float *)16 },
		{ .q0 = 1, .n_q = 1, .n_kv = 1, .kv_stride = 1 },
	};
	const kvmem_cuda_att_seq *p[2] = { &a[0], &a[1] };
	const int rc = kvmem_cuda_att_dec_batch(g_c, NULL, NULL, p, 2, 32, 8, 128, 1.0f);

	report(rc == -EINVAL && strstr(kvmem_last_error(), "fp8 and bf16"),
	       "fp8 decode, batched: fp8 and bf16 views in one call refused (%d: %s)", rc,
	       kvmem_last_error());
}

/* ---- timings --------------------------------------------------------------- */
struct bench_b {
	const kvmem_cuda_att_seq *p[MAX_SEQS];
	void *q, *out, *pos, *nkv;
	int n, alone;
};

static int run_batch(void *arg)
{
	struct bench_b *b = arg;

	if (!b->alone)
		return kvmem_cuda_att_dec_batch(g_c, b->out, b->q, b->p, b->n, 32, 8, 128,
						1.0f / sqrtf(128.0f));
	for (int i = 0; i < b->n; i++) {
		const kvmem_cuda_att_seq *x = b->p[i];
		int rc = kvmem_cuda_attention_decode_fp8(
			g_c, (uint16_t *)b->out + (size_t)i * 32 * 128,
			(const uint16_t *)b->q + (size_t)i * 32 * 128, x->q_pos, 1,
			(const uint8_t *)x->k, (const uint8_t *)x->v, x->k_scale, x->v_scale,
			(const int32_t *)b->nkv + i, x->n_kv, x->kv_stride, 32, 8, 128,
			1.0f / sqrtf(128.0f));

		if (rc)
			return rc;
	}
	return 0;
}

/* 16 views of n_kv keys each: one random fp8 layer, copied to every view
 * (its own memory: nothing shared in the L2), and its bf16 dequantised. */
static void bench_one(int n_kv)
{
	const int n = MAX_SEQS, H = 8, D = 128;
	const size_t rows = (size_t)H * n_kv, qn = (size_t)n * 32 * D;
	struct flayer f;
	kvmem_cuda_att_seq a8[MAX_SEQS], a16[MAX_SEQS];
	void *k8[MAX_SEQS], *v8[MAX_SEQS], *ks[MAX_SEQS], *vs[MAX_SEQS], *k16[MAX_SEQS],
		*v16[MAX_SEQS];
	int32_t pos[MAX_SEQS], cnt[MAX_SEQS];
	uint16_t *q = rand_bf16(qn, -2, 2);
	struct bench_b b8 = { .n = n }, b16 = { .n = n }, solo = { .n = n, .alone = 1 };
	double t8, t16, tsolo;
	/* bytes a decode reads: K and V, fp8 + a scale a row, or bf16 */
	const double by8 = (double)n * rows * (2.0 * D + 8), by16 = (double)n * rows * 4.0 * D;

	flayer_make(&f, H, n_kv, D);
	for (int i = 0; i < n; i++) {
		pos[i] = n_kv - 1, cnt[i] = n_kv;
		k8[i] = dput(f.hk8, rows * D), v8[i] = dput(f.hv8, rows * D);
		ks[i] = dput(f.hks, 4 * rows), vs[i] = dput(f.hvs, 4 * rows);
		k16[i] = dpoison(2 * rows * D), v16[i] = dpoison(2 * rows * D);
		if (kvmem_cuda_fp8_view_bf16(g_c, k16[i], v16[i], n_kv, k8[i], v8[i], ks[i], vs[i], H,
					     n_kv, n_kv, D))
			die("fp8 view as bf16");
	}
	b8.q = b16.q = solo.q = dput(q, 2 * qn);
	b8.out = b16.out = solo.out = dpoison(2 * qn);
	b8.pos = dput(pos, sizeof(pos));
	solo.nkv = dput(cnt, sizeof(cnt));
	for (int i = 0; i < n; i++) {
		a8[i] = (kvmem_cuda_att_seq){ .q0 = i, .n_q = 1, .q_pos = (const int32_t *)b8.pos + i,
					      .k = k8[i], .v = v8[i], .n_kv = n_kv,
					      .kv_stride = n_kv, .k_scale = ks[i], .v_scale = vs[i] };
		a16[i] = a8[i];
		a16[i].k = k16[i], a16[i].v = v16[i], a16[i].k_scale = a16[i].v_scale = NULL;
		b8.p[i] = solo.p[i] = &a8[i];
		b16.p[i] = &a16[i];
	}
	t8 = time_ms(run_batch, &b8, 3, 20);
	t16 = time_ms(run_batch, &b16, 3, 20);
	tsolo = time_ms(run_batch, &solo, 3, 20);
	printf("decode attention, batched, 16 views x %d keys, one layer: fp8 %.4f ms (%.0f GB/s), "
	       "bf16 %.4f ms (%.0f GB/s): bf16 / fp8 %.2f; 16 lone fp8 calls %.4f ms: %.2fx the "
	       "batch\n", n_kv, t8, by8 / t8 / 1e6, t16, by16 / t16 / 1e6, t16 / t8, tsolo,
	       tsolo / t8);
	for (int i = 0; i < n; i++) {
		kvmem_cuda_free(k8[i]), kvmem_cuda_free(v8[i]), kvmem_cuda_free(ks[i]);
		kvmem_cuda_free(vs[i]), kvmem_cuda_free(k16[i]), kvmem_cuda_free(v16[i]);
	}
	kvmem_cuda_free(b8.q), kvmem_cuda_free(b8.out), kvmem_cuda_free(b8.pos);
	kvmem_cuda_free(solo.nkv);
	flayer_free(&f);
	free(q);
}

void check_fp8_batch(int bench)
{
	static const int mix[] = { 1, 33, 64, 700, 2000, 4097, 9000 };
	static const int same[] = { 4096, 4096, 4096, 4096 };
	static const int longv[] = { 32768, 5, 20000 };

	check_put_rows(1, 8, 128);
	check_put_rows(16, 8, 128);
	check_put_rows(9, 2, 64);
	check_dec_batch(mix, 7, 32, 8, 128);
	check_dec_batch(same, 4, 32, 8, 128);
	check_dec_batch(mix, 5, 16, 8, 64);
	check_dec_batch(mix + 2, 4, 16, 2, 128);
	if (!g_quick)
		check_dec_batch(longv, 3, 32, 8, 128);
	check_dec_batch_mixed();
	if (bench) {
		bench_one(4096);
		bench_one(32768);
	}
}

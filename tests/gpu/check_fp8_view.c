// SPDX-License-Identifier: MIT
/*
 * The cuda backend's fp8 views (kernels/cuda/fp8_view.cu, attention.cu's v5
 * over fp8) against their twins (kernels/cpu/fp8_view.c):
 *  - put: a forward pass's bf16 K/V rows into the view, bytes and scales bit
 *    for bit (the page bytes the host makes of the same rows, K rotated);
 *  - gather: fp8 pages in pinned host memory and in device memory into the
 *    view at shuffled slots, bit for bit;
 *  - a move (the sources copied aside, then gathered at new slots),
 *    overlapping runs: view and raw K bit for bit against the twin;
 *  - a layer as bf16: bit for bit against kvmem_fp8_dequant_rows_bf16;
 *  - decode (v5 reading e4m3): bit for bit the bf16 v5 over the layer
 *    dequantised, at 1 to 32768 keys (prefill chunks: check_fp8_prefill.c).
 * With --bench, at Qwen3-8B's geometry in the same run: decode attention of
 * one layer at 32K and 128K keys, v5 over fp8 against v5 over bf16; the
 * fp8 view's rematerialisation from pinned fp8 pages against the bf16
 * view's from bf16 pages (tokens/s).
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

#define THETA 1e6

void fview_make(struct fview *v, int L, int H, int D, int cap)
{
	*v = (struct fview){ .L = L, .H = H, .D = D, .cap = cap, .n = (size_t)L * H * cap };
	v->k8 = hmalloc(v->n * D), v->v8 = hmalloc(v->n * D), v->r8 = hmalloc(v->n * D);
	v->ks = hmalloc(4 * v->n), v->vs = hmalloc(4 * v->n), v->rs = hmalloc(4 * v->n);
	memset(v->k8, 0xff, v->n * D), memset(v->v8, 0xff, v->n * D), memset(v->r8, 0xff, v->n * D);
	memset(v->ks, 0xff, 4 * v->n), memset(v->vs, 0xff, 4 * v->n), memset(v->rs, 0xff, 4 * v->n);
	v->dk8 = dpoison(v->n * D), v->dv8 = dpoison(v->n * D), v->dr8 = dpoison(v->n * D);
	v->dks = dpoison(4 * v->n), v->dvs = dpoison(4 * v->n), v->drs = dpoison(4 * v->n);
}

/* (check_fp8.h) */
int fview_same(const struct fview *v)
{
	uint8_t *k = dget(v->dk8, v->n * v->D), *vv = dget(v->dv8, v->n * v->D);
	uint8_t *r = dget(v->dr8, v->n * v->D);
	float *ks = dget(v->dks, 4 * v->n), *vs = dget(v->dvs, 4 * v->n), *rs = dget(v->drs, 4 * v->n);
	int ok = !memcmp(k, v->k8, v->n * v->D) && !memcmp(vv, v->v8, v->n * v->D) &&
		 !memcmp(ks, v->ks, 4 * v->n) && !memcmp(vs, v->vs, 4 * v->n) &&
		 !memcmp(r, v->r8, v->n * v->D) && !memcmp(rs, v->rs, 4 * v->n);

	free(k), free(vv), free(ks), free(vs), free(r), free(rs);
	return ok;
}

void fview_free(struct fview *v)
{
	free(v->k8), free(v->v8), free(v->ks), free(v->vs), free(v->r8), free(v->rs);
	kvmem_cuda_free(v->dk8), kvmem_cuda_free(v->dv8), kvmem_cuda_free(v->dr8);
	kvmem_cuda_free(v->dks), kvmem_cuda_free(v->dvs), kvmem_cuda_free(v->drs);
}

/* (check_fp8.h) */
uint16_t *fwd_rows(int n, int H, int D, int ld)
{
	uint16_t *rows = hmalloc(2 * (size_t)n * ld);

	memset(rows, 0, 2 * (size_t)n * ld);
	for (int t = 0; t < n; t++)
		for (int h = 0; h < 3 * H; h++) {
			const double m = ldexp(1.0, rint_in(-20, 20));

			for (int i = 0; i < D; i++)
				rows[(size_t)t * ld + h * D + i] = kvmem_f32_to_bf16((float)(runi(-1, 1) * m));
		}
	return rows;
}

static void check_put(int n, int H, int D, int slot)
{
	const int L = 2, ld = 3 * H * D + 8, k0 = H * D, cap = slot + n + 5;
	struct fview v;
	uint16_t *rows = fwd_rows(n, H, D, ld);
	void *drows, *ditem;
	kvmem_scatter_item it = { .layer = 1, .slot = slot, .n = n, .tok_stride = ld,
				  .head_stride = D };
	int ok;

	fview_make(&v, L, H, D, cap);
	drows = dput(rows, 2 * (size_t)n * ld);
	ditem = dput(&it, sizeof(it));
	kvmem_fp8_view_put(v.k8, v.v8, v.ks, v.vs, v.r8, v.rs, rows + k0, rows + k0 + H * D, ld, &it, n, H, D,
			   cap, THETA);
	/* the untouched slots keep the poison on both sides */
	ok = kvmem_cuda_fp8_view_put(g_c, v.dk8, v.dv8, v.dks, v.dvs, v.dr8, v.drs,
				     (uint16_t *)drows + k0,
				     (uint16_t *)drows + k0 + H * D, ld, ditem, n, H, D, cap,
				     THETA) == 0 && kvmem_cuda_sync(g_c) == 0;
	report(ok && fview_same(&v), "fp8 view put: %d tokens x %d heads x %d at slot %d, K "
	       "(rotated) and V bytes and scales bit for bit", n, H, D, slot);
	fview_free(&v);
	free(rows);
	kvmem_cuda_free(drows);
	kvmem_cuda_free(ditem);
}

/* cvt: the gather's conversions by cvt (fp8_gather_cvt). Two NaN codes in
 * a page's raw K (0x7f at dim 3 of its first row, 0xff at dim 70 of its
 * sixth): the rotated pair's codes are NaN (0x7f) on both sides. run 1:
 * items layer by layer, a block each; run > 1: a block's layers one after
 * another (the session's order), run items a block, so a block computes
 * its angles once for items at the same slots (run 3 = L: a block's
 * layers; run 2 straddles them), and again for the one item (block 4,
 * layer 1) whose first token differs from its neighbours'. */
static void check_gather(int in_device, int cvt, int run)
{
	struct pages p;
	const int L = 3, H = 8, D = 128, B = 32, NB = 12, cap = NB * B + 16;
	kvmem_gather_item it[64], dit[64];
	struct fview v;
	char *dev = NULL;
	void *ditems;
	int n = 0, ok, was = kvmem_cuda_tune(g_c, "fp8_gather_cvt", cvt), u0_of[NB];

	if (pages_make(&p, L, H, D, B, NB, KVMEM_DTYPE_FP8)) {
		report(0, "fp8 view gather: no pinned memory");
		return;
	}
	/* block 1, layer 0: placed whole (u0 = 0, below) */
	((uint8_t *)p.host + (size_t)(1 * L + 0) * p.page)[3] = 0x7f;
	((uint8_t *)p.host + (size_t)(1 * L + 0) * p.page)[5 * D + 70] = 0xff;
	if (in_device && (kvmem_cuda_malloc((void **)&dev, p.page * L * NB) ||
			  kvmem_cuda_upload(g_c, dev, p.host, p.page * L * NB)))
		die("fp8 view gather: device pages");
	fview_make(&v, L, H, D, cap);
	for (int b = 0; b < NB; b++)
		u0_of[b] = b % 3 ? 0 : rint_in(0, B / 2);
	for (int o = 0; o < L * NB; o++) {
		const int l = run > 1 ? o % L : o / NB, b = run > 1 ? o / L : o % NB;
		int u0 = run > 1 ? u0_of[b] : b % 3 ? 0 : rint_in(0, B / 2), len;

		if (run > 1 && b == 4 && l == 1)
			u0 = 1;
		len = B - u0;
		it[n] = page_item(&p, p.host, l, b, u0, len, ((b * 5) % NB) * B + u0 + 7);
		dit[n] = in_device ? page_item(&p, dev, l, b, u0, len, it[n].slot) : it[n];
		n++;
	}
	kvmem_fp8_view_gather(v.k8, v.v8, v.ks, v.vs, v.r8, v.rs, it, n, L, H, D, cap, THETA);
	ditems = dput(dit, sizeof(dit[0]) * n);
	ok = kvmem_cuda_fp8_view_gather(g_c, v.dk8, v.dv8, v.dks, v.dvs, v.dr8, v.drs, ditems, n, run,
					L, H, D, cap, THETA) == 0 && kvmem_cuda_sync(g_c) == 0;
	report(ok && fview_same(&v), "fp8 view gather%s: %d items of pages %s (two NaN codes), "
	       "%d a block%s, K (rotated) and V bytes and scales bit for bit",
	       cvt ? " by cvt (fp8_gather_cvt)" : "", n,
	       in_device ? "in device memory" : "in pinned host memory", run,
	       run > 1 ? " (a block's layers in turn)" : "");
	kvmem_cuda_tune(g_c, "fp8_gather_cvt", was);
	fview_free(&v);
	kvmem_cuda_free(ditems);
	kvmem_cuda_free(dev);
	cudaFreeHost(p.host);
}

/* A move inside the view: each layer's runs copied aside (snap), then
 * gathered at their new slots from the copy (K re-rotated from the raw K
 * there, V and the raw K moved); twin: the same gather from a host copy. */
static void check_move(void)
{
	struct pages p;
	const int L = 2, H = 8, D = 128, B = 32, NB = 6, cap = NB * B + 40;
	kvmem_gather_item it[16], hit[16], dit[16];
	kvmem_fp8_snap sn[16];
	struct fview v;
	/* A run's copy: raw K and V bytes, then their fp32 scales, for the
	 * longest run (40 slots); shorter runs leave the rest unused. Sized
	 * by a page (32) the copies overlapped, and the device's two blocks
	 * of a layer wrote the overlap in either order: a race in the check,
	 * not in the move. */
	const int most = 40;
	const size_t ib = ((size_t)2 * H * most * D + (size_t)8 * H * most + 15) & ~(size_t)15;
	char *host = hmalloc(16 * ib), *st = dpoison(16 * ib);
	void *ditems, *dsnaps, *dit2;
	int n = 0, m = 0, ok;

	if (pages_make(&p, L, H, D, B, NB, KVMEM_DTYPE_FP8)) {
		report(0, "fp8 view move: no pinned memory");
		return;
	}
	fview_make(&v, L, H, D, cap);
	for (int l = 0; l < L; l++)
		for (int b = 0; b < NB; b++)
			it[n++] = page_item(&p, p.host, l, b, 0, B, b * B);
	kvmem_fp8_view_gather(v.k8, v.v8, v.ks, v.vs, v.r8, v.rs, it, n, L, H, D, cap, THETA);
	ditems = dput(it, sizeof(it[0]) * n);
	ok = kvmem_cuda_fp8_view_gather(g_c, v.dk8, v.dv8, v.dks, v.dvs, v.dr8, v.drs, ditems, n, 1,
					L, H, D, cap, THETA) == 0;
	/* Per layer: slots 10..49 to 30..69 (overlapping), 100..119 to 0..19. */
	for (int l = 0; l < L; l++)
		for (int k = 0; k < 2; k++) {
			const int from = k ? 100 : 10, to = k ? 0 : 30, cnt = k ? 20 : most;
			const size_t off = (size_t)m * ib;
			char *h = host + off, *d = st + off;

			sn[m] = (kvmem_fp8_snap){ .layer = l, .n = cnt, .from = from, .off = (int64_t)off };
			/* the host copy: raw K and V runs, then their scales */
			for (int hh = 0; hh < H; hh++) {
				const size_t r0 = ((size_t)l * H + hh) * cap + from;

				memcpy(h + (size_t)hh * cnt * D, v.r8 + r0 * D, (size_t)cnt * D);
				memcpy(h + ((size_t)H + hh) * cnt * D, v.v8 + r0 * D, (size_t)cnt * D);
				memcpy(h + (size_t)2 * H * cnt * D + (size_t)hh * cnt * 4, v.rs + r0,
				       (size_t)cnt * 4);
				memcpy(h + (size_t)2 * H * cnt * D + ((size_t)H + hh) * cnt * 4, v.vs + r0,
				       (size_t)cnt * 4);
			}
			for (int side = 0; side < 2; side++) {
				char *base = side ? d : h;

				(side ? dit : hit)[m] = (kvmem_gather_item){
					.k = base, .v = base + (size_t)H * cnt * D, .layer = l, .slot = to,
					.n = cnt, .head_stride = cnt * D, .dtype = KVMEM_DTYPE_FP8,
					.k_scale = (const float *)(base + (size_t)2 * H * cnt * D),
					.v_scale = (const float *)(base + (size_t)2 * H * cnt * D) + (size_t)H * cnt,
					.scale_stride = cnt,
				};
			}
			m++;
		}
	kvmem_fp8_view_gather(v.k8, v.v8, v.ks, v.vs, v.r8, v.rs, hit, m, L, H, D, cap, THETA);
	dsnaps = dput(sn, sizeof(sn[0]) * m);
	dit2 = dput(dit, sizeof(dit[0]) * m);
	for (int l = 0; l < L && ok; l++)	/* a layer at a time, as cuda_fp8_move */
		ok = kvmem_cuda_fp8_view_snap(g_c, st, (kvmem_fp8_snap *)dsnaps + 2 * l, 2, v.dr8,
					      v.dv8, v.drs, v.dvs, H, D, cap) == 0 &&
		     kvmem_cuda_fp8_view_gather(g_c, v.dk8, v.dv8, v.dks, v.dvs, v.dr8, v.drs,
						(kvmem_gather_item *)dit2 + 2 * l, 2, 1, L, H, D, cap,
						THETA) == 0;
	ok = ok && kvmem_cuda_sync(g_c) == 0;
	report(ok && fview_same(&v), "fp8 view move: %d runs over 2 layers (overlapping), K "
	       "re-rotated from the raw K, V and raw K moved, bit for bit", m);
	fview_free(&v);
	free(host);
	kvmem_cuda_free(st), kvmem_cuda_free(ditems), kvmem_cuda_free(dsnaps), kvmem_cuda_free(dit2);
	cudaFreeHost(p.host);
}

void flayer_make(struct flayer *f, int H, int cap, int D)
{
	const size_t rows = (size_t)H * cap;
	float x[1024];

	f->hk8 = hmalloc(rows * D), f->hv8 = hmalloc(rows * D);
	f->hks = hmalloc(4 * rows), f->hvs = hmalloc(4 * rows);
	for (size_t r = 0; r < rows; r++)
		for (int kv = 0; kv < 2; kv++) {
			const double m = ldexp(1.0, rint_in(-4, 4));

			for (int i = 0; i < D; i++)
				x[i] = (float)(runi(-1, 1) * m);
			kvmem_fp8_quant_row((kv ? f->hv8 : f->hk8) + r * D, (kv ? f->hvs : f->hks) + r,
					    x, D);
		}
	f->k8 = dput(f->hk8, rows * D), f->v8 = dput(f->hv8, rows * D);
	f->ks = dput(f->hks, 4 * rows), f->vs = dput(f->hvs, 4 * rows);
}

void flayer_free(struct flayer *f)
{
	free(f->hk8), free(f->hv8), free(f->hks), free(f->hvs);
	kvmem_cuda_free(f->k8), kvmem_cuda_free(f->v8);
	kvmem_cuda_free(f->ks), kvmem_cuda_free(f->vs);
}

static void check_layer_bf16(int H, int cap, int len, int D)
{
	struct flayer f;
	const int stride = len + 3;
	uint16_t *ref = hmalloc(2 * (size_t)H * stride * D), *gk, *gv, *rk = hmalloc(2 * (size_t)H * stride * D);
	void *ok16 = dpoison(2 * (size_t)H * stride * D), *ov16 = dpoison(2 * (size_t)H * stride * D);
	int ok = 1;

	flayer_make(&f, H, cap, D);
	ok = kvmem_cuda_fp8_view_bf16(g_c, ok16, ov16, stride, f.k8, f.v8, f.ks, f.vs, H, len, cap,
				      D) == 0 && kvmem_cuda_sync(g_c) == 0;
	gk = dget(ok16, 2 * (size_t)H * stride * D);
	gv = dget(ov16, 2 * (size_t)H * stride * D);
	for (int h = 0; h < H && ok; h++) {
		kvmem_fp8_dequant_rows_bf16(rk, f.hk8 + (size_t)h * cap * D, f.hks + (size_t)h * cap,
					    len, D);
		kvmem_fp8_dequant_rows_bf16(ref, f.hv8 + (size_t)h * cap * D, f.hvs + (size_t)h * cap,
					    len, D);
		ok = !memcmp(gk + (size_t)h * stride * D, rk, 2 * (size_t)len * D) &&
		     !memcmp(gv + (size_t)h * stride * D, ref, 2 * (size_t)len * D);
	}
	report(ok, "fp8 view layer as bf16: %d of %d slots x %d heads x %d, bit for bit", len, cap,
	       H, D);
	free(ref), free(rk), free(gk), free(gv);
	kvmem_cuda_free(ok16), kvmem_cuda_free(ov16);
	flayer_free(&f);
}

/* v5 over fp8 = v5 over the same rows dequantised, bit for bit. */
struct dec8 {
	struct flayer f;
	void *q, *out, *k16, *v16, *nkv, *qp;
	int n_kv, cap, heads, H, D;
};

/* odd_q: one Q value (of the first KV head's group) is (1 + 2^-7) 2^-20,
 * which f16 cannot hold exactly (its step there is 2^-24): the f16-K form
 * (fp8_f16k) falls back in that KV head's blocks. */
static void dec8_make_q(struct dec8 *d, int n_kv, int heads, int H, int D, int odd_q)
{
	uint16_t *q = rand_bf16((size_t)heads * D, -2, 2);
	int32_t pos = n_kv - 1;

	if (odd_q)
		q[D / 2 + 3] = 0x3581;	/* (1 + 2^-7) 2^-20 as bf16 */

	d->n_kv = n_kv, d->cap = n_kv + 9, d->heads = heads, d->H = H, d->D = D;
	flayer_make(&d->f, H, d->cap, D);
	d->q = dput(q, 2 * (size_t)heads * D);
	d->out = dpoison(2 * (size_t)heads * D);
	d->k16 = dpoison(2 * (size_t)H * d->cap * D), d->v16 = dpoison(2 * (size_t)H * d->cap * D);
	d->nkv = dput(&n_kv, sizeof(n_kv));
	d->qp = dput(&pos, sizeof(pos));
	free(q);
	if (kvmem_cuda_fp8_view_bf16(g_c, d->k16, d->v16, d->cap, d->f.k8, d->f.v8, d->f.ks,
				     d->f.vs, H, n_kv, d->cap, D))
		die("fp8 view as bf16");
}

static void dec8_make(struct dec8 *d, int n_kv, int heads, int H, int D)
{
	dec8_make_q(d, n_kv, heads, H, D, 0);
}

static void dec8_free(struct dec8 *d)
{
	flayer_free(&d->f);
	kvmem_cuda_free(d->q), kvmem_cuda_free(d->out), kvmem_cuda_free(d->k16);
	kvmem_cuda_free(d->v16), kvmem_cuda_free(d->nkv), kvmem_cuda_free(d->qp);
}

static int run_dec8(void *a)
{
	struct dec8 *d = a;

	return kvmem_cuda_attention_decode_fp8(g_c, d->out, d->q, d->qp, 1, d->f.k8, d->f.v8,
					       d->f.ks, d->f.vs, d->nkv, d->n_kv, d->cap, d->heads,
					       d->H, d->D, 1.0f / sqrtf((float)d->D));
}

static int run_dec16(void *a)
{
	struct dec8 *d = a;

	return kvmem_cuda_attention_decode_bf16(g_c, 0, d->out, d->q, d->qp, 1, d->k16, d->v16,
						d->nkv, d->n_kv, d->cap, d->heads, d->H, d->D,
						1.0f / sqrtf((float)d->D));
}

/* The forms of decode over fp8 (kvmem_cuda_tune): mode bit 0 Q K^T on the
 * f16 MMA (fp8_f16k), bit 1 e4m3 -> bf16 by integer ops (fp8_int), both
 * of the tile form; bit 2 the register form (fp8_reg, attention_fp8.cu,
 * which the other bits leave alone). */
static const char *const dec8_mode_name[5] = { "", ", Q K^T on the f16 MMA (fp8_f16k)",
					       ", e4m3 by integer ops (fp8_int)",
					       ", fp8_f16k and fp8_int",
					       ", in registers (fp8_reg)" };
#define DEC8_REG 4	/* mode bit 2: the register form (dec8r_kernel), not v5's bits */

static int dec8_mode(int mode)
{
	int was = kvmem_cuda_tune(g_c, "fp8_f16k", mode & 1);

	was |= kvmem_cuda_tune(g_c, "fp8_int", (mode >> 1) & 1) << 1;
	return was | kvmem_cuda_tune(g_c, "fp8_reg", (mode >> 2) & 1) << 2;
}

/* Bit for bit v5 over the rows dequantised, in each mode: an experiment
 * that changes a bit is not kept. odd_q: a Q value f16 cannot hold (the
 * f16-K form falls back in that KV head's blocks). */
static void check_dec8_q(int n_kv, int heads, int H, int D, int odd_q)
{
	struct dec8 d;
	uint16_t *a;
	int rc, was = dec8_mode(0);

	dec8_make_q(&d, n_kv, heads, H, D, odd_q);
	rc = run_dec16(&d);
	a = dget(d.out, 2 * (size_t)heads * D);
	for (int mode = 0; mode < 4 && !rc; mode++) {
		uint16_t *b;

		if (odd_q && !(mode & 1))
			continue;	/* the odd Q matters to the f16 form only */
		dec8_mode(mode);
		rc = run_dec8(&d);
		b = dget(d.out, 2 * (size_t)heads * D);
		if (!rc)
			report(!memcmp(a, b, 2 * (size_t)heads * D), "decode v5 over fp8 K/V%s%s: "
			       "%d keys, %d/%d heads x %d, bit for bit v5 over the rows dequantised",
			       dec8_mode_name[mode], odd_q ? " (a Q value f16 cannot hold)" : "",
			       n_kv, heads, H, D);
		free(b);
	}
	if (!rc && !odd_q) {
		/* The register form sums in another order: within a bf16 ulp
		 * or two of v5 over the rows dequantised. */
		char what[96];
		uint16_t *b;

		dec8_mode(DEC8_REG);
		rc = run_dec8(&d);
		b = dget(d.out, 2 * (size_t)heads * D);
		snprintf(what, sizeof(what), "dec fp8_reg %d keys %d/%dx%d", n_kv, heads, H, D);
		if (!rc)
			cmp_bf16(what, b, a, (size_t)heads * D, 1e-3, 1e-2);
		free(b);
	}
	dec8_mode(was);
	if (rc)
		report(0, "decode v5 over fp8: %s", kvmem_last_error());
	free(a);
	dec8_free(&d);
}

static void check_dec8(int n_kv, int heads, int H, int D)
{
	check_dec8_q(n_kv, heads, H, D, 0);
}

/* The register form and a NaN code (what an fp8 row of a NaN holds): a
 * code in K of KV head 1, then in V of KV head 2, makes that head's
 * group NaN and leaves the other groups' numbers. */
static void check_dec8r_nan(int n_kv, int heads, int H, int D)
{
	const int G = heads / H;
	const uint8_t nan_code[2] = { 0x7f, 0xff };
	int was = dec8_mode(DEC8_REG), ok = 1, rc = 0;
	struct dec8 d;

	dec8_make(&d, n_kv, heads, H, D);
	for (int kv = 0; kv < 2 && !rc; kv++) {
		const int h = 1 + kv, key = kv ? 3 : n_kv / 2;
		uint8_t *dev = (uint8_t *)(kv ? d.f.v8 : d.f.k8) + ((size_t)h * d.cap + key) * D + 7;
		uint8_t was_b;
		uint16_t *out;

		was_b = dpoke(dev, nan_code[kv]);
		rc = run_dec8(&d);
		out = dget(d.out, 2 * (size_t)heads * D);
		for (int q = 0; q < heads && !rc; q++)
			for (int i = 0; i < D; i++) {
				const uint16_t x = out[(size_t)q * D + i];
				const int is_nan = (x & 0x7f80) == 0x7f80 && (x & 0x7f);

				ok &= is_nan == (q / G == h);
			}
		free(out);
		dpoke(dev, was_b);
	}
	if (rc)
		report(0, "decode v5 over fp8 in registers, a NaN code: %s", kvmem_last_error());
	else
		report(ok, "decode v5 over fp8 in registers: a NaN code in K (head 1), then in V "
		       "(head 2): that group's rows NaN, the others numbers (%d keys)", n_kv);
	dec8_mode(was);
	dec8_free(&d);
}

/* ---- timings ---------------------------------------------------------------- */
struct vg_arg {
	struct fview *v;
	void *items;
	int n, run;
};

static int run_view_gather(void *a)
{
	struct vg_arg *g = a;

	return kvmem_cuda_fp8_view_gather(g_c, g->v->dk8, g->v->dv8, g->v->dks, g->v->dvs, NULL, NULL,
					  g->items, g->n, g->run, g->v->L, g->v->H, g->v->D,
					  g->v->cap, THETA);
}

struct bg_arg {
	void *vk, *vv, *items;
	int n, run, L, H, D, cap;
};

static int run_bf16_gather(void *a)
{
	struct bg_arg *g = a;

	return kvmem_cuda_view_gather_bf16(g_c, g->vk, g->vv, g->items, g->n, g->run, g->L, g->H,
					   g->D, g->cap, THETA);
}

/* Both dtypes' items for NB blocks x L layers of pages at d8 / d16 into
 * g8 / g16 (i8, i16: host room): layer by layer, a block an item (run 1),
 * or a block's layers in turn, L items a block (the session's order). */
static void bench_order(struct vg_arg *g8, struct bg_arg *g16, kvmem_gather_item *i8,
			kvmem_gather_item *i16, const struct pages *p8, const struct pages *p16,
			const char *d8, const char *d16, int L, int NB, int B, int by_block)
{
	for (int l = 0; l < L; l++)
		for (int b = 0; b < NB; b++) {
			const int at = by_block ? b * L + l : l * NB + b;

			i8[at] = page_item(p8, d8, l, b, 0, B, b * B);
			i16[at] = page_item(p16, d16, l, b, 0, B, b * B);
		}
	if (kvmem_cuda_upload(g_c, g8->items, i8, sizeof(*i8) * L * NB) ||
	    kvmem_cuda_upload(g_c, g16->items, i16, sizeof(*i16) * L * NB))
		die("device items");
	g8->run = g16->run = by_block ? L : 1;
}

static void bench_view(void)
{
	const int L = 36, H = 8, D = 128, B = 32, NB = 256, heads = 32;
	double t8, t16;

	printf("\n== fp8 views / bf16 views at Qwen3-8B's geometry\n");
	for (int k = 0; k < 2; k++) {
		struct dec8 d;

		dec8_make(&d, k ? 131072 : 32768, heads, H, D);
		int was = dec8_mode(0);

		if (!k)
			prof_once(run_dec16, &d);	/* ncu: tests/gpu/prof27.sh */
		t16 = time_ms(run_dec16, &d, 3, 21);
		t8 = time_ms(run_dec8, &d, 3, 21);
		printf("decode attention v5, %dK keys, one layer: bf16 view %.1f us, "
		       "fp8 view (cvt) %.1f us; fp8 / bf16 speed %.2f\n", d.n_kv / 1024, t16 * 1e3,
		       t8 * 1e3, t16 / t8);
		for (int mode = 1; mode <= DEC8_REG; mode++) {
			double tm;

			dec8_mode(mode);
			if (!k && mode >= 3)
				prof_once(run_dec8, &d);
			tm = time_ms(run_dec8, &d, 3, 21);
			printf("  fp8 view%s: %.1f us, fp8 / bf16 speed %.2f\n", dec8_mode_name[mode],
			       tm * 1e3, t16 / tm);
		}
		{	/* the register form at 3 blocks a multiprocessor */
			int wb = kvmem_cuda_tune(g_c, "fp8_reg_blocks", 3);
			double tm;

			dec8_mode(DEC8_REG);
			tm = time_ms(run_dec8, &d, 3, 21);
			printf("  fp8 view, in registers, 3 blocks an SM: %.1f us, fp8 / bf16 speed %.2f\n",
			       tm * 1e3, t16 / tm);
			kvmem_cuda_tune(g_c, "fp8_reg_blocks", wb);
		}
		dec8_mode(was);
		dec8_free(&d);
	}
	/* Rematerialisation of NB blocks x L layers from pinned host pages. */
	{
		struct pages p8, p16;
		kvmem_gather_item *i8 = hmalloc(sizeof(*i8) * L * NB), *i16 = hmalloc(sizeof(*i16) * L * NB);
		struct fview v;
		struct vg_arg g8;
		struct bg_arg g16 = { .n = L * NB, .run = L, .L = L, .H = H, .D = D, .cap = NB * B };

		if (pages_make(&p8, L, H, D, B, NB, KVMEM_DTYPE_FP8) ||
		    pages_make(&p16, L, H, D, B, NB, KVMEM_DTYPE_BF16))
			die("pinned pages");
		for (int l = 0; l < L; l++)	/* in the session's order (below) */
			for (int b = 0; b < NB; b++) {
				i8[b * L + l] = page_item(&p8, p8.host, l, b, 0, B, b * B);
				i16[b * L + l] = page_item(&p16, p16.host, l, b, 0, B, b * B);
			}
		fview_make(&v, L, H, D, NB * B);
		g8 = (struct vg_arg){ .v = &v, .items = dput(i8, sizeof(*i8) * L * NB), .n = L * NB,
				      .run = L };
		g16.items = dput(i16, sizeof(*i16) * L * NB);
		g16.vk = dpoison((size_t)L * H * NB * B * D * 2);
		g16.vv = dpoison((size_t)L * H * NB * B * D * 2);
		t16 = time_ms(run_bf16_gather, &g16, 2, 9);
		t8 = time_ms(run_view_gather, &g8, 2, 9);
		printf("rematerialise %d blocks x %d layers from pinned pages: bf16 pages into a bf16 "
		       "view %.3f ms (%.0f tokens/s, %.1f GB/s), fp8 pages into an fp8 view %.3f ms "
		       "(%.0f tokens/s, %.1f GB/s); fp8 / bf16 tokens/s %.2f (target >= 1.9)\n", NB, L,
		       t16, NB * B / (t16 / 1e3), p16.page * L * NB / (t16 / 1e3) / 1e9, t8,
		       NB * B / (t8 / 1e3), p8.page * L * NB / (t8 / 1e3) / 1e9, t16 / t8);
		{	/* the same pages in device memory: a warm step's place()
			 * from the device page pool, against the device copy rate */
			const double copy = kvmem_cuda_copy_gbps(g_c, 1ull << 30);
			void *d8 = dput(p8.host, p8.page * L * NB), *d16 = dput(p16.host, p16.page * L * NB);

			bench_order(&g8, &g16, i8, i16, &p8, &p16, d8, d16, L, NB, B, 0);
			double tc, tr, to, t16o;
			int was;

			prof_once(run_bf16_gather, &g16);	/* ncu: tests/gpu/prof27.sh */
			prof_once(run_view_gather, &g8);
			t16o = time_ms(run_bf16_gather, &g16, 2, 9);
			was = kvmem_cuda_tune(g_c, "fp8_gather_cvt", 0);
			to = time_ms(run_view_gather, &g8, 2, 9);
			kvmem_cuda_tune(g_c, "fp8_gather_cvt", 1);
			tc = time_ms(run_view_gather, &g8, 2, 9);
			bench_order(&g8, &g16, i8, i16, &p8, &p16, d8, d16, L, NB, B, 1);
			prof_once(run_view_gather, &g8);
			tr = time_ms(run_view_gather, &g8, 2, 9);
			t16 = time_ms(run_bf16_gather, &g16, 2, 9);
			t8 = was ? tr : to;
			kvmem_cuda_tune(g_c, "fp8_gather_cvt", was);
			/* pages read, view rows written (K, V; fp8 with scales) */
			printf("rematerialise the same from device memory (the page pool's way, a "
			       "block's %d layers in turn): bf16 %.3f ms (%.0f GB/s read + written), fp8 "
			       "%.3f ms (%.0f GB/s); fp8 / bf16 tokens/s %.2f (target >= 1.9); the device "
			       "copy rate %.0f GB/s\n", L, t16, 2 * p16.page * L * NB / (t16 / 1e3) / 1e9,
			       t8, 2 * p8.page * L * NB / (t8 / 1e3) / 1e9, t16 / t8, copy);
			printf("  bf16, layer by layer, a block an item (before 2026-12-04): %.3f ms "
			       "(%.0f GB/s)\n", t16o, 2 * p16.page * L * NB / (t16o / 1e3) / 1e9);
			printf("  fp8 by field decode, layer by layer (before 2026-12-04): %.3f ms "
			       "(%.0f GB/s); against bf16 then %.2f\n", to,
			       2 * p8.page * L * NB / (to / 1e3) / 1e9, t16o / to);
			printf("  fp8 by cvt, layer by layer: %.3f ms (%.0f GB/s)\n", tc,
			       2 * p8.page * L * NB / (tc / 1e3) / 1e9);
			kvmem_cuda_free(d8), kvmem_cuda_free(d16);
		}
		fview_free(&v);
		kvmem_cuda_free(g8.items), kvmem_cuda_free(g16.items);
		kvmem_cuda_free(g16.vk), kvmem_cuda_free(g16.vv);
		cudaFreeHost(p8.host), cudaFreeHost(p16.host);
		free(i8), free(i16);
	}
}

void check_fp8_view(int bench)
{
	check_put(1, 8, 128, 0);
	check_put(37, 8, 128, 100);
	check_put(20, 2, 64, 3);
	check_gather(0, 0, 1);
	check_gather(1, 0, 1);
	check_gather(0, 1, 1);
	check_gather(1, 1, 1);
	check_gather(1, 1, 3);
	check_gather(0, 1, 2);
	check_gather(1, 0, 3);
	check_move();
	check_layer_bf16(8, 300, 257, 128);
	check_layer_bf16(3, 70, 70, 64);
	check_dec8(1, 32, 8, 128);
	check_dec8(33, 32, 8, 128);
	check_dec8(700, 8, 8, 128);
	check_dec8(4097, 16, 8, 64);
	check_dec8(2000, 16, 2, 128);
	check_dec8_q(700, 8, 8, 128, 1);
	check_dec8r_nan(700, 32, 8, 128);
	if (!g_quick)
		check_dec8(32768, 32, 8, 128);
	check_fp8_prefill(bench);	/* check_fp8_prefill.c */
	check_fp8_batch(bench);		/* check_fp8_batch.c */
	if (bench)
		bench_view();
}

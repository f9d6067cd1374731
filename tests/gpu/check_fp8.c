// SPDX-License-Identifier: MIT
/*
 * fp8 KV on the GPU (kernels/cuda/fp8.cu, the fp8 pages of gather.cu)
 * against the CPU twins (kernels/cpu/fp8.c, fp8_attn.c, gather.c):
 *  - quantising rows of f32 and of bf16, bit for bit (bytes and scales),
 *    rows of every magnitude with NaN, infinities, zeros, values in the
 *    subnormal range and beyond 448 x scale;
 *  - dequantising to bf16, bit for bit;
 *  - rematerialising from fp8 pages in pinned host memory and in device
 *    memory (the gather): the view's K and V bit for bit;
 *  - decode attention over bf16 and over fp8 K/V against its twin, within
 *    2e-3 + 2^-6 |ref| (bf16 outputs, fp32 softmax), at 1 to 32768 keys.
 * With --bench, in the same run and at Qwen3-8B's geometry (36 layers, 8
 * KV heads, 32 query heads, head_dim 128, blocks of 32): rematerialisation
 * from pinned host pages, tokens/s, fp8 against bf16; decode attention per
 * layer at 32K and 128K keys, fp8 against bf16 (the same kernel) and the
 * main path's bf16 kernel; each beside its byte floor at the copy rate.
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

/* Rows of every kind: magnitudes 2^-140..2^120, specials sprinkled in. */
static float *special_rows(size_t rows, int n)
{
	float *x = hmalloc(sizeof(float) * rows * n);

	for (size_t r = 0; r < rows; r++) {
		int e = rint_in(-140, 120), kind = rint_in(0, 15);

		for (int i = 0; i < n; i++)
			x[r * n + i] = (float)ldexp(runi(-1, 1), e);
		if (kind == 0)
			x[r * n + rint_in(0, n - 1)] = NAN;
		else if (kind == 1)
			x[r * n + rint_in(0, n - 1)] = -INFINITY;
		else if (kind == 2)
			memset(x + r * n, 0, sizeof(float) * n);
		else if (kind == 3)	/* one outlier: the rest falls to subnormals */
			x[r * n + rint_in(0, n - 1)] = (float)ldexp(1.0, e + 12);
	}
	return x;
}

static void check_quant(int n, int x_dtype)
{
	const size_t rows = g_quick ? 300 : 5000;
	float *x = special_rows(rows, n);
	uint16_t *xb = hmalloc(2 * rows * n);
	const void *hx = x;
	uint8_t *q = hmalloc(rows * n), *got;
	float *sc = hmalloc(4 * rows), *gsc;
	void *dx, *dq = dpoison(rows * n), *ds = dpoison(4 * rows);
	int ok;

	if (x_dtype == KVMEM_DTYPE_BF16) {
		kvmem_f32_to_bf16_n(xb, x, rows * n);
		hx = xb;
	}
	dx = dput(hx, rows * n * (x_dtype == KVMEM_DTYPE_BF16 ? 2 : 4));
	ok = kvmem_fp8_quant_rows(q, sc, hx, x_dtype, rows, n) == 0 &&
	     kvmem_cuda_fp8_quant_rows(g_c, dq, ds, dx, x_dtype, rows, n) == 0;
	got = dget(dq, rows * n);
	gsc = dget(ds, 4 * rows);
	ok = ok && !memcmp(got, q, rows * n) && !memcmp(gsc, sc, 4 * rows);
	if (!ok)
		for (size_t i = 0; i < rows * n; i++)
			if (got[i] != q[i]) {
				printf("     row %zu value %zu: %a -> gpu 0x%02x, cpu 0x%02x\n", i / n,
				       i % n, (double)((float *)x)[i], got[i], q[i]);
				break;
			}
	report(ok, "fp8 quantise: %zu rows of %d %s, bytes and scales bit for bit", rows, n,
	       x_dtype == KVMEM_DTYPE_BF16 ? "bf16" : "f32");
	/* and back */
	{
		uint16_t *ref = hmalloc(2 * rows * n), *g;
		void *dout = dpoison(2 * rows * n);

		kvmem_fp8_dequant_rows_bf16(ref, q, sc, rows, n);
		ok = kvmem_cuda_fp8_dequant_rows_bf16(g_c, dout, dq, ds, rows, n) == 0;
		g = dget(dout, 2 * rows * n);
		report(ok && !memcmp(g, ref, 2 * rows * n),
		       "fp8 dequantise to bf16: %zu rows of %d, bit for bit", rows, n);
		free(ref);
		free(g);
		kvmem_cuda_free(dout);
	}
	free(x);
	free(xb);
	free(q);
	free(sc);
	free(got);
	free(gsc);
	kvmem_cuda_free(dx);
	kvmem_cuda_free(dq);
	kvmem_cuda_free(ds);
}

int pages_make(struct pages *p, int L, int H, int D, int B, int NB, int dtype)
{
	const size_t rows = (size_t)H * B;

	*p = (struct pages){ .L = L, .H = H, .D = D, .B = B, .NB = NB, .dtype = dtype };
	p->page = dtype == KVMEM_DTYPE_FP8 ? 2 * rows * D + 8 * rows : 4 * rows * D;
	if (cudaMallocHost((void **)&p->host, p->page * L * NB) != cudaSuccess) {
		p->host = NULL;
		return -1;
	}
	/* 64 random pages, repeated: the values do not change the timing. */
	for (size_t pg = 0; pg < (size_t)L * NB; pg++) {
		char *b = p->host + pg * p->page;

		if (pg >= 64) {
			memcpy(b, p->host + (pg % 64) * p->page, p->page);
			continue;
		}

		for (size_t r = 0; r < 2 * rows; r++) {	/* K rows, then V rows */
			float x[1024];

			for (int i = 0; i < D; i++)
				x[i] = (float)runi(-3, 3);
			if (dtype == KVMEM_DTYPE_FP8)
				kvmem_fp8_quant_row((uint8_t *)b + r * D, (float *)(b + 2 * rows * D) + r,
						    x, D);
			else
				kvmem_f32_to_bf16_n((uint16_t *)b + r * D, x, D);
		}
	}
	return 0;
}

kvmem_gather_item page_item(const struct pages *p, const char *base, int l, int b, int u0,
				   int n, int slot)
{
	const char *pg = base + ((size_t)b * p->L + l) * p->page;
	const size_t rows = (size_t)p->H * p->B;
	kvmem_gather_item it = { .layer = l, .slot = slot, .n = n, .head_stride = p->B * p->D,
				 .dtype = p->dtype };

	if (p->dtype == KVMEM_DTYPE_FP8) {
		it.k = pg + (size_t)u0 * p->D;
		it.v = pg + rows * p->D + (size_t)u0 * p->D;
		it.k_scale = (const float *)(pg + 2 * rows * p->D) + u0;
		it.v_scale = (const float *)(pg + 2 * rows * p->D) + rows + u0;
		it.scale_stride = p->B;
	} else {
		it.k = pg + (size_t)u0 * p->D * 2;
		it.v = pg + (rows * p->D + (size_t)u0 * p->D) * 2;
	}
	return it;
}

/* Device addresses of pinned host memory are its host addresses (UVA);
 * with in_device the pages are copied to device memory first. */
static void check_gather_fp8(int in_device)
{
	struct pages p;
	const int L = 3, H = 8, D = 128, B = 32, NB = 12, cap = NB * B;
	const size_t vsz = (size_t)L * H * cap * D;
	kvmem_gather_item it[64], dit[64];
	uint16_t *rk = hmalloc(2 * vsz), *rv = hmalloc(2 * vsz), *gk, *gv;
	void *vk = dpoison(2 * vsz), *vv = dpoison(2 * vsz), *ditems = NULL;
	char *dev = NULL;
	int n = 0, ok;

	if (pages_make(&p, L, H, D, B, NB, KVMEM_DTYPE_FP8)) {
		report(0, "fp8 gather: no pinned memory");
		return;
	}
	if (in_device && (kvmem_cuda_malloc((void **)&dev, p.page * L * NB) ||
			  kvmem_cuda_upload(g_c, dev, p.host, p.page * L * NB)))
		die("fp8 gather: device pages");
	memset(rk, 0xff, 2 * vsz);
	memset(rv, 0xff, 2 * vsz);
	/* Every block of every layer once, in pieces, at shuffled slots: block
	 * b goes to block slot (b * 5) % NB. */
	for (int l = 0; l < L; l++)
		for (int b = 0; b < NB; b++) {
			int u0 = b % 3 ? 0 : rint_in(0, B / 2), len = B - u0;

			it[n] = page_item(&p, p.host, l, b, u0, len, ((b * 5) % NB) * B + u0);
			dit[n] = in_device ? page_item(&p, dev, l, b, u0, len, it[n].slot) : it[n];
			n++;
		}
	ok = kvmem_view_gather_bf16(rk, rv, it, n, L, H, D, cap, 1e6) == 0;
	if (kvmem_cuda_malloc(&ditems, sizeof(dit)) || kvmem_cuda_upload(g_c, ditems, dit, sizeof(dit)))
		die("fp8 gather: items");
	ok = ok && kvmem_cuda_view_gather_bf16(g_c, vk, vv, ditems, n, 1, L, H, D, cap, 1e6) == 0;
	gk = dget(vk, 2 * vsz);
	gv = dget(vv, 2 * vsz);
	report(ok && !memcmp(gk, rk, 2 * vsz) && !memcmp(gv, rv, 2 * vsz),
	       "fp8 gather: %d items of pages %s into a view, K and V bit for bit", n,
	       in_device ? "in device memory" : "in pinned host memory");
	free(rk);
	free(rv);
	free(gk);
	free(gv);
	kvmem_cuda_free(vk);
	kvmem_cuda_free(vv);
	kvmem_cuda_free(ditems);
	kvmem_cuda_free(dev);
	cudaFreeHost(p.host);
}

/* K and V of one layer, [kvh][stride][hd], as bf16 and as fp8 + scales
 * (from the same random values). */
struct kv {
	size_t stride;
	int kvh, hd;
	uint16_t *k16, *v16;	/* host */
	uint8_t *k8, *v8;
	float *ks, *vs;
	void *dk16, *dv16, *dk8, *dv8, *dks, *dvs;	/* device */
};

static void kv_make(struct kv *x, int kvh, size_t stride, int hd, int host_copy)
{
	const size_t rows = (size_t)kvh * stride, n = rows * hd;
	float *f = hmalloc(sizeof(float) * n);

	x->stride = stride, x->kvh = kvh, x->hd = hd;
	x->k16 = hmalloc(2 * n), x->v16 = hmalloc(2 * n);
	x->k8 = hmalloc(n), x->v8 = hmalloc(n);
	x->ks = hmalloc(4 * rows), x->vs = hmalloc(4 * rows);
	for (int kv = 0; kv < 2; kv++) {
		for (size_t i = 0; i < n; i++)
			f[i] = (float)runi(-1, 1) * (kv ? 1.0f : 2.0f);
		kvmem_f32_to_bf16_n(kv ? x->v16 : x->k16, f, n);
		kvmem_fp8_quant_rows(kv ? x->v8 : x->k8, kv ? x->vs : x->ks, f, KVMEM_DTYPE_F32, rows,
				     hd);
	}
	free(f);
	x->dk16 = dput(x->k16, 2 * n), x->dv16 = dput(x->v16, 2 * n);
	x->dk8 = dput(x->k8, n), x->dv8 = dput(x->v8, n);
	x->dks = dput(x->ks, 4 * rows), x->dvs = dput(x->vs, 4 * rows);
	if (!host_copy) {
		free(x->k16), free(x->v16), free(x->k8), free(x->v8), free(x->ks), free(x->vs);
		x->k16 = x->v16 = NULL, x->k8 = x->v8 = NULL, x->ks = x->vs = NULL;
	}
}

static void kv_free(struct kv *x)
{
	free(x->k16), free(x->v16), free(x->k8), free(x->v8), free(x->ks), free(x->vs);
	kvmem_cuda_free(x->dk16), kvmem_cuda_free(x->dv16), kvmem_cuda_free(x->dk8);
	kvmem_cuda_free(x->dv8), kvmem_cuda_free(x->dks), kvmem_cuda_free(x->dvs);
}

static void check_decode(int n_kv, int heads, int kvh, int hd)
{
	struct kv x;
	uint16_t *q = rand_bf16((size_t)heads * hd, -2, 2), *ref = hmalloc(2 * heads * hd), *got;
	void *dq = dput(q, 2 * heads * hd), *dout = dpoison(2 * heads * hd);
	const float sc = 1.0f / sqrtf((float)hd);

	kv_make(&x, kvh, (size_t)n_kv + 7, hd, 1);
	for (int f8 = 0; f8 < 2; f8++) {
		char what[160];
		int rc = kvmem_decode_kv_bf16(ref, q, f8 ? (void *)x.k8 : x.k16, f8 ? (void *)x.v8 : x.v16,
					      x.ks, x.vs, f8 ? KVMEM_DTYPE_FP8 : KVMEM_DTYPE_BF16, n_kv,
					      x.stride, heads, kvh, hd, sc);

		rc = rc || kvmem_cuda_decode_kv_bf16(g_c, dout, dq, f8 ? x.dk8 : x.dk16,
						     f8 ? x.dv8 : x.dv16, x.dks, x.dvs,
						     f8 ? KVMEM_DTYPE_FP8 : KVMEM_DTYPE_BF16, n_kv,
						     x.stride, heads, kvh, hd, sc);
		if (rc) {
			report(0, "decode attention %s: %s", f8 ? "fp8" : "bf16", kvmem_last_error());
			continue;
		}
		got = dget(dout, 2 * heads * hd);
		snprintf(what, sizeof(what), "decode attention over %s K/V: %d keys, %d/%d heads x %d",
			 f8 ? "fp8" : "bf16", n_kv, heads, kvh, hd);
		cmp_bf16(what, got, ref, (size_t)heads * hd, 2e-3, 0x1p-6);
		free(got);
	}
	kv_free(&x);
	free(q);
	free(ref);
	kvmem_cuda_free(dq);
	kvmem_cuda_free(dout);
}

/* ---- timings ---------------------------------------------------------------- */
struct gather_arg {
	void *vk, *vv, *items;
	int n, L, H, D, cap;
};

static int run_gather(void *a)
{
	struct gather_arg *g = a;

	return kvmem_cuda_view_gather_bf16(g_c, g->vk, g->vv, g->items, g->n, 1, g->L, g->H, g->D,
					   g->cap, 1e6);
}

struct dec_arg {
	struct kv *x;
	void *q, *out;
	int n_kv, heads, f8, main_path;
};

static int run_decode(void *a)
{
	struct dec_arg *d = a;
	const float sc = 1.0f / sqrtf((float)d->x->hd);

	if (d->main_path) {
		static int32_t *qp;

		if (!qp) {
			int32_t pos = 1 << 30;

			qp = dput(&pos, sizeof(pos));
		}
		return kvmem_cuda_attention_bf16(g_c, d->out, d->q, qp, 1, d->x->dk16, d->x->dv16, NULL,
						 d->n_kv, d->x->stride, d->heads, d->x->kvh, d->x->hd,
						 sc);
	}
	return kvmem_cuda_decode_kv_bf16(g_c, d->out, d->q, d->f8 ? d->x->dk8 : d->x->dk16,
					 d->f8 ? d->x->dv8 : d->x->dv16, d->x->dks, d->x->dvs,
					 d->f8 ? KVMEM_DTYPE_FP8 : KVMEM_DTYPE_BF16, d->n_kv,
					 d->x->stride, d->heads, d->x->kvh, d->x->hd, sc);
}

static void bench_fp8(void)
{
	const int L = 36, H = 8, D = 128, B = 32, NB = 256, heads = 32;
	const double copy = kvmem_cuda_copy_gbps(g_c, 1ull << 30);
	double ms[2];

	printf("\n== fp8 / bf16 at Qwen3-8B's geometry (copy rate %.0f GB/s, read + write)\n", copy);
	/* Rematerialisation: NB blocks x 36 layers from pinned host pages. */
	for (int f8 = 0; f8 < 2; f8++) {
		struct pages p;
		kvmem_gather_item *it = hmalloc(sizeof(*it) * L * NB);
		struct gather_arg g = { .n = L * NB, .L = L, .H = H, .D = D, .cap = NB * B };

		if (pages_make(&p, L, H, D, B, NB, f8 ? KVMEM_DTYPE_FP8 : KVMEM_DTYPE_BF16))
			die("pinned pages");
		for (int l = 0; l < L; l++)
			for (int b = 0; b < NB; b++)
				it[l * NB + b] = page_item(&p, p.host, l, b, 0, B, b * B);
		if (kvmem_cuda_malloc(&g.vk, (size_t)L * H * NB * B * D * 2) ||
		    kvmem_cuda_malloc(&g.vv, (size_t)L * H * NB * B * D * 2) ||
		    kvmem_cuda_malloc(&g.items, sizeof(*it) * L * NB) ||
		    kvmem_cuda_upload(g_c, g.items, it, sizeof(*it) * L * NB))
			die("gather buffers");
		ms[f8] = time_ms(run_gather, &g, 2, 9);
		printf("rematerialise %s: %d blocks x %d layers (%.0f MB of pages) %.3f ms, %.0f "
		       "tokens/s, %.1f GB/s of pages\n", f8 ? "fp8 " : "bf16", NB, L,
		       p.page * L * NB / 1e6, ms[f8], NB * B / (ms[f8] / 1e3),
		       p.page * L * NB / (ms[f8] / 1e3) / 1e9);
		kvmem_cuda_free(g.vk), kvmem_cuda_free(g.vv), kvmem_cuda_free(g.items);
		cudaFreeHost(p.host);
		free(it);
	}
	printf("rematerialisation tokens/s, fp8 / bf16: %.2f (target >= 1.9)\n", ms[0] / ms[1]);
	/* Decode attention per layer. */
	for (int k = 0; k < 2; k++) {
		const int n_kv = k ? 131072 : 32768;
		struct kv x;
		uint16_t *q = rand_bf16((size_t)heads * D, -2, 2);
		struct dec_arg d = { .x = &x, .q = dput(q, 2 * heads * D), .out = dpoison(2 * heads * D),
				     .n_kv = n_kv, .heads = heads };
		/* K + V bytes at the copy rate (which counts a stream of reads) */
		double t16, t8, tm, floor16 = 4.0 * H * n_kv * D / (copy * 1e9) * 1e3;

		kv_make(&x, H, n_kv, D, 0);
		t16 = time_ms(run_decode, &d, 3, 21);
		d.f8 = 1;
		t8 = time_ms(run_decode, &d, 3, 21);
		d.f8 = 0, d.main_path = 1;
		tm = time_ms(run_decode, &d, 3, 21);
		printf("decode attention, %dK keys, one layer: bf16 %.1f us (byte floor %.1f), fp8 "
		       "%.1f us (floor %.1f); fp8 / bf16 speed %.2f; the main path's bf16 kernel "
		       "%.1f us\n", n_kv / 1024, t16 * 1e3, floor16 * 1e3, t8 * 1e3,
		       floor16 * 1e3 * (D + 4) / (2.0 * D), t16 / t8, tm * 1e3);
		kv_free(&x);
		kvmem_cuda_free(d.q), kvmem_cuda_free(d.out);
		free(q);
	}
}

void check_fp8(int bench)
{
	check_quant(128, KVMEM_DTYPE_F32);
	check_quant(128, KVMEM_DTYPE_BF16);
	check_quant(64, KVMEM_DTYPE_F32);
	check_quant(100, KVMEM_DTYPE_F32);
	check_gather_fp8(0);
	check_gather_fp8(1);
	check_decode(1, 32, 8, 128);
	check_decode(33, 32, 8, 128);
	check_decode(4097, 16, 8, 64);
	check_decode(700, 8, 8, 128);
	check_decode(2000, 16, 2, 128);
	if (!g_quick)
		check_decode(32768, 32, 8, 128);
	if (bench)
		bench_fp8();
	check_fp8_view(bench);	/* the cuda backend's fp8 views: check_fp8_view.c */
}

// SPDX-License-Identifier: MIT
/*
 * The batched decode's q/k kernel (kvmem_cuda_qk_norm_rope_scatter_rows_bf16,
 * qkv.cu): n rows, each into its own view at its own slot, against the
 * one-row entry (kvmem_cuda_qk_norm_rope_scatter_bf16) called per row, as a
 * lone decode step calls it: the rotated q, raw q, raw K, V and every view
 * slot bit for bit. Inputs are fresh random numbers; outputs and views
 * poisoned first, so a slot either call leaves alone stays equal too.
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_cuda.h"
#include "kvmem/kvmem.h"
#include "check_gemv_rows.h"
#include "check_util.h"

#define QR_MAX 24
#define QR_L 2

struct qr_side {	/* one run's outputs */
	void *q, *qr, *kr, *vo;
	void *vk[QR_MAX], *vv[QR_MAX], *rk[QR_MAX];
};

static void side_make(struct qr_side *s, int n, int nh, int nkv, int hd, const int *cap,
		      const int *keep)
{
	s->q = dpoison((size_t)n * nh * hd * 2);
	s->qr = dpoison((size_t)n * nh * hd * 2);
	s->kr = dpoison((size_t)n * nkv * hd * 2);
	s->vo = dpoison((size_t)n * nkv * hd * 2);
	for (int i = 0; i < n; i++) {
		const size_t vb = (size_t)QR_L * nkv * cap[i] * hd * 2;

		s->vk[i] = dpoison(vb);
		s->vv[i] = dpoison(vb);
		s->rk[i] = keep[i] ? dpoison(vb) : NULL;
	}
}

/* Bytes of a and b's device buffers that differ. */
static size_t ddiff(const void *a, const void *b, size_t bytes)
{
	unsigned char *x = dget(a, bytes), *y = dget(b, bytes);
	size_t d = 0;

	for (size_t e = 0; e < bytes; e++)
		d += x[e] != y[e];
	free(x);
	free(y);
	return d;
}

static void qr_case(int n, int nh, int nkv, int hd)
{
	const int ld = (nh + 2 * nkv) * hd;
	int cap[QR_MAX], keep[QR_MAX], layer = rint_in(0, QR_L - 1);
	int32_t pos[QR_MAX];
	kvmem_scatter_item it[QR_MAX];
	kvmem_qk_view tv[QR_MAX];
	struct qr_side a, b;
	uint16_t *qkv_h = rand_bf16((size_t)n * ld, -2, 2);
	uint16_t *qn = rand_bf16(hd, 0.5, 1.5), *kn = rand_bf16(hd, 0.5, 1.5);
	void *qkv1 = dput(qkv_h, (size_t)n * ld * 2), *qkv2 = dput(qkv_h, (size_t)n * ld * 2);
	void *dqn = dput(qn, (size_t)hd * 2), *dkn = dput(kn, (size_t)hd * 2);
	void *dpos, *dit, *dtv, *ang;
	size_t d = 0;
	int rc;

	for (int i = 0; i < n; i++) {
		cap[i] = rint_in(1, 300);
		keep[i] = rint_in(0, 1);
		pos[i] = rint_in(0, cap[i] - 1);	/* the slot: the view's length */
		it[i] = (kvmem_scatter_item){ .layer = layer, .slot = pos[i], .n = 1,
					      .tok_stride = ld, .src = 0, .head_stride = hd };
	}
	side_make(&a, n, nh, nkv, hd, cap, keep);
	side_make(&b, n, nh, nkv, hd, cap, keep);
	dpos = dput(pos, sizeof(pos[0]) * n);
	dit = dput(it, sizeof(it[0]) * n);
	if (kvmem_cuda_malloc(&ang, (size_t)n * hd * sizeof(double)) ||
	    kvmem_cuda_rope_angles(g_c, ang, dpos, n, hd, 1e6))
		die("q/k rows: angles");
	for (int i = 0; i < n; i++)
		tv[i] = (kvmem_qk_view){ .k = b.vk[i], .v = b.vv[i], .rk = b.rk[i],
					 .item = (const kvmem_scatter_item *)dit + i, .cap = cap[i] };
	dtv = dput(tv, sizeof(tv[0]) * n);
	/* a: one row at a time, as the lone decode step; b: all rows at once */
	for (int i = 0; i < n; i++)
		if (kvmem_cuda_qk_norm_rope_scatter_bf16(
			    g_c, (uint16_t *)qkv1 + (size_t)i * ld, ld, dqn, dkn, 1, nh, nkv, hd, 1e-6f,
			    (const int32_t *)dpos + i, 1e6, (uint16_t *)a.q + (size_t)i * nh * hd,
			    (uint16_t *)a.qr + (size_t)i * nh * hd, (uint16_t *)a.kr + (size_t)i * nkv * hd,
			    (uint16_t *)a.vo + (size_t)i * nkv * hd, a.vk[i], a.vv[i], a.rk[i],
			    (const kvmem_scatter_item *)dit + i, QR_L, cap[i],
			    (const double *)ang + (size_t)i * hd))
			die("q/k rows: one row");
	rc = kvmem_cuda_qk_norm_rope_scatter_rows_bf16(g_c, qkv2, ld, dqn, dkn, n, nh, nkv, hd,
						       1e-6f, dpos, 1e6, b.q, b.qr, b.kr, b.vo, dtv,
						       QR_L, ang);
	if (rc == -ENOTSUP) {
		report(1, "q/k rows: skipped (\"fuse\" off in this context)");
		goto out;
	}
	if (rc)
		die("q/k rows");
	d += ddiff(qkv1, qkv2, (size_t)n * ld * 2);
	d += ddiff(a.q, b.q, (size_t)n * nh * hd * 2) + ddiff(a.qr, b.qr, (size_t)n * nh * hd * 2);
	d += ddiff(a.kr, b.kr, (size_t)n * nkv * hd * 2) + ddiff(a.vo, b.vo, (size_t)n * nkv * hd * 2);
	for (int i = 0; i < n; i++) {
		const size_t vb = (size_t)QR_L * nkv * cap[i] * hd * 2;

		d += ddiff(a.vk[i], b.vk[i], vb) + ddiff(a.vv[i], b.vv[i], vb);
		if (keep[i])
			d += ddiff(a.rk[i], b.rk[i], vb);
	}
	report(!d, "q/k norm + rope + scatter over %2d rows (%d/%d heads x %d): %zu bytes differ "
	       "from one row at a time (q, raw q, raw K, V, every view slot)", n, nh, nkv, hd, d);
out:
	for (struct qr_side *s = &a; s; s = s == &a ? &b : NULL) {
		kvmem_cuda_free(s->q);
		kvmem_cuda_free(s->qr);
		kvmem_cuda_free(s->kr);
		kvmem_cuda_free(s->vo);
		for (int i = 0; i < n; i++) {
			kvmem_cuda_free(s->vk[i]);
			kvmem_cuda_free(s->vv[i]);
			kvmem_cuda_free(s->rk[i]);
		}
	}
	kvmem_cuda_free(qkv1);
	kvmem_cuda_free(qkv2);
	kvmem_cuda_free(dqn);
	kvmem_cuda_free(dkn);
	kvmem_cuda_free(dpos);
	kvmem_cuda_free(dit);
	kvmem_cuda_free(dtv);
	kvmem_cuda_free(ang);
	free(qkv_h);
	free(qn);
	free(kn);
}

void check_qk_rows(void)
{
	printf("\nthe batched decode's q/k kernel (qkv.cu, rows of many views) vs one row at a time\n");
	qr_case(rint_in(1, QR_MAX), 32, 8, 128);
	qr_case(rint_in(1, QR_MAX), 8, 2, 64);
	qr_case(rint_in(1, QR_MAX), 4, 4, 128);
}

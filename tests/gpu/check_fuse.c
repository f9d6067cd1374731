// SPDX-License-Identifier: MIT
/*
 * Decode's fused ops (kernels/cuda/gemv.cu) against their twins and against
 * the unfused CUDA ops (see check_fuse.h).
 *
 * Tolerance against the twin (Documentation/kernels.md): the GEMM's,
 * |gpu - cpu| <= 1e-5 Σ|h·w| per output (h the twin's normalised row), plus
 * one bf16 ulp of the value for bf16 out, plus 1e-6 |y| for fp32 +=. For
 * the SwiGLU form the gate g and up u sums each carry that error (δg, δu)
 * before SwiGLU, whose slopes are |silu'| <= 1.1 and |silu(g)|: the bound is
 * 1.1 (|u| + δu) δg + (|silu(g)| + 1.1 δg) δu, plus one bf16 ulp.
 *
 * Bit for bit: with one row, the fused kernel must give the unfused ops'
 * bits (kvmem_cuda_rmsnorm_bf16, the split GEMV, kvmem_cuda_swiglu_bf16)
 * at the split the shape picks and at every forced one, and must leave the
 * scratch h and gu (poisoned) untouched: that is how the check knows the
 * fused kernel ran rather than the unfused fallback. The q/k norm + RoPE +
 * view scatter kernel is defined as the two unfused ops and checked bit for
 * bit against them (qkn_case).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_cuda.h"
#include "kvmem/kvmem.h"
#include "check_fuse.h"
#include "check_util.h"

/* One case: n rows of in -> out (the SwiGLU form: out = inter, the
 * weights [gate; up] have 2 * out rows). */
struct fcase {
	int n, in, out, swiglu, mode;
};

static int saved[4];

static void fuse_tune(const char *what, int on, int *was)
{
	int rc = kvmem_cuda_tune(g_c, what, on);

	if (rc < 0)
		die("kvmem_cuda_tune (fuse)");
	if (was)
		*was = rc;
}

static int wrows(const struct fcase *f)
{
	return f->swiglu ? 2 * f->out : f->out;
}

static size_t ybytes(const struct fcase *f)
{
	return (f->swiglu || f->mode == KVMEM_GEMM_BF16 ? 2 : 4) * (size_t)f->n * f->out;
}

static int all_poison(const uint16_t *h, size_t words)
{
	for (size_t i = 0; i < words; i++)
		if (h[i] != 0xffff)
			return 0;
	return 1;
}

/* One call by the context's current settings: the output (y0 for +=,
 * else poisoned) comes back; *untouched says whether the poisoned scratch
 * h and gu stayed so. */
static void *fuse_run(const struct fcase *f, const void *dx, const void *dnw, const void *dw,
		      const float *y0, int *untouched)
{
	const size_t hw = (size_t)f->n * f->in, gw = (size_t)f->n * 2 * f->out;
	const int add = !f->swiglu && f->mode == KVMEM_GEMM_F32_ADD;
	void *dy = add ? dput(y0, ybytes(f)) : dpoison(ybytes(f));
	void *dh = dpoison(2 * hw), *dgu = dpoison(2 * gw), *got;
	uint16_t *h, *gu;
	int rc;

	if (f->swiglu)
		rc = kvmem_cuda_norm_gemv_swiglu_bf16(g_c, dy, dx, dnw, 1e-6f, dw, dh, dgu, f->n,
						      f->in, f->out);
	else
		rc = kvmem_cuda_norm_gemv_bf16(g_c, dy, f->mode, dx, dnw, 1e-6f, dw, dh, f->n, f->in,
					       f->out);
	if (rc)
		die("fused op");
	got = dget(dy, ybytes(f));
	h = dget(dh, 2 * hw);
	gu = dget(dgu, 2 * gw);
	*untouched = all_poison(h, hw) && all_poison(gu, gw);
	free(h);
	free(gu);
	kvmem_cuda_free(dy);
	kvmem_cuda_free(dh);
	kvmem_cuda_free(dgu);
	return got;
}

/* Against the twin, with the tolerance above. */
static void fuse_cmp_twin(const char *what, const struct fcase *f, const void *got,
			  const void *ref, const uint16_t *gu, const float *abs_, const float *y0)
{
	const int rows = wrows(f);
	struct cmp c = { 0 };

	for (int i = 0; i < f->n; i++)
		for (int o = 0; o < f->out; o++) {
			const size_t e = (size_t)i * f->out + o;
			const float *a = abs_ + (size_t)i * rows;

			if (f->swiglu) {
				double g = bf(gu[(size_t)i * rows + o]), u = bf(gu[(size_t)i * rows + f->out + o]);
				double dg = 1e-5 * a[o] + ULP1 * fabs(g);
				double du = 1e-5 * a[f->out + o] + ULP1 * fabs(u);
				double silu = g / (1.0 + exp(-g));

				cmp_one(&c, bf(((const uint16_t *)got)[e]), bf(((const uint16_t *)ref)[e]),
					1.1 * (fabs(u) + du) * dg + (fabs(silu) + 1.1 * dg) * du, ULP1);
			} else if (f->mode == KVMEM_GEMM_BF16) {
				cmp_one(&c, bf(((const uint16_t *)got)[e]), bf(((const uint16_t *)ref)[e]),
					1e-5 * a[o], ULP1);
			} else {
				cmp_one(&c, ((const float *)got)[e], ((const float *)ref)[e],
					1e-5 * a[o] + (y0 ? 1e-6 * fabs(y0[e]) : 0), 0);
			}
		}
	cmp_report(&c, what, 1e-5, f->swiglu || f->mode == KVMEM_GEMM_BF16 ? ULP1 : 0);
}

static void fuse_case(const struct fcase *f)
{
	static const char *modes[] = { "bf16", "f32", "f32+=" };
	static const int kss[] = { 0, 1, 2, 4, 8 };
	const int rows = wrows(f);
	const size_t nw = (size_t)rows * f->in;
	const int add = !f->swiglu && f->mode == KVMEM_GEMM_F32_ADD;
	float *x = rand_f32((size_t)f->n * f->in, -4, 4);
	float *y0 = add ? rand_f32((size_t)f->n * f->out, -3, 3) : NULL;
	float *abs_ = hmalloc(4 * (size_t)f->n * rows);
	uint16_t *nrm = rand_bf16(f->in, 0.5, 1.5), *w, *th = hmalloc(2 * (size_t)f->n * f->in);
	uint16_t *tgu = hmalloc(2 * (size_t)f->n * 2 * f->out);
	void *ref = hmalloc(ybytes(f)), *dx = dput(x, 4 * (size_t)f->n * f->in), *dnw = dput(nrm, 2 * f->in);
	void *dw, *fused;
	char what[120], name[64];
	int untouched, rc;
	size_t differ = 0, words = ybytes(f) / 2;

	if (kvmem_cuda_malloc(&dw, 2 * nw) || kvmem_cuda_random_bf16(g_c, dw, nw, rnext(), 0.5f))
		die("fuse: weights");
	w = dget(dw, 2 * nw);
	if (f->swiglu) {
		snprintf(name, sizeof(name), "%dx%d->2x%d swiglu", f->n, f->in, f->out);
		rc = kvmem_norm_gemv_swiglu_bf16(ref, x, nrm, 1e-6f, w, th, tgu, f->n, f->in, f->out);
	} else {
		snprintf(name, sizeof(name), "%dx%d->%d %s", f->n, f->in, f->out, modes[f->mode]);
		if (add)
			memcpy(ref, y0, ybytes(f));
		rc = kvmem_norm_gemv_bf16(ref, f->mode, x, nrm, 1e-6f, w, th, f->n, f->in, f->out);
	}
	if (rc)
		die("fuse twin");
	for (int i = 0; i < f->n; i++)	/* Σ|h·w| per output row */
		for (int o = 0; o < rows; o++) {
			const uint16_t *wo = w + (size_t)o * f->in, *hi = th + (size_t)i * f->in;
			double s = 0;

			for (int k = 0; k < f->in; k++)
				s += fabs((double)kvmem_bf16_to_f32(hi[k]) * kvmem_bf16_to_f32(wo[k]));
			abs_[(size_t)i * rows + o] = (float)s;
		}
	fuse_tune("fuse", 1, NULL);
	fuse_tune("gemv_ks", 0, NULL);
	fused = fuse_run(f, dx, dnw, dw, y0, &untouched);
	snprintf(what, sizeof(what), "fuse %s", name);
	fuse_cmp_twin(what, f, fused, ref, tgu, abs_, y0);
	free(fused);
	if (f->n == 1) {
		int fused_ran = 1;

		for (size_t k = 0; k < sizeof(kss) / sizeof(kss[0]); k++) {
			void *plain, *fz;
			int u0, u1;

			fuse_tune("gemv_ks", kss[k], NULL);
			fuse_tune("fuse", 1, NULL);
			fz = fuse_run(f, dx, dnw, dw, y0, &u1);
			fuse_tune("fuse", 0, NULL);
			plain = fuse_run(f, dx, dnw, dw, y0, &u0);
			for (size_t i = 0; i < words; i++)
				differ += ((uint16_t *)fz)[i] != ((uint16_t *)plain)[i];
			fused_ran &= u1 && !u0;
			free(fz);
			free(plain);
		}
		fuse_tune("gemv_ks", 0, NULL);
		report(!differ && fused_ran, "%-34s fused == unfused bits at ks 0,1,2,4,8: %zu of %zu "
		       "words differ; fused kernel ran (scratch untouched): %s", what, differ,
		       words * 5, fused_ran ? "yes" : "NO");
	}
	free(x);
	free(y0);
	free(abs_);
	free(nrm);
	free(w);
	free(th);
	free(tgu);
	free(ref);
	kvmem_cuda_free(dx);
	kvmem_cuda_free(dnw);
	kvmem_cuda_free(dw);
}

/* ---- q/k norm + RoPE + the view scatter ---------------------------------------- */

/*
 * n tokens (one: a decode step; more: a prefill chunk): the fused kernel
 * against kvmem_cuda_qk_norm_rope_bf16 then kvmem_cuda_view_scatter_bf16
 * (each checked against its twins in check.c and check_perf.c) from the
 * same random state, bit for bit in every output: qkv (K normalised in
 * place), q rotated, raw q, raw K, V, the whole view (its other slots
 * random, so a stray write shows) and the raw K kept beside the view (its
 * slots the raw K rows, bit for bit). slot 0: the item's slots are the
 * tokens' positions (the forward pass); 1: other slots; 2: a run that
 * would pass the capacity (nothing written).
 */
static void qkn_case(int heads, int kvh, int hd, int slot_kind, int n)
{
	const int L = 3, cap = 50 + n, ld = (heads + 2 * kvh) * hd + 8;
	const size_t qn = (size_t)n * heads * hd, kn = (size_t)n * kvh * hd,
		     vn = (size_t)L * kvh * cap * hd;
	uint16_t *qkv = rand_bf16((size_t)n * ld, -3, 3), *qw = rand_bf16(hd, 0.5, 1.5),
		 *kw = rand_bf16(hd, 0.5, 1.5);
	uint16_t *vk = rand_bf16(vn, -2, 2), *vv = rand_bf16(vn, -2, 2);
	int32_t *pos = malloc(sizeof(int32_t) * n);
	kvmem_scatter_item it = { .layer = rint_in(0, L - 1), .n = n, .tok_stride = ld, .src = 0,
				  .head_stride = hd };
	const size_t sizes[] = { 2 * (size_t)n * ld, 2 * qn, 2 * qn, 2 * kn, 2 * kn, 2 * vn, 2 * vn,
				 2 * vn };
	void *got[3][8];
	size_t raw_bad = 0;
	size_t differ = 0, words = 0;
	char what[120];

	it.slot = slot_kind == 0 || slot_kind == 1 ? rint_in(0, cap - n) : cap - n + rint_in(1, 5);
	for (int t = 0; t < n; t++)
		pos[t] = slot_kind == 0 ? it.slot + t : rint_in(0, 4000000);
	/* 0 unfused; 1 fused, each block working the angles out; 2 fused,
	 * reading the forward's table (kvmem_cuda_rope_angles) */
	for (int on = 0; on < 3; on++) {
		void *d[8] = { dput(qkv, sizes[0]), dpoison(sizes[1]), dpoison(sizes[2]), dpoison(sizes[3]),
			       dpoison(sizes[4]), dput(vk, sizes[5]), dput(vv, sizes[6]),
			       dput(vk, sizes[7]) };
		void *dqw = dput(qw, 2 * hd), *dkw = dput(kw, 2 * hd), *dpos = dput(pos, 4 * n);
		void *dit = dput(&it, sizeof(it)), *dang = NULL;

		fuse_tune("fuse", on > 0, NULL);
		if (on == 2 && (!(dang = dpoison((size_t)n * hd * sizeof(double))) ||
				kvmem_cuda_rope_angles(g_c, dang, dpos, n, hd, 1e6)))
			die("rope angles");
		if (kvmem_cuda_qk_norm_rope_scatter_bf16(g_c, d[0], ld, dqw, dkw, n, heads, kvh, hd, 1e-6f,
							 dpos, 1e6, d[1], d[2], d[3], d[4], d[5], d[6],
							 d[7], dit, L, cap, dang))
			die("q/k norm + rope + scatter");
		kvmem_cuda_free(dang);
		for (int i = 0; i < 8; i++) {
			got[on][i] = dget(d[i], sizes[i]);
			kvmem_cuda_free(d[i]);
		}
		/* The raw K beside the view: the raw K rows at the item's slots
		 * (when they are in the view), the other slots as they were. */
		for (int t = 0; t < n && it.slot + n <= cap; t++)
			for (int g = 0; g < kvh; g++)
				raw_bad += memcmp((uint16_t *)got[on][7] +
						  (((size_t)it.layer * kvh + g) * cap + it.slot + t) * hd,
						  (uint16_t *)got[on][3] + ((size_t)t * kvh + g) * hd,
						  2 * (size_t)hd) != 0;
		if (it.slot + n > cap)
			raw_bad += memcmp(got[on][7], vk, sizes[7]) != 0;
		kvmem_cuda_free(dqw);
		kvmem_cuda_free(dkw);
		kvmem_cuda_free(dpos);
		kvmem_cuda_free(dit);
	}
	for (int i = 0; i < 8; i++) {
		for (size_t k = 0; k < sizes[i] / 2; k++)
			for (int on = 1; on < 3; on++)
				differ += ((uint16_t *)got[0][i])[k] != ((uint16_t *)got[on][i])[k];
		words += 2 * sizes[i] / 2;
		for (int on = 0; on < 3; on++)
			free(got[on][i]);
	}
	snprintf(what, sizeof(what), "fuse qk norm+rope+scatter %d x %d/%d x %d, %s", n, heads, kvh,
		 hd, slot_kind == 0 ? "slot = position" : slot_kind == 1 ? "another slot" :
		 "past the view");
	report(!differ && !raw_bad, "%-34s fused (angles worked out; from the table) == unfused "
	       "bits: %zu of %zu words differ; %zu raw K rows beside the view wrong", what, differ,
	       words, raw_bad);
	free(pos);
	free(qkv);
	free(qw);
	free(kw);
	free(vk);
	free(vv);
}

/* kvmem_cuda_rope_angles against its twin (kvmem_rope_angles): CUDA's pow
 * and sincos against glibc's, each within 2 ulp, on angles up to 4M rad:
 * a difference of a few ulp of the angle (pos * 2^-52) shows in its sine. */
static void angles_case(int n, int hd)
{
	int32_t *pos = malloc(sizeof(int32_t) * n);
	double *ref = malloc(sizeof(double) * n * hd), *got, worst = 0;
	void *dpos, *dang = dpoison(sizeof(double) * n * hd);
	size_t bad = 0;

	for (int t = 0; t < n; t++)
		pos[t] = t < n / 2 ? t : rint_in(0, 4000000);
	dpos = dput(pos, 4 * n);
	kvmem_rope_angles(ref, pos, n, hd, 1e6);
	if (kvmem_cuda_rope_angles(g_c, dang, dpos, n, hd, 1e6))
		die("rope angles");
	got = dget(dang, sizeof(double) * n * hd);
	for (size_t k = 0; k < (size_t)n * hd; k++) {
		double d = fabs(got[k] - ref[k]), tol = 8.0 * (pos[k / hd] + 1) * 0x1p-52 + 1e-15;

		worst = d > worst ? d : worst;
		bad += !(d <= tol);
	}
	report(!bad, "rope angles %d x %d vs twin               max|d|=%.3g bad=%zu", n, hd, worst,
	       bad);
	free(pos);
	free(ref);
	free(got);
	kvmem_cuda_free(dpos);
	kvmem_cuda_free(dang);
}

/* ---- times -------------------------------------------------------------------- */

struct frun {
	int swiglu, copies, in, out;
	void *dy, *dx, *dnw, *dh, *dgu;
	const uint16_t *dw;	/* copies of the weights, back to back */
};

static int frun_all(void *arg)
{
	const struct frun *t = arg;
	const size_t stride = (size_t)(t->swiglu ? 2 * t->out : t->out) * t->in;
	int rc = 0;

	for (int i = 0; i < t->copies && !rc; i++)
		rc = t->swiglu ? kvmem_cuda_norm_gemv_swiglu_bf16(g_c, t->dy, t->dx, t->dnw, 1e-6f,
								  t->dw + i * stride, t->dh, t->dgu,
								  1, t->in, t->out)
			       : kvmem_cuda_norm_gemv_bf16(g_c, t->dy, KVMEM_GEMM_BF16, t->dx, t->dnw,
							   1e-6f, t->dw + i * stride, t->dh, 1,
							   t->in, t->out);
	return rc;
}

/* Each Qwen3-8B decode op, unfused and fused, over weight copies larger
 * than the L2 (cold, as in decode): microseconds a call. */
static void fuse_times(void)
{
	static const struct { const char *name; int in, out, swiglu, copies; } ops[] = {
		{ "attn_norm + qkv 4096->6144", 4096, 6144, 0, 4 },
		{ "mlp_norm + gate|up 4096->24576 + swiglu", 4096, 12288, 1, 2 },
	};

	for (size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); k++) {
		const size_t nw = (size_t)(ops[k].swiglu ? 2 : 1) * ops[k].out * ops[k].in * ops[k].copies;
		struct frun t = { .swiglu = ops[k].swiglu, .copies = ops[k].copies, .in = ops[k].in,
				  .out = ops[k].out };
		void *dw;
		double us[2];

		if (kvmem_cuda_malloc(&dw, 2 * nw) || kvmem_cuda_random_bf16(g_c, dw, nw, rnext(), 0.5f))
			die("fuse times: weights");
		t.dw = dw;
		{
			float *x = rand_f32(ops[k].in, -4, 4);
			uint16_t *nrm = rand_bf16(ops[k].in, 0.5, 1.5);

			t.dx = dput(x, 4 * (size_t)ops[k].in);
			t.dnw = dput(nrm, 2 * (size_t)ops[k].in);
			free(x);
			free(nrm);
		}
		t.dy = dpoison(2 * (size_t)2 * ops[k].out);
		t.dh = dpoison(2 * (size_t)ops[k].in);
		t.dgu = dpoison(2 * (size_t)2 * ops[k].out);
		for (int on = 0; on < 2; on++) {
			fuse_tune("fuse", on, NULL);
			us[on] = time_ms(frun_all, &t, 2, 20) * 1e3 / t.copies;
		}
		printf("time %-44s unfused %7.2f us, fused %7.2f us (%.2fx)\n", ops[k].name, us[0],
		       us[1], us[0] / us[1]);
		kvmem_cuda_free(dw);
		kvmem_cuda_free(t.dx);
		kvmem_cuda_free(t.dnw);
		kvmem_cuda_free(t.dy);
		kvmem_cuda_free(t.dh);
		kvmem_cuda_free(t.dgu);
	}
}

void check_fuse(void)
{
	/* Qwen3-8B's two (qkv; gate|up with SwiGLU), then odd shapes: 4104
	 * inputs are 513 chunks (not a multiple of 32; splits past the end at
	 * ks 8), 64 inputs fewer chunks than a warp, outputs that leave a
	 * block part empty; n 3: the unfused path the op takes for prefill. */
	static const struct fcase cases[] = {
		{ 1, 4096, 6144, 0, KVMEM_GEMM_BF16 },
		{ 1, 4096, 12288, 1, KVMEM_GEMM_BF16 },
		{ 1, 1000, 333, 0, KVMEM_GEMM_BF16 },
		{ 1, 1000, 333, 0, KVMEM_GEMM_F32 },
		{ 1, 1000, 333, 0, KVMEM_GEMM_F32_ADD },
		{ 1, 4104, 37, 0, KVMEM_GEMM_BF16 },
		{ 1, 64, 7, 0, KVMEM_GEMM_F32_ADD },
		{ 1, 1000, 333, 1, KVMEM_GEMM_BF16 },
		{ 1, 4104, 37, 1, KVMEM_GEMM_BF16 },
		{ 1, 64, 3, 1, KVMEM_GEMM_BF16 },
		{ 3, 1000, 333, 0, KVMEM_GEMM_F32_ADD },
		{ 3, 1000, 333, 1, KVMEM_GEMM_BF16 },
	};

	fuse_tune("fuse", 1, &saved[0]);
	fuse_tune("gemv", 1, &saved[1]);
	fuse_tune("gemv_split", 1, &saved[2]);
	fuse_tune("gemv_ks", 0, &saved[3]);
	for (size_t i = g_quick ? 2 : 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		fuse_case(&cases[i]);
	for (int k = 0; k < 3; k++) {
		if (!g_quick) {
			qkn_case(32, 8, 128, k, 1);
			qkn_case(32, 8, 128, k, rint_in(100, 700));
		}
		qkn_case(6, 2, 64, k, 1);
		qkn_case(6, 2, 64, k, rint_in(2, 40));
		qkn_case(6, 2, 20, k, rint_in(2, 40));	/* the kernel's 2-byte moves */
	}
	angles_case(rint_in(100, 3000), 128);
	angles_case(rint_in(1, 50), 64);
	if (!g_quick)
		fuse_times();
	fuse_tune("fuse", saved[0], NULL);
	fuse_tune("gemv", saved[1], NULL);
	fuse_tune("gemv_split", saved[2], NULL);
	fuse_tune("gemv_ks", saved[3], NULL);
}

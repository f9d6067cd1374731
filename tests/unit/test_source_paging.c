// SPDX-License-Identifier: MIT
/*
 * The page source's side of the GPU paging path, on the CPU (fresh random
 * inputs; KVMEM_TEST_SEED replays them):
 *
 *   - a bf16 workspace: rows written as fp32 come back from get as bf16,
 *     each the kvmem_f32_to_bf16 rounding of what was written, full blocks
 *     (from the host pool or NVMe) and the open last block alike; the
 *     source's region is the host pool and holds every fetched page;
 *   - typed rows: a forward pass's rows of every layer in one write_rows
 *     call (bf16, or f32) give the pages fp32 rows give through write;
 *   - rows a backend writes into the pages itself (row_pages, then
 *     write_rows with no rows), the pages asked a chunk ahead of the
 *     rows' count as the session's writer thread lags: the same pages;
 *   - one format: a workspace keeps the dtype it was created with whatever
 *     a later open asks (f32 from the CPU opens as f32 when bf16 is asked,
 *     bf16 opens as bf16 by default), and a session adopts it either way;
 *   - a session over a source with a region registers it with a backend
 *     that offers host_register, once, and unregisters it when freed;
 *   - pages the backend says it keeps (page_cached) are not asked of the
 *     source: they reach place() as KVMEM_MEM_BACKEND items and are never
 *     put, and the session's logits stay those of host memory.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "backend/backend_impl.h"
#include "kernels/kernels.h"
#include "kernels/kernels_bf16.h"
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"
#include "kvmem/store.h"
#include "session/inspect.h"
#include "helpers/test_model.h"
#include "helpers/test_tmpdir.h"

static uint64_t g_seed;

static void test_bf16_pages(void **state)
{
	uint64_t rng = g_seed ^ 0xb16;
	const int L = test_rng_int(&rng, 1, 3), H = test_rng_int(&rng, 1, 3), D = 32, B = 16;
	const int n = test_rng_int(&rng, 5 * B + 1, 9 * B - 1), w = H * D;
	kvmem_page_geom g = { .fingerprint = 0xb16, .n_layers = L, .n_heads = H, .n_kv_heads = H,
			      .head_dim = D, .block_tokens = B, .dtype = KVMEM_DTYPE_BF16 };
	float *k = malloc(sizeof(float) * (size_t)n * L * w), *v = malloc(sizeof(float) * (size_t)n * L * w);
	kvmem_pager_opts po;
	kvmem_page_source src;
	kvmem_pager *p;
	char dir[256];
	void *base = NULL;
	size_t len = 0;

	assert_non_null(k);
	assert_non_null(v);
	for (size_t i = 0; i < (size_t)n * L * w; i++) {
		k[i] = (float)test_rng_range(&rng, -4, 4);
		v[i] = (float)test_rng_range(&rng, -4, 4);
	}
	assert_int_equal(test_tmpdir_make(dir, sizeof(dir), "source-paging"), 0);
	strcat(dir, "/ws");
	kvmem_pager_opts_default(&po);
	po.flags = KVMEM_PAGER_CREATE | KVMEM_PAGER_NO_KEEP;
	po.host_cap = kvmem_page_stride(&g) * (L + 1);	/* reads come from disk */
	if (kvmem_pager_open(dir, &g, &po, &p) < 0)
		fail_msg("%s", kvmem_last_error());
	assert_int_equal(kvmem_page_source_pager(&src, p), 0);
	assert_non_null(src.ops->region);
	assert_int_equal(src.ops->region(src.ctx, &base, &len), 0);
	assert_non_null(base);
	/* Token-major rows of layer l: [t][h][d] at (t * L + l) * w. */
	for (int t = 0; t < n; t++)
		for (int l = 0; l < L; l++)
			if (src.ops->write(src.ctx, t / B, l, t % B, 1, k + ((size_t)t * L + l) * w,
					   v + ((size_t)t * L + l) * w))
				fail_msg("%s", kvmem_last_error());
	for (int b = 0; b * B < n; b++)
		for (int l = 0; l < L; l++) {
			kvmem_page pg;

			assert_int_equal(src.ops->get(src.ctx, b, l, &pg), 0);
			assert_int_equal(pg.dtype, KVMEM_DTYPE_BF16);
			if ((b + 1) * B <= n)	/* staged out: fetched into the pool */
				assert_true((const char *)pg.k >= (char *)base &&
					    (const char *)pg.v + (size_t)H * B * D * 2 <= (char *)base + len);
			for (int t = b * B; t < n && t < (b + 1) * B; t++)
				for (int h = 0; h < H; h++)
					for (int d = 0; d < D; d++) {
						size_t at = ((size_t)h * B + t % B) * D + d;
						size_t in = ((size_t)t * L + l) * w + (size_t)h * D + d;

						assert_int_equal(((const uint16_t *)pg.k)[at],
								 kvmem_f32_to_bf16(k[in]));
						assert_int_equal(((const uint16_t *)pg.v)[at],
								 kvmem_f32_to_bf16(v[in]));
					}
			src.ops->put(src.ctx, b, l);
		}
	kvmem_page_source_destroy(&src);
	assert_int_equal(kvmem_pager_close(p), 0);
	*strrchr(dir, '/') = 0;
	test_tmpdir_remove(dir);
	free(k);
	free(v);
}

/* ---- one format ------------------------------------------------------- */
static uint32_t open_dtype(const char *dir, const kvmem_model *m, uint32_t ask)
{
	kvmem_workspace_opts wo = { .block = 16, .dtype = ask };
	kvmem_workspace *w;
	uint32_t got;

	if (kvmem_workspace_open(dir, m, &wo, &w) < 0)
		fail_msg("%s", kvmem_last_error());
	got = kvmem_pager_geom(kvmem_workspace_pager(w))->dtype;
	assert_int_equal(kvmem_workspace_close(w), 0);
	return got;
}

/* Append n random tokens in a session over dir and commit. */
static void grow(const char *dir, kvmem_backend *be, uint32_t ask, int n, uint64_t seed)
{
	kvmem_workspace_opts wo = { .block = 16, .dtype = ask };
	kvmem_session_opts so;
	kvmem_workspace *w;
	kvmem_session *s;
	int32_t tok[200];
	uint64_t r = seed;

	for (int i = 0; i < n; i++)
		tok[i] = test_rng_int(&r, 0, be->model->cfg.vocab - 1);
	if (kvmem_workspace_open(dir, be->model, &wo, &w) < 0)
		fail_msg("%s", kvmem_last_error());
	kvmem_session_opts_default(&so);
	so.block = 16;
	so.budget = 64;
	so.chunk = 32;
	so.source = kvmem_workspace_source(w);
	s = kvmem_session_create(be, &so);
	assert_non_null(s);
	if (kvmem_workspace_adopt(w, s) < 0 || kvmem_session_append(s, tok, n, 0) ||
	    kvmem_session_decode(s, 3, NULL, NULL) || kvmem_workspace_commit(w, s) < 0)
		fail_msg("%s", kvmem_last_error());
	kvmem_session_free(s);
	assert_int_equal(kvmem_workspace_close(w), 0);
}

/* A pager source over a fresh workspace of dtype dt in dir. */
static kvmem_pager *rows_pager(const char *dir, const kvmem_page_geom *g0, uint32_t dt,
			       kvmem_page_source *src)
{
	kvmem_page_geom g = *g0;
	kvmem_pager_opts po;
	kvmem_pager *p;

	g.dtype = dt;
	kvmem_pager_opts_default(&po);
	po.flags = KVMEM_PAGER_CREATE;
	if (kvmem_pager_open(dir, &g, &po, &p) < 0 || kvmem_page_source_pager(src, p) < 0)
		fail_msg("%s", kvmem_last_error());
	return p;
}

/*
 * Typed rows (write_rows): a forward pass's rows of every layer in one
 * call, bf16 as a GPU makes them or f32, in chunks of any size over block
 * boundaries, give the very pages that fp32 rows written a block's piece
 * at a time through write give (bf16 rows widened first, which is exact),
 * in a bf16 and in an f32 workspace; full blocks staged out and the open
 * block alike. Another dtype is refused with nothing written, a token
 * written again too.
 */
static void test_typed_rows(void **state)
{
	uint64_t rng = g_seed ^ 0x7e5;
	const int L = test_rng_int(&rng, 1, 3), H = test_rng_int(&rng, 1, 3), D = 32, B = 16;
	const int n = test_rng_int(&rng, 5 * B + 1, 9 * B - 1), w = H * D;
	const kvmem_page_geom g = { .fingerprint = 0x7e5, .n_layers = L, .n_heads = H,
				    .n_kv_heads = H, .head_dim = D, .block_tokens = B };
	/* [L][n][w]: every layer's rows, as a forward over all n would give */
	uint16_t *k16 = malloc(2 * (size_t)L * n * w), *v16 = malloc(2 * (size_t)L * n * w);
	float *k32 = malloc(4 * (size_t)L * n * w), *v32 = malloc(4 * (size_t)L * n * w);
	char tmp[256], dir[300];

	assert_true(k16 && v16 && k32 && v32);
	for (size_t i = 0; i < (size_t)L * n * w; i++) {
		k16[i] = kvmem_f32_to_bf16((float)test_rng_range(&rng, -4, 4));
		v16[i] = kvmem_f32_to_bf16((float)test_rng_range(&rng, -4, 4));
		k32[i] = kvmem_bf16_to_f32(k16[i]);
		v32[i] = kvmem_bf16_to_f32(v16[i]);
	}
	assert_int_equal(test_tmpdir_make(tmp, sizeof(tmp), "typed-rows"), 0);
	for (int dt = 0; dt < 2; dt++) {
		const uint32_t ws_dt = dt ? KVMEM_DTYPE_F32 : KVMEM_DTYPE_BF16;
		const size_t es = ws_dt == KVMEM_DTYPE_F32 ? 4 : 2;
		kvmem_page_source src[3];
		kvmem_pager *p[3];

		/* 0: write, a block's piece of a layer at a time (the reference);
		 * 1: write_rows of bf16 rows; 2: write_rows of f32 rows. */
		for (int k = 0; k < 3; k++) {
			snprintf(dir, sizeof(dir), "%s/%d-%d", tmp, dt, k);
			p[k] = rows_pager(dir, &g, ws_dt, &src[k]);
		}
		assert_non_null(src[1].ops->write_rows);
		for (int l = 0; l < L; l++)
			for (int t = 0; t < n;) {
				int m = B - t % B < n - t ? B - t % B : n - t;
				size_t at = ((size_t)l * n + t) * w;

				assert_int_equal(src[0].ops->write(src[0].ctx, t / B, l, t % B, m, k32 + at,
								   v32 + at), 0);
				t += m;
			}
		for (int t = 0; t < n;) {
			int m = test_rng_int(&rng, 1, 2 * B + 3), bad = (int)test_rng_int(&rng, 0, 3);

			m = m < n - t ? m : n - t;
			/* The chunk's rows [L][m][w] out of the [L][n][w] arrays. */
			uint16_t *ck = malloc(2 * (size_t)L * m * w), *cv = malloc(2 * (size_t)L * m * w);
			float *fk = malloc(4 * (size_t)L * m * w), *fv = malloc(4 * (size_t)L * m * w);

			for (int l = 0; l < L; l++) {
				memcpy(ck + (size_t)l * m * w, k16 + ((size_t)l * n + t) * w, 2 * (size_t)m * w);
				memcpy(cv + (size_t)l * m * w, v16 + ((size_t)l * n + t) * w, 2 * (size_t)m * w);
				memcpy(fk + (size_t)l * m * w, k32 + ((size_t)l * n + t) * w, 4 * (size_t)m * w);
				memcpy(fv + (size_t)l * m * w, v32 + ((size_t)l * n + t) * w, 4 * (size_t)m * w);
			}
			if (!bad) {	/* refused, nothing written: the same call again works */
				assert_int_equal(src[1].ops->write_rows(src[1].ctx, t, m, ck, cv, 7),
						 -ENOTSUP);
				/* a token again (written, or staged out) */
				if (t)
					assert_int_equal(src[1].ops->write_rows(src[1].ctx, t - 1, m, ck,
										 cv, KVMEM_DTYPE_BF16),
							 -EINVAL);
			}
			assert_int_equal(src[1].ops->write_rows(src[1].ctx, t, m, ck, cv,
								 KVMEM_DTYPE_BF16), 0);
			assert_int_equal(src[2].ops->write_rows(src[2].ctx, t, m, fk, fv,
								 KVMEM_DTYPE_F32), 0);
			free(ck);
			free(cv);
			free(fk);
			free(fv);
			t += m;
		}
		for (int b = 0; b * B < n; b++)
			for (int l = 0; l < L; l++) {
				const int len = n - b * B < B ? n - b * B : B;
				kvmem_page ref, got;

				assert_int_equal(src[0].ops->get(src[0].ctx, b, l, &ref), 0);
				for (int k = 1; k < 3; k++) {
					assert_int_equal(src[k].ops->get(src[k].ctx, b, l, &got), 0);
					assert_int_equal(got.dtype, ws_dt);
					/* Tokens past the block's length are unspecified. */
					for (int h = 0; h < H; h++) {
						size_t o = (size_t)h * B * D * es;

						assert_memory_equal((const char *)got.k + o,
								    (const char *)ref.k + o, len * D * es);
						assert_memory_equal((const char *)got.v + o,
								    (const char *)ref.v + o, len * D * es);
					}
					src[k].ops->put(src[k].ctx, b, l);
				}
				src[0].ops->put(src[0].ctx, b, l);
			}
		for (int k = 0; k < 3; k++) {
			kvmem_page_source_destroy(&src[k]);
			assert_int_equal(kvmem_pager_close(p[k]), 0);
		}
	}
	test_tmpdir_remove(tmp);
	free(k16);
	free(v16);
	free(k32);
	free(v32);
}

/*
 * Pages a backend writes itself: row_pages gives every layer's page of a
 * chunk's blocks (in the host pool), the chunk's rows go there (by
 * kvmem_rows_to_pages_bf16 or _fp8, the twins of the cuda backend's
 * copies: page_dtype says which), then
 * write_rows(NULL, NULL) counts them in. Asked as a session asks them: a
 * chunk's pages before the rows of the chunk before are counted in (the
 * writer thread lags a forward behind), chunks of any size over block
 * boundaries. The pages equal those of write_rows with the rows; the
 * staged-out blocks sit in the pool with their checksums (verify reads
 * them). An f32 workspace refuses (-ENOTSUP); no rows in an f32 one too.
 * For a bf16 workspace and an fp8 one (its pages' bytes and scales).
 */
static void row_pages_case(uint32_t dt)
{
	uint64_t rng = g_seed ^ 0x9a6e ^ dt;
	const int es = dt == KVMEM_DTYPE_FP8 ? 1 : 2;	/* bytes a value */
	const int L = test_rng_int(&rng, 1, 3), H = test_rng_int(&rng, 1, 3), D = 32, B = 16;
	const int n = test_rng_int(&rng, 5 * B + 1, 9 * B - 1), w = H * D;
	const kvmem_page_geom g = { .fingerprint = 0x9a6e, .n_layers = L, .n_heads = H,
				    .n_kv_heads = H, .head_dim = D, .block_tokens = B };
	uint16_t *k16 = malloc(2 * (size_t)L * n * w), *v16 = malloc(2 * (size_t)L * n * w);
	void **pages = malloc(sizeof(void *) * (size_t)L * 4);	/* a chunk spans <= 4 blocks */
	kvmem_page_source src[3];
	kvmem_pager *p[3];
	char tmp[256], dir[300];
	int64_t pend_t = -1;
	int pend_m = 0;

	assert_true(k16 && v16 && pages);
	for (size_t i = 0; i < (size_t)L * n * w; i++) {
		k16[i] = kvmem_f32_to_bf16((float)test_rng_range(&rng, -4, 4));
		v16[i] = kvmem_f32_to_bf16((float)test_rng_range(&rng, -4, 4));
	}
	assert_int_equal(test_tmpdir_make(tmp, sizeof(tmp), "row-pages"), 0);
	/* 0: write_rows of the rows (the reference); 1: row_pages; 2: f32. */
	for (int k = 0; k < 3; k++) {
		snprintf(dir, sizeof(dir), "%s/%d", tmp, k);
		p[k] = rows_pager(dir, &g, k == 2 ? KVMEM_DTYPE_F32 : dt, &src[k]);
	}
	assert_non_null(src[1].ops->row_pages);
	assert_int_equal(src[1].ops->page_dtype(src[1].ctx), dt);
	assert_int_equal(src[2].ops->row_pages(src[2].ctx, 0, B, pages), -ENOTSUP);
	assert_int_equal(src[2].ops->write_rows(src[2].ctx, 0, B, NULL, NULL, KVMEM_DTYPE_BF16),
			 -EINVAL);
	for (int t = 0; t < n;) {
		int m = test_rng_int(&rng, 1, 2 * B + 3);
		int nb;
		uint16_t *ck, *cv;

		m = m < n - t ? m : n - t;
		nb = (t % B + m - 1) / B + 1;
		ck = malloc(2 * (size_t)L * m * w);
		cv = malloc(2 * (size_t)L * m * w);
		assert_true(ck && cv);
		for (int l = 0; l < L; l++) {
			memcpy(ck + (size_t)l * m * w, k16 + ((size_t)l * n + t) * w, 2 * (size_t)m * w);
			memcpy(cv + (size_t)l * m * w, v16 + ((size_t)l * n + t) * w, 2 * (size_t)m * w);
		}
		assert_int_equal(src[0].ops->write_rows(src[0].ctx, t, m, ck, cv, KVMEM_DTYPE_BF16), 0);
		/* This chunk's pages, then the chunk before is counted in. */
		assert_int_equal(src[1].ops->row_pages(src[1].ctx, t, m, pages), 0);
		for (int l = 0; l < L; l++)
			(dt == KVMEM_DTYPE_FP8 ? kvmem_rows_to_pages_fp8 : kvmem_rows_to_pages_bf16)(
				pages + (size_t)l * nb, t % B, m, ck + (size_t)l * m * w,
				cv + (size_t)l * m * w, H, B, D);
		if (pend_m)
			assert_int_equal(src[1].ops->write_rows(src[1].ctx, pend_t, pend_m, NULL, NULL,
								 KVMEM_DTYPE_BF16), 0);
		pend_t = t;
		pend_m = m;
		free(ck);
		free(cv);
		t += m;
	}
	assert_int_equal(src[1].ops->write_rows(src[1].ctx, pend_t, pend_m, NULL, NULL,
						 KVMEM_DTYPE_BF16), 0);
	/* Every full block staged out, as with the rows. */
	assert_int_equal(kvmem_pager_blocks(p[1]), n / B);
	assert_int_equal(kvmem_pager_blocks(p[0]), n / B);
	for (int b = 0; b * B < n; b++)
		for (int l = 0; l < L; l++) {
			const int len = n - b * B < B ? n - b * B : B;
			kvmem_page ref, got;

			assert_int_equal(src[0].ops->get(src[0].ctx, b, l, &ref), 0);
			assert_int_equal(src[1].ops->get(src[1].ctx, b, l, &got), 0);
			assert_int_equal(got.dtype, dt);
			for (int h = 0; h < H; h++) {
				size_t o = (size_t)h * B * D * es;

				assert_memory_equal((const char *)got.k + o, (const char *)ref.k + o,
						    len * D * es);
				assert_memory_equal((const char *)got.v + o, (const char *)ref.v + o,
						    len * D * es);
				if (dt == KVMEM_DTYPE_FP8) {
					assert_memory_equal(got.k_scale + h * B, ref.k_scale + h * B,
							    len * sizeof(float));
					assert_memory_equal(got.v_scale + h * B, ref.v_scale + h * B,
							    len * sizeof(float));
				}
			}
			src[1].ops->put(src[1].ctx, b, l);
			src[0].ops->put(src[0].ctx, b, l);
		}
	for (int k = 0; k < 3; k++) {
		kvmem_page_source_destroy(&src[k]);
		assert_int_equal(kvmem_pager_close(p[k]), 0);
	}
	test_tmpdir_remove(tmp);
	free(k16);
	free(v16);
	free(pages);
}

static void test_row_pages(void **state)
{
	row_pages_case(KVMEM_DTYPE_BF16);
	row_pages_case(KVMEM_DTYPE_FP8);
}

static void test_one_format(void **state)
{
	uint64_t rng = g_seed ^ 0xf0;
	kvmem_config c = test_model_config(2, 64, 4, 2, 16, 96, 200, 0);
	kvmem_model *m = test_model_random(&c, test_rng_next(&rng));
	kvmem_backend *be = kvmem_backend_cpu(m, 32);
	char tmp[256], a[300], b[300];

	assert_non_null(be);
	assert_int_equal(test_tmpdir_make(tmp, sizeof(tmp), "one-format"), 0);
	snprintf(a, sizeof(a), "%s/f32", tmp);
	snprintf(b, sizeof(b), "%s/bf16", tmp);
	/* Written as f32 (the CPU's default); asked for bf16 later: stays f32. */
	grow(a, be, 0, 150, test_rng_next(&rng));
	assert_int_equal(open_dtype(a, m, KVMEM_DTYPE_BF16), KVMEM_DTYPE_F32);
	grow(a, be, KVMEM_DTYPE_BF16, 70, test_rng_next(&rng));
	/* Written as bf16 (a GPU's); opened with the default: stays bf16, and
	 * the history goes on in it. */
	grow(b, be, KVMEM_DTYPE_BF16, 150, test_rng_next(&rng));
	assert_int_equal(open_dtype(b, m, 0), KVMEM_DTYPE_BF16);
	grow(b, be, 0, 70, test_rng_next(&rng));
	assert_int_equal(open_dtype(b, m, 0), KVMEM_DTYPE_BF16);
	assert_int_equal(kvmem_workspace_verify(a, NULL, 0), 0);
	assert_int_equal(kvmem_workspace_verify(b, NULL, 0), 0);
	{
		kvmem_workspace_info wi;

		assert_int_equal(kvmem_workspace_info_read(b, &wi), 0);
		assert_int_equal(wi.tokens, 150 + 3 + 70 + 3);
		assert_int_equal(wi.page_bytes, 2 * 2 * 16 * 16 * 2);
	}
	test_tmpdir_remove(tmp);
	kvmem_backend_close(be);
	test_model_free(m);
}

/* ---- registration ----------------------------------------------------- */
static int g_reg, g_unreg;
static void *g_base;
static size_t g_len;

static int fake_register(void *ctx, void *base, size_t len)
{
	g_reg++;
	g_base = base;
	g_len = len;
	return 0;
}

static void fake_unregister(void *ctx, void *base)
{
	assert_ptr_equal(base, g_base);
	g_unreg++;
}

static void test_registration(void **state)
{
	uint64_t rng = g_seed ^ 0x12e6;
	kvmem_config c = test_model_config(2, 64, 4, 2, 16, 96, 200, 0);
	kvmem_model *m = test_model_random(&c, test_rng_next(&rng));
	kvmem_backend *be = kvmem_backend_cpu(m, 32);
	kvmem_backend_ops ops = *be->ops;
	const kvmem_backend_ops *cpu_ops = be->ops;
	kvmem_workspace_opts wo = { .block = 16 };
	kvmem_session_opts so;
	kvmem_workspace *w;
	kvmem_session *s;
	char tmp[256], dir[300];
	int32_t tok[300];
	void *base = NULL;
	size_t len = 0;

	assert_non_null(be);
	ops.host_register = fake_register;
	ops.host_unregister = fake_unregister;
	be->ops = &ops;
	for (int i = 0; i < 300; i++)
		tok[i] = test_rng_int(&rng, 0, c.vocab - 1);
	assert_int_equal(test_tmpdir_make(tmp, sizeof(tmp), "registration"), 0);
	snprintf(dir, sizeof(dir), "%s/ws", tmp);
	if (kvmem_workspace_open(dir, m, &wo, &w) < 0)
		fail_msg("%s", kvmem_last_error());
	kvmem_session_opts_default(&so);
	so.block = 16;
	so.budget = 64;
	so.chunk = 32;
	so.source = kvmem_workspace_source(w);
	s = kvmem_session_create(be, &so);
	assert_non_null(s);
	assert_int_equal(kvmem_session_append(s, tok, 300, 0), 0);
	assert_int_equal(kvmem_session_select(s), 0);
	assert_int_equal(kvmem_session_append(s, tok, 100, 0), 0);
	assert_int_equal(kvmem_session_select(s), 0);
	/* Once, with the host pool; nothing undone while the session lives. */
	assert_int_equal(g_reg, 1);
	assert_int_equal(g_unreg, 0);
	kvmem_pager_region((kvmem_workspace_pager(w)), &base, &len);
	assert_ptr_equal(g_base, base);
	assert_int_equal(g_len, len);
	kvmem_session_free(s);
	assert_int_equal(g_unreg, 1);
	/* A memory source has no region: nothing registered. */
	so.source = NULL;
	s = kvmem_session_create(be, &so);
	assert_non_null(s);
	assert_int_equal(kvmem_session_append(s, tok, 300, 0), 0);
	assert_int_equal(kvmem_session_select(s), 0);
	kvmem_session_free(s);
	assert_int_equal(g_reg, 1);
	assert_int_equal(g_unreg, 1);
	assert_int_equal(kvmem_workspace_close(w), 0);
	be->ops = cpu_ops;
	test_tmpdir_remove(tmp);
	kvmem_backend_close(be);
	test_model_free(m);
}

/* ---- a backend that keeps pages itself ------------------------------------ */
static const kvmem_page_source_ops *g_real;	/* the workspace source's ops */
static void *g_real_ctx;
static const kvmem_backend_ops *g_cpu;
static int g_gets_cached, g_backend_items, g_puts;
static int g_most_items, g_most_held;	/* the largest place() call, its pages got */

static int g_kept_every = 2;	/* the backend keeps one page in this many */

static int cached(int64_t block, int layer)
{
	return (block + layer) % g_kept_every == 0;
}

static int counting_get(void *ctx, int64_t b, int layer, kvmem_page *pg)
{
	g_gets_cached += cached(b, layer);
	return g_real->get(ctx, b, layer, pg);
}

static void counting_put(void *ctx, int64_t b, int layer)
{
	g_puts++;
	g_real->put(ctx, b, layer);
}

static int fake_cached(void *ctx, const void *region, uint32_t owner, int64_t block, int layer,
		       uint64_t *token)
{
	(void)token;
	assert_ptr_equal(region, g_base);
	assert_int_not_equal(owner, 0);	/* the session names itself */
	return cached(block, layer);
}

/* The cpu backend's place, with the pages it "keeps" taken from the source
 * as the GPU takes them from its pool. */
static int keeping_place(void *ctx, kvmem_view *v, const kvmem_place *items, int n)
{
	kvmem_place *it = malloc(sizeof(*it) * (n ? n : 1));
	int rc;

	int held = 0;

	assert_non_null(it);
	memcpy(it, items, sizeof(*it) * n);
	for (int i = 0; i < n; i++)
		held += it[i].page.mem != KVMEM_MEM_BACKEND;
	g_most_items = n > g_most_items ? n : g_most_items;
	g_most_held = held > g_most_held ? held : g_most_held;
	for (int i = 0; i < n; i++)
		if (it[i].page.mem == KVMEM_MEM_BACKEND) {
			assert_true(cached(it[i].block, it[i].layer));
			assert_ptr_equal(it[i].page.k, g_base);
			assert_int_equal(g_real->get(g_real_ctx, it[i].block, it[i].layer, &it[i].page), 0);
			g_backend_items++;
		}
	rc = g_cpu->place(ctx, v, it, n);
	for (int i = 0; i < n; i++)
		if (items[i].page.mem == KVMEM_MEM_BACKEND)
			g_real->put(g_real_ctx, it[i].block, it[i].layer);
	free(it);
	return rc;
}

/* Four steps of a session over src; w: its workspace, committed at the
 * end (NULL: none). */
static void run_logged(kvmem_backend *be, const kvmem_page_source *src, uint64_t seed,
		       float *logits, int32_t *out, kvmem_workspace *w)
{
	kvmem_session_opts so;
	kvmem_session *s;
	uint64_t r = seed;
	int32_t tok[300];
	const int V = be->model->cfg.vocab;

	kvmem_session_opts_default(&so);
	so.block = 16;
	so.budget = 64;
	so.chunk = 32;
	so.policy = "subblock";
	so.source = src;
	s = kvmem_session_create(be, &so);
	assert_non_null(s);
	for (int step = 0; step < 4; step++) {
		int n = test_rng_int(&r, 100, 300);

		for (int i = 0; i < n; i++)
			tok[i] = test_rng_int(&r, 0, V - 1);
		if (kvmem_session_append(s, tok, n, 0) || kvmem_session_select(s) ||
		    kvmem_session_decode(s, 4, NULL, out + 4 * step))
			fail_msg("step %d: %s", step, kvmem_last_error());
		memcpy(logits + (size_t)step * V, kvmem_session_logits(s), sizeof(float) * V);
	}
	if (w && kvmem_workspace_commit(w, s) < 0)
		fail_msg("%s", kvmem_last_error());
	kvmem_session_free(s);
}

/* A workspace whose source counts its gets and puts, and the cpu backend
 * dressed as one that keeps some of its pages (keeping_place): sessions
 * run over k->wrapped with be->ops = &k->ops until the caller puts g_cpu
 * back. */
struct keeping {
	char tmp[256];
	kvmem_workspace *w;
	kvmem_page_source wrapped;
	kvmem_page_source_ops sops;
	kvmem_backend_ops ops;
};

static void keeping_open(struct keeping *k, kvmem_backend *be, const kvmem_model *m,
			 const char *name)
{
	kvmem_workspace_opts wo = { .block = 16 };
	char dir[300];

	assert_int_equal(test_tmpdir_make(k->tmp, sizeof(k->tmp), name), 0);
	snprintf(dir, sizeof(dir), "%s/ws", k->tmp);
	if (kvmem_workspace_open(dir, m, &wo, &k->w) < 0)
		fail_msg("%s", kvmem_last_error());
	k->wrapped = *kvmem_workspace_source(k->w);
	g_real = k->wrapped.ops;
	g_real_ctx = k->wrapped.ctx;
	k->sops = *k->wrapped.ops;
	k->sops.get = counting_get;
	k->sops.put = counting_put;
	k->wrapped.ops = &k->sops;
	g_cpu = be->ops;
	k->ops = *be->ops;
	k->ops.host_register = fake_register;
	k->ops.host_unregister = fake_unregister;
	k->ops.page_cached = fake_cached;
	k->ops.place = keeping_place;
	be->ops = &k->ops;
}

static void keeping_close(struct keeping *k)
{
	assert_int_equal(kvmem_workspace_close(k->w), 0);
	test_tmpdir_remove(k->tmp);
}

static void test_backend_cache(void **state)
{
	uint64_t rng = g_seed ^ 0xcac4e;
	kvmem_config c = test_model_config(2, 64, 4, 2, 16, 96, 200, 0);
	kvmem_model *m = test_model_random(&c, test_rng_next(&rng));
	kvmem_backend *be = kvmem_backend_cpu(m, 32);
	struct keeping k;
	kvmem_page_source mem;
	float *want = malloc(sizeof(float) * 4 * c.vocab), *got = malloc(sizeof(float) * 4 * c.vocab);
	int32_t out_want[16], out_got[16];
	uint64_t seed = test_rng_next(&rng);

	assert_non_null(be);
	assert_non_null(want);
	assert_non_null(got);
	/* The reference: the same session over host memory. */
	assert_int_equal(kvmem_page_source_mem(&mem, c.n_layers, c.n_kv_heads, c.head_dim, 16), 0);
	run_logged(be, &mem, seed, want, out_want, NULL);
	kvmem_page_source_destroy(&mem);

	keeping_open(&k, be, m, "backend-cache");
	g_reg = g_unreg = 0;
	run_logged(be, &k.wrapped, seed, got, out_got, NULL);
	be->ops = g_cpu;
	/* Every page the backend said it keeps came from it, not the source,
	 * and the results are those of host memory, bit for bit. */
	assert_int_equal(g_gets_cached, 0);
	assert_true(g_backend_items > 0);
	assert_true(g_puts > 0);
	assert_memory_equal(got, want, sizeof(float) * 4 * c.vocab);
	assert_memory_equal(out_got, out_want, sizeof(out_want));
	keeping_close(&k);
	free(want);
	free(got);
	kvmem_backend_close(be);
	test_model_free(m);
}

/*
 * Batches: items of pages the backend keeps hold nothing of the source's,
 * so a place() call takes up to 8,192 of them, while the pages got from
 * the source stay at most 1,024 a call (held until placed). A view of 2,048
 * tokens over 4,096 in blocks of 16 and 24 layers: a step's random view
 * enters about 64 blocks (1,536 pages), a quarter of them kept by the
 * backend, so the pages got fill a batch (1,024) before the step's end. The answers are those of
 * host memory, bit for bit.
 */
static void run_wide(kvmem_backend *be, const kvmem_page_source *src, uint64_t seed,
		     float *logits)
{
	kvmem_session_opts so;
	kvmem_session *s;
	uint64_t r = seed;
	const int V = be->model->cfg.vocab, n0 = 4096;
	int32_t *tok = malloc(sizeof(*tok) * n0);

	assert_non_null(tok);
	kvmem_session_opts_default(&so);
	so.block = 16;
	so.budget = 2048;
	so.chunk = 512;
	so.policy = "random";
	so.source = src;
	s = kvmem_session_create(be, &so);
	if (!s)
		fail_msg("%s", kvmem_last_error());
	for (int step = 0; step < 3; step++) {
		const int n = step ? 16 : n0;

		for (int i = 0; i < n; i++)
			tok[i] = test_rng_int(&r, 0, V - 1);
		if (kvmem_session_append(s, tok, n, 0) || kvmem_session_select(s))
			fail_msg("step %d: %s", step, kvmem_last_error());
		memcpy(logits + (size_t)step * V, kvmem_session_logits(s), sizeof(float) * V);
	}
	kvmem_session_free(s);
	free(tok);
}

static void test_place_batches(void **state)
{
	uint64_t rng = g_seed ^ 0xba7c4;
	kvmem_config c = test_model_config(24, 32, 2, 1, 16, 48, 64, 0);
	kvmem_model *m = test_model_random(&c, test_rng_next(&rng));
	kvmem_backend *be = kvmem_backend_cpu(m, 512);
	struct keeping k;
	kvmem_page_source mem;
	float *want = malloc(sizeof(float) * 3 * c.vocab), *got = malloc(sizeof(float) * 3 * c.vocab);
	uint64_t seed = test_rng_next(&rng);

	assert_non_null(be);
	assert_non_null(want);
	assert_non_null(got);
	assert_int_equal(kvmem_page_source_mem(&mem, c.n_layers, c.n_kv_heads, c.head_dim, 16), 0);
	run_wide(be, &mem, seed, want);
	kvmem_page_source_destroy(&mem);

	keeping_open(&k, be, m, "place-batches");
	g_most_items = g_most_held = g_gets_cached = 0;
	g_kept_every = 4;
	run_wide(be, &k.wrapped, seed, got);
	g_kept_every = 2;
	be->ops = g_cpu;
	print_message("largest place(): %d items, %d of them pages got from the source\n",
		      g_most_items, g_most_held);
	assert_int_equal(g_gets_cached, 0);
	assert_int_equal(g_most_held, 1024);	/* a batch's pages got, at most */
	assert_true(g_most_items > 1024);	/* the kept pages' items ride along */
	assert_memory_equal(got, want, sizeof(float) * 3 * c.vocab);
	keeping_close(&k);
	free(want);
	free(got);
	kvmem_backend_close(be);
	test_model_free(m);
}

/* ---- a GPU's rows and pages, played by the cpu backend ----------------- */
static kvmem_config g_cfg;
static int g_pinned, g_page_calls;

static int heap_alloc(void *ctx, size_t bytes, void **p)
{
	*p = malloc(bytes);
	return *p ? 0 : -ENOMEM;
}

static void heap_free(void *ctx, void *p)
{
	free(p);
}

/* Registering pins: host_pinned says so from then on. */
static int pin_register(void *ctx, void *base, size_t len)
{
	g_pinned = 1;
	g_base = base;
	return 0;
}

static void pin_unregister(void *ctx, void *base)
{
}

static int fake_pinned(void *ctx, const void *base)
{
	return g_pinned;
}

/* The cpu forward, its rows handed over as the cuda backend hands them:
 * bf16 rows, and the pages written by the backend (through the twin of its
 * copy) when the session gives them. */
static int gpu_like_forward(void *ctx, kvmem_view *v, const int32_t *tok, int n, float *logits,
			    int all, const kvmem_fwd_out *out)
{
	const int L = g_cfg.n_layers, H = g_cfg.n_kv_heads, D = g_cfg.head_dim;
	const size_t m = (size_t)L * n * H * D;
	float *k = malloc(4 * m), *vv = malloc(4 * m);
	uint16_t *kb = malloc(2 * m), *vb = malloc(2 * m);
	kvmem_fwd_out o = { .raw_k = k, .v = vv };
	int rc;

	assert_true(k && vv && kb && vb);
	if (out) {
		o.q_raw = out->q_raw;
		o.q_last = out->q_last;
	}
	rc = g_cpu->forward(ctx, v, tok, n, logits, all, out ? &o : NULL);
	if (!rc && out) {
		kvmem_f32_to_bf16_n(kb, k, m);
		kvmem_f32_to_bf16_n(vb, vv, m);
		if (out->raw_k_bf16)
			memcpy(out->raw_k_bf16, kb, 2 * m);
		if (out->v_bf16)
			memcpy(out->v_bf16, vb, 2 * m);
		if (out->pages) {
			const int nb = (out->page_t0 + n - 1) / out->page_block + 1;

			for (int l = 0; l < L; l++)
				(out->page_dtype == KVMEM_DTYPE_FP8 ? kvmem_rows_to_pages_fp8
								    : kvmem_rows_to_pages_bf16)(
					out->pages + (size_t)l * nb, out->page_t0, n,
					kb + (size_t)l * n * H * D, vb + (size_t)l * n * H * D, H,
					out->page_block, D);
			g_page_calls++;
		}
	}
	free(k);
	free(vv);
	free(kb);
	free(vb);
	return rc;
}

/*
 * The whole way of pages written by the backend, on the CPU: a backend
 * that hands over bf16 rows and writes pages (the cpu one, its rows
 * rounded as a GPU's are, its pages through kvmem_rows_to_pages_bf16),
 * sessions over bf16 workspaces, the writer thread taking every job (as
 * with a GPU: row_pages runs while it puts the forward before away).
 * With the pool pinned, appends go through pages, and the logits, the
 * greedy tokens and every page equal those of the same session with
 * KVMEM_PAGE_ROWS=0 (rows copied on the host); the workspace verifies.
 * With the pool not pinned, a first append makes no pages (pinning is
 * not worth a chunk's pages); after a selection pinned it, they do. The
 * same over an fp8 workspace (a backend opened with kv_dtype fp8, its pages
 * through kvmem_rows_to_pages_fp8: page_dtype), bytes and scales.
 */
static void gpu_like_case(uint32_t dt)
{
	uint64_t rng = g_seed ^ 0x6a7e ^ dt;
	kvmem_config c = test_model_config(2, 64, 4, 2, 16, 96, 200, 0);
	kvmem_model *m = test_model_random(&c, test_rng_next(&rng));
	kvmem_backend *be = NULL;
	kvmem_backend_ops ops;
	kvmem_workspace_opts wo = { .block = 16, .dtype = dt };
	/* a page's K (or V) bytes, and fp8's scales */
	const size_t kb = (size_t)c.n_kv_heads * 16 * c.head_dim * (dt == KVMEM_DTYPE_FP8 ? 1 : 2);
	const size_t sb = dt == KVMEM_DTYPE_FP8 ? (size_t)c.n_kv_heads * 16 * sizeof(float) : 0;
	kvmem_workspace *w[2];
	char tmp[256], dir[2][300];
	float *lg[2];
	int32_t out[2][16], tok[100];
	uint64_t seed = test_rng_next(&rng);
	int calls;

	if (dt == KVMEM_DTYPE_FP8)
		assert_int_equal(kvmem_backend_open("cpu", m, &(kvmem_backend_opts){
							    .max_chunk = 32, .kv_dtype = dt }, &be), 0);
	else
		be = kvmem_backend_cpu(m, 32);
	assert_non_null(be);
	g_cfg = c;
	g_cpu = be->ops;
	ops = *be->ops;
	ops.rows_dtype = KVMEM_DTYPE_BF16;
	ops.page_rows = 1;
	ops.page_rows_fp8 = 1;
	ops.host_alloc = heap_alloc;
	ops.host_free = heap_free;
	ops.host_register = pin_register;
	ops.host_unregister = pin_unregister;
	ops.host_pinned = fake_pinned;
	ops.forward = gpu_like_forward;
	be->ops = &ops;
	assert_int_equal(test_tmpdir_make(tmp, sizeof(tmp), "gpu-like-pages"), 0);
	for (int k = 0; k < 2; k++) {
		lg[k] = malloc(sizeof(float) * 4 * c.vocab);
		assert_non_null(lg[k]);
		snprintf(dir[k], sizeof(dir[k]), "%s/%s", tmp, k ? "rows" : "pages");
		if (kvmem_workspace_open(dir[k], m, &wo, &w[k]) < 0)
			fail_msg("%s", kvmem_last_error());
		g_pinned = 1;	/* as a server's pool */
		g_page_calls = 0;
		if (k)
			setenv("KVMEM_PAGE_ROWS", "0", 1);
		run_logged(be, kvmem_workspace_source(w[k]), seed, lg[k], out[k], w[k]);
		unsetenv("KVMEM_PAGE_ROWS");
		if (k)
			assert_int_equal(g_page_calls, 0);
		else
			assert_true(g_page_calls > 0);
		assert_int_equal(kvmem_workspace_close(w[k]), 0);
		assert_int_equal(kvmem_workspace_verify(dir[k], NULL, 0), 0);
	}
	assert_memory_equal(lg[0], lg[1], sizeof(float) * 4 * c.vocab);
	assert_memory_equal(out[0], out[1], sizeof(out[0]));
	for (int k = 0; k < 2; k++)
		if (kvmem_workspace_open(dir[k], m, &wo, &w[k]) < 0)
			fail_msg("%s", kvmem_last_error());
	{
		const kvmem_page_source *a = kvmem_workspace_source(w[0]),
					*b = kvmem_workspace_source(w[1]);
		const uint64_t blocks = kvmem_pager_blocks(kvmem_workspace_pager(w[0]));

		assert_int_equal(blocks, kvmem_pager_blocks(kvmem_workspace_pager(w[1])));
		assert_true(blocks > 0);
		for (uint64_t bl = 0; bl < blocks; bl++)
			for (int l = 0; l < c.n_layers; l++) {
				kvmem_page pa, pb;

				assert_int_equal(a->ops->get(a->ctx, (int64_t)bl, l, &pa), 0);
				assert_int_equal(b->ops->get(b->ctx, (int64_t)bl, l, &pb), 0);
				assert_int_equal(pa.dtype, dt);
				assert_memory_equal(pa.k, pb.k, kb);
				assert_memory_equal(pa.v, pb.v, kb);
				if (sb) {
					assert_memory_equal(pa.k_scale, pb.k_scale, sb);
					assert_memory_equal(pa.v_scale, pb.v_scale, sb);
				}
				a->ops->put(a->ctx, (int64_t)bl, l);
				b->ops->put(b->ctx, (int64_t)bl, l);
			}
	}
	for (int k = 0; k < 2; k++)
		assert_int_equal(kvmem_workspace_close(w[k]), 0);
	/* Not pinned: the first append keeps its rows; a selection pins. */
	if (dt == KVMEM_DTYPE_BF16) {
		kvmem_session_opts so;
		kvmem_session *s;
		char d[300];

		snprintf(d, sizeof(d), "%s/unpinned", tmp);
		if (kvmem_workspace_open(d, m, &wo, &w[0]) < 0)
			fail_msg("%s", kvmem_last_error());
		kvmem_session_opts_default(&so);
		so.block = 16;
		so.budget = 64;
		so.chunk = 32;
		so.source = kvmem_workspace_source(w[0]);
		g_pinned = 0;
		g_page_calls = 0;
		s = kvmem_session_create(be, &so);
		assert_non_null(s);
		for (int i = 0; i < 100; i++)
			tok[i] = test_rng_int(&rng, 0, c.vocab - 1);
		assert_int_equal(kvmem_session_append(s, tok, 100, 0), 0);
		assert_int_equal(g_page_calls, 0);
		assert_int_equal(kvmem_session_select(s), 0);
		assert_int_equal(g_pinned, 1);
		calls = g_page_calls;
		assert_int_equal(kvmem_session_append(s, tok, 100, 0), 0);
		assert_true(g_page_calls > calls);
		kvmem_session_free(s);
		assert_int_equal(kvmem_workspace_close(w[0]), 0);
	}
	be->ops = g_cpu;
	test_tmpdir_remove(tmp);
	free(lg[0]);
	free(lg[1]);
	kvmem_backend_close(be);
	test_model_free(m);
}

static void test_gpu_like_pages(void **state)
{
	gpu_like_case(KVMEM_DTYPE_BF16);
	gpu_like_case(KVMEM_DTYPE_FP8);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bf16_pages),
		cmocka_unit_test(test_typed_rows),
		cmocka_unit_test(test_row_pages),
		cmocka_unit_test(test_one_format),
		cmocka_unit_test(test_registration),
		cmocka_unit_test(test_backend_cache),
		cmocka_unit_test(test_place_batches),
		cmocka_unit_test(test_gpu_like_pages),
	};

	g_seed = test_rng_fresh_seed("test_source_paging");
	return cmocka_run_group_tests(tests, NULL, NULL);
}

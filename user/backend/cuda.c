// SPDX-License-Identifier: MIT
/*
 * The cuda backend: the Qwen3 forward pass on one GPU with the ops of
 * kernels/cuda/ (kernels/kernels_cuda.h), built only when nvcc is found.
 *
 * Number formats (kernels_bf16.h): weights bf16 on the GPU, converted once
 * at load from the model's fp32 (Wq, Wk, Wv as one [q;k;v] weight); the
 * residual stream fp32; GEMM inputs bf16 with fp32 accumulation; the view
 * bf16. The forward pass itself, per layer and as a CUDA graph for decode,
 * is in cuda_fwd.c.
 *
 * A view is [n_layers][n_kv_heads][cap][head_dim] bf16 K and V on the GPU.
 * place() packs the pages' token ranges into a host staging buffer as bf16
 * (f32 pages hold bf16 values widened by forward(), so this is exact),
 * uploads it in one copy and scatters it with one kernel: a token placed at
 * the slot forward() gave it gets the same bits, so with a budget over the
 * workspace a session equals a plain run bit for bit on the GPU as on the
 * CPU (the same kernels, in the same order, over the same bytes).
 *
 * Outputs for the session (raw K, V, raw queries: fp32 host arrays, logits)
 * are copied down after the pass and widened on the host.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend_impl.h"
#include "kernels/kernels_cuda.h"
#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "backend/cuda_backend.h"
#include "util/clock.h"

int cuda_dev_alloc(void *p, size_t bytes, uint64_t *count)
{
	if (count)
		*count += bytes;
	return kvmem_cuda_malloc((void **)p, bytes);
}

/* ---- weights -------------------------------------------------------------- */
/* Upload an fp32 host tensor as bf16, through a device staging buffer. */
static int upload_bf16(struct cuda *b, uint16_t *dst, const float *src, size_t n, float *stage,
		       size_t stage_n)
{
	for (size_t at = 0; at < n; at += stage_n) {
		size_t m = n - at < stage_n ? n - at : stage_n;
		int rc;

		if ((rc = kvmem_cuda_upload(b->ctx, stage, src + at, m * sizeof(float))) < 0 ||
		    (rc = kvmem_cuda_convert_to_bf16(b->ctx, dst + at, stage, KVMEM_DTYPE_F32, m)) < 0)
			return rc;
	}
	return 0;
}

/* Random weights on the GPU (a model with no weights: benchmarks of a
 * geometry, e.g. Qwen3-8B, with no 16 GB file): N(0, s^2)-like uniform
 * values, s = 1/sqrt(fan_in) for projections, norms 1. */
static int fill(struct cuda *b, uint16_t *dst, size_t n, uint64_t seed, double scale, int norm)
{
	return norm ? kvmem_cuda_fill_bf16(b->ctx, dst, n, 1.0f)
		    : kvmem_cuda_random_bf16(b->ctx, dst, n, seed, (float)scale);
}

static int load_weights(struct cuda *b, const kvmem_model *m, uint64_t seed)
{
	const kvmem_config *c = b->c;
	const size_t H = c->hidden, I = c->intermediate, V = c->vocab;
	const size_t stage_n = 16u << 20;	/* 64 MiB of fp32 per upload */
	float *stage = NULL;
	int rc = 0, random = !m->layers;

	if ((rc = cuda_dev_alloc(&b->embed, V * H * 2, &b->weight_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&b->final_norm, H * 2, &b->weight_bytes)) < 0)
		return rc;
	if (c->tie_embeddings)
		b->lm_head = b->embed;
	else if ((rc = cuda_dev_alloc(&b->lm_head, V * H * 2, &b->weight_bytes)) < 0)
		return rc;
	b->L = calloc(c->n_layers, sizeof(*b->L));
	if (!b->L)
		return kvmem_error(ENOMEM, "out of memory");
	for (int l = 0; l < c->n_layers; l++) {
		struct layer_w *w = &b->L[l];

		if ((rc = cuda_dev_alloc(&w->attn_norm, H * 2, &b->weight_bytes)) < 0 ||
		    /* q, k, v rows in one allocation: one GEMM (cuda_fwd.c) */
		    (rc = cuda_dev_alloc(&w->wq, (size_t)(b->qw + 2 * b->kw) * H * 2,
					 &b->weight_bytes)) < 0 ||
		    (rc = cuda_dev_alloc(&w->wo, H * b->qw * 2, &b->weight_bytes)) < 0 ||
		    (rc = cuda_dev_alloc(&w->q_norm, (size_t)c->head_dim * 2, &b->weight_bytes)) < 0 ||
		    (rc = cuda_dev_alloc(&w->k_norm, (size_t)c->head_dim * 2, &b->weight_bytes)) < 0 ||
		    (rc = cuda_dev_alloc(&w->mlp_norm, H * 2, &b->weight_bytes)) < 0 ||
		    (rc = cuda_dev_alloc(&w->w_gateup, 2 * I * H * 2, &b->weight_bytes)) < 0 ||
		    (rc = cuda_dev_alloc(&w->w_down, H * I * 2, &b->weight_bytes)) < 0)
			return rc;
		w->w_qkv = w->wq;
		w->wk = w->wq + (size_t)b->qw * H;
		w->wv = w->wk + (size_t)b->kw * H;
	}
	if (random) {
		uint64_t s = seed;
		double sh = 1.0 / sqrt((double)H), si = 1.0 / sqrt((double)I);
		double so = 1.0 / sqrt((double)b->qw * 2 * c->n_layers);

		if ((rc = fill(b, b->embed, V * H, s++, sh, 0)) < 0 ||
		    (rc = fill(b, b->final_norm, H, 0, 0, 1)) < 0 ||
		    (!c->tie_embeddings && (rc = fill(b, b->lm_head, V * H, s++, sh, 0)) < 0))
			return rc;
		for (int l = 0; l < c->n_layers; l++) {
			struct layer_w *w = &b->L[l];

			if ((rc = fill(b, w->attn_norm, H, 0, 0, 1)) < 0 ||
			    (rc = fill(b, w->wq, (size_t)b->qw * H, s++, sh, 0)) < 0 ||
			    (rc = fill(b, w->wk, (size_t)b->kw * H, s++, sh, 0)) < 0 ||
			    (rc = fill(b, w->wv, (size_t)b->kw * H, s++, sh, 0)) < 0 ||
			    (rc = fill(b, w->wo, H * b->qw, s++, so, 0)) < 0 ||
			    (rc = fill(b, w->q_norm, c->head_dim, 0, 0, 1)) < 0 ||
			    (rc = fill(b, w->k_norm, c->head_dim, 0, 0, 1)) < 0 ||
			    (rc = fill(b, w->mlp_norm, H, 0, 0, 1)) < 0 ||
			    (rc = fill(b, w->w_gateup, 2 * I * H, s++, sh, 0)) < 0 ||
			    (rc = fill(b, w->w_down, H * I, s++, si / sqrt(2.0 * c->n_layers), 0)) < 0)
				return rc;
		}
		return kvmem_cuda_sync(b->ctx);
	}
	if ((rc = kvmem_cuda_malloc((void **)&stage, stage_n * sizeof(float))) < 0)
		return rc;
	rc = upload_bf16(b, b->embed, m->embed, V * H, stage, stage_n);
	if (!rc)
		rc = upload_bf16(b, b->final_norm, m->final_norm, H, stage, stage_n);
	if (!rc && !c->tie_embeddings)
		rc = upload_bf16(b, b->lm_head, m->lm_head, V * H, stage, stage_n);
	for (int l = 0; l < c->n_layers && !rc; l++) {
		const kvmem_layer *s = &m->layers[l];
		struct layer_w *w = &b->L[l];

		if ((rc = upload_bf16(b, w->attn_norm, s->attn_norm, H, stage, stage_n)) ||
		    (rc = upload_bf16(b, w->wq, s->wq, (size_t)b->qw * H, stage, stage_n)) ||
		    (rc = upload_bf16(b, w->wk, s->wk, (size_t)b->kw * H, stage, stage_n)) ||
		    (rc = upload_bf16(b, w->wv, s->wv, (size_t)b->kw * H, stage, stage_n)) ||
		    (rc = upload_bf16(b, w->wo, s->wo, H * b->qw, stage, stage_n)) ||
		    (rc = upload_bf16(b, w->q_norm, s->q_norm, c->head_dim, stage, stage_n)) ||
		    (rc = upload_bf16(b, w->k_norm, s->k_norm, c->head_dim, stage, stage_n)) ||
		    (rc = upload_bf16(b, w->mlp_norm, s->mlp_norm, H, stage, stage_n)) ||
		    (rc = upload_bf16(b, w->w_gateup, s->w_gate, I * H, stage, stage_n)) ||
		    (rc = upload_bf16(b, w->w_gateup + I * H, s->w_up, I * H, stage, stage_n)) ||
		    (rc = upload_bf16(b, w->w_down, s->w_down, H * I, stage, stage_n)))
			break;
	}
	kvmem_cuda_free(stage);
	return rc;
}

/* ---- create / destroy ---------------------------------------------------- */
static int cuda_available(void)
{
	if (kvmem_cuda_device_count() <= 0)
		return kvmem_error(ENODEV, "no CUDA device here (no GPU, or no driver)");
	return 0;
}

static void cuda_destroy(void *ctx)
{
	struct cuda *b = ctx;

	if (!b)
		return;
	if (b->L)
		for (int l = 0; l < b->c->n_layers; l++) {
			struct layer_w *w = &b->L[l];
			uint16_t *all[] = { w->attn_norm, w->w_qkv, w->wo, w->q_norm, w->k_norm,
					    w->mlp_norm, w->w_gateup, w->w_down };

			for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
				kvmem_cuda_free(all[i]);
		}
	free(b->L);
	if (b->lm_head != b->embed)
		kvmem_cuda_free(b->lm_head);
	kvmem_cuda_free(b->embed);
	kvmem_cuda_free(b->final_norm);
	cuda_rows_destroy(b);		/* cuda_host.c */
	cuda_fwd_index_destroy(b);	/* cuda_fwd_index.c */
	{
		void *dev[] = { b->x, b->h, b->q, b->k, b->v, b->att, b->gu, b->act, b->tmp,
				b->ids, b->pos, b->logits, b->oq, b->ok, b->ov, b->st_k, b->st_v,
				b->items };

		for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
			kvmem_cuda_free(dev[i]);
	}
	cudaFreeHost(b->host_o);
	cudaFreeHost(b->host_i);
	cudaFreeHost(b->host_st);
	cudaFreeHost(b->host_items);
	cuda_fp8_destroy(b);
	cuda_pages_destroy(b);
	cuda_fwdp_destroy(b);
	cuda_fwd_destroy(b);
	kvmem_cuda_ctx_destroy(b->ctx);
	free(b);
}

int cuda_pinned(void *p, size_t bytes)
{
	if (cudaMallocHost((void **)p, bytes ? bytes : 1) != cudaSuccess)
		return kvmem_error(ENOMEM, "cannot pin %zu bytes of host memory", bytes);
	return 0;
}

static int cuda_create(const kvmem_model *m, const kvmem_backend_opts *o, void **out)
{
	const kvmem_config *c = &m->cfg;
	struct cuda *b = calloc(1, sizeof(*b));
	size_t C, H, I, V, L, maxo;
	int rc;

	if (!b)
		return kvmem_error(ENOMEM, "out of memory");
	b->c = c;
	b->max_chunk = o->max_chunk;
	b->mem_cap = o->mem_cap;
	b->page_pool = o->page_pool;
	b->index_mem = o->index_mem;
	b->fp8 = o->kv_dtype == KVMEM_DTYPE_FP8;	/* views: cuda_view_fp8.c */
	b->place_sync = getenv("KVMEM_CUDA_PLACE_SYNC") &&
			!strcmp(getenv("KVMEM_CUDA_PLACE_SYNC"), "1");
	b->qw = c->n_heads * c->head_dim;
	b->kw = c->n_kv_heads * c->head_dim;
	C = (size_t)o->max_chunk, H = c->hidden, I = c->intermediate, V = c->vocab;
	L = c->n_layers;
	if (c->head_dim != 64 && c->head_dim != 128) {
		rc = kvmem_error(ENOTSUP, "head_dim %d: the CUDA attention takes 64 or 128",
				 c->head_dim);
		goto fail;
	}
	if ((rc = kvmem_cuda_ctx_create(&b->ctx, o->device)) < 0 ||
	    (rc = load_weights(b, m, 0x6b766d656dull)) < 0)
		goto fail;
	if (o->mem_cap && b->weight_bytes > o->mem_cap) {
		rc = kvmem_error(ENOMEM, "the weights take %llu MiB of the %llu MiB GPU cap",
				 (unsigned long long)(b->weight_bytes >> 20),
				 (unsigned long long)(o->mem_cap >> 20));
		goto fail;
	}
	maxo = L * C * (size_t)(b->qw > b->kw ? b->qw : b->kw);
	if ((rc = cuda_dev_alloc(&b->x, C * H * 4, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&b->h, C * H * 2, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&b->q, C * b->qw * 2, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&b->k, C * b->kw * 2, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&b->v, C * b->kw * 2, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&b->att, C * b->qw * 2, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&b->gu, C * 2 * I * 2, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&b->act, C * I * 2, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&b->tmp, C * H * 2, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&b->ids, C * 4, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&b->pos, C * 4, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&b->logits, V * 4, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&b->oq, L * C * b->qw * 2, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&b->ok, L * C * b->kw * 2, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&b->ov, L * C * b->kw * 2, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_pinned(&b->host_o, maxo * 2)) < 0 || (rc = cuda_pinned(&b->host_i, 2 * C * 4)) < 0 ||
	    (rc = cuda_fwd_create(b)) < 0 || (rc = cuda_rows_create(b)) < 0)
		goto fail;
	b->logit_rows = 1;
	/* Prefill chunks of several views in one pass (cuda_fwd_prefill.c)
	 * need the GEMMs pinned; KVMEM_CUDA_GEMM_PIN, when set, decides. */
	if (o->batch_prefill && !getenv("KVMEM_CUDA_GEMM_PIN") &&
	    (rc = kvmem_cuda_tune(b->ctx, "gemm_pin", CUDA_PREFILL_PIN_ROWS)) < 0)
		goto fail;
	b->prefill_batch = o->batch_prefill && kvmem_cuda_gemm_pin(b->ctx) > 0;
	*out = b;
	return 0;
fail:
	cuda_destroy(b);
	return rc;
}

/* ---- forward: cuda_fwd.c ------------------------------------------------------ */
/* Room for the scatter's item list (one item per layer in forward). */
int cuda_items_room(struct cuda *b, int n)
{
	int rc;

	if (n <= b->cap_items)
		return 0;
	kvmem_cuda_free(b->items);
	cudaFreeHost(b->host_items);
	b->items = NULL;
	b->host_items = NULL;
	b->cap_items = 0;
	if ((rc = kvmem_cuda_malloc((void **)&b->items, (size_t)n * sizeof(*b->items))) < 0 ||
	    (rc = cuda_pinned(&b->host_items, (size_t)n * sizeof(*b->host_items))) < 0)
		return rc;
	b->cap_items = n;
	return 0;
}

/* The held GEMM rate: GEMMs back to back for HELD_WARM_S, the rate over
 * the HELD_S after. An H200 at full tensor load reaches its 700 W limit
 * within a few hundred ms and drops its SM clock from 1980 MHz to ~1500-1650
 * (nvidia-smi, sampled every 50 ms through bench engine): a 10-GEMM burst
 * never sees that, a 1.3 s prefill lives in it. */
#define HELD_WARM_S 0.5
#define HELD_S 1.0

static int gemm_held(struct cuda *b, uint16_t *y, const uint16_t *a, const uint16_t *w, int n,
		     double *tflops)
{
	double t0 = kvmem_now_s(), t1 = 0, t;
	long done = 0;
	int rc;

	for (;;) {
		for (int r = 0; r < 8; r++)
			if ((rc = kvmem_cuda_gemm_bf16(b->ctx, y, KVMEM_GEMM_BF16, a, w, n, n, n)) < 0)
				return rc;
		if ((rc = kvmem_cuda_sync(b->ctx)) < 0)
			return rc;
		t = kvmem_now_s();
		if (t1 == 0 && t - t0 >= HELD_WARM_S)
			t1 = t;	/* the window opens at a batch's end */
		else if (t1 > 0 && (done += 8, t - t1 >= HELD_S))
			break;
	}
	*tflops = 2.0 * n * (double)n * n * done / (t - t1) / 1e12;
	return 0;
}

/* cuBLASLt bf16 GEMM at 8192^3 on random data (median-free: best of 10
 * after 3 warm-ups, then held for a second: gemm_held) and a 2 GiB
 * device-to-device copy (best of 5). */
static int cuda_ceilings(void *ctx, kvmem_ceilings *out)
{
	struct cuda *b = ctx;
	const int n = 8192;
	const size_t mat = (size_t)n * n, copy = 2u << 30;
	uint16_t *a = NULL, *w = NULL, *y = NULL;
	void *x = NULL, *z = NULL;
	double best = 1e30, bestc = 1e30;
	size_t free_b, total_b;
	const char *held;
	int rc;

	memset(out, 0, sizeof(*out));
	snprintf(out->device, sizeof(out->device), "%s", kvmem_cuda_device_name(b->ctx));
	out->matmul_type = "bf16 in, fp32 accumulate (cuBLASLt)";
	if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
		out->mem_bytes = total_b;
	if ((rc = kvmem_cuda_malloc((void **)&a, mat * 2)) < 0 ||
	    (rc = kvmem_cuda_malloc((void **)&w, mat * 2)) < 0 ||
	    (rc = kvmem_cuda_malloc((void **)&y, mat * 2)) < 0 ||
	    (rc = kvmem_cuda_random_bf16(b->ctx, a, mat, 1, 1.0f)) < 0 ||
	    (rc = kvmem_cuda_random_bf16(b->ctx, w, mat, 2, 1.0f)) < 0)
		goto out;
	for (int r = 0; r < 13; r++) {
		double t0;

		if ((rc = kvmem_cuda_sync(b->ctx)) < 0)
			goto out;
		t0 = kvmem_now_s();
		if ((rc = kvmem_cuda_gemm_bf16(b->ctx, y, KVMEM_GEMM_BF16, a, w, n, n, n)) < 0 ||
		    (rc = kvmem_cuda_sync(b->ctx)) < 0)
			goto out;
		if (r >= 3 && kvmem_now_s() - t0 < best)
			best = kvmem_now_s() - t0;
	}
	held = getenv("KVMEM_CEILINGS_HELD");	/* "0": skip it (under a profiler) */
	if ((!held || held[0] != '0') && (rc = gemm_held(b, y, a, w, n, &out->matmul_held_tflops)) < 0)
		goto out;
	kvmem_cuda_free(a);
	kvmem_cuda_free(w);
	kvmem_cuda_free(y);
	a = w = y = NULL;
	if ((rc = kvmem_cuda_malloc(&x, copy)) < 0 || (rc = kvmem_cuda_malloc(&z, copy)) < 0 ||
	    (rc = kvmem_cuda_fill_bf16(b->ctx, x, copy / 2, 1.5f)) < 0)
		goto out;
	for (int r = 0; r < 6; r++) {
		double t0;

		if ((rc = kvmem_cuda_sync(b->ctx)) < 0)
			goto out;
		t0 = kvmem_now_s();
		if (cudaMemcpyAsync(z, x, copy, cudaMemcpyDeviceToDevice,
				    kvmem_cuda_stream(b->ctx)) != cudaSuccess) {
			rc = kvmem_error(EIO, "cuda ceilings: copy failed");
			goto out;
		}
		if ((rc = kvmem_cuda_sync(b->ctx)) < 0)
			goto out;
		if (r >= 1 && kvmem_now_s() - t0 < bestc)
			bestc = kvmem_now_s() - t0;
	}
	out->matmul_tflops = 2.0 * n * (double)n * n / best / 1e12;
	out->copy_gbps = 2.0 * copy / bestc / 1e9;
	rc = cuda_copy_ceilings(b, out);	/* pinned host <-> device (cuda_page.c) */
out:
	kvmem_cuda_free(a);
	kvmem_cuda_free(w);
	kvmem_cuda_free(y);
	kvmem_cuda_free(x);
	kvmem_cuda_free(z);
	return rc;
}

static int cuda_move_any(void *ctx, kvmem_view *v, const kvmem_move *items, int n)
{
	return v->fp8 ? cuda_fp8_move(ctx, v, items, n) : cuda_move(ctx, v, items, n);
}

/* fp8 views only: a bf16 view has no host copy to give. */
static const kvmem_kvcache *cuda_host_view(void *ctx, const kvmem_view *v)
{
	return v->fp8 ? cuda_fp8_host_view(ctx, (kvmem_view *)v) : NULL;
}

static uint64_t cuda_mem_used(void *ctx)
{
	const struct cuda *b = ctx;

	return cuda_dev_used(b);
}

/* Pinned host memory for the session's typed rows: the forward pass copies
 * straight into it. Kept when freed, for the next session (cuda_host.c). */
static int cuda_host_alloc(void *ctx, size_t bytes, void **p)
{
	return cuda_rows_alloc(ctx, bytes, p);
}

static void cuda_host_free(void *ctx, void *p)
{
	cuda_rows_free(ctx, p);
}

const kvmem_backend_ops kvmem_backend_cuda_ops = {
	.name = "cuda",
	.fp8 = 1,	/* views: cuda_view_fp8.c */
	.what = "Qwen3 on one NVIDIA GPU (bf16 weights and view, fp32 accumulation)",
	.rows_dtype = KVMEM_DTYPE_BF16,
	.page_rows = 1,
	.page_rows_fp8 = 1,	/* kernels/cuda/pages.cu quantises them */
	.available = cuda_available,
	.create = cuda_create,
	.destroy = cuda_destroy,
	.view_create = cuda_view_create,
	.view_destroy = cuda_view_destroy,
	.reserve = cuda_reserve,
	.capacity = cuda_capacity,
	.length = cuda_length,
	.set_length = cuda_set_length,
	.forward = cuda_forward,
	.forward_batch = cuda_forward_batch,
	.logits_fetch = cuda_logits_fetch,
	.place = cuda_place,
	.host_view = cuda_host_view,
	.ceilings = cuda_ceilings,
	.mem_used = cuda_mem_used,
	.host_register = cuda_host_register,
	.index_rows = 1,	/* cuda_fwd_index.c */
	.index_holds = cuda_fwd_index_holds,
	.host_unregister = cuda_host_unregister,
	.host_pinned = cuda_host_pinned,
	.page_cached = cuda_page_cached,
	.pool_watch = cuda_pool_watch,
	.place_stats = cuda_place_stats,
	.set = cuda_set,
	.mirror_create = cuda_mirror_create,
	.pool_fill = cuda_pool_fill,
	.mirror_destroy = cuda_mirror_destroy,
	.score = cuda_score,
	.mirror_bytes = cuda_mirror_bytes,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
	.keep_raw = cuda_keep_raw,
	.move = cuda_move_any,
	.devices = kvmem_cuda_device_count,
};

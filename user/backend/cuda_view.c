// SPDX-License-Identifier: MIT
/*
 * The cuda backend's views: [n_layers][n_kv_heads][cap][head_dim] bf16 K
 * and V on the GPU per session, grown by copying the slots in use, and
 * place(): the items checked here, then moved by the paging path
 * (cuda_page.c: one gather kernel reading the pages where they are). The
 * first version stays as the "pack" method: the pages' token ranges packed
 * as bf16 into a pinned staging buffer on the CPU, one upload each for K
 * and V, one scatter kernel that rotates K at its slot from raw K.
 *
 * Under a device memory cap (kvmem_backend_opts.mem_cap) a view grows only
 * while weights, views, the forward pass's scratch and the paging path's
 * buffers stay under it; the device page pool gives its memory back first.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "backend/cuda_backend.h"
#include "util/clock.h"

/* ---- views ------------------------------------------------------------------ */
/* Device bytes of a view of cap slots: K and V (and the raw K when kept),
 * bf16, every layer. */
static uint64_t view_bytes(const struct cuda *b, const kvmem_view *v, int64_t cap)
{
	return (uint64_t)cap * b->c->n_layers * b->kw * 2 * (v->keep ? 3 : 2);
}

int cuda_view_create(void *ctx, kvmem_view **v)
{
	if (!(*v = calloc(1, sizeof(**v))))
		return kvmem_error(ENOMEM, "cuda view: out of memory");
	(*v)->fp8 = ((struct cuda *)ctx)->fp8;	/* cuda_view_fp8.c */
	return 0;
}

void cuda_view_destroy(void *ctx, kvmem_view *v)
{
	if (!v)
		return;
	cuda_view_logits_free(ctx, v);
	if (v->fp8) {
		cuda_fp8_view_destroy(ctx, v);
		return;
	}
	/* A place() left running (cuda_ring.c) writes it. */
	kvmem_cuda_sync(((struct cuda *)ctx)->ctx);
	((struct cuda *)ctx)->view_bytes -= view_bytes(ctx, v, v->cap);
	cuda_fwd_forget(ctx, v->k);
	kvmem_cuda_free(v->k);
	kvmem_cuda_free(v->v);
	kvmem_cuda_free(v->rk);
	free(v);
}

/* dst[l][h][0..len) = src[l][h][0..len) between views of capacity cs / cd. */
static int copy_runs(struct cuda *b, uint16_t *dst, int64_t cd, const uint16_t *src, int64_t cs,
		     int64_t len)
{
	const size_t row = (size_t)b->c->head_dim * 2;
	cudaError_t e = cudaMemcpy2DAsync(dst, cd * row, src, cs * row, len * row,
					  (size_t)b->c->n_layers * b->c->n_kv_heads,
					  cudaMemcpyDeviceToDevice, kvmem_cuda_stream(b->ctx));

	return e == cudaSuccess ? 0 : kvmem_error(EIO, "cuda view: copy: %s", cudaGetErrorString(e));
}

uint64_t cuda_dev_used(const struct cuda *b)
{
	return b->weight_bytes + b->view_bytes + b->scratch_bytes + b->index_bytes +
	       cuda_pages_dev_bytes(b);
}

void cuda_view_drop_raw(struct cuda *b, kvmem_view *v)
{
	if (!v->keep)
		return;
	cuda_fwd_forget(b, v->k);	/* its decode graphs write the raw K */
	kvmem_cuda_sync(b->ctx);	/* and a place() left running */
	b->view_bytes -= view_bytes(b, v, v->cap);
	v->keep = 0;
	b->view_bytes += view_bytes(b, v, v->cap);
	kvmem_cuda_free(v->rk);
	v->rk = NULL;
}

int cuda_keep_raw(void *ctx, kvmem_view *v)
{
	struct cuda *b = ctx;

	if (v->fp8)
		return cuda_fp8_keep_raw(b, v);
	if (v->len)
		return kvmem_error(EINVAL, "cuda view: raw K asked for after %lld tokens",
				   (long long)v->len);
	if (v->keep)
		return 0;
	if (v->cap) {
		/* Made with the next growth (a view made with room: now). */
		int64_t cap = v->cap;
		int rc;

		kvmem_cuda_sync(b->ctx);	/* a place() left running */
		kvmem_cuda_free(v->k);
		kvmem_cuda_free(v->v);
		b->view_bytes -= view_bytes(b, v, v->cap);
		v->k = v->v = NULL;
		v->cap = 0;
		v->keep = 1;
		if ((rc = cuda_reserve(b, v, cap)) < 0) {
			v->keep = 0;
			return rc;
		}
		return 0;
	}
	v->keep = 1;
	return 0;
}

int cuda_reserve(void *ctx, kvmem_view *v, int64_t slots)
{
	struct cuda *b = ctx;
	size_t bytes;	/* K or V */
	uint16_t *nk = NULL, *nv = NULL, *nr = NULL;
	int rc;

	if (v->fp8)
		return cuda_fp8_reserve(b, v, slots);
	if (slots <= v->cap)
		return 0;
	if (slots > INT32_MAX)
		return kvmem_error(EINVAL, "cuda view: %lld slots, at most %d", (long long)slots,
				   INT32_MAX);
	/* Under the cap: while the view grows it holds the old and the new
	 * copy at once. The raw K kept beside it goes first: without it a
	 * selection places from pages, as it did before it was kept. */
	if (v->keep && b->mem_cap &&
	    cuda_dev_used(b) + 3 * (view_bytes(b, v, slots) / 3) + CUDA_CAP_MARGIN > b->mem_cap)
		cuda_view_drop_raw(b, v);
	bytes = view_bytes(b, v, slots) / (v->keep ? 3 : 2);
	if (b->mem_cap && cuda_dev_used(b) + (v->keep ? 3 : 2) * bytes + CUDA_CAP_MARGIN > b->mem_cap) {
		cuda_pages_drop_pool(b);
		if (cuda_dev_used(b) + 2 * bytes + CUDA_CAP_MARGIN > b->mem_cap)
			return kvmem_error(ENOMEM, "cuda view: %lld slots take %" PRIu64 " MiB; the %"
					   PRIu64 " MiB GPU cap leaves %" PRIu64 " MiB (weights %"
					   PRIu64 ", views %" PRIu64 ", index %" PRIu64
					   ", scratch and staging %" PRIu64 ", margin %llu)", (long long)slots,
					   (uint64_t)(2 * bytes) >> 20, b->mem_cap >> 20,
					   (uint64_t)(b->mem_cap - (cuda_dev_used(b) + CUDA_CAP_MARGIN <
							  b->mem_cap ? cuda_dev_used(b) +
							  CUDA_CAP_MARGIN : b->mem_cap)) >> 20,
					   b->weight_bytes >> 20, b->view_bytes >> 20,
					   b->index_bytes >> 20, (b->scratch_bytes + cuda_pages_dev_bytes(b)) >> 20,
					   CUDA_CAP_MARGIN >> 20);
	}
	for (int tries = 0;; tries++) {
		if ((rc = kvmem_cuda_malloc((void **)&nk, bytes)) == 0 &&
		    (rc = kvmem_cuda_malloc((void **)&nv, bytes)) == 0 &&
		    (!v->keep || (rc = kvmem_cuda_malloc((void **)&nr, bytes)) == 0))
			break;
		kvmem_cuda_free(nk);
		kvmem_cuda_free(nv);
		nk = nv = NULL;
		/* No cap: the page pool took half of what was free; a view
		 * comes first. */
		if (tries || !cuda_pages_dev_bytes(b))
			goto fail;
		cudaGetLastError();
		cuda_pages_drop_pool(b);
	}
	if (v->len && ((rc = copy_runs(b, nk, slots, v->k, v->cap, v->len)) < 0 ||
		       (rc = copy_runs(b, nv, slots, v->v, v->cap, v->len)) < 0 ||
		       (nr && (rc = copy_runs(b, nr, slots, v->rk, v->cap, v->len)) < 0)))
		goto fail;
	/* The copies, and a place() left running (cuda_ring.c), done. */
	if ((rc = kvmem_cuda_sync(b->ctx)) < 0)
		goto fail;
	cuda_fwd_forget(b, v->k);
	kvmem_cuda_free(v->k);
	kvmem_cuda_free(v->v);
	kvmem_cuda_free(v->rk);
	b->view_bytes += view_bytes(b, v, slots) - view_bytes(b, v, v->cap);
	v->k = nk;
	v->v = nv;
	v->rk = nr;
	v->cap = slots;
	return 0;
fail:
	kvmem_cuda_free(nk);
	kvmem_cuda_free(nv);
	kvmem_cuda_free(nr);
	return rc;
}

int64_t cuda_capacity(void *ctx, const kvmem_view *v)
{
	return v->cap;
}

int64_t cuda_length(void *ctx, const kvmem_view *v)
{
	return v->len;
}

int cuda_set_length(void *ctx, kvmem_view *v, int64_t len)
{
	if (len < 0 || len > v->cap)
		return kvmem_error(EINVAL, "cuda view: length %lld outside 0..%lld", (long long)len,
				   (long long)v->cap);
	v->len = len;
	return 0;
}

/* ---- place ------------------------------------------------------------------ */
static int staging_room(struct cuda *b, size_t elems)
{
	int rc;

	if (elems <= b->cap_st)
		return 0;
	kvmem_cuda_free(b->st_k);
	kvmem_cuda_free(b->st_v);
	cudaFreeHost(b->host_st);
	b->st_k = b->st_v = b->host_st = NULL;
	b->cap_st = 0;
	elems = elems < (1u << 20) ? (1u << 20) : elems;
	if ((rc = kvmem_cuda_malloc((void **)&b->st_k, elems * 2)) < 0 ||
	    (rc = kvmem_cuda_malloc((void **)&b->st_v, elems * 2)) < 0 ||
	    (rc = cuda_pinned(&b->host_st, 2 * elems * 2)) < 0)
		return rc;
	b->cap_st = elems;
	return 0;
}

/* Tokens u0..u0+n-1 of every head of one page half (K or V) as bf16 into
 * dst [n_kv_heads][n][head_dim]. */
static int pack(const kvmem_place *it, int is_v, int H, int D, uint16_t *dst)
{
	const kvmem_page *pg = &it->page;
	const char *src = is_v ? pg->v : pg->k;

	for (int h = 0; h < H; h++) {
		size_t off = ((size_t)h * it->stride + it->u0) * D, n = (size_t)it->n * D;
		uint16_t *o = dst + (size_t)h * n;

		switch (pg->dtype) {
		case KVMEM_DTYPE_BF16:
			memcpy(o, (const uint16_t *)src + off, n * 2);
			break;
		case KVMEM_DTYPE_F32:
			kvmem_f32_to_bf16_n(o, (const float *)src + off, n);
			break;
		case KVMEM_DTYPE_F16:
			for (size_t i = 0; i < n; i++)
				o[i] = kvmem_f32_to_bf16(kvmem_f16_to_f32(((const uint16_t *)src)[off + i]));
			break;
		default:
			return kvmem_error(EINVAL, "cuda place: page dtype %u", pg->dtype);
		}
	}
	return 0;
}

/* The first version: pack as bf16 on the CPU, upload, scatter. */
static int place_pack(struct cuda *b, kvmem_view *v, const kvmem_place *items, int n)
{
	const int H = b->c->n_kv_heads, D = b->c->head_dim;
	size_t total = 0, at = 0;
	int rc;

	for (int i = 0; i < n; i++)
		total += (size_t)items[i].n * H * D;
	if ((rc = staging_room(b, total)) < 0 || (rc = cuda_items_room(b, n)) < 0)
		return rc;
	for (int i = 0; i < n; i++) {
		const kvmem_place *it = &items[i];

		if ((rc = pack(it, 0, H, D, b->host_st + at)) < 0 ||
		    (rc = pack(it, 1, H, D, b->host_st + b->cap_st + at)) < 0)
			return rc;
		b->host_items[i] = (kvmem_scatter_item){
			.layer = it->layer, .slot = (int32_t)it->slot, .n = it->n,
			.tok_stride = D, .src = (int64_t)at, .head_stride = it->n * D,
		};
		at += (size_t)it->n * H * D;
	}
	if ((rc = kvmem_cuda_upload(b->ctx, b->st_k, b->host_st, total * 2)) < 0 ||
	    (rc = kvmem_cuda_upload(b->ctx, b->st_v, b->host_st + b->cap_st, total * 2)) < 0 ||
	    (rc = kvmem_cuda_upload(b->ctx, b->items, b->host_items, (size_t)n * sizeof(*b->items))) < 0 ||
	    (rc = kvmem_cuda_view_scatter_bf16(b->ctx, v->k, v->v, b->st_k, b->st_v, b->items, n,
					       b->c->n_layers, H, D, (int)v->cap,
					       b->c->rope_theta)) < 0)
		return rc;
	return kvmem_cuda_sync(b->ctx);
}

int cuda_place(void *ctx, kvmem_view *v, const kvmem_place *items, int n)
{
	struct cuda *b = ctx;
	const int H = b->c->n_kv_heads, D = b->c->head_dim;
	double t0 = (double)kvmem_now_ns();
	int rc, device = 0;

	if (v->fp8)
		return cuda_fp8_place(b, v, items, n);
	for (int i = 0; i < n; i++) {
		const kvmem_place *it = &items[i];

		if (it->layer < 0 || it->layer >= b->c->n_layers || it->n <= 0 || it->u0 < 0 ||
		    it->u0 + it->n > it->stride || it->slot < 0 || it->slot + it->n > v->cap)
			return kvmem_error(EINVAL, "cuda place: bad placement (layer %d, tokens %d+%d "
					   "of %d, slot %lld of %lld)", it->layer, it->u0, it->n,
					   it->stride, (long long)it->slot, (long long)v->cap);
		if (it->page.dtype != KVMEM_DTYPE_F32 && it->page.dtype != KVMEM_DTYPE_BF16 &&
		    it->page.dtype != KVMEM_DTYPE_F16)
			return kvmem_error(EINVAL, "cuda place: page dtype %u", it->page.dtype);
		device |= it->page.mem != KVMEM_MEM_HOST;
	}
	if (!n)
		return 0;
	/* The gather takes 3/16 * n_kv_heads * head_dim threads a token: at
	 * most 256 (every Qwen3 geometry); else the pack path. */
	if (cuda_pages_method(b) != CUDA_PLACE_PACK && D % 16 == 0 && (size_t)H * D * 3 / 16 <= 256)
		return cuda_pages_place(b, v, items, n);
	if (device)
		return kvmem_error(ENOTSUP, "cuda place: the pack method takes pages in host memory only");
	cuda_view_drop_raw(b, v);	/* the pack path writes no raw K */
	if ((rc = place_pack(b, v, items, n)) < 0)
		return rc;
	cuda_pages_count_pack(b, items, n, (double)kvmem_now_ns() - t0);
	return 0;
}


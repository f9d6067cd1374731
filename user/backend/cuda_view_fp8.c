// SPDX-License-Identifier: MIT
/*
 * fp8 views of the cuda backend (kv_dtype fp8, issue #27): per layer and KV
 * head, `cap` slots of e4m3 K (rotated at the slot) and V with one fp32
 * scale per row (kernels/cuda/fp8_view.cu says how a view row is made from
 * its page's raw fp8 K and V). 2 * Hk * D + 8 * Hk bytes a slot and layer:
 * 0.52 of bf16's at Qwen3-8B's geometry.
 *
 * Exactness: a token's view rows are a function of its page's bytes and
 * scales and its slot alone, whichever path writes them. The forward pass
 * quantises its bf16 K and V exactly as the host quantises the rows it
 * writes into the token's page (kvmem_fp8_quant_row of the widened bf16:
 * the twin of kvmem_cuda_fp8_quant_rows), and place() reads those pages.
 * Pages of another dtype (a session over host f32 pages) are quantised on
 * the host the same way first. So with a budget over the workspace, a
 * paged session equals a full-context run over the same fp8 KV bit for bit
 * (tests/unit/test_fp8_session.c with KVMEM_TEST_BACKEND=cuda).
 *
 * First steps, said as such (Documentation/kernels.md, "fp8 views"):
 *  - attention reads the e4m3 rows itself where the main path's bf16
 *    kernel for the shape has an fp8 form: decode (v5: in registers up
 *    to 8 rows a KV head, else dequantising each tile into shared memory)
 *    and the prefill chunks v4 takes of up to 128 rows a KV head (its
 *    flash kernel with e4m3 tiles, kvmem_cuda_attention_fp8: a warm step's
 *    question; e4m3_rows_env); each gives the bits of its bf16 kernel over
 *    the rows dequantised. Other chunks read the layer dequantised into a
 *    bf16 scratch (exact: e4m3 x 2^e fits bf16), then the bf16 kernel (v4,
 *    or v6 where the rows fill the GPU). The scratch is made when such a
 *    chunk comes, not with the view: where the GPU cap leaves no room for
 *    it, v4 reads the e4m3 rows instead (v4's bits; a chunk v6 would have
 *    taken gets other bits, each exact over the same fp8 KV);
 *  - place(): one kernel reads fp8 pages in registered host memory (a
 *    pager's pinned pool) where they are, 16 bytes a thread, and rotates
 *    them into the view; other pages are packed into pinned staging on
 *    the host first (quantised when not fp8). fp8 pages have a device
 *    page pool (cuda_page.c; KVMEM_CUDA_FP8_POOL=0: none), as bf16
 *    pages have: each slot a page's bytes and scales as the page
 *    holds them (kvmem_page_at's layout, 0.52 of a bf16 slot at
 *    Qwen3-8B), filled ahead by pool_fill and by place()'s whole pages of
 *    registered memory (copied in before the gather), and read by the
 *    same kernel as the page would be, so no bit changes; page_cached()
 *    then says yes for its pages, which the session no longer gets from
 *    its source (on by default since tests/gpu/fp8pool27.sh ran:
 *    Documentation/benchmarks.md);
 *  - the raw K kept beside the view (keep_raw): e4m3 bytes and scales as
 *    the pages hold them, written by the forward pass, place() and move();
 *    move() re-rotates from them (it is dropped first under the cap);
 *  - no batched forward (-ENOTSUP:
 *    the caller runs items one by one). A decode step is a CUDA graph as
 *    on bf16 (the put kernel reads its slot, v5 its key count, on the
 *    device) while the main decode is v5; with another decode version
 *    (KVMEM_CUDA_DECODE) the capture is refused and the backend decodes
 *    with plain launches from then on (KVMEM_CUDA_GRAPH=2: an error).
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cuda_backend.h"
#include "kernels/kernels_cuda_fp8.h"
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"
#include "kvmem/source.h"
#include "util/clock.h"

struct cuda_fp8 {
	uint16_t *dk, *dv;	/* one layer as bf16: [Hk][rows][D] each */
	int64_t rows;
	char *st, *host_st;	/* staging on the device (place, move) and pinned
				 * on the host (what place() packs) */
	size_t cap_st, cap_host_st;
	struct cuda_ring ring;	/* the gather's items (cuda_ring.c) */
	kvmem_fp8_snap *snaps, *host_snaps;	/* move(): the sources' copies */
	void *snap_ev;		/* recorded after a move not waited for */
	int snap_armed;		/* ... and not yet waited for */
	int cap_items;
	const char **at;	/* place() with the pool: the items' slots */
	int cap_at;
	int e4m3_rows;		/* e4m3_rows_env() */
};

/*
 * The most rows a KV head (tokens x the group's heads) for which a prefill
 * chunk that v4 takes reads the e4m3 rows (kvmem_cuda_attention_fp8) where
 * the bf16 scratch has room; above, the scratch and v4 over it. The bits
 * are the same either way (v4 over the rows dequantised); the time is not:
 * the e4m3 tiles cost each 128-row tile of v4 their conversion, the scratch
 * costs the layer once (Documentation/benchmarks.md, "Prefill attention
 * over fp8"). KVMEM_CUDA_FP8_PREFILL_ROWS sets it (0: never while there is
 * room); 128 (one of v4's row tiles: a warm step's question) when unset.
 */
static int e4m3_rows_env(void)
{
	const char *e = getenv("KVMEM_CUDA_FP8_PREFILL_ROWS");
	const int rows = e && *e ? atoi(e) : 128;

	return rows < 0 ? 0 : rows;
}

static struct cuda_fp8 *f8_of(struct cuda *b)
{
	if (b->f8)
		return b->f8;
	if (!(b->f8 = calloc(1, sizeof(*b->f8))))
		kvmem_error(ENOMEM, "cuda fp8 view: out of memory");
	else
		b->f8->e4m3_rows = e4m3_rows_env();
	return b->f8;
}

/* The snapshots' pinned copy is written again only once the device has
 * read the last one. */
static int snaps_free(struct cuda_fp8 *f)
{
	return cuda_mark_wait(f->snap_ev, &f->snap_armed);
}

void cuda_fp8_destroy(struct cuda *b)
{
	struct cuda_fp8 *f = b->f8;

	if (!f)
		return;
	kvmem_cuda_free(f->dk);
	kvmem_cuda_free(f->dv);
	cuda_ring_free(&f->ring);	/* waits for what is queued */
	cuda_mark_free(&f->snap_ev, &f->snap_armed);
	kvmem_cuda_free(f->st);
	kvmem_cuda_free(f->snaps);
	cudaFreeHost(f->host_st);
	cudaFreeHost(f->host_snaps);
	free(f->at);
	free(f);
	b->f8 = NULL;
}

uint64_t cuda_fp8_view_bytes(const struct cuda *b, int64_t cap, int keep)
{
	/* K, V and their scales; the raw K and its scales when kept */
	return (uint64_t)cap * b->c->n_layers * (keep ? 3 : 2) * (b->kw + 4ull * b->c->n_kv_heads);
}

/* The bf16 scratch attention reads: one layer of `rows` slots, K and V. */
static uint64_t scratch_bytes(const struct cuda *b, int64_t rows)
{
	return (uint64_t)rows * b->kw * 2 * 2;
}

/* -ENOMEM (the caller may take another way) when the GPU cap has no room. */
static int scratch_room(struct cuda *b, int64_t rows)
{
	struct cuda_fp8 *f = f8_of(b);
	int rc;

	if (!f)
		return kvmem_fail();
	if (rows <= f->rows)
		return 0;
	if (b->mem_cap && cuda_dev_used(b) - scratch_bytes(b, f->rows) + scratch_bytes(b, rows) +
			  CUDA_CAP_MARGIN > b->mem_cap)
		return kvmem_error(ENOMEM, "cuda fp8 view: no room under the %" PRIu64 " MiB GPU cap "
				   "for a %" PRIu64 " MiB bf16 layer", b->mem_cap >> 20,
				   scratch_bytes(b, rows) >> 20);
	/* Nothing reads the old one: the stream is in order and the free
	 * waits for the device. */
	kvmem_cuda_free(f->dk);
	kvmem_cuda_free(f->dv);
	b->scratch_bytes -= scratch_bytes(b, f->rows);
	f->dk = f->dv = NULL;
	f->rows = 0;
	if ((rc = cuda_dev_alloc(&f->dk, (size_t)rows * b->kw * 2, NULL)) < 0 ||
	    (rc = cuda_dev_alloc(&f->dv, (size_t)rows * b->kw * 2, NULL)) < 0) {
		kvmem_cuda_free(f->dk);
		f->dk = NULL;
		return rc;
	}
	f->rows = rows;
	b->scratch_bytes += scratch_bytes(b, rows);
	return 0;
}

void cuda_fp8_view_free(struct cuda *b, kvmem_view *v)
{
	b->view_bytes -= cuda_fp8_view_bytes(b, v->cap, v->keep);
	cuda_fwd_forget(b, v->k8);	/* decode graphs that hold it (cuda_fwd.c) */
	kvmem_cuda_sync(b->ctx);	/* a place() left running (cuda_ring.c) */
	kvmem_cuda_free(v->k8);
	kvmem_cuda_free(v->v8);
	kvmem_cuda_free(v->ks);
	kvmem_cuda_free(v->vs);
	kvmem_cuda_free(v->rk8);
	kvmem_cuda_free(v->rks);
	v->k8 = v->v8 = v->rk8 = NULL;
	v->ks = v->vs = v->rks = NULL;
	v->cap = 0;
}

/* Give the raw K up (under the cap): moves then say -ENOTSUP. */
static void drop_raw(struct cuda *b, kvmem_view *v)
{
	if (!v->keep)
		return;
	cuda_fwd_forget(b, v->k8);	/* its decode graphs write the raw K */
	kvmem_cuda_sync(b->ctx);	/* and a place() left running */
	b->view_bytes -= cuda_fp8_view_bytes(b, v->cap, 1) - cuda_fp8_view_bytes(b, v->cap, 0);
	kvmem_cuda_free(v->rk8);
	kvmem_cuda_free(v->rks);
	v->rk8 = NULL;
	v->rks = NULL;
	v->keep = 0;
}

int cuda_fp8_keep_raw(struct cuda *b, kvmem_view *v)
{
	int64_t cap = v->cap;
	int rc;

	if (v->len)
		return kvmem_error(EINVAL, "cuda view: raw K asked for after %lld tokens",
				   (long long)v->len);
	if (v->keep)
		return 0;
	/* Nothing to keep yet: the view is made again with room for it. */
	cuda_fp8_view_free(b, v);
	v->keep = 1;
	if (cap && (rc = cuda_fp8_reserve(b, v, cap)) < 0) {
		v->keep = 0;
		return rc;
	}
	return 0;
}

void cuda_fp8_view_destroy(struct cuda *b, kvmem_view *v)
{
	cuda_fp8_view_free(b, v);
	if (v->host) {
		kvmem_kvcache_free(v->host);
		free(v->host);
	}
	free(v);
}

const kvmem_kvcache *cuda_fp8_host_view(struct cuda *b, kvmem_view *v)
{
	const kvmem_config *c = b->c;
	const size_t D = c->head_dim, rows = (size_t)c->n_layers * c->n_kv_heads;
	const size_t n = rows * v->cap;
	uint8_t *q = malloc(2 * n * D + 1);
	float *s = malloc(2 * n * sizeof(float) + 1);

	if (!q || !s)
		goto nomem;
	if (!v->host && !(v->host = calloc(1, sizeof(*v->host))))
		goto nomem;
	kvmem_kvcache_free(v->host);
	if (kvmem_kvcache_init(v->host, c, v->cap > 0 ? (int)v->cap : 1) < 0)
		goto fail;
	if (v->cap && (kvmem_cuda_download(b->ctx, q, v->k8, n * D) < 0 ||
		       kvmem_cuda_download(b->ctx, q + n * D, v->v8, n * D) < 0 ||
		       kvmem_cuda_download(b->ctx, s, v->ks, n * sizeof(float)) < 0 ||
		       kvmem_cuda_download(b->ctx, s + n, v->vs, n * sizeof(float)) < 0))
		goto fail;
	/* [L][Hk][cap] rows in both layouts */
	for (size_t r = 0; r < rows; r++)
		for (int64_t t = 0; t < v->len; t++) {
			const size_t i = r * v->cap + t;

			kvmem_fp8_dequant_row(v->host->k + i * D, q + i * D, s[i], (int)D);
			kvmem_fp8_dequant_row(v->host->v + i * D, q + (n + i) * D, s[n + i], (int)D);
		}
	v->host->len = (int)v->len;
	free(q);
	free(s);
	return v->host;
nomem:
	kvmem_error(ENOMEM, "cuda fp8 view: out of memory");
fail:
	free(q);
	free(s);
	return NULL;
}

/* dst[l][h][0..len) = src[l][h][0..len), rows of `row` bytes. */
static int copy_runs(struct cuda *b, void *dst, int64_t cd, const void *src, int64_t cs,
		     int64_t len, size_t row)
{
	cudaError_t e = cudaMemcpy2DAsync(dst, cd * row, src, cs * row, len * row,
					  (size_t)b->c->n_layers * b->c->n_kv_heads,
					  cudaMemcpyDeviceToDevice, kvmem_cuda_stream(b->ctx));

	return e == cudaSuccess ? 0 : kvmem_error(EIO, "cuda fp8 view: copy: %s",
						  cudaGetErrorString(e));
}

int cuda_fp8_reserve(struct cuda *b, kvmem_view *v, int64_t slots)
{
	const size_t D = b->c->head_dim, rows = (size_t)b->c->n_layers * b->c->n_kv_heads;
	uint64_t grow;
	uint8_t *nk = NULL, *nv = NULL, *nr = NULL;
	float *nks = NULL, *nvs = NULL, *nrs = NULL;
	int rc;

	if (slots <= v->cap)
		return 0;
	if (slots > INT32_MAX)
		return kvmem_error(EINVAL, "cuda view: %lld slots, at most %d", (long long)slots,
				   INT32_MAX);
	/* Under the cap: while the view grows it holds the old and the new
	 * copy at once (the bf16 scratch is not the view's: cuda_fp8_layer
	 * makes it when a chunk needs it and there is room). The raw K kept
	 * beside it goes first (a selection then places from pages). */
	if (v->keep && b->mem_cap &&
	    cuda_dev_used(b) + cuda_fp8_view_bytes(b, slots, 1) + CUDA_CAP_MARGIN > b->mem_cap)
		drop_raw(b, v);
	grow = cuda_fp8_view_bytes(b, slots, v->keep);
	if (b->mem_cap && cuda_dev_used(b) + grow + CUDA_CAP_MARGIN > b->mem_cap) {
		cuda_pages_drop_pool(b);
		if (cuda_dev_used(b) + grow + CUDA_CAP_MARGIN > b->mem_cap)
			return kvmem_error(ENOMEM, "cuda view (fp8): %lld slots take %" PRIu64
					    " MiB; the %" PRIu64 " MiB GPU cap "
					   "holds %" PRIu64 " MiB (weights %" PRIu64 ", views %" PRIu64
					   ", index %" PRIu64 ", scratch and staging %" PRIu64
					   ", margin %llu)", (long long)slots, grow >> 20,
					   b->mem_cap >> 20, cuda_dev_used(b) >> 20,
					   b->weight_bytes >> 20, b->view_bytes >> 20,
					   b->index_bytes >> 20,
					   (b->scratch_bytes + cuda_pages_dev_bytes(b)) >> 20,
					   CUDA_CAP_MARGIN >> 20);
	}
	if ((rc = kvmem_cuda_malloc((void **)&nk, rows * slots * D)) < 0 ||
	    (rc = kvmem_cuda_malloc((void **)&nv, rows * slots * D)) < 0 ||
	    (rc = kvmem_cuda_malloc((void **)&nks, rows * slots * 4)) < 0 ||
	    (rc = kvmem_cuda_malloc((void **)&nvs, rows * slots * 4)) < 0 ||
	    (v->keep && ((rc = kvmem_cuda_malloc((void **)&nr, rows * slots * D)) < 0 ||
			 (rc = kvmem_cuda_malloc((void **)&nrs, rows * slots * 4)) < 0)))
		goto fail;
	if (v->len && ((rc = copy_runs(b, nk, slots, v->k8, v->cap, v->len, D)) < 0 ||
		       (rc = copy_runs(b, nv, slots, v->v8, v->cap, v->len, D)) < 0 ||
		       (rc = copy_runs(b, nks, slots, v->ks, v->cap, v->len, 4)) < 0 ||
		       (rc = copy_runs(b, nvs, slots, v->vs, v->cap, v->len, 4)) < 0 ||
		       (nr && (rc = copy_runs(b, nr, slots, v->rk8, v->cap, v->len, D)) < 0) ||
		       (nrs && (rc = copy_runs(b, nrs, slots, v->rks, v->cap, v->len, 4)) < 0) ||
		       (rc = kvmem_cuda_sync(b->ctx)) < 0))
		goto fail;
	{
		const int64_t len = v->len;

		cuda_fp8_view_free(b, v);
		v->len = len;
	}
	b->view_bytes += cuda_fp8_view_bytes(b, slots, v->keep);
	v->k8 = nk;
	v->v8 = nv;
	v->ks = nks;
	v->vs = nvs;
	v->rk8 = nr;
	v->rks = nrs;
	v->cap = slots;
	return 0;
fail:
	kvmem_cuda_free(nk);
	kvmem_cuda_free(nv);
	kvmem_cuda_free(nks);
	kvmem_cuda_free(nvs);
	kvmem_cuda_free(nr);
	kvmem_cuda_free(nrs);
	return rc;
}

/* ---- place ------------------------------------------------------------------ */
/*
 * Room for a call's staging: dev bytes on the device, host bytes pinned
 * (place() packs there; a move needs none), n items. Grown with room to
 * spare: pinning costs about a millisecond per few MB, and a step's calls
 * vary in size.
 */
static int staging_room(struct cuda *b, size_t dev, size_t host, int n)
{
	struct cuda_fp8 *f = f8_of(b);
	int rc;

	if (!f)
		return kvmem_fail();
	/* What is freed below may be read by a move or a gather still queued. */
	if ((dev > f->cap_st || host > f->cap_host_st || n > f->cap_items) &&
	    ((rc = cuda_ring_quiet(&f->ring, b->ctx)) < 0 || (rc = snaps_free(f)) < 0))
		return rc;
	if (dev > f->cap_st) {
		kvmem_cuda_free(f->st);
		f->st = NULL;
		b->scratch_bytes -= f->cap_st;	/* counted under the cap */
		f->cap_st = 0;
		dev = dev < (4u << 20) ? (4u << 20) : dev + dev / 4;
		if ((rc = kvmem_cuda_malloc((void **)&f->st, dev)) < 0)
			return rc;
		f->cap_st = dev;
		b->scratch_bytes += dev;
	}
	if (host > f->cap_host_st) {
		cudaFreeHost(f->host_st);
		f->host_st = NULL;
		f->cap_host_st = 0;
		host = host < (4u << 20) ? (4u << 20) : host + host / 4;
		if ((rc = cuda_pinned(&f->host_st, host)) < 0)
			return rc;
		f->cap_host_st = host;
	}
	if ((rc = cuda_ring_room(&f->ring, b->ctx, n, NULL)) < 0)
		return rc;
	if (n > f->cap_items) {
		kvmem_cuda_free(f->snaps);
		cudaFreeHost(f->host_snaps);
		f->snaps = f->host_snaps = NULL;
		f->cap_items = 0;
		n = n < 1024 ? 1024 : n + n / 4;
		if ((rc = kvmem_cuda_malloc((void **)&f->snaps, (size_t)n * sizeof(*f->snaps))) < 0 ||
		    (rc = cuda_pinned(&f->host_snaps, (size_t)n * sizeof(*f->host_snaps))) < 0)
			return rc;
		f->cap_items = n;
	}
	return 0;
}

/* Bytes one item takes in the staging: K and V bytes [Hk][n][D], then
 * their scales [Hk][n], 16-byte aligned. */
static size_t item_bytes(const struct cuda *b, int n)
{
	return ((size_t)2 * b->kw * n + (size_t)8 * b->c->n_kv_heads * n + 15) & ~(size_t)15;
}

/* One item's token range into the staging at dst, as fp8: an fp8 page's
 * bytes and scales as they are, another page's rows quantised (the host's
 * kvmem_fp8_quant_row, as the rows of a forward pass are). */
static int pack(const struct cuda *b, const kvmem_place *it, char *dst)
{
	const kvmem_page *pg = &it->page;
	const int H = b->c->n_kv_heads, D = b->c->head_dim, n = it->n;
	uint8_t *q = (uint8_t *)dst;
	float *sc = (float *)(dst + (size_t)2 * H * n * D), row[1024];

	for (int is_v = 0; is_v < 2; is_v++)
		for (int h = 0; h < H; h++) {
			uint8_t *o = q + ((size_t)is_v * H + h) * n * D;
			float *os = sc + ((size_t)is_v * H + h) * n;
			const size_t first = (size_t)h * it->stride + it->u0;

			if (pg->dtype == KVMEM_DTYPE_FP8) {
				const float *s = is_v ? pg->v_scale : pg->k_scale;

				memcpy(o, (const uint8_t *)(is_v ? pg->v : pg->k) + first * D,
				       (size_t)n * D);
				memcpy(os, s + first, (size_t)n * sizeof(float));
				continue;
			}
			for (int t = 0; t < n; t++) {
				if (kvmem_page_copy_f32(pg, is_v, (first + t) * D, D, row) < 0)
					return kvmem_fail();
				kvmem_fp8_quant_row(o + (size_t)t * D, &os[t], row, D);
			}
		}
	return 0;
}

/* The item's tokens u0.. of every head, read from a page's K, V and
 * scales at these device addresses. */
static kvmem_gather_item page_item(const struct cuda *b, const kvmem_place *it, const char *k,
				   const char *v, const char *ks, const char *vs)
{
	const size_t D = b->c->head_dim;

	return (kvmem_gather_item){
		.k = k + it->u0 * D, .v = v + it->u0 * D,
		.layer = it->layer, .slot = (int32_t)it->slot, .n = it->n,
		.head_stride = (int32_t)(it->stride * D), .dtype = KVMEM_DTYPE_FP8,
		.k_scale = (const float *)ks + it->u0, .v_scale = (const float *)vs + it->u0,
		.scale_stride = it->stride,
	};
}

/* An fp8 page in registered host memory (a pager's pinned pool): the
 * item reads it where it is; 0 when it is elsewhere (then packed). */
static int direct(struct cuda *b, const kvmem_place *it, kvmem_gather_item *g)
{
	const kvmem_page *pg = &it->page;
	const size_t D = b->c->head_dim, rows = (size_t)b->c->n_kv_heads * it->stride;
	const char *k, *v, *ks, *vs;

	if (pg->dtype != KVMEM_DTYPE_FP8 ||
	    !(k = cuda_pages_dev_addr(b, pg->k, rows * D)) ||
	    !(v = cuda_pages_dev_addr(b, pg->v, rows * D)) ||
	    !(ks = cuda_pages_dev_addr(b, pg->k_scale, rows * 4)) ||
	    !(vs = cuda_pages_dev_addr(b, pg->v_scale, rows * 4)))
		return 0;
	*g = page_item(b, it, k, v, ks, vs);
	return 1;
}

/* A page in a slot of the device page pool (KVMEM_CUDA_FP8_POOL=1): its
 * bytes as kvmem_page_at lays them out, K, V, K's scales, V's. */
static kvmem_gather_item pooled(const struct cuda *b, const kvmem_place *it, const char *slot)
{
	const size_t rows = (size_t)b->c->n_kv_heads * it->stride, half = rows * b->c->head_dim;

	return page_item(b, it, slot, slot + half, slot + 2 * half, slot + 2 * half + 4 * rows);
}

/* Room for the items' pool slots (place() with the pool). */
static int at_room(struct cuda_fp8 *f, int n)
{
	const char **p;

	if (n <= f->cap_at)
		return 0;
	if (!(p = realloc(f->at, (size_t)n * sizeof(*p))))
		return kvmem_error(ENOMEM, "cuda place (fp8): out of memory");
	f->at = p;
	f->cap_at = n;
	return 0;
}

/*
 * Every item a device pool page named by a live token: its gather items
 * built, uploaded and launched PLACE_CHUNK at a time through the ring's
 * halves, none waited for: the device starts on the first chunk while the
 * host builds the next. A chunk of 4,096 keeps a block's 36 layers in one
 * run of the gather (gather_run allows 31 items a block there, 15 at
 * 2,048: the rotary angles are made once a run).
 */
#define PLACE_CHUNK 4096

/* The ring's current half (hi, n items built) uploaded and gathered into
 * the view; waited for when `wait`, else queued on the half's event. */
static int gather_half(struct cuda *b, kvmem_view *v, const kvmem_gather_item *hi, int n,
		       int wait)
{
	struct cuda_fp8 *f = b->f8;
	kvmem_gather_item *di;
	int rc;

	if ((rc = cuda_ring_upload(&f->ring, b->ctx, n, &di)) < 0 ||
	    (rc = kvmem_cuda_fp8_view_gather(b->ctx, v->k8, v->v8, v->ks, v->vs, v->rk8, v->rks,
					     di, n, cuda_slot_run(hi, n), b->c->n_layers,
					     b->c->n_kv_heads, b->c->head_dim, (int)v->cap,
					     b->c->rope_theta)) < 0)
		return rc;
	return wait ? kvmem_cuda_sync(b->ctx) : cuda_ring_queued(&f->ring, b->ctx);
}

static int place_pooled(struct cuda *b, kvmem_view *v, const kvmem_place *items, int n,
			const char *const *slot)
{
	struct cuda_fp8 *f = b->f8;
	kvmem_gather_item *hi;
	int rc;

	for (int c0 = 0; c0 < n; c0 += PLACE_CHUNK) {
		const int m = n - c0 < PLACE_CHUNK ? n - c0 : PLACE_CHUNK;

		if ((rc = staging_room(b, 0, 0, m)) < 0)
			return rc;
		hi = cuda_ring_host(&f->ring);
		for (int i = 0; i < m; i++)
			hi[i] = pooled(b, &items[c0 + i], slot[c0 + i]);
		if ((rc = gather_half(b, v, hi, m, b->place_sync)) < 0)
			return rc;
	}
	return 0;
}

/* An error after cuda_pages_fp8_at issued copies from the caller's pages:
 * they are waited for before the caller may let those pages go. */
static int after_copies(struct cuda *b, int copied, int rc)
{
	if (copied > 0)
		kvmem_cuda_sync(b->ctx);
	return rc;
}

int cuda_fp8_place(struct cuda *b, kvmem_view *v, const kvmem_place *items, int n)
{
	const int H = b->c->n_kv_heads, D = b->c->head_dim;
	const double t0 = (double)kvmem_now_ns();
	const char **slot = NULL;	/* the items' pool slots (KVMEM_CUDA_FP8_POOL=1) */
	size_t total = 0, at = 0;
	kvmem_gather_item g, *hi;
	struct cuda_fp8 *f;
	int rc, pool = cuda_pages_fp8_pool(b), host = 0, copied = 0;

	if (pool < 0)
		return pool;
	/* The warm step's way: every page in the device pool, found again by
	 * page_cached()'s tokens (no lookup, no check: a live token is one). */
	if (pool && n && (f = f8_of(b)) && at_room(f, n) == 0 &&
	    cuda_pages_fp8_tokens(b, items, n, f->at) == 1) {
		if ((rc = place_pooled(b, v, items, n, f->at)) == 0)
			cuda_pages_count_ns(b, (double)kvmem_now_ns() - t0);
		return rc;
	}
	for (int i = 0; i < n; i++) {
		const kvmem_place *it = &items[i];

		/* KVMEM_MEM_BACKEND: page_cached() said the pool holds it */
		if (it->page.mem != KVMEM_MEM_HOST && !(pool && it->page.mem == KVMEM_MEM_BACKEND))
			return kvmem_error(ENOTSUP, "cuda place (fp8 view): pages in host memory only");
		if (it->page.mem == KVMEM_MEM_HOST && it->page.dtype == KVMEM_DTYPE_FP8 &&
		    (!it->page.k_scale || !it->page.v_scale ||
		     (it->page.scale_run && it->page.scale_run != (uint32_t)D)))
			return kvmem_error(EINVAL, "cuda place: an fp8 page without its row scales");
	}
	if (!n)
		return 0;
	if (pool) {
		if (!(f = f8_of(b)))
			return kvmem_fail();
		if ((rc = at_room(f, n)) < 0 ||
		    (rc = copied = cuda_pages_fp8_at(b, v->cap, items, n, f->at)) < 0)
			return rc;
		slot = f->at;
	}
	for (int i = 0; i < n; i++)	/* staging only for what is packed */
		if (!(slot && slot[i]) && !direct(b, &items[i], &g))
			total += item_bytes(b, items[i].n);
	if ((rc = staging_room(b, total, total, n)) < 0)
		return after_copies(b, copied, rc);
	f = b->f8;
	hi = cuda_ring_host(&f->ring);
	for (int i = 0; i < n; i++) {
		const kvmem_place *it = &items[i];
		char *dev = f->st + at;

		if (slot && slot[i]) {
			hi[i] = pooled(b, it, slot[i]);
			continue;
		}
		host = 1;	/* read from host memory, or packed from it */
		if (direct(b, it, &hi[i]))
			continue;
		if ((rc = pack(b, it, f->host_st + at)) < 0)
			return after_copies(b, copied, rc);
		hi[i] = (kvmem_gather_item){
			.k = dev, .v = dev + (size_t)H * it->n * D,
			.layer = it->layer, .slot = (int32_t)it->slot, .n = it->n,
			.head_stride = it->n * D, .dtype = KVMEM_DTYPE_FP8,
			.k_scale = (const float *)(dev + (size_t)2 * H * it->n * D),
			.v_scale = (const float *)(dev + (size_t)2 * H * it->n * D) + (size_t)H * it->n,
			.scale_stride = it->n,
		};
		at += item_bytes(b, it->n);
	}
	/* Pages from the device pool only: the kernel is not waited for (the
	 * next call fills the ring's other half meanwhile); pages read from
	 * host memory, or copied from it into the pool by this call, are let
	 * go when this returns, so their kernel is (one wait for both). */
	if ((at && (rc = kvmem_cuda_upload(b->ctx, f->st, f->host_st, at)) < 0) ||
	    (rc = gather_half(b, v, hi, n, host || copied || b->place_sync)) < 0)
		return after_copies(b, copied, rc);
	/* counted as the bf16 view's place() counts (kvmem_place_stats) */
	cuda_pages_count_fp8(b, items, n, slot, (double)kvmem_now_ns() - t0);
	return 0;
}

/* ---- move ------------------------------------------------------------------ */
/*
 * Tokens already in the view to other slots: the items' raw K and V runs
 * (with their scales) are copied aside into the staging (one kernel), then
 * the gather reads them there as it reads pages and writes K rotated at
 * the new slot, V and the raw K: the bits a place() from the token's page
 * at that slot gives. Every item reads the view as it was: its copy is
 * taken before anything of its layer is written. Layers go in groups whose
 * copies fit MOVE_GROUP_BYTES, a snapshot and a gather launch a group (a
 * launch a layer was 72 small kernels a step, 1.4-1.8 ms for 0.4 GB at the
 * 8B geometry); the stream keeps the groups in order through one staging.
 * Not waited for (KVMEM_CUDA_PLACE_SYNC=1: waited), as a place() from the
 * pool: the view is read next by the stream's own work.
 */
#define MOVE_GROUP_BYTES (256ull << 20)

int cuda_fp8_move(struct cuda *b, kvmem_view *v, const kvmem_move *items, int n)
{
	const int H = b->c->n_kv_heads, D = b->c->head_dim, L = b->c->n_layers;
	const double t0 = (double)kvmem_now_ns();
	uint64_t tokens = 0;
	int *start = calloc((size_t)L + 1, sizeof(int)), *at = calloc((size_t)L, sizeof(int));
	size_t *used = calloc((size_t)L, sizeof(size_t)), *base = calloc((size_t)L, sizeof(size_t));
	size_t most = 0, group = 0;
	kvmem_gather_item *hi, *di;
	struct cuda_fp8 *f;
	int rc = 0;

	if (!start || !at || !used || !base) {
		rc = kvmem_error(ENOMEM, "cuda move (fp8): out of memory");
		goto out;
	}
	if (!v->rk8) {
		rc = kvmem_error(ENOTSUP, "cuda move: the fp8 view keeps no raw K");
		goto out;
	}
	for (int i = 0; i < n; i++) {
		const kvmem_move *m = &items[i];

		if (m->layer < 0 || m->layer >= L || m->n <= 0 || m->from < 0 || m->to < 0 ||
		    m->from + m->n > v->cap || m->to + m->n > v->cap) {
			rc = kvmem_error(EINVAL, "cuda move: bad move (layer %d, %d tokens from slot "
					 "%lld to %lld of %lld)", m->layer, m->n, (long long)m->from,
					 (long long)m->to, (long long)v->cap);
			goto out;
		}
		start[m->layer + 1]++;
		used[m->layer] += item_bytes(b, m->n);
		tokens += (uint64_t)m->n;
	}
	if (!n)
		goto out;
	/* Each layer's copies at base[l] of its group's staging; a group ends
	 * before the layer that would take it past MOVE_GROUP_BYTES. */
	for (int l = 0; l < L; l++) {
		start[l + 1] += start[l];
		if (group && group + used[l] > MOVE_GROUP_BYTES)
			group = 0;
		base[l] = group;
		group += used[l];
		most = group > most ? group : most;
		used[l] = 0;
	}
	/* Under the cap the staging may not fit: the session then places
	 * these tokens from their pages. */
	if (b->mem_cap && most > (b->f8 ? b->f8->cap_st : 0) &&
	    cuda_dev_used(b) + most + CUDA_CAP_MARGIN > b->mem_cap) {
		rc = kvmem_error(ENOTSUP, "cuda move (fp8): %zu MiB of staging over the GPU cap",
				 most >> 20);
		goto out;
	}
	if ((rc = staging_room(b, most, 0, n)) < 0)
		goto out;
	f = b->f8;
	if ((rc = snaps_free(f)) < 0)
		goto out;
	hi = cuda_ring_host(&f->ring);
	for (int i = 0; i < n; i++) {	/* in layer order, each layer's from base[l] */
		const kvmem_move *m = &items[i];
		const int k = start[m->layer] + at[m->layer]++;
		const size_t off = base[m->layer] + used[m->layer];
		char *dev = f->st + off;

		used[m->layer] += item_bytes(b, m->n);
		f->host_snaps[k] = (kvmem_fp8_snap){ .layer = m->layer, .n = m->n, .from = m->from,
						     .off = (int64_t)off };
		hi[k] = (kvmem_gather_item){
			.k = dev, .v = dev + (size_t)H * m->n * D,
			.layer = m->layer, .slot = (int32_t)m->to, .n = m->n,
			.head_stride = m->n * D, .dtype = KVMEM_DTYPE_FP8,
			.k_scale = (const float *)(dev + (size_t)2 * H * m->n * D),
			.v_scale = (const float *)(dev + (size_t)2 * H * m->n * D) + (size_t)H * m->n,
			.scale_stride = m->n,
		};
	}
	if (cudaMemcpyAsync(f->snaps, f->host_snaps, (size_t)n * sizeof(*f->snaps),
			    cudaMemcpyHostToDevice, kvmem_cuda_stream(b->ctx)) != cudaSuccess) {
		cudaGetLastError();
		rc = kvmem_error(EIO, "cuda move (fp8): uploading %d copies", n);
		goto out;
	}
	if ((rc = cuda_ring_upload(&f->ring, b->ctx, n, &di)) < 0)
		goto out;
	for (int l = 0, first = 0; l < L; l++) {
		const int c = start[l + 1] - start[first];

		if (l + 1 < L && base[l + 1])
			continue;	/* the group goes on */
		if (c && ((rc = kvmem_cuda_fp8_view_snap(b->ctx, f->st, f->snaps + start[first], c,
							 v->rk8, v->v8, v->rks, v->vs, H, D,
							 (int)v->cap)) < 0 ||
			  (rc = kvmem_cuda_fp8_view_gather(b->ctx, v->k8, v->v8, v->ks, v->vs, v->rk8,
							   v->rks, di + start[first], c, 1, L, H, D,
							   (int)v->cap, b->c->rope_theta)) < 0))
			goto out;
		first = l + 1;
	}
	if (b->place_sync)
		rc = kvmem_cuda_sync(b->ctx);
	else if ((rc = cuda_ring_queued(&f->ring, b->ctx)) == 0)
		rc = cuda_mark(&f->snap_ev, &f->snap_armed, b->ctx);
	/* Each item's own tokens copied aside: as many as move. */
	if (rc == 0)
		cuda_pages_count_move(b, tokens, tokens, (double)kvmem_now_ns() - t0);
out:
	free(start);
	free(at);
	free(used);
	free(base);
	return rc;
}

/* ---- the forward pass --------------------------------------------------------- */
/* Whether the compute stream is being captured into a graph. */
static int capturing(struct cuda *b)
{
	enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;

	return cudaStreamIsCapturing(kvmem_cuda_stream(b->ctx), &st) == cudaSuccess &&
	       st != cudaStreamCaptureStatusNone;
}

/* Prefill attention over layer l's e4m3 rows (kvmem_cuda_attention_fp8). */
static int attend_e4m3(struct cuda *b, kvmem_view *v, int l, int n, const int32_t *pos,
		       int64_t len, float scale)
{
	const kvmem_config *c = b->c;
	const int H = c->n_kv_heads, D = c->head_dim;
	const size_t vl = (size_t)H * v->cap * D, sl = (size_t)H * v->cap;

	return kvmem_cuda_attention_fp8(b->ctx, b->att, b->q, pos, n, v->k8 + l * vl,
					v->v8 + l * vl, v->ks + l * sl, v->vs + l * sl, (int)len,
					(size_t)v->cap, c->n_heads, H, D, scale);
}

int cuda_fp8_layer(struct cuda *b, kvmem_view *v, int l, int n, const uint16_t *qkv, int ld,
		   const kvmem_scatter_item *item, const int32_t *pos, const int32_t *n_kv)
{
	const kvmem_config *c = b->c;
	const int H = c->n_kv_heads, D = c->head_dim;
	const size_t vl = (size_t)H * v->cap * D, sl = (size_t)H * v->cap;
	const int64_t len = v->len + n;
	const float scale = (float)(1.0 / sqrt((double)D));
	const uint16_t *rk = qkv + (size_t)c->n_heads * D;
	struct cuda_fp8 *f;
	int rc;

	if ((rc = kvmem_cuda_fp8_view_put(b->ctx, v->k8, v->v8, v->ks, v->vs, v->rk8, v->rks, rk,
					  rk + (size_t)H * D,
					  ld, item, n, H, D, (int)v->cap, c->rope_theta)) < 0)
		return rc;
	/* Decode: v5 reads the e4m3 rows itself (-ENOTSUP: another decode
	 * version is chosen; then as a prefill chunk, through bf16). */
	if (n == 1 && c->n_heads / H <= 16) {
		rc = kvmem_cuda_attention_decode_fp8(b->ctx, b->att, b->q, pos, 1, v->k8 + l * vl,
						     v->v8 + l * vl, v->ks + l * sl, v->vs + l * sl,
						     n_kv, (int)v->cap, (size_t)v->cap, c->n_heads, H,
						     D, scale);	/* the count: n_kv's (graphs) */
		if (rc != -ENOTSUP)
			return rc;
		/* The way below bakes the key count into a decode graph being
		 * captured: refuse it (the backend then decodes with plain
		 * launches) rather than replay a stale count. */
		if (capturing(b))
			return kvmem_error(ENOTSUP, "cuda fp8 view: a decode graph needs decode v5");
	}
	/* A prefill chunk the main path gives to v4, of few rows: v4 over
	 * the e4m3 rows. */
	if (!(f = f8_of(b)))
		return kvmem_fail();
	if (n > 1 && (int64_t)n * (c->n_heads / H) <= f->e4m3_rows &&
	    kvmem_cuda_attention_fp8_same(b->ctx, n, c->n_heads, H, D))
		return attend_e4m3(b, v, l, n, pos, len, scale);
	if ((rc = scratch_room(b, v->cap)) < 0) {
		/* No room under the cap for the scratch (the view took it):
		 * v4 over the e4m3 rows, a chunk of a few tokens too (a decode
		 * of one that v5 refused keeps its error: a graph may be
		 * taking it). */
		if (rc == -ENOMEM && n > 1)
			return attend_e4m3(b, v, l, n, pos, len, scale);
		return rc;
	}
	f = b->f8;
	if ((rc = kvmem_cuda_fp8_view_bf16(b->ctx, f->dk, f->dv, (int)f->rows, v->k8 + l * vl,
					   v->v8 + l * vl, v->ks + l * sl, v->vs + l * sl, H,
					   (int)len, (int)v->cap, D)) < 0)
		return rc;
	if (n == 1 && c->n_heads / H <= 16)
		return kvmem_cuda_attention_decode_bf16(b->ctx, 0, b->att, b->q, pos, 1, f->dk, f->dv,
							n_kv, (int)len, (size_t)f->rows, c->n_heads,
							H, D, scale);
	return kvmem_cuda_attention_bf16(b->ctx, b->att, b->q, pos, n, f->dk, f->dv, NULL, (int)len,
					 (size_t)f->rows, c->n_heads, H, D, scale);
}

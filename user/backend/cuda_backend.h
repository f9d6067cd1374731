/* SPDX-License-Identifier: MIT */
/*
 * The cuda backend's private state, shared by its three files:
 *   cuda.c       weights, create/destroy, ceilings, the ops table
 *   cuda_fwd.c   the forward pass and its decode graphs
 *   cuda_fwd_index.c  a forward's index summaries, made on the device
 *   cuda_host.c  pinned host memory for the sessions' rows, kept for reuse
 *   cuda_fwd_batch.c  the batched forward (decode steps of many views)
 *   cuda_fwd_prefill.c  prefill chunks of several views in one pass
 *   cuda_view_fp8.c  fp8 views (kv_dtype fp8): their memory, place(), move(),
 *                the forward pass's K/V and attention over them
 *   cuda_view.c  views: create, reserve, length, place (checks, the pack path)
 *   cuda_page.c  the paging path: registered host memory, the gather, the
 *                device page pool, place()'s counters, the copy ceilings
 *   cuda_score.c selection scoring on the device over a mirror of the index
 * Built into libkvmem_cuda.a only (kernels/cuda/cuda.mk).
 */
#ifndef KVMEM_BACKEND_CUDA_INT_H
#define KVMEM_BACKEND_CUDA_INT_H

#include <stdint.h>

#include "backend/backend_impl.h"
#include "kernels/kernels_cuda.h"

struct layer_w {
	uint16_t *w_qkv;	/* [qw + 2 kw][hidden]: q, k, v rows in one allocation
				 * (one GEMM); wq, wk, wv point into it */
	uint16_t *attn_norm, *wq, *wk, *wv, *wo, *q_norm, *k_norm;
	uint16_t *mlp_norm, *w_gateup, *w_down;	/* [2I][hidden]: gate rows, then up rows */
};

struct kvmem_view {
	uint16_t *k, *v;	/* [L][Hk][cap][D] */
	uint16_t *rk;		/* raw K [L][Hk][cap][D] when kept (keep_raw) */
	int keep;		/* keep_raw asked and not given up */
	int64_t cap, len;
	/* fp8 views (the backend's kv_dtype; cuda_view_fp8.c): k and v stay
	 * NULL, these hold e4m3 K (rotated) and V [L][Hk][cap][D] and their
	 * row scales [L][Hk][cap] (kernels/kernels_cuda_fp8.h). */
	int fp8;
	uint8_t *k8, *v8;
	float *ks, *vs;
	uint8_t *rk8;		/* fp8, keep_raw: raw K bytes and scales, the pages' */
	float *rks;
	kvmem_kvcache *host;	/* fp8: the view dequantised for host_view, or NULL */
	/* Logits a batched decode left here (kvmem_fwd_item.argmax): two
	 * device rows, lg_cur the last forward's, the other the next one's
	 * (a pass that fails leaves the last ones whole). cuda_fwd_batch.c */
	float *lg;
	int lg_cur, lg_have;
};

struct cuda {
	const kvmem_config *c;
	kvmem_cuda_ctx *ctx;
	int max_chunk, qw, kw;
	int fp8;			/* views hold fp8 KV (kvmem_backend_opts.kv_dtype) */
	int place_sync;			/* KVMEM_CUDA_PLACE_SYNC=1: every place() waits
					 * for its gather, as before 2026-12-04
					 * (cuda_ring.c) */
	struct cuda_fp8 *f8;		/* cuda_view_fp8.c: its scratch and staging */
	uint16_t *embed, *final_norm, *lm_head;	/* lm_head == embed when tied */
	struct layer_w *L;
	uint64_t weight_bytes;
	uint64_t view_bytes;		/* held by views now */
	/* scratch for one chunk */
	float *x;			/* [C][hidden] residual */
	uint16_t *h, *q, *k, *v, *att, *gu, *act, *tmp;
	int32_t *ids, *pos;		/* [C] */
	float *logits;			/* [logit_rows][vocab] */
	int logit_rows;
	uint16_t *oq, *ok, *ov;		/* [L][C][..] raw q, raw K, V for the session */
	uint16_t *host_o;		/* pinned: the largest of those, to widen */
	int32_t *host_i;		/* pinned: ids and positions */
	/* place(): staging on both sides */
	uint16_t *st_k, *st_v, *host_st;	/* [cap_st] each; host: K then V */
	kvmem_scatter_item *items, *host_items;
	size_t cap_st;
	int cap_items;
	/* the paging path (cuda_page.c) and the device memory cap */
	struct cuda_pages *pages;
	uint64_t mem_cap, page_pool;	/* from kvmem_backend_opts */
	uint64_t index_mem;		/* from kvmem_backend_opts: the mirrors' share */
	uint64_t index_bytes;		/* held by index mirrors now (cuda_score.c) */
	uint64_t scratch_bytes;		/* the forward pass's scratch */
	struct cuda_rows *rows;		/* cuda_host.c: pinned rows kept for reuse */
	struct cuda_fwd_index *fix;	/* cuda_fwd_index.c: the index's window and
					 * running state (made at first use) */
	struct cuda_fwd *fwd;		/* cuda_fwd.c: the forward pass's inputs,
					 * q/k/v scratch and decode graphs */
	struct cuda_fwdb *fwdb;		/* cuda_fwd_batch.c: the batched forward's
					 * buffers (made at its first call) */
	struct cuda_fwdp *fwdp;		/* cuda_fwd_prefill.c: the batched prefill's
					 * inputs (made at its first call) */
	int prefill_batch;		/* prefill chunks of several views share a
					 * pass (kvmem_backend_opts.batch_prefill,
					 * the GEMMs pinned) */
};

/* place() methods (the "place" setting) */
enum { CUDA_PLACE_GATHER = 0, CUDA_PLACE_BATCH = 1, CUDA_PLACE_PACK = 2 };
/* Device memory kept free under a cap for what is not counted (cuBLASLt's
 * workspace, the ops' scratch, the CUDA context's own). */
#define CUDA_CAP_MARGIN (256ull << 20)

/* cudaMalloc of `bytes` into *p, counted into *count when count is set. */
int cuda_dev_alloc(void *p, size_t bytes, uint64_t *count);
/* Pinned host memory (cudaMallocHost). */
int cuda_pinned(void *p, size_t bytes);
/* Room for n scatter items on both sides. */
int cuda_items_room(struct cuda *b, int n);

/* cuda_ring.c: gather items in two halves, each with the event of the
 * kernel that read it, so that a place() reading only device memory need
 * not wait for its kernel. room: cap >= n (waits for what is queued before
 * it frees; count: device bytes, counted). host: the half to fill (waits
 * for that half's last kernel). upload: the filled n items to the device
 * (*dev: where the kernel reads them). queued: the kernel is queued, the
 * next call takes the other half. quiet: wait for every armed half. */
struct cuda_ring {
	kvmem_gather_item *dev, *host;	/* 2 * cap each */
	int cap, half;
	void *ev[2];			/* cudaEvent_t */
	int armed[2];
};
int cuda_ring_room(struct cuda_ring *r, kvmem_cuda_ctx *c, int n, uint64_t *count);
kvmem_gather_item *cuda_ring_host(struct cuda_ring *r);
int cuda_ring_upload(struct cuda_ring *r, kvmem_cuda_ctx *c, int n, kvmem_gather_item **dev);
int cuda_ring_queued(struct cuda_ring *r, kvmem_cuda_ctx *c);
int cuda_ring_quiet(struct cuda_ring *r, kvmem_cuda_ctx *c);
void cuda_ring_free(struct cuda_ring *r);
/* An event marking the stream's point now (armed), its wait, its end. */
int cuda_mark(void **ev, int *armed, kvmem_cuda_ctx *c);
int cuda_mark_wait(void *ev, int *armed);
void cuda_mark_free(void **ev, int *armed);
/* Items a block of a gather kernel takes (its `run`): the mean run of
 * consecutive items at the same slots (the session queues a block of
 * tokens' layers one after another), whose rotary angles a block then
 * computes once. At most 64; an uneven run only costs a block its angles
 * twice. */
int cuda_slot_run(const kvmem_gather_item *it, int n);
/* cuda_host.c: pinned host memory for the sessions' rows (host_alloc /
 * host_free), kept when freed for the next session of the same size. */
int cuda_rows_create(struct cuda *b);
void cuda_rows_destroy(struct cuda *b);
int cuda_rows_alloc(struct cuda *b, size_t bytes, void **p);
void cuda_rows_free(struct cuda *b, void *p);
/* cuda_fwd_index.c: queue the index's summaries of the n tokens whose raw
 * K ([L][n][H][D] bf16) is at raw_k on the device, and their copies into
 * ix's host buffers, on the compute stream (kvmem_fwd_index). */
int cuda_fwd_index(struct cuda *b, const uint16_t *raw_k, int n, const kvmem_fwd_index *ix);
int cuda_fwd_index_holds(void *ctx, uint32_t key, int64_t upto);
void cuda_fwd_index_destroy(struct cuda *b);

/* cuda_view.c: the view half of the ops table. */
int cuda_view_create(void *ctx, kvmem_view **v);
void cuda_view_destroy(void *ctx, kvmem_view *v);
int cuda_reserve(void *ctx, kvmem_view *v, int64_t slots);
int64_t cuda_capacity(void *ctx, const kvmem_view *v);
int64_t cuda_length(void *ctx, const kvmem_view *v);
int cuda_set_length(void *ctx, kvmem_view *v, int64_t len);
int cuda_place(void *ctx, kvmem_view *v, const kvmem_place *items, int n);
int cuda_keep_raw(void *ctx, kvmem_view *v);
/* Give the view's raw K up (a path that cannot write it, the cap): moves
 * then say -ENOTSUP and the session places from pages. */
void cuda_view_drop_raw(struct cuda *b, kvmem_view *v);
/* cuda_page.c: move() over a snapshot of each layer's raw K and V. */
int cuda_move(void *ctx, kvmem_view *v, const kvmem_move *items, int n);
/* Device bytes counted against the cap: weights, views, scratch, paging. */
uint64_t cuda_dev_used(const struct cuda *b);

/* cuda_fwd.c: the forward pass (KVMEM_CUDA_GRAPH: decode as a CUDA graph) */
int cuda_fwd_create(struct cuda *b);
void cuda_fwd_destroy(struct cuda *b);
/* Drop the decode graphs that hold device memory about to be freed (a
 * view's K or V, the logits buffer; NULL, nothing allocated yet: none). */
void cuda_fwd_forget(struct cuda *b, const void *dev);
int cuda_forward(void *ctx, kvmem_view *v, const int32_t *tokens, int n, float *logits,
		 int all_logits, const kvmem_fwd_out *out);
/* A layer in three parts, for cuda_fwd_prefill.c's rows of several views:
 * the device pointers of a call's inputs, and where its raw q, K, V go
 * (layer l's at oq + l * sq, ok + l * sk, ov + l * sk) ... */
struct fwd_ptrs {
	const int32_t *ids, *pos, *n_kv;
	const kvmem_scatter_item *items;
	uint16_t *oq, *ok, *ov;
	size_t sq, sk;
	uint16_t *hk, *hv;	/* typed rows: host [L][n][kw] bf16, or NULL */
	void *const *pages;	/* kvmem_fwd_out.pages ([L][nb]), or NULL */
	int pt0, pb, pnb;	/* its page_t0, page_block, blocks */
	int p8;			/* its pages are fp8 (page_dtype) */
};
/* ... and one view's rows in the scratch: its qkv, q, attention output
 * and RoPE angles (cuda_fwd_rows_at: from row a). */
struct fwd_rows {
	uint16_t *qkv, *q, *att;
	double *ang;
};
void cuda_fwd_rows_at(struct cuda *b, int a, struct fwd_rows *r);
/* 1 when a call's out asks for any of the forward's outputs. */
int cuda_fwd_wants_out(const kvmem_fwd_out *out);
/* p's host side from out (NULL: none) for a call of n tokens: the typed
 * rows, the pages and where the first row falls in them. */
void cuda_fwd_out_ptrs(struct fwd_ptrs *p, const kvmem_fwd_out *out, int n);
/* A call's inputs for view v: its key count after the n new tokens and a
 * scatter item a layer (the tokens at slots len..). */
void cuda_fwd_view_in(const struct cuda *b, const kvmem_view *v, int n, int32_t *n_kv,
		      kvmem_scatter_item *items);
/* The embedding of n ids into x and the angles of their positions (device). */
int cuda_fwd_embed(struct cuda *b, const int32_t *ids, const int32_t *pos, int n);
int cuda_fwd_qkv(struct cuda *b, int l, int n);
int cuda_fwd_attend(struct cuda *b, kvmem_view *v, int l, int n, int want_out,
		    const struct fwd_ptrs *p, const struct fwd_rows *r);
int cuda_fwd_mlp(struct cuda *b, int l, int n);
int cuda_fwd_rows_down(struct cuda *b, int l, int n, const struct fwd_ptrs *p);
/* Wait for the typed rows and pages sent down (0, or -EIO). */
int cuda_fwd_rows_wait(struct cuda *b);
int cuda_fwd_pages_ready(struct cuda *b, const kvmem_fwd_out *out, int n);
int cuda_fwd_download_f32(struct cuda *b, float *dst, const uint16_t *src, int L, int n, int rows,
			  size_t w);
/* Room for `rows` logits rows in b->logits (the graphs holding it dropped). */
int cuda_fwd_logit_rows(struct cuda *b, int rows);

/* The rows the GEMMs' algorithm is picked for when the backend batches
 * prefill (kvmem_gpu_check --gemm-pin, H100: the four 8B layer GEMMs at 206
 * rows 0.244 ms against 0.220 unpinned, at 1024 rows 0.657 against 0.558;
 * picked for 1024 rows instead: 0.362 and 0.578). */
#define CUDA_PREFILL_PIN_ROWS 256
/* cuda_fwd_prefill.c: prefill chunks of several views in one pass (the
 * GEMMs pinned, c->gemm_pin; -ENOTSUP when they are not). */
int cuda_prefill_batch(struct cuda *b, const kvmem_fwd_item *items, int n);
void cuda_fwdp_destroy(struct cuda *b);

/* cuda_fwd_batch.c: forward_batch (decode items; -ENOTSUP otherwise) */
int cuda_forward_batch(void *ctx, const kvmem_fwd_item *items, int n);
int cuda_logits_fetch(void *ctx, kvmem_view *v, float *dst);
void cuda_view_logits_free(struct cuda *b, kvmem_view *v);
void cuda_fwdb_destroy(struct cuda *b);

/* cuda_page.c */
int cuda_pages_place(struct cuda *b, kvmem_view *v, const kvmem_place *items, int n);
/* The device's address of [p, p + len) in registered host memory, or NULL. */
const void *cuda_pages_dev_addr(struct cuda *b, const void *p, size_t len);
int cuda_pages_method(struct cuda *b);
void cuda_pages_count_pack(struct cuda *b, const kvmem_place *items, int n, double ns);
/* fp8 views and the device page pool (KVMEM_CUDA_FP8_POOL): 1 when the
 * pool keeps fp8 pages, 0 when not, an error for a bad value. */
int cuda_pages_fp8_pool(struct cuda *b);
/* With it on: at[i] the device's address of a pool slot holding item i's
 * page as the page holds it (K, V, their scales: kvmem_page_at's layout),
 * or NULL; whole pages of registered memory enter it on their way. The
 * pages copied in, their copies not waited for (wait before the pages
 * they read may go), or an error. */
int cuda_pages_fp8_at(struct cuda *b, int64_t view_cap, const kvmem_place *items, int n,
		      const char **at);
/* count_pack's counters for fp8 place(); the items of at[i] set came
 * from the pool (no bytes in now). */
void cuda_pages_count_fp8(struct cuda *b, const kvmem_place *items, int n,
			  const char *const *at, double ns);
void cuda_pages_count_move(struct cuda *b, uint64_t tokens, uint64_t staged, double ns);
/* fp8 place() from the device pool by page_cached()'s tokens alone: 1 when
 * every item's slot is in at (counted but for the time), else 0. */
int cuda_pages_fp8_tokens(struct cuda *b, const kvmem_place *items, int n, const char **at);
void cuda_pages_count_ns(struct cuda *b, double ns);
int cuda_pool_watch(void *ctx, const void *region, uint32_t owner, kvmem_pool_report_fn fn,
		    void *arg);
uint64_t cuda_pages_dev_bytes(const struct cuda *b);
void cuda_pages_drop_pool(struct cuda *b);
void cuda_pages_destroy(struct cuda *b);
int cuda_host_register(void *ctx, void *base, size_t len);
void cuda_host_unregister(void *ctx, void *base);
int cuda_host_pinned(void *ctx, const void *base);
int cuda_page_cached(void *ctx, const void *region, uint32_t owner, int64_t block, int layer,
		     uint64_t *token);
int cuda_pool_fill(void *ctx, const kvmem_place *items, int n);
void cuda_place_stats(void *ctx, kvmem_place_stats *st);
int cuda_set(void *ctx, const char *key, const char *value);
int cuda_copy_ceilings(struct cuda *b, kvmem_ceilings *out);

/* cuda_view_fp8.c: fp8 views. view_bytes: device bytes of cap slots. */
uint64_t cuda_fp8_view_bytes(const struct cuda *b, int64_t cap, int keep);
int cuda_fp8_keep_raw(struct cuda *b, kvmem_view *v);
/* move() over the raw K kept beside the view (-ENOTSUP without it). */
int cuda_fp8_move(struct cuda *b, kvmem_view *v, const kvmem_move *items, int n);
int cuda_fp8_reserve(struct cuda *b, kvmem_view *v, int64_t slots);
void cuda_fp8_view_free(struct cuda *b, kvmem_view *v);	/* its memory: cap 0 */
void cuda_fp8_view_destroy(struct cuda *b, kvmem_view *v);	/* and the view */
/* The view's slots 0..len-1 dequantised into host fp32 (host_view: tests
 * that look inside), kept with the view until the next call; NULL with a
 * message on failure. */
const kvmem_kvcache *cuda_fp8_host_view(struct cuda *b, kvmem_view *v);
int cuda_fp8_place(struct cuda *b, kvmem_view *v, const kvmem_place *items, int n);
/* Layer l's attention input over an fp8 view: the n new tokens' K and V
 * (normalised K and raw V columns of qkv, rows ld apart) into the view at
 * the device item's slot, then attention of the rotated queries q
 * (positions pos, device) over slots 0..len+n-1 into att. n_kv: the key
 * count on the device (decode). */
int cuda_fp8_layer(struct cuda *b, kvmem_view *v, int l, int n, const uint16_t *qkv, int ld,
		   const kvmem_scatter_item *item, const int32_t *pos, const int32_t *n_kv);
void cuda_fp8_destroy(struct cuda *b);

/* cuda_score.c: the score op and its mirrors */
int cuda_mirror_create(void *ctx, void **out);
void cuda_mirror_destroy(void *ctx, void *mirror);
uint64_t cuda_mirror_bytes(void *ctx, const void *mirror);
int cuda_score(void *ctx, void *mirror, const char *scorer, const kvmem_score_input *ix,
	       const float *gq, const kvmem_score_geom *g, float *scores);

#endif

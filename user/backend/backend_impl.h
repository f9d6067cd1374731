/* SPDX-License-Identifier: MIT */
/*
 * The backend seam from the inside: the ops table a backend implements and
 * the session drives. Private to the library and the in-tree programs (the
 * benchmarks measure through it); the public face is kvmem/backend.h, an
 * opaque kvmem_backend and its views.
 *
 * A backend owns the model's weights in its own form and its views. A view
 * is one session's execution view: per layer, the K (rotated at compact slot
 * positions 0..len-1) and V the next tokens attend to. Several views may
 * live on one backend (sessions interleaved at step boundaries, a
 * full-context twin beside a session); calls on one backend come from one
 * thread at a time. The view is opaque; the session never touches its
 * bytes, it only says what goes where:
 *
 *   forward   run n tokens at slots len..len+n-1 (their positions), causally
 *             over the view; they join it (len += n). Raw K / V and raw
 *             queries of the new tokens come back for the history, the
 *             index and selection, and logits for sampling.
 *   place     rematerialise: tokens of history pages go to view slots, K
 *             rotated from raw K at the slot's position, V copied. K is
 *             never rotated from an already rotated copy, so a token placed
 *             at the slot the forward pass gave it has the same bits.
 *   length / set_length / reserve
 *             the view's size: after a selection the session sets the
 *             length to the selected history's and the tail grows from
 *             there; slots past the length are scratch.
 *
 * Backends: "cpu" (user/backend/cpu.c, the reference engine of
 * user/engine/engine.h: fp32, bit-exact, OpenBLAS) and, when built with
 * nvcc, "cuda". A new backend is one ops table in kvmem_backends[].
 *
 * Exactness: with a budget that holds the whole workspace the view is the
 * identity layout, so a session's logits equal the same backend's plain
 * forward passes bit for bit (tests/unit/test_ws_session.c, run on every
 * backend through these ops).
 */
#ifndef KVMEM_BACKEND_IMPL_H
#define KVMEM_BACKEND_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "kernels/draw_fixed.h"
#include "kernels/kernels_bf16.h"
#include "kvmem/backend.h"
#include "kvmem/model.h"
#include "kvmem/source.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One rematerialisation: tokens u0..u0+n-1 of a page go to view slots
 * slot..slot+n-1 of `layer`. The page's K and V are [n_kv_heads][stride]
 * [head_dim]; stride is the block size B. */
typedef struct kvmem_place {
	int64_t block;		/* the page's block (a backend may cache by page) */
	/* Whose block numbers these are, among the sessions that share the
	 * page's host region (a pool pagers share: each numbers its blocks
	 * from 0): a session's own tag, never reused in a process. 0: the
	 * caller names none (a backend then caches only while the region
	 * has one user). */
	uint32_t owner;
	int layer;
	int u0, n;
	int stride;
	int64_t slot;
	kvmem_page page;
	/* page.mem KVMEM_MEM_BACKEND: the token page_cached() gave with its
	 * yes (0: none), so the backend can find the page again without a
	 * second lookup while its answer holds. */
	uint64_t cached;
} kvmem_place;

/* One execution view, owned by its backend. */
typedef struct kvmem_view kvmem_view;

/* One move inside a view: the n tokens at slots from..from+n-1 of `layer`
 * go to slots to..to+n-1. */
typedef struct kvmem_move {
	int32_t layer, n;
	int64_t from, to;
} kvmem_move;

/*
 * A session's block summaries as the device scorer reads them: host arrays
 * laid out [n_layers][n_kv_heads][cap_blocks][per][head_dim] in fp32 (per:
 * 1 for Mean-K, KVMEM_SUBBLOCKS for the sub-block means). They only grow;
 * when cap_blocks grows the arrays move (realloc) and the pointers say so.
 */
typedef struct kvmem_score_input {
	const float *meank;	/* Mean-K of every block */
	const float *sub;	/* sub-block means, or NULL when not kept */
	int64_t n_blocks, cap_blocks;
	int n_layers, n_kv_heads, head_dim;
} kvmem_score_input;

/* One sequence of a batched forward: n tokens at the end of view v, the
 * other arguments as forward()'s. argmax (may be NULL; a decode item's, n
 * 1, all_logits 0): the caller takes the logits lazily. A backend with
 * logits_fetch may then leave them beside the view instead of in logits
 * and write *argmax: the first of the highest logits, or -1 when one is
 * NaN or infinite (kvmem_argmax_finite's answer); one that does not
 * leaves *argmax as it was (the caller sets KVMEM_ARGMAX_NONE) and writes
 * logits as usual. draw (NULL, or with argmax): the draw is at a temperature
 * instead, and *argmax gets kvmem_sample's token over the logits with the
 * spec's banned ids at -inf, from the state draw->rng (which the caller
 * advances by one value), or -1 when it is left to the host (NaN or an
 * infinity among the logits, every one banned). */
typedef struct kvmem_fwd_item {
	kvmem_view *v;
	const int32_t *tokens;
	int n;
	float *logits;
	int all_logits;
	const kvmem_fwd_out *out;
	int32_t *argmax;
	const kvmem_draw_spec *draw;
} kvmem_fwd_item;

#define KVMEM_ARGMAX_NONE (-2)	/* *argmax untouched: the logits came to the host */

/* An item whose logits a backend with logits_fetch leaves beside its view. */
static inline int kvmem_fwd_lazy(const kvmem_fwd_item *it)
{
	return it->argmax && it->n == 1 && !it->all_logits;
}

/* What a backend tells a watcher of its device page pool (pool_watch):
 * n pages that entered or left it, in order. */
typedef void (*kvmem_pool_report_fn)(void *arg, const kvmem_device_page *pages, int n);

typedef struct kvmem_backend_ops {
	const char *name;
	const char *what;	/* one line for --help */
	/* The dtype a forward pass's raw K / V rows come out in: 0 (fp32:
	 * kvmem_fwd_out.raw_k, v) or KVMEM_DTYPE_BF16 (raw_k_bf16, v_bf16,
	 * the device's own rows: nothing widened on the host). */
	uint32_t rows_dtype;
	/* 1: views can hold fp8 KV (kvmem_backend_opts.kv_dtype). */
	int fp8;
	/* 1: forward() writes bf16 pages for the session (kvmem_fwd_out.pages);
	 * page_rows_fp8 1: fp8 pages too (kvmem_fwd_out.page_dtype). */
	int page_rows, page_rows_fp8;
	/* 1: forward() makes the index's summaries (kvmem_fwd_out.index). */
	int index_rows;
	/* 0 when the backend can run here, else -errno with a message (no
	 * GPU, no driver). May be NULL: always available. */
	int (*available)(void);
	int (*create)(const kvmem_model *m, const kvmem_backend_opts *o, void **ctx);
	void (*destroy)(void *ctx);
	/* An empty view (length 0, capacity 0) / free it. */
	int (*view_create)(void *ctx, kvmem_view **v);
	void (*view_destroy)(void *ctx, kvmem_view *v);
	/* Room for `slots` view slots per layer; slots 0..length-1 keep
	 * their contents. Never shrinks. */
	int (*reserve)(void *ctx, kvmem_view *v, int64_t slots);
	int64_t (*capacity)(void *ctx, const kvmem_view *v);
	int64_t (*length)(void *ctx, const kvmem_view *v);
	/* Set the view's length (<= capacity): slots past it become scratch. */
	int (*set_length)(void *ctx, kvmem_view *v, int64_t len);
	/* See kvmem_forward() in engine.h for the arguments; outputs in host
	 * memory, fp32. Fails with nothing changed when there is no room. */
	int (*forward)(void *ctx, kvmem_view *v, const int32_t *tokens, int n, float *logits,
		       int all_logits, const kvmem_fwd_out *out);
	/* Rematerialise n items (any order; no two write one slot). */
	int (*place)(void *ctx, kvmem_view *v, const kvmem_place *items, int n);
	/* Optional: the view as host fp32 (the cpu backend's kvcache), for
	 * tests and tools that look inside; NULL elsewhere. */
	const kvmem_kvcache *(*host_view)(void *ctx, const kvmem_view *v);
	/* Optional: measure the ceilings now (a second or two). */
	int (*ceilings)(void *ctx, kvmem_ceilings *out);
	/* Optional: bytes of device memory the backend holds now (weights,
	 * views, scratch). */
	uint64_t (*mem_used)(void *ctx);
	/* Optional: host memory [base, base + len) will hold pages place()
	 * reads (a pager's host pool): pin and map it so the device reads the
	 * pages where they are, with no staging copy. Counted per base: each
	 * register needs its unregister, which must come before the memory
	 * is unmapped. -ENOTSUP (or any failure): place() stages instead. */
	int (*host_register)(void *ctx, void *base, size_t len);
	void (*host_unregister)(void *ctx, void *base);
	/* Optional: 1 when host memory at base is registered already (by
	 * any holder: a further host_register of it is only a count), else 0.
	 * Pinning costs (cuda: 0.43 s for a 2.7 GB pool on the H200 host). */
	int (*host_pinned)(void *ctx, const void *base);
	/* Optional, with page_cached: from now on call fn(arg, pages, n)
	 * with the pages of (region, owner) that enter the device page pool
	 * (a slot: page_cached says yes from then on) and leave it
	 * (KVMEM_DEVICE_NONE: evicted, the pool dropped or remade, the region
	 * unregistered), at the latest when the call that changed them
	 * returns, on its thread. fn NULL ends the watch. Only a report (the
	 * session hands it to its source's device op): 0, or -ENOMEM. */
	int (*pool_watch)(void *ctx, const void *region, uint32_t owner, kvmem_pool_report_fn fn,
			  void *arg);
	/* Optional: 1 when the backend holds page (block, layer) of owner's
	 * pages in `region` (a base given to host_register; owner as in
	 * kvmem_place) in its own memory (the device page pool). The session may then queue a place item for it
	 * without getting the page from its source: page.mem
	 * KVMEM_MEM_BACKEND, page.k = region. The answer holds until the next
	 * place() call, which takes such items before anything is evicted.
	 * token (may be NULL): set with a yes, for the item's `cached`. */
	int (*page_cached)(void *ctx, const void *region, uint32_t owner, int64_t block,
			   int layer, uint64_t *token);
	/* Optional: keep these pages in the device page pool without placing
	 * them (whole bf16 pages of a registered region: u0 0, n = stride;
	 * block, layer, owner as in place(); slot unused), so that a later
	 * place() reads them from device memory. Only free slots are taken:
	 * nothing the pool holds is evicted for them. Synchronous: the pages
	 * may be put when it returns. Returns how many of the n are in the
	 * pool now (there already, or copied); fewer than n when it is full
	 * or an item is not one it keeps. */
	int (*pool_fill)(void *ctx, const kvmem_place *items, int n);
	/* Optional: place()'s counters. */
	void (*place_stats)(void *ctx, kvmem_place_stats *st);
	/* Optional: a named knob for tools and benchmarks (cuda: "place" =
	 * "gather" | "batch" | "stage"; "pool" = device page pool bytes, or
	 * "default"; "gather_threads" = 256, 512, 768 or 1024).
	 * -EINVAL for an unknown key or value. */
	int (*set)(void *ctx, const char *key, const char *value);
	/*
	 * Optional: selection scoring on the device, the twins of the host
	 * scorers (kernels/cpu/score.c) over a device copy of a session's
	 * index, given as plain arrays (kvmem_score_input: the backend never
	 * sees the session's index). A mirror is that copy, empty when made,
	 * tied to one index (which only grows): score() first brings it up to
	 * date (the blocks appended since its last call, and that call's last
	 * block again, as it may have grown), then fills scores[g->n_blocks]
	 * in host memory.
	 * scorer "meank" or "subblock", gq [n_layers * n_kv_heads][head_dim]
	 * in host memory as kvmem_group_queries() gives it, g as
	 * ws_score_geom() fills it (the host index's). -ENOTSUP: not here
	 * (another scorer, or the copy would pass index_mem or the cap: the
	 * mirror then gives its memory back and stays empty); the caller
	 * scores on the host. mirror_bytes: device bytes it holds.
	 */
	int (*mirror_create)(void *ctx, void **mirror);
	void (*mirror_destroy)(void *ctx, void *mirror);
	int (*score)(void *ctx, void *mirror, const char *scorer, const kvmem_score_input *in,
		     const float *gq, const kvmem_score_geom *g, float *scores);
	uint64_t (*mirror_bytes)(void *ctx, const void *mirror);
	/* Optional: host memory the device copies into directly (pinned), for
	 * a forward pass's typed rows. host_free(ctx, NULL) does nothing. */
	int (*host_alloc)(void *ctx, size_t bytes, void **p);
	void (*host_free)(void *ctx, void *p);
	/*
	 * Optional, together: the view keeps every slot's raw K beside its
	 * rotated K (keep_raw, asked before the view's first token: forward,
	 * place and move write it), so a token already in the view can change
	 * slots without its page: move() re-rotates K at the new slot from
	 * the raw K of the old one (never from the rotated copy: the bits of
	 * a place() from the page at that slot) and moves V and the raw K.
	 * Every item reads the view as it was before the call, so sources
	 * and destinations may overlap in any way; two items must not write
	 * one slot. keep_raw -ENOTSUP / -ENOMEM, or move -ENOTSUP (the raw
	 * copy was given up, e.g. under a device memory cap): the caller
	 * places those tokens from their pages instead.
	 */
	int (*keep_raw)(void *ctx, kvmem_view *v);
	int (*move)(void *ctx, kvmem_view *v, const kvmem_move *items, int n);
	/* Optional: the GPUs this backend could spread over (--tp); NULL: it
	 * runs one rank only (cpu). */
	int (*devices)(void);
	/*
	 * Optional: forward() over n items in one pass, each on its own view
	 * (no two share one): the rows of all of them through each weight
	 * at once, each attending to its own view only. Batch invariant:
	 * every item's view, rows and logits have the bits forward() gives
	 * it alone. Fails with nothing changed (any item's error); the
	 * caller may then run the items one by one to learn whose it was.
	 * Absent, or -ENOTSUP (cuda: another decode attention, or turned
	 * off): the caller runs them one by one.
	 */
	int (*forward_batch)(void *ctx, const kvmem_fwd_item *items, int n);
	/* Optional, with forward_batch: an item whose logits stayed beside
	 * its view (kvmem_fwd_item.argmax) gets them here, vocab floats into
	 * dst, until the view's next forward. A batched decode step of greedy
	 * draws then copies no logits to the host (the cuda backend: 0.6 MB
	 * an item at Qwen3's vocabulary, 39 MB a step of 64; issue #26). */
	int (*logits_fetch)(void *ctx, kvmem_view *v, float *dst);
	/* With index_rows: 1 when the backend's running summaries are key's
	 * and end at token upto (a forward may then go on from them: not
	 * fresh), else 0. One backend serves many sessions, so a session's
	 * own bookkeeping cannot know whether another's chunk came between. */
	int (*index_holds)(void *ctx, uint32_t key, int64_t upto);
	/* Optional: bytes a weight element takes as the forward reads it (4:
	 * the cpu engine's fp32 weights, 2: its bf16 copies); absent: 2 (bf16
	 * on the device). What a benchmark's decode roofline counts. */
	int (*weight_bytes)(void *ctx);
} kvmem_backend_ops;

struct kvmem_backend {
	const kvmem_backend_ops *ops;
	void *ctx;
	const kvmem_model *model;
	kvmem_backend_opts opts;	/* defaults resolved */
};

/* NULL-terminated: "cpu", then "cuda" when built with it. */
extern const kvmem_backend_ops *const kvmem_backends[];

/* The cpu backend with chunks of max_chunk: NULL + kvmem_error on failure. */
kvmem_backend *kvmem_backend_cpu(const kvmem_model *m, int max_chunk);

/* kvmem_backend_append() with the forward pass's optional outputs (raw K,
 * V, raw queries: engine/engine.h). */
/* Whether backend ops can run o->tp ranks of m (backend_tp.c): 0, or
 * -EINVAL / -ENODEV / -ENOTSUP with a message (kvmem_backend_opts.tp). */
int kvmem_backend_tp_check(const kvmem_backend_ops *ops, const kvmem_model *m,
			   const kvmem_backend_opts *o);

int kvmem_backend_append_out(kvmem_backend *b, kvmem_view *v, const int32_t *tokens, int n,
			     float *logits, int all_logits, const kvmem_fwd_out *out);

/* forward_batch on b, or -ENOTSUP (with a message) when b has none. */
int kvmem_backend_forward_batch(kvmem_backend *b, const kvmem_fwd_item *items, int n);

#ifdef __cplusplus
}
#endif
#endif

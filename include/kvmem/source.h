/* SPDX-License-Identifier: MIT */
/*
 * The page-source seam: where the raw K and V of history pages live.
 *
 * A page is one block in one layer: raw K [n_kv_heads][B][head_dim] and V
 * [n_kv_heads][B][head_dim] (raw K: after the model's k-norm, before RoPE,
 * so it does not depend on where the token will sit in a view). Tokens past
 * a block's length are unspecified.
 *
 * The session writes every token through a source and reads history back
 * only with get/put, so any store can stand behind the same ops:
 *
 *   source          where              pages          file
 *   memory          host malloc        f32, host      user/source/source_mem.c
 *   pager ("uring") host pool + NVMe   workspace's    user/source/source_pager.c
 *   kmod            /dev/kvmem window  workspace's    user/source/source_kmod.c
 *                   (committed pages; the pager's source writes)
 *
 * A source built on another store implements these ops from that store's
 * public API; tests/unit/test_page_source.c runs one suite over every source.
 */
#ifndef KVMEM_SOURCE_H
#define KVMEM_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "kvmem/kvmem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with -fvisibility=hidden: what is declared here is its API. */
#pragma GCC visibility push(default)

/* Where a page's bytes are. */
/* KVMEM_MEM_BACKEND: no bytes here; the backend's own copy (a place item
 * the session made after the backend's page_cached() said yes). */
enum kvmem_mem { KVMEM_MEM_HOST = 0, KVMEM_MEM_DEVICE = 1, KVMEM_MEM_BACKEND = 2 };

/* One page as get returns it: valid until put. */
typedef struct kvmem_page {
	const void *k;		/* raw K [n_kv_heads][block][head_dim] */
	const void *v;		/* V, the same layout */
	uint32_t dtype;		/* enum kvmem_dtype of both */
	uint32_t mem;		/* enum kvmem_mem: where k and v point */
	/* KVMEM_DTYPE_FP8 only: the rows' scales [n_kv_heads][block], fp32,
	 * one per scale_run (= head_dim) elements of k and of v. */
	const float *k_scale, *v_scale;
	uint32_t scale_run;
} kvmem_page;

/* One page of a source in a backend's device page pool (a GPU's memory:
 * the third tier, above host memory and disk): it entered the pool at
 * `slot`, or left it (slot KVMEM_DEVICE_NONE). */
#define KVMEM_DEVICE_NONE UINT32_MAX
typedef struct kvmem_device_page {
	int64_t block;
	int32_t layer;
	uint32_t slot;
} kvmem_device_page;

typedef struct kvmem_page_source_ops {
	const char *name;	/* "mem", "pager", "kmod" */
	/* Store tokens t0..t0+n-1 of block b, layer l; k and v are fp32,
	 * token-major [n][n_kv_heads][head_dim] (rows of a forward pass's
	 * kvmem_fwd_out). The source keeps them in its own dtype. Tokens of
	 * a layer come in order with no gap (-EINVAL); writing again from an
	 * earlier token replaces what was there from that token on, where the
	 * source can (memory); a source whose pages are durable refuses to
	 * change them (the pager: staged-out blocks). */
	int (*write)(void *ctx, int64_t b, int layer, int t0, int n, const float *k,
		     const float *v);
	/* The page's bytes, until put. */
	int (*get)(void *ctx, int64_t b, int layer, kvmem_page *pg);
	void (*put)(void *ctx, int64_t b, int layer);
	/* Optional: these blocks (all layers) will be read soon. */
	void (*prefetch)(void *ctx, const int64_t *blocks, int n);
	/* Optional: the selector's view of n blocks this step, each score in
	 * [0, 1] (1: in the view); a cache may keep them accordingly. */
	void (*hint)(void *ctx, const int64_t *blocks, const float *scores, int n);
	/* Optional: tokens 0..n_tokens-1 are all written (a commit point). */
	int (*sync)(void *ctx, int64_t n_tokens);
	void (*destroy)(void *ctx);
	/* Optional: the host memory most pages get returns live in (a pager's
	 * host pool), for a backend to pin and map once (host_register in
	 * kvmem/backend.h) so it reads them where they are. It stays mapped
	 * until the source is destroyed. 0, or -ENOENT when there is none. */
	int (*region)(void *ctx, void **base, size_t *len);
	/* Optional: persist the history at a step boundary: token ids [0, n)
	 * (n the tokens written through the source), their pages, and `app`
	 * (opaque bytes stored with the commit: the session's state), made
	 * durable together. Sources over a store (the pager, the module). */
	int (*commit)(void *ctx, const int32_t *ids, int64_t n, const void *app, uint32_t app_len);
	/* Optional: tokens p0..p0+n-1 of every layer in one call, as typed
	 * rows: k and v [n_layers][n][n_kv_heads][head_dim] in dtype
	 * (KVMEM_DTYPE_F32, or KVMEM_DTYPE_BF16: a GPU's rows, never widened),
	 * host memory. The rules of write hold for each layer. A source that
	 * has it takes a forward pass's rows whole (and may spread the copies
	 * over threads); -ENOTSUP for a dtype it does not take, with nothing
	 * written: the caller then writes fp32 through write. */
	int (*write_rows)(void *ctx, int64_t p0, int n, const void *k, const void *v,
			  uint32_t dtype);
	/* Optional: the pages tokens p0..p0+n-1 of every layer are to be
	 * written in, so that a backend writes a forward pass's rows there
	 * itself (a GPU copying straight into pinned host memory): pages
	 * [l * nb + i] gets layer l's page of the i-th block from p0's, nb =
	 * (p0 % block + n - 1) / block + 1, pages of the workspace layout in
	 * the source's region: bf16, or fp8 where page_dtype says so (each
	 * row quantised as kvmem_fp8_quant_row does). The rows then come as
	 * write_rows(p0, n, NULL, NULL, KVMEM_DTYPE_BF16), which counts them
	 * in (the rules of write hold). It is the one call that may run
	 * while an earlier write_rows is under way on another thread.
	 * -ENOTSUP (pages of another dtype, or not in the region): write the
	 * rows instead. */
	int (*row_pages)(void *ctx, int64_t p0, int n, void **pages);
	/* Optional: 1 when get(b, layer) would find the page in host memory
	 * and it never changes again (no read from a slower tier; not a
	 * block still filling), else 0. A hint: it may be stale by the time
	 * get runs. A session fills a device page pool only with such pages. */
	int (*resident)(void *ctx, int64_t b, int layer);
	/* Optional: pages of this source entered or left the backend's
	 * device page pool, in the order they did (the session forwards what
	 * the backend reports while the source's region is registered on it),
	 * so a store can record which of its pages a GPU holds (the module:
	 * KVMEM_IOC_GPU). Only a report: the pages stay the source's. */
	void (*device)(void *ctx, const kvmem_device_page *pages, int n);
	/* Optional, with row_pages: the dtype of the pages it gives,
	 * KVMEM_DTYPE_BF16 or KVMEM_DTYPE_FP8 (absent: bf16). */
	uint32_t (*page_dtype)(void *ctx);
} kvmem_page_source_ops;

typedef struct kvmem_page_source {
	const kvmem_page_source_ops *ops;
	void *ctx;
} kvmem_page_source;

/* Pages in host memory (f32), allocated a block (all layers) at a time. */
int kvmem_page_source_mem(kvmem_page_source *src, int n_layers, int n_kv_heads, int head_dim,
			  int block);
/* The same with pages of dtype KVMEM_DTYPE_F32 or KVMEM_DTYPE_BF16 (half the
 * bytes; fp32 rows written to it round to the nearest even bf16, so it is
 * for rows that are bf16 values: a session on a backend whose rows are
 * bf16 keeps its history in one). -EINVAL for another dtype. */
int kvmem_page_source_mem_dtype(kvmem_page_source *src, int n_layers, int n_kv_heads,
				int head_dim, int block, uint32_t dtype);
/* The source's commit op; -ENOTSUP for a source that keeps nothing (memory).
 * A session's decode step may return before its rows reach the source:
 * kvmem_session_sync first (kvmem_workspace_commit does it itself). */
int kvmem_page_source_commit(kvmem_page_source *src, const int32_t *ids, int64_t n,
			     const void *app, uint32_t app_len);
/* Destroy through the ops and clear *src (a cleared source is a no-op). */
void kvmem_page_source_destroy(kvmem_page_source *src);

/*
 * The page's K (or V) as fp32 host values, n elements: the page's own
 * pointer when it already is (f32 in host memory), else converted into
 * scratch (n floats). NULL + -ENOTSUP when the bytes are on a device.
 */
const float *kvmem_page_f32(const kvmem_page *pg, int is_v, size_t n, float *scratch);
/* Copy elements off..off+n-1 of the page's K (or V) into dst as fp32. */
int kvmem_page_copy_f32(const kvmem_page *pg, int is_v, size_t off, size_t n, float *dst);
/* pg for a page of the workspace layout at `base` in host memory: raw K,
 * V, and for fp8 the scales after them (Documentation/formats.md). */
void kvmem_page_at(kvmem_page *pg, const void *base, uint32_t dtype, int n_kv_heads, int block,
		   int head_dim);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif

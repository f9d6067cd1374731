/* SPDX-License-Identifier: MIT */
/*
 * The tiered store: pages of KV history in a host pool and in a workspace
 * directory on NVMe, moved through io_uring, or in a Ceph pool (a `dir` of
 * rados://POOL/NAME). See Documentation/pager.md for the tiers, replacement
 * policies, staging, stores, the crash rule, counters and probes, and
 * Documentation/formats.md ("Workspace directory", "Workspace in RADOS").
 *
 * A page is the KV of one block in one layer: raw K [H_kv][B][D] followed by
 * V [H_kv][B][D], in the workspace's dtype. The pager never looks inside a
 * page; it stores, checksums and moves bytes. Page id = block * L + layer, and
 * a block's L pages are one contiguous extent on disk.
 *
 * A pager is used from one thread at a time.
 */
#ifndef KVMEM_PAGER_H
#define KVMEM_PAGER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <linux/kvmem.h>

#include "kvmem/kvmem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with -fvisibility=hidden: what is declared here is its API. */
#pragma GCC visibility push(default)

/* ---- geometry ----------------------------------------------------------- */

typedef struct kvmem_page_geom {
	uint64_t fingerprint;	/* kvmem_config_fingerprint() of the model */
	uint32_t n_layers, n_heads, n_kv_heads, head_dim;
	uint32_t block_tokens;	/* B */
	uint32_t dtype;		/* enum kvmem_dtype */
	uint32_t index_bytes;	/* bytes of the per-block index record (0: none) */
} kvmem_page_geom;

/* 2 * H_kv * B * D * elem; fp8 adds 2 * H_kv * B fp32 scales */
size_t kvmem_page_bytes(const kvmem_page_geom *g);
size_t kvmem_page_stride(const kvmem_page_geom *g);	/* page bytes rounded up to KVMEM_IO_ALIGN */
/* Check sizes are positive and representable; `name` is used in messages. */
int kvmem_page_geom_check(const kvmem_page_geom *g, const char *name);
/* "L=28 Hq=16 Hkv=8 D=128 B=32 f32 index=28672 fp=0x..." into buf. */
char *kvmem_page_geom_str(const kvmem_page_geom *g, char *buf, size_t len);

static inline uint64_t kvmem_page_id(const kvmem_page_geom *g, uint64_t block, uint32_t layer)
{
	return block * g->n_layers + layer;
}

/* ---- replacement policies ---------------------------------------------- */
/* Which resident pages leave the host pool when room is needed
 * (kvmem_pager_opts.policy, Documentation/pager.md): i from 0 until NULL,
 * the name, and a line for --help in *what when what is not NULL. */
const char *kvmem_repl_at(int i, const char **what);

/* ---- counters ----------------------------------------------------------- */
#define KVMEM_PAGER_STATS(X)							\
	X(steps, "step boundaries")						\
	X(commits, "commits (committed count advanced durably)")		\
	X(host_hits, "fetched pages found in the host pool")			\
	X(host_misses, "fetched pages not in the host pool")			\
	X(staging_hits, "misses served from the stage-out buffer or memory")	\
	X(pages_in, "pages read from NVMe")					\
	X(bytes_in, "bytes read from NVMe")					\
	X(read_requests, "NVMe read requests (a request covers a page run)")	\
	X(read_ns, "nanoseconds NVMe reads were outstanding, summed")		\
	X(fetch_wait_ns, "nanoseconds fetch waited for NVMe")			\
	X(prefetch_pages, "pages asked ahead by prefetch")			\
	X(prefetch_used, "prefetched pages later fetched")			\
	X(evictions, "pages evicted from the host pool")			\
	X(blocks_out, "blocks staged out")					\
	X(bytes_out, "bytes written to the pages file")				\
	X(write_ns, "nanoseconds stage-out writes were outstanding, summed")	\
	X(backpressure_waits, "appends that waited for a full stage-out buffer") \
	X(backpressure_ns, "nanoseconds appends waited for stage-out")		\
	X(commit_ns, "nanoseconds spent in commits")				\
	X(read_errors, "failed NVMe reads")					\
	X(write_errors, "failed NVMe writes")					\
	X(checksum_errors, "pages whose checksum did not match")

typedef struct kvmem_pager_stats {
#define KVMEM_STAT_FIELD(name, what) uint64_t name;
	KVMEM_PAGER_STATS(KVMEM_STAT_FIELD)
#undef KVMEM_STAT_FIELD
} kvmem_pager_stats;

/* ---- a workspace's manifest, summed up ---------------------------------- */
/* What the manifest of a workspace says (kvmem_workspace_info_read in
 * kvmem/store.h reads it; no data file is read). */
typedef struct kvmem_workspace_info {
	kvmem_page_geom geom;
	uint64_t tokens, blocks, generation;	/* committed */
	uint32_t tail_tokens, app_bytes;
	uint32_t page_bytes, page_stride;
} kvmem_workspace_info;

/* ---- the pager ---------------------------------------------------------- */
typedef struct kvmem_pager kvmem_pager;
/* A host pool: a pager's own, or one several pagers share. */
typedef struct kvmem_pager_pool kvmem_pager_pool;

/*
 * A host pool for several pagers of one geometry (kvmem serve's
 * conversations): bytes of pinned-to-be host memory in slots of g's page
 * stride, on numa_node (-1: local). Pagers opened with it (opts.pool) keep
 * their pages there instead of in a pool of their own, and one short of
 * room takes it from the others' least recently used pages (pages pinned,
 * being read or not yet written stay). Its memory is touched as pages
 * arrive and stays with the pool: a pager that closes gives its slots back.
 * Free it after the last pager closed (-EBUSY before).
 */
int kvmem_pager_pool_create(const kvmem_page_geom *g, uint64_t bytes, int numa_node,
			    kvmem_pager_pool **out);
int kvmem_pager_pool_free(kvmem_pager_pool *pool);
/* The pool's memory, [*base, *base + *len): what a backend pins once
 * (host_register) for every session over the pool, before the first. */
void kvmem_pager_pool_region(const kvmem_pager_pool *pool, void **base, size_t *len);

#define KVMEM_PAGER_CREATE	0x01	/* create the directory when it has no manifest */
#define KVMEM_PAGER_RDONLY	0x02	/* read committed data only; nothing is written */
#define KVMEM_PAGER_NO_DIRECT	0x04	/* buffered I/O even where O_DIRECT works */
#define KVMEM_PAGER_NO_KEEP	0x08	/* do not keep staged-out pages in the host pool */

typedef struct kvmem_pager_opts {
	uint64_t host_cap;	/* host pool bytes; 0: 256 MiB */
	int numa_node;		/* -1: local node (there is no GPU node here) */
	const char *policy;	/* "lru" (default), "lfu", "score" */
	uint64_t stage_bytes;	/* stage-out in-flight buffer; 0: 32 MiB; at least 2 extents */
	uint32_t queue_depth;	/* io_uring entries; 0: 64 */
	uint32_t max_read;	/* largest read request in bytes (runs of pages
				 * are cut there, at least one page); 0: 8 MiB */
	int flags;		/* KVMEM_PAGER_* */
	/* Called at each step boundary, e.g. to kvmem_pager_prefetch() pages for
	 * the next step. May be NULL. */
	void (*prefetch_hook)(void *arg, kvmem_pager *p, uint64_t next_step);
	void *prefetch_arg;
	/* A shared host pool (kvmem_pager_pool_create) instead of one of
	 * host_cap bytes; NULL: the pager's own. Its slots must be this
	 * geometry's page stride (-EINVAL). */
	kvmem_pager_pool *pool;
} kvmem_pager_opts;

/* Fill opts with the defaults. */
void kvmem_pager_opts_default(kvmem_pager_opts *o);

/*
 * Open the workspace directory `dir`. With KVMEM_PAGER_CREATE an absent or
 * empty directory becomes a new workspace with zero tokens (its parent must
 * exist); a directory holding anything else without a manifest is refused
 * (-ENOENT when it holds workspace files, -EEXIST other files), never
 * created over. An existing workspace must match `g` (its fingerprint and
 * geometry), else -ESTALE naming both fingerprints; g may be NULL with
 * KVMEM_PAGER_RDONLY to take whatever the manifest says. One writer at a
 * time: a second writable open fails with -EBUSY naming the holder's pid;
 * read-only opens never wait and never disturb the writer. Files are never
 * followed through symbolic links nor opened when not regular (-EBADMSG
 * naming them). Anything past the last commit is ignored (and cut off
 * unless read-only). A corrupt or truncated committed state is refused
 * (-EBADMSG), naming the file (see kvmem_workspace_salvage).
 */
int kvmem_pager_open(const char *dir, const kvmem_page_geom *g, const kvmem_pager_opts *o,
		   kvmem_pager **out);
/* Wait for stage-out, save counters, free everything. Does not commit.
 * Returns -errno when a write failed since the last commit (data past it
 * lost): -ENOSPC for a full disk, -EIO otherwise. */
int kvmem_pager_close(kvmem_pager *p);

const kvmem_page_geom *kvmem_pager_geom(const kvmem_pager *p);
const char *kvmem_pager_dir(const kvmem_pager *p);
uint64_t kvmem_pager_tokens(const kvmem_pager *p);		/* appended */
uint64_t kvmem_pager_blocks(const kvmem_pager *p);		/* appended full blocks */
uint64_t kvmem_pager_committed_tokens(const kvmem_pager *p);
/* Opaque bytes the last commit stored (the session's own state). */
const void *kvmem_pager_app_state(const kvmem_pager *p, uint32_t *len);

/* Append token ids (the history, in order). */
int kvmem_pager_append_tokens(kvmem_pager *p, const int32_t *ids, size_t n);
/*
 * Append full block `block` (must equal kvmem_pager_blocks()): layers[l] points
 * to page_bytes of layer l; index to index_bytes (NULL when index_bytes is 0).
 * The bytes are copied: stage-out proceeds asynchronously and this returns
 * at once unless the stage-out buffer is full (backpressure). Pages that
 * are the block's own memory (kvmem_pager_block_memory) are not copied:
 * they are written to disk from where they are and stay in the host pool.
 */
int kvmem_pager_append_block(kvmem_pager *p, uint64_t block, const void *const *layers,
			   const void *index);
/*
 * Host pool memory for block `block`'s pages before it is appended (block >=
 * kvmem_pager_blocks(); asked again, the same memory): layers[l] gets
 * page_bytes of layer l, to be filled and then handed to append_block as
 * they are, with no copy. -ENOBUFS when the pool has no room even after
 * waiting for the writes in flight, or when the blocks being made would
 * take more than half of it, -ENOTSUP read-only or with
 * KVMEM_PAGER_NO_KEEP: the caller then uses memory of its own. The memory
 * is the pager's until append_block, or until close.
 */
int kvmem_pager_block_memory(kvmem_pager *p, uint64_t block, void **layers);
/*
 * Make everything appended durable and advance the committed count to
 * kvmem_pager_tokens(). Full blocks must cover tokens / B; when tokens % B is
 * not zero, tail_layers/tail_index hold the partial block (else NULL). app:
 * up to KVMEM_PAGER_APP_MAX opaque bytes stored with the commit (in the
 * manifest, rewritten at each commit: keep it small when commits are many).
 */
#define KVMEM_PAGER_APP_MAX (16u << 20)
int kvmem_pager_commit(kvmem_pager *p, const void *const *tail_layers, const void *tail_index,
		     const void *app, uint32_t app_len);

int kvmem_pager_read_tokens(kvmem_pager *p, uint64_t first, size_t n, int32_t *out);
int kvmem_pager_read_index(kvmem_pager *p, uint64_t first_block, size_t n, void *out);
/* The partial block of the last commit (committed tokens % B of them);
 * returns that count (0: none, nothing written). */
int kvmem_pager_read_tail(kvmem_pager *p, void *const *layers, void *index);

/*
 * Bring pages into the host pool and pin them: hits come from the pool,
 * misses from the stage-out buffer or NVMe (one batch, consecutive pages in
 * one request). out[i] points to page i's bytes until it is released. Fails
 * when the pool cannot hold them all; a page whose read fails or whose
 * checksum does not match is never returned.
 */
int kvmem_pager_fetch(kvmem_pager *p, const uint64_t *pages, size_t n, const void **out);
void kvmem_pager_release(kvmem_pager *p, const uint64_t *pages, size_t n);

/* Stage in a plan of any size: fetch in batches that fit the pool and call
 * fn for every page (in plan order within a batch), then release it. */
typedef int (*kvmem_page_fn)(void *arg, uint64_t page, const void *data);
int kvmem_pager_stage_in(kvmem_pager *p, const uint64_t *pages, size_t n, kvmem_page_fn fn,
		       void *arg);

/* Start reading pages ahead without waiting (best effort: pages that do not
 * fit without evicting pinned ones are skipped). Returns pages started. */
int kvmem_pager_prefetch(kvmem_pager *p, const uint64_t *pages, size_t n);
/* Selector feedback for the score-aware policy (others ignore it). */
void kvmem_pager_hint(kvmem_pager *p, uint64_t block, float score);
/* Step boundary: reap finished I/O, age the policy, fire the step probe and
 * the prefetch hook. */
int kvmem_pager_step(kvmem_pager *p, uint64_t step);

/* Counters of this pager (since open), and the totals of the directory
 * (saved at each commit and close, plus this pager's since then). */
void kvmem_pager_stats_get(const kvmem_pager *p, kvmem_pager_stats *s);
void kvmem_pager_stats_total(const kvmem_pager *p, kvmem_pager_stats *s);
/* A file of the workspace directory (DIR/name), opened the pager's way:
 * under its directory descriptor, never through a link, never a FIFO or a
 * device. An fd, or -errno with a message naming the file. */
int kvmem_pager_open_file(const kvmem_pager *p, const char *name, int flags);
/* The counters as `kvmem stat` prints them, one per line. */
void kvmem_pager_stats_print(const kvmem_pager_stats *s, FILE *f);
/* The page's entry (NULL past the last page); valid until the next append. */
const struct kvmem_pte *kvmem_pager_pte(const kvmem_pager *p, uint64_t page);
/* The host pool's memory: where the pages fetch returns live, for a device
 * to register once (kvmem_backend's host_register). */
void kvmem_pager_region(const kvmem_pager *p, void **base, size_t *len);
/* 1 when the pages file uses O_DIRECT. */
int kvmem_pager_direct(const kvmem_pager *p);
/* 1 when the host pool and stage-out buffer go to io_uring as fixed
 * buffers, each 64 MiB piece registered when an I/O first uses it (0:
 * io_uring refused, e.g. RLIMIT_MEMLOCK; plain reads and writes are used,
 * with one warning; a piece refused later is said once too). */
int kvmem_pager_registered(const kvmem_pager *p);

/* The session's page source over a pager, and a session's history kept in
 * a workspace directory: include/kvmem/store.h. */

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif

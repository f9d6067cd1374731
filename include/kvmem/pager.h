/* SPDX-License-Identifier: MIT */
/*
 * The tiered store: pages of KV history in a host pool and in a workspace
 * directory on NVMe, moved through io_uring. See Documentation/pager.md for
 * the tiers, replacement policies, staging, the crash rule, counters and
 * probes, and Documentation/formats.md ("Workspace directory") for the files.
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

size_t kvmem_page_bytes(const kvmem_page_geom *g);	/* 2 * H_kv * B * D * elem */
size_t kvmem_page_stride(const kvmem_page_geom *g);	/* page bytes rounded up to KVMEM_IO_ALIGN */
/* Check sizes are positive and representable; `name` is used in messages. */
int kvmem_page_geom_check(const kvmem_page_geom *g, const char *name);
/* "L=28 Hq=16 Hkv=8 D=128 B=32 f32 index=28672 fp=0x..." into buf. */
char *kvmem_page_geom_str(const kvmem_page_geom *g, char *buf, size_t len);

static inline uint64_t kvmem_page_id(const kvmem_page_geom *g, uint64_t block, uint32_t layer)
{
	return block * g->n_layers + layer;
}

/* ---- host pool ---------------------------------------------------------- */
/*
 * Fixed-size slots in one 2 MiB-aligned anonymous mapping, advised for
 * transparent huge pages and bound to a NUMA node (libnuma), so it can be
 * registered with io_uring and pinned by CUDA as one region. Slots are handed
 * out in contiguous runs where possible, so consecutive pages of a block land
 * in consecutive slots and move as one large request.
 */
typedef struct kvmem_hostpool kvmem_hostpool;

/* cap: bytes; slot_bytes: multiple of KVMEM_IO_ALIGN; numa_node -1 = local. */
kvmem_hostpool *kvmem_hostpool_create(uint64_t cap, size_t slot_bytes, int numa_node);
void kvmem_hostpool_free(kvmem_hostpool *hp);
uint32_t kvmem_hostpool_slots(const kvmem_hostpool *hp);
uint32_t kvmem_hostpool_free_slots(const kvmem_hostpool *hp);
size_t kvmem_hostpool_slot_bytes(const kvmem_hostpool *hp);
void *kvmem_hostpool_slot(const kvmem_hostpool *hp, uint32_t slot);
/* Allocate up to `want` consecutive free slots; returns how many (0: none
 * free) and the first in *first. */
uint32_t kvmem_hostpool_alloc_run(kvmem_hostpool *hp, uint32_t want, uint32_t *first);
void kvmem_hostpool_release(kvmem_hostpool *hp, uint32_t first, uint32_t n);
int kvmem_hostpool_is_free(const kvmem_hostpool *hp, uint32_t slot);
/* The whole mapping (for io_uring / cudaHostRegister). */
void kvmem_hostpool_region(const kvmem_hostpool *hp, void **base, size_t *len);
int kvmem_hostpool_node(const kvmem_hostpool *hp);	/* -1 when NUMA is unavailable */
int kvmem_hostpool_huge(const kvmem_hostpool *hp);	/* 1 when MADV_HUGEPAGE was accepted */

/* ---- replacement policies ---------------------------------------------- */
/*
 * Which resident pages leave the host pool when room is needed. State is per
 * slot; the pager tells the policy about inserts, accesses and removals and
 * asks for victims, passing a predicate for slots that may not leave now
 * (pinned, being read).
 */
typedef int (*kvmem_slot_pred)(void *arg, uint32_t slot);

typedef struct kvmem_repl_ops {
	const char *name;
	const char *what;	/* one line for --help */
	void *(*create)(uint32_t n_slots, uint32_t n_layers);
	void (*destroy)(void *st);
	void (*insert)(void *st, uint32_t slot, uint64_t page, uint64_t step);
	void (*touch)(void *st, uint32_t slot, uint64_t step);
	void (*remove)(void *st, uint32_t slot);
	/* Selector feedback: block's score this step in [0, 1] (1: chosen). */
	void (*hint)(void *st, uint64_t block, float score, uint64_t step);
	void (*step)(void *st, uint64_t step);	/* step boundary: aging */
	/* Up to `want` evictable slots, best victims first; returns the count. */
	uint32_t (*victims)(void *st, uint32_t want, uint32_t *out, uint64_t step,
			    kvmem_slot_pred busy, void *arg);
} kvmem_repl_ops;

/* NULL-terminated list: lru, lfu, score. */
extern const kvmem_repl_ops *const kvmem_repl_policies[];
const kvmem_repl_ops *kvmem_repl_find(const char *name);

/*
 * A step sequence for replaying policies offline: step s fetches
 * pages[step_off[s] .. step_off[s + 1]) and, before that, hints
 * hint_block/hint_score[hint_off[s] .. hint_off[s + 1]) (hint_off may be
 * NULL). Pages of the step being fetched cannot be evicted, as in the pager.
 */
typedef struct kvmem_repl_trace {
	size_t n_steps;
	const size_t *step_off;
	const uint64_t *pages;
	const size_t *hint_off;
	const uint64_t *hint_block;
	const float *hint_score;
} kvmem_repl_trace;

/* Replay a trace on a pool of n_slots pages; returns the hit rate (or -1). */
double kvmem_repl_simulate(const kvmem_repl_ops *ops, uint32_t n_slots, uint32_t n_layers,
			 const kvmem_repl_trace *t, uint64_t *hits, uint64_t *misses);

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

/* ---- the pager ---------------------------------------------------------- */
typedef struct kvmem_pager kvmem_pager;

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
 * at once unless the stage-out buffer is full (backpressure).
 */
int kvmem_pager_append_block(kvmem_pager *p, uint64_t block, const void *const *layers,
			   const void *index);
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
/* The page's entry (NULL past the last page); valid until the next append. */
const struct kvmem_pte *kvmem_pager_pte(const kvmem_pager *p, uint64_t page);
kvmem_hostpool *kvmem_pager_hostpool(kvmem_pager *p);
/* 1 when the pages file uses O_DIRECT. */
int kvmem_pager_direct(const kvmem_pager *p);
/* 1 when the host pool and stage-out buffer are registered with io_uring
 * as fixed buffers (0: io_uring refused, e.g. RLIMIT_MEMLOCK; plain
 * reads and writes are used, with one warning). */
int kvmem_pager_registered(const kvmem_pager *p);

/* The session's page source over a pager, and a session's history kept in
 * a workspace directory: include/kvmem/store.h. */

/* ---- directory tools (no pager needed) --------------------------------- */
/* What the manifest of a workspace says (no data file is read). */
typedef struct kvmem_workspace_info {
	kvmem_page_geom geom;
	uint64_t tokens, blocks, generation;	/* committed */
	uint32_t tail_tokens, app_bytes;
	uint32_t page_bytes, page_stride;
} kvmem_workspace_info;
int kvmem_workspace_info_read(const char *dir, kvmem_workspace_info *wi);

/* Check every checksum of a workspace; writes one line per bad page/file to
 * `report` (and a summary). Returns the number of bad items, -errno when the
 * directory cannot be read as a workspace at all (-ENOENT no manifest,
 * -EBADMSG a corrupt one). A writer may commit meanwhile: a check that
 * raced with a commit is run again on the new commit. report may be NULL. */
long kvmem_workspace_verify(const char *dir, FILE *report, int verbose);

/*
 * Recovery: copy the longest prefix of a workspace that checks out — every
 * token (when the committed tokens' checksum holds), the full blocks whose
 * pages and index record all match their checksums up to the first one that
 * does not, the partial block when every full block was kept — into a new
 * workspace at `dest` (absent or an empty directory), never modifying
 * `dir`. The session state is kept only when nothing is dropped. `r` says
 * what was kept and what was lost. Returns 0 (dest written and committed),
 * or -errno: -EEXIST when dest is not empty, -EBADMSG when the manifest
 * itself cannot be read (nothing to go by).
 */
typedef struct kvmem_salvage_report {
	uint64_t tokens, tokens_kept;		/* committed in dir / written to dest */
	uint64_t blocks, blocks_kept;		/* full blocks */
	uint32_t tail_tokens, tail_kept;	/* the partial block: tokens / kept (0 or all) */
	int tokens_ok;				/* the committed tokens' checksum held */
	int app_kept;				/* the session state went along */
	char first_bad[512];			/* the first bad item, "" when nothing was lost */
} kvmem_salvage_report;
int kvmem_workspace_salvage(const char *dir, const char *dest, kvmem_salvage_report *r);
/* The counters saved in DIR/stats. */
int kvmem_workspace_stats(const char *dir, kvmem_pager_stats *s);
void kvmem_pager_stats_print(const kvmem_pager_stats *s, FILE *f);

/* ---- fault injection (tests) ------------------------------------------- */
enum kvmem_fault {
	KVMEM_FAULT_READ = 1, KVMEM_FAULT_WRITE = 2, KVMEM_FAULT_DIRECT = 3, KVMEM_FAULT_SYNC = 4
};
/* The nth I/O completion of this kind from now (1: the next) fails: READ and
 * WRITE with -EIO; DIRECT (any read or write) with -EINVAL, as on a file
 * system that refuses O_DIRECT I/O; SYNC: the nth fdatasync or fsync the
 * store makes fails with -EIO. nth 0 disarms. Process-wide. */
void kvmem_pager_fault_inject(enum kvmem_fault kind, unsigned nth);
/* Called with each durability step of the store, in order, as "fdatasync
 * pages" (tokens, index, sums, tail), "fsync manifest.tmp", "rename
 * manifest", "fsync ." (the workspace directory), "fsync .." (the
 * directory holding a newly created workspace). NULL stops. Process-wide. */
typedef void (*kvmem_sync_trace_fn)(void *arg, const char *event);
void kvmem_pager_sync_trace(kvmem_sync_trace_fn fn, void *arg);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif

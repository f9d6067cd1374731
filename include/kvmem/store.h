/* SPDX-License-Identifier: MIT */
/*
 * A session's history kept in a workspace: a directory, or rados://POOL/NAME
 * (a namespace of a Ceph pool: Documentation/pager.md, "Stores"), wherever
 * a function below takes `dir`.
 *
 * kvmem_workspace_open() opens (or creates) the workspace through the
 * tiered pager and gives a page source over it; a session created with that
 * source takes the stored history over with kvmem_workspace_adopt() and
 * makes each step durable with kvmem_workspace_commit(): token ids, pages,
 * the partial block and the session's state (plan, pins, queries, logits,
 * RNG), so that a reopened session goes on bit for bit as if it had never
 * stopped. `kvmem run --workspace` is a thin shell over these calls.
 *
 *   kvmem_workspace *w;
 *   kvmem_workspace_open(dir, model, NULL, &w);
 *   so.source = kvmem_workspace_source(w);
 *   s = kvmem_session_create(backend, &so);
 *   kvmem_workspace_adopt(w, s);            (0: restored, 1: fresh view)
 *   ... kvmem_session_append / decode ...
 *   kvmem_workspace_commit(w, s);           (a step boundary)
 *   kvmem_session_free(s);
 *   kvmem_workspace_close(w);
 */
#ifndef KVMEM_STORE_H
#define KVMEM_STORE_H

#include <stdint.h>

#include "kvmem/kmod.h"
#include "kvmem/model.h"
#include "kvmem/pager.h"
#include "kvmem/source.h"
#include "kvmem/session.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with -fvisibility=hidden: what is declared here is its API. */
#pragma GCC visibility push(default)

/* The geometry of a model's workspace: fp32 pages of `block` tokens (set
 * g->dtype for another), no index record; the fingerprint is the model's (weights included), or the
 * config's when the model has none (built in memory). */
void kvmem_page_geom_model(kvmem_page_geom *g, const kvmem_model *m, int block);

/* The page source over a pager p (which must outlive it): full blocks are
 * staged out as they complete, reads go through fetch (pinned until put),
 * prefetch and hints go to the pager. Blocks not yet full stay in the
 * source's memory. When p holds a committed partial block, it is restored,
 * so a session resumed at kvmem_pager_tokens(p) goes on from there. */
int kvmem_page_source_pager(kvmem_page_source *src, kvmem_pager *p);

/*
 * The page source over the kernel module (/dev/kvmem, Documentation/kmod.md)
 * beside the pager p, one truth read two ways: writes, stage-out and commits
 * go through a pager source over p exactly as above (the crash rule is the
 * pager's); reads of the pages p's last commit covers go through the
 * module's window (kvmem_kmod_open_pager: read-only, no lock of its own),
 * prefetch of those pages to the module, and each commit moves the
 * module's page count and step along. Pages written but not yet committed
 * are read through the pager. o: the window (host_cap, numa_node, dev;
 * page_max: its first size in pages, 0: room for 1024 blocks; it grows by
 * reopening when commits pass it). -ENODEV when the module is not loaded.
 * Pointers get returns stay valid until put; a page reclaim takes meanwhile
 * is faulted in again on the next touch.
 */
int kvmem_page_source_kmod(kvmem_page_source *src, kvmem_pager *p, const kvmem_kmod_opts *o);
/* The module's client under a kmod source (NULL for any other source): its
 * table and counters. It changes when the window grows. */
kvmem_kmod *kvmem_page_source_kmod_client(const kvmem_page_source *src);
/* The module's counters since the source was made, over every window it
 * had (resident and slots: the current one's). -EINVAL for another source. */
int kvmem_page_source_kmod_stats(const kvmem_page_source *src, struct kvmem_ioc_stats *st);

typedef struct kvmem_workspace kvmem_workspace;

typedef struct kvmem_workspace_opts {
	int block;		/* tokens per block (0: KVMEM_BLOCK_DEFAULT); must
				 * match an existing workspace's */
	uint64_t host_cap;	/* host pool bytes (0: the pager's default); with
				 * pager "kmod", the module's window cap too */
	const char *cache_policy; /* replacement policy (NULL: the pager's default) */
	int flags;		/* KVMEM_PAGER_* besides KVMEM_PAGER_CREATE, which is implied */
	uint32_t dtype;		/* pages of a new workspace: KVMEM_DTYPE_F32 (0: the
				 * default, the CPU engine's) or BF16 (a GPU's: half
				 * the bytes, placed with no conversion). An existing
				 * workspace keeps its own: either opens on either
				 * backend. KVMEM_DTYPE_FP8 (e4m3 with scales,
				 * for a backend opened with kv_dtype fp8) is
				 * fixed at creation: fp8 and the others refuse
				 * each other (-ESTALE, naming both). */
	uint64_t stage_bytes;	/* the pager's stage-out buffer (0: its default):
				 * a prefill whose pages fit in it never waits
				 * for the disk */
	const char *pager;	/* who reads pages back: "uring" (NULL: the
				 * default), the userspace pager; or "kmod",
				 * the kernel module (kvmem_page_source_kmod;
				 * -ENODEV when it is not loaded) */
	kvmem_pager_pool *pool;	/* a host pool shared with other workspaces
				 * (kvmem_pager_pool_create; host_cap is then
				 * unused); NULL: the pager's own */
} kvmem_workspace_opts;

/*
 * Open dir for model m (create it when it is empty or absent). Fails with
 * the pager's codes (-ESTALE: another model's or geometry's workspace,
 * -EBADMSG: corrupt, -EBUSY: another process writes it, ...).
 */
int kvmem_workspace_open(const char *dir, const kvmem_model *m, const kvmem_workspace_opts *o,
			 kvmem_workspace **out);
const kvmem_page_source *kvmem_workspace_source(kvmem_workspace *w);
kvmem_pager *kvmem_workspace_pager(kvmem_workspace *w);
const char *kvmem_workspace_dir(const kvmem_workspace *w);
/* The stored history's token ids (valid until close). */
int64_t kvmem_workspace_tokens(const kvmem_workspace *w);
const int32_t *kvmem_workspace_token_ids(const kvmem_workspace *w);
/*
 * Take the stored history over into s, a fresh session created with
 * kvmem_workspace_source(w). Returns 0 when the last commit's session state
 * was restored (the session goes on exactly as it would have), 1 when it
 * could not be (none was saved, or it is refused: other options, another
 * version, corrupt; kvmem_last_error() says which) and a fresh selection laid
 * out the view instead, so what follows may differ from an uninterrupted
 * run; negative on failure. Nothing to do (0) for an empty workspace.
 */
int kvmem_workspace_adopt(kvmem_workspace *w, kvmem_session *s);
/*
 * Commit the session's history and state: a step boundary. Returns 0, or 1
 * when the history was committed without the session state because the
 * state is larger than a commit holds (KVMEM_PAGER_APP_MAX; a reopen then
 * makes a fresh selection); negative on failure (nothing past the previous
 * commit is promised).
 */
int kvmem_workspace_commit(kvmem_workspace *w, const kvmem_session *s);
/* Close the source and the pager. Does not commit; negative when something
 * written since the last commit could not be saved. */
int kvmem_workspace_close(kvmem_workspace *w);

/*
 * A small record of the application's kept beside the workspace, in the
 * same store: the file DIR/NAME, or an object of a RADOS workspace's
 * namespace. NAME is "app." then letters, digits, '.', '_', '-' (kvmem
 * serve keeps a shared store's conversation record as
 * app.conversation.json). Read whole (*text malloc'd, NUL-terminated;
 * -ENOENT when there is none); written whole, replacing the last, durably
 * when it returns 0 (a writer's only: in RADOS, only while its lease
 * holds). Up to 16 MiB. A record is not part of the commit: write it
 * before kvmem_workspace_commit when it must never lag behind the history.
 */
int kvmem_workspace_record_read(kvmem_workspace *w, const char *name, char **text, size_t *len);
int kvmem_workspace_record_write(kvmem_workspace *w, const char *name, const void *text,
				 size_t len);

/* ---- a workspace directory's tools (no pager needed) ---------------------- */
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
/*
 * Copy the workspace `src` whole into a new workspace `dest` (absent or
 * empty), between any two stores: a directory or rados://POOL/NAME, either
 * way. Every block, index record, the partial block and the tokens are
 * checked against their checksums on the way; the session state goes along,
 * so a session adopted from dest goes on exactly as from src. All or
 * nothing: 0 when dest holds everything, -EBADMSG naming the first bad item
 * (dest then holds an empty workspace), -EEXIST when dest is not empty, or
 * another -errno. src is only read. r says what was copied.
 */
int kvmem_workspace_copy(const char *src, const char *dest, kvmem_salvage_report *r);
/* The counters saved in DIR/stats. */
int kvmem_workspace_stats(const char *dir, kvmem_pager_stats *s);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif

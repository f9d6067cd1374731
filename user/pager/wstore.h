/* SPDX-License-Identifier: MIT */
/*
 * The store under the pager: where a workspace's bytes live, behind one ops
 * table. Everything above it (the host pool, replacement, prefetch, the
 * page source, kvmem_workspace_*, verify, salvage, stat) is the same over
 * every store; a store only keeps bytes and the one-writer rule.
 *
 *   store        where                     file
 *   directory    DIR                       store_dir.c (files.c, manifest.c, durable.c, uring.c)
 *   RADOS        rados://POOL/NAME         store_rados.c (rados_dl.c loads librados)
 *
 * A workspace is a manifest and five data streams (enum ws_stream, the
 * order of ws_data_files). Streams are appended past the last commit and
 * never rewritten below it (the tail stream's two slots alternate); the
 * manifest is replaced whole and atomically. What a store promises, op by
 * op, is what the pager's crash rule needs (Documentation/pager.md, "What
 * the store promises"; Documentation/architecture.md, "The store seam"):
 *
 *   lock, claim      the one-writer rule: take it (-EBUSY naming the
 *                    holder), then say who holds it (a directory: the
 *                    open's last step; RADOS names the holder at once, so
 *                    a writer that dies before its first write is fenced).
 *                    A directory's lock lives as long as the process; a
 *                    RADOS lock is a lease the store renews, and a writer
 *                    whose lease lapsed stops writing (-ENOLCK) before
 *                    anything it writes can be seen.
 *   mf_load          the manifest's bytes (-ENOENT: none).
 *   mf_replace       the new manifest, atomically: readers see the old one
 *                    or the new one; replaced only while old_gen is current
 *                    (UINT64_MAX: no manifest yet) and the lock is held.
 *   read, write      a byte range of a stream; 0 or -errno (-ENODATA when
 *                    the stream ends first). No message: the caller names
 *                    the stream. A write may only be durable after sync.
 *   submit, reap     page reads into the host pool and stage-out writes,
 *                    asynchronous: many in flight, completions handed to
 *                    the callback in the caller's thread (r->res: bytes, or
 *                    -errno).
 *   sync             everything written so far is durable (before a
 *                    manifest that covers it is written).
 *
 * A store is used from one thread at a time, like the pager above it.
 */
#ifndef KVMEM_PAGER_WSTORE_H
#define KVMEM_PAGER_WSTORE_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum ws_stream { WS_PAGES, WS_TOKENS, WS_INDEX, WS_SUMS, WS_TAIL, WS_N_STREAMS };

struct io_req;
struct kvmem_io;
struct ws_store_ops;

struct ws_store {
	const struct ws_store_ops *ops;
	/* The directory, or rados://POOL/NAME: the first word of every
	 * message about this workspace ("<name>/pages: ..."). */
	char name[PATH_MAX];
	int flags;		/* KVMEM_PAGER_* it was opened with */
	int rdonly;
	int direct;		/* pages move with O_DIRECT (a directory only) */
	int created;		/* the open made the directory (or namespace) */
};

typedef void (*ws_done_fn)(void *arg, struct io_req *r);

struct ws_store_ops {
	const char *kind;			/* "directory", "rados" */
	void (*close)(struct ws_store *s);	/* drops the lock too */

	int (*mf_load)(struct ws_store *s, uint8_t **buf, size_t *len);
	int (*mf_replace)(struct ws_store *s, const void *buf, size_t len, uint64_t old_gen,
			  uint64_t new_gen);
	/* No manifest: may this become a new workspace? 0, or -errno naming
	 * what is there (-ENOENT workspace data without a manifest, -EEXIST
	 * something else). */
	int (*may_create)(struct ws_store *s, int flags);
	/* Make the data streams of a new workspace (the lock is held);
	 * `extent` is a block's bytes in the pages stream. */
	int (*create)(struct ws_store *s, uint64_t extent);
	/* Open stream i for use (the directory opens its file); -errno with a
	 * message naming it. */
	int (*open_stream)(struct ws_store *s, int i);
	/* Bytes stream i holds (at least up to `need` is all a caller asks). */
	int (*size)(struct ws_store *s, int i, uint64_t need, uint64_t *bytes);
	int (*read)(struct ws_store *s, int i, void *buf, size_t len, uint64_t off);
	int (*write)(struct ws_store *s, int i, const void *buf, size_t len, uint64_t off);
	int (*sync)(struct ws_store *s);
	/* Before a writer's first write: what lies past need[] (an
	 * interrupted append) goes, and a dead writer's leftovers. */
	int (*begin_write)(struct ws_store *s, const uint64_t need[WS_N_STREAMS]);
	int (*lock)(struct ws_store *s);
	int (*claim)(struct ws_store *s);

	/* Asynchronous page I/O through io: setup makes its `depth` request
	 * records (and a directory's ring, with the regions the I/O lands in
	 * registered). */
	int (*io_setup)(struct ws_store *s, struct kvmem_io *io, unsigned depth,
			void *const *bases, const size_t *lens, unsigned n);
	int (*submit)(struct ws_store *s, struct kvmem_io *io, struct io_req *r);
	int (*reap)(struct ws_store *s, struct kvmem_io *io, unsigned wait, ws_done_fn done,
		    void *arg);
	/* Optional: room for the pages stream up to `end` ahead of writes,
	 * in steps of whole extents and of at least `reach` bytes (what the
	 * stage-out buffer can have in flight) (best effort; -errno when a
	 * failed attempt could not be undone), and what was reserved past
	 * `end` given back at a writer's close. */
	int (*reserve)(struct ws_store *s, uint64_t end, uint64_t extent, uint64_t reach);
	void (*unreserve)(struct ws_store *s, uint64_t end);

	/* Small whole objects beside the workspace (the counters, an
	 * application's record): read whole (-ENOENT: none; a message naming
	 * it), replace whole (durably when asked; -errno, no message). */
	int (*aux_read)(struct ws_store *s, const char *name, char **buf, size_t *len);
	int (*aux_write)(struct ws_store *s, const char *name, const void *buf, size_t len,
			 int durable);
	uint64_t (*id)(const struct ws_store *s);	/* the probes' workspace id */
	/* Optional: what an I/O error code means in this store (RADOS: a
	 * lost lease, a cluster that does not answer), for messages. */
	const char *(*strerr)(struct ws_store *s, int err);
};

/* strerror(err), or what the store says err means. */
static inline const char *ws_strerror(struct ws_store *s, int err)
{
	return s->ops->strerr ? s->ops->strerr(s, err) : strerror(err);
}

/* Open the store `where` names (rados://... or a directory) with
 * KVMEM_PAGER_* flags: CREATE makes an absent directory, RDONLY never
 * writes, NO_DIRECT. -errno with a message. */
int ws_store_open(const char *where, int flags, struct ws_store **out);
void ws_store_close(struct ws_store *s);
/* 1 when `where` names a RADOS workspace. */
int ws_is_rados(const char *where);
/* The directory store's descriptor (-1 for any other store). */
int ws_store_dirfd(const struct ws_store *s);

int ws_dir_open(const char *dir, int flags, struct ws_store **out);
int ws_rados_open(const char *where, int flags, struct ws_store **out);
/* Remove every object of the RADOS workspace `where` (scratch workspaces
 * of the benchmark); no lock is asked for. */
int ws_rados_destroy(const char *where);

#endif

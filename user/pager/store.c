// SPDX-License-Identifier: MIT
/*
 * A workspace over its store (wstore.h: a directory, or RADOS): create or
 * reopen, check the committed state against the manifest, cut off what
 * lies past the last commit. Nothing here knows which store it is.
 *
 * Choice for a torn or corrupt workspace: REFUSE. A manifest that fails its
 * checksum, a file shorter than the commit says, or tokens/sums whose hash
 * differs from the manifest's make the open fail (-EBADMSG) with a message
 * naming the file; nothing is modified. Bytes past the last commit are not
 * damage (an interrupted append) and are cut off at this open's first
 * write. Pages are checked on every read. A store without a manifest
 * becomes a workspace only when it is empty; a writer holds the store's
 * lock (DIR/lock, or a RADOS lease) for as long as it is open.
 *
 * Order: every check an existing workspace can fail (manifest, model and
 * geometry, file sizes, the committed tokens' and sums' checksums) runs
 * before the lock is created, taken or written, so a refused open changes
 * no file at all; the open's own writes (who holds the lock) come last,
 * and the rest waits for the first write (store_begin_write).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pager/pager_int.h"
#include "util/fs.h"

int hash_stream_prefix(struct ws_store *s, int i, uint64_t len, const char *name, uint64_t *out)
{
	enum { CHUNK = 1 << 20 };
	XXH3_state_t *st = XXH3_createState();
	uint8_t *buf = malloc(CHUNK);
	uint64_t off = 0;

	if (!st || !buf) {
		XXH3_freeState(st);
		free(buf);
		return kvmem_error(ENOMEM, "%s: out of memory", name);
	}
	XXH3_64bits_reset(st);
	while (off < len) {
		size_t want = len - off < CHUNK ? len - off : CHUNK;
		int rc = s->ops->read(s, i, buf, want, off);

		if (rc) {
			XXH3_freeState(st);
			free(buf);
			return kvmem_error(rc == -ENODATA ? EIO : -rc, "%s: read failed at offset %"
					 PRIu64 ": %s", name, off, rc == -ENODATA ?
					 "unexpected end of file" : strerror(-rc));
		}
		XXH3_64bits_update(st, buf, want);
		off += want;
	}
	*out = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	free(buf);
	return 0;
}

int store_grow(kvmem_pager *p, uint64_t blocks)
{
	size_t L = p->g.n_layers;

	if (blocks * L > p->pt_cap) {
		size_t n = p->pt_cap ? p->pt_cap : 1024;
		struct kvmem_pte *pt;

		while (n < blocks * L)
			n *= 2;
		pt = realloc(p->pt, n * sizeof(*pt));
		if (!pt)
			return kvmem_error(ENOMEM, "%s: out of memory for the page table", p->dir);
		p->pt = pt;
		p->pt_cap = n;
	}
	if (blocks * (L + 1) > p->sums_cap) {
		size_t n = p->sums_cap ? p->sums_cap : 1024;
		uint64_t *s;

		while (n < blocks * (L + 1))
			n *= 2;
		s = realloc(p->sums, n * sizeof(*s));
		if (!s)
			return kvmem_error(ENOMEM, "%s: out of memory for page checksums", p->dir);
		p->sums = s;
		p->sums_cap = n;
	}
	if (blocks > p->orphan_cap) {
		size_t n = p->orphan_cap ? p->orphan_cap : 1024;
		void **o;

		while (n < blocks)
			n *= 2;
		o = realloc(p->orphan, n * sizeof(*o));
		if (!o)
			return kvmem_error(ENOMEM, "%s: out of memory", p->dir);
		memset(o + p->orphan_cap, 0, (n - p->orphan_cap) * sizeof(*o));
		p->orphan = o;
		o = realloc(p->orphan_ix, n * sizeof(*o));
		if (!o)
			return kvmem_error(ENOMEM, "%s: out of memory", p->dir);
		memset(o + p->orphan_cap, 0, (n - p->orphan_cap) * sizeof(*o));
		p->orphan_ix = o;
		p->orphan_cap = n;
	}
	for (uint64_t pg = p->n_blocks * L; pg < blocks * L; pg++) {
		struct kvmem_pte *e = &p->pt[pg];

		memset(e, 0, sizeof(*e));
		e->page_id = pg;
		e->host_slot = e->gpu_slot = KVMEM_SLOT_NONE;
	}
	return 0;
}

static int create_files(kvmem_pager *p, const kvmem_page_geom *g)
{
	if (p->ws->ops->create(p->ws, kvmem_page_stride(g) * g->n_layers) < 0)
		return kvmem_error_prefix("%s: cannot create the workspace", p->dir);
	mf_from_geom(&p->m, g);
	p->m.tail_sums = calloc(g->n_layers + 1, 8);
	p->m.app = malloc(1);
	if (!p->m.tail_sums || !p->m.app)
		return kvmem_error(ENOMEM, "%s: out of memory", p->dir);
	if (mf_write(p->ws, &p->m, UINT64_MAX) < 0)
		return kvmem_error_prefix("%s: cannot create the workspace", p->dir);
	return 0;
}

/* Check each file holds at least what the commit covers. Sizes come from
 * the manifest, which mf_read bounded: nothing is allocated for them
 * before every file is checked. */
static int check_lengths(kvmem_pager *p)
{
	uint64_t need[WS_N_DATA], size;
	int rc;

	mf_needs(&p->m.h, need);
	for (int i = 0; i < WS_N_DATA; i++) {
		if ((rc = p->ws->ops->size(p->ws, i, need[i], &size)) < 0)
			return kvmem_error(-rc, "%s/%s: %s", p->dir, ws_data_files[i], strerror(-rc));
		if (size < need[i])
			return kvmem_error(EBADMSG, "%s/%s: %lld bytes, but the last commit covers %" PRIu64
					 ": truncated; refusing to open (see kvmem verify)", p->dir,
					 ws_data_files[i], (long long)size, need[i]);
	}
	return 0;
}

int store_begin_write(kvmem_pager *p)
{
	uint64_t need[WS_N_DATA];

	if (p->wrote)
		return 0;
	if (p->rdonly)
		return kvmem_error(EINVAL, "%s: opened read-only", p->dir);
	/* Appends go on from the commit: what an interrupted one left past
	 * it goes first (the store's begin_write). */
	mf_needs(&p->m.h, need);
	if (p->ws->ops->begin_write(p->ws, need) < 0)
		return kvmem_fail();
	p->wrote = 1;
	return 0;
}

/* Load the committed sums and tokens and check them against the manifest. */
static int load_committed(kvmem_pager *p)
{
	enum { CHUNK = 1 << 20 };
	const struct mf_head *h = &p->m.h;
	uint64_t n = h->blocks * (p->g.n_layers + 1);
	uint8_t *buf;
	int rc;

	if (store_grow(p, h->blocks) < 0)
		return kvmem_fail();
	if (n && (rc = p->ws->ops->read(p->ws, WS_SUMS, p->sums, n * 8, 0)) < 0)
		return kvmem_error(rc == -ENODATA ? EIO : -rc, "%s/sums: cannot read %" PRIu64
				 " committed checksums: %s", p->dir, n,
				 rc == -ENODATA ? "short read" : strerror(-rc));
	XXH3_64bits_reset(p->sums_hash);
	XXH3_64bits_update(p->sums_hash, p->sums, n * 8);
	if (XXH3_64bits_digest(p->sums_hash) != h->sums_hash)
		return kvmem_error(EBADMSG, "%s/sums: checksum of the committed part differs from the "
				 "manifest: corrupt; refusing to open (see kvmem verify)", p->dir);
	/* Hash the committed tokens once; the state goes on with new appends. */
	XXH3_64bits_reset(p->tok_hash);
	buf = malloc(CHUNK);
	if (!buf)
		return kvmem_error(ENOMEM, "%s/tokens: out of memory", p->dir);
	for (uint64_t off = 0; off < h->tokens * 4;) {
		size_t want = h->tokens * 4 - off < CHUNK ? h->tokens * 4 - off : CHUNK;

		rc = p->ws->ops->read(p->ws, WS_TOKENS, buf, want, off);
		if (rc) {
			free(buf);
			return kvmem_error(rc == -ENODATA ? EIO : -rc, "%s/tokens: read failed at offset %"
					 PRIu64 ": %s", p->dir, off, rc == -ENODATA ?
					 "unexpected end of file" : strerror(-rc));
		}
		XXH3_64bits_update(p->tok_hash, buf, want);
		off += want;
	}
	free(buf);
	if (XXH3_64bits_digest(p->tok_hash) != h->tokens_hash)
		return kvmem_error(EBADMSG, "%s/tokens: checksum of the committed part differs from the "
				 "manifest: corrupt; refusing to open (see kvmem verify)", p->dir);
	p->n_tokens = h->tokens;
	p->n_blocks = h->blocks;
	for (uint64_t pg = 0; pg < h->blocks * p->g.n_layers; pg++)
		p->pt[pg].tiers = KVMEM_TIER_NVME;
	return 0;
}

/* The sizes the pager works in, from the manifest's geometry. */
static void set_geometry(kvmem_pager *p)
{
	mf_geom(&p->m, &p->g);
	p->page_bytes = p->m.h.page_bytes;
	p->page_stride = p->m.h.page_stride;
	p->extent_bytes = p->page_stride * p->g.n_layers;
	p->tail_slot_bytes = p->extent_bytes + round_up(p->g.index_bytes, KVMEM_IO_ALIGN);
	p->sums_rec = ((size_t)p->g.n_layers + 1) * 8;
}

/* The workspace p->m names, checked whole (reads only): its model and
 * geometry against g, its files, their sizes, the committed tokens and
 * sums. */
static int load_existing(kvmem_pager *p, const kvmem_page_geom *g)
{
	if (g && mf_check_geom(&p->m, g, p->dir) < 0)
		return kvmem_fail();
	set_geometry(p);
	for (int i = 0; i < WS_N_DATA; i++)
		if (p->ws->ops->open_stream(p->ws, i) < 0)
			return kvmem_fail();
	if (check_lengths(p) < 0 || load_committed(p) < 0)
		return kvmem_fail();
	return 0;
}

/* Forget what load_existing loaded, to load another commit (its streams
 * are opened again). */
static void unload(kvmem_pager *p)
{
	p->n_tokens = p->n_blocks = 0;
	mf_free(&p->m);
}

/* An existing workspace, checked without the lock: now take it. Another
 * writer may have committed between the checks and the lock; then the new
 * commit is checked again, under the lock (nothing can change it now). */
static int lock_existing(kvmem_pager *p, const kvmem_page_geom *g)
{
	struct manifest now;
	int rc;

	if ((rc = p->ws->ops->lock(p->ws)) < 0)
		return rc;
	p->locked = 1;
	rc = mf_read(p->ws, &now);
	if (rc < 0)
		return rc;
	if (now.h.generation == p->m.h.generation && now.h.tokens == p->m.h.tokens &&
	    now.h.tokens_hash == p->m.h.tokens_hash && now.h.sums_hash == p->m.h.sums_hash) {
		mf_free(&now);
		return 0;
	}
	unload(p);
	p->m = now;
	return load_existing(p, g);
}

int store_open(kvmem_pager *p, const char *dir, const kvmem_page_geom *g, int flags)
{
	int rc;

	snprintf(p->dir, sizeof(p->dir), "%s", dir);
	p->flags = flags;
	p->rdonly = !!(flags & KVMEM_PAGER_RDONLY);
	if ((rc = ws_store_open(dir, flags, &p->ws)) < 0)
		return rc;
	p->tok_hash = XXH3_createState();
	p->sums_hash = XXH3_createState();
	if (!p->tok_hash || !p->sums_hash)
		return kvmem_error(ENOMEM, "%s: out of memory", dir);
	XXH3_64bits_reset(p->tok_hash);
	XXH3_64bits_reset(p->sums_hash);

	rc = mf_read(p->ws, &p->m);
	if (rc == 0) {
		rc = load_existing(p, g);
		if (rc == 0 && !p->rdonly)
			rc = lock_existing(p, g);
	} else if (rc == -ENOENT && (rc = p->ws->ops->may_create(p->ws, flags)) == 0) {
		/* One writer: the lock, then look again: another writer may
		 * have created the workspace before we held it. */
		if ((rc = p->ws->ops->lock(p->ws)) < 0)
			return rc;
		p->locked = 1;
		rc = mf_read(p->ws, &p->m);
		if (rc == 0) {
			rc = load_existing(p, g);
		} else if (rc == -ENOENT && (rc = p->ws->ops->may_create(p->ws, flags)) == 0) {
			if (!g)
				return kvmem_error(EINVAL, "%s: creating a workspace needs its geometry", dir);
			if (create_files(p, g) < 0)
				return kvmem_fail();
			p->wrote = 1;
			set_geometry(p);
			if (check_lengths(p) < 0 || load_committed(p) < 0)
				return kvmem_fail();
		}
	}
	if (rc < 0)
		return rc;
	stats_load(p);
	return 0;
}

void store_close(kvmem_pager *p)
{
	ws_store_close(p->ws);	/* releases the writer's lock */
	p->ws = NULL;
	XXH3_freeState(p->tok_hash);
	XXH3_freeState(p->sums_hash);
	mf_free(&p->m);
	free(p->pt);
	free(p->sums);
	for (size_t i = 0; i < p->orphan_cap; i++) {
		free(p->orphan[i]);
		free(p->orphan_ix[i]);
	}
	free(p->orphan);
	free(p->orphan_ix);
}

// SPDX-License-Identifier: MIT
/*
 * kvmem_workspace_salvage: one bad page makes a workspace unopenable (the
 * store refuses rather than repairs). Salvage copies the longest prefix
 * that checks out into a new workspace beside it, through the pager itself
 * (so the copy is committed by the same crash rule), and says what was
 * lost. The damaged workspace is only read. kvmem_workspace_copy is the
 * same walk, all or nothing: between any two stores (a directory, a RADOS
 * pool), every block checked on the way.
 *
 * What can be checked one by one: each full block (its L pages and index
 * record against their sums) and the partial block (against the manifest).
 * The token ids have one checksum over all of them: when it fails, no
 * token can be trusted and nothing is kept.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pager/pager_int.h"
#include "util/fs.h"
#include "kvmem/store.h"

struct src {
	const char *dir;
	struct ws_store *ws;
	int ok[WS_N_DATA];	/* stream i could be opened */
	struct manifest m;
	kvmem_page_geom g;
	size_t pb, stride, extent, L, ib, slot_bytes;
};

static void src_close(struct src *s)
{
	ws_store_close(s->ws);
	mf_free(&s->m);
}

/* Read [off, off + len) of stream i whole: 0, or -errno. */
static int src_read(struct src *s, int i, void *buf, size_t len, uint64_t off)
{
	return s->ok[i] ? s->ws->ops->read(s->ws, i, buf, len, off) : -EIO;
}

static void bad(kvmem_salvage_report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bad(kvmem_salvage_report *r, const char *fmt, ...)
{
	va_list ap;

	if (r->first_bad[0])
		return;
	va_start(ap, fmt);
	vsnprintf(r->first_bad, sizeof(r->first_bad), fmt, ap);
	va_end(ap);
}

/* A RADOS dest must hold nothing yet, and not be dir itself. */
static int check_dest_rados(const char *dir, const char *dest)
{
	struct ws_store *ws;
	uint8_t *buf;
	size_t len;
	int rc;

	if (!strcmp(dir, dest))
		return kvmem_error(EINVAL, "%s: salvage writes beside the damaged workspace, not over it",
				 dest);
	if ((rc = ws_store_open(dest, 0, &ws)) < 0)
		return rc;
	rc = ws->ops->mf_load(ws, &buf, &len);
	free(buf);
	if (rc == 0 || rc != -ENOENT || ws->ops->may_create(ws, KVMEM_PAGER_CREATE) < 0)
		rc = kvmem_error(EEXIST, "%s: not empty: salvage writes a new workspace into an absent "
				 "or empty one", dest);
	else
		rc = 0;
	ws_store_close(ws);
	return rc;
}

/* dest must be absent or an empty directory, and not dir itself. */
static int check_dest(const char *dir, const char *dest)
{
	struct stat a, b;
	struct ws_scan sc;
	int fd, rc;

	if (ws_is_rados(dest))
		return check_dest_rados(dir, dest);
	if (stat(dest, &b) < 0)
		return errno == ENOENT ? 0 : kvmem_error(errno, "%s: %s", dest, strerror(errno));
	if (stat(dir, &a) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
		return kvmem_error(EINVAL, "%s: salvage writes beside the damaged workspace, not over it",
				 dest);
	fd = open(dest, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return kvmem_error(errno, "%s: %s", dest, strerror(errno));
	rc = ws_scan(fd, dest, &sc);
	close(fd);
	if (rc < 0)
		return rc;
	if (sc.manifest || sc.ws_file[0] || sc.other[0] || sc.empty_data)
		return kvmem_error(EEXIST, "%s: not empty: salvage writes a new workspace into an absent or "
				 "empty directory", dest);
	return 0;
}

/* The tokens' single checksum: 1 when it holds. */
static int tokens_ok(struct src *s, kvmem_salvage_report *r)
{
	const struct mf_head *h = &s->m.h;
	char name[PATH_MAX + 16];
	uint64_t sum, size;

	if (!s->ok[WS_TOKENS]) {
		bad(r, "%s", kvmem_last_error());
		return 0;
	}
	if (s->ws->ops->size(s->ws, WS_TOKENS, h->tokens * 4, &size) < 0 || size < h->tokens * 4) {
		bad(r, "%s/tokens: shorter than the %" PRIu64 " committed tokens: truncated", s->dir,
		    h->tokens);
		return 0;
	}
	snprintf(name, sizeof(name), "%s/tokens", s->dir);
	if (hash_stream_prefix(s->ws, WS_TOKENS, h->tokens * 4, name, &sum) < 0 ||
	    sum != h->tokens_hash) {
		bad(r, "%s/tokens: the committed %" PRIu64 " tokens: checksum mismatch (token ids have "
		    "one checksum: none can be kept)", s->dir, h->tokens);
		return 0;
	}
	return 1;
}

/* Block b's extent and index record, checked against its sums; 1 good. */
static int block_ok(struct src *s, uint64_t b, uint8_t *ext, uint8_t *ix, kvmem_salvage_report *r)
{
	uint64_t *sums = (uint64_t *)(ix + s->ib);	/* L + 1 after the record */
	size_t L = s->L;

	if (src_read(s, WS_SUMS, sums, (L + 1) * 8, b * (L + 1) * 8) < 0) {
		bad(r, "%s/sums: the checksums of block %" PRIu64 " cannot be read (truncated?)", s->dir, b);
		return 0;
	}
	if (src_read(s, WS_PAGES, ext, s->extent, b * s->extent) < 0) {
		bad(r, "%s/pages: block %" PRIu64 " at offset %" PRIu64 " cannot be read (truncated?)",
		    s->dir, b, b * s->extent);
		return 0;
	}
	for (size_t l = 0; l < L; l++)
		if (XXH3_64bits(ext + l * s->stride, s->pb) != sums[l]) {
			bad(r, "%s/pages: page %" PRIu64 " (block %" PRIu64 ", layer %zu) at offset %" PRIu64
			    ": checksum mismatch", s->dir, b * L + l, b, l, (b * L + l) * s->stride);
			return 0;
		}
	if (s->ib && src_read(s, WS_INDEX, ix, s->ib, b * s->ib) < 0) {
		bad(r, "%s/index: the record of block %" PRIu64 " cannot be read (truncated?)", s->dir, b);
		return 0;
	}
	if (XXH3_64bits(s->ib ? ix : (const void *)"", s->ib) != sums[L]) {
		bad(r, "%s/index: record of block %" PRIu64 " at offset %" PRIu64 ": checksum mismatch",
		    s->dir, b, b * s->ib);
		return 0;
	}
	return 1;
}

/* The committed partial block into buf: its L layers, then its index
 * record (slot L, checked too: a record that fails its sum would give the
 * copy an index that no longer describes its keys); 1 good. */
static int tail_ok(struct src *s, uint8_t *buf, kvmem_salvage_report *r)
{
	const struct mf_head *h = &s->m.h;
	uint64_t off = (uint64_t)h->tail_slot * s->slot_bytes;

	if (src_read(s, WS_TAIL, buf, s->slot_bytes, off) < 0) {
		bad(r, "%s/tail: slot %u cannot be read (truncated?)", s->dir, h->tail_slot);
		return 0;
	}
	for (size_t l = 0; l <= s->L; l++) {
		size_t len = l < s->L ? s->pb : s->ib;

		if (XXH3_64bits(buf + l * s->stride, len) != s->m.tail_sums[l]) {
			bad(r, "%s/tail: slot %u, %s %zu at offset %" PRIu64 " (the partial block of "
			    "%u tokens): checksum mismatch", s->dir, h->tail_slot,
			    l < s->L ? "layer" : "index", l, off + l * s->stride,
			    h->tail_tokens);
			return 0;
		}
	}
	return 1;
}

/* 1 when stream i is open and holds at least `len` bytes. */
static int has_bytes(struct src *s, int i, uint64_t len)
{
	uint64_t size;

	return s->ok[i] && s->ws->ops->size(s->ws, i, len, &size) == 0 && size >= len;
}

/* Copy tokens [0, n) from the source into the new pager. */
static int copy_tokens(struct src *s, kvmem_pager *p, uint64_t n)
{
	enum { CHUNK = 1 << 16 };
	int32_t *buf = malloc(CHUNK * sizeof(int32_t));

	if (!buf)
		return kvmem_error(ENOMEM, "%s/tokens: out of memory", s->dir);
	for (uint64_t at = 0; at < n;) {
		size_t k = n - at < CHUNK ? n - at : CHUNK;

		if (src_read(s, WS_TOKENS, buf, k * 4, at * 4) < 0) {
			free(buf);
			return kvmem_error(EIO, "%s/tokens: cannot read tokens %" PRIu64 "..%" PRIu64,
					 s->dir, at, at + k);
		}
		if (kvmem_pager_append_tokens(p, buf, k) < 0) {
			free(buf);
			return kvmem_fail();
		}
		at += k;
	}
	free(buf);
	return 0;
}

/* strict (a copy): everything or nothing is committed at dest. */
static int salvage(struct src *s, const char *dest, kvmem_salvage_report *r, int strict)
{
	const struct mf_head *h = &s->m.h;
	const void *layers[4096];
	kvmem_pager_opts o;
	kvmem_pager *p = NULL;
	uint8_t *ext = NULL, *ix = NULL;
	int good_tokens, rc = 0;
	uint64_t b;

	r->tokens_ok = good_tokens = tokens_ok(s, r);
	kvmem_pager_opts_default(&o);
	o.host_cap = 8 * s->stride > (1u << 20) ? 8 * s->stride : 1u << 20;
	o.stage_bytes = 4 * s->extent;
	o.flags = KVMEM_PAGER_CREATE | KVMEM_PAGER_NO_KEEP;
	if (kvmem_pager_open(dest, &s->g, &o, &p) < 0)
		return kvmem_fail();
	if (kvmem_pager_tokens(p)) {
		kvmem_pager_close(p);
		return kvmem_error(EEXIST, "%s: already holds a workspace", dest);
	}
	/* Buffers sized by the geometry, but only when a file holds that much
	 * (a forged geometry asks for terabytes): otherwise nothing of that
	 * kind can be read and nothing is allocated for it. */
	if (!good_tokens ||
	    (!has_bytes(s, WS_PAGES, s->extent) && !has_bytes(s, WS_TAIL, s->slot_bytes)) ||
	    (s->ib && !has_bytes(s, WS_INDEX, s->ib) && !has_bytes(s, WS_TAIL, s->slot_bytes))) {
		if (good_tokens && (h->blocks || h->tail_tokens))
			bad(r, "%s: the pages, index or tail files hold less than one block", s->dir);
		good_tokens = 0;
	} else {
		ext = malloc(s->slot_bytes);
		ix = malloc(s->ib + (s->L + 1) * 8);
		if (!ext || !ix) {
			rc = kvmem_error(ENOMEM, "%s: out of memory", s->dir);
			goto out;
		}
	}
	for (b = 0; good_tokens && b < h->blocks; b++) {
		if (!block_ok(s, b, ext, ix, r))
			break;
		for (size_t l = 0; l < s->L; l++)
			layers[l] = ext + l * s->stride;
		if (kvmem_pager_append_block(p, b, layers, s->ib ? ix : NULL) < 0) {
			rc = kvmem_fail();
			goto out;
		}
	}
	r->blocks_kept = good_tokens ? b : 0;
	r->tokens_kept = r->blocks_kept * h->block_tokens;
	if (good_tokens && r->blocks_kept == h->blocks && h->tail_tokens &&
	    has_bytes(s, WS_TAIL, (uint64_t)(h->tail_slot + 1) * s->slot_bytes) && tail_ok(s, ext, r)) {
		r->tail_kept = h->tail_tokens;
		r->tokens_kept += h->tail_tokens;
	}
	if (copy_tokens(s, p, r->tokens_kept) < 0) {
		rc = kvmem_fail();
		goto out;
	}
	for (size_t l = 0; ext && l < s->L; l++)
		layers[l] = ext + l * s->stride;
	/* The session state describes the whole history: kept only with it. */
	r->app_kept = r->tokens_kept == h->tokens;
	if (strict && !r->app_kept) {
		/* Nothing past the empty workspace the open made is committed. */
		rc = kvmem_error(EBADMSG, "cannot copy %s: %s; %s holds an empty workspace (kvmem "
				 "verify names what is bad, --salvage keeps what is good)", s->dir,
				 r->first_bad[0] ? r->first_bad : "damaged", dest);
		goto out;
	}
	rc = kvmem_pager_commit(p, r->tail_kept ? layers : NULL,
				r->tail_kept && s->ib ? ext + s->L * s->stride : NULL,
				r->app_kept ? s->m.app : NULL, r->app_kept ? h->app_bytes : 0);
out:
	free(ext);
	free(ix);
	if (kvmem_pager_close(p) < 0 && !rc)
		rc = kvmem_fail();
	return rc;
}

static int copy_prefix(const char *dir, const char *dest, kvmem_salvage_report *r, int strict)
{
	struct src s = { .dir = dir };
	int rc;

	memset(r, 0, sizeof(*r));
	/* Buffered reads: blocks land in memory of any alignment. */
	if ((rc = ws_store_open(dir, KVMEM_PAGER_RDONLY | KVMEM_PAGER_NO_DIRECT, &s.ws)) < 0)
		return rc;
	rc = mf_read(s.ws, &s.m);
	if (rc < 0) {
		ws_store_close(s.ws);
		return kvmem_error_prefix("cannot salvage (the manifest says what there is to keep)");
	}
	rc = check_dest(dir, dest);
	if (rc < 0) {
		src_close(&s);
		return rc;
	}
	mf_geom(&s.m, &s.g);
	s.L = s.g.n_layers;
	s.pb = s.m.h.page_bytes;
	s.stride = s.m.h.page_stride;
	s.extent = s.stride * s.L;
	s.ib = s.g.index_bytes;
	s.slot_bytes = s.extent + round_up(s.ib, KVMEM_IO_ALIGN);
	r->tokens = s.m.h.tokens;
	r->blocks = s.m.h.blocks;
	r->tail_tokens = s.m.h.tail_tokens;
	/* A stream that cannot be opened is not ok: what needs it is lost. */
	for (int i = 0; i < WS_N_DATA; i++) {
		s.ok[i] = s.ws->ops->open_stream(s.ws, i) == 0;
		if (!s.ok[i])
			bad(r, "%s", kvmem_last_error());
	}
	if (s.L > 4096) {
		src_close(&s);
		return kvmem_error(EBADMSG, "%s/manifest: %zu layers", dir, s.L);
	}
	rc = salvage(&s, dest, r, strict);
	if (r->tokens_kept == r->tokens)
		r->first_bad[0] = 0;	/* nothing lost (damage past what was needed) */
	src_close(&s);
	return rc;
}

int kvmem_workspace_salvage(const char *dir, const char *dest, kvmem_salvage_report *r)
{
	return copy_prefix(dir, dest, r, 0);
}

int kvmem_workspace_copy(const char *src, const char *dest, kvmem_salvage_report *r)
{
	return copy_prefix(src, dest, r, 1);
}

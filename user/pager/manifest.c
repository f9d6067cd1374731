// SPDX-License-Identifier: MIT
/*
 * The workspace manifest: a small binary record replaced atomically, so a
 * reader sees either the previous commit or the new one, never a mix. Its
 * bytes are the same in every store (wstore.h); how it is replaced is the
 * store's: in a directory, write a temporary file of the writer's own name,
 * fsync, rename, fsync the directory (mf_replace_at); in RADOS, one guarded
 * write operation. Every field is checked before it is used: the checksum,
 * the geometry, counts that agree with each other and that a file can hold.
 * Layout in Documentation/formats.md ("Workspace directory").
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

void mf_from_geom(struct manifest *m, const kvmem_page_geom *g)
{
	struct mf_head *h = &m->h;

	memset(h, 0, sizeof(*h));
	memcpy(h->magic, MF_MAGIC, 8);
	h->version = MF_VERSION;
	h->head_bytes = sizeof(*h);
	h->fingerprint = g->fingerprint;
	h->n_layers = g->n_layers;
	h->n_heads = g->n_heads;
	h->n_kv_heads = g->n_kv_heads;
	h->head_dim = g->head_dim;
	h->block_tokens = g->block_tokens;
	h->dtype = g->dtype;
	h->index_bytes = g->index_bytes;
	h->page_bytes = kvmem_page_bytes(g);
	h->page_stride = kvmem_page_stride(g);
	h->align = KVMEM_IO_ALIGN;
	h->tokens_hash = XXH3_64bits(NULL, 0);
	h->sums_hash = XXH3_64bits(NULL, 0);
}

void mf_geom(const struct manifest *m, kvmem_page_geom *g)
{
	const struct mf_head *h = &m->h;

	memset(g, 0, sizeof(*g));
	g->fingerprint = h->fingerprint;
	g->n_layers = h->n_layers;
	g->n_heads = h->n_heads;
	g->n_kv_heads = h->n_kv_heads;
	g->head_dim = h->head_dim;
	g->block_tokens = h->block_tokens;
	g->dtype = h->dtype;
	g->index_bytes = h->index_bytes;
}

void mf_free(struct manifest *m)
{
	free(m->tail_sums);
	free(m->app);
	m->tail_sums = NULL;
	m->app = NULL;
}

static size_t mf_size(const struct mf_head *h)
{
	return sizeof(*h) + ((size_t)h->n_layers + 1) * 8 + h->app_bytes + 8;
}

/* Bytes per data file; -1 when one would pass INT64_MAX (no file holds it). */
static int needs_checked(const struct mf_head *h, uint64_t need[5])
{
	uint64_t extent, slot, sums_rec = ((uint64_t)h->n_layers + 1) * 8;
	int over = 0;

	over |= __builtin_mul_overflow((uint64_t)h->page_stride, h->n_layers, &extent);
	over |= __builtin_add_overflow(extent, round_up(h->index_bytes, KVMEM_IO_ALIGN), &slot);
	over |= __builtin_mul_overflow(h->blocks, extent, &need[0]);
	over |= __builtin_mul_overflow(h->tokens, 4, &need[1]);
	over |= __builtin_mul_overflow(h->blocks, (uint64_t)h->index_bytes, &need[2]);
	over |= __builtin_mul_overflow(h->blocks, sums_rec, &need[3]);
	need[4] = h->tail_tokens ? ((uint64_t)h->tail_slot + 1) * slot : 0;
	for (int i = 0; i < 5; i++)
		over |= need[i] > INT64_MAX;
	return over ? -1 : 0;
}

void mf_needs(const struct mf_head *h, uint64_t need[5])
{
	needs_checked(h, need);
}

/* Everything in the head that does not depend on the data files. */
static int check_head(const struct mf_head *h, const char *dir)
{
	char name[PATH_MAX + 16], msg[768];
	uint64_t need[5];
	kvmem_page_geom g;
	struct manifest m = { .h = *h };

	mf_geom(&m, &g);
	snprintf(name, sizeof(name), "%s/manifest", dir);
	if (kvmem_page_geom_check(&g, name) < 0) {
		snprintf(msg, sizeof(msg), "%s", kvmem_last_error());
		return kvmem_error(EBADMSG, "%s: corrupt", msg);
	}
	if (h->page_bytes != kvmem_page_bytes(&g) || h->page_stride != kvmem_page_stride(&g) ||
	    h->align != KVMEM_IO_ALIGN)
		return kvmem_error(EBADMSG, "%s: page size %u / stride %u / alignment %u do not follow "
				 "from its geometry: corrupt", name, h->page_bytes, h->page_stride,
				 h->align);
	if (h->blocks != h->tokens / h->block_tokens || h->tail_tokens != h->tokens % h->block_tokens ||
	    h->tail_slot > 1)
		return kvmem_error(EBADMSG, "%s: inconsistent counts (tokens %" PRIu64 ", blocks %" PRIu64
				 ", tail %u in slot %u): corrupt", name, h->tokens, h->blocks,
				 h->tail_tokens, h->tail_slot);
	if (needs_checked(h, need) < 0)
		return kvmem_error(EBADMSG, "%s: claims %" PRIu64 " tokens in %" PRIu64 " blocks, more "
				 "than any file can hold: corrupt or forged", name, h->tokens,
				 h->blocks);
	return 0;
}

int mf_load_at(int dirfd, const char *dir, uint8_t **out, size_t *len)
{
	struct stat sb;
	uint8_t *buf;
	int fd, rc;

	*out = NULL;
	*len = 0;
	fd = ws_open_file(dirfd, dir, "manifest", O_RDONLY);
	if (fd < 0)
		return fd;
	if (fstat(fd, &sb) < 0 || sb.st_size > (off_t)KVMEM_PAGER_APP_MAX + (1 << 20)) {
		close(fd);
		return kvmem_error(EBADMSG, "%s/manifest: %lld bytes, too large to be a manifest", dir,
				 (long long)sb.st_size);
	}
	buf = malloc(sb.st_size ? sb.st_size : 1);
	if (!buf) {
		close(fd);
		return kvmem_error(ENOMEM, "%s/manifest: out of memory", dir);
	}
	rc = kvmem_read_all(fd, buf, sb.st_size, 0);
	if (rc) {
		free(buf);
		close(fd);
		return kvmem_error(rc == -ENODATA ? EIO : -rc, "%s/manifest: cannot read: %s", dir,
				 rc == -ENODATA ? "shorter than its size" : strerror(-rc));
	}
	close(fd);
	*out = buf;
	*len = sb.st_size;
	return 0;
}

int mf_decode(const uint8_t *buf, size_t got, const char *dir, struct manifest *m)
{
	struct mf_head h;
	uint64_t sum;
	size_t want;

	memset(m, 0, sizeof(*m));
	if (got < sizeof(h) || memcmp(buf, MF_MAGIC, 8))
		return kvmem_error(EBADMSG, "%s/manifest: not a kvmem workspace manifest (bad magic or "
				 "size %zu)", dir, got);
	memcpy(&h, buf, sizeof(h));
	memcpy(&sum, buf + got - 8, 8);
	if (h.version != MF_VERSION || h.head_bytes != sizeof(h)) {
		/* Another version when it checks out as a whole, else damage. */
		int whole = XXH3_64bits(buf, got - 8) == sum;

		if (whole && h.version != MF_VERSION)
			return kvmem_error(ESTALE, "%s/manifest: format version %u; this kvmem reads "
					 "version %u", dir, h.version, MF_VERSION);
		return kvmem_error(EBADMSG, "%s/manifest: head of %u bytes with format version %u (version "
				 "%u has %zu): torn or corrupt", dir, h.head_bytes, h.version,
				 MF_VERSION, sizeof(h));
	}
	want = h.n_layers <= 4096 && h.app_bytes <= KVMEM_PAGER_APP_MAX ? mf_size(&h) : 0;
	if (got != want)
		return kvmem_error(EBADMSG, "%s/manifest: %zu bytes where its head says %zu: torn or "
				 "corrupt", dir, got, want);
	if (XXH3_64bits(buf, want - 8) != sum)
		return kvmem_error(EBADMSG, "%s/manifest: checksum mismatch: torn or corrupt", dir);
	if (check_head(&h, dir) < 0)
		return kvmem_fail();
	m->h = h;
	m->tail_sums = calloc(h.n_layers + 1, 8);
	m->app = malloc(h.app_bytes ? h.app_bytes : 1);
	if (!m->tail_sums || !m->app) {
		mf_free(m);
		return kvmem_error(ENOMEM, "%s/manifest: out of memory", dir);
	}
	memcpy(m->tail_sums, buf + sizeof(h), ((size_t)h.n_layers + 1) * 8);
	memcpy(m->app, buf + sizeof(h) + ((size_t)h.n_layers + 1) * 8, h.app_bytes);
	return 0;
}

int mf_read_at(int dirfd, const char *dir, struct manifest *m)
{
	uint8_t *buf;
	size_t len;
	int rc;

	memset(m, 0, sizeof(*m));
	if ((rc = mf_load_at(dirfd, dir, &buf, &len)) < 0)
		return rc;
	rc = mf_decode(buf, len, dir, m);
	free(buf);
	return rc;
}

int mf_read(struct ws_store *s, struct manifest *m)
{
	uint8_t *buf;
	size_t len;
	int rc;

	memset(m, 0, sizeof(*m));
	if ((rc = s->ops->mf_load(s, &buf, &len)) < 0)
		return rc;
	rc = mf_decode(buf, len, s->name, m);
	free(buf);
	return rc;
}

int mf_encode(const struct manifest *m, uint8_t **out, size_t *len)
{
	size_t size = mf_size(&m->h), tail = ((size_t)m->h.n_layers + 1) * 8;
	uint8_t *buf = malloc(size);
	uint64_t sum;

	if (!buf)
		return -ENOMEM;
	memcpy(buf, &m->h, sizeof(m->h));
	memcpy(buf + sizeof(m->h), m->tail_sums, tail);
	if (m->h.app_bytes)
		memcpy(buf + sizeof(m->h) + tail, m->app, m->h.app_bytes);
	sum = XXH3_64bits(buf, size - 8);
	memcpy(buf + size - 8, &sum, 8);
	*out = buf;
	*len = size;
	return 0;
}

int mf_replace_at(int dirfd, const char *dir, const void *buf, size_t size)
{
	static _Atomic unsigned seq;
	char tmp[64];
	int fd, err;

	/* A name of this writer's own: nobody else writes it, and nothing
	 * found there is followed or reused. */
	snprintf(tmp, sizeof(tmp), "manifest.tmp.%d.%u", (int)getpid(), seq++);
	unlinkat(dirfd, tmp, 0);
	fd = ws_create_file(dirfd, dir, tmp, O_WRONLY);
	if (fd < 0)
		return fd;
	if (kvmem_write_all(fd, buf, size, -1) < 0) {
		err = errno;
		close(fd);
		unlinkat(dirfd, tmp, 0);
		return kvmem_error(err, "%s/%s: cannot write: %s", dir, tmp, strerror(err));
	}
	if (dur_sync(fd, 0, dir, "manifest.tmp") < 0) {
		close(fd);
		unlinkat(dirfd, tmp, 0);
		return kvmem_fail();
	}
	close(fd);
	if (renameat(dirfd, tmp, dirfd, "manifest") < 0) {
		err = errno;
		unlinkat(dirfd, tmp, 0);
		return kvmem_error(err, "%s/manifest: cannot replace: %s", dir, strerror(err));
	}
	dur_note("rename", "manifest");
	return dur_sync(dirfd, 0, dir, ".");
}

int mf_write(struct ws_store *s, const struct manifest *m, uint64_t old_gen)
{
	uint8_t *buf;
	size_t size;
	int rc;

	if (mf_encode(m, &buf, &size) < 0)
		return kvmem_error(ENOMEM, "%s/manifest: out of memory", s->name);
	rc = s->ops->mf_replace(s, buf, size, old_gen, m->h.generation);
	free(buf);
	return rc;
}

int mf_check_geom(const struct manifest *m, const kvmem_page_geom *g, const char *dir)
{
	char have[256], want[256];
	kvmem_page_geom mg;

	mf_geom(m, &mg);
	if (mg.fingerprint == g->fingerprint && mg.n_layers == g->n_layers &&
	    mg.n_heads == g->n_heads && mg.n_kv_heads == g->n_kv_heads &&
	    mg.head_dim == g->head_dim && mg.block_tokens == g->block_tokens &&
	    mg.dtype == g->dtype && mg.index_bytes == g->index_bytes)
		return 0;
	kvmem_page_geom_str(&mg, have, sizeof(have));
	kvmem_page_geom_str(g, want, sizeof(want));
	if (mg.fingerprint != g->fingerprint)
		return kvmem_error(ESTALE, "%s/manifest: workspace belongs to model fingerprint %016" PRIx64
				 " (%s), not to this model's fingerprint %016" PRIx64
				 " (%s); refusing to open it",
				 dir, mg.fingerprint, have, g->fingerprint, want);
	return kvmem_error(ESTALE, "%s/manifest: workspace geometry (%s) differs from the requested one (%s), "
			 "both with fingerprint %016" PRIx64 "; refusing to open it",
			 dir, have, want, g->fingerprint);
}

static void mf_info_of(struct manifest *m, kvmem_workspace_info *wi)
{
	mf_geom(m, &wi->geom);
	wi->tokens = m->h.tokens;
	wi->blocks = m->h.blocks;
	wi->generation = m->h.generation;
	wi->tail_tokens = m->h.tail_tokens;
	wi->app_bytes = m->h.app_bytes;
	wi->page_bytes = m->h.page_bytes;
	wi->page_stride = m->h.page_stride;
	mf_free(m);
}

int mf_info(struct ws_store *s, kvmem_workspace_info *wi)
{
	struct manifest m;
	int rc;

	memset(wi, 0, sizeof(*wi));
	if ((rc = mf_read(s, &m)) < 0)
		return rc;
	mf_info_of(&m, wi);
	return 0;
}

int mf_info_at(int dirfd, const char *dir, kvmem_workspace_info *wi)
{
	struct manifest m;
	int rc;

	memset(wi, 0, sizeof(*wi));
	if ((rc = mf_read_at(dirfd, dir, &m)) < 0)
		return rc;
	mf_info_of(&m, wi);
	return 0;
}

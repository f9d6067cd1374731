// SPDX-License-Identifier: MIT
/*
 * The workspace manifest: a small binary file replaced atomically (write
 * manifest.tmp, fsync, rename, fsync the directory), so a reader sees either
 * the previous commit or the new one, never a mix. Layout in
 * Documentation/formats.md ("Workspace directory").
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

int mf_read(int dirfd, const char *dir, struct manifest *m)
{
	struct mf_head h;
	struct stat sb;
	uint8_t *buf;
	uint64_t sum;
	size_t want;
	ssize_t got;
	int fd;

	memset(m, 0, sizeof(*m));
	fd = openat(dirfd, "manifest", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return kvmem_error(errno, "%s/manifest: %s", dir, strerror(errno));
	if (fstat(fd, &sb) < 0 || sb.st_size > (off_t)KVMEM_PAGER_APP_MAX + (1 << 20)) {
		close(fd);
		return kvmem_error(EINVAL, "%s/manifest: unreadable or too large to be a manifest", dir);
	}
	buf = malloc(sb.st_size ? sb.st_size : 1);
	if (!buf) {
		close(fd);
		return kvmem_error(ENOMEM, "%s/manifest: out of memory", dir);
	}
	got = pread(fd, buf, sb.st_size, 0);
	close(fd);
	if (got != sb.st_size) {
		free(buf);
		return kvmem_error(EINVAL, "%s/manifest: short read", dir);
	}
	if ((size_t)got < sizeof(h) || memcmp(buf, MF_MAGIC, 8)) {
		free(buf);
		return kvmem_error(EINVAL, "%s/manifest: not a kvmem workspace manifest (bad magic or size %zd)",
				 dir, got);
	}
	memcpy(&h, buf, sizeof(h));
	if (h.version != MF_VERSION || h.head_bytes != sizeof(h)) {
		free(buf);
		return kvmem_error(EINVAL, "%s/manifest: format version %u (head %u bytes); this kvmem reads version %u",
				 dir, h.version, h.head_bytes, MF_VERSION);
	}
	want = h.n_layers <= 4096 && h.app_bytes <= KVMEM_PAGER_APP_MAX ? mf_size(&h) : 0;
	if ((size_t)got != want) {
		free(buf);
		return kvmem_error(EINVAL, "%s/manifest: %zd bytes where its head says %zu: torn or corrupt",
				 dir, got, want);
	}
	memcpy(&sum, buf + want - 8, 8);
	if (XXH3_64bits(buf, want - 8) != sum) {
		free(buf);
		return kvmem_error(EINVAL, "%s/manifest: checksum mismatch: torn or corrupt", dir);
	}
	m->h = h;
	m->tail_sums = calloc(h.n_layers + 1, 8);
	m->app = malloc(h.app_bytes ? h.app_bytes : 1);
	if (!m->tail_sums || !m->app) {
		free(buf);
		mf_free(m);
		return kvmem_error(ENOMEM, "%s/manifest: out of memory", dir);
	}
	memcpy(m->tail_sums, buf + sizeof(h), ((size_t)h.n_layers + 1) * 8);
	memcpy(m->app, buf + sizeof(h) + ((size_t)h.n_layers + 1) * 8, h.app_bytes);
	free(buf);
	if (h.blocks != h.tokens / (h.block_tokens ? h.block_tokens : 1) ||
	    h.tail_tokens != h.tokens % (h.block_tokens ? h.block_tokens : 1) || h.tail_slot > 1) {
		mf_free(m);
		return kvmem_error(EINVAL, "%s/manifest: inconsistent counts (tokens %" PRIu64 ", blocks %" PRIu64
				 ", tail %u)", dir, h.tokens, h.blocks, h.tail_tokens);
	}
	return 0;
}

static int write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *b = buf;

	while (len) {
		ssize_t n = write(fd, b, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		b += n;
		len -= n;
	}
	return 0;
}

int mf_write(int dirfd, const char *dir, const struct manifest *m)
{
	size_t size = mf_size(&m->h), tail = ((size_t)m->h.n_layers + 1) * 8;
	uint8_t *buf = malloc(size);
	uint64_t sum;
	int fd, err;

	if (!buf)
		return kvmem_error(ENOMEM, "%s/manifest.tmp: out of memory", dir);
	memcpy(buf, &m->h, sizeof(m->h));
	memcpy(buf + sizeof(m->h), m->tail_sums, tail);
	if (m->h.app_bytes)
		memcpy(buf + sizeof(m->h) + tail, m->app, m->h.app_bytes);
	sum = XXH3_64bits(buf, size - 8);
	memcpy(buf + size - 8, &sum, 8);

	fd = openat(dirfd, "manifest.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		err = errno;
		free(buf);
		return kvmem_error(err, "%s/manifest.tmp: cannot create: %s", dir, strerror(err));
	}
	if (write_all(fd, buf, size) < 0 || fsync(fd) < 0) {
		err = errno ? errno : EIO;
		free(buf);
		close(fd);
		unlinkat(dirfd, "manifest.tmp", 0);
		return kvmem_error(err, "%s/manifest.tmp: cannot write: %s", dir, strerror(err));
	}
	free(buf);
	close(fd);
	if (renameat(dirfd, "manifest.tmp", dirfd, "manifest") < 0) {
		err = errno;
		unlinkat(dirfd, "manifest.tmp", 0);
		return kvmem_error(err, "%s/manifest: cannot replace: %s", dir, strerror(err));
	}
	if (fsync(dirfd) < 0)
		return kvmem_error(errno, "%s: cannot fsync the directory: %s", dir, strerror(errno));
	return 0;
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
		return kvmem_error(EINVAL, "%s/manifest: workspace belongs to model fingerprint %016" PRIx64
				 " (%s), not to this model's fingerprint %016" PRIx64
				 " (%s); refusing to open it",
				 dir, mg.fingerprint, have, g->fingerprint, want);
	return kvmem_error(EINVAL, "%s/manifest: workspace geometry (%s) differs from the requested one (%s), "
			 "both with fingerprint %016" PRIx64 "; refusing to open it",
			 dir, have, want, g->fingerprint);
}

int kvmem_workspace_info_read(const char *dir, kvmem_workspace_info *wi)
{
	struct manifest m;
	int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	memset(wi, 0, sizeof(*wi));
	if (dirfd < 0)
		return kvmem_error(errno, "%s: %s", dir, strerror(errno));
	if (mf_read(dirfd, dir, &m) < 0) {
		close(dirfd);
		return -1;
	}
	close(dirfd);
	mf_geom(&m, &wi->geom);
	wi->tokens = m.h.tokens;
	wi->blocks = m.h.blocks;
	wi->generation = m.h.generation;
	wi->tail_tokens = m.h.tail_tokens;
	wi->app_bytes = m.h.app_bytes;
	wi->page_bytes = m.h.page_bytes;
	wi->page_stride = m.h.page_stride;
	mf_free(&m);
	return 0;
}

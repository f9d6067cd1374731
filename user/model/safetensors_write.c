// SPDX-License-Identifier: MIT
/*
 * Writing safetensors files as a stream: the tensor list is declared first
 * so the header (with every offset) can go out before the data, and the
 * data then arrive in pieces of any size. The file is written under a
 * temporary name and renamed into place only when complete and synced.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "model/safetensors.h"
#include "util/json.h"
#include "util/fs.h"

#define WBUF (4u << 20)

struct wtensor {
	char *name;
	kvmem_st_dtype dtype;
	int ndim;
	int64_t shape[KVMEM_ST_MAX_DIMS];
	uint64_t nbytes;
};

struct kvmem_st_writer {
	struct wtensor *t;
	size_t n, cap;
	char **meta;		/* key, value, key, value... */
	size_t nmeta;
	char *header;		/* built once, padded */
	size_t header_len;
	uint64_t data_total, written;
	bool failed, finished;
	int fd;
	char *path, *tmp;
	unsigned char *buf;
	size_t used;
};

kvmem_st_writer *kvmem_st_writer_new(void)
{
	kvmem_st_writer *w = calloc(1, sizeof(*w));

	if (!w) {
		kvmem_error(ENOMEM, "safetensors writer: out of memory");
		return NULL;
	}
	w->fd = -1;
	return w;
}

int kvmem_st_writer_meta(kvmem_st_writer *w, const char *key, const char *value)
{
	char **m;

	if (w->header)
		return kvmem_error(EINVAL, "safetensors writer: metadata '%s' added after the header was built",
				 key);
	m = realloc(w->meta, (w->nmeta + 2) * sizeof(*m));
	if (!m)
		return kvmem_error(ENOMEM, "safetensors writer: out of memory");
	w->meta = m;
	m[w->nmeta] = strdup(key);
	m[w->nmeta + 1] = strdup(value);
	w->nmeta += 2;
	if (!m[w->nmeta - 2] || !m[w->nmeta - 1])
		return kvmem_error(ENOMEM, "safetensors writer: out of memory");
	return 0;
}

int kvmem_st_writer_add(kvmem_st_writer *w, const char *name, kvmem_st_dtype dtype, int ndim,
		      const int64_t *shape)
{
	struct wtensor *t;
	uint64_t numel = 1;

	if (w->header)
		return kvmem_error(EINVAL, "safetensors writer: tensor '%s' added after the header was built",
				 name);
	if (!name || !*name || !strcmp(name, "__metadata__"))
		return kvmem_error(EINVAL, "safetensors writer: invalid tensor name '%s'", name ? name : "");
	if ((unsigned)dtype >= KVMEM_ST_NDTYPES || ndim < 0 || ndim > KVMEM_ST_MAX_DIMS)
		return kvmem_error(EINVAL, "safetensors writer: tensor '%s': bad dtype or rank", name);
	for (int i = 0; i < ndim; i++) {
		if (shape[i] < 0 || (shape[i] && numel > UINT64_MAX / 16 / (uint64_t)shape[i]))
			return kvmem_error(EINVAL, "safetensors writer: tensor '%s': bad shape", name);
		numel *= (uint64_t)shape[i];
	}
	for (size_t i = 0; i < w->n; i++)
		if (!strcmp(w->t[i].name, name))
			return kvmem_error(EINVAL, "safetensors writer: tensor '%s' added twice", name);
	if (w->n == w->cap) {
		size_t cap = w->cap ? 2 * w->cap : 64;

		t = realloc(w->t, cap * sizeof(*t));
		if (!t)
			return kvmem_error(ENOMEM, "safetensors writer: out of memory");
		w->t = t;
		w->cap = cap;
	}
	t = &w->t[w->n];
	memset(t, 0, sizeof(*t));
	t->name = strdup(name);
	if (!t->name)
		return kvmem_error(ENOMEM, "safetensors writer: out of memory");
	t->dtype = dtype;
	t->ndim = ndim;
	memcpy(t->shape, shape, (size_t)ndim * sizeof(*shape));
	t->nbytes = numel * kvmem_st_dtype_size(dtype);
	w->n++;
	return 0;
}

static int build_header(kvmem_st_writer *w)
{
	FILE *f;
	char *text = NULL;
	size_t len = 0;
	uint64_t off = 0;
	int bad = 0;	/* a name JSON cannot hold (not UTF-8) */

	if (w->header)
		return 0;
	f = open_memstream(&text, &len);
	if (!f)
		return kvmem_error(ENOMEM, "safetensors writer: out of memory");
	fputc('{', f);
	if (w->nmeta) {
		fputs("\"__metadata__\":{", f);
		for (size_t i = 0; i < w->nmeta; i += 2) {
			if (i)
				fputc(',', f);
			bad |= kvmem_json_write_str(f, w->meta[i]) == -EILSEQ;
			fputc(':', f);
			bad |= kvmem_json_write_str(f, w->meta[i + 1]) == -EILSEQ;
		}
		fputc('}', f);
	}
	for (size_t i = 0; i < w->n; i++) {
		const struct wtensor *t = &w->t[i];

		if (i || w->nmeta)
			fputc(',', f);
		bad |= kvmem_json_write_str(f, t->name) == -EILSEQ;
		fprintf(f, ":{\"dtype\":\"%s\",\"shape\":[", kvmem_st_dtype_name(t->dtype));
		for (int d = 0; d < t->ndim; d++)
			fprintf(f, "%s%lld", d ? "," : "", (long long)t->shape[d]);
		fprintf(f, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
			(unsigned long long)(off + t->nbytes));
		off += t->nbytes;
	}
	fputc('}', f);
	/* Spaces up to a multiple of 8, so the data start 8-aligned. */
	while ((ftell(f) + 8) % 8)
		fputc(' ', f);
	if (fclose(f) || !text) {
		free(text);
		return kvmem_error(ENOMEM, "safetensors writer: out of memory");
	}
	if (bad) {
		free(text);
		return kvmem_error(EINVAL, "safetensors writer: a tensor name or metadata string is not "
				   "UTF-8, which the JSON header cannot hold");
	}
	w->header = text;
	w->header_len = len;
	w->data_total = off;
	return 0;
}

uint64_t kvmem_st_writer_file_size(kvmem_st_writer *w)
{
	if (build_header(w))
		return 0;
	return 8 + w->header_len + w->data_total;
}

static int flush_buf(kvmem_st_writer *w)
{
	int rc = kvmem_write_all(w->fd, w->buf, w->used, -1);

	if (rc < 0) {
		w->failed = true;
		return kvmem_error(-rc, "%s: write failed: %s", w->path, strerror(-rc));
	}
	w->used = 0;
	return 0;
}

static int put(kvmem_st_writer *w, const void *data, size_t n)
{
	const unsigned char *p = data;
	int rc;

	while (n) {
		size_t k = WBUF - w->used < n ? WBUF - w->used : n;

		memcpy(w->buf + w->used, p, k);
		w->used += k;
		p += k;
		n -= k;
		if (w->used == WBUF && (rc = flush_buf(w)))
			return rc;
	}
	return 0;
}

int kvmem_st_writer_begin(kvmem_st_writer *w, const char *path)
{
	unsigned char len8[8];
	char *dcopy, *bcopy;
	int n, rc;

	if (w->fd >= 0 || w->finished)
		return kvmem_error(EINVAL, "%s: safetensors writer already begun", path);
	if ((rc = build_header(w)))
		return rc;
	w->path = strdup(path);
	dcopy = strdup(path);
	bcopy = strdup(path);
	w->buf = malloc(WBUF);
	if (!w->path || !dcopy || !bcopy || !w->buf) {
		free(dcopy);
		free(bcopy);
		return kvmem_error(ENOMEM, "%s: out of memory", path);
	}
	n = asprintf(&w->tmp, "%s/.%s" KVMEM_TMP_TAG "%d", dirname(dcopy), basename(bcopy),
		     (int)getpid());
	free(dcopy);
	free(bcopy);
	if (n < 0) {
		w->tmp = NULL;
		return kvmem_error(ENOMEM, "%s: out of memory", path);
	}
	/* A leftover of an earlier process with our pid goes; then O_EXCL and
	 * O_NOFOLLOW, so a link planted under the name is never written through. */
	unlink(w->tmp);
	w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (w->fd < 0)
		return kvmem_error(errno, "%s: cannot create: %s", w->tmp, strerror(errno));
	for (int i = 0; i < 8; i++)
		len8[i] = (unsigned char)((uint64_t)w->header_len >> (8 * i));
	if ((rc = put(w, len8, 8)))
		return rc;
	return put(w, w->header, w->header_len);
}

int kvmem_st_writer_write(kvmem_st_writer *w, const void *data, size_t n)
{
	if (w->fd < 0 || w->failed)
		return kvmem_error(EINVAL, "%s: safetensors writer is not open", w->path ? w->path : "?");
	if (n > w->data_total - w->written) {
		w->failed = true;
		return kvmem_error(EINVAL, "%s: %llu bytes more than the declared tensors hold", w->path,
				 (unsigned long long)(n - (w->data_total - w->written)));
	}
	w->written += n;
	return put(w, data, n);
}

/* Make the rename itself durable. */
static void sync_dir_of(const char *path)
{
	char *d = strdup(path);
	int fd;

	if (!d)
		return;
	fd = open(dirname(d), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
	free(d);
}

int kvmem_st_writer_finish(kvmem_st_writer *w)
{
	int rc;

	if (w->fd < 0 || w->failed)
		return kvmem_error(EINVAL, "%s: safetensors writer is not open", w->path ? w->path : "?");
	if (w->written != w->data_total) {
		w->failed = true;
		return kvmem_error(EINVAL, "%s: %llu of %llu data bytes written", w->path,
				 (unsigned long long)w->written, (unsigned long long)w->data_total);
	}
	if ((rc = flush_buf(w)))
		return rc;
	if (fsync(w->fd)) {
		w->failed = true;
		return kvmem_error(errno, "%s: fsync failed: %s", w->tmp, strerror(errno));
	}
	close(w->fd);
	w->fd = -1;
	if (rename(w->tmp, w->path)) {
		w->failed = true;
		unlink(w->tmp);
		return kvmem_error(errno, "%s: cannot rename into place: %s", w->path, strerror(errno));
	}
	w->finished = true;
	sync_dir_of(w->path);
	return 0;
}

void kvmem_st_writer_free(kvmem_st_writer *w)
{
	if (!w)
		return;
	if (w->fd >= 0) {
		close(w->fd);
		unlink(w->tmp);
	}
	for (size_t i = 0; i < w->n; i++)
		free(w->t[i].name);
	for (size_t i = 0; i < w->nmeta; i++)
		free(w->meta[i]);
	free(w->t);
	free(w->meta);
	free(w->header);
	free(w->path);
	free(w->tmp);
	free(w->buf);
	free(w);
}

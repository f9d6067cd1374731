// SPDX-License-Identifier: MIT
/*
 * Reading safetensors files: map, parse the JSON header, and check every
 * tensor's dtype, shape and byte range against the file before anyone
 * touches the data. See safetensors.h for the format and the rules.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "kvmem/kvmem.h"
#include "model/modelfile.h"
#include "model/safetensors.h"
#include "util/json.h"

struct kvmem_st_file {
	char *path;
	const unsigned char *base;
	size_t size;
	bool mapped;
	json_t *doc;
	const json_t *meta;
	size_t n;
	kvmem_st_tensor *t;	/* by data offset */
	uint32_t *by_name;	/* indices into t, sorted by name */
	struct stat st;		/* of the opened file (zero when parsed from memory) */
	uint64_t header_hash;	/* XXH3-64 of the length and the JSON header */
};

static const struct {
	const char *name;
	size_t size;
} dtypes[KVMEM_ST_NDTYPES] = {
	[KVMEM_ST_BOOL] = { "BOOL", 1 },	   [KVMEM_ST_U8] = { "U8", 1 },
	[KVMEM_ST_I8] = { "I8", 1 },	   [KVMEM_ST_F8_E5M2] = { "F8_E5M2", 1 },
	[KVMEM_ST_F8_E4M3] = { "F8_E4M3", 1 }, [KVMEM_ST_I16] = { "I16", 2 },
	[KVMEM_ST_U16] = { "U16", 2 },	   [KVMEM_ST_F16] = { "F16", 2 },
	[KVMEM_ST_BF16] = { "BF16", 2 },	   [KVMEM_ST_I32] = { "I32", 4 },
	[KVMEM_ST_U32] = { "U32", 4 },	   [KVMEM_ST_F32] = { "F32", 4 },
	[KVMEM_ST_F64] = { "F64", 8 },	   [KVMEM_ST_I64] = { "I64", 8 },
	[KVMEM_ST_U64] = { "U64", 8 },
};

const char *kvmem_st_dtype_name(kvmem_st_dtype d)
{
	return (unsigned)d < KVMEM_ST_NDTYPES ? dtypes[d].name : "?";
}

size_t kvmem_st_dtype_size(kvmem_st_dtype d)
{
	return (unsigned)d < KVMEM_ST_NDTYPES ? dtypes[d].size : 0;
}

int kvmem_st_dtype_parse(const char *name)
{
	for (int i = 0; i < KVMEM_ST_NDTYPES; i++)
		if (name && !strcmp(name, dtypes[i].name))
			return i;
	return -1;
}

char *kvmem_st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
	size_t at = 0;

	at += (size_t)snprintf(buf, len, "[");
	for (int i = 0; i < ndim && at < len; i++)
		at += (size_t)snprintf(buf + at, len - at, "%s%lld", i ? ", " : "",
				       (long long)shape[i]);
	if (at < len)
		snprintf(buf + at, len - at, "]");
	return buf;
}

/* ---- header ------------------------------------------------------------ */
/* A non-negative integer's value, else -1. */
static int64_t count_of(const json_t *v)
{
	return json_is_integer(v) && json_integer_value(v) >= 0 ? json_integer_value(v) : -1;
}

static int parse_tensor(kvmem_st_file *f, const char *name, const json_t *v, uint64_t data_len,
			kvmem_st_tensor *t)
{
	const json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
	const json_t *offs = json_object_get(v, "data_offsets");
	uint64_t begin, end;
	int d;

	t->name = name;
	if (!json_is_object(v))
		return kvmem_error(EBADMSG, "%s: tensor '%s': expected an object with dtype, shape and "
				 "data_offsets, found %s", f->path, name, kvmem_json_type_name(v));
	if (!json_is_string(dt))
		return kvmem_error(EBADMSG, "%s: tensor '%s' has no dtype string", f->path, name);
	d = kvmem_st_dtype_parse(json_string_value(dt));
	if (d < 0)
		return kvmem_error(EBADMSG, "%s: tensor '%s' has unknown dtype '%.40s'", f->path, name,
				 json_string_value(dt));
	t->dtype = (kvmem_st_dtype)d;

	if (!json_is_array(shape))
		return kvmem_error(EBADMSG, "%s: tensor '%s' has no shape array", f->path, name);
	if (json_array_size(shape) > KVMEM_ST_MAX_DIMS)
		return kvmem_error(EBADMSG, "%s: tensor '%s' has %zu dimensions (at most %d are read)",
				 f->path, name, json_array_size(shape), KVMEM_ST_MAX_DIMS);
	t->ndim = (int)json_array_size(shape);
	t->numel = 1;
	for (int i = 0; i < t->ndim; i++) {
		int64_t n = count_of(json_array_get(shape, (size_t)i));

		if (n < 0)
			return kvmem_error(EBADMSG, "%s: tensor '%s': shape entry %d is not a non-negative integer",
					 f->path, name, i);
		t->shape[i] = n;
		if (n && t->numel > UINT64_MAX / 16 / (uint64_t)n)
			return kvmem_error(EBADMSG, "%s: tensor '%s': shape is too large", f->path, name);
		t->numel *= (uint64_t)n;
	}
	t->nbytes = t->numel * kvmem_st_dtype_size(t->dtype);

	if (json_array_size(offs) != 2 || count_of(json_array_get(offs, 0)) < 0 ||
	    count_of(json_array_get(offs, 1)) < 0)
		return kvmem_error(EBADMSG, "%s: tensor '%s': data_offsets must be two non-negative integers",
				 f->path, name);
	begin = (uint64_t)count_of(json_array_get(offs, 0));
	end = (uint64_t)count_of(json_array_get(offs, 1));
	if (end < begin)
		return kvmem_error(EBADMSG, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin",
				 f->path, name, (unsigned long long)begin, (unsigned long long)end);
	if (end > data_len)
		return kvmem_error(EBADMSG, "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the "
				 "data (%llu bytes): the file is truncated or the offsets are wrong",
				 f->path, name, (unsigned long long)begin, (unsigned long long)end,
				 (unsigned long long)data_len);
	if (end - begin != t->nbytes) {
		char s[160];

		return kvmem_error(EBADMSG, "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but "
				 "shape %s of %s needs %llu", f->path, name,
				 (unsigned long long)begin, (unsigned long long)end,
				 (unsigned long long)(end - begin),
				 kvmem_st_shape_str(s, sizeof(s), t->ndim, t->shape),
				 kvmem_st_dtype_name(t->dtype), (unsigned long long)t->nbytes);
	}
	t->offset = f->size - data_len + begin;
	t->data = f->base + t->offset;
	return 0;
}

static int check_metadata(kvmem_st_file *f, json_t *meta)
{
	const char *key;
	json_t *v;

	if (!json_is_object(meta))
		return kvmem_error(EBADMSG, "%s: __metadata__ must be an object, found %s", f->path,
				 kvmem_json_type_name(meta));
	json_object_foreach(meta, key, v)
		if (!json_is_string(v))
			return kvmem_error(EBADMSG, "%s: __metadata__ value of '%s' must be a string, found %s",
					 f->path, key, kvmem_json_type_name(v));
	f->meta = meta;
	return 0;
}

static int by_offset(const void *a, const void *b)
{
	const kvmem_st_tensor *x = a, *y = b;

	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static int by_name(const void *a, const void *b, void *arg)
{
	const kvmem_st_tensor *t = arg;

	return strcmp(t[*(const uint32_t *)a].name, t[*(const uint32_t *)b].name);
}

static int parse_header(kvmem_st_file *f)
{
	uint64_t hlen = 0, data_len;
	const unsigned char *h;
	char jname[4200];
	size_t i, n = 0;
	const char *key;
	json_t *v;
	int rc;

	if (f->size < 8)
		return kvmem_error(EBADMSG, "%s: file is %zu bytes, too short for the 8-byte header length "
				 "(truncated, or not a safetensors file)", f->path, f->size);
	for (i = 0; i < 8; i++)
		hlen |= (uint64_t)f->base[i] << (8 * i);
	if (hlen > f->size - 8)
		return kvmem_error(EBADMSG, "%s: header length %llu runs past the end of the file (%zu bytes): "
				 "truncated, or not a safetensors file", f->path,
				 (unsigned long long)hlen, f->size);
	if (hlen > KVMEM_ST_MAX_HEADER)
		return kvmem_error(EBADMSG, "%s: header length %llu is above the %u MB limit", f->path,
				 (unsigned long long)hlen, KVMEM_ST_MAX_HEADER >> 20);
	h = f->base + 8;
	f->header_hash = XXH3_64bits(f->base, 8 + hlen);
	if (!hlen || h[0] != '{')
		return kvmem_error(EBADMSG, "%s: the header does not start with '{': not a safetensors file",
				 f->path);
	snprintf(jname, sizeof(jname), "%s (header)", f->path);
	if ((rc = kvmem_json_load((const char *)h, hlen, jname, &f->doc)) < 0)
		return rc;
	data_len = f->size - 8 - hlen;

	f->t = calloc(json_object_size(f->doc) + 1, sizeof(*f->t));
	f->by_name = calloc(json_object_size(f->doc) + 1, sizeof(*f->by_name));
	if (!f->t || !f->by_name)
		return kvmem_error(ENOMEM, "%s: out of memory", f->path);
	json_object_foreach(f->doc, key, v) {
		if (!strcmp(key, "__metadata__")) {
			if ((rc = check_metadata(f, v)))
				return rc;
			continue;
		}
		if (!*key)
			return kvmem_error(EBADMSG, "%s: a tensor has an empty name", f->path);
		if ((rc = parse_tensor(f, key, v, data_len, &f->t[n])))
			return rc;
		n++;
	}
	f->n = n;

	qsort(f->t, n, sizeof(*f->t), by_offset);
	for (i = 1; i < n; i++) {
		const kvmem_st_tensor *a = &f->t[i - 1], *b = &f->t[i];

		/* Empty tensors own no bytes, so they overlap nothing. */
		if (a->nbytes && b->nbytes && b->offset < a->offset + a->nbytes) {
			uint64_t d0 = f->size - data_len;

			return kvmem_error(EBADMSG, "%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap",
					 f->path, a->name, (unsigned long long)(a->offset - d0),
					 (unsigned long long)(a->offset - d0 + a->nbytes), b->name,
					 (unsigned long long)(b->offset - d0),
					 (unsigned long long)(b->offset - d0 + b->nbytes));
		}
	}
	/* The names are distinct C strings: the parser refuses a repeated key
	 * and a key holding "\u0000". */
	for (i = 0; i < n; i++)
		f->by_name[i] = (uint32_t)i;
	qsort_r(f->by_name, n, sizeof(uint32_t), by_name, f->t);
	return 0;
}

static kvmem_st_file *file_new(const char *name)
{
	kvmem_st_file *f = calloc(1, sizeof(*f));

	if (!f || !(f->path = strdup(name ? name : "safetensors"))) {
		free(f);
		kvmem_error(ENOMEM, "%s: out of memory", name ? name : "safetensors");
		return NULL;
	}
	return f;
}

int kvmem_st_parse(const void *buf, size_t len, const char *name, kvmem_st_file **out)
{
	kvmem_st_file *f = file_new(name);
	int rc;

	*out = NULL;
	if (!f)
		return -ENOMEM;	/* file_new said so */
	f->base = buf;
	f->size = len;
	if ((rc = parse_header(f))) {
		kvmem_st_close(f);
		return rc;
	}
	*out = f;
	return 0;
}

int kvmem_st_open(const char *path, kvmem_st_file **out)
{
	kvmem_st_file *f;
	struct stat st;
	int fd, rc;

	*out = NULL;
	/* Without blocking on a FIFO; a dangling link or a device is named. */
	if ((rc = kvmem_mf_open(path, &fd, &st)) < 0)
		return rc;
	f = file_new(path);
	if (!f) {
		close(fd);
		return -ENOMEM;	/* file_new said so */
	}
	f->size = (size_t)st.st_size;
	f->st = st;
	if (f->size >= 8) {	/* shorter files fail the header check below */
		void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);

		if (map == MAP_FAILED) {
			rc = kvmem_error(errno, "%s: cannot map %zu bytes: %s", path, f->size,
					 strerror(errno));
			close(fd);
			kvmem_st_close(f);
			return rc;
		}
		f->base = map;
		f->mapped = true;
	}
	close(fd);
	if ((rc = parse_header(f))) {
		kvmem_st_close(f);
		return rc;
	}
	*out = f;
	return 0;
}

void kvmem_st_close(kvmem_st_file *f)
{
	if (!f)
		return;
	if (f->mapped)
		munmap((void *)f->base, f->size);
	json_decref(f->doc);
	free(f->t);
	free(f->by_name);
	free(f->path);
	free(f);
}

const char *kvmem_st_path(const kvmem_st_file *f)
{
	return f->path;
}

size_t kvmem_st_file_size(const kvmem_st_file *f)
{
	return f->size;
}

const struct stat *kvmem_st_stat(const kvmem_st_file *f)
{
	return f->st.st_ino || f->st.st_dev ? &f->st : NULL;
}

uint64_t kvmem_st_header_hash(const kvmem_st_file *f)
{
	return f->header_hash;
}

size_t kvmem_st_count(const kvmem_st_file *f)
{
	return f->n;
}

const kvmem_st_tensor *kvmem_st_at(const kvmem_st_file *f, size_t i)
{
	return i < f->n ? &f->t[i] : NULL;
}

const kvmem_st_tensor *kvmem_st_find(const kvmem_st_file *f, const char *name)
{
	size_t lo = 0, hi = f->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const kvmem_st_tensor *t = &f->t[f->by_name[mid]];
		int c = strcmp(t->name, name);

		if (!c)
			return t;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const char *kvmem_st_metadata(const kvmem_st_file *f, const char *key)
{
	return json_string_value(json_object_get(f->meta, key));
}

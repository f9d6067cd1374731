/* SPDX-License-Identifier: MIT */
/*
 * The safetensors format: read (mapped with mmap, every field checked) and
 * write (streamed, so a model larger than memory can be written).
 *
 * Layout of a file:
 *   8 bytes    N, the header length, little-endian unsigned
 *   N bytes    a JSON object: "__metadata__" (optional, string -> string)
 *              and one member per tensor:
 *                "name": {"dtype": "BF16", "shape": [rows, cols],
 *                         "data_offsets": [begin, end]}
 *              padded with spaces
 *   the rest   the data section; offsets count from its first byte
 *
 * The reader refuses, with a message that names the file and the tensor:
 * a file too short for the length, a header length past the end (or above
 * 100 MB), a header that is not a JSON object, an unknown dtype, a negative
 * or non-integer dimension, more than KVMEM_ST_MAX_DIMS dimensions, offsets
 * that are reversed, past the end of the file (a truncated file), overlapping
 * another tensor, or whose length is not shape x dtype size. Gaps between
 * tensors and bytes after the last one are allowed.
 */
#ifndef KVMEM_MODEL_SAFETENSORS_H
#define KVMEM_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

typedef enum kvmem_st_dtype {
	KVMEM_ST_BOOL,
	KVMEM_ST_U8,
	KVMEM_ST_I8,
	KVMEM_ST_F8_E5M2,
	KVMEM_ST_F8_E4M3,
	KVMEM_ST_I16,
	KVMEM_ST_U16,
	KVMEM_ST_F16,
	KVMEM_ST_BF16,
	KVMEM_ST_I32,
	KVMEM_ST_U32,
	KVMEM_ST_F32,
	KVMEM_ST_F64,
	KVMEM_ST_I64,
	KVMEM_ST_U64,
	KVMEM_ST_NDTYPES
} kvmem_st_dtype;

/* "BF16" etc. as the format spells them; "?" when out of range. */
const char *kvmem_st_dtype_name(kvmem_st_dtype d);
/* Bytes per element. */
size_t kvmem_st_dtype_size(kvmem_st_dtype d);
/* The dtype a name spells, or -1. */
int kvmem_st_dtype_parse(const char *name);

#define KVMEM_ST_MAX_DIMS 8
#define KVMEM_ST_MAX_HEADER (100u << 20)

typedef struct kvmem_st_tensor {
	const char *name;
	kvmem_st_dtype dtype;
	int ndim;
	int64_t shape[KVMEM_ST_MAX_DIMS];
	uint64_t numel;		/* product of shape (1 for a scalar) */
	uint64_t offset;	/* of the first byte, from the start of the file */
	uint64_t nbytes;	/* numel * dtype size */
	const void *data;	/* in the mapping; alignment as the file has it */
} kvmem_st_tensor;

typedef struct kvmem_st_file kvmem_st_file;

/* Map and check a file. 0, or with the message set: -EBADMSG for a file
 * that fails a check above (the header's JSON included), the open's code
 * (-ENOENT, -ELOOP, -EINVAL for what is not a regular file; modelfile.h),
 * -ENOMEM. */
int kvmem_st_open(const char *path, kvmem_st_file **out);
/* Check a file already in memory (buf must outlive the result, which does
 * not copy it); `name` starts the messages. */
int kvmem_st_parse(const void *buf, size_t len, const char *name, kvmem_st_file **out);
/* Unmap and free; NULL is fine. Tensor pointers die with it. */
void kvmem_st_close(kvmem_st_file *f);

const char *kvmem_st_path(const kvmem_st_file *f);
size_t kvmem_st_file_size(const kvmem_st_file *f);
/* The fstat of the opened file (NULL for kvmem_st_parse), and the XXH3-64
 * of its first 8 + N bytes (length and header): what the fingerprint
 * cache keys on besides the file's identity. */
const struct stat *kvmem_st_stat(const kvmem_st_file *f);
uint64_t kvmem_st_header_hash(const kvmem_st_file *f);
size_t kvmem_st_count(const kvmem_st_file *f);
/* Tensor i in the order of their data offsets. */
const kvmem_st_tensor *kvmem_st_at(const kvmem_st_file *f, size_t i);
/* The tensor by name (logarithmic), or NULL. */
const kvmem_st_tensor *kvmem_st_find(const kvmem_st_file *f, const char *name);
/* A "__metadata__" value, or NULL. */
const char *kvmem_st_metadata(const kvmem_st_file *f, const char *key);
/* "[4096, 1024]" into buf (for messages); returns buf. */
char *kvmem_st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape);

/* ---- writer ----------------------------------------------------------- *
 *   w = kvmem_st_writer_new();
 *   kvmem_st_writer_meta(w, "format", "pt");
 *   kvmem_st_writer_add(w, "a", KVMEM_ST_BF16, 2, shape_a);   // every tensor first
 *   kvmem_st_writer_add(w, "b", ...);
 *   kvmem_st_writer_begin(w, "dir/model.safetensors");       // header written
 *   kvmem_st_writer_write(w, bytes, n) ...                   // a's bytes, then b's
 *   kvmem_st_writer_finish(w);                               // fsync, rename
 *   kvmem_st_writer_free(w);
 * Data go to "dir/.model.safetensors.kvmem-tmp-<pid>" and replace the target only
 * when complete, so a crash never leaves a half-written model under the real
 * name. The header is padded with spaces to a multiple of 8 bytes, so the
 * data section starts 8-aligned, and tensors follow each other in the order
 * they were added.
 */
typedef struct kvmem_st_writer kvmem_st_writer;

kvmem_st_writer *kvmem_st_writer_new(void);
int kvmem_st_writer_meta(kvmem_st_writer *w, const char *key, const char *value);
int kvmem_st_writer_add(kvmem_st_writer *w, const char *name, kvmem_st_dtype dtype, int ndim,
		      const int64_t *shape);
/* The size the finished file will have (valid once every tensor is added). */
uint64_t kvmem_st_writer_file_size(kvmem_st_writer *w);
int kvmem_st_writer_begin(kvmem_st_writer *w, const char *path);
int kvmem_st_writer_write(kvmem_st_writer *w, const void *data, size_t n);
int kvmem_st_writer_finish(kvmem_st_writer *w);
/* Frees; a file begun but not finished is removed. */
void kvmem_st_writer_free(kvmem_st_writer *w);

#endif

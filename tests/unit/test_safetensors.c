// SPDX-License-Identifier: MIT
/* safetensors: the writer's files read back exactly; every malformed file
 * is refused with a message naming the file and the problem, and nothing is
 * read outside the file (ASan watches exact-size buffers). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "model/safetensors.h"
#include "helpers/test_model.h"

static uint64_t rng_state;
static char tmpdir[64];

static uint64_t rnd(void)
{
	return kvmem_rng_next(&rng_state);
}

static int setup(void **state)
{
	strcpy(tmpdir, "/tmp/kvmem-st.XXXXXX");
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	return system(cmd);
}

/* A file image: 8-byte length, the header as given, data_len random bytes. */
static unsigned char *image(const char *header, size_t data_len, size_t *len)
{
	size_t h = strlen(header);
	unsigned char *b = malloc(8 + h + data_len);

	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)((uint64_t)h >> (8 * i));
	memcpy(b + 8, header, h);
	for (size_t i = 0; i < data_len; i++)
		b[8 + h + i] = (unsigned char)rnd();
	*len = 8 + h + data_len;
	return b;
}

static void expect_refused(const char *header, size_t data_len, const char *want)
{
	size_t len;
	unsigned char *b = image(header, data_len, &len);
	kvmem_st_file *f = (kvmem_st_file *)&len;	/* must be reset to NULL */

	if (!kvmem_st_parse(b, len, "bad.safetensors", &f))
		fail_msg("header <%s> was accepted, want <%s>", header, want);
	assert_null(f);
	if (!strstr(kvmem_last_error(), want) || strncmp(kvmem_last_error(), "bad.safetensors", 15))
		fail_msg("header <%s>: want <%s>, got <%s>", header, want, kvmem_last_error());
	free(b);
}

struct spec {
	char name[32];
	kvmem_st_dtype dtype;
	int ndim;
	int64_t shape[4];
	size_t nbytes;
	unsigned char *data;
};

/* Write n random tensors with the writer; returns the file's path. */
static void write_random(const char *path, struct spec *s, int n, int meta)
{
	kvmem_st_writer *w = kvmem_st_writer_new();
	const kvmem_st_dtype pick[] = { KVMEM_ST_BF16, KVMEM_ST_F16, KVMEM_ST_F32, KVMEM_ST_I8, KVMEM_ST_F64,
				      KVMEM_ST_I64 };

	assert_non_null(w);
	if (meta) {
		assert_int_equal(kvmem_st_writer_meta(w, "format", "pt"), 0);
		assert_int_equal(kvmem_st_writer_meta(w, "quote\"d", "line\nbreak"), 0);
	}
	for (int i = 0; i < n; i++) {
		size_t numel = 1;

		snprintf(s[i].name, sizeof(s[i].name), "t%d.w%llu", i,
			 (unsigned long long)(rnd() % 1000));
		s[i].dtype = pick[rnd() % 6];
		s[i].ndim = (int)(rnd() % 4);
		for (int d = 0; d < s[i].ndim; d++) {
			s[i].shape[d] = (int64_t)(rnd() % 9);
			numel *= (size_t)s[i].shape[d];
		}
		s[i].nbytes = numel * kvmem_st_dtype_size(s[i].dtype);
		s[i].data = malloc(s[i].nbytes + 1);
		for (size_t b = 0; b < s[i].nbytes; b++)
			s[i].data[b] = (unsigned char)rnd();
		assert_int_equal(kvmem_st_writer_add(w, s[i].name, s[i].dtype, s[i].ndim, s[i].shape), 0);
	}
	assert_int_equal(kvmem_st_writer_begin(w, path), 0);
	for (int i = 0; i < n; i++) {
		/* in uneven pieces, as a streaming generator would */
		size_t done = 0;

		while (done < s[i].nbytes) {
			size_t k = 1 + rnd() % (s[i].nbytes - done);

			assert_int_equal(kvmem_st_writer_write(w, s[i].data + done, k), 0);
			done += k;
		}
	}
	assert_int_equal(kvmem_st_writer_finish(w), 0);
	{
		struct stat st;

		assert_int_equal(stat(path, &st), 0);
		assert_int_equal((uint64_t)st.st_size, kvmem_st_writer_file_size(w));
	}
	kvmem_st_writer_free(w);
}

static void test_roundtrip(void **state)
{
	enum { N = 40 };
	struct spec s[N];
	char path[128];
	kvmem_st_file *f;
	uint64_t hlen = 0;

	snprintf(path, sizeof(path), "%s/rt.safetensors", tmpdir);
	write_random(path, s, N, 1);
	assert_int_equal(kvmem_st_open(path, &f), 0);
	assert_int_equal(kvmem_st_count(f), N);
	assert_string_equal(kvmem_st_metadata(f, "format"), "pt");
	assert_string_equal(kvmem_st_metadata(f, "quote\"d"), "line\nbreak");
	assert_null(kvmem_st_metadata(f, "absent"));
	assert_string_equal(kvmem_st_path(f), path);
	for (int i = 0; i < N; i++) {
		const kvmem_st_tensor *t = kvmem_st_find(f, s[i].name);

		assert_non_null(t);
		assert_string_equal(t->name, s[i].name);
		assert_int_equal(t->dtype, s[i].dtype);
		assert_int_equal(t->ndim, s[i].ndim);
		for (int d = 0; d < t->ndim; d++)
			assert_int_equal(t->shape[d], s[i].shape[d]);
		assert_int_equal(t->nbytes, s[i].nbytes);
		if (s[i].nbytes)
			assert_memory_equal(t->data, s[i].data, s[i].nbytes);
		free(s[i].data);
	}
	assert_null(kvmem_st_find(f, "t"));
	/* the data section starts 8-aligned and tensors come in offset order */
	for (int i = 0; i < 8; i++)
		hlen |= (uint64_t)((const unsigned char *)kvmem_st_at(f, 0)->data -
				   kvmem_st_at(f, 0)->offset)[i] << (8 * i);
	assert_int_equal(hlen % 8, 0);
	for (size_t i = 1; i < kvmem_st_count(f); i++)
		assert_true(kvmem_st_at(f, i)->offset >= kvmem_st_at(f, i - 1)->offset);
	kvmem_st_close(f);
}

static void test_dtypes(void **state)
{
	assert_string_equal(kvmem_st_dtype_name(KVMEM_ST_BF16), "BF16");
	assert_int_equal(kvmem_st_dtype_parse("F16"), KVMEM_ST_F16);
	assert_int_equal(kvmem_st_dtype_parse("F32"), KVMEM_ST_F32);
	assert_true(kvmem_st_dtype_parse("bf16") < 0);
	assert_true(kvmem_st_dtype_parse("Q4_0") < 0);
	assert_int_equal(kvmem_st_dtype_size(KVMEM_ST_F64), 8);
	assert_int_equal(kvmem_st_dtype_size(KVMEM_ST_BF16), 2);
}

static void test_bad_headers(void **state)
{
	const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
	size_t len;
	unsigned char *b;
	kvmem_st_file *f;

	/* the good one first, so the refusals below are about their one change */
	b = image(ok, 24, &len);
	assert_int_equal(kvmem_st_parse(b, len, "good", &f), 0);
	assert_int_equal(kvmem_st_find(f, "a")->numel, 6);
	kvmem_st_close(f);
	free(b);

	expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},}", 24,
		       "bad.safetensors (header):1:");
	expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}", 24,
		       "bad.safetensors (header):1:56: '}' expected near end of file");
	expect_refused("[1, 2]", 0, "does not start with '{'");
	expect_refused("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
		       "tensor 'a' has unknown dtype 'Q4'");
	expect_refused("{\"a\":{\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24, "no dtype");
	expect_refused("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,24]}}", 24, "no shape");
	expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,24]}}", 24,
		       "shape entry 1 is not a non-negative integer");
	expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3.5],\"data_offsets\":[0,24]}}", 24,
		       "shape entry 1");
	expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
		       1, "9 dimensions");
	expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 23,
		       "data_offsets [0, 24] run past the end of the data (23 bytes)");
	expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24,
		       "[0, 20] hold 20 bytes but shape [2, 3] of F32 needs 24");
	expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[24,0]}}", 24,
		       "end before they begin");
	expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0]}}", 24,
		       "two non-negative integers");
	expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[-8,16]}}", 24,
		       "two non-negative integers");
	expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
		       "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[20,28]}}", 28,
		       "tensors 'a' [0, 24] and 'b' [20, 28] overlap");
	expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "overlap");
	expect_refused("{\"a\":7}", 0, "tensor 'a': expected an object");
	expect_refused("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ value of 'k' must be a string");
	expect_refused("{\"__metadata__\":[]}", 0, "__metadata__ must be an object");
	expect_refused("{\"\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, "empty name");
	/* Issue 9 item 8: a name holding "\u0000" would pass for its prefix in
	 * every C string comparison; the parser refuses it in any key or string. */
	expect_refused("{\"a\\u0000x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
		       "\"a\\u0000y\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0,
		       "holds \"\\u0000\"");
	expect_refused("{\"model.norm.weight\\u0000\":{\"dtype\":\"F32\",\"shape\":[0],"
		       "\"data_offsets\":[0,0]}}", 0, "a key holds \"\\u0000\": \"model.norm.weight\\u0000\"");
	expect_refused("{\"a\":{\"dtype\":\"F32\\u0000\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0,
		       "a string holds \"\\u0000\": \"F32\\u0000\"");
	expect_refused("{\"__metadata__\":{\"format\":\"pt\\u0000\"}}", 0,
		       "a string holds \"\\u0000\": \"pt\\u0000\"");
	expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],"
		       "\"data_offsets\":[0,8]}}", 8, "too large");

	/* empty tensors own no bytes; a scalar has one element */
	b = image("{\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[4,4]},"
		  "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
		  "\"__metadata__\":{}}    ", 4, &len);
	assert_int_equal(kvmem_st_parse(b, len, "edge", &f), 0);
	assert_int_equal(kvmem_st_find(f, "e")->numel, 0);
	assert_int_equal(kvmem_st_find(f, "s")->numel, 1);
	assert_ptr_equal(kvmem_st_find(f, "s")->data, b + len - 4);
	kvmem_st_close(f);
	free(b);
}

static void test_lengths(void **state)
{
	unsigned char b[16] = { 0 };
	kvmem_st_file *f;
	size_t big = 120u << 20;
	unsigned char *m;

	assert_true(kvmem_st_parse(b, 5, "short.safetensors", &f) < 0);
	assert_non_null(strstr(kvmem_last_error(), "short.safetensors: file is 5 bytes, too short"));
	b[0] = 9;	/* header of 9 bytes in a 16-byte file */
	assert_true(kvmem_st_parse(b, 16, "x.safetensors", &f) < 0);
	assert_non_null(strstr(kvmem_last_error(),
			       "x.safetensors: header length 9 runs past the end of the file (16 bytes)"));
	memset(b, 0xff, 8);
	assert_true(kvmem_st_parse(b, 16, "x.safetensors", &f) < 0);
	assert_non_null(strstr(kvmem_last_error(), "runs past the end"));

	/* A plausible-looking length above the 100 MB cap in a big enough file:
	 * untouched pages of the mapping cost nothing. */
	m = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	assert_true(m != MAP_FAILED);
	m[3] = 0x06;	/* 0x06000000 = 96 MiB: fine by the cap, but it is not JSON */
	m[8] = '{';
	assert_true(kvmem_st_parse(m, big, "y.safetensors", &f) < 0);
	assert_null(strstr(kvmem_last_error(), "limit"));
	m[3] = 0x07;	/* 112 MiB */
	assert_true(kvmem_st_parse(m, big, "y.safetensors", &f) < 0);
	assert_non_null(strstr(kvmem_last_error(), "above the 100 MB limit"));
	munmap(m, big);
}

/* Every prefix of a real file fails cleanly; random damage never crashes. */
static void test_truncation_and_damage(void **state)
{
	enum { N = 6 };
	struct spec s[N];
	char path[128];
	FILE *fp;
	unsigned char *whole;
	size_t size;
	kvmem_st_file *f;
	uint64_t last_end = 0;

	snprintf(path, sizeof(path), "%s/trunc.safetensors", tmpdir);
	for (;;) {	/* want the last tensor non-empty so that every cut shows */
		write_random(path, s, N, 0);
		for (int i = 0; i < N; i++)
			free(s[i].data);
		assert_int_equal(kvmem_st_open(path, &f), 0);
		last_end = kvmem_st_at(f, N - 1)->offset + kvmem_st_at(f, N - 1)->nbytes;
		size = kvmem_st_file_size(f);
		kvmem_st_close(f);
		if (last_end == size)
			break;
	}
	fp = fopen(path, "rb");
	whole = malloc(size);
	assert_int_equal(fread(whole, 1, size, fp), size);
	fclose(fp);
	for (size_t n = 0; n < size; n++) {
		unsigned char *cut = malloc(n ? n : 1);

		memcpy(cut, whole, n);
		assert_true(kvmem_st_parse(cut, n, "cut.safetensors", &f) < 0);
		assert_true(!strncmp(kvmem_last_error(), "cut.safetensors", 15));
		free(cut);
	}
	/* the same through the file path: a truncated file on disk */
	assert_int_equal(truncate(path, (off_t)size - 1), 0);
	assert_true(kvmem_st_open(path, &f) < 0);
	assert_non_null(strstr(kvmem_last_error(), "run past the end of the data"));
	assert_non_null(strstr(kvmem_last_error(), path));

	for (int round = 0; round < 3000; round++) {
		unsigned char *d = malloc(size);

		memcpy(d, whole, size);
		for (int k = 0; k < 2; k++)
			d[rnd() % (size < 300 ? size : 300)] = (unsigned char)rnd();
		if (!kvmem_st_parse(d, size, "damaged", &f)) {
			for (size_t i = 0; i < kvmem_st_count(f); i++) {	/* in bounds? */
				const kvmem_st_tensor *t = kvmem_st_at(f, i);

				assert_true(t->offset + t->nbytes <= size);
			}
			kvmem_st_close(f);
		}
		free(d);
	}
	free(whole);
}

static void test_open_errors(void **state)
{
	char path[128];
	kvmem_st_file *f;
	FILE *fp;

	snprintf(path, sizeof(path), "%s/nope.safetensors", tmpdir);
	assert_true(kvmem_st_open(path, &f) < 0);
	assert_non_null(strstr(kvmem_last_error(), "nope.safetensors: cannot open: No such file"));
	assert_true(kvmem_st_open(tmpdir, &f) < 0);
	assert_non_null(strstr(kvmem_last_error(), "not a regular file"));
	snprintf(path, sizeof(path), "%s/empty.safetensors", tmpdir);
	fp = fopen(path, "w");
	fclose(fp);
	assert_true(kvmem_st_open(path, &f) < 0);
	assert_non_null(strstr(kvmem_last_error(), "file is 0 bytes"));
}

static void test_writer_errors(void **state)
{
	char path[128], tmp[160];
	int64_t shape[2] = { 3, 5 };
	unsigned char junk[64] = { 0 };
	kvmem_st_writer *w = kvmem_st_writer_new();

	snprintf(path, sizeof(path), "%s/w.safetensors", tmpdir);
	snprintf(tmp, sizeof(tmp), "%s/.w.safetensors" KVMEM_TMP_TAG "%d", tmpdir, (int)getpid());
	assert_int_equal(kvmem_st_writer_add(w, "x", KVMEM_ST_F32, 2, shape), 0);
	assert_true(kvmem_st_writer_add(w, "x", KVMEM_ST_F32, 2, shape) < 0);
	assert_non_null(strstr(kvmem_last_error(), "added twice"));
	assert_true(kvmem_st_writer_add(w, "__metadata__", KVMEM_ST_F32, 2, shape) < 0);
	assert_int_equal(kvmem_st_writer_begin(w, path), 0);
	assert_int_equal(access(tmp, F_OK), 0);
	assert_int_equal(kvmem_st_writer_write(w, junk, 40), 0);
	assert_true(kvmem_st_writer_finish(w) < 0);	/* 40 of 60 bytes */
	assert_non_null(strstr(kvmem_last_error(), "40 of 60 data bytes written"));
	kvmem_st_writer_free(w);
	assert_int_equal(access(path, F_OK), -1);	/* nothing under the real name */
	assert_int_equal(access(tmp, F_OK), -1);	/* and no leftover */

	w = kvmem_st_writer_new();
	assert_int_equal(kvmem_st_writer_add(w, "x", KVMEM_ST_BF16, 2, shape), 0);
	assert_int_equal(kvmem_st_writer_begin(w, path), 0);
	assert_true(kvmem_st_writer_write(w, junk, 31) < 0);
	assert_non_null(strstr(kvmem_last_error(), "1 bytes more than the declared tensors hold"));
	kvmem_st_writer_free(w);
	assert_int_equal(access(tmp, F_OK), -1);

	w = kvmem_st_writer_new();
	snprintf(path, sizeof(path), "%s/no/such/dir/w.safetensors", tmpdir);
	assert_true(kvmem_st_writer_begin(w, path) < 0);
	assert_non_null(strstr(kvmem_last_error(), "cannot create"));
	kvmem_st_writer_free(w);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dtypes),
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_bad_headers),
		cmocka_unit_test(test_lengths),
		cmocka_unit_test(test_truncation_and_damage),
		cmocka_unit_test(test_open_errors),
		cmocka_unit_test(test_writer_errors),
	};

	rng_state = test_rng_fresh_seed("test_safetensors");
	return cmocka_run_group_tests(tests, setup, teardown);
}

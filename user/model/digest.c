// SPDX-License-Identifier: MIT
/*
 * Per-tensor digests of a safetensors file and their cache (digest.h).
 *
 * Cache file <data dir>/fingerprints/<dev>-<ino> (hex), text:
 *   kvmem-fingerprint-cache 1
 *   file <dev> <ino> <size> <mtime s> <mtime ns> <ctime s> <ctime ns> <header hash> <tensors>
 *   <hash> <nonfinite>            one line per tensor, in data-offset order
 *   end <XXH64 of every byte before this line>
 * Numbers in decimal except dev, ino and the hashes (16 lower-case hex digits).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "kvmem/kvmem.h"
#include "model/digest.h"
#include "util/fs.h"

#define CACHE_MAGIC "kvmem-fingerprint-cache 1\n"
#define CHUNK (64u << 10)	/* hashed, then scanned while still in the L2 cache */
#define RACY_S 2		/* see digest.h: changes this recent are not cached */

/* Is the element at p (esz bytes, little-endian) NaN or infinite? */
static int special(const unsigned char *p, int esz, uint32_t emask)
{
	uint32_t v = 0;

	memcpy(&v, p, (size_t)esz);
	return (v & emask) == emask;
}

/*
 * Values whose exponent bits are all ones: NaN or infinite. Eight bytes at a
 * time: a lane whose exponent is all ones becomes a zero lane of
 * (x & mask) ^ mask, found with the has-a-zero-lane test; only then are the
 * lanes counted one by one. Non-finite weights are rare, so this runs at
 * the speed of the loads (a loop per element cost 0.85 s per GiB).
 */
static uint64_t count_nonfinite(const void *data, size_t nbytes, kvmem_st_dtype dt)
{
	const unsigned char *p = data;
	uint64_t mask, ones, highs, bad = 0;
	uint32_t emask;
	int esz;
	size_t i = 0;

	if (dt == KVMEM_ST_BF16 || dt == KVMEM_ST_F16) {
		emask = dt == KVMEM_ST_BF16 ? 0x7f80 : 0x7c00;
		mask = emask * 0x0001000100010001ull;
		ones = 0x0001000100010001ull;
		highs = 0x8000800080008000ull;
		esz = 2;
	} else if (dt == KVMEM_ST_F32) {
		emask = 0x7f800000u;
		mask = emask * 0x0000000100000001ull;
		ones = 0x0000000100000001ull;
		highs = 0x8000000080000000ull;
		esz = 4;
	} else {
		return 0;
	}
	for (; i + 8 <= nbytes; i += 8) {
		uint64_t x, y;

		memcpy(&x, p + i, 8);
		y = (x & mask) ^ mask;
		if ((y - ones) & ~y & highs)
			for (int k = 0; k < 8; k += esz)
				bad += (uint64_t)special(p + i + k, esz, emask);
	}
	for (; i + (size_t)esz <= nbytes; i += (size_t)esz)
		bad += (uint64_t)special(p + i, esz, emask);
	return bad;
}

/*
 * Fault the mapped range in with one call instead of a page fault per 4 KiB
 * (measured on a 1.19 GB model in the page cache: 1.2 s of faults against
 * 0.15 s of hashing). Only a hint: errors (an old kernel) change nothing.
 */
static void populate(const void *p, uint64_t n)
{
#ifdef MADV_POPULATE_READ
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p & ~(pg - 1);

	if (n)
		madvise((void *)a, (uintptr_t)p + n - a, MADV_POPULATE_READ);
#else
	(void)p;
	(void)n;
#endif
}

void kvmem_digest_tensor(const kvmem_st_tensor *t, struct kvmem_tensor_digest *d)
{
	XXH3_state_t *st = XXH3_createState();

	populate(t->data, t->nbytes);

	d->nonfinite = 0;
	if (!st || XXH3_64bits_reset(st) != XXH_OK) {
		/* No memory for the streaming state: the same digest in one go,
		 * then the scan (the bytes are read twice). */
		XXH3_freeState(st);
		d->hash = XXH3_64bits(t->data, t->nbytes);
		d->nonfinite = count_nonfinite(t->data, t->nbytes, t->dtype);
		return;
	}
	/* Chunks a multiple of 4 bytes, so no value straddles two. */
	for (uint64_t at = 0; at < t->nbytes; at += CHUNK) {
		size_t n = t->nbytes - at < CHUNK ? (size_t)(t->nbytes - at) : CHUNK;
		const char *p = (const char *)t->data + at;

		XXH3_64bits_update(st, p, n);
		d->nonfinite += count_nonfinite(p, n, t->dtype);
	}
	d->hash = XXH3_64bits_digest(st);
	XXH3_freeState(st);
}

/* ---- the cache ----------------------------------------------------------- */
/* The cache file for st, and its folder; -ENAMETOOLONG (no message: the
 * cache is best effort, and callers go on without it). */
static int cache_path(const struct stat *st, char *buf, size_t len, char *dir, size_t dlen)
{
	char base[4096];

	if (!kvmem_data_dir(base, sizeof(base)) ||
	    (size_t)snprintf(dir, dlen, "%s/fingerprints", base) >= dlen ||
	    (size_t)snprintf(buf, len, "%s/%016" PRIx64 "-%016" PRIx64, dir, (uint64_t)st->st_dev,
			     (uint64_t)st->st_ino) >= len)
		return -ENAMETOOLONG;
	return 0;
}

static int file_line(char *buf, size_t len, const kvmem_st_file *f, const struct stat *st)
{
	return snprintf(buf, len, "file %016" PRIx64 " %016" PRIx64 " %lld %lld %ld %lld %ld %016" PRIx64
			" %zu\n", (uint64_t)st->st_dev, (uint64_t)st->st_ino, (long long)st->st_size,
			(long long)st->st_mtim.tv_sec, st->st_mtim.tv_nsec, (long long)st->st_ctim.tv_sec,
			st->st_ctim.tv_nsec, kvmem_st_header_hash(f), kvmem_st_count(f));
}

/* 1 and out[] filled when the cache holds this exact file; 0 otherwise. */
static int cache_load(const kvmem_st_file *f, const struct stat *st, struct kvmem_tensor_digest *out)
{
	char path[4300], dir[4200], want[256];
	size_t n = kvmem_st_count(f), cap = 256 + 48 * n, got = 0, at;
	char *buf, *end;
	int fd, ok = 0;

	if (cache_path(st, path, sizeof(path), dir, sizeof(dir)))
		return 0;
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return 0;
	buf = malloc(cap + 1);
	while (buf && got < cap) {
		ssize_t r = read(fd, buf + got, cap - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	if (!buf || got == cap)		/* longer than this file's record can be */
		goto out;
	buf[got] = 0;
	/* "end <hash>\n" closes it and checks every byte before. */
	end = got >= 21 ? buf + got - 21 : NULL;
	if (!end || strncmp(end, "end ", 4) || buf[got - 1] != '\n' ||
	    strtoull(end + 4, NULL, 16) != XXH64(buf, (size_t)(end - buf), 0))
		goto out;
	*end = 0;
	file_line(want, sizeof(want), f, st);
	if (strncmp(buf, CACHE_MAGIC, strlen(CACHE_MAGIC)))
		goto out;
	at = strlen(CACHE_MAGIC);
	if (strncmp(buf + at, want, strlen(want)))
		goto out;
	at += strlen(want);
	for (size_t i = 0; i < n; i++) {
		unsigned long long h, bad;
		int used = 0;

		if (sscanf(buf + at, "%16llx %llu\n%n", &h, &bad, &used) != 2 || !used)
			goto out;
		out[i].hash = h;
		out[i].nonfinite = bad;
		at += (size_t)used;
	}
	ok = buf[at] == 0;
out:
	free(buf);
	return ok;
}

static void cache_store(const kvmem_st_file *f, const struct stat *st,
			const struct kvmem_tensor_digest *d)
{
	char path[4300], dir[4200], tmp[4400];
	char *text = NULL;
	size_t len = 0;
	int written;
	struct timespec now;
	FILE *m;
	int fd;

	clock_gettime(CLOCK_REALTIME, &now);
	if (now.tv_sec - st->st_ctim.tv_sec < RACY_S)
		return;
	if (cache_path(st, path, sizeof(path), dir, sizeof(dir)) || kvmem_mkdir_p(dir))
		goto quiet;
	m = open_memstream(&text, &len);
	if (!m)
		goto quiet;
	fputs(CACHE_MAGIC, m);
	{
		char line[256];

		file_line(line, sizeof(line), f, st);
		fputs(line, m);
	}
	for (size_t i = 0; i < kvmem_st_count(f); i++)
		fprintf(m, "%016" PRIx64 " %" PRIu64 "\n", d[i].hash, d[i].nonfinite);
	if (fflush(m))
		goto drop;
	fprintf(m, "end %016llx\n", (unsigned long long)XXH64(text, len, 0));
	if (fclose(m))
		goto quiet;
	m = NULL;
	snprintf(tmp, sizeof(tmp), "%s.kvmem-tmp-%d", path, (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0)
		goto quiet;
	written = kvmem_write_all(fd, text, len, -1) == 0;
	/* No fsync: a cache torn by a crash fails its check and is redone. */
	if (close(fd) || !written || rename(tmp, path))
		unlink(tmp);
	goto quiet;
drop:
	fclose(m);
quiet:
	free(text);
	kvmem_error_clear();	/* the cache is an optimisation: no error leaks */
}

int kvmem_digest_file(const kvmem_st_file *f, struct kvmem_tensor_digest *out, uint64_t *hashed)
{
	const struct stat *st = kvmem_st_stat(f);
	size_t n = kvmem_st_count(f);
	uint64_t bytes = 0;

	*hashed = 0;
	if (st && cache_load(f, st, out))
		return 0;
	#pragma omp parallel for schedule(dynamic) reduction(+:bytes)
	for (size_t i = 0; i < n; i++) {
		kvmem_digest_tensor(kvmem_st_at(f, i), &out[i]);
		bytes += kvmem_st_at(f, i)->nbytes;
	}
	*hashed = bytes;
	if (st)
		cache_store(f, st, out);
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * Shared by the pager tests: temporary workspace directories, a small random
 * page geometry, and page / index / token contents that are a pure function
 * of (seed, id), so any process can check what another one wrote.
 */
#ifndef KVMEM_TEST_PAGER_FIXTURE_H
#define KVMEM_TEST_PAGER_FIXTURE_H

#include <dirent.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "kernels/kernels.h"
#include "kvmem/pager.h"
#include "helpers/test_model.h"
#include "pager/hostpool.h"

static inline uint64_t fx_mix(uint64_t x)
{
	return kvmem_mix64(x + KVMEM_GOLDEN_GAMMA);
}

/* Bytes that depend on (seed, kind, id) only. */
static inline void fx_fill(void *buf, size_t len, uint64_t seed, uint64_t kind, uint64_t id)
{
	uint64_t s = fx_mix(seed ^ fx_mix(kind * 0x1000003 + id));
	uint8_t *b = buf;

	for (size_t i = 0; i < len; i += 8) {
		uint64_t v = fx_mix(s + i);

		memcpy(b + i, &v, len - i < 8 ? len - i : 8);
	}
}

static inline int32_t fx_token(uint64_t seed, uint64_t pos)
{
	return (int32_t)(fx_mix(seed ^ (pos * 7919 + 13)) % 151936);
}

/* Open a workspace as the pager tests do: a small host pool and stage-out
 * buffer (so eviction and backpressure happen at test sizes), the flags
 * given (KVMEM_PAGER_CREATE, _RDONLY...). NULL on failure, its message
 * printed unless quiet (tests that expect a refusal check it themselves). */
static inline kvmem_pager *fx_open(const char *dir, const kvmem_page_geom *g, uint64_t host_cap,
				   uint64_t stage_bytes, int flags, int quiet)
{
	kvmem_pager_opts o;
	kvmem_pager *p = NULL;

	kvmem_pager_opts_default(&o);
	o.host_cap = host_cap;
	o.stage_bytes = stage_bytes;
	o.flags = flags;
	if (kvmem_pager_open(dir, g, &o, &p) < 0 && !quiet)
		fprintf(stderr, "open %s: %s\n", dir, kvmem_last_error());
	return p;
}

/* A random small geometry; page bytes not always a multiple of 4096. */
static inline kvmem_page_geom fx_geom(uint64_t *rng)
{
	static const uint32_t dims[] = { 16, 24, 32, 64 };
	kvmem_page_geom g = { 0 };

	g.fingerprint = fx_mix(*rng) | 1;
	g.n_layers = test_rng_int(rng, 1, 4);
	g.n_kv_heads = test_rng_int(rng, 1, 2);
	g.n_heads = g.n_kv_heads * test_rng_int(rng, 1, 2);
	g.head_dim = dims[test_rng_int(rng, 0, 3)];
	g.block_tokens = 16 << test_rng_int(rng, 0, 1);
	g.dtype = test_rng_int(rng, 0, 1) ? KVMEM_DTYPE_F32 : KVMEM_DTYPE_BF16;
	g.index_bytes = g.n_layers * g.n_kv_heads * g.head_dim * 4;
	return g;
}

/* Page and index contents of block b. */
static inline void fx_page(const kvmem_page_geom *g, uint64_t seed, uint64_t page, void *buf)
{
	fx_fill(buf, kvmem_page_bytes(g), seed, 1, page);
}

static inline void fx_index(const kvmem_page_geom *g, uint64_t seed, uint64_t block, void *buf)
{
	fx_fill(buf, g->index_bytes, seed, 2, block);
}

/* The partial block after `tokens` tokens (changes with its length). */
static inline void fx_tail(const kvmem_page_geom *g, uint64_t seed, uint64_t tokens, uint32_t l,
			   void *buf)
{
	fx_fill(buf, kvmem_page_bytes(g), seed, 3, tokens * 4096 + l);
}

static inline void fx_tail_index(const kvmem_page_geom *g, uint64_t seed, uint64_t tokens,
				 void *buf)
{
	fx_fill(buf, g->index_bytes, seed, 4, tokens);
}

/* Append tokens [have, have + n) and every block they complete. */
static inline int fx_append(kvmem_pager *p, uint64_t seed, uint64_t n)
{
	const kvmem_page_geom *g = kvmem_pager_geom(p);
	size_t pb = kvmem_page_bytes(g);
	uint8_t *pages = malloc(pb * g->n_layers), *ix = malloc(g->index_bytes + 1);
	const void *layers[64];
	int rc = 0;

	for (uint64_t i = 0; i < n && !rc; i++) {
		uint64_t pos = kvmem_pager_tokens(p);
		int32_t t = fx_token(seed, pos);

		rc = kvmem_pager_append_tokens(p, &t, 1);
		if (rc || (pos + 1) % g->block_tokens)
			continue;
		for (uint32_t l = 0; l < g->n_layers; l++) {
			fx_page(g, seed, kvmem_page_id(g, pos / g->block_tokens, l), pages + l * pb);
			layers[l] = pages + l * pb;
		}
		fx_index(g, seed, pos / g->block_tokens, ix);
		rc = kvmem_pager_append_block(p, pos / g->block_tokens, layers, ix);
	}
	free(pages);
	free(ix);
	return rc;
}

/* Commit with the fixture's partial block and `app` as session state. */
static inline int fx_commit(kvmem_pager *p, uint64_t seed, const void *app, uint32_t len)
{
	const kvmem_page_geom *g = kvmem_pager_geom(p);
	size_t pb = kvmem_page_bytes(g);
	uint64_t tokens = kvmem_pager_tokens(p);
	uint8_t *pages = malloc(pb * g->n_layers), *ix = malloc(g->index_bytes + 1);
	const void *layers[64];
	int rc;

	for (uint32_t l = 0; l < g->n_layers; l++) {
		fx_tail(g, seed, tokens, l, pages + l * pb);
		layers[l] = pages + l * pb;
	}
	fx_tail_index(g, seed, tokens, ix);
	rc = kvmem_pager_commit(p, tokens % g->block_tokens ? layers : NULL, ix, app, len);
	free(pages);
	free(ix);
	return rc;
}

/* Check everything committed/appended reads back as written: tokens, index,
 * every page (through fetch, in batches the pool holds), the tail. Returns
 * the number of mismatches. */
static inline int fx_check(kvmem_pager *p, uint64_t seed, int check_tail)
{
	const kvmem_page_geom *g = kvmem_pager_geom(p);
	size_t pb = kvmem_page_bytes(g);
	uint64_t n = kvmem_pager_tokens(p), blocks = kvmem_pager_blocks(p);
	uint8_t *want = malloc(pb > g->index_bytes ? pb : g->index_bytes + 1);
	uint8_t *got = malloc(pb * g->n_layers + g->index_bytes + 1);
	int32_t *tok = malloc((n + 1) * 4);
	int bad = 0;

	if (kvmem_pager_read_tokens(p, 0, n, tok) < 0)
		bad++;
	for (uint64_t i = 0; i < n && !bad; i++)
		bad += tok[i] != fx_token(seed, i);
	for (uint64_t b = 0; b < blocks; b++) {
		uint32_t cap = kvmem_hostpool_slots(kvmem_pager_hostpool(p));
		uint32_t step = cap < g->n_layers ? cap : g->n_layers;

		if (g->index_bytes) {
			fx_index(g, seed, b, want);
			if (kvmem_pager_read_index(p, b, 1, got) < 0 || memcmp(want, got, g->index_bytes))
				bad++;
		}
		for (uint32_t l0 = 0; l0 < g->n_layers; l0 += step) {
			uint64_t ids[64];
			const void *ptr[64];
			uint32_t k = g->n_layers - l0 < step ? g->n_layers - l0 : step;

			for (uint32_t j = 0; j < k; j++)
				ids[j] = kvmem_page_id(g, b, l0 + j);
			if (kvmem_pager_fetch(p, ids, k, ptr) < 0) {
				bad++;
				continue;
			}
			for (uint32_t j = 0; j < k; j++) {
				fx_page(g, seed, ids[j], want);
				bad += memcmp(want, ptr[j], pb) != 0;
			}
			kvmem_pager_release(p, ids, k);
		}
	}
	if (check_tail && n % g->block_tokens) {
		void *layers[64];

		for (uint32_t l = 0; l < g->n_layers; l++)
			layers[l] = got + l * pb;
		if (kvmem_pager_read_tail(p, layers, got + g->n_layers * pb) !=
		    (int)(n % g->block_tokens)) {
			bad++;
		} else {
			for (uint32_t l = 0; l < g->n_layers; l++) {
				fx_tail(g, seed, n, l, want);
				bad += memcmp(want, got + l * pb, pb) != 0;
			}
			fx_tail_index(g, seed, n, want);
			bad += memcmp(want, got + g->n_layers * pb, g->index_bytes) != 0;
		}
	}
	free(want);
	free(got);
	free(tok);
	return bad;
}

static inline int fx_rm_one(const char *path, const struct stat *sb, int type, struct FTW *f)
{
	return remove(path);
}

static inline void fx_rmtree(const char *dir)
{
	nftw(dir, fx_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh directory under $TMPDIR (default /var/tmp: a disk, not tmpfs). */
static inline char *fx_tmpdir(char *buf, size_t len)
{
	const char *t = getenv("TMPDIR");

	snprintf(buf, len, "%s/kvmem-test.XXXXXX", t && *t ? t : "/var/tmp");
	return mkdtemp(buf);
}

/* Flip one byte of a file at `off`. */
static inline int fx_flip(const char *path, uint64_t off)
{
	FILE *f = fopen(path, "r+b");
	int c;

	if (!f)
		return -1;
	fseeko(f, off, SEEK_SET);
	c = fgetc(f);
	fseeko(f, off, SEEK_SET);
	fputc(c ^ 0x5a, f);
	return fclose(f);
}

/* A digest of everything in a directory (one level): names, types, sizes,
 * regular files' bytes, symbolic links' targets. Equal digests: nothing in
 * it changed. FIFOs are not opened. */
static inline uint64_t fx_dir_digest(const char *dir)
{
	XXH3_state_t *st = XXH3_createState();
	struct dirent **list = NULL;
	int n = scandir(dir, &list, NULL, alphasort);
	uint64_t d;

	XXH3_64bits_reset(st);
	for (int i = 0; i < n; i++) {
		char path[4096], buf[65536];
		struct stat sb;

		snprintf(path, sizeof(path), "%s/%s", dir, list[i]->d_name);
		XXH3_64bits_update(st, list[i]->d_name, strlen(list[i]->d_name) + 1);
		if (lstat(path, &sb) == 0) {
			uint64_t meta[2] = { (uint64_t)sb.st_mode & S_IFMT, (uint64_t)sb.st_size };

			XXH3_64bits_update(st, meta, sizeof(meta));
			if (S_ISREG(sb.st_mode)) {
				FILE *f = fopen(path, "rb");
				size_t got;

				while (f && (got = fread(buf, 1, sizeof(buf), f)) > 0)
					XXH3_64bits_update(st, buf, got);
				if (f)
					fclose(f);
			} else if (S_ISLNK(sb.st_mode)) {
				ssize_t len = readlink(path, buf, sizeof(buf));

				if (len > 0)
					XXH3_64bits_update(st, buf, len);
			}
		}
		free(list[i]);
	}
	free(list);
	d = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	return d;
}

/* Write `len` bytes of `text` to a new file (replacing it); 0 or -1. */
static inline int fx_write_file(const char *path, const void *text, size_t len)
{
	FILE *f = fopen(path, "wb");

	if (!f)
		return -1;
	if (fwrite(text, 1, len, f) != len) {
		fclose(f);
		return -1;
	}
	return fclose(f);
}

#endif

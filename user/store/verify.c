// SPDX-License-Identifier: MIT
/*
 * kvmem_workspace_verify: check every checksum of a workspace — manifest,
 * committed tokens, the checksum file, every page, every index record, the
 * partial block — and name each bad one with its file. Reads only, through
 * the store (a directory or RADOS: user/pager/wstore.h); never repairs;
 * takes no lock (a writer may go on meanwhile). Every size the manifest
 * claims is checked against the stream before a buffer is sized by it.
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
#include "kvmem/store.h"

struct vctx {
	const char *dir;
	struct ws_store *ws;
	FILE *out;
	int verbose;		/* say what is fine too, not only what is bad */
	long bad;
	kvmem_page_geom g;
	size_t pb, stride, L;
	const struct manifest *m;
};

/* Open a data stream for checking; a missing, non-regular or truncated
 * file is one bad item (reported), -1. (The pages of a directory are read
 * with O_DIRECT where the file system takes it: from the disk, not a
 * cache.) */
static int vopen(struct vctx *v, int i, uint64_t need, uint64_t *size)
{
	const char *name = ws_data_files[i];
	int rc;

	if (v->ws->ops->open_stream(v->ws, i) < 0) {
		fprintf(v->out, "%s\n", kvmem_last_error());
		v->bad++;
		return -1;
	}
	if ((rc = v->ws->ops->size(v->ws, i, need, size)) < 0) {
		fprintf(v->out, "%s/%s: %s\n", v->dir, name, strerror(-rc));
		v->bad++;
		return -1;
	}
	if (*size < need) {
		fprintf(v->out, "%s/%s: %lld bytes, the last commit covers %" PRIu64 ": truncated\n",
			v->dir, name, (long long)*size, need);
		v->bad++;
		return -1;
	}
	return 0;
}

static void check_pages(struct vctx *v, const uint64_t *sums)
{
	const struct mf_head *h = &v->m->h;
	size_t ext = v->stride * v->L, per = ext >= (8u << 20) ? 1 : (8u << 20) / ext;
	uint64_t size;
	uint8_t *buf;

	if (vopen(v, WS_PAGES, h->blocks * ext, &size) < 0)
		return;
	/* The file holds every committed block: a buffer of up to 8 MiB or
	 * one extent is bounded by it. */
	if (h->blocks && posix_memalign((void **)&buf, KVMEM_IO_ALIGN, per * ext)) {
		fprintf(v->out, "%s/pages: out of memory\n", v->dir);
		v->bad++;
		return;
	}
	for (uint64_t b = 0; b < h->blocks; b += per) {
		size_t n = h->blocks - b < per ? h->blocks - b : per;
		int rc = v->ws->ops->read(v->ws, WS_PAGES, buf, n * ext, b * ext);

		if (rc < 0) {
			fprintf(v->out, "%s/pages: blocks %" PRIu64 "..%" PRIu64 ": read error: %s\n",
				v->dir, b, b + n - 1, strerror(rc == -ENODATA ? EIO : -rc));
			v->bad += n * v->L;
			continue;
		}
		for (size_t i = 0; i < n * v->L; i++) {
			uint64_t pg = b * v->L + i, blk = pg / v->L;
			uint32_t l = pg % v->L;

			if (XXH3_64bits(buf + i * v->stride, v->pb) != sums[blk * (v->L + 1) + l]) {
				fprintf(v->out, "%s/pages: page %" PRIu64 " (block %" PRIu64
					", layer %u) at offset %" PRIu64 ": checksum mismatch\n",
					v->dir, pg, blk, l, pg * v->stride);
				v->bad++;
			}
		}
	}
	/* An interrupted append, not damage: worth a note, not an error. */
	if (v->verbose && size > h->blocks * ext)
		fprintf(v->out, "%s/pages: %" PRIu64 " bytes past the last commit (ignored)\n",
			v->dir, size - h->blocks * ext);
	if (h->blocks)
		free(buf);
}

static void check_index(struct vctx *v, const uint64_t *sums)
{
	const struct mf_head *h = &v->m->h;
	size_t ib = h->index_bytes;
	uint64_t size;
	uint8_t *buf;

	if (vopen(v, WS_INDEX, h->blocks * ib, &size) < 0 || !h->blocks || !ib)
		return;
	buf = malloc(ib);	/* the file holds blocks * ib bytes */
	for (uint64_t b = 0; buf && b < h->blocks; b++) {
		if (v->ws->ops->read(v->ws, WS_INDEX, buf, ib, b * ib) < 0 ||
		    XXH3_64bits(buf, ib) != sums[b * (v->L + 1) + v->L]) {
			fprintf(v->out, "%s/index: record of block %" PRIu64 " at offset %" PRIu64
				": checksum mismatch\n", v->dir, b, b * ib);
			v->bad++;
		}
	}
	free(buf);
}

static void check_tail(struct vctx *v)
{
	const struct mf_head *h = &v->m->h;
	size_t slot_bytes = v->stride * v->L + round_up(h->index_bytes, KVMEM_IO_ALIGN);
	uint64_t size, off = (uint64_t)h->tail_slot * slot_bytes;
	uint8_t *buf;

	if (!h->tail_tokens)
		return;
	if (vopen(v, WS_TAIL, off + slot_bytes, &size) < 0)
		return;
	buf = malloc(slot_bytes);
	if (buf && v->ws->ops->read(v->ws, WS_TAIL, buf, slot_bytes, off) == 0) {
		for (size_t l = 0; l <= v->L; l++) {
			size_t len = l < v->L ? v->pb : h->index_bytes;

			if (XXH3_64bits(buf + l * v->stride, len) != v->m->tail_sums[l]) {
				fprintf(v->out, "%s/tail: slot %u, %s %zu at offset %" PRIu64
					" (the partial block of %u tokens): checksum mismatch\n", v->dir,
					h->tail_slot, l < v->L ? "layer" : "index", l,
					off + l * v->stride, h->tail_tokens);
				v->bad++;
			}
		}
	} else {
		fprintf(v->out, "%s/tail: cannot read slot %u\n", v->dir, h->tail_slot);
		v->bad++;
	}
	free(buf);
}

/* One pass over the commit the manifest names now; its generation in *gen.
 * Returns the bad items, or -errno when there is no workspace to check. */
static long verify_once(const char *dir, struct ws_store *ws, FILE *out, int verbose, uint64_t *gen)
{
	struct manifest m;
	struct vctx v = { .dir = dir, .ws = ws, .out = out, .verbose = verbose, .m = &m };
	uint64_t size, sum, n_sums, need[WS_N_DATA];
	uint64_t *sums = NULL;
	char name[PATH_MAX + 16];
	int ok, rc;

	rc = mf_read(ws, &m);
	if (rc < 0) {
		fprintf(out, "%s\n", kvmem_last_error());
		return rc;
	}
	*gen = m.h.generation;
	mf_geom(&m, &v.g);
	mf_needs(&m.h, need);
	v.pb = m.h.page_bytes;
	v.stride = m.h.page_stride;
	v.L = m.h.n_layers;

	ok = vopen(&v, WS_TOKENS, need[WS_TOKENS], &size) == 0;
	snprintf(name, sizeof(name), "%s/tokens", dir);
	if (ok && (hash_stream_prefix(ws, WS_TOKENS, need[WS_TOKENS], name, &sum) < 0 ||
		   sum != m.h.tokens_hash)) {
		fprintf(out, "%s/tokens: the committed %" PRIu64 " tokens: checksum mismatch\n",
			dir, m.h.tokens);
		v.bad++;
	}

	/* The sums file is checked to hold them before they are allocated. */
	n_sums = m.h.blocks * (v.L + 1);
	if (vopen(&v, WS_SUMS, need[WS_SUMS], &size) == 0) {
		sums = malloc(n_sums * 8 + 8);
		if (!sums) {
			fprintf(out, "%s/sums: out of memory for %" PRIu64 " checksums\n", dir, n_sums);
			v.bad++;
		} else if (ws->ops->read(ws, WS_SUMS, sums, n_sums * 8, 0) < 0 ||
			   XXH3_64bits(sums, n_sums * 8) != m.h.sums_hash) {
			fprintf(out, "%s/sums: the committed page checksums: checksum mismatch "
				"(pages below may be reported bad because of it)\n", dir);
			v.bad++;
		}
		if (sums) {
			check_pages(&v, sums);
			check_index(&v, sums);
		}
	}
	check_tail(&v);
	if (verbose || v.bad)
		fprintf(out, "%s: %" PRIu64 " tokens, %" PRIu64 " blocks, %" PRIu64
			" pages committed (generation %" PRIu64 "): %s%ld bad\n", dir, m.h.tokens,
			m.h.blocks, m.h.blocks * v.L, m.h.generation, v.bad ? "" : "all good, ",
			v.bad);
	free(sums);
	mf_free(&m);
	return v.bad;
}

/* The generation the manifest names now (UINT64_MAX when unreadable). */
static uint64_t generation_now(struct ws_store *ws)
{
	struct manifest m;
	uint64_t gen;

	if (mf_read(ws, &m) < 0)
		return UINT64_MAX;
	gen = m.h.generation;
	mf_free(&m);
	return gen;
}

long kvmem_workspace_verify(const char *dir, FILE *out, int verbose)
{
	struct ws_store *ws;
	long bad = 0;

	if (ws_store_open(dir, KVMEM_PAGER_RDONLY, &ws) < 0) {
		if (out)
			fprintf(out, "%s\n", kvmem_last_error());
		return kvmem_fail();
	}
	/* A writer may commit while we read: the tail slot the old commit
	 * named can be rewritten two commits later. Damage found during a
	 * pass that a commit overtook is checked again on the new commit, for
	 * as long as commits keep overtaking (up to 10 s: a busy writer on a
	 * loaded machine commits many times during one pass); damage that
	 * stays is reported. */
	const uint64_t t_end = kvmem_now_ns() + 10000000000ull;

	for (;;) {
		char *text = NULL;
		size_t len = 0;
		FILE *mem = open_memstream(&text, &len);
		uint64_t gen = UINT64_MAX;

		if (!mem) {
			if (!out) {
				bad = kvmem_error(ENOMEM, "%s: out of memory for the report", dir);
				break;
			}
			bad = verify_once(dir, ws, out, verbose, &gen);
			break;
		}
		bad = verify_once(dir, ws, mem, verbose, &gen);
		fclose(mem);
		if (bad > 0 && kvmem_now_ns() < t_end && generation_now(ws) != gen) {
			free(text);
			continue;
		}
		if (out)
			fwrite(text, 1, len, out);
		free(text);
		break;
	}
	ws_store_close(ws);
	return bad;
}

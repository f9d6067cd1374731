// SPDX-License-Identifier: MIT
/*
 * Corpus files for tools/train/train.py: a 128-byte header and fixed-length
 * sequences of little-endian ids (layout in user/agentlang/agentlang.h),
 * then, for paged view sequences, their page windows and an index.
 * Sequences are generated in parallel, a chunk at a time; each depends only
 * on (seed, index), so the file is the same whatever the thread count.
 */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "agentlang/lang.h"

#define CHUNK_SEQS 512

static void put16(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
	put16(p, v);
	put16(p + 2, v >> 16);
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)v);
	put32(p + 4, (uint32_t)(v >> 32));
}

static uint32_t get16(const uint8_t *p)
{
	return p[0] | (uint32_t)p[1] << 8;
}

static uint32_t get32(const uint8_t *p)
{
	return get16(p) | get16(p + 2) << 16;
}

static uint64_t get64(const uint8_t *p)
{
	return get32(p) | (uint64_t)get32(p + 4) << 32;
}

static void header_bytes(uint8_t *h, const agentlang_corpus_opts *o, uint64_t n_seqs, int idb)
{
	memset(h, 0, AGENTLANG_CORPUS_HEADER);
	memcpy(h, AGENTLANG_CORPUS_MAGIC, 8);
	put32(h + 8, 4);
	put32(h + 12, AGENTLANG_CORPUS_HEADER);
	put32(h + 16, (uint32_t)agentlang_vocab_size());
	put32(h + 20, (uint32_t)o->seq_len);
	put64(h + 24, n_seqs);
	put64(h + 32, o->seed);
	put32(h + 40, (uint32_t)idb);
	put16(h + 44, AGENTLANG_PAD);
	put16(h + 46, AGENTLANG_BOS);
	put16(h + 48, AGENTLANG_EOS);
	put16(h + 50, AGENTLANG_Q);
	put16(h + 52, AGENTLANG_A);
	put16(h + 54, AGENTLANG_END);
	put32(h + 56, (uint32_t)(o->view_share * 1000.0 + 0.5));
	put32(h + 60, agentlang_vocab_hash());
	if (o->view.policy)
		memcpy(h + 64, o->view.policy, strlen(o->view.policy));
	put32(h + 96, (uint32_t)(o->view.max_ratio ? o->view.max_ratio : 16));
	put32(h + 100, (uint32_t)(o->view.stale * 1000.0 + 0.5));
	put32(h + 104, (uint32_t)(o->view.drop * 1000.0 + 0.5));
	put32(h + 108, (uint32_t)(o->view.paged * 1000.0 + 0.5));
	put32(h + 112, o->view.paged > 0 ? (uint32_t)(o->view.window ? o->view.window : o->seq_len) : 0);
	put32(h + 128, o->view.paged > 0 ? (uint32_t)(o->view.whole * 1000.0 + 0.5) : 0);
	put32(h + 132, o->view.paged > 0 && o->view.whole > 0 ?
		       (uint32_t)(o->view.whole_min_ratio ? o->view.whole_min_ratio : 16) : 0);
	put32(h + 140, (uint32_t)o->view.lookalikes);	/* 0: drawn a sequence */
	/* 116: paged sequences, 120: the index's offset, 136: whole ones;
	 * patched at the end. */
}

/* Generate sequences [s0, s0 + n) into ids (and pages, when paged views
 * are asked for); 0 or -1 with the first error. */
static int gen_chunk(const agentlang_corpus_opts *o, uint64_t s0, int n, int32_t *ids,
		     agentlang_pages *pages, char *err, size_t errlen)
{
	int failed = 0;

#pragma omp parallel for schedule(dynamic, 4) num_threads(o->threads > 0 ? o->threads : omp_get_max_threads())
	for (int i = 0; i < n; i++) {
		if (failed)
			continue;
		if (agentlang_train_seq_paged(o->seed, s0 + (uint64_t)i, o->seq_len, o->view_share,
					      &o->view, ids + (size_t)i * o->seq_len, NULL,
					      pages ? &pages[i] : NULL)) {
#pragma omp critical
			{
				if (!failed)
					snprintf(err, errlen, "%s", kvmem_last_error());
				failed = 1;
			}
		}
	}
	return failed ? -1 : 0;
}

static int write_all(FILE *f, const void *p, size_t n, const char *path)
{
	if (fwrite(p, 1, n, f) != n)
		return kvmem_error(errno, "%s: write failed: %s", path, strerror(errno));
	return 0;
}

/* One paged sequence's record (agentlang.h); 0 or -errno. */
static int write_record(FILE *f, const agentlang_pages *pg, const char *path)
{
	size_t nv = (size_t)pg->n_view, nw = (size_t)pg->n_windows, W = (size_t)pg->window;
	size_t nve = (nv + 1) / 2 * 2;	/* each u16 array padded to keep 4-byte alignment */
	size_t nq = (size_t)pg->n_q;
	size_t size = 32 + 4 * nq + 8 * nw + 4 * nve + 2 * nw * W;
	uint8_t *b = calloc(1, size), *p = b;
	int rc;

	if (!b)
		return kvmem_error(ENOMEM, "%s: out of memory for a page record", path);
	put32(p, (uint32_t)nv);
	put32(p + 4, (uint32_t)nw);
	put32(p + 8, pg->ws_tokens > UINT32_MAX ? UINT32_MAX : (uint32_t)pg->ws_tokens);
	put32(p + 12, (uint32_t)W);
	put32(p + 16, pg->whole ? 1 : 0);
	put32(p + 20, (uint32_t)nq);
	p += 32;
	for (size_t i = 0; i < nq; i++)
		put32(p + 4 * i, (uint32_t)pg->needle[i]);
	p += 4 * nq;
	for (size_t w = 0; w < nw; w++) {
		put32(p + 4 * w, (uint32_t)pg->win_start[w]);
		put32(p + 4 * (nw + w), (uint32_t)pg->win_end[w]);
	}
	p += 8 * nw;
	for (size_t i = 0; i < nv; i++) {
		put16(p + 2 * i, pg->win[i]);
		put16(p + 2 * (nve + i), pg->off[i]);
	}
	p += 4 * nve;
	for (size_t i = 0; i < nw * W; i++)
		put16(p + 2 * i, (uint32_t)pg->ids[i]);
	rc = write_all(f, b, size, path);
	free(b);
	return rc;
}

int agentlang_corpus_write(const char *path, const agentlang_corpus_opts *o)
{
	int idb = o->id_bytes ? o->id_bytes : 2;
	uint8_t h[AGENTLANG_CORPUS_HEADER];
	char err[1024] = "";
	int rc = 0;

	if (o->seq_len < 256 || o->seq_len > (1 << 20))
		return kvmem_error(EINVAL, "%s: sequence length %d: need 256 .. 2^20", path, o->seq_len);
	if (o->n_tokens <= 0)
		return kvmem_error(EINVAL, "%s: corpus of %lld tokens", path, (long long)o->n_tokens);
	if (idb != 2 && idb != 4)
		return kvmem_error(EINVAL, "%s: ids of %d bytes: need 2 or 4", path, idb);
	if (!(o->view_share >= 0 && o->view_share <= 1))
		return kvmem_error(EINVAL, "%s: view share %g is not in 0..1", path, o->view_share);
	if (!(o->view.stale >= 0 && o->view.stale <= 1) || !(o->view.drop >= 0 && o->view.drop <= 1))
		return kvmem_error(EINVAL, "%s: stale %g / drop %g: chances in 0..1", path, o->view.stale,
				   o->view.drop);
	if (o->view.policy && strlen(o->view.policy) >= AGENTLANG_CORPUS_POLICY)
		return kvmem_error(EINVAL, "%s: view policy name '%s' is longer than %d bytes", path,
				   o->view.policy, AGENTLANG_CORPUS_POLICY - 1);
	/* An unknown policy, or one that needs a model, fails here and not in
	 * the middle of the file. */
	if (o->view.policy && o->view.policy[0] && agentlang_view_policy_check(o->view.policy))
		return kvmem_error_prefix("%s", path);

	const int paged = o->view.paged > 0;

	if (!(o->view.paged >= 0 && o->view.paged <= 1))
		return kvmem_error(EINVAL, "%s: paged share %g is not in 0..1", path, o->view.paged);
	if (!(o->view.whole >= 0 && o->view.whole <= 1) || o->view.whole_min_ratio < 0)
		return kvmem_error(EINVAL, "%s: whole share %g / min ratio %d: a chance in 0..1, a "
				   "ratio >= 0", path, o->view.whole, o->view.whole_min_ratio);
	if (o->view.lookalikes < 0 || o->view.lookalikes > 16)
		return kvmem_error(EINVAL, "%s: %d look-alike lines a needle: 1..16, or 0 to draw "
				   "them a sequence", path, o->view.lookalikes);
	if (paged && (!o->view.policy || !o->view.policy[0] || idb != 2))
		return kvmem_error(EINVAL, "%s: paged view sequences need a view policy and 2-byte ids",
				   path);

	uint64_t n_seqs = ((uint64_t)o->n_tokens + (uint64_t)o->seq_len - 1) / (uint64_t)o->seq_len;
	int chunk = n_seqs < CHUNK_SEQS ? (int)n_seqs : CHUNK_SEQS;
	int32_t *ids = malloc((size_t)chunk * o->seq_len * sizeof(*ids));
	uint8_t *bytes = malloc((size_t)chunk * o->seq_len * (size_t)idb);
	agentlang_pages *pages = paged ? calloc((size_t)chunk, sizeof(*pages)) : NULL;
	uint8_t *index = NULL;
	uint64_t n_paged = 0, n_whole = 0, index_cap = 0;
	/* The ids of every sequence first, the page records after them: a
	 * chunk's ids are written in their place, its records at rec_at. */
	off_t rec_at = (off_t)AGENTLANG_CORPUS_HEADER + (off_t)(n_seqs * (uint64_t)o->seq_len * (uint64_t)idb);
	FILE *f = fopen(path, "wb");

	if (!ids || !bytes || !f || (paged && !pages)) {
		rc = !f ? kvmem_error(errno, "%s: cannot create: %s", path, strerror(errno))
			: kvmem_error(ENOMEM, "%s: out of memory for %d sequences", path, chunk);
		goto out;
	}
	header_bytes(h, o, n_seqs, idb);
	if ((rc = write_all(f, h, sizeof(h), path)))
		goto out;
	for (uint64_t s0 = 0; s0 < n_seqs; s0 += (uint64_t)chunk) {
		int n = n_seqs - s0 < (uint64_t)chunk ? (int)(n_seqs - s0) : chunk;
		size_t cnt = (size_t)n * o->seq_len;

		if (gen_chunk(o, s0, n, ids, pages, err, sizeof(err))) {
			rc = kvmem_error(EINVAL, "%s: sequence generation failed: %s", path, err);
			goto out;
		}
		for (size_t i = 0; i < cnt; i++)
			idb == 2 ? put16(bytes + 2 * i, (uint32_t)ids[i])
				 : put32(bytes + 4 * i, (uint32_t)ids[i]);
		if (paged && fseeko(f, (off_t)AGENTLANG_CORPUS_HEADER +
				     (off_t)(s0 * (uint64_t)o->seq_len * (uint64_t)idb), SEEK_SET))
			rc = kvmem_error(errno, "%s: seek failed: %s", path, strerror(errno));
		if (rc || (rc = write_all(f, bytes, cnt * (size_t)idb, path)))
			goto out;
		for (int i = 0; paged && i < n; i++) {
			if (!pages[i].n_view)
				continue;
			if (n_paged == index_cap) {
				uint8_t *t = realloc(index, (size_t)(index_cap = index_cap * 2 + 256) * 16);

				if (!t) {
					rc = kvmem_error(ENOMEM, "%s: out of memory for the paged index", path);
					goto out;
				}
				index = t;
			}
			put64(index + 16 * n_paged, s0 + (uint64_t)i);
			put64(index + 16 * n_paged + 8, (uint64_t)rec_at);
			n_paged++;
			n_whole += pages[i].whole;
			if (fseeko(f, rec_at, SEEK_SET))
				rc = kvmem_error(errno, "%s: seek failed: %s", path, strerror(errno));
			if (rc || (rc = write_record(f, &pages[i], path)))
				goto out;
			rec_at = ftello(f);
		}
		for (int i = 0; paged && i < n; i++)
			agentlang_pages_free(&pages[i]);
		if (o->progress)
			o->progress((int64_t)((s0 + (uint64_t)n) * (uint64_t)o->seq_len),
				    (int64_t)(n_seqs * (uint64_t)o->seq_len), o->arg);
	}
	if (paged) {
		/* The index after the last record, then the header's pointer to it. */
		uint8_t tail[12];

		uint8_t whole[4];

		put32(tail, (uint32_t)n_paged);
		put64(tail + 4, n_paged ? (uint64_t)rec_at : 0);
		put32(whole, (uint32_t)n_whole);
		if (fseeko(f, rec_at, SEEK_SET) || (n_paged && fwrite(index, 16, n_paged, f) != n_paged) ||
		    fseeko(f, 116, SEEK_SET) || fwrite(tail, 1, 12, f) != 12 ||
		    fseeko(f, 136, SEEK_SET) || fwrite(whole, 1, 4, f) != 4)
			rc = kvmem_error(errno ? errno : EIO, "%s: writing the paged index failed: %s",
					 path, strerror(errno));
	}
out:
	if (f && fclose(f) && !rc)
		rc = kvmem_error(errno, "%s: close failed: %s", path, strerror(errno));
	if (rc && f)
		unlink(path);
	for (int i = 0; pages && i < chunk; i++)
		agentlang_pages_free(&pages[i]);
	free(pages);
	free(index);
	free(ids);
	free(bytes);
	return rc;
}

int agentlang_corpus_read_header(const char *path, agentlang_corpus_header *hd)
{
	uint8_t h[AGENTLANG_CORPUS_HEADER];
	FILE *f = fopen(path, "rb");

	if (!f)
		return kvmem_error(errno, "%s: cannot open: %s", path, strerror(errno));
	size_t got = fread(h, 1, sizeof(h), f);
	fclose(f);
	/* A version-1 file of one tiny sequence may be shorter than 128 bytes. */
	if (got < AGENTLANG_CORPUS_HEADER_V1)
		return kvmem_error(EINVAL, "%s: shorter than the %d-byte corpus header", path,
				 AGENTLANG_CORPUS_HEADER_V1);
	if (memcmp(h, AGENTLANG_CORPUS_MAGIC, 8))
		return kvmem_error(EINVAL, "%s: not a kvmem synth corpus (bad magic)", path);
	memset(hd, 0, sizeof(*hd));
	hd->version = get32(h + 8);
	hd->header_bytes = get32(h + 12);
	if (!(hd->version == 1 && hd->header_bytes == AGENTLANG_CORPUS_HEADER_V1) &&
	    !((hd->version == 2 || hd->version == 3) && hd->header_bytes == AGENTLANG_CORPUS_HEADER_V3) &&
	    !(hd->version == 4 && hd->header_bytes == AGENTLANG_CORPUS_HEADER))
		return kvmem_error(EINVAL, "%s: corpus version %u / header %u: this kvmem reads "
				 "1 / %d, 2 / %d, 3 / %d and 4 / %d", path, hd->version,
				 hd->header_bytes, AGENTLANG_CORPUS_HEADER_V1, AGENTLANG_CORPUS_HEADER_V3,
				 AGENTLANG_CORPUS_HEADER_V3, AGENTLANG_CORPUS_HEADER);
	if (got < hd->header_bytes)
		return kvmem_error(EINVAL, "%s: shorter than its %u-byte corpus header", path,
				 hd->header_bytes);
	hd->vocab = get32(h + 16);
	hd->seq_len = get32(h + 20);
	hd->n_seqs = get64(h + 24);
	hd->seed = get64(h + 32);
	hd->id_bytes = get32(h + 40);
	hd->pad = (uint16_t)get16(h + 44);
	hd->bos = (uint16_t)get16(h + 46);
	hd->eos = (uint16_t)get16(h + 48);
	hd->q = (uint16_t)get16(h + 50);
	hd->a = (uint16_t)get16(h + 52);
	hd->end = (uint16_t)get16(h + 54);
	hd->view_permille = get32(h + 56);
	hd->vocab_hash = get32(h + 60);
	hd->max_ratio = 16;
	if (hd->version >= 2) {
		memcpy(hd->view_policy, h + 64, AGENTLANG_CORPUS_POLICY);
		hd->view_policy[AGENTLANG_CORPUS_POLICY - 1] = 0;
		hd->max_ratio = get32(h + 96);
		hd->stale_permille = get32(h + 100);
		hd->drop_permille = get32(h + 104);
	}
	if (hd->version >= 3) {
		hd->paged_permille = get32(h + 108);
		hd->window = get32(h + 112);
		hd->n_paged = get32(h + 116);
		hd->paged_index = get64(h + 120);
	}
	if (hd->version >= 4) {
		hd->whole_permille = get32(h + 128);
		hd->whole_min_ratio = get32(h + 132);
		hd->n_whole = get32(h + 136);
		hd->lookalikes = get32(h + 140);	/* zero in files before it */
	}
	return 0;
}

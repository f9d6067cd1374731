// SPDX-License-Identifier: MIT
/*
 * Corpus files for tools/train/train.py: a 128-byte header and fixed-length
 * sequences of little-endian ids (layout in user/agentlang/agentlang.h).
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
	put32(h + 8, 2);
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
}

/* Generate sequences [s0, s0 + n) into ids; 0 or -1 with the first error. */
static int gen_chunk(const agentlang_corpus_opts *o, uint64_t s0, int n, int32_t *ids,
		     char *err, size_t errlen)
{
	int failed = 0;

#pragma omp parallel for schedule(dynamic, 4) num_threads(o->threads > 0 ? o->threads : omp_get_max_threads())
	for (int i = 0; i < n; i++) {
		if (failed)
			continue;
		if (agentlang_train_seq_opts(o->seed, s0 + (uint64_t)i, o->seq_len, o->view_share,
					    &o->view, ids + (size_t)i * o->seq_len, NULL)) {
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

	uint64_t n_seqs = ((uint64_t)o->n_tokens + (uint64_t)o->seq_len - 1) / (uint64_t)o->seq_len;
	int chunk = n_seqs < CHUNK_SEQS ? (int)n_seqs : CHUNK_SEQS;
	int32_t *ids = malloc((size_t)chunk * o->seq_len * sizeof(*ids));
	uint8_t *bytes = malloc((size_t)chunk * o->seq_len * (size_t)idb);
	FILE *f = fopen(path, "wb");

	if (!ids || !bytes || !f) {
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

		if (gen_chunk(o, s0, n, ids, err, sizeof(err))) {
			rc = kvmem_error(EINVAL, "%s: sequence generation failed: %s", path, err);
			goto out;
		}
		for (size_t i = 0; i < cnt; i++)
			idb == 2 ? put16(bytes + 2 * i, (uint32_t)ids[i])
				 : put32(bytes + 4 * i, (uint32_t)ids[i]);
		if ((rc = write_all(f, bytes, cnt * (size_t)idb, path)))
			goto out;
		if (o->progress)
			o->progress((int64_t)((s0 + (uint64_t)n) * (uint64_t)o->seq_len),
				    (int64_t)(n_seqs * (uint64_t)o->seq_len), o->arg);
	}
out:
	if (f && fclose(f) && !rc)
		rc = kvmem_error(errno, "%s: close failed: %s", path, strerror(errno));
	if (rc && f)
		unlink(path);
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
	if (got < AGENTLANG_CORPUS_HEADER_V1 ||
	    (got < sizeof(h) && get32(h + 8) != 1))
		return kvmem_error(EINVAL, "%s: shorter than the %d-byte corpus header", path,
				 got < AGENTLANG_CORPUS_HEADER_V1 ? AGENTLANG_CORPUS_HEADER_V1
								  : AGENTLANG_CORPUS_HEADER);
	if (memcmp(h, AGENTLANG_CORPUS_MAGIC, 8))
		return kvmem_error(EINVAL, "%s: not a kvmem synth corpus (bad magic)", path);
	memset(hd, 0, sizeof(*hd));
	hd->version = get32(h + 8);
	hd->header_bytes = get32(h + 12);
	if (!(hd->version == 1 && hd->header_bytes == AGENTLANG_CORPUS_HEADER_V1) &&
	    !(hd->version == 2 && hd->header_bytes == AGENTLANG_CORPUS_HEADER))
		return kvmem_error(EINVAL, "%s: corpus version %u / header %u: this kvmem reads "
				 "1 / %d and 2 / %d", path, hd->version, hd->header_bytes,
				 AGENTLANG_CORPUS_HEADER_V1, AGENTLANG_CORPUS_HEADER);
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
	if (hd->version == 2) {
		memcpy(hd->view_policy, h + 64, AGENTLANG_CORPUS_POLICY);
		hd->view_policy[AGENTLANG_CORPUS_POLICY - 1] = 0;
		hd->max_ratio = get32(h + 96);
		hd->stale_permille = get32(h + 100);
		hd->drop_permille = get32(h + 104);
	}
	return 0;
}

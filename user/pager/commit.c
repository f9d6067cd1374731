// SPDX-License-Identifier: MIT
/*
 * Commit: the crash rule. The committed count in the manifest advances only
 * after everything it covers is durable: stage-out writes complete, the
 * partial block written to the tail slot the current manifest does not use,
 * then every data stream made durable (a directory: fdatasync of each file),
 * then the manifest replaced atomically (the store's sync and mf_replace;
 * a directory's go through durable.c, so tests can watch the order and fail
 * one).
 * A crash at any point leaves the previous manifest, whose data is intact
 * (appends never overwrite committed bytes; the current tail slot is never
 * rewritten).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pager/pager_int.h"
#include "pager/probes.h"
#include "util/fs.h"

static int write_tail(kvmem_pager *p, uint32_t slot, const void *const *layers,
		      const void *index, uint64_t *sums)
{
	size_t L = p->g.n_layers, ib = p->g.index_bytes;
	uint8_t *buf = calloc(1, p->tail_slot_bytes);
	uint64_t off = (uint64_t)slot * p->tail_slot_bytes;
	size_t len = p->tail_slot_bytes;
	int rc;

	if (!buf)
		return kvmem_error(ENOMEM, "%s/tail: out of memory", p->dir);
	for (size_t l = 0; l < L; l++) {
		memcpy(buf + l * p->page_stride, layers[l], p->page_bytes);
		sums[l] = XXH3_64bits(buf + l * p->page_stride, p->page_bytes);
	}
	if (ib)
		memcpy(buf + L * p->page_stride, index, ib);
	sums[L] = XXH3_64bits(buf + L * p->page_stride, ib);
	if ((rc = p->ws->ops->write(p->ws, WS_TAIL, buf, len, off)) < 0) {
		free(buf);
		return kvmem_error(-rc, "%s/tail: cannot write slot %u: %s", p->dir, slot,
				   strerror(-rc));
	}
	free(buf);
	return 0;
}

static int commit(kvmem_pager *p, const void *const *tail_layers, const void *tail_index,
		  const void *app, uint32_t app_len)
{
	uint64_t t0 = kvmem_now_ns(), B = p->g.block_tokens, tokens = p->n_tokens;
	uint32_t tail = tokens % B, slot = p->m.h.tail_slot;
	struct manifest m2;

	if (p->rdonly)
		return kvmem_error(EINVAL, "%s: opened read-only", p->dir);
	if (p->n_blocks != tokens / B)
		return kvmem_error(EINVAL, "%s: commit of %" PRIu64 " tokens needs %" PRIu64
				 " full blocks, %" PRIu64 " were appended", p->dir, tokens,
				 tokens / B, p->n_blocks);
	if (tail && !tail_layers)
		return kvmem_error(EINVAL, "%s: commit of %" PRIu64 " tokens needs the partial block of %u "
				 "tokens", p->dir, tokens, tail);
	if (tail && p->g.index_bytes && !tail_index)
		return kvmem_error(EINVAL, "%s: commit needs the partial block's index record", p->dir);
	if (app_len > KVMEM_PAGER_APP_MAX)
		return kvmem_error(EINVAL, "%s: %u bytes of session state, at most %u", p->dir, app_len,
				 KVMEM_PAGER_APP_MAX);
	if (store_begin_write(p) < 0 || stage_drain(p) < 0)
		return kvmem_fail();
	if (p->write_failed)
		return kvmem_error(p->write_errno, "%s: cannot commit: %s; the workspace stays at its "
				 "last commit (%" PRIu64 " tokens)", p->dir, p->write_err,
				 p->m.h.tokens);

	memset(&m2, 0, sizeof(m2));
	m2.h = p->m.h;
	m2.tail_sums = calloc(p->g.n_layers + 1, 8);
	m2.app = malloc(app_len ? app_len : 1);
	if (!m2.tail_sums || !m2.app) {
		mf_free(&m2);
		return kvmem_error(ENOMEM, "%s: out of memory", p->dir);
	}
	if (app_len)
		memcpy(m2.app, app, app_len);
	if (tail) {
		/* Never the slot the current manifest points to. */
		slot = 1 - p->m.h.tail_slot;
		if (write_tail(p, slot, tail_layers, tail_index, m2.tail_sums) < 0)
			goto fail;
	}
	/* Every data stream, before the manifest that covers them is written. */
	if (p->ws->ops->sync(p->ws) < 0)
		goto fail;
	m2.h.generation++;
	m2.h.tokens = tokens;
	m2.h.blocks = p->n_blocks;
	m2.h.tokens_hash = XXH3_64bits_digest(p->tok_hash);
	m2.h.sums_hash = XXH3_64bits_digest(p->sums_hash);
	m2.h.tail_slot = slot;
	m2.h.tail_tokens = tail;
	m2.h.app_bytes = app_len;
	if (mf_write(p->ws, &m2, p->m.h.generation) < 0)
		goto fail;
	mf_free(&p->m);
	p->m = m2;
	t0 = kvmem_now_ns() - t0;	/* one figure for the counter and the probe */
	p->st.commits++;
	p->st.commit_ns += t0;
	PROBE_COMMIT(tokens, p->n_blocks, t0);
	stats_save(p);
	return 0;
fail:
	/* After a failed write or fdatasync nothing later can be trusted to be
	 * durable: refuse commits from now on, keep serving from memory. */
	mf_free(&m2);
	pager_fail_write(p, kvmem_last_errno(), "%s", kvmem_last_error());
	return kvmem_error(p->write_errno, "%s; the workspace stays at its last commit (%" PRIu64
			 " tokens)", p->write_err, p->m.h.tokens);
}

int kvmem_pager_commit(kvmem_pager *p, const void *const *tail_layers, const void *tail_index,
		     const void *app, uint32_t app_len)
{
	int rc;

	pager_lock(p);
	rc = commit(p, tail_layers, tail_index, app, app_len);
	pager_unlock(p);
	return rc;
}

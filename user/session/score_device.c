// SPDX-License-Identifier: MIT
/*
 * Selection scoring on the backend's device (kvmem_backend_ops.score).
 *
 * At a large workspace the host's share of a step is scoring: every
 * block's summaries, per layer and KV head, read once per selection (8192
 * blocks x 4 layers x 8 heads of fp32 Mean-K is 134 MB). A backend with
 * its own memory keeps a copy of the index there (the mirror), brought up
 * to date with the blocks appended since the last selection, and runs the
 * twins of the host scorers on it; only the group queries go up and the
 * block scores come down. The policy decides what to score (it calls
 * ws_device_score in score.c); this file only connects it to the backend.
 * The first refusal (no room under the index's share of device memory)
 * turns the device off for the session, so its selections do not switch
 * back and forth between the two.
 */
#include <errno.h>

#include "kvmem/kvmem.h"
#include "session/session_int.h"

static int session_score(void *arg, const char *scorer, const float *gq,
			 const kvmem_score_geom *g, float *scores)
{
	kvmem_session *s = arg;
	const kvmem_backend_ops *ops = s->be->ops;
	int rc;

	if (s->mirror_off)
		return -ENOTSUP;
	if (!s->mirror && (rc = ops->mirror_create(s->be->ctx, &s->mirror)) < 0) {
		s->mirror_off = 1;
		return rc == -ENOTSUP ? rc : kvmem_error_prefix("session: the index on the device");
	}
	const kvmem_index *ix = &s->index;
	const kvmem_score_input in = {
		.meank = ix->meank,
		.sub = (ix->sums & KVMEM_SUM_SUBBLOCK) ? ix->sub : NULL,
		.n_blocks = ix->n_blocks,
		.cap_blocks = ix->cap_blocks,
		.n_layers = ix->n_layers,
		.n_kv_heads = ix->n_kv_heads,
		.head_dim = ix->head_dim,
	};

	rc = ops->score(s->be->ctx, s->mirror, scorer, &in, gq, g, scores);
	if (rc == 0)
		s->st.device_scored++;
	else if (rc == -ENOTSUP && !ops->mirror_bytes(s->be->ctx, s->mirror))
		s->mirror_off = 1;	/* no room: the mirror gave its memory back */
	return rc;
}

const kvmem_score_device *ws_score_device(kvmem_session *s, kvmem_score_device *dev)
{
	const kvmem_backend_ops *ops = s->be->ops;

	if (s->o.host_scoring || s->mirror_off || !ops->score || !ops->mirror_create ||
	    !ops->mirror_destroy || !ops->mirror_bytes)
		return NULL;
	*dev = (kvmem_score_device){ .score = session_score, .arg = s };
	return dev;
}

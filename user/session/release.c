// SPDX-License-Identifier: MIT
/*
 * An idle session gives its view up and lays it out again later from its
 * pages (kvmem serve's idle conversations, issue #24 and #26).
 *
 * What goes: the view on the backend (K, V and the raw K kept beside it:
 * fp32 on the cpu backend, 9 KiB a token for the embedded model; device
 * memory on a GPU), the writer thread with its second set of row buffers,
 * and the session's own row and query buffers of one forward pass. What
 * stays: everything a step needs to know where the view was, the plan in
 * force, sel_tokens and view_len, the index, the query ring, the last
 * logits and the random state; the pages stay where the page source keeps
 * them (a host pool, the workspace on disk).
 *
 * kvmem_session_idle is the lighter rest: the writer and the row buffers
 * go, the view stays; ws_run_begin (and select ahead) take the buffers
 * again before a forward pass writes rows.
 *
 * Laying it out again is ws_view_restore, the rebuild a restored session
 * state makes (kvmem_session_adopt_state): every slot from the pages, K
 * rotated from raw K at the very slot it had, V copied, the tail too. The
 * engine computed the view's K from the same raw K at the same slot with
 * the same rotation, so the session goes on bit for bit as one that never
 * gave its view up (tests/unit/test_ws_release.c); no token is run through
 * the model again.
 */
#include <errno.h>
#include <stdlib.h>

#include "kvmem/kvmem.h"
#include "session/session_int.h"

/* A fresh empty view, keeping raw K beside it as kvmem_session_create
 * asked (a backend that no longer can places from pages: the same bits). */
static int new_view(kvmem_session *s)
{
	const kvmem_backend_ops *ops = s->be->ops;

	if (ops->view_create(s->be->ctx, &s->view)) {
		s->view = NULL;
		return kvmem_fail();
	}
	if (s->move_ok && ops->keep_raw(s->be->ctx, s->view))
		s->move_ok = 0;
	return 0;
}

int kvmem_session_release_view(kvmem_session *s)
{
	if (s->released)
		return 0;
	/* The last logits stay with the session (a batched step may have
	 * left them beside the view). */
	if (ws_usable(s) || ws_writer_wait(s) || ws_logits_host(s))
		return kvmem_fail();
	ws_writer_free(s);
	ws_scratch_free(s);
	s->be->ops->view_destroy(s->be->ctx, s->view);
	s->view = NULL;
	s->released = 1;
	if (new_view(s)) {
		s->broken = 1;
		return kvmem_error_prefix("session: giving the view up");
	}
	return 0;
}

int kvmem_session_idle(kvmem_session *s)
{
	if (s->broken)
		return kvmem_error(EINVAL, "session: unusable after an earlier failure (see the first error)");
	if (s->stepping)
		return 0;	/* its selection's layout still needs them */
	if (ws_writer_wait(s))
		return kvmem_fail();
	ws_writer_free(s);
	ws_scratch_free(s);	/* ws_run_begin takes them again */
	return 0;
}

int kvmem_session_restore_view_step(kvmem_session *s, int layers)
{
	int rc;

	if (!s->released)
		return 0;
	if (s->broken)
		return kvmem_error(EINVAL, "session: unusable after an earlier failure (see the first error)");
	if (layers < 1)
		return kvmem_error(EINVAL, "session: laying the view out %d layers at a time", layers);
	/* An adopted history's index first, a group of blocks a call. */
	if (s->adopting) {
		if (ws_adopt_history_step(s, 1) < 0)
			return kvmem_error_prefix("session: taking the adopted history in");
		return 1;
	}
	if (s->restore_next == 0 && ws_scratch_alloc(s))
		return kvmem_fail();
	/* A failure here leaves a half-built view: the session is broken
	 * (its pages and state stay; a reopened workspace goes on). */
	rc = ws_view_restore_layers(s, &s->restore_next, layers);
	if (rc < 0) {
		s->broken = 1;
		return kvmem_error_prefix("session: laying the view out again");
	}
	if (rc)
		return 1;
	s->restore_next = 0;
	s->released = 0;
	return 0;
}

int kvmem_session_restore_view(kvmem_session *s)
{
	int rc;

	while ((rc = kvmem_session_restore_view_step(s, s->cfg.n_layers)) == 1)
		;
	return rc;
}

int kvmem_session_view_released(const kvmem_session *s)
{
	return s->released;
}

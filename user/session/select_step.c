// SPDX-License-Identifier: MIT
/*
 * A step-boundary selection laid out over several calls (issue #26): the
 * scoring, the plan and the moves in the first, then `layers` layers of
 * placements a call, the plan put in force by the last. kvmem serve runs
 * one conversation's selection a slice a round, the others' decode between
 * the slices, as it lays out a view that was given up (release.c).
 *
 * The result is kvmem_session_select's, bit for bit: the moves all come
 * first in both (every one reads the view as it was), and a placement
 * writes its slots from the page source's raw K and V whatever the order
 * of the layers (tests/unit/test_ws_release.c).
 */
#include <errno.h>

#include "kvmem/kvmem.h"
#include "session/session_int.h"

int kvmem_session_select_step(kvmem_session *s, int layers)
{
	const int L = s->cfg.n_layers;
	int rc, end;

	if (layers < 1)
		return kvmem_error(EINVAL, "session: a selection laid out %d layers at a time", layers);
	if (!s->stepping) {
		if (ws_usable(s))
			return kvmem_fail();
		rc = ws_select_begin(s, 0, NULL, 0, &s->step_plan);
		if (rc)
			return rc > 0 ? 0 : kvmem_fail();	/* no blocks: nothing to select */
		s->stepping = 1;
		s->step_next = 0;
	}
	end = s->step_next + layers < L ? s->step_next + layers : L;
	if (ws_select_layers(s, &s->step_plan, s->step_next, end)) {
		s->stepping = 0;	/* broken, the plan freed */
		return kvmem_fail();
	}
	s->step_next = end;
	if (end < L)
		return 1;
	s->stepping = 0;
	return ws_select_end(s, &s->step_plan, 0);
}

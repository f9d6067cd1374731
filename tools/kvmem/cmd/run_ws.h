/* SPDX-License-Identifier: MIT */
/*
 * `kvmem run --workspace DIR`: the agent session's history in a workspace
 * directory (run_ws.c over kvmem/store.h), with the warnings a person should
 * see and the tier counters at the end.
 */
#ifndef KVMEM_TOOLS_RUN_WS_H
#define KVMEM_TOOLS_RUN_WS_H

#include <stdint.h>
#include <stdio.h>

#include "kvmem/model.h"
#include "kvmem/session.h"
#include "kvmem/store.h"

/* The run's workspace; zeroed: none (every call below then does nothing). */
struct run_ws {
	kvmem_workspace *w;
	int state_warned;	/* the "fresh selection on reopen" warning was given */
};

/* Open (or create) dir for model m (wo: block, host pool, policy, page
 * dtype, reader); the session must use run_ws_source()'s page source. */
int run_ws_open(struct run_ws *r, const char *dir, const kvmem_model *m,
		const kvmem_workspace_opts *wo);
const kvmem_page_source *run_ws_source(const struct run_ws *r);
/* The opened workspace's pager (NULL when none is open). */
kvmem_pager *run_ws_pager(const struct run_ws *r);
/* Tokens the opened workspace already holds (0 when none is open). */
int64_t run_ws_tokens(const struct run_ws *r);
/* Take over the stored history (kvmem_workspace_adopt), with one warning on
 * stderr when the view starts from a fresh selection. */
int run_ws_adopt(struct run_ws *r, kvmem_session *s);
/* Commit the session's history and its state (a step boundary). */
int run_ws_commit(struct run_ws *r, const kvmem_session *s);
/* After the session is gone: print a line about the workspace to f and
 * close it. Negative when something was not saved. */
int run_ws_close(struct run_ws *r, FILE *f);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * `kvmem run --workspace DIR`: the agent session's history in a workspace
 * directory through the tiered pager (pager_cli.c). One workspace per
 * process.
 */
#ifndef KVMEM_TOOLS_PAGER_CLI_H
#define KVMEM_TOOLS_PAGER_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "kvmem/model.h"
#include "kvmem/workspace.h"

/*
 * Open (or create) dir for model m with blocks of `block` tokens, a host
 * pool of host_cap bytes (0: default) and a replacement policy (NULL:
 * default); fill *src with a page source over it. When dir holds a history,
 * *ids / *n_ids are its token ids (malloc'd) for kvmem_session_adopt().
 */
int pager_cli_open(const char *dir, const kvmem_model *m, int block, uint64_t host_cap,
		   const char *cache_policy, kvmem_page_source *src, int32_t **ids, int64_t *n_ids);
/*
 * Take over the reopened history: with the session state of the last
 * commit (kvmem_session_adopt_state: the session goes on exactly as it
 * would have), or, when the commit holds none or it is refused (other
 * options, another version, corrupt), with a fresh selection
 * (kvmem_session_adopt) after one warning on stderr.
 */
int pager_cli_adopt(kvmem_session *s, const int32_t *ids, int64_t n);
/* Commit the session's history and its state (a step boundary); -1 with
 * kvmem_error. */
int pager_cli_commit(kvmem_page_source *src, const kvmem_session *s);
/* After the session and the source are gone: print a line about the
 * workspace to f and close it. -1 when something was not saved. */
int pager_cli_close(FILE *f);

#endif

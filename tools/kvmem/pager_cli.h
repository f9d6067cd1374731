/* SPDX-License-Identifier: MIT */
/*
 * `kvmem run --workspace DIR`: the agent session's history in a workspace
 * directory (pager_cli.c over kvmem/store.h). One workspace per process.
 */
#ifndef KVMEM_TOOLS_PAGER_CLI_H
#define KVMEM_TOOLS_PAGER_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "kvmem/model.h"
#include "kvmem/session.h"

/* Open (or create) dir for model m with blocks of `block` tokens, a host
 * pool of host_cap bytes (0: default) and a replacement policy (NULL:
 * default); *src is the page source the session must use. */
int pager_cli_open(const char *dir, const kvmem_model *m, int block, uint64_t host_cap,
		   const char *cache_policy, const kvmem_page_source **src);
/* The page dtype of a workspace created from now on (0: f32, the CPU
 * engine's; a GPU backend's session asks for bf16). An existing workspace
 * keeps its own. */
void pager_cli_dtype(uint32_t dtype);
/* Who reads pages back in a workspace opened from now on: "uring" (NULL:
 * the default) or "kmod" (kvmem_workspace_opts.pager). */
void pager_cli_reader(const char *pager);
/* The opened workspace's pager (NULL when none is open). */
kvmem_pager *pager_cli_pager(void);
/* Tokens the opened workspace already holds (0 when none is open). */
int64_t pager_cli_tokens(void);
/* Take over the stored history (kvmem_workspace_adopt), with one warning on
 * stderr when the view starts from a fresh selection. */
int pager_cli_adopt(kvmem_session *s);
/* Commit the session's history and its state (a step boundary). */
int pager_cli_commit(const kvmem_session *s);
/* After the session is gone: print a line about the workspace to f and
 * close it. Negative when something was not saved. */
int pager_cli_close(FILE *f);

#endif

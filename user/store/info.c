// SPDX-License-Identifier: MIT
/* What a workspace says of itself without a pager: its manifest and its
 * saved counters (kvmem info-style tools, `kvmem stat`), from any store. */
#include <errno.h>
#include <string.h>

#include "kvmem/store.h"
#include "pager/pager_int.h"

int kvmem_workspace_info_read(const char *dir, kvmem_workspace_info *wi)
{
	struct ws_store *s;
	int rc;

	memset(wi, 0, sizeof(*wi));
	if ((rc = ws_store_open(dir, KVMEM_PAGER_RDONLY, &s)) < 0)
		return rc;
	rc = mf_info(s, wi);
	ws_store_close(s);
	return rc;
}

int kvmem_workspace_stats(const char *dir, kvmem_pager_stats *st)
{
	struct ws_store *s;
	int rc;

	memset(st, 0, sizeof(*st));
	if ((rc = ws_store_open(dir, KVMEM_PAGER_RDONLY, &s)) < 0)
		return rc;
	rc = stats_read(s, st);
	ws_store_close(s);
	return rc;
}

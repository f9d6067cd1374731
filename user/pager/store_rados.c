// SPDX-License-Identifier: MIT
/* The RADOS store (wstore.h): not built yet; rados:// names are refused. */
#include <errno.h>

#include "pager/pager_int.h"

int ws_rados_open(const char *where, int flags, struct ws_store **out)
{
	*out = NULL;
	return kvmem_error(EPROTONOSUPPORT, "%s: RADOS workspaces are not supported yet", where);
}

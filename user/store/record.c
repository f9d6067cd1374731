// SPDX-License-Identifier: MIT
/*
 * An application's small records kept beside its workspace, in the same
 * store: a file of the workspace directory, or an object of the workspace's
 * RADOS namespace (wstore.h's aux objects). kvmem serve keeps a shared
 * store's conversation record there, so any server that takes the
 * conversation over finds it with the history.
 */
#include <errno.h>
#include <string.h>

#include "kvmem/store.h"
#include "pager/pager_int.h"

/* "app." then letters, digits, '.', '_', '-': never a workspace file's name. */
static int record_name_ok(const char *name)
{
	size_t n = strlen(name);

	if (n < 5 || n > 128 || strncmp(name, "app.", 4) || strstr(name, ".."))
		return 0;
	for (size_t i = 4; i < n; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return 0;
	}
	return 1;
}

int kvmem_workspace_record_read(kvmem_workspace *w, const char *name, char **text, size_t *len)
{
	kvmem_pager *p = kvmem_workspace_pager(w);

	*text = NULL;
	*len = 0;
	if (!record_name_ok(name))
		return kvmem_error(EINVAL, "%s: '%s' is no record's name (app. then letters, digits, "
				   "'.', '_', '-')", p->dir, name);
	return p->ws->ops->aux_read(p->ws, name, text, len);
}

int kvmem_workspace_record_write(kvmem_workspace *w, const char *name, const void *text,
				 size_t len)
{
	kvmem_pager *p = kvmem_workspace_pager(w);
	int rc;

	if (!record_name_ok(name))
		return kvmem_error(EINVAL, "%s: '%s' is no record's name (app. then letters, digits, "
				   "'.', '_', '-')", p->dir, name);
	if (p->rdonly)
		return kvmem_error(EINVAL, "%s: opened read-only", p->dir);
	if (len > (16u << 20))
		return kvmem_error(EFBIG, "%s/%s: %zu bytes, a record holds at most 16 MiB", p->dir,
				   name, len);
	rc = p->ws->ops->aux_write(p->ws, name, text, len, 1);
	if (rc < 0)
		return kvmem_error(-rc, "%s/%s: cannot write: %s", p->dir, name,
				   ws_strerror(p->ws, -rc));
	return 0;
}

// SPDX-License-Identifier: MIT
/* What a workspace directory says of itself without a pager: its manifest
 * and its saved counters (kvmem info-style tools, `kvmem stat`). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "kvmem/store.h"
#include "pager/pager_int.h"

int kvmem_workspace_info_read(const char *dir, kvmem_workspace_info *wi)
{
	int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc;

	memset(wi, 0, sizeof(*wi));
	if (dirfd < 0)
		return kvmem_error(errno, "%s: %s", dir, strerror(errno));
	rc = mf_info_at(dirfd, dir, wi);
	close(dirfd);
	return rc;
}

int kvmem_workspace_stats(const char *dir, kvmem_pager_stats *s)
{
	int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc;

	memset(s, 0, sizeof(*s));
	if (dirfd < 0)
		return kvmem_error(errno, "%s: %s", dir, strerror(errno));
	rc = stats_read(dirfd, dir, s);
	close(dirfd);
	return rc;
}

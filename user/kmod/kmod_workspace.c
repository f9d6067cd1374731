// SPDX-License-Identifier: MIT
/*
 * kvmem_kmod_open_workspace: the module over a workspace directory. The
 * manifest gives the page geometry and the committed blocks; only those
 * pages are served (what lies past the commit is not trusted).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kvmem/kmod.h"
#include "kvmem/kvmem.h"
#include "kvmem/pager.h"

static int open_in(const char *dir, const char *name, int rdonly, int *fd)
{
	char path[4096];

	if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path))
		return kvmem_error(EINVAL, "%s: path too long", dir);
	*fd = open(path, (rdonly ? O_RDONLY : O_RDWR) | O_CLOEXEC);
	if (*fd < 0)
		return kvmem_error(errno, "%s: %s", path, strerror(errno));
	return 0;
}

int kvmem_kmod_open_workspace(const char *dir, const kvmem_kmod_opts *o, kvmem_kmod **out)
{
	int rdonly = o && (o->flags & KVMEM_KMOD_RDONLY);
	kvmem_workspace_info wi;
	kvmem_kmod_files f;
	int err;

	*out = NULL;
	err = kvmem_workspace_info_read(dir, &wi);
	if (err < 0)
		return err;
	memset(&f, 0, sizeof(f));
	f.pages_fd = f.sums_fd = -1;
	f.page_bytes = wi.page_bytes;
	f.page_stride = wi.page_stride;
	f.n_layers = wi.geom.n_layers;
	f.page_count = wi.blocks * wi.geom.n_layers;
	if (!f.page_count)
		return kvmem_error(EINVAL, "%s: the workspace has no committed block: nothing "
				   "for the module to serve", dir);
	err = open_in(dir, "pages", rdonly, &f.pages_fd);
	if (!err)
		err = open_in(dir, "sums", rdonly, &f.sums_fd);
	if (!err) {
		err = kvmem_kmod_open(&f, o, out);
		if (err < 0)
			kvmem_error_prefix("%s", dir);
	}
	/* The module holds files of its own now. */
	if (f.pages_fd >= 0)
		close(f.pages_fd);
	if (f.sums_fd >= 0)
		close(f.sums_fd);
	return err;
}

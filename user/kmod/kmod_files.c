// SPDX-License-Identifier: MIT
/*
 * The module over a workspace directory: kvmem_kmod_open_workspace (the
 * directory alone) and kvmem_kmod_open_pager (the directory a pager of this
 * process has open). The manifest gives the page geometry and the committed
 * blocks; only those pages are served (what lies past the commit is not
 * trusted).
 *
 * The files are opened as the pager opens them (user/pager/files.c): under
 * the directory's descriptor, never through a symbolic link, never a FIFO or
 * device. The module reopens the very files it is handed (the same path,
 * with no more access), so what it reads is what was checked here.
 *
 * Locking follows the pager's rule (Documentation/pager.md): one writer
 * holds DIR/lock, readers take nothing. A writable open here is a writer
 * (pages written through the window reach the files) and takes the lock for
 * as long as it is open: -EBUSY while a pager writes the workspace. A
 * read-only open, and kvmem_kmod_open_pager, are readers of committed pages
 * and take no lock: they never disturb the writer.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "kvmem/kmod.h"
#include "kvmem/kvmem.h"
#include "kvmem/pager.h"
#include "kmod/kmod_int.h"
#include "pager/dirfiles.h"

/* Set the module up over the first page_count pages of the pages and sums
 * files the caller opened (fds < 0: their open failed, and the code is in
 * them). The descriptors are closed here: the module holds files of its
 * own. */
static int open_files(int pages_fd, int sums_fd, const char *dir, const kvmem_page_geom *g,
		      uint32_t page_bytes, uint32_t page_stride, uint64_t page_count,
		      const kvmem_kmod_opts *o, kvmem_kmod **out)
{
	kvmem_kmod_files f;
	int err;

	if (pages_fd < 0 || sums_fd < 0) {
		err = pages_fd < 0 ? pages_fd : sums_fd;
		goto out;
	}
	memset(&f, 0, sizeof(f));
	f.page_bytes = page_bytes;
	f.page_stride = page_stride;
	f.n_layers = g->n_layers;
	f.page_count = page_count;
	f.pages_fd = pages_fd;
	f.sums_fd = sums_fd;
	err = kvmem_kmod_open(&f, o, out);
	if (err < 0)
		kvmem_error_prefix("%s", dir);
out:
	if (pages_fd >= 0)
		close(pages_fd);
	if (sums_fd >= 0)
		close(sums_fd);
	return err;
}

static int no_block(const char *dir)
{
	return kvmem_error(EINVAL, "%s: the workspace has no committed block: nothing for the "
			   "module to serve", dir);
}

int kvmem_kmod_open_workspace(const char *dir, const kvmem_kmod_opts *o, kvmem_kmod **out)
{
	int rdonly = o && (o->flags & KVMEM_KMOD_RDONLY);
	int dirfd, lock = -1, err, pages_fd, sums_fd;
	kvmem_workspace_info wi;

	*out = NULL;
	dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0)
		return kvmem_error(errno, "%s: cannot open the workspace directory: %s", dir,
				   strerror(errno));
	/* A directory that is no workspace is refused before anything (the
	 * lock file included) is made in it. */
	err = mf_info_at(dirfd, dir, &wi);
	if (err < 0)
		goto out;
	/* Refused before the lock is taken: a refusal changes nothing. */
	if (!wi.blocks) {
		err = no_block(dir);
		goto out;
	}
	if (!rdonly) {
		/* A writer: the lock, then what the last writer committed
		 * before we held it. */
		lock = ws_lock(dirfd, dir);
		if (lock < 0) {
			err = lock;
			goto out;
		}
		err = mf_info_at(dirfd, dir, &wi);
		if (err < 0)
			goto out;
	}
	if (!wi.blocks) {	/* emptied while we waited for the lock */
		err = no_block(dir);
		goto out;
	}
	pages_fd = ws_open_file(dirfd, dir, "pages", rdonly ? O_RDONLY : O_RDWR);
	sums_fd = pages_fd < 0 ? -1 : ws_open_file(dirfd, dir, "sums", rdonly ? O_RDONLY : O_RDWR);
	err = open_files(pages_fd, sums_fd, dir, &wi.geom, wi.page_bytes, wi.page_stride,
			 wi.blocks * wi.geom.n_layers, o, out);
	if (!err && lock >= 0) {
		kmod_keep_lock(*out, lock);
		lock = -1;
	}
out:
	if (lock >= 0)
		close(lock);
	close(dirfd);
	return err;
}

int kvmem_kmod_open_pager(kvmem_pager *p, const kvmem_kmod_opts *o, kvmem_kmod **out)
{
	const kvmem_page_geom *g = kvmem_pager_geom(p);
	uint64_t pages = kvmem_pager_committed_tokens(p) / g->block_tokens * g->n_layers;
	const char *dir = kvmem_pager_dir(p);
	kvmem_kmod_opts ro;
	int pages_fd, sums_fd;

	*out = NULL;
	if (o)
		ro = *o;
	else
		kvmem_kmod_opts_default(&ro);
	/* A reader of committed pages, beside the writer p. */
	ro.flags |= KVMEM_KMOD_RDONLY;
	if (!pages && !ro.page_max)
		return kvmem_error(EINVAL, "%s: the workspace has no committed block and the window "
				   "has no room to grow (page_max 0): nothing for the module to serve",
				   dir);
	if (ro.page_max && ro.page_max < pages)
		return kvmem_error(EINVAL, "%s: a window of %" PRIu64 " pages cannot hold the %" PRIu64
				   " committed ones", dir, ro.page_max, pages);
	pages_fd = kvmem_pager_open_file(p, "pages", O_RDONLY);
	sums_fd = pages_fd < 0 ? -1 : kvmem_pager_open_file(p, "sums", O_RDONLY);
	return open_files(pages_fd, sums_fd, dir, g, (uint32_t)kvmem_page_bytes(g),
			  (uint32_t)kvmem_page_stride(g), pages, &ro, out);
}

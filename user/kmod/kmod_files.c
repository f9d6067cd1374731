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
#include "pager/pager_int.h"

/* Open pages and sums under dirfd and set the module up over the first
 * page_count pages. The caller's descriptors are closed here: the module
 * holds files of its own. */
static int open_files(int dirfd, const char *dir, const kvmem_page_geom *g,
		      uint32_t page_bytes, uint32_t page_stride, uint64_t page_count,
		      const kvmem_kmod_opts *o, kvmem_kmod **out)
{
	int rdonly = o && (o->flags & KVMEM_KMOD_RDONLY);
	kvmem_kmod_files f;
	int err;

	memset(&f, 0, sizeof(f));
	f.page_bytes = page_bytes;
	f.page_stride = page_stride;
	f.n_layers = g->n_layers;
	f.page_count = page_count;
	f.pages_fd = ws_open_file(dirfd, dir, "pages", rdonly ? O_RDONLY : O_RDWR);
	if (f.pages_fd < 0)
		return f.pages_fd;
	f.sums_fd = ws_open_file(dirfd, dir, "sums", rdonly ? O_RDONLY : O_RDWR);
	if (f.sums_fd < 0) {
		close(f.pages_fd);
		return f.sums_fd;
	}
	err = kvmem_kmod_open(&f, o, out);
	if (err < 0)
		kvmem_error_prefix("%s", dir);
	close(f.pages_fd);
	close(f.sums_fd);
	return err;
}

int kvmem_kmod_open_workspace(const char *dir, const kvmem_kmod_opts *o, kvmem_kmod **out)
{
	int rdonly = o && (o->flags & KVMEM_KMOD_RDONLY);
	int dirfd, lock = -1, err;
	struct manifest m;
	kvmem_page_geom g;

	*out = NULL;
	dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0)
		return kvmem_error(errno, "%s: cannot open the workspace directory: %s", dir,
				   strerror(errno));
	/* A directory that is no workspace is refused before anything (the
	 * lock file included) is made in it. */
	err = mf_read(dirfd, dir, &m);
	if (err < 0)
		goto out;
	if (!rdonly) {
		/* A writer: the lock, then what the last writer committed
		 * before we held it. */
		mf_free(&m);
		lock = ws_lock(dirfd, dir);
		if (lock < 0) {
			err = lock;
			goto out;
		}
		err = mf_read(dirfd, dir, &m);
		if (err < 0)
			goto out;
	}
	mf_geom(&m, &g);
	if (!m.h.blocks) {
		err = kvmem_error(EINVAL, "%s: the workspace has no committed block: nothing for the "
				  "module to serve", dir);
	} else {
		err = open_files(dirfd, dir, &g, m.h.page_bytes, m.h.page_stride,
				 m.h.blocks * g.n_layers, o, out);
		if (!err && lock >= 0) {
			kmod_keep_lock(*out, lock);
			lock = -1;
		}
	}
	mf_free(&m);
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
	kvmem_kmod_opts ro;

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
				   p->dir);
	if (ro.page_max && ro.page_max < pages)
		return kvmem_error(EINVAL, "%s: a window of %" PRIu64 " pages cannot hold the %" PRIu64
				   " committed ones", p->dir, ro.page_max, pages);
	return open_files(p->dirfd, p->dir, g, (uint32_t)p->page_bytes, (uint32_t)p->page_stride,
			  pages, &ro, out);
}

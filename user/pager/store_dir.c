// SPDX-License-Identifier: MIT
/*
 * The directory store (wstore.h): a workspace as files of one directory on
 * a local file system, the NVMe tier. The manifest is replaced by rename
 * (manifest.c), data files are opened the safe way (files.c), durability
 * goes through durable.c (so tests can watch and fail each sync), pages
 * move through io_uring with O_DIRECT (uring.c), and the one-writer rule is
 * an open file description lock on DIR/lock. Layout: Documentation/formats.md,
 * "Workspace directory".
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pager/pager_int.h"
#include "util/fs.h"

struct dir_store {
	struct ws_store s;
	int dirfd;
	int fd[WS_N_STREAMS];
	int fd_lock;		/* the writer's lock (-1: none taken) */
	int warned_direct;	/* said once that O_DIRECT is refused */
	uint64_t prealloc_end;	/* pages file allocated up to here */
	int no_prealloc;	/* fallocate refused: stop trying */
};

static struct dir_store *D(struct ws_store *s)
{
	return (struct dir_store *)s;
}

static void dir_close(struct ws_store *s)
{
	struct dir_store *d = D(s);

	for (int i = 0; i < WS_N_STREAMS; i++)
		if (d->fd[i] >= 0)
			close(d->fd[i]);
	if (d->dirfd >= 0)
		close(d->dirfd);
	if (d->fd_lock >= 0)
		close(d->fd_lock);	/* releases the writer's lock */
	free(d);
}

static int dir_mf_load(struct ws_store *s, uint8_t **buf, size_t *len)
{
	return mf_load_at(D(s)->dirfd, s->name, buf, len);
}

static int dir_mf_replace(struct ws_store *s, const void *buf, size_t len, uint64_t old_gen,
			  uint64_t new_gen)
{
	/* The lock file guards the rename: nobody else writes the manifest. */
	return mf_replace_at(D(s)->dirfd, s->name, buf, len);
}

/*
 * No readable manifest: decide whether dir may become a new workspace. Only
 * an empty directory may (or one left by a creation cut short: empty data
 * files, temporary files, the lock). Anything else is refused, naming it.
 */
static int dir_may_create(struct ws_store *s, int flags)
{
	struct ws_scan sc;
	int rc = ws_scan(D(s)->dirfd, s->name, &sc);

	if (rc < 0)
		return rc;
	if (sc.manifest)
		return kvmem_error(ENOENT, "%s/manifest: vanished while opening", s->name);
	if (sc.ws_file[0])
		return kvmem_error(ENOENT, "%s: no manifest, but the directory holds workspace files "
				 "('%s'): a damaged workspace, not an empty one; refusing to create "
				 "a new workspace over it", s->name, sc.ws_file);
	if (sc.other[0])
		return kvmem_error(EEXIST, "%s: not a kvmem workspace and not empty (it holds '%s'); "
				 "refusing to create a workspace in it", s->name, sc.other);
	if (!(flags & KVMEM_PAGER_CREATE) || s->rdonly)
		return kvmem_error(ENOENT, "%s: not a kvmem workspace (no manifest)", s->name);
	return 0;
}

/* Open (or create) one data file; O_DIRECT for pages unless refused (then
 * buffered). Never through a link, never a FIFO or other non-regular file. */
static int open_file(struct dir_store *d, int i, int create)
{
	int flags = d->s.rdonly ? O_RDONLY : O_RDWR;
	const char *name = ws_data_files[i], *dir = d->s.name;
	int fd;

	/* Opened again to read another commit: the file may be another. */
	if (d->fd[i] >= 0) {
		close(d->fd[i]);
		d->fd[i] = -1;
	}
	if (i == WS_PAGES && !(d->s.flags & KVMEM_PAGER_NO_DIRECT)) {
		fd = create ? ws_create_file(d->dirfd, dir, name, flags | O_DIRECT) :
			      ws_open_file(d->dirfd, dir, name, flags | O_DIRECT);
		if (fd >= 0) {
			d->s.direct = 1;
			d->fd[i] = fd;
			return 0;
		}
		if (fd != -EINVAL)
			return fd;
		fprintf(stderr, "kvmem: %s: the file system refuses O_DIRECT; using buffered I/O\n",
			dir);
		d->warned_direct = 1;
	}
	fd = create ? ws_create_file(d->dirfd, dir, name, flags) :
		      ws_open_file(d->dirfd, dir, name, flags);
	/* The O_DIRECT attempt may have created it before being refused. */
	if (fd == -EEXIST && d->warned_direct && i == WS_PAGES)
		fd = ws_open_file(d->dirfd, dir, name, flags);
	if (fd < 0)
		return fd;
	d->fd[i] = fd;
	return 0;
}

static int dir_create(struct ws_store *s, uint64_t extent)
{
	ws_clean_temps(D(s)->dirfd, 1);
	for (int i = 0; i < WS_N_STREAMS; i++)
		if (open_file(D(s), i, 1) < 0)
			return kvmem_fail();
	return 0;
}

static int dir_open_stream(struct ws_store *s, int i)
{
	return open_file(D(s), i, 0);
}

static int dir_size(struct ws_store *s, int i, uint64_t need, uint64_t *bytes)
{
	struct stat sb;

	if (fstat(D(s)->fd[i], &sb) < 0)
		return -errno;
	*bytes = sb.st_size;
	return 0;
}

static int dir_read(struct ws_store *s, int i, void *buf, size_t len, uint64_t off)
{
	return kvmem_read_all(D(s)->fd[i], buf, len, off);
}

static int dir_write(struct ws_store *s, int i, const void *buf, size_t len, uint64_t off)
{
	return kvmem_write_all(D(s)->fd[i], buf, len, (int64_t)off);
}

/* Every data file, before the manifest that covers them is written. */
static int dir_sync(struct ws_store *s)
{
	static const int order[] = { WS_PAGES, WS_SUMS, WS_INDEX, WS_TOKENS, WS_TAIL };

	for (int k = 0; k < WS_N_STREAMS; k++)
		if (dur_sync(D(s)->fd[order[k]], 1, s->name, ws_data_files[order[k]]) < 0)
			return kvmem_fail();
	return 0;
}

static int dir_begin_write(struct ws_store *s, const uint64_t need[WS_N_STREAMS])
{
	struct dir_store *d = D(s);
	struct stat sb;

	/* Appends go on from the commit: what an interrupted one left past
	 * it goes first. The tail file keeps both slots: the other one may be
	 * next. */
	for (int i = 0; i < WS_N_STREAMS; i++) {
		if (i == WS_TAIL || fstat(d->fd[i], &sb) < 0 || (uint64_t)sb.st_size <= need[i])
			continue;
		if (ftruncate(d->fd[i], need[i]) < 0)
			return kvmem_error(errno, "%s/%s: cannot cut off data past the last commit: %s",
					 s->name, ws_data_files[i], strerror(errno));
	}
	ws_clean_temps(d->dirfd, 0);
	d->prealloc_end = need[WS_PAGES];
	return 0;
}

static int dir_lock(struct ws_store *s)
{
	D(s)->fd_lock = ws_lock_take(D(s)->dirfd, s->name);
	return D(s)->fd_lock < 0 ? D(s)->fd_lock : 0;
}

static int dir_claim(struct ws_store *s)
{
	return ws_lock_claim(D(s)->fd_lock, s->name);
}

static int dir_io_setup(struct ws_store *s, struct kvmem_io *io, unsigned depth,
			void *const *bases, const size_t *lens, unsigned n)
{
	if (io_init(io, depth) < 0)
		return kvmem_fail();
	io_register(io, bases, lens, n);
	return 0;
}

static int dir_submit(struct ws_store *s, struct kvmem_io *io, struct io_req *r)
{
	return io_queue(io, D(s)->fd[WS_PAGES], r);
}

struct reap_ctx {
	struct dir_store *d;
	struct kvmem_io *io;
	ws_done_fn done;
	void *arg;
};

/* Some file systems accept O_DIRECT at open and refuse the I/O: switch the
 * pages file to buffered I/O and queue the request again. */
static void dir_done(void *arg, struct io_req *r)
{
	struct reap_ctx *c = arg;
	struct dir_store *d = c->d;
	int fd = d->fd[WS_PAGES];

	if (r->res == -EINVAL && d->s.direct) {
		int fl = fcntl(fd, F_GETFL);

		if (fl >= 0 && fcntl(fd, F_SETFL, fl & ~O_DIRECT) == 0) {
			d->s.direct = 0;
			if (!d->warned_direct)
				fprintf(stderr, "kvmem: %s: the file system refuses O_DIRECT I/O; "
						"using buffered I/O\n", d->s.name);
			d->warned_direct = 1;
			r->done = 0;
			if (io_queue(c->io, fd, r) == 0)
				return;
		}
	}
	c->done(c->arg, r);
}

static int dir_reap(struct ws_store *s, struct kvmem_io *io, unsigned wait, ws_done_fn done,
		    void *arg)
{
	struct reap_ctx c = { D(s), io, done, arg };

	return io_reap(io, wait, dir_done, &c);
}

/*
 * Allocate the pages file ahead of the writes. Writes into allocated blocks
 * inside the file size let ext4 run several O_DIRECT writes at once (shared
 * inode lock, no punt to a worker); writes that extend the file go one at
 * a time. Best effort: a file system that refuses is written as it is.
 */
static int dir_reserve(struct ws_store *s, uint64_t end, uint64_t extent, uint64_t reach)
{
	struct dir_store *d = D(s);
	uint64_t chunk = d->prealloc_end / 4;

	if (d->no_prealloc || end <= d->prealloc_end)
		return 0;
	/* Large steps: ext4's fallocate waits for every direct I/O in flight. */
	if (chunk < (64u << 20))
		chunk = 64u << 20;
	if (chunk < 16 * extent)
		chunk = 16 * extent;
	if (chunk > (1u << 30))
		chunk = 1u << 30;
	/* At least the stage-out buffer's reach: every write it can hold in
	 * flight lands in allocated blocks, and a prefill that fills it is not
	 * stopped by a fallocate waiting for those writes again and again (a
	 * 2.4 GB buffer grown a quarter at a time: about a dozen waits for the
	 * disk in a 16K-token prefill at Qwen3-8B). */
	if (chunk < reach)
		chunk = reach;
	chunk = round_up(chunk, extent);
	if (fallocate(d->fd[WS_PAGES], 0, d->prealloc_end, end + chunk - d->prealloc_end) == 0) {
		d->prealloc_end = end + chunk;
		return 0;
	}
	/* A failed fallocate may keep what it got before running out (ext4
	 * does), which would take the space the tail and the manifest need:
	 * give it back. Every write in flight ends at or before prealloc_end. */
	d->no_prealloc = 1;
	if (ftruncate(d->fd[WS_PAGES], d->prealloc_end) < 0)
		return kvmem_error(errno, "%s/pages: cannot give back a failed allocation: %s",
				   s->name, strerror(errno));
	return 0;
}

/* Give back what was allocated ahead and not written. */
static void dir_unreserve(struct ws_store *s, uint64_t end)
{
	struct dir_store *d = D(s);

	if (!s->rdonly && d->fd[WS_PAGES] >= 0 && d->prealloc_end > end)
		if (ftruncate(d->fd[WS_PAGES], end) < 0)
			d->no_prealloc = 1;
}

static int dir_aux_read(struct ws_store *s, const char *name, char **buf, size_t *len)
{
	int fd = ws_open_file(D(s)->dirfd, s->name, name, O_RDONLY), rc;
	struct stat sb;
	char *b;

	*buf = NULL;
	*len = 0;
	if (fd < 0)
		return fd;
	if (fstat(fd, &sb) < 0 || sb.st_size > (16 << 20)) {
		close(fd);
		return kvmem_error(EFBIG, "%s/%s: too large", s->name, name);
	}
	b = malloc(sb.st_size + 1);
	if (!b) {
		close(fd);
		return kvmem_error(ENOMEM, "%s/%s: out of memory", s->name, name);
	}
	rc = kvmem_read_all(fd, b, sb.st_size, 0);
	close(fd);
	if (rc < 0) {
		free(b);
		return kvmem_error(rc == -ENODATA ? EIO : -rc, "%s/%s: cannot read: %s", s->name, name,
				   strerror(rc == -ENODATA ? EIO : -rc));
	}
	b[sb.st_size] = 0;
	*buf = b;
	*len = sb.st_size;
	return 0;
}

/* This writer's own temporary name, created where nothing is, renamed over
 * `name`; durably (fsync, rename, fsync the directory) when asked. -errno,
 * no message. */
static int dir_aux_write(struct ws_store *s, const char *name, const void *buf, size_t len,
			 int durable)
{
	int dirfd = D(s)->dirfd, fd, err = 0;
	char tmp[NAME_MAX + 1];

	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", name, (int)getpid());
	unlinkat(dirfd, tmp, 0);
	fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	errno = 0;
	if (kvmem_write_all(fd, buf, len, -1) < 0 || (durable && fsync(fd) < 0))
		err = errno ? errno : EIO;
	if (close(fd) < 0 && !err)
		err = errno;
	if (err || renameat(dirfd, tmp, dirfd, name) < 0) {
		err = err ? err : errno;
		unlinkat(dirfd, tmp, 0);
		return -err;
	}
	if (durable && fsync(dirfd) < 0 && errno != EINVAL)
		return -errno;
	return 0;
}

static uint64_t dir_id(const struct ws_store *s)
{
	const struct dir_store *d = (const struct dir_store *)s;
	struct stat st;

	return d->dirfd >= 0 && fstat(d->dirfd, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static const struct ws_store_ops dir_ops = {
	.kind = "directory",
	.close = dir_close,
	.mf_load = dir_mf_load,
	.mf_replace = dir_mf_replace,
	.may_create = dir_may_create,
	.create = dir_create,
	.open_stream = dir_open_stream,
	.size = dir_size,
	.read = dir_read,
	.write = dir_write,
	.sync = dir_sync,
	.begin_write = dir_begin_write,
	.lock = dir_lock,
	.claim = dir_claim,
	.io_setup = dir_io_setup,
	.submit = dir_submit,
	.reap = dir_reap,
	.reserve = dir_reserve,
	.unreserve = dir_unreserve,
	.aux_read = dir_aux_read,
	.aux_write = dir_aux_write,
	.id = dir_id,
};

int ws_store_dirfd(const struct ws_store *s)
{
	return s && s->ops == &dir_ops ? ((const struct dir_store *)s)->dirfd : -1;
}

int ws_dir_open(const char *dir, int flags, struct ws_store **out)
{
	struct dir_store *d = calloc(1, sizeof(*d));

	*out = NULL;
	if (!d)
		return kvmem_error(ENOMEM, "%s: out of memory", dir);
	d->s.ops = &dir_ops;
	snprintf(d->s.name, sizeof(d->s.name), "%s", dir);
	d->s.flags = flags;
	d->s.rdonly = !!(flags & KVMEM_PAGER_RDONLY);
	d->dirfd = d->fd_lock = -1;
	for (int i = 0; i < WS_N_STREAMS; i++)
		d->fd[i] = -1;
	if ((flags & KVMEM_PAGER_CREATE) && !d->s.rdonly) {
		if (mkdir(dir, 0755) == 0) {
			d->s.created = 1;
			/* Its name in the parent must be durable before any
			 * commit in it is reported durable. */
			if (ws_sync_parent(dir) < 0) {
				free(d);
				return kvmem_fail();
			}
		} else if (errno != EEXIST) {
			int err = errno;

			free(d);
			return kvmem_error(err, "%s: cannot create the workspace directory: %s", dir,
					 strerror(err));
		}
	}
	d->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (d->dirfd < 0) {
		int err = errno;

		free(d);
		return kvmem_error(err, "%s: cannot open the workspace directory: %s", dir,
				 strerror(err));
	}
	*out = &d->s;
	return 0;
}

int ws_is_rados(const char *where)
{
	return where && !strncmp(where, "rados://", 8);
}

int ws_store_open(const char *where, int flags, struct ws_store **out)
{
	return ws_is_rados(where) ? ws_rados_open(where, flags, out) : ws_dir_open(where, flags, out);
}

void ws_store_close(struct ws_store *s)
{
	if (s)
		s->ops->close(s);
}

// SPDX-License-Identifier: MIT
/*
 * The files of a workspace directory, opened the safe way: every name is
 * opened under the directory's descriptor, never through a symbolic link
 * (O_NOFOLLOW), never in a way that blocks (a FIFO is refused before and
 * after open: fstatat, then O_NONBLOCK and fstat), and created only where
 * nothing is (O_EXCL). The writer's lock lives here too.
 */
#include <dirent.h>
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

const char *const ws_data_files[WS_N_DATA] = { "pages", "tokens", "index", "sums", "tail" };

static const char *type_name(mode_t m)
{
	switch (m & S_IFMT) {
	case S_IFLNK: return "a symbolic link";
	case S_IFIFO: return "a FIFO";
	case S_IFDIR: return "a directory";
	case S_IFCHR: return "a character device";
	case S_IFBLK: return "a block device";
	case S_IFSOCK: return "a socket";
	}
	return "not a regular file";
}

static int not_regular(const char *dir, const char *name, mode_t m)
{
	return kvmem_error(EBADMSG, "%s/%s: is %s, not a regular file: refusing to use it", dir, name,
			 type_name(m));
}

int ws_open_file(int dirfd, const char *dir, const char *name, int flags)
{
	struct stat sb;
	int fd, fl;

	/* Refuse what is not a regular file before opening it: opening a
	 * device can have effects of its own. */
	if (fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
		return kvmem_error(errno, "%s/%s: %s", dir, name, strerror(errno));
	if (!S_ISREG(sb.st_mode))
		return not_regular(dir, name, sb.st_mode);
	/* And again on what was opened: it may have been swapped between. */
	fd = openat(dirfd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		int err = errno;

		if (fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(sb.st_mode))
			return not_regular(dir, name, sb.st_mode);
		return kvmem_error(err, "%s/%s: %s", dir, name, strerror(err));
	}
	if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		close(fd);
		return not_regular(dir, name, sb.st_mode);
	}
	/* io_uring honours O_NONBLOCK on regular files too (-EAGAIN). */
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
		int err = errno;

		close(fd);
		return kvmem_error(err, "%s/%s: %s", dir, name, strerror(err));
	}
	return fd;
}

int ws_create_file(int dirfd, const char *dir, const char *name, int flags)
{
	int fd = openat(dirfd, name, flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);

	if (fd < 0) {
		int err = errno;

		if (err == EEXIST)
			return kvmem_error(EEXIST, "%s/%s: already exists: refusing to overwrite it", dir,
					 name);
		return kvmem_error(err, "%s/%s: cannot create: %s", dir, name, strerror(err));
	}
	return fd;
}

/* "." then one or more groups of digits separated by dots, to the end. */
static int digit_groups(const char *s)
{
	if (*s != '.')
		return 0;
	while (*s == '.') {
		const char *d = ++s;

		while (*s >= '0' && *s <= '9')
			s++;
		if (s == d)
			return 0;
	}
	return !*s;
}

/* The temporary files a writer makes: manifest.tmp.<pid>.<n>,
 * stats.tmp.<pid>, and the fixed names older versions used. Nothing else
 * is taken for one (a user's file is never removed). */
static int is_temp(const char *n)
{
	if (!strcmp(n, "manifest.tmp") || !strcmp(n, "stats.tmp"))
		return 1;
	if (!strncmp(n, "manifest.tmp", 12))
		return digit_groups(n + 12);
	if (!strncmp(n, "stats.tmp", 9))
		return digit_groups(n + 9);
	return 0;
}

static int is_data(const char *n)
{
	for (int i = 0; i < WS_N_DATA; i++)
		if (!strcmp(n, ws_data_files[i]))
			return 1;
	return 0;
}

int ws_scan(int dirfd, const char *dir, struct ws_scan *sc)
{
	int fd = dup(dirfd);
	struct dirent *de;
	DIR *d;

	memset(sc, 0, sizeof(*sc));
	if (fd < 0 || !(d = fdopendir(fd))) {
		int err = errno;

		if (fd >= 0)
			close(fd);
		return kvmem_error(err, "%s: cannot list the directory: %s", dir, strerror(err));
	}
	rewinddir(d);
	while ((de = readdir(d))) {
		const char *n = de->d_name;
		struct stat sb;

		if (!strcmp(n, ".") || !strcmp(n, ".."))
			continue;
		if (fstatat(dirfd, n, &sb, AT_SYMLINK_NOFOLLOW) < 0)
			continue;	/* gone meanwhile */
		if (!strcmp(n, "manifest")) {
			sc->manifest = 1;
		} else if (is_data(n) && S_ISREG(sb.st_mode) && sb.st_size == 0) {
			sc->empty_data++;	/* left by a creation cut short */
		} else if (is_data(n) || !strcmp(n, "stats")) {
			if (!sc->ws_file[0])
				snprintf(sc->ws_file, sizeof(sc->ws_file), "%s", n);
		} else if (!strcmp(n, "lock") || is_temp(n)) {
			if (!S_ISREG(sb.st_mode) && !sc->ws_file[0])
				snprintf(sc->ws_file, sizeof(sc->ws_file), "%s", n);
		} else if (!sc->other[0]) {
			snprintf(sc->other, sizeof(sc->other), "%s", n);
		}
	}
	closedir(d);
	return 0;
}

void ws_clean_temps(int dirfd, int empty_data_too)
{
	int fd = dup(dirfd);
	struct dirent *de;
	DIR *d;

	if (fd < 0 || !(d = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return;
	}
	rewinddir(d);
	while ((de = readdir(d))) {
		struct stat sb;

		if (is_temp(de->d_name)) {
			unlinkat(dirfd, de->d_name, 0);	/* a link is removed, not followed */
		} else if (empty_data_too && is_data(de->d_name) &&
			   fstatat(dirfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
			   S_ISREG(sb.st_mode) && sb.st_size == 0) {
			unlinkat(dirfd, de->d_name, 0);
		}
	}
	closedir(d);
}

int ws_lock_take(int dirfd, const char *dir)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
	char buf[32];
	struct stat sb;
	int fd, n;

	fd = openat(dirfd, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
	if (fd < 0) {
		int err = errno;

		if (fstatat(dirfd, "lock", &sb, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(sb.st_mode))
			return not_regular(dir, "lock", sb.st_mode);
		return kvmem_error(err, "%s/lock: cannot open the writer's lock: %s", dir, strerror(err));
	}
	if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		close(fd);
		return not_regular(dir, "lock", sb.st_mode);
	}
	/* An open file description lock: released when the descriptor is
	 * closed or the process dies, and exclusive between two opens in one
	 * process as between processes. */
	if (fcntl(fd, F_OFD_SETLK, &fl) < 0) {
		int err = errno;

		if (err == EAGAIN || err == EACCES) {
			n = pread(fd, buf, sizeof(buf) - 1, 0);
			close(fd);
			buf[n > 0 ? n : 0] = 0;
			buf[strcspn(buf, "\n")] = 0;
			return kvmem_error(EBUSY, "%s: in use by another writer (process %s, holding %s/lock); "
					 "a workspace has one writer at a time (read-only opens, "
					 "kvmem verify and kvmem stat are fine)", dir,
					 buf[0] ? buf : "unknown", dir);
		}
		close(fd);
		return kvmem_error(err, "%s/lock: cannot lock: %s", dir, strerror(err));
	}
	return fd;
}

int ws_lock_claim(int fd, const char *dir)
{
	char buf[32];
	int n = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());

	errno = 0;
	if (ftruncate(fd, 0) < 0 || kvmem_write_all(fd, buf, (size_t)n, 0) < 0) {
		int err = errno ? errno : EIO;

		return kvmem_error(err, "%s/lock: cannot write: %s", dir, strerror(err));
	}
	return 0;
}

int ws_lock(int dirfd, const char *dir)
{
	int fd = ws_lock_take(dirfd, dir);

	if (fd >= 0 && ws_lock_claim(fd, dir) < 0) {
		close(fd);
		return kvmem_fail();
	}
	return fd;
}

int ws_sync_parent(const char *dir)
{
	char parent[PATH_MAX];
	size_t n;
	char *slash;
	int fd, rc;

	snprintf(parent, sizeof(parent), "%s", dir);
	n = strlen(parent);
	while (n > 1 && parent[n - 1] == '/')
		parent[--n] = 0;
	slash = strrchr(parent, '/');
	if (!slash)
		snprintf(parent, sizeof(parent), ".");
	else if (slash == parent)
		parent[1] = 0;
	else
		*slash = 0;
	fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return kvmem_error(errno, "%s: cannot open to make the new workspace durable: %s", parent,
				 strerror(errno));
	rc = dur_sync(fd, 0, parent, "..");
	close(fd);
	return rc;
}

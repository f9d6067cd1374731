// SPDX-License-Identifier: MIT
/* Opening a model directory's files safely (modelfile.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "model/modelfile.h"

static const char *type_name(mode_t m)
{
	if (S_ISDIR(m))
		return "a directory";
	if (S_ISFIFO(m))
		return "a FIFO";
	if (S_ISSOCK(m))
		return "a socket";
	if (S_ISCHR(m))
		return "a character device";
	if (S_ISBLK(m))
		return "a block device";
	return "not a plain file";
}

/* Why open(path) said ENOENT: nothing there, or a link to nothing. */
static int absent(const char *path)
{
	struct stat ls;
	char target[PATH_MAX];
	ssize_t n;

	if (lstat(path, &ls) || !S_ISLNK(ls.st_mode))
		return kvmem_error(ENOENT, "%s: cannot open: %s", path, strerror(ENOENT));
	n = readlink(path, target, sizeof(target) - 1);
	target[n > 0 ? n : 0] = 0;
	return kvmem_error(ENOENT, "%s: a dangling symbolic link to '%s' (its target does not exist)",
			   path, target);
}

int kvmem_mf_open(const char *path, int *fd_out, struct stat *st)
{
	int fd, fl;

	*fd_out = -1;
	/* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
	 * writer forever; a regular file ignores the flag. */
	fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		if (errno == ENOENT)
			return absent(path);
		if (errno == ELOOP)
			return kvmem_error(ELOOP, "%s: a loop of symbolic links", path);
		return kvmem_error(errno, "%s: cannot open: %s", path, strerror(errno));
	}
	if (fstat(fd, st)) {
		int e = errno;

		close(fd);
		return kvmem_error(e, "%s: cannot stat: %s", path, strerror(e));
	}
	if (!S_ISREG(st->st_mode)) {
		close(fd);
		return kvmem_error(EINVAL, "%s: %s, not a regular file", path, type_name(st->st_mode));
	}
	fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
	*fd_out = fd;
	return 0;
}

int kvmem_mf_exists(const char *path)
{
	struct stat ls;

	return !lstat(path, &ls);
}

int kvmem_mf_read(const char *path, size_t max, char **buf_out, size_t *len)
{
	struct stat st;
	char *buf;
	size_t got = 0;
	int fd, rc;

	*buf_out = NULL;
	*len = 0;
	if ((rc = kvmem_mf_open(path, &fd, &st)) < 0)
		return rc;
	if ((uint64_t)st.st_size > max) {
		close(fd);
		return kvmem_error(EINVAL, "%s: %lld bytes, more than the %zu such a file may have", path,
				   (long long)st.st_size, max);
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		close(fd);
		return kvmem_error(ENOMEM, "%s: out of memory for %lld bytes", path, (long long)st.st_size);
	}
	while (got < (size_t)st.st_size) {
		ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			rc = kvmem_error(r ? errno : EIO, "%s: read failed: %s", path,
					 r ? strerror(errno) : "the file shrank while read");
			free(buf);
			close(fd);
			return rc;
		}
		got += (size_t)r;
	}
	close(fd);
	buf[got] = 0;
	*buf_out = buf;
	*len = got;
	return 0;
}

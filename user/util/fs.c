// SPDX-License-Identifier: MIT
/* File-system helpers the library and the command share. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "util/fs.h"

int kvmem_mkdir_p(const char *dir)
{
	char tmp[4096];
	size_t len = strlen(dir);
	struct stat st;

	if (len >= sizeof(tmp))
		return kvmem_error(EINVAL, "%.100s...: path too long", dir);
	memcpy(tmp, dir, len + 1);
	for (char *s = tmp + 1; ; s++) {
		if (*s == '/' || !*s) {
			char keep = *s;

			*s = 0;
			if (mkdir(tmp, 0755) && errno != EEXIST)
				return kvmem_error(errno, "%s: cannot create: %s", tmp, strerror(errno));
			*s = keep;
			if (!keep)
				break;
		}
	}
	if (stat(dir, &st) || !S_ISDIR(st.st_mode))
		return kvmem_error(EINVAL, "%s: not a directory", dir);
	return 0;
}

int kvmem_write_all(int fd, const void *buf, size_t len, int64_t off)
{
	const char *b = buf;

	while (len) {
		ssize_t w = off < 0 ? write(fd, b, len) : pwrite(fd, b, len, off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			/* A write that takes nothing and says nothing: the disk is full. */
			if (w == 0)
				errno = ENOSPC;
			return -errno;
		}
		b += w;
		len -= (size_t)w;
		if (off >= 0)
			off += w;
	}
	return 0;
}

int kvmem_read_all(int fd, void *buf, size_t len, uint64_t off)
{
	char *b = buf;

	while (len) {
		ssize_t n = pread(fd, b, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -ENODATA;
		b += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

// SPDX-License-Identifier: MIT
/* File-system helpers the library and the command share. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "kvmem/kvmem.h"

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

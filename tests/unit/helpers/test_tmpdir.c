// SPDX-License-Identifier: MIT
/* A scratch directory for a test program's files (test_tmpdir.h). */
#include <stdio.h>
#include <stdlib.h>

#include "test_tmpdir.h"

int test_tmpdir_make(char *dir, size_t len, const char *name)
{
	int n = snprintf(dir, len, "/tmp/kvmem-%s.XXXXXX", name);

	if (n < 0 || (size_t)n >= len)
		return -1;
	return mkdtemp(dir) ? 0 : -1;
}

int test_tmpdir_remove(const char *dir)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd);
}

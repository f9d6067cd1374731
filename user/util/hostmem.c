// SPDX-License-Identifier: MIT
/* What the process's mappings allow: see hostmem.h. */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>

#include "util/hostmem.h"

int kvmem_host_writable(const void *p, size_t len)
{
	uintptr_t at = (uintptr_t)p, end = at + len;
	char line[512];
	int writable = 1;
	FILE *f;

	if (!len)
		return 1;
	if (end < at)
		return -ENOENT;
	if (!(f = fopen("/proc/self/maps", "re")))
		return -errno;
	/* Lines come in address order: walk them while they cover [at, end). */
	while (at < end && fgets(line, sizeof(line), f)) {
		uintptr_t lo, hi;
		char perms[5];

		if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s", &lo, &hi, perms) != 3)
			continue;
		if (hi <= at)
			continue;
		if (lo > at)
			break;	/* a hole before the next mapping */
		if (perms[1] != 'w')
			writable = 0;
		at = hi;
	}
	fclose(f);
	return at < end ? -ENOENT : writable;
}

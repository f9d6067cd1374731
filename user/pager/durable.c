// SPDX-License-Identifier: MIT
/*
 * The durability steps of the store (fdatasync, fsync, rename) go through
 * here, so a test can see their order (kvmem_pager_sync_trace) and make one
 * fail (KVMEM_FAULT_SYNC) the way a disk that loses a write does.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "pager/pager_int.h"

static kvmem_sync_trace_fn trace_fn;
static void *trace_arg;

void kvmem_pager_sync_trace(kvmem_sync_trace_fn fn, void *arg)
{
	trace_fn = fn;
	trace_arg = arg;
}

void dur_note(const char *op, const char *name)
{
	char ev[64];

	if (!trace_fn)
		return;
	snprintf(ev, sizeof(ev), "%s %s", op, name);
	trace_fn(trace_arg, ev);
}

int dur_sync(int fd, int data_only, const char *dir, const char *name)
{
	const char *op = data_only ? "fdatasync" : "fsync";
	int rc;

	dur_note(op, name);
	if (fault_fire(KVMEM_FAULT_SYNC)) {
		errno = EIO;
		rc = -1;
	} else {
		rc = data_only ? fdatasync(fd) : fsync(fd);
	}
	if (rc < 0) {
		int err = errno;

		/* Some file systems cannot sync a directory; nothing to wait for. */
		if (err == EINVAL && !data_only && name[0] == '.')
			return 0;
		if (name[0] == '.')
			return kvmem_error(err, "%s: directory %s failed: %s", dir, op,
					 strerror(err));
		return kvmem_error(err, "%s/%s: %s failed: %s", dir, name, op, strerror(err));
	}
	return 0;
}

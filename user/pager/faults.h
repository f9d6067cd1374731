/* SPDX-License-Identifier: MIT */
/* Fault injection and durability tracing for the tests (private). */
#ifndef KVMEM_PAGER_FAULTS_H
#define KVMEM_PAGER_FAULTS_H

enum kvmem_fault {
	KVMEM_FAULT_READ = 1, KVMEM_FAULT_WRITE = 2, KVMEM_FAULT_DIRECT = 3, KVMEM_FAULT_SYNC = 4
};
/* The nth I/O completion of this kind from now (1: the next) fails: READ and
 * WRITE with -EIO; DIRECT (any read or write) with -EINVAL, as on a file
 * system that refuses O_DIRECT I/O; SYNC: the nth fdatasync or fsync the
 * store makes fails with -EIO. nth 0 disarms. Process-wide. */
void kvmem_pager_fault_inject(enum kvmem_fault kind, unsigned nth);
/* Called with each durability step of the store, in order, as "fdatasync
 * pages" (tokens, index, sums, tail), "fsync manifest.tmp", "rename
 * manifest", "fsync ." (the workspace directory), "fsync .." (the
 * directory holding a newly created workspace). NULL stops. Process-wide. */
typedef void (*kvmem_sync_trace_fn)(void *arg, const char *event);
void kvmem_pager_sync_trace(kvmem_sync_trace_fn fn, void *arg);

#endif

/* SPDX-License-Identifier: MIT */
/* kvmemtop: what its BPF half counts and its userspace half prints. */
#ifndef KVMEMTOP_H
#define KVMEMTOP_H

#include "kvmem_trace.h"

/* One row: a process and the workspace it works on (ws 0: unknown). The
 * module's completions (fills, evictions, write-backs) run in kernel
 * threads and count under pid 0. */
struct top_key {
	__u32 pid;
	__u32 pad;
	__u64 ws;
};

/* Running totals since the tool attached (userspace prints differences).
 * Tier moves are indexed KT_MOVE(from, to). */
struct top_val {
	__u64 bytes[KT_MOVES];
	__u64 pages[KT_MOVES];
	__u64 moves[KT_MOVES];	/* events: a stage-out moves a block's pages at once */
	__u64 hits;		/* fetched pages found in the host tier */
	__u64 staging_hits;	/* misses served from the stage-out buffer */
	__u64 misses;		/* faults: fetched pages not in the host tier */
	__u64 prefetches;	/* pages asked ahead */
	__u64 errors;		/* failed reads and writes */
	__u64 steps;
	__u64 commits;
};

#endif

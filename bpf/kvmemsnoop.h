/* SPDX-License-Identifier: MIT */
/* kvmemsnoop: the event record its BPF half sends through the ring buffer. */
#ifndef KVMEMSNOOP_H
#define KVMEMSNOOP_H

#include "kvmem_trace.h"

enum snoop_kind {
	SNOOP_IN,	/* pages read into the host tier (one record per request) */
	SNOOP_OUT,	/* a block written to NVMe (stage-out, module write-back) */
	SNOOP_EVICT,	/* a page left the host tier */
	SNOOP_PREFETCH,	/* a read started ahead of use */
	SNOOP_ERROR,	/* a read or write failed */
	SNOOP_HIT,	/* -a: a fetched page was in memory */
	SNOOP_MISS,	/* -a: a fetched page was not in the host tier (module: fault) */
	SNOOP_STEP,	/* -a: agent step boundary (page = the step that ended) */
	SNOOP_HINT,	/* -a: selector feedback (page = block, bytes = score x 1e6) */
	SNOOP_KINDS,
};

struct snoop_event {
	__u64 ts_ns;		/* bpf_ktime_get_ns() */
	__u64 ws;		/* workspace id (0: unknown) */
	__u64 page;		/* page, or the first of a run */
	__u64 bytes;		/* bytes of the whole record */
	__u64 lat_ns;		/* the I/O's latency where it has one, else 0 */
	__u32 pid;		/* 0: module completion in a kernel thread */
	__u32 n;		/* pages in the record (in: run length; out: 0 = a block) */
	__u32 layers;		/* pages per block (0: unknown) */
	__u32 page_bytes;	/* 0: unknown */
	__s32 err;		/* error: -errno */
	__u8 kind;		/* enum snoop_kind */
	__u8 from, to;		/* KT_TIER_* of the move */
	__u8 pad;
};

#endif

/* SPDX-License-Identifier: MIT */
/* kvmemlat: the latencies its BPF half histograms, as running totals. */
#ifndef KVMEMLAT_H
#define KVMEMLAT_H

#include "kvmem_trace.h"

/* What is timed; the userspace half names them (kvmemlat.c). */
enum lat_kind {
	LAT_PAGE_IN,		/* an NVMe read request: submit to completion */
	LAT_FETCH,		/* a fetch call: asked to every page ready */
	LAT_STAGE_OUT,		/* a block's extent written: submit to completion */
	LAT_BACKPRESSURE,	/* an append waiting for the stage-out buffer */
	LAT_COMMIT,		/* a commit, fdatasync and manifest included */
	LAT_STEP,		/* an agent step: boundary to boundary */
	LAT_FAULT,		/* module: fault to page mapped (fill done) */
	LAT_WRITEBACK,		/* module: a dirty page written back */
	LAT_KINDS,
};

/* Running totals per kind (the userspace half prints differences). */
struct lat_hist {
	__u64 slots[KT_MAX_SLOTS];	/* log2 of the latency in the unit (-m: ms, else us) */
	__u64 count;
	__u64 sum_ns;
};

#endif

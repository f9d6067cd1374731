/* SPDX-License-Identifier: MIT */
/*
 * kvmempolicy: what its userspace half passes to the feed program (run with
 * BPF_PROG_TEST_RUN during an offline replay) and what the policy programs
 * answer. The maps both sides share are in policies/policy.bpf.h.
 */
#ifndef KVMEMPOLICY_H
#define KVMEMPOLICY_H

/* feed(kind, ws, id, step, value): what happened, in trace order. */
enum feed_kind {
	FEED_SETUP,	/* id: pages per block */
	FEED_STEP,	/* step: the step that begins */
	FEED_ACCESS,	/* id: page fetched at step */
	FEED_HINT,	/* id: block, value: score x 1e6 */
};

/* A policy's answer about one candidate victim: choose(ws, page, step)
 * returns it; on the module's reclaim tracepoint the first candidate not
 * kept becomes the verdict (policies/policy.bpf.h). */
enum pol_verdict {
	POL_DEFAULT,	/* no opinion: the default order decides */
	POL_EVICT,	/* evict this page */
	POL_KEEP,	/* keep it: skip it in this scan */
	POL_VERDICTS,
};

#endif

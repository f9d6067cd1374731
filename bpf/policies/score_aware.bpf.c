// SPDX-License-Identifier: GPL-2.0
/*
 * score_aware: keep the pages of blocks the selector keeps choosing. Each
 * selector hint adds the block's score (1.0 when chosen) to a sum that
 * halves every 4 steps (as the pager's `score` policy does); a page whose
 * block's sum is at least the threshold is kept, a page whose block was
 * never hinted (or long ago) may go at once, the rest follow the default
 * order.
 *
 * Parameter (kvmempolicy -o PPM): the threshold x 1e6 (default 1500000:
 * chosen in about two of the last four steps).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "policy.bpf.h"

static __always_inline int decide(__u64 ws, __u64 page, __u64 step)
{
	__u64 thr = pol_param(0, 1500000), score;

	score = pol_block_score(ws, page / pol_layers(ws), step);
	if (score >= thr)
		return POL_KEEP;
	return score ? POL_DEFAULT : POL_EVICT;
}

KVMEM_POLICY(score_aware)

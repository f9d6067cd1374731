// SPDX-License-Identifier: GPL-2.0
/*
 * protect_recent: keep a page that the last N selections (agent steps)
 * used at least K times; anything else goes in the default order (LRU in
 * the replay). A page reused every few steps survives the scans between
 * its uses, which evict it under plain LRU.
 *
 * Parameters (kvmempolicy -o N -o K): N window in steps (default 8, at
 * most 64), K uses in the window (default 2).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "policy.bpf.h"

static __always_inline int decide(__u64 ws, __u64 page, __u64 step)
{
	__u64 n = pol_param(0, 8), k = pol_param(1, 2);

	return pol_recent_uses(ws, page, step, n) >= k ? POL_KEEP : POL_DEFAULT;
}

KVMEM_POLICY(protect_recent)

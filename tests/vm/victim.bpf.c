// SPDX-License-Identifier: GPL-2.0
/*
 * A reclaim policy for kvmem.ko's writable tracepoint kvmem_reclaim, for the
 * VM test (kvmem-bpf): the module passes its candidates in clock order and
 * evicts candidate 0 unless the program names another. Mode (cfg[0]): 0 say
 * nothing, 1 evict the candidate with the largest page id (the newest
 * block's pages), 2 give a verdict out of range (the module must refuse it).
 * cfg[1] counts calls, cfg[2] holds the last call's candidate count, cfg[3]
 * its step, cfg[8] its candidates' hints (KVMEM_HINTED_*, candidate i in
 * bits 4i..4i+3) and cfg[9] their page ids' low 4 bits, packed the same.
 *
 * And a program for the prefetch hook kvmem_prefetch_hook. Mode (cfg[4]):
 * 0 add nothing, 1 add the two pages after the first one seen (read-ahead),
 * 2 add one page past the end and then the next page, 3 claim 100 pages
 * (more than the module takes). cfg[5] counts calls, cfg[6] holds the last
 * step, cfg[7] the last reason.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <linux/kvmem.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 10);
	__type(key, __u32);
	__type(value, __u64);
} kvmem_victim_cfg SEC(".maps");

static __u64 *cfg(__u32 k)
{
	return bpf_map_lookup_elem(&kvmem_victim_cfg, &k);
}

SEC("raw_tp.w/kvmem_reclaim")
int kvmem_victim(__u64 *ctx)
{
	__u64 *mode = cfg(0), *calls = cfg(1), *ncand = cfg(2), *last_step = cfg(3);
	__u64 *hints = cfg(8), *pages = cfg(9);
	__u64 best_page = 0, h = 0, p = 0;
	struct kvmem_reclaim_ctx *c;
	__u32 n, best = 0;

	if (!mode || !calls || !ncand)
		return 0;
	/* Taken after the lookups: 6.1's verifier loses the buffer
	 * pointer's type when it is spilled across their calls. */
	c = (struct kvmem_reclaim_ctx *)ctx[0];
	__sync_fetch_and_add(calls, 1);
	n = c->n_candidates;
	*ncand = n;
	if (last_step)
		*last_step = c->step;
	/* Straight-line: few registers live, so the buffer pointer is never
	 * spilled (the module zeroes the entries past n_candidates). */
	if (hints) {
		h = c->hint[0] & 15;
		h |= (__u64)(c->hint[1] & 15) << 4;
		h |= (__u64)(c->hint[2] & 15) << 8;
		h |= (__u64)(c->hint[3] & 15) << 12;
		h |= (__u64)(c->hint[4] & 15) << 16;
		h |= (__u64)(c->hint[5] & 15) << 20;
		h |= (__u64)(c->hint[6] & 15) << 24;
		h |= (__u64)(c->hint[7] & 15) << 28;
		*hints = h;
	}
	if (pages) {
		p = c->page[0] & 15;
		p |= (c->page[1] & 15) << 4;
		p |= (c->page[2] & 15) << 8;
		p |= (c->page[3] & 15) << 12;
		p |= (c->page[4] & 15) << 16;
		p |= (c->page[5] & 15) << 20;
		p |= (c->page[6] & 15) << 24;
		p |= (c->page[7] & 15) << 28;
		*pages = p;
	}
	if (*mode == 1) {
		/* Constant offsets only: the tracepoint buffer takes no
		 * variable index, so the loop is unrolled. */
#pragma clang loop unroll(full)
		for (__u32 i = 0; i < KVMEM_RECLAIM_MAX; i++) {
			if (i < n && c->page[i] >= best_page) {
				best_page = c->page[i];
				best = i;
			}
		}
		c->verdict = best;
	} else if (*mode == 2) {
		c->verdict = KVMEM_RECLAIM_MAX + 100;
	}
	return 0;
}

SEC("raw_tp.w/kvmem_prefetch_hook")
int kvmem_readahead(__u64 *ctx)
{
	struct kvmem_prefetch_ctx *c = (struct kvmem_prefetch_ctx *)ctx[0];
	__u64 *mode = cfg(4), *calls = cfg(5), *step = cfg(6), *reason = cfg(7);

	if (!mode || !calls || !step || !reason)
		return 0;
	__sync_fetch_and_add(calls, 1);
	*step = c->step;
	*reason = c->reason;
	if (*mode == 1) {
		c->add[0] = c->page[0] + 1;
		c->add[1] = c->page[0] + 2;
		c->n_add = 2;
	} else if (*mode == 2) {
		c->add[0] = c->page_count + 5;
		c->add[1] = c->page[0] + 1;
		c->n_add = 2;
	} else if (*mode == 3) {
		c->n_add = 100;
	}
	return 0;
}

/* No-ops that kvmem-fuzz keeps attached for its whole run, two on each
 * tracepoint, so that attaching and detaching the two programs above never
 * patches kernel text: neither the tracepoint's static key (0 <-> 1
 * probes) nor its static call (1 <-> 2 probes: the call sites in the
 * module go from the one probe to the iterator; 2 <-> 3 changes neither).
 * kvmem-fuzz.c, bpf_flipper, says why.
 */
SEC("raw_tp.w/kvmem_reclaim")
int kvmem_anchor_reclaim(__u64 *ctx)
{
	return 0;
}

SEC("raw_tp.w/kvmem_prefetch_hook")
int kvmem_anchor_prefetch(__u64 *ctx)
{
	return 0;
}

/* The second of each pair: a program is one probe however often it is
 * attached (a second attach of the same one is EEXIST). */
SEC("raw_tp.w/kvmem_reclaim")
int kvmem_anchor_reclaim2(__u64 *ctx)
{
	return 0;
}

SEC("raw_tp.w/kvmem_prefetch_hook")
int kvmem_anchor_prefetch2(__u64 *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";

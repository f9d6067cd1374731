// SPDX-License-Identifier: GPL-2.0
/*
 * kvmempolicy's own programs: the feeders that keep the page history a
 * victim policy reads (policies/policy.bpf.h). `feed` is run with
 * BPF_PROG_TEST_RUN by the offline replay; the usdt_* and tp_* feeders
 * follow a live pager or the module (its step from kvmem_step) while a
 * policy is attached to the module's writable tracepoint kvmem_reclaim.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

#include "kvmem.bpf.h"
#include "policies/policy.bpf.h"
#include "kvmempolicy.h"

SEC("raw_tp")
int feed(__u64 *ctx)
{
	__u64 kind = ctx[0], ws = ctx[1], id = ctx[2], step = ctx[3], value = ctx[4];

	switch (kind) {
	case FEED_SETUP:
		pol_setup(ws, id);
		break;
	case FEED_STEP:
		pol_step(ws, step);
		break;
	case FEED_ACCESS:
		pol_access(ws, id, step);
		break;
	case FEED_HINT:
		pol_hint(ws, id, value, step);
		break;
	}
	return 0;
}

/* ---- live: the userspace pager's probes ------------------------------------ */
static __always_inline __u64 live_ws(void)
{
	__s64 tgid = kt_tgid();
	struct kt_workspace *w;

	if (tgid < 0)
		return 0;
	w = kt_ws(tgid);
	return w ? w->id : 0;
}

SEC("usdt")
int BPF_USDT(usdt_open__pol, void *dir, __u64 layers, __u64 page_bytes, __u64 id)
{
	if (kt_tgid() >= 0)
		pol_setup(id, layers);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_hit, __u64 page, __u64 tier, __u64 bytes)
{
	__u64 ws = live_ws();

	if (ws && tier == KT_TIER_HOST)
		pol_access(ws, page, pol_now(ws));
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_miss, __u64 page, __u64 bytes)
{
	__u64 ws = live_ws();

	if (ws)
		pol_access(ws, page, pol_now(ws));
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_hint, __u64 block, __u64 ppm)
{
	__u64 ws = live_ws();

	if (ws)
		pol_hint(ws, block, ppm, pol_now(ws));
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_step, __u64 step, __u64 hits, __u64 misses, __u64 bytes, __u64 ns)
{
	__u64 ws = live_ws();

	/* the probe names the step that ended; kvmem run counts steps by one */
	if (ws)
		pol_step(ws, step + 1);
	return 0;
}

/* ---- live: the module's tracepoints (kvmem_tp.h) --------------------------- */
/*
 * The module's workspaces are keyed by the inode of their pages file and
 * step with KVMEM_IOC_STEP; kvmem_step says so, and the accesses below are
 * recorded at that step. (The USDT feeders above key the userspace
 * pager's workspaces by their directory's inode: another key, another
 * step count.)
 */
SEC("raw_tp/kvmem_step")
int BPF_PROG(tp_step, __u64 ws_id, __u64 step, __u64 layers)
{
	pol_setup(ws_id, layers);
	pol_step(ws_id, step);
	return 0;
}

SEC("raw_tp/kvmem_fault")
int BPF_PROG(tp_fault, __u64 ws_id, __u64 page, __u64 flags)
{
	pol_access(ws_id, page, pol_now(ws_id));
	return 0;
}

SEC("raw_tp/kvmem_hit")
int BPF_PROG(tp_hit, __u64 ws_id, __u64 page)
{
	pol_access(ws_id, page, pol_now(ws_id));
	return 0;
}

char LICENSE[] SEC("license") = "GPL";

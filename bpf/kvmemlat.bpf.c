// SPDX-License-Identifier: GPL-2.0
/*
 * kvmemlat: log2 histograms of the pager's latencies, from the durations
 * its probes already carry (page_in, fetch, stage_out, backpressure,
 * commit, step) or the module's (fill_done: fault to ready; writeback).
 * Nothing is timed here: each probe fires once per call, write or reap
 * pass (page_in_batch carries each read request's latency), so the cost
 * is a probe hit per I/O batch, not per page.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

#include "kvmem.bpf.h"
#include "kvmemlat.h"

const volatile bool targ_ms = false;	/* -m: millisecond slots */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LAT_KINDS);
	__type(key, __u32);
	__type(value, struct lat_hist);
} hists SEC(".maps");

static __always_inline void record(__u32 kind, __u64 ns)
{
	struct lat_hist *h = bpf_map_lookup_elem(&hists, &kind);
	__u64 slot;

	if (!h)
		return;
	slot = kt_slot(targ_ms ? ns / 1000000 : ns / 1000);
	__sync_fetch_and_add(&h->slots[slot], 1);
	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->sum_ns, ns);
}

static __always_inline int mine(void)
{
	return kt_tgid() >= 0;
}

/* ---- the userspace pager's USDT probes ------------------------------------ */
/* Each read request's latency, from the batch a reap pass fires: one hit
 * per pass (up to PAGE_IN_BATCH_MAX requests) instead of one per request. */
#define PAGE_IN_BATCH_MAX 64	/* KVMEM_PROBE_BATCH_MAX, user/pager/probes.h */

SEC("usdt")
int BPF_USDT(usdt_page_in_batch, __u64 reqs, __u64 pages, __u64 bytes, __u64 ns, __u64 lat)
{
	if (!mine())
		return 0;
	for (__u32 i = 0; i < PAGE_IN_BATCH_MAX && i < reqs; i++) {
		__u64 v;

		if (bpf_probe_read_user(&v, sizeof(v), (const void *)(lat + 8 * (__u64)i)))
			break;
		record(LAT_PAGE_IN, v);
	}
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_fetch, __u64 n, __u64 hits, __u64 misses, __u64 staged, __u64 ns)
{
	if (mine())
		record(LAT_FETCH, ns);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_stage_out, __u64 block, __u64 bytes, __u64 ns)
{
	if (mine())
		record(LAT_STAGE_OUT, ns);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_backpressure, __u64 block, __u64 ns)
{
	if (mine())
		record(LAT_BACKPRESSURE, ns);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_commit, __u64 tokens, __u64 blocks, __u64 ns)
{
	if (mine())
		record(LAT_COMMIT, ns);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_step, __u64 step, __u64 hits, __u64 misses, __u64 bytes, __u64 ns)
{
	if (mine())
		record(LAT_STEP, ns);
	return 0;
}

/* ---- the module's tracepoints (kvmem_tp.h) ----------------------- */
/* Completions run in kernel threads: with -p they are not counted. */
SEC("raw_tp/kvmem_fill_done")
int BPF_PROG(tp_fill_done, __u64 ws_id, __u64 first, __u64 n, __u64 bytes, __u64 ns, __s64 err)
{
	if (!targ_tgid && !err)
		record(LAT_FAULT, ns);
	return 0;
}

SEC("raw_tp/kvmem_writeback")
int BPF_PROG(tp_writeback, __u64 ws_id, __u64 page, __u64 bytes, __u64 ns)
{
	if (!targ_tgid)
		record(LAT_WRITEBACK, ns);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";

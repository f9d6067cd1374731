// SPDX-License-Identifier: GPL-2.0
/*
 * kvmemsnoop: one ring buffer record per page event. Reads come as one
 * record per NVMe request (page_in: a run of pages) which userspace prints
 * as one line per page, so the probe cost is per request; stage-outs are
 * one record per block. Evictions and prefetches fire per page. With -a
 * also every hit, miss, step boundary and selector hint (a probe hit per
 * fetched page).
 * Records that do not fit the ring buffer are counted in `lost`.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

#include "kvmem.bpf.h"
#include "kvmemsnoop.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);	/* resized by userspace (-B) before load */
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

static __always_inline void emit(__u32 pid, __u64 ws_id, const struct kt_workspace *ws, __u8 kind,
				 __u64 page, __u32 n, __u64 bytes, __u64 lat, __u8 from, __u8 to,
				 __s32 err)
{
	struct snoop_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		__u32 zero = 0;
		__u64 *l = bpf_map_lookup_elem(&lost, &zero);

		if (l)
			__sync_fetch_and_add(l, 1);
		return;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->ws = ws ? ws->id : ws_id;
	e->page = page;
	e->bytes = bytes;
	e->lat_ns = lat;
	e->pid = pid;
	e->n = n;
	e->layers = ws ? ws->layers : 0;
	e->page_bytes = ws ? ws->page_bytes : 0;
	e->err = err;
	e->kind = kind;
	e->from = from;
	e->to = to;
	e->pad = 0;
	bpf_ringbuf_submit(e, 0);
}

/* A USDT event of the calling process (nothing when filtered out). */
static __always_inline void usdt_emit(__u8 kind, __u64 page, __u32 n, __u64 bytes, __u64 lat,
				      __u8 from, __u8 to, __s32 err)
{
	__s64 tgid = kt_tgid();

	if (tgid < 0)
		return;
	emit(tgid, 0, kt_ws(tgid), kind, page, n, bytes, lat, from, to, err);
}

/* ---- the userspace pager's USDT probes ------------------------------------ */
SEC("usdt")
int BPF_USDT(usdt_page_in, __u64 first, __u64 n, __u64 bytes, __u64 ns)
{
	usdt_emit(SNOOP_IN, first, n, bytes, ns, KT_TIER_NVME, KT_TIER_HOST, 0);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_stage_out, __u64 block, __u64 bytes, __u64 ns)
{
	__s64 tgid = kt_tgid();
	struct kt_workspace *ws;

	if (tgid < 0)
		return 0;
	ws = kt_ws(tgid);
	/* page: the block's first page when the layer count is known */
	emit(tgid, 0, ws, SNOOP_OUT, ws && ws->layers ? block * ws->layers : block, 0, bytes, ns,
	     KT_TIER_NONE, KT_TIER_NVME, 0);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_evict, __u64 page, __u64 slot, __u64 bytes)
{
	usdt_emit(SNOOP_EVICT, page, 1, bytes, 0, KT_TIER_HOST, KT_TIER_NONE, 0);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_prefetch, __u64 page, __u64 bytes)
{
	usdt_emit(SNOOP_PREFETCH, page, 1, bytes, 0, KT_TIER_NVME, KT_TIER_HOST, 0);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_io_error, __u64 page, __s64 err)
{
	usdt_emit(SNOOP_ERROR, page, 1, 0, 0, 0, 0, (__s32)err);
	return 0;
}

/* -a only: per fetched page and per step. */
SEC("usdt")
int BPF_USDT(usdt_hit, __u64 page, __u64 tier, __u64 bytes)
{
	usdt_emit(SNOOP_HIT, page, 1, bytes, 0, tier, KT_TIER_HOST, 0);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_miss, __u64 page, __u64 bytes)
{
	usdt_emit(SNOOP_MISS, page, 1, bytes, 0, 0, 0, 0);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_step, __u64 step, __u64 hits, __u64 misses, __u64 bytes, __u64 ns)
{
	/* page: the number of the step that ended (pager.c) */
	usdt_emit(SNOOP_STEP, step, 0, bytes, ns, 0, 0, 0);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_hint, __u64 block, __u64 ppm)
{
	usdt_emit(SNOOP_HINT, block, 0, ppm, 0, 0, 0, 0);
	return 0;
}

/* ---- the module's tracepoints (kvmem_tp.h) ----------------------- */
static __always_inline void tp_emit(int sync, __u64 ws_id, __u8 kind, __u64 page, __u32 n,
				    __u64 bytes, __u64 lat, __u8 from, __u8 to, __s32 err)
{
	__s64 tgid = kt_tgid();

	if (sync && tgid >= 0)
		emit(tgid, ws_id, NULL, kind, page, n, bytes, lat, from, to, err);
	else if (!sync && !targ_tgid)
		emit(0, ws_id, NULL, kind, page, n, bytes, lat, from, to, err);
}

SEC("raw_tp/kvmem_fill_done")
int BPF_PROG(tp_fill_done, __u64 ws_id, __u64 first, __u64 n, __u64 bytes, __u64 ns, __s64 err)
{
	if (err)
		tp_emit(0, ws_id, SNOOP_ERROR, first, n, 0, ns, 0, 0, err);
	else
		tp_emit(0, ws_id, SNOOP_IN, first, n, bytes, ns, KT_TIER_NVME, KT_TIER_HOST, 0);
	return 0;
}

SEC("raw_tp/kvmem_writeback")
int BPF_PROG(tp_writeback, __u64 ws_id, __u64 page, __u64 bytes, __u64 ns)
{
	tp_emit(0, ws_id, SNOOP_OUT, page, 1, bytes, ns, KT_TIER_HOST, KT_TIER_NVME, 0);
	return 0;
}

SEC("raw_tp/kvmem_evict")
int BPF_PROG(tp_evict, __u64 ws_id, __u64 page, __u64 dirty)
{
	tp_emit(0, ws_id, SNOOP_EVICT, page, 1, 0, 0, KT_TIER_HOST, KT_TIER_NONE, 0);
	return 0;
}

SEC("raw_tp/kvmem_prefetch")
int BPF_PROG(tp_prefetch, __u64 ws_id, __u64 first, __u64 n)
{
	tp_emit(1, ws_id, SNOOP_PREFETCH, first, n, 0, 0, KT_TIER_NVME, KT_TIER_HOST, 0);
	return 0;
}

SEC("raw_tp/kvmem_fault")
int BPF_PROG(tp_fault, __u64 ws_id, __u64 page, __u64 flags)
{
	tp_emit(1, ws_id, SNOOP_MISS, page, 1, 0, 0, 0, 0, 0);
	return 0;
}

SEC("raw_tp/kvmem_hit")
int BPF_PROG(tp_hit, __u64 ws_id, __u64 page)
{
	tp_emit(1, ws_id, SNOOP_HIT, page, 1, 0, 0, KT_TIER_HOST, KT_TIER_HOST, 0);
	return 0;
}

SEC("raw_tp/kvmem_error")
int BPF_PROG(tp_error, __u64 ws_id, __u64 page, __s64 err)
{
	tp_emit(0, ws_id, SNOOP_ERROR, page, 1, 0, 0, 0, 0, err);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";

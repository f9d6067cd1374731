// SPDX-License-Identifier: GPL-2.0
/*
 * kvmemtop: per process and workspace, running totals of tier moves (bytes,
 * pages), hits, misses, prefetches, errors, steps and commits, from the
 * pager's USDT probes or the module's tracepoints. Totals only grow; the
 * userspace half prints differences per interval, so nothing counted
 * between two reads is lost. One row per process and workspace, shared by
 * the process's threads (atomic adds).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

#include "kvmem.bpf.h"
#include "kvmemtop.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 10240);
	__type(key, struct top_key);
	__type(value, struct top_val);
} rows SEC(".maps");

static struct top_val zero;

/* Threads of one process may count into one row at once. */
#define ADD(field, n) __sync_fetch_and_add(&(field), (n))

static __always_inline struct top_val *row(__u32 pid, __u64 ws)
{
	struct top_key k = { .pid = pid, .ws = ws };
	struct top_val *v = bpf_map_lookup_elem(&rows, &k);

	if (v)
		return v;
	bpf_map_update_elem(&rows, &k, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&rows, &k);
}

/* The row of the calling process (NULL: filtered out); *ws its workspace. */
static __always_inline struct top_val *usdt_row(struct kt_workspace **ws)
{
	__s64 tgid = kt_tgid();
	struct kt_workspace *w;

	if (tgid < 0)
		return NULL;
	w = kt_ws(tgid);
	if (ws)
		*ws = w;
	return row(tgid, w ? w->id : 0);
}

/* `events` moves (requests, writes) that carried `pages` pages in all. */
static __always_inline void count_moves(struct top_val *v, __u64 from, __u64 to, __u64 bytes,
					__u64 pages, __u64 events)
{
	__u32 m = KT_MOVE(from, to);

	if (m >= KT_MOVES)
		return;
	ADD(v->bytes[m], bytes);
	ADD(v->pages[m], pages);
	ADD(v->moves[m], events);
}

static __always_inline void count_move(struct top_val *v, __u64 from, __u64 to, __u64 bytes,
				       __u64 pages)
{
	count_moves(v, from, to, bytes, pages, 1);
}

/* ---- the userspace pager's USDT probes (user/pager/probes.h) -------------- */
/*
 * Two sets count the same things. The default one follows the probes that
 * fire once per call, request or reap (fetch, page_in_batch, reclaim,
 * prefetch_batch, stage_out): a fetch of 64 pages costs a few probe hits
 * instead of a few hundred. The per-page set (-P: hit, miss, tier_move, prefetch) also sees
 * moves the batched probes do not carry (GPU tiers, memory -> host copies).
 * Userspace switches one set off before load.
 */
SEC("usdt")
int BPF_USDT(usdt_fetch, __u64 n, __u64 hits, __u64 misses, __u64 staged, __u64 ns)
{
	struct top_val *v = usdt_row(NULL);

	if (!v)
		return 0;
	ADD(v->hits, hits);
	ADD(v->misses, misses);
	ADD(v->staging_hits, staged);
	return 0;
}

/* Once per reap of completions, not per read request (page_in): the
 * requests a fetch waits for land in a few passes. */
SEC("usdt")
int BPF_USDT(usdt_page_in_batch, __u64 requests, __u64 n, __u64 bytes, __u64 ns)
{
	struct kt_workspace *ws = NULL;
	struct top_val *v = usdt_row(&ws);

	/* bytes read cover whole slots (pages rounded up to 4 KiB): count
	 * the pages' own bytes, as bytes_in does, when the size is known */
	if (v)
		count_moves(v, KT_TIER_NVME, KT_TIER_HOST, ws && ws->page_bytes ?
			    n * ws->page_bytes : bytes, n, requests);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_reclaim, __u64 want, __u64 evicted)
{
	struct top_val *v = usdt_row(NULL);

	if (v && evicted)
		count_move(v, KT_TIER_HOST, KT_TIER_NONE, 0, evicted);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_prefetch_batch, __u64 asked, __u64 started)
{
	struct top_val *v = usdt_row(NULL);

	if (v)
		ADD(v->prefetches, started);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_stage_out, __u64 block, __u64 bytes, __u64 ns)
{
	struct kt_workspace *ws = NULL;
	struct top_val *v = usdt_row(&ws);

	if (v)
		count_move(v, KT_TIER_NONE, KT_TIER_NVME, bytes, ws && ws->layers ? ws->layers : 1);
	return 0;
}

/* The per-page set (-P). */
SEC("usdt")
int BPF_USDT(usdt_hit, __u64 page, __u64 tier, __u64 bytes)
{
	struct top_val *v = usdt_row(NULL);

	if (!v)
		return 0;
	if (tier == KT_TIER_HOST)
		ADD(v->hits, 1);
	else
		ADD(v->staging_hits, 1);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_miss, __u64 page, __u64 bytes)
{
	struct top_val *v = usdt_row(NULL);

	if (v)
		ADD(v->misses, 1);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_tier_move, __u64 page, __u64 from, __u64 to, __u64 bytes, __u64 ns)
{
	struct kt_workspace *ws = NULL;
	struct top_val *v = usdt_row(&ws);

	if (!v)
		return 0;
	/* A stage-out moves a whole block (one event, the extent's bytes). */
	count_move(v, from, to, bytes, to == KT_TIER_NVME && ws && ws->layers ? ws->layers : 1);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_prefetch, __u64 page, __u64 bytes)
{
	struct top_val *v = usdt_row(NULL);

	if (v)
		ADD(v->prefetches, 1);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_io_error, __u64 page, __s64 err)
{
	struct top_val *v = usdt_row(NULL);

	if (v)
		ADD(v->errors, 1);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_step, __u64 step, __u64 hits, __u64 misses, __u64 bytes, __u64 ns)
{
	struct top_val *v = usdt_row(NULL);

	if (v)
		ADD(v->steps, 1);
	return 0;
}

SEC("usdt")
int BPF_USDT(usdt_commit, __u64 tokens, __u64 blocks, __u64 ns)
{
	struct top_val *v = usdt_row(NULL);

	if (v)
		ADD(v->commits, 1);
	return 0;
}

/* ---- the module's tracepoints (kvmem_tp.h) ----------------------- */
/* Synchronous events count under the calling process, completions under
 * pid 0 (they run in kernel threads), both under the module's ws_id. */
static __always_inline struct top_val *tp_row(__u64 ws_id, int sync)
{
	__s64 tgid = kt_tgid();

	if (sync)
		return tgid < 0 ? NULL : row(tgid, ws_id);
	return targ_tgid ? NULL : row(0, ws_id);
}

SEC("raw_tp/kvmem_fault")
int BPF_PROG(tp_fault, __u64 ws_id, __u64 page, __u64 flags)
{
	struct top_val *v = tp_row(ws_id, 1);

	if (v)
		ADD(v->misses, 1);
	return 0;
}

SEC("raw_tp/kvmem_hit")
int BPF_PROG(tp_hit, __u64 ws_id, __u64 page)
{
	struct top_val *v = tp_row(ws_id, 1);

	if (v)
		ADD(v->hits, 1);
	return 0;
}

SEC("raw_tp/kvmem_fill_done")
int BPF_PROG(tp_fill_done, __u64 ws_id, __u64 first, __u64 n, __u64 bytes, __u64 ns, __s64 err)
{
	struct top_val *v = tp_row(ws_id, 0);

	if (!v)
		return 0;
	if (err)
		ADD(v->errors, 1);
	else
		count_move(v, KT_TIER_NVME, KT_TIER_HOST, bytes, n);
	return 0;
}

SEC("raw_tp/kvmem_prefetch")
int BPF_PROG(tp_prefetch, __u64 ws_id, __u64 first, __u64 n)
{
	struct top_val *v = tp_row(ws_id, 1);

	if (v)
		ADD(v->prefetches, n);
	return 0;
}

SEC("raw_tp/kvmem_evict")
int BPF_PROG(tp_evict, __u64 ws_id, __u64 page, __u64 dirty)
{
	struct top_val *v = tp_row(ws_id, 0);

	if (v)
		count_move(v, KT_TIER_HOST, KT_TIER_NONE, 0, 1);
	return 0;
}

SEC("raw_tp/kvmem_writeback")
int BPF_PROG(tp_writeback, __u64 ws_id, __u64 page, __u64 bytes, __u64 ns)
{
	struct top_val *v = tp_row(ws_id, 0);

	if (v)
		count_move(v, KT_TIER_HOST, KT_TIER_NVME, bytes, 1);
	return 0;
}

SEC("raw_tp/kvmem_error")
int BPF_PROG(tp_error, __u64 ws_id, __u64 page, __s64 err)
{
	struct top_val *v = tp_row(ws_id, 0);

	if (v)
		ADD(v->errors, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";

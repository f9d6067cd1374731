/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Tracepoints of kvmem.ko, subsystem "kvmem" (perf list 'kvmem:*'). Every
 * argument is a scalar, so raw_tp BPF programs read them as ctx[0..n-1]
 * without BTF. ws_id is the inode number of the workspace's pages file.
 * kvmem_reclaim and kvmem_prefetch_hook are bare writable tracepoints (no
 * trace event): a BPF program attached with SEC("raw_tp.w/kvmem_reclaim")
 * may write the verdict of struct kvmem_reclaim_ctx, one attached with
 * SEC("raw_tp.w/kvmem_prefetch_hook") the pages struct kvmem_prefetch_ctx
 * adds (include/uapi/linux/kvmem.h).
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM kvmem

#if !defined(KVMEM_TRACE_H) || defined(TRACE_HEADER_MULTI_READ)
#define KVMEM_TRACE_H

#include <linux/tracepoint.h>
#include <linux/kvmem.h>

/* kvmem_fault flags */
#define KVMEM_FAULT_WRITE	0x1	/* a write access */
#define KVMEM_FAULT_WAITED	0x2	/* another thread's fill was under way */

TRACE_EVENT(kvmem_fault,
	TP_PROTO(u64 ws_id, u64 page, u32 flags),
	TP_ARGS(ws_id, page, flags),
	TP_STRUCT__entry(
		__field(u64, ws_id)
		__field(u64, page)
		__field(u32, flags)
	),
	TP_fast_assign(
		__entry->ws_id = ws_id;
		__entry->page = page;
		__entry->flags = flags;
	),
	TP_printk("ws=%llu page=%llu flags=0x%x",
		  __entry->ws_id, __entry->page, __entry->flags)
);

TRACE_EVENT(kvmem_hit,
	TP_PROTO(u64 ws_id, u64 page),
	TP_ARGS(ws_id, page),
	TP_STRUCT__entry(
		__field(u64, ws_id)
		__field(u64, page)
	),
	TP_fast_assign(
		__entry->ws_id = ws_id;
		__entry->page = page;
	),
	TP_printk("ws=%llu page=%llu", __entry->ws_id, __entry->page)
);

TRACE_EVENT(kvmem_fill_done,
	TP_PROTO(u64 ws_id, u64 first_page, u32 n_pages, u64 bytes, u64 ns, int err),
	TP_ARGS(ws_id, first_page, n_pages, bytes, ns, err),
	TP_STRUCT__entry(
		__field(u64, ws_id)
		__field(u64, first_page)
		__field(u32, n_pages)
		__field(u64, bytes)
		__field(u64, ns)
		__field(int, err)
	),
	TP_fast_assign(
		__entry->ws_id = ws_id;
		__entry->first_page = first_page;
		__entry->n_pages = n_pages;
		__entry->bytes = bytes;
		__entry->ns = ns;
		__entry->err = err;
	),
	TP_printk("ws=%llu page=%llu n=%u bytes=%llu ns=%llu err=%d",
		  __entry->ws_id, __entry->first_page, __entry->n_pages,
		  __entry->bytes, __entry->ns, __entry->err)
);

TRACE_EVENT(kvmem_prefetch,
	TP_PROTO(u64 ws_id, u64 first_page, u32 n_pages),
	TP_ARGS(ws_id, first_page, n_pages),
	TP_STRUCT__entry(
		__field(u64, ws_id)
		__field(u64, first_page)
		__field(u32, n_pages)
	),
	TP_fast_assign(
		__entry->ws_id = ws_id;
		__entry->first_page = first_page;
		__entry->n_pages = n_pages;
	),
	TP_printk("ws=%llu page=%llu n=%u",
		  __entry->ws_id, __entry->first_page, __entry->n_pages)
);

TRACE_EVENT(kvmem_step,
	TP_PROTO(u64 ws_id, u64 step, u32 n_layers),
	TP_ARGS(ws_id, step, n_layers),
	TP_STRUCT__entry(
		__field(u64, ws_id)
		__field(u64, step)
		__field(u32, n_layers)
	),
	TP_fast_assign(
		__entry->ws_id = ws_id;
		__entry->step = step;
		__entry->n_layers = n_layers;
	),
	TP_printk("ws=%llu step=%llu layers=%u",
		  __entry->ws_id, __entry->step, __entry->n_layers)
);

TRACE_EVENT(kvmem_hint,
	TP_PROTO(u64 ws_id, u64 step, u32 n_pages, u32 n_selected),
	TP_ARGS(ws_id, step, n_pages, n_selected),
	TP_STRUCT__entry(
		__field(u64, ws_id)
		__field(u64, step)
		__field(u32, n_pages)
		__field(u32, n_selected)
	),
	TP_fast_assign(
		__entry->ws_id = ws_id;
		__entry->step = step;
		__entry->n_pages = n_pages;
		__entry->n_selected = n_selected;
	),
	TP_printk("ws=%llu step=%llu pages=%u selected=%u",
		  __entry->ws_id, __entry->step, __entry->n_pages, __entry->n_selected)
);

TRACE_EVENT(kvmem_gpu,
	TP_PROTO(u64 ws_id, u64 page, u32 slot),
	TP_ARGS(ws_id, page, slot),
	TP_STRUCT__entry(
		__field(u64, ws_id)
		__field(u64, page)
		__field(u32, slot)
	),
	TP_fast_assign(
		__entry->ws_id = ws_id;
		__entry->page = page;
		__entry->slot = slot;
	),
	TP_printk("ws=%llu page=%llu slot=%u", __entry->ws_id, __entry->page, __entry->slot)
);

/* kvmem_evict reason */
#define KVMEM_EVICT_RECLAIM	0	/* over the cap, the module's choice */
#define KVMEM_EVICT_VERDICT	1	/* over the cap, a BPF program's choice */
#define KVMEM_EVICT_ASKED	2	/* KVMEM_IOC_EVICT */

TRACE_EVENT(kvmem_evict,
	TP_PROTO(u64 ws_id, u64 page, u32 dirty, u32 reason),
	TP_ARGS(ws_id, page, dirty, reason),
	TP_STRUCT__entry(
		__field(u64, ws_id)
		__field(u64, page)
		__field(u32, dirty)
		__field(u32, reason)
	),
	TP_fast_assign(
		__entry->ws_id = ws_id;
		__entry->page = page;
		__entry->dirty = dirty;
		__entry->reason = reason;
	),
	TP_printk("ws=%llu page=%llu dirty=%u reason=%u",
		  __entry->ws_id, __entry->page, __entry->dirty, __entry->reason)
);

TRACE_EVENT(kvmem_writeback,
	TP_PROTO(u64 ws_id, u64 page, u64 bytes, u64 ns),
	TP_ARGS(ws_id, page, bytes, ns),
	TP_STRUCT__entry(
		__field(u64, ws_id)
		__field(u64, page)
		__field(u64, bytes)
		__field(u64, ns)
	),
	TP_fast_assign(
		__entry->ws_id = ws_id;
		__entry->page = page;
		__entry->bytes = bytes;
		__entry->ns = ns;
	),
	TP_printk("ws=%llu page=%llu bytes=%llu ns=%llu",
		  __entry->ws_id, __entry->page, __entry->bytes, __entry->ns)
);

TRACE_EVENT(kvmem_error,
	TP_PROTO(u64 ws_id, u64 page, int err),
	TP_ARGS(ws_id, page, err),
	TP_STRUCT__entry(
		__field(u64, ws_id)
		__field(u64, page)
		__field(int, err)
	),
	TP_fast_assign(
		__entry->ws_id = ws_id;
		__entry->page = page;
		__entry->err = err;
	),
	TP_printk("ws=%llu page=%llu err=%d",
		  __entry->ws_id, __entry->page, __entry->err)
);

/*
 * Only the BPF pass of define_trace.h (trace/bpf_probe.h) knows
 * DECLARE_TRACE_WRITABLE; every other pass sees a plain bare tracepoint.
 */
#undef KVMEM_DECLARE_TRACE_W
#ifdef DECLARE_TRACE_WRITABLE
#define KVMEM_DECLARE_TRACE_W(call, proto, args, size) \
	DECLARE_TRACE_WRITABLE(call, PARAMS(proto), PARAMS(args), size)
#else
#define KVMEM_DECLARE_TRACE_W(call, proto, args, size) \
	DECLARE_TRACE(call, PARAMS(proto), PARAMS(args))
#endif

KVMEM_DECLARE_TRACE_W(kvmem_reclaim,
	TP_PROTO(struct kvmem_reclaim_ctx *ctx),
	TP_ARGS(ctx),
	sizeof(struct kvmem_reclaim_ctx)
);

KVMEM_DECLARE_TRACE_W(kvmem_prefetch_hook,
	TP_PROTO(struct kvmem_prefetch_ctx *ctx),
	TP_ARGS(ctx),
	sizeof(struct kvmem_prefetch_ctx)
);

#endif /* KVMEM_TRACE_H */

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#define TRACE_INCLUDE_FILE kvmem_trace
#include <trace/define_trace.h>

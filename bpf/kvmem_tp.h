/* SPDX-License-Identifier: MIT */
/*
 * The kernel module's tracepoints as the BPF tools read them: a mirror of
 * kmod/kvmem_trace.h (subsystem "kvmem"). raw_tp arguments come in TP_PROTO
 * order, all scalars, so a raw_tp program reads them as ctx[0..n-1] with no
 * BTF (Debian's 6.1 headers build the module without BTF: FIELD-NOTES.md).
 * ws_id is the inode number of the workspace's pages file.
 *
 *   kvmem_fault(ws_id, page, flags)		a fault on a page not resident
 *						(process context)
 *   kvmem_hit(ws_id, page)			asked for, already resident
 *   kvmem_fill_done(ws_id, first_page, n_pages, bytes, ns, err)
 *						a fill from the pages file ended;
 *						ns: fill start to page ready
 *   kvmem_prefetch(ws_id, first_page, n_pages)	KVMEM_IOC_PREFETCH started fills
 *   kvmem_evict(ws_id, page, dirty, reason)	a page left the host tier
 *   kvmem_writeback(ws_id, page, bytes, ns)	a dirty page was written back
 *   kvmem_error(ws_id, page, err)		a fill or write-back failed
 *   kvmem_step(ws_id, step, n_layers)		KVMEM_IOC_STEP: the workspace's
 *						step from now on
 *   kvmem_reclaim(struct kvmem_reclaim_ctx *)	writable (raw_tp.w): reclaim's
 *						candidates; a program may name
 *						the one to evict
 *   kvmem_prefetch_hook(struct kvmem_prefetch_ctx *)
 *						writable (raw_tp.w): a PREFETCH
 *						list or a fault's fill; a
 *						program may add pages
 *
 * Every tp_* program in bpf/ is loaded only when the module is (see
 * kt_module_loaded()), so the USDT side never depends on it. In the VM of
 * `make vmtest` bpf/vm-observe.sh runs the tools on these tracepoints and
 * compares their totals with the module's counters (observability.md,
 * "The module's side").
 */
#ifndef KVMEM_BPF_TP_H
#define KVMEM_BPF_TP_H

#define KVMEM_TP_FAULT		"kvmem_fault"
#define KVMEM_TP_HIT		"kvmem_hit"
#define KVMEM_TP_FILL_DONE	"kvmem_fill_done"
#define KVMEM_TP_PREFETCH	"kvmem_prefetch"
#define KVMEM_TP_EVICT		"kvmem_evict"
#define KVMEM_TP_WRITEBACK	"kvmem_writeback"
#define KVMEM_TP_ERROR		"kvmem_error"
#define KVMEM_TP_RECLAIM	"kvmem_reclaim"
#define KVMEM_TP_STEP		"kvmem_step"
#define KVMEM_TP_PREFETCH_HOOK	"kvmem_prefetch_hook"

/* Where the module's events show up in tracefs when it is loaded. */
#define KVMEM_TP_DIR		"/sys/kernel/tracing/events/kvmem"
#define KVMEM_TP_DIR_DEBUGFS	"/sys/kernel/debug/tracing/events/kvmem"

/*
 * The writable tracepoint's buffer, struct kvmem_reclaim_ctx of
 * include/uapi/linux/kvmem.h, mirrored here because BPF C includes
 * vmlinux.h and not the uapi headers (kvmempolicy.c checks the two agree).
 * The module fills up to KT_RECLAIM_MAX candidates in clock order
 * (candidate 0 is its own choice; those the step's selection names come
 * last, hint[] says how: KT_HINTED_*) and verdict = KT_VERDICT_DEFAULT; a
 * program may set verdict to the index of the candidate to evict.
 */
#define KT_RECLAIM_MAX		8
#define KT_VERDICT_DEFAULT	0xffffffffu
#define KT_HINTED_NONE		0u
#define KT_HINTED_RUNNER_UP	1u
#define KT_HINTED_SELECTED	2u
struct kt_reclaim_ctx {
	__u64 ws_id;
	__u64 step;
	__u32 n_candidates;
	__u32 verdict;
	__u64 page[KT_RECLAIM_MAX];
	__u64 last_step[KT_RECLAIM_MAX];
	__u32 access_count[KT_RECLAIM_MAX];
	__u32 dirty[KT_RECLAIM_MAX];
	__u32 hint[KT_RECLAIM_MAX];
};

/*
 * The prefetch hook's buffer, struct kvmem_prefetch_ctx of the uapi: the
 * module fills the list's first ids (or the faulting page) and n_add = 0;
 * a program may name up to KT_PREFETCH_ADD_MAX pages in add[] and set
 * n_add. The buffer takes constant offsets only: write add[0], add[1], ...
 */
#define KT_PREFETCH_SEEN	8
#define KT_PREFETCH_ADD_MAX	16
#define KT_PREFETCH_LIST	0u
#define KT_PREFETCH_FAULT	1u
struct kt_prefetch_ctx {
	__u64 ws_id;
	__u64 step;
	__u64 page_count;
	__u32 reason;
	__u32 n_pages;
	__u64 page[KT_PREFETCH_SEEN];
	__u32 n_add;
	__u32 reserved;
	__u64 add[KT_PREFETCH_ADD_MAX];
};

#endif

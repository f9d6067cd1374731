/* SPDX-License-Identifier: GPL-2.0 */
/*
 * kvmem.ko internals: one struct kvmem_ws per open file of /dev/kvmem.
 *
 * Locking (Documentation/kmod.md, "Locking"):
 *  - ws->lock (a mutex) guards every field below marked [lock]: page
 *    states, slots, the clock hand, counters, and every write to the shared
 *    page table. It is never held across file I/O, nor across allocating,
 *    mapping (vmap) or freeing a slot's memory: a slot in transit is owned
 *    by the thread that took it off the free list (and counted in busy).
 *    Order: a window page's lock, then ws->lock (the re-checks after
 *    lock_page()); nothing takes a page lock while holding ws->lock.
 *  - A page in a transient state (FILLING, EVICTING, WRITEBACK) belongs to
 *    the thread that set it; the others sleep on ws->wq until it changes.
 *  - A fault that must fill or wait lets go of the mmap lock first when it
 *    may (FAULT_FLAG_ALLOW_RETRY) and returns VM_FAULT_RETRY after.
 *  - Window pages are this module's own order-0 pages, mapped by .fault
 *    with VM_FAULT_LOCKED; eviction locks them before zapping the ptes, so
 *    a fault that raced with it re-checks and retries (as truncate does).
 */
#ifndef KVMEM_INT_H
#define KVMEM_INT_H

#include <linux/atomic.h>
#include <linux/bits.h>
#include <linux/build_bug.h>
#include <linux/fs.h>
#include <linux/log2.h>
#include <linux/mm.h>
#include <linux/mutex.h>
#include <linux/stddef.h>
#include <linux/threads.h>
#include <linux/types.h>
#include <linux/version.h>
#include <linux/wait.h>
#include <linux/workqueue.h>

#include <linux/kvmem.h>

#define KVMEM_WINDOW_PGOFF	(KVMEM_MMAP_PAGE_WINDOW >> PAGE_SHIFT)
#define KVMEM_PAGE_MAX		BIT_ULL(24)	/* page ids per workspace */
#define KVMEM_STRIDE_MAX	(64u << 20)	/* bytes per page */
#define KVMEM_LAYERS_MAX	1024u
#define KVMEM_FAILED_NOTES	16	/* faults retried at once whose fill failed */

/* Private state of one page id (kvmem_pg.state). */
enum kvmem_state {
	KVMEM_ABSENT = 0,
	KVMEM_FILLING,		/* the module reads it from the pages file */
	KVMEM_CLAIMED,		/* userspace fills it (CLAIM .. FILLED) */
	KVMEM_RESIDENT,
	KVMEM_WRITEBACK,	/* resident, being written to the pages file */
	KVMEM_EVICTING,
};

/* kvmem_pg.flags */
#define KVMEM_PG_DIRTY		0x01	/* written through the window since the last write-back */
#define KVMEM_PG_BAD		0x02	/* the last fill failed */
#define KVMEM_PG_PREFETCHED	0x04	/* filled by prefetch, not faulted since */
#define KVMEM_PG_HINT_SEL	0x08	/* in the selection of step hint_step (HINT) */
#define KVMEM_PG_HINT_RUN	0x10	/* a runner-up of that selection */

struct kvmem_pg {
	u32 slot;		/* KVMEM_SLOT_NONE when absent */
	u32 pins;		/* faults between taking the page and mapping it: one per task */
	u8 state;		/* enum kvmem_state */
	u8 flags;		/* KVMEM_PG_* */
	/* Fills of this page that ended with a read or checksum error
	 * (wrapping): a fault that waited for another's fill fails with it only
	 * when this moved meanwhile, not on an older BAD flag.
	 */
	u16 fill_errs;
};

/* Every task may be between taking a page and mapping it at once. */
static_assert(sizeof_field(struct kvmem_pg, pins) * BITS_PER_BYTE > ilog2(PID_MAX_LIMIT));

/* Memory of one resident page: page_stride bytes in order-0 pages. */
struct kvmem_slot {
	u64 page;		/* the page id it holds, when used */
	struct page **pages;	/* npp pages */
	void *vaddr;		/* vmap of pages (hashing, write-back) */
	bool used;
	bool ref;		/* clock: faulted since the hand last passed */
};

struct kvmem_prefetch_batch {
	struct list_head node;
	u32 n;
	u64 ids[];	/* a PREFETCH list has room for KVMEM_PREFETCH_ADD_MAX more */
};

struct kvmem_ws {
	struct mutex lock;	/* the [lock] fields; never held across file I/O */
	wait_queue_head_t wq;	/* sleepers on a page's state change (gen) */
	/* Per-open address space, so zapping one workspace's window leaves
	 * other opens of /dev/kvmem alone (they share the device inode).
	 */
	struct address_space mapping;
	bool set_up;		/* [lock] SETUP done; the fields below are fixed after */
	bool dying;		/* [lock] release started: no new prefetch work */

	struct file *pages;	/* private reopen of pages_fd (no O_DIRECT) */
	struct file *sums;
	u64 ws_id;		/* inode number of the pages file (tracepoints) */
	u32 page_bytes, page_stride, n_layers, npp;	/* npp: PAGE_SIZE pages per page */
	int node;		/* NUMA node, NUMA_NO_NODE for local */
	bool rdonly;
	u64 page_count;		/* [lock] written; read locklessly with READ_ONCE */
	u64 page_max;

	struct kvmem_pt_header *table;	/* vmap of table_pages: header + page_max entries */
	size_t table_bytes;
	struct page **table_pages;	/* n_table_pages, mapped by mmap offset 0 */
	u32 n_table_pages;
	struct mem_cgroup *memcg;	/* charged for every page allocated (SETUP's caller's) */
	u64 reserved;			/* bytes of the module's max_memory taken at SETUP */
	struct kvmem_pte *pte;		/* table + 1 */
	struct kvmem_pg *pg;		/* [lock] page_max entries */

	struct kvmem_slot *slots;	/* [lock] n_slots */
	u32 n_slots, n_free, hand;
	u32 *free_list;		/* [lock] n_free free slot numbers */
	struct page **page_ptrs;	/* n_slots * npp, slot i's at i * npp */
	/* [lock] slots in transit (filling, write-back, eviction) plus fault
	 * pins: while non-zero, a full window may still free a slot.
	 */
	u32 busy;
	u64 gen;		/* [lock] bumped at every state change (ws->wq) */

	u64 step;		/* [lock] KVMEM_IOC_STEP */
	/* [lock] The last HINT: its step and its pages (whose flags carry
	 * the hint; they count while step == hint_step).
	 */
	u64 hint_step;
	u64 *hint_ids;
	u32 n_hint;
	struct kvmem_ioc_stats stats;	/* [lock] */

	/* Faults whose fill failed after they let go of the mmap lock, for
	 * their retries (kvmem_window.c, note_failed) [lock].
	 */
	struct kvmem_failed_note {
		pid_t pid;		/* 0: unused */
		u16 errs;		/* the page's fill_errs after the failure */
		u64 id;
		unsigned long when;	/* jiffies */
	} failed[KVMEM_FAILED_NOTES];
	u32 failed_next;

	struct work_struct prefetch_work;
	struct list_head prefetch_list;	/* [lock] of kvmem_prefetch_batch */
	u32 prefetch_queued;		/* [lock] page ids on prefetch_list */
};

/* kvmem_dev.c: pages the module holds in all windows, for leak checks
 * (/sys/module/kvmem/parameters/pages).
 */
extern atomic_long_t kvmem_pages_held;
void kvmem_queue_prefetch(struct kvmem_ws *ws);

/* vm_flags became read-only in 6.3 (vm_flags_set/clear); 6.1 writes it. */
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 3, 0)
static inline void kvmem_vm_flags_set(struct vm_area_struct *vma, vm_flags_t flags)
{
	vma->vm_flags |= flags;
}

static inline void kvmem_vm_flags_clear(struct vm_area_struct *vma, vm_flags_t flags)
{
	vma->vm_flags &= ~flags;
}
#else
#define kvmem_vm_flags_set vm_flags_set
#define kvmem_vm_flags_clear vm_flags_clear
#endif

/* struct fd's file became fd_file(f) in 6.12. */
#ifndef fd_file
#define fd_file(f) ((f).file)
#endif

/* Ptes mapping a page: page_mapcount is gone by 6.12 (folio_mapcount is
 * inline there; 6.1 does not export it).
 */
static inline int kvmem_mapcount(struct page *page)
{
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 12, 0)
	return page_mapcount(page);
#else
	return folio_mapcount(page_folio(page));
#endif
}

/* Let go of the lock a fault holds: the mmap lock on 6.1; from 6.7 it may
 * be the VMA's lock instead (release_fault_lock knows which).
 */
static inline void kvmem_release_fault_lock(struct vm_fault *vmf)
{
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 7, 0)
	mmap_read_unlock(vmf->vma->vm_mm);
#else
	release_fault_lock(vmf);
#endif
}

/* Every allocation for a workspace: charged to its memory cgroup, failing
 * (no OOM kill) when the cgroup or the machine has no more.
 */
#define KVMEM_GFP (GFP_KERNEL_ACCOUNT | __GFP_RETRY_MAYFAIL | __GFP_NOWARN)

/* kvmem_window.c: the table, slot memory, fills, the vm_operations */
extern const struct vm_operations_struct kvmem_window_vm_ops;
extern const struct vm_operations_struct kvmem_table_vm_ops;
size_t kvmem_ws_memory_bytes(u64 page_max, u64 n_slots, u32 npp);
int kvmem_ws_init_memory(struct kvmem_ws *ws, u64 host_cap);
void kvmem_ws_free_memory(struct kvmem_ws *ws);
void kvmem_pte_init(struct kvmem_ws *ws, u64 first, u64 end);
void kvmem_pte_update(struct kvmem_ws *ws, u64 id);
/* The entry with this GPU slot (KVMEM_SLOT_NONE: not on the GPU). */
void kvmem_pte_set_gpu(struct kvmem_ws *ws, u64 id, u32 gpu_slot);
/* kvmem_gpu.c: the GPU ioctl. */
long kvmem_gpu(struct kvmem_ws *ws, void __user *uarg);
void kvmem_ws_changed(struct kvmem_ws *ws);
int kvmem_ws_wait(struct kvmem_ws *ws);
void kvmem_slot_release(struct kvmem_ws *ws, struct kvmem_slot *s);
void kvmem_slot_free(struct kvmem_ws *ws, u32 slot);
bool kvmem_slot_maybe_held(struct kvmem_ws *ws, struct kvmem_slot *s, u32 pins);
bool kvmem_slot_held(struct kvmem_ws *ws, struct kvmem_slot *s);
void kvmem_zap_page(struct kvmem_ws *ws, u64 id, struct kvmem_slot *s);
int kvmem_fill_locked(struct kvmem_ws *ws, u64 id, bool prefetch);
int kvmem_claim_page(struct kvmem_ws *ws, u64 id);
void kvmem_unclaim_page(struct kvmem_ws *ws, u64 id);
int kvmem_filled_page(struct kvmem_ws *ws, u64 id, u32 flags);
/* kvmem_hint.c: HINT; a page's KVMEM_HINTED_* for the step (ws->lock held). */
long kvmem_hint(struct kvmem_ws *ws, void __user *uarg);
u32 kvmem_hinted(const struct kvmem_ws *ws, u64 id);
void kvmem_hint_free(struct kvmem_ws *ws);

/* kvmem_prefetch.c: the prefetch queue, its worker and the prefetch hook */
int kvmem_prefetch_list(struct kvmem_ws *ws, struct kvmem_prefetch_batch *b, bool wait,
			u32 reason);
void kvmem_prefetch_on_fault(struct kvmem_ws *ws, u64 id);
void kvmem_prefetch_work(struct work_struct *work);

/* kvmem_reclaim.c: ws->lock held on entry and exit, dropped around I/O */
int kvmem_slot_get(struct kvmem_ws *ws, u32 *out);
int kvmem_evict_page(struct kvmem_ws *ws, u64 id);
int kvmem_sync(struct kvmem_ws *ws);
void kvmem_writeback_all(struct kvmem_ws *ws);

/* kvmem_io.c: file I/O, ws->lock not held */
int kvmem_read_page(struct kvmem_ws *ws, u64 id, struct kvmem_slot *s);
int kvmem_verify_page(struct kvmem_ws *ws, u64 id, struct kvmem_slot *s);
int kvmem_write_page(struct kvmem_ws *ws, u64 id, struct kvmem_slot *s);

#endif

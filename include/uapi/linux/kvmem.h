/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * kvmem uapi: what the userspace pager and the kernel module (/dev/kvmem)
 * share. Usable from kernel C and from userspace C11.
 *
 * The page table is an array of fixed-size entries, one per page, indexed by
 * page id. A page is the KV of one block in one layer (raw K then V, see
 * Documentation/pager.md); page id = block * n_layers + layer. The kernel
 * module exposes the same array read-only through mmap, preceded by one
 * struct kvmem_pt_header, so residency can be read with no system call.
 *
 * Versioning: KVMEM_PT_VERSION changes whenever the layout of an entry or the
 * meaning of a field changes; readers check header.version and
 * header.entry_size and refuse what they do not know. Version 2: the entry's
 * former `reserved` is its sequence count `seq`.
 *
 * Reading an entry that another thread or the kernel changes: `seq` is odd
 * while the writer changes the entry and even otherwise (the writer adds 1
 * before and 1 after, with write barriers in between). A reader loads seq
 * (acquire), copies the fields, loads seq again after a read barrier, and
 * keeps the copy when both loads gave the same even value; otherwise it
 * reads again. (A 16-bit count: a reader stalled for exactly 65,536 changes
 * of one entry between its two loads could be fooled; its copy takes a few
 * loads.) A single field may be read alone at any time. The userspace
 * pager changes entries only in its own thread and leaves seq 0.
 */
#ifndef KVMEM_UAPI_KVMEM_H
#define KVMEM_UAPI_KVMEM_H

/*
 * linux/types.h and linux/ioctl.h are uapi headers themselves, present in
 * every Linux userspace (linux-libc-dev); they give the same __u32/__u64 the
 * kernel uses. Defining those names from stdint.h instead would clash with
 * <sys/ioctl.h>, which pulls in asm/types.h.
 */
#include <linux/types.h>
#include <linux/ioctl.h>

#define KVMEM_PT_MAGIC	0x4b564d50u	/* "KVMP" */
#define KVMEM_PT_VERSION	2u

/* Tier bits (kvmem_pte.tiers): where valid copies of the page's bytes are. */
#define KVMEM_TIER_GPU	0x01u	/* GPU pool, at gpu_slot */
#define KVMEM_TIER_HOST	0x02u	/* host pool, at host_slot */
#define KVMEM_TIER_NVME	0x04u	/* durable in the workspace's pages file */

/* State flags (kvmem_pte.flags). */
#define KVMEM_PTE_IN_FLIGHT 0x01u	/* a transfer into host_slot is under way */
#define KVMEM_PTE_DIRTY	  0x02u	/* newer than the NVMe copy (stage-out pending) */
#define KVMEM_PTE_PINNED	  0x04u	/* must not be evicted (in use by a step) */
#define KVMEM_PTE_BAD	  0x08u	/* last read failed or its checksum did not match */
#define KVMEM_PTE_PREFETCHED 0x10u /* brought in by prefetch, not fetched since */

#define KVMEM_SLOT_NONE	0xffffffffu

/* One page, 32 bytes. */
struct kvmem_pte {
	__u64 page_id;		/* block * n_layers + layer */
	__u32 host_slot;	/* host pool slot, KVMEM_SLOT_NONE when absent */
	__u32 gpu_slot;		/* GPU pool slot, KVMEM_SLOT_NONE when absent */
	__u8 tiers;		/* KVMEM_TIER_* */
	__u8 flags;		/* KVMEM_PTE_* */
	__u16 seq;		/* odd while the entry changes (see above) */
	__u32 access_count;	/* fetches since the page was created (saturates) */
	__u64 last_step;	/* agent step of the last fetch */
};

/* Precedes the entries in the module's mmap of the table. */
struct kvmem_pt_header {
	__u32 magic;		/* KVMEM_PT_MAGIC */
	__u32 version;		/* KVMEM_PT_VERSION */
	__u32 entry_size;	/* sizeof(struct kvmem_pte) */
	__u32 n_layers;
	__u64 n_entries;	/* pages present */
	__u64 reserved[5];
};

#ifdef __KERNEL__
#include <linux/build_bug.h>
static_assert(sizeof(struct kvmem_pte) == 32);
static_assert(sizeof(struct kvmem_pt_header) == 64);
#elif defined(__cplusplus)
static_assert(sizeof(struct kvmem_pte) == 32, "kvmem_pte must stay 32 bytes");
static_assert(sizeof(struct kvmem_pt_header) == 64, "kvmem_pt_header must stay 64 bytes");
#else
_Static_assert(sizeof(struct kvmem_pte) == 32, "kvmem_pte must stay 32 bytes");
_Static_assert(sizeof(struct kvmem_pt_header) == 64, "kvmem_pt_header must stay 64 bytes");
#endif

/* Direct I/O alignment of every page and extent in the workspace files. */
#define KVMEM_IO_ALIGN	4096u

/* ---- /dev/kvmem: ioctls, mmap, reclaim verdict --------------------------- */
/*
 * One workspace per open file of /dev/kvmem (Documentation/kmod.md). Every
 * argument struct is made of __u64/__s32/__u32 fields with explicit padding,
 * so it has one layout on every ABI; reserved fields and unknown flag bits
 * must be zero. A user pointer is a __u64.
 *
 * ioctl type 0xE7: free in Documentation/userspace-api/ioctl/ioctl-number.rst
 * of Linux 6.1 and used by no _IO* definition of that tree ('k', the old
 * choice, is spidev's, kyro's and hsi_char's).
 */

/* Set up the workspace of this open file; once per open. */
struct kvmem_ioc_setup {
	__s32 pages_fd;		/* the workspace's pages file (read; read-write unless RDONLY) */
	__s32 sums_fd;		/* its sums file: XXH3-64 per page (formats.md) */
	__u32 page_bytes;	/* bytes a page's checksum covers */
	__u32 page_stride;	/* page_bytes rounded up to KVMEM_IO_ALIGN */
	__u32 n_layers;		/* L: page id = block * L + layer */
	__s32 numa_node;	/* node of the window's memory; -1: the faulting CPU's */
	__u64 page_count;	/* pages in the file now, a multiple of L */
	__u64 page_max;		/* pages the table and window are sized for; 0: page_count */
	__u64 host_cap;		/* bytes of window memory the module may keep resident */
	__u32 flags;		/* KVMEM_SETUP_* */
	__u32 reserved0;	/* zero */
	__u64 reserved[4];	/* zero */
};

#define KVMEM_SETUP_RDONLY	0x1u	/* files read-only: the window cannot be mapped writable */
#define KVMEM_SETUP_FLAGS	KVMEM_SETUP_RDONLY

/* A list of page ids, for prefetch, claim, filled, evict. */
struct kvmem_ioc_pages {
	__u64 pages;		/* user pointer to n_pages __u64 page ids, each < page_count */
	__u64 status;		/* user pointer to n_pages __s32 results, or 0 (see each ioctl) */
	__u32 n_pages;		/* 1 .. KVMEM_IOC_PAGES_MAX */
	__u32 flags;		/* KVMEM_PAGES_* allowed for that ioctl */
	__u64 reserved;		/* zero */
};

#define KVMEM_IOC_PAGES_MAX	65536u
#define KVMEM_PAGES_WAIT	0x1u	/* PREFETCH: return when every fill has ended */
#define KVMEM_PAGES_VERIFY	0x2u	/* FILLED: check each page against its checksum */
/* FILLED: the fill failed (a read's error, a short read): drop each page as
 * a read error; not with VERIFY.
 */
#define KVMEM_PAGES_FAILED	0x4u

/* Counters of one workspace since setup. */
struct kvmem_ioc_stats {
	__u64 faults;		/* window faults handled */
	__u64 hits;		/* faults and prefetches that found the page resident */
	__u64 fills;		/* pages read from the pages file */
	__u64 fill_bytes;
	__u64 fill_ns;		/* time fills took, summed */
	__u64 user_fills;	/* pages filled by userspace (CLAIM + FILLED) */
	__u64 prefetches;	/* pages asked for by PREFETCH */
	__u64 evictions;	/* pages dropped by reclaim or EVICT */
	__u64 writebacks;	/* dirty pages written to the pages file */
	__u64 read_errors;	/* fills that failed: I/O error or short read */
	__u64 checksum_errors;	/* fills whose bytes did not match the sums file */
	__u64 write_errors;	/* write-backs that failed */
	__u64 verdicts;		/* reclaim verdicts a BPF program gave and the module took */
	__u64 bad_verdicts;	/* verdicts refused (out of range): the default was used */
	__u64 resident;		/* pages resident now */
	__u64 slots;		/* host_cap / page_stride */
	__u64 prefetch_adds;	/* pages a BPF program added to prefetches (prefetch hook) */
	__u64 bad_prefetch_adds; /* pages it named that were refused (past page_count) */
	__u64 reserved[6];
};

/*
 * The engine's selection of a step (HINT): the pages of the blocks the next
 * view holds, then their runners-up (the best of the rest), with the step
 * they are for. They hold while the workspace's step is that step: reclaim
 * lets a selected page go last (then a runner-up), the BPF hooks see them
 * (kvmem_reclaim_ctx.hint[], the prefetch hook with reason HINT), and with
 * KVMEM_HINT_PREFETCH the absent selected pages are prefetched by the
 * module. A new HINT replaces the last one.
 */
struct kvmem_ioc_hint {
	__u64 step;		/* the step: the workspace's step from now on (as STEP) */
	__u64 pages;		/* user pointer to n_pages __u64 page ids, each < page_count */
	__u32 n_pages;		/* 0 .. KVMEM_IOC_PAGES_MAX (0: no hint for this step) */
	__u32 n_selected;	/* the first n_selected ids are the view's; <= n_pages */
	__u32 flags;		/* KVMEM_HINT_* */
	__u32 reserved0;	/* zero */
	__u64 reserved[2];	/* zero */
};

#define KVMEM_HINT_PREFETCH	0x1u	/* prefetch the absent selected pages */
#define KVMEM_HINT_FLAGS	KVMEM_HINT_PREFETCH

/* A page's hint for the workspace's step (kvmem_reclaim_ctx.hint[]). */
#define KVMEM_HINTED_NONE	0u
#define KVMEM_HINTED_RUNNER_UP	1u	/* a runner-up of the step's selection */
#define KVMEM_HINTED_SELECTED	2u	/* in the step's view */

/*
 * The GPU tier (GPU): where the engine's GPU pool holds copies of pages, so
 * the table shows three tiers. For each page id, slots[i] is its GPU slot
 * (written to kvmem_pte.gpu_slot, KVMEM_TIER_GPU set) or KVMEM_SLOT_NONE
 * (it left the GPU: both cleared). The module only records it: its reclaim
 * and fills are about the host copy, which may come and go meanwhile.
 */
struct kvmem_ioc_gpu {
	__u64 pages;		/* user pointer to n_pages __u64 page ids, each < page_count */
	__u64 slots;		/* user pointer to n_pages __u32 GPU slots or KVMEM_SLOT_NONE */
	__u32 n_pages;		/* 1 .. KVMEM_IOC_PAGES_MAX */
	__u32 flags;		/* zero */
	__u64 reserved;		/* zero */
};

/*
 * SETUP	set up (EBUSY when done before; EINVAL on any bad field)
 * PREFETCH	fill pages asynchronously; status unused; flags WAIT
 * CLAIM	take absent pages for userspace to fill: status[i] = 1 when page i
 *		was claimed (zeroed, mapped without a fill until FILLED), 0 when
 *		it was resident or being filled already
 * FILLED	userspace finished filling claimed pages; flags VERIFY;
 *		status[i] = 0 or -EBADMSG (page dropped, marked BAD); flag
 *		FAILED instead: its fill failed, status[i] = -EIO, each page
 *		dropped and marked BAD, counted in read_errors
 * EVICT	drop pages now (dirty ones are written back first); status[i] =
 *		0, -EBUSY (pinned by get_user_pages or in use) or -errno
 * SYNC		write back every dirty page, then fsync the pages and sums files
 * STEP		the agent step: recorded in last_step, given to the BPF hooks
 *		(struct kvmem_reclaim_ctx, struct kvmem_prefetch_ctx) and to
 *		the tracepoint kvmem_step (argument: __u64)
 * SET_COUNT	grow page_count (argument: __u64, a multiple of L, <= page_max)
 * STATS	read struct kvmem_ioc_stats
 * HINT		the step's selection (struct kvmem_ioc_hint, above): sets the step
 * GPU		record pages' GPU slots in the table (struct kvmem_ioc_gpu, above)
 */
#define KVMEM_IOC_MAGIC		0xE7
#define KVMEM_IOC_SETUP		_IOW(KVMEM_IOC_MAGIC, 1, struct kvmem_ioc_setup)
#define KVMEM_IOC_PREFETCH	_IOW(KVMEM_IOC_MAGIC, 2, struct kvmem_ioc_pages)
#define KVMEM_IOC_CLAIM		_IOW(KVMEM_IOC_MAGIC, 3, struct kvmem_ioc_pages)
#define KVMEM_IOC_FILLED	_IOW(KVMEM_IOC_MAGIC, 4, struct kvmem_ioc_pages)
#define KVMEM_IOC_EVICT		_IOW(KVMEM_IOC_MAGIC, 5, struct kvmem_ioc_pages)
#define KVMEM_IOC_SYNC		_IO(KVMEM_IOC_MAGIC, 6)
#define KVMEM_IOC_STEP		_IOW(KVMEM_IOC_MAGIC, 7, __u64)
#define KVMEM_IOC_SET_COUNT	_IOW(KVMEM_IOC_MAGIC, 8, __u64)
#define KVMEM_IOC_STATS		_IOR(KVMEM_IOC_MAGIC, 9, struct kvmem_ioc_stats)
#define KVMEM_IOC_HINT		_IOW(KVMEM_IOC_MAGIC, 10, struct kvmem_ioc_hint)
#define KVMEM_IOC_GPU		_IOW(KVMEM_IOC_MAGIC, 11, struct kvmem_ioc_gpu)

/*
 * mmap offsets of the two mappings (MAP_SHARED only).
 * PAGE_TABLE: struct kvmem_pt_header, then page_max struct kvmem_pte, read-only.
 * PAGE_WINDOW: page id p at byte p * page_stride; any part of
 * [0, page_max * page_stride) may be mapped, at its own offset.
 */
#define KVMEM_MMAP_PAGE_TABLE	0x0ull
#define KVMEM_MMAP_PAGE_WINDOW	0x100000000ull

/*
 * The reclaim verdict: the buffer of the writable tracepoint kvmem_reclaim
 * (DECLARE_TRACE_WRITABLE; a BPF program attaches with SEC("raw_tp.w/kvmem_reclaim")
 * and gets a pointer to this struct as its only argument). The module fills
 * the candidates in its own order (clock order: candidate 0 is its choice)
 * and sets verdict to KVMEM_VERDICT_DEFAULT; a program may set verdict to the
 * index of the candidate to evict. Anything else but DEFAULT is refused and
 * the module evicts candidate 0 (counted in bad_verdicts). Candidates the
 * step's selection names (HINT) come after the others, runners-up before
 * selected pages, each group in clock order.
 */
#define KVMEM_RECLAIM_MAX	8
#define KVMEM_VERDICT_DEFAULT	0xffffffffu
struct kvmem_reclaim_ctx {
	__u64 ws_id;		/* inode number of the workspace's pages file */
	__u64 step;		/* the workspace's step (KVMEM_IOC_STEP) */
	__u32 n_candidates;	/* 1 .. KVMEM_RECLAIM_MAX */
	__u32 verdict;		/* in: DEFAULT; out: an index < n_candidates */
	__u64 page[KVMEM_RECLAIM_MAX];		/* page ids */
	__u64 last_step[KVMEM_RECLAIM_MAX];	/* step of the page's last fault */
	__u32 access_count[KVMEM_RECLAIM_MAX];	/* the page's faults */
	__u32 dirty[KVMEM_RECLAIM_MAX];		/* 1: evicting it writes it back first */
	__u32 hint[KVMEM_RECLAIM_MAX];		/* KVMEM_HINTED_* for the step */
};

/*
 * The prefetch hook: the buffer of the writable tracepoint
 * kvmem_prefetch_hook (SEC("raw_tp.w/kvmem_prefetch_hook")). The module
 * calls it for each PREFETCH list (reason LIST; page[] holds the list's
 * first ids) and for each fault that fills a page (reason FAULT; page[0] is
 * that page), with the workspace's step. A program may name up to
 * KVMEM_PREFETCH_ADD_MAX more pages to prefetch: add[0 .. n_add). Each id
 * below page_count is prefetched after the list (for a fault: as a list of
 * its own, asynchronously), in that order (stats prefetch_adds); an id past
 * page_count is refused (bad_prefetch_adds), and so is every one when n_add
 * is above the maximum.
 */
#define KVMEM_PREFETCH_SEEN	8
#define KVMEM_PREFETCH_ADD_MAX	16
#define KVMEM_PREFETCH_LIST	0u	/* a PREFETCH list */
#define KVMEM_PREFETCH_FAULT	1u	/* a fault that fills page[0] */
#define KVMEM_PREFETCH_HINT	2u	/* a HINT's selected pages (KVMEM_HINT_PREFETCH) */
struct kvmem_prefetch_ctx {
	__u64 ws_id;		/* inode number of the workspace's pages file */
	__u64 step;		/* the workspace's step (KVMEM_IOC_STEP) */
	__u64 page_count;	/* valid page ids are below it */
	__u32 reason;		/* KVMEM_PREFETCH_LIST, _FAULT or _HINT */
	__u32 n_pages;		/* ids in the list (1 for a fault) */
	__u64 page[KVMEM_PREFETCH_SEEN];	/* its first min(n_pages, 8) ids */
	__u32 n_add;		/* in: 0; out: entries of add[] to prefetch too */
	__u32 reserved;		/* zero */
	__u64 add[KVMEM_PREFETCH_ADD_MAX];	/* out: page ids */
};

#endif

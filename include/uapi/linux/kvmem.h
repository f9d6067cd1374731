/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * kvmem uapi: what the userspace pager and the kernel module (/dev/kvmem)
 * share. Usable from kernel C and from userspace C11.
 *
 * The page table is an array of fixed-size entries, one per page, indexed by
 * page id. A page is the KV of one block in one layer (raw K then V, see
 * Documentation/pager.md); page id = block * n_layers + layer. The kernel
 * module will expose the same array read-only through mmap, preceded by one
 * struct kvmem_pt_header, so residency can be read with no system call.
 *
 * Versioning: KVMEM_PT_VERSION changes whenever the layout of an entry or the
 * meaning of a field changes; readers check header.version and
 * header.entry_size and refuse what they do not know.
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
#define KVMEM_PT_VERSION	1u

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
	__u16 reserved;		/* zero */
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
#else
_Static_assert(sizeof(struct kvmem_pte) == 32, "kvmem_pte must stay 32 bytes");
_Static_assert(sizeof(struct kvmem_pt_header) == 64, "kvmem_pt_header must stay 64 bytes");
#endif

/* Direct I/O alignment of every page and extent in the workspace files. */
#define KVMEM_IO_ALIGN	4096u

/* ---- /dev/kvmem ioctls (the kernel module; not implemented yet) -------- */

/* Set up a workspace: the pages file, the page geometry and the host cap. */
struct kvmem_ioc_setup {
	__s32 backing_fd;	/* the workspace's pages file, opened O_RDWR */
	__u32 page_stride;	/* bytes per page in the file, multiple of KVMEM_IO_ALIGN */
	__u64 page_count;	/* pages in the file */
	__u64 host_cap;		/* bytes of host memory the module may keep resident */
	__s32 numa_node;	/* -1: local */
	__u32 n_layers;
};

/* Ask for pages ahead of use; the fill completes asynchronously. */
struct kvmem_ioc_prefetch {
	__u64 pages;		/* user pointer to __u64 page ids */
	__u32 n_pages;
	__u32 flags;		/* zero */
};

#define KVMEM_IOC_MAGIC		'k'
#define KVMEM_IOC_SETUP		_IOW(KVMEM_IOC_MAGIC, 1, struct kvmem_ioc_setup)
#define KVMEM_IOC_PREFETCH	_IOW(KVMEM_IOC_MAGIC, 2, struct kvmem_ioc_prefetch)

/* mmap offsets of the two mappings. */
#define KVMEM_MMAP_PAGE_TABLE	0x0ull
#define KVMEM_MMAP_PAGE_WINDOW	0x100000000ull

#endif

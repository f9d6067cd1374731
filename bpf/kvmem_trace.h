/* SPDX-License-Identifier: MIT */
/*
 * What every kvmem BPF tool shares between its BPF half and its userspace
 * half: tier numbering, the per-process workspace record and histogram
 * sizes. Included by BPF C (after vmlinux.h) and by userspace C (after
 * <linux/types.h>); only __u32/__u64 types, no libc.
 *
 * Sources of events (see Documentation/observability.md):
 *  - the userspace pager's USDT probes, provider "kvmem" (user/pager/probes.h),
 *    in build/kvmem (libkvmem linked statically) or in libkvmem.so;
 *  - the kernel module's tracepoints, subsystem "kvmem" (kvmem_tp.h).
 */
#ifndef KVMEM_BPF_TRACE_H
#define KVMEM_BPF_TRACE_H

/*
 * Tier bits as the probes pass them: the uapi's KVMEM_TIER_GPU/HOST/NVME
 * (include/uapi/linux/kvmem.h; the userspace halves check they agree), and
 * 0 for memory outside the tiers (the stage-out buffer, a dropped copy).
 */
#define KT_TIER_NONE	0u
#define KT_TIER_GPU	1u
#define KT_TIER_HOST	2u
#define KT_TIER_NVME	4u

/* A tier as a dense index 0..3 (none, GPU, host, NVMe), so a move from
 * tier a to tier b is cell KT_MOVE(a, b). */
#define KT_TIERS	4u
#define KT_MOVES	(KT_TIERS * KT_TIERS)
#define KT_TIER_IDX(t)	((t) == KT_TIER_NVME ? 3u : (__u32)((t) & 3u))
#define KT_MOVE(from, to) (KT_TIER_IDX(from) * KT_TIERS + KT_TIER_IDX(to))

/* The workspace a process works on, from the open probe. id: inode of the
 * workspace directory (0: unknown, the process opened it before the tool
 * attached); dir: the path as the process gave it, cut to fit. */
#define KT_DIR_LEN	112
struct kt_workspace {
	__u64 id;
	__u32 layers;		/* pages per block: page = block * layers + layer */
	__u32 page_bytes;
	char dir[KT_DIR_LEN];
};

/* log2 histograms: slot i counts values in [2^i, 2^(i+1)) of the unit;
 * slot 0 also counts 0. */
#define KT_MAX_SLOTS	32

#endif

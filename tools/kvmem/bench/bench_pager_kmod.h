/* SPDX-License-Identifier: MIT */
/*
 * What kvmem bench pager shares with its page-in through the kernel module
 * (--pager kmod, bench_pager_kmod.c): the random page order both page-ins
 * use, and the module's page-in itself.
 */
#ifndef KVMEM_TOOLS_BENCH_PAGER_KMOD_H
#define KVMEM_TOOLS_BENCH_PAGER_KMOD_H

#include <stdint.h>

#include <linux/kvmem.h>

/* 0 .. n-1 in a fixed random order (the same every run), malloc'd; NULL
 * when out of memory. */
uint64_t *bench_pager_order(uint64_t n);

/*
 * Page-in of the workspace in dir (committed by the pager) through the
 * module, as the kmod page source does it: `batch` pages at a time in the
 * order given, each batch filled by io_uring O_DIRECT reads straight into
 * the module's window (kvmem_kmod_fill) and then got (kvmem_kmod_get: the
 * pages mapped); the window holds two batches, so the module's reclaim
 * makes room. Where the file system takes no O_DIRECT the module reads
 * the pages itself (the get faults them in). bps: page bytes a second;
 * st: the module's counters at the end. 0, or -errno with the message set.
 */
int bench_kmod_page_in(const char *dir, uint64_t page, const uint64_t *order, uint64_t n_pages,
		       int batch, double *bps, struct kvmem_ioc_stats *st);

#endif

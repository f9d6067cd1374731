/* SPDX-License-Identifier: MIT */
/*
 * The client of the kernel module kvmem.ko (/dev/kvmem): a workspace's pages
 * served through a window the module fills on fault, with the page table
 * readable without system calls. Documentation/kmod.md describes the module,
 * its ABI (include/uapi/linux/kvmem.h) and what happens on each error.
 *
 * One kvmem_kmod is one open of /dev/kvmem, set up over a workspace's pages
 * and sums files, with the page table and the whole window mapped. A page
 * source sits on it with three calls: kvmem_kmod_get (a page's bytes by
 * page id, resident on return), kvmem_kmod_prefetch (a list, asynchronous)
 * and kvmem_kmod_sync (written pages to disk).
 *
 * Functions return 0 (or a count) on success and a negative errno value on
 * failure, with kvmem_last_error() naming the device, the page and what is
 * wrong. Calls on one kvmem_kmod may come from several threads: the module
 * serialises what needs it.
 */
#ifndef KVMEM_KMOD_H
#define KVMEM_KMOD_H

#include <stddef.h>
#include <stdint.h>

#include <linux/kvmem.h>

#include "kvmem/pager.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with -fvisibility=hidden: what is declared here is its API. */
#pragma GCC visibility push(default)

typedef struct kvmem_kmod kvmem_kmod;

#define KVMEM_KMOD_RDONLY	0x1	/* open the files read-only; the window is read-only */

typedef struct kvmem_kmod_opts {
	const char *dev;	/* NULL: /dev/kvmem */
	uint64_t host_cap;	/* bytes the module may keep resident; 0: 256 MiB */
	int numa_node;		/* node of the window's memory; -1: local */
	uint64_t page_max;	/* pages the window is sized for; 0: the pages present */
	int flags;		/* KVMEM_KMOD_* */
} kvmem_kmod_opts;

void kvmem_kmod_opts_default(kvmem_kmod_opts *o);

/* The files and geometry of a workspace, for kvmem_kmod_open. */
typedef struct kvmem_kmod_files {
	int pages_fd, sums_fd;	/* the module reopens them; the caller keeps its fds */
	uint32_t page_bytes;	/* bytes a page's checksum covers */
	uint32_t page_stride;	/* page_bytes rounded up to KVMEM_IO_ALIGN */
	uint32_t n_layers;	/* page id = block * n_layers + layer */
	uint64_t page_count;	/* pages in the file, a multiple of n_layers */
} kvmem_kmod_files;

/* 0 when the device opens here (dev NULL: /dev/kvmem): the module is loaded
 * and this process may use it. -ENODEV when the module is not loaded,
 * -EACCES or -EPERM when this process may not open it. */
int kvmem_kmod_probe(const char *dev);

/* Open the device, set it up over f and map the table and the window.
 * -ENODEV when the device is absent: the kernel module is not loaded. */
int kvmem_kmod_open(const kvmem_kmod_files *f, const kvmem_kmod_opts *o, kvmem_kmod **out);
/*
 * The same over a workspace directory: its manifest gives the geometry and
 * the committed pages (Documentation/formats.md); the files are opened under
 * the directory's descriptor and never through a symbolic link (-EBADMSG
 * naming one that is not a regular file). A writable open is the
 * workspace's writer and holds DIR/lock until close (-EBUSY while a pager
 * writes it); a KVMEM_KMOD_RDONLY open is a reader and takes no lock.
 */
int kvmem_kmod_open_workspace(const char *dir, const kvmem_kmod_opts *o, kvmem_kmod **out);
/*
 * The same over the workspace a pager of this process has open (p holds
 * the writer's lock): a reader of the pages p's last commit covers, opened
 * read-only (KVMEM_KMOD_RDONLY is implied), taking no lock of its own. The
 * window is sized for o->page_max pages (0: the committed ones), which may
 * be 0 when nothing is committed yet; kvmem_kmod_set_count follows later
 * commits. This is what the kmod page source sits on (kvmem/store.h).
 */
int kvmem_kmod_open_pager(kvmem_pager *p, const kvmem_kmod_opts *o, kvmem_kmod **out);
/* Unmap and close: the module writes back dirty pages and frees the rest.
 * Use kvmem_kmod_sync first to know the write-back worked. */
void kvmem_kmod_close(kvmem_kmod *k);

int kvmem_kmod_fd(const kvmem_kmod *k);
uint64_t kvmem_kmod_pages(const kvmem_kmod *k);		/* page_count now */
uint32_t kvmem_kmod_page_bytes(const kvmem_kmod *k);
uint32_t kvmem_kmod_page_stride(const kvmem_kmod *k);

/* The shared page table (read-only; the module writes it): header, and the
 * entry of a page (NULL past page_max). No system call. Fields read one at
 * a time through kvmem_kmod_pte may belong to different moments; for a
 * consistent copy of a whole entry use kvmem_kmod_pte_read (it retries
 * while the module changes the entry: the entry's sequence count, uapi
 * kvmem.h). kvmem_kmod_pte_read returns 0, or -EINVAL past page_max. */
const struct kvmem_pt_header *kvmem_kmod_table(const kvmem_kmod *k);
const struct kvmem_pte *kvmem_kmod_pte(const kvmem_kmod *k, uint64_t page);
int kvmem_kmod_pte_read(const kvmem_kmod *k, uint64_t page, struct kvmem_pte *out);
/* 1 when the page is in host memory now (KVMEM_TIER_HOST). */
int kvmem_kmod_resident(const kvmem_kmod *k, uint64_t page);

/* The window: page p at base + p * page_stride. Touching an absent page
 * faults it in; a page that cannot be read raises SIGBUS at the touch. */
void *kvmem_kmod_window(const kvmem_kmod *k, size_t *len);
void *kvmem_kmod_page_addr(const kvmem_kmod *k, uint64_t page);

/*
 * The page's bytes, resident and mapped on return (MADV_POPULATE_READ, so
 * a failure is an error code, not a signal): -EBADMSG when the page does not
 * match its checksum, -EIO when it cannot be read, -EINVAL past the last
 * page. The pointer stays valid; if reclaim takes the page later, the next
 * touch faults it in again.
 */
int kvmem_kmod_get(kvmem_kmod *k, uint64_t page, const void **out);

/* Ask for pages ahead of use (any number; sent in lists of
 * KVMEM_IOC_PAGES_MAX). wait: return when every fill has ended. */
int kvmem_kmod_prefetch(kvmem_kmod *k, const uint64_t *pages, size_t n, int wait);

/*
 * Userspace fills (e.g. io_uring O_DIRECT reads straight into the window):
 * claim takes absent pages (claimed[i] = 1: fill page i, zeroed and mapped
 * without a fill; 0: it is resident or on its way, do not write it), then
 * filled says they are complete (verify: the module checks each against the
 * sums file; status[i] = 0 or -EBADMSG, the page dropped). Returns the
 * number claimed, or the first error.
 */
int kvmem_kmod_claim(kvmem_kmod *k, const uint64_t *pages, size_t n, int32_t *claimed);
int kvmem_kmod_filled(kvmem_kmod *k, const uint64_t *pages, size_t n, int verify,
		      int32_t *status);

/*
 * Fill pages without a copy: claim the absent ones, read them with io_uring
 * O_DIRECT from the pages file straight into the window, and hand them back
 * with FILLED and VERIFY (user/kmod/kmod_fill.c). Returns when every read
 * has ended. status[i] (may be NULL): 1 filled by this call, 0 resident or
 * on its way already (left alone), or -errno: -ENOMEM no slot could be
 * claimed, -EIO (or the read's error) the read failed or was short,
 * -EBADMSG the bytes do not match the checksum; a page that failed is
 * absent again, and kvmem_kmod_get reads it through the module (and says
 * what is wrong with it). Returns the number filled, or the first error;
 * -EINVAL, nothing done, when a page is past the last one.
 * -ENOTSUP when this open has no O_DIRECT path (kvmem_kmod_direct 0: the
 * file system refuses O_DIRECT, e.g. tmpfs): nothing is done.
 */
int kvmem_kmod_fill(kvmem_kmod *k, const uint64_t *pages, size_t n, int32_t *status);
/*
 * The same, the reads left going while the caller works: claims and
 * submits, and returns the number claimed (or the error when none was).
 * kvmem_kmod_fill_wait ends them (and hands the pages back): the number
 * filled, or the first page's error; so do the next kvmem_kmod_fill,
 * kvmem_kmod_get (before it hands out any page) and close. Until then a
 * started page reads as zeros through the window: touch it only after.
 */
int kvmem_kmod_fill_start(kvmem_kmod *k, const uint64_t *pages, size_t n);
int kvmem_kmod_fill_wait(kvmem_kmod *k);
/* 1 when kvmem_kmod_fill can read into the window here. */
int kvmem_kmod_direct(const kvmem_kmod *k);

/* Drop pages now (dirty ones written back first); status[i] (may be NULL):
 * 0, -EBUSY (pinned or in transit) or the write-back's error. */
int kvmem_kmod_evict(kvmem_kmod *k, const uint64_t *pages, size_t n, int32_t *status);
/* Write back every dirty page and fsync the pages and sums files. */
int kvmem_kmod_sync(kvmem_kmod *k);
/* The agent step recorded in each entry's last_step from now on. */
int kvmem_kmod_step(kvmem_kmod *k, uint64_t step);
/*
 * The step's selection (KVMEM_IOC_HINT): pages[0 .. n_selected) are the
 * next view's, the rest their runners-up; the module's step becomes step.
 * Until the step changes, reclaim lets selected pages go last (then the
 * runners-up) and the BPF hooks see them; KVMEM_KMOD_HINT_PREFETCH: the
 * module prefetches the absent selected pages. At most
 * KVMEM_IOC_PAGES_MAX pages are passed (the first ones). A new hint
 * replaces the last.
 */
#define KVMEM_KMOD_HINT_PREFETCH 0x1
int kvmem_kmod_hint(kvmem_kmod *k, uint64_t step, const uint64_t *pages, size_t n,
		    size_t n_selected, int flags);
/*
 * The GPU tier (KVMEM_IOC_GPU): page pages[i] is in the engine's GPU pool at
 * slots[i], or left it (KVMEM_SLOT_NONE). The module writes it into the
 * table (gpu_slot, KVMEM_TIER_GPU) for the table's readers and the
 * tracepoint kvmem_gpu; nothing else changes. Lists longer than
 * KVMEM_IOC_PAGES_MAX go in several ioctls; an error stops at that ioctl
 * (the earlier ones are recorded).
 */
int kvmem_kmod_gpu(kvmem_kmod *k, const uint64_t *pages, const uint32_t *slots, size_t n);
/* The file grew (appended blocks): pages [old count, pages) become valid. */
int kvmem_kmod_set_count(kvmem_kmod *k, uint64_t pages);
int kvmem_kmod_stats(kvmem_kmod *k, struct kvmem_ioc_stats *st);

/* The candidate index the module evicts for a reclaim verdict: the
 * program's choice when valid, else 0 (the module's own). */
uint32_t kvmem_kmod_verdict_pick(const struct kvmem_reclaim_ctx *c);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif

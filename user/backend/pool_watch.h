/* SPDX-License-Identifier: MIT */
/*
 * Who hears about a device page pool (private to the library): the pages
 * of a (region, owner) pair entering and leaving a backend's pool, for the
 * session to forward to its source (kvmem_page_source_ops.device), so a
 * store shows which pages a GPU holds. Any backend with a pool keeps one
 * of these, notes each page that enters or leaves, and flushes at the end
 * of the call that changed it (place, unregister): the notes of one call
 * reach the watcher as a few lists, not a page at a time.
 *
 * Not thread-safe: a backend's calls come from one thread at a time.
 */
#ifndef KVMEM_BACKEND_POOL_WATCH_H
#define KVMEM_BACKEND_POOL_WATCH_H

#include <stdint.h>

#include "backend/backend_impl.h"

/* Notes a watch keeps before it flushes by itself. */
#define KVMEM_POOL_WATCH_BATCH 256

struct kvmem_pool_watch {
	const void *region;
	uint32_t owner;
	kvmem_pool_report_fn fn;
	void *arg;
	int n;				/* notes pending */
	kvmem_device_page pend[KVMEM_POOL_WATCH_BATCH];
};

typedef struct kvmem_pool_watches {
	struct kvmem_pool_watch *w;
	size_t n, cap;
} kvmem_pool_watches;

/* Report (region, owner)'s pages to fn(arg, ...) from now on, replacing a
 * watch of that pair (its pending notes go to the old fn first); fn NULL
 * ends it. 0, or -ENOMEM with a message. */
int kvmem_pool_watch_set(kvmem_pool_watches *ws, const void *region, uint32_t owner,
			 kvmem_pool_report_fn fn, void *arg);
/* Page (block, layer) of (region, owner) entered the pool at slot, or left
 * it (KVMEM_DEVICE_NONE). Nothing when nobody watches that pair. */
void kvmem_pool_note(kvmem_pool_watches *ws, const void *region, uint32_t owner, int64_t block,
		     int layer, uint32_t slot);
/* Hand every watch's pending notes to its fn. */
void kvmem_pool_flush(kvmem_pool_watches *ws);
/* Flush, then forget every watch. */
void kvmem_pool_watches_free(kvmem_pool_watches *ws);

#endif

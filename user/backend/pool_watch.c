// SPDX-License-Identifier: MIT
/* Who hears about a device page pool: see pool_watch.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend/pool_watch.h"
#include "kvmem/kvmem.h"
#include "util/grow.h"

static struct kvmem_pool_watch *find(kvmem_pool_watches *ws, const void *region, uint32_t owner)
{
	for (size_t i = 0; i < ws->n; i++)
		if (ws->w[i].region == region && ws->w[i].owner == owner)
			return &ws->w[i];
	return NULL;
}

static void flush_one(struct kvmem_pool_watch *w)
{
	int n = w->n;

	/* Cleared first: the watcher may call into the backend again. */
	w->n = 0;
	if (n)
		w->fn(w->arg, w->pend, n);
}

int kvmem_pool_watch_set(kvmem_pool_watches *ws, const void *region, uint32_t owner,
			 kvmem_pool_report_fn fn, void *arg)
{
	struct kvmem_pool_watch *w = find(ws, region, owner);

	if (w) {
		flush_one(w);
		if (fn) {
			w->fn = fn;
			w->arg = arg;
		} else {
			*w = ws->w[--ws->n];
		}
		return 0;
	}
	if (!fn)
		return 0;
	if (kvmem_grow(&ws->w, sizeof(*ws->w), ws->n + 1, &ws->cap, 2))
		return kvmem_error(ENOMEM, "device page pool: out of memory for %zu watches",
				   ws->n + 1);
	w = &ws->w[ws->n++];
	w->region = region;
	w->owner = owner;
	w->fn = fn;
	w->arg = arg;
	w->n = 0;
	return 0;
}

void kvmem_pool_note(kvmem_pool_watches *ws, const void *region, uint32_t owner, int64_t block,
		     int layer, uint32_t slot)
{
	struct kvmem_pool_watch *w;

	if (!ws->n || !(w = find(ws, region, owner)))
		return;
	if (w->n == KVMEM_POOL_WATCH_BATCH)
		flush_one(w);
	w->pend[w->n++] = (kvmem_device_page){ .block = block, .layer = layer, .slot = slot };
}

void kvmem_pool_flush(kvmem_pool_watches *ws)
{
	for (size_t i = 0; i < ws->n; i++)
		flush_one(&ws->w[i]);
}

void kvmem_pool_watches_free(kvmem_pool_watches *ws)
{
	kvmem_pool_flush(ws);
	free(ws->w);
	memset(ws, 0, sizeof(*ws));
}

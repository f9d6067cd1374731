// SPDX-License-Identifier: GPL-2.0
/*
 * Prefetch: PREFETCH lists go, checked, to a per-workspace queue that one
 * work item on the module's workqueue fills in order (a hint: failures are
 * counted, nobody waits for them unless the caller asked to). The prefetch
 * hook, the writable tracepoint kvmem_prefetch_hook, lets a BPF program add
 * up to KVMEM_PREFETCH_ADD_MAX pages to each list and to each fault that
 * fills a page (a fault's additions become a list of their own).
 */
#include <linux/mm.h>
#include <linux/slab.h>

#include "kvmem_int.h"
#include "kvmem_trace.h"

/*
 * Ask a program on kvmem_prefetch_hook for more pages (none attached: no
 * cost but the static key). The ids it names below page_count go to out[]
 * (room for KVMEM_PREFETCH_ADD_MAX), the others are refused; returns how
 * many. ws->lock held.
 */
static u32 run_hook(struct kvmem_ws *ws, u32 reason, const u64 *ids, u32 n, u64 *out)
{
	struct kvmem_prefetch_ctx ctx = {
		.ws_id = ws->ws_id, .step = ws->step, .page_count = ws->page_count,
		.reason = reason, .n_pages = n,
	};
	u32 i, added = 0;

	if (!trace_kvmem_prefetch_hook_enabled())
		return 0;
	for (i = 0; i < n && i < KVMEM_PREFETCH_SEEN; i++)
		ctx.page[i] = ids[i];
	trace_kvmem_prefetch_hook(&ctx);
	if (ctx.n_add > KVMEM_PREFETCH_ADD_MAX) {
		ws->stats.bad_prefetch_adds += KVMEM_PREFETCH_ADD_MAX;
		return 0;
	}
	for (i = 0; i < ctx.n_add; i++) {
		if (ctx.add[i] < ws->page_count)
			out[added++] = ctx.add[i];
		else
			ws->stats.bad_prefetch_adds++;
	}
	ws->stats.prefetch_adds += added;
	return added;
}

/*
 * PREFETCH, once the list b (n ids, room for KVMEM_PREFETCH_ADD_MAX more)
 * was checked: the hook may extend it (told why: a PREFETCH list, or a
 * HINT's selected pages), then it joins the queue; with wait, return when
 * the queue is done. The batch belongs to the worker once
 * queued (it frees it), so nothing here reads it after that.
 */
int kvmem_prefetch_list(struct kvmem_ws *ws, struct kvmem_prefetch_batch *b, bool wait,
			u32 reason)
{
	u64 first = b->ids[0];
	u32 n;

	mutex_lock(&ws->lock);
	if (ws->prefetch_queued + b->n > KVMEM_IOC_PAGES_MAX * 4) {
		mutex_unlock(&ws->lock);
		return -EAGAIN;	/* the queue is full: wait for it (WAIT) */
	}
	b->n += run_hook(ws, reason, b->ids, b->n, b->ids + b->n);
	n = b->n;
	ws->prefetch_queued += b->n;
	list_add_tail(&b->node, &ws->prefetch_list);
	mutex_unlock(&ws->lock);
	trace_kvmem_prefetch(ws->ws_id, first, n);
	kvmem_queue_prefetch(ws);
	if (wait)
		flush_work(&ws->prefetch_work);
	return 0;
}

/* A fault is about to fill page id (ws->lock held): the hook's additions
 * are queued as a list of their own. A full queue or no memory drops them.
 */
void kvmem_prefetch_on_fault(struct kvmem_ws *ws, u64 id)
{
	u64 add[KVMEM_PREFETCH_ADD_MAX];
	struct kvmem_prefetch_batch *b;
	u32 n = run_hook(ws, KVMEM_PREFETCH_FAULT, &id, 1, add);

	if (!n || ws->dying || ws->prefetch_queued + n > KVMEM_IOC_PAGES_MAX * 4)
		return;
	b = kvmalloc(struct_size(b, ids, n), GFP_KERNEL_ACCOUNT | __GFP_NOWARN);
	if (!b)
		return;
	b->n = n;
	memcpy(b->ids, add, n * sizeof(u64));
	ws->prefetch_queued += n;
	list_add_tail(&b->node, &ws->prefetch_list);
	trace_kvmem_prefetch(ws->ws_id, add[0], n);
	kvmem_queue_prefetch(ws);
}

static int prefetch_page(struct kvmem_ws *ws, u64 id)
{
	int err = 0;

	mutex_lock(&ws->lock);
	if (id < ws->page_count) {
		ws->stats.prefetches++;
		if (ws->pg[id].state == KVMEM_ABSENT) {
			err = kvmem_fill_locked(ws, id, true);
		} else if (ws->pg[id].state == KVMEM_RESIDENT) {
			ws->stats.hits++;
			trace_kvmem_hit(ws->ws_id, id);
		}
	}
	mutex_unlock(&ws->lock);
	return err;
}

void kvmem_prefetch_work(struct work_struct *work)
{
	struct kvmem_ws *ws = container_of(work, struct kvmem_ws, prefetch_work);
	struct kvmem_prefetch_batch *b;
	u32 i;

	for (;;) {
		mutex_lock(&ws->lock);
		b = list_first_entry_or_null(&ws->prefetch_list, struct kvmem_prefetch_batch, node);
		if (b) {
			list_del(&b->node);
			ws->prefetch_queued -= b->n;
		}
		mutex_unlock(&ws->lock);
		if (!b)
			return;
		for (i = 0; i < b->n && !READ_ONCE(ws->dying); i++)
			prefetch_page(ws, b->ids[i]);
		kvfree(b);
	}
}

// SPDX-License-Identifier: GPL-2.0
/*
 * HINT: the engine's selection of a step reaches the module. The pages of
 * the blocks the next view holds, then their runners-up, are marked with
 * the step they are for (two page flags plus the workspace's hint_step);
 * they count while the workspace's step is still that step, so a STEP or
 * the next HINT ends them without touching every page. Reclaim orders its
 * candidates by them (kvmem_reclaim.c), the victim hook sees them
 * (kvmem_reclaim_ctx.hint[]), and with KVMEM_HINT_PREFETCH the absent
 * selected pages join the prefetch queue through the prefetch hook
 * (reason KVMEM_PREFETCH_HINT).
 */
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "kvmem_int.h"
#include "kvmem_trace.h"

#define KVMEM_PG_HINTS	(KVMEM_PG_HINT_SEL | KVMEM_PG_HINT_RUN)

u32 kvmem_hinted(const struct kvmem_ws *ws, u64 id)
{
	u8 f = ws->pg[id].flags;

	if (ws->hint_step != ws->step)
		return KVMEM_HINTED_NONE;
	if (f & KVMEM_PG_HINT_SEL)
		return KVMEM_HINTED_SELECTED;
	return f & KVMEM_PG_HINT_RUN ? KVMEM_HINTED_RUNNER_UP : KVMEM_HINTED_NONE;
}

long kvmem_hint(struct kvmem_ws *ws, void __user *uarg)
{
	struct kvmem_prefetch_batch *b = NULL;
	struct kvmem_ioc_hint a;
	u64 *ids = NULL, *old, count;
	u32 i, n_old;

	if (copy_from_user(&a, uarg, sizeof(a)))
		return -EFAULT;
	if ((a.flags & ~KVMEM_HINT_FLAGS) || a.reserved0 || a.reserved[0] || a.reserved[1])
		return -EINVAL;
	if (a.n_pages > KVMEM_IOC_PAGES_MAX || a.n_selected > a.n_pages)
		return -EINVAL;
	if (a.n_pages) {
		ids = kvmalloc_array(a.n_pages, sizeof(u64), GFP_KERNEL_ACCOUNT);
		if (!ids)
			return -ENOMEM;
		if (copy_from_user(ids, u64_to_user_ptr(a.pages),
				   (size_t)a.n_pages * sizeof(u64))) {
			kvfree(ids);
			return -EFAULT;
		}
		count = READ_ONCE(ws->page_count);	/* it only grows */
		for (i = 0; i < a.n_pages; i++) {
			if (ids[i] >= count) {
				kvfree(ids);
				return -EINVAL;
			}
		}
	}
	if ((a.flags & KVMEM_HINT_PREFETCH) && a.n_selected) {
		b = kvmalloc(struct_size(b, ids, a.n_selected + KVMEM_PREFETCH_ADD_MAX),
			     GFP_KERNEL_ACCOUNT);
		if (!b) {
			kvfree(ids);
			return -ENOMEM;
		}
		b->n = 0;
	}

	mutex_lock(&ws->lock);
	for (i = 0; i < ws->n_hint; i++)
		ws->pg[ws->hint_ids[i]].flags &= ~KVMEM_PG_HINTS;
	old = ws->hint_ids;
	n_old = ws->n_hint;
	for (i = 0; i < a.n_pages; i++)
		ws->pg[ids[i]].flags |= i < a.n_selected ? KVMEM_PG_HINT_SEL : KVMEM_PG_HINT_RUN;
	ws->hint_ids = ids;
	ws->n_hint = a.n_pages;
	ws->hint_step = a.step;
	ws->step = a.step;
	for (i = 0; b && i < a.n_selected; i++)
		if (ws->pg[ids[i]].state == KVMEM_ABSENT)
			b->ids[b->n++] = ids[i];
	mutex_unlock(&ws->lock);
	kvfree(old);
	trace_kvmem_step(ws->ws_id, a.step, ws->n_layers);
	trace_kvmem_hint(ws->ws_id, a.step, a.n_pages, a.n_selected);
	/* A prefetch is a hint too: a full queue drops it, not the HINT. */
	if (b && (!b->n || kvmem_prefetch_list(ws, b, false, KVMEM_PREFETCH_HINT)))
		kvfree(b);
	return 0;
}

void kvmem_hint_free(struct kvmem_ws *ws)
{
	kvfree(ws->hint_ids);
	ws->hint_ids = NULL;
	ws->n_hint = 0;
}

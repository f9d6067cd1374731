// SPDX-License-Identifier: GPL-2.0
/*
 * GPU: the engine tells the module which pages its GPU pool holds, and the
 * module writes them into the shared table (gpu_slot, KVMEM_TIER_GPU) under
 * the entry's sequence count, with a tracepoint per page, so the table's
 * readers and perf/BPF tools see three tiers. The module only records it;
 * kvmem_pte_update keeps the GPU tier of an entry whatever the host copy
 * does.
 */
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "kvmem_int.h"
#include "kvmem_trace.h"

long kvmem_gpu(struct kvmem_ws *ws, void __user *uarg)
{
	struct kvmem_ioc_gpu a;
	u64 *ids, count;
	u32 *slots, i;
	long ret = 0;

	if (copy_from_user(&a, uarg, sizeof(a)))
		return -EFAULT;
	if (a.flags || a.reserved || !a.n_pages || a.n_pages > KVMEM_IOC_PAGES_MAX)
		return -EINVAL;
	ids = kvmalloc_array(a.n_pages, sizeof(*ids), GFP_KERNEL_ACCOUNT);
	slots = kvmalloc_array(a.n_pages, sizeof(*slots), GFP_KERNEL_ACCOUNT);
	if (!ids || !slots) {
		ret = -ENOMEM;
		goto out;
	}
	if (copy_from_user(ids, u64_to_user_ptr(a.pages), (size_t)a.n_pages * sizeof(*ids)) ||
	    copy_from_user(slots, u64_to_user_ptr(a.slots), (size_t)a.n_pages * sizeof(*slots))) {
		ret = -EFAULT;
		goto out;
	}
	count = READ_ONCE(ws->page_count);	/* it only grows */
	for (i = 0; i < a.n_pages; i++) {
		if (ids[i] >= count) {
			ret = -EINVAL;
			goto out;
		}
	}
	mutex_lock(&ws->lock);
	for (i = 0; i < a.n_pages; i++) {
		kvmem_pte_set_gpu(ws, ids[i], slots[i]);
		trace_kvmem_gpu(ws->ws_id, ids[i], slots[i]);
	}
	mutex_unlock(&ws->lock);
out:
	kvfree(ids);
	kvfree(slots);
	return ret;
}

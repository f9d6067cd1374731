// SPDX-License-Identifier: GPL-2.0
/*
 * The host window of a workspace: page id p lives at window offset
 * p * page_stride, in page_stride bytes of this module's own order-0 pages
 * (NUMA-placed as SETUP asked, charged to the memory cgroup of SETUP's
 * caller, never swapped: pinned while resident). A touch of an absent page
 * faults here; the fault reads the page from the pages file, checks it
 * against the sums file (XXH3-64) and maps it. One thread fills a page; the
 * others wait for that fill. A failed read or a bad checksum maps nothing:
 * the faulting access gets SIGBUS, the page is marked BAD and a later touch
 * tries again. A fault that may (FAULT_FLAG_ALLOW_RETRY) fills or waits
 * without the process's mmap lock and has the access retried.
 *
 * At most n_slots = host_cap / page_stride pages are resident. Room is made
 * by reclaim: a clock over the slots proposes up to KVMEM_RECLAIM_MAX
 * candidates, a BPF program on the writable tracepoint kvmem_reclaim may
 * pick another, the victim's ptes are zapped, and a dirty victim is written
 * back before its memory is freed. Writes through the window are tracked
 * with page_mkwrite (ptes start read-only), so only written pages go back.
 * A page somebody holds by a reference of their own (get_user_pages: an
 * O_DIRECT read into the window, a registered buffer) may be written
 * without a fault: it is not evicted, and a write-back leaves it DIRTY.
 *
 * Here: the table, slot memory, fills, userspace fills and the window's
 * vm_operations. Prefetch and its BPF hook: kvmem_prefetch.c; reclaim and
 * write-back: kvmem_reclaim.c; file I/O: kvmem_io.c. Locking and page
 * states: kvmem_int.h, Documentation/kmod.md.
 */
#include <linux/file.h>
#include <linux/ktime.h>
#include <linux/memcontrol.h>
#include <linux/mm.h>
#include <linux/pagemap.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include "kvmem_int.h"
#include "kvmem_trace.h"

/* ---- the shared page table (only this module writes it) ---------------- */

/*
 * Every change of an entry is made under ws->lock between two increments
 * of its sequence count (include/uapi/linux/kvmem.h): odd while the entry
 * changes, so a reader that sees the same even count before and after its
 * copy has a consistent entry.
 */
static void pte_begin(struct kvmem_pte *e)
{
	WRITE_ONCE(e->seq, e->seq + 1);
	smp_wmb();	/* the odd count before any field: pairs with the reader's acquire */
}

static void pte_end(struct kvmem_pte *e)
{
	smp_wmb();	/* every field before the even count: pairs with the reader's fence */
	WRITE_ONCE(e->seq, e->seq + 1);
}

/* The entry from the page's state, with gpu_slot (the GPU tier is the
 * engine's word, GPU ioctl: kept as it is by every other update).
 */
static void kvmem_pte_write(struct kvmem_ws *ws, u64 id, u32 gpu_slot)
{
	struct kvmem_pte *e = &ws->pte[id];
	struct kvmem_pg *pg = &ws->pg[id];
	u8 tiers = id < ws->page_count ? KVMEM_TIER_NVME : 0;
	u8 flags = 0;

	if (gpu_slot != KVMEM_SLOT_NONE)
		tiers |= KVMEM_TIER_GPU;

	switch (pg->state) {
	case KVMEM_RESIDENT:
	case KVMEM_WRITEBACK:
	case KVMEM_EVICTING:
		tiers |= KVMEM_TIER_HOST;
		break;
	case KVMEM_FILLING:
	case KVMEM_CLAIMED:
		flags |= KVMEM_PTE_IN_FLIGHT;
		break;
	}
	if (pg->flags & KVMEM_PG_DIRTY)
		flags |= KVMEM_PTE_DIRTY;
	if (pg->flags & KVMEM_PG_BAD)
		flags |= KVMEM_PTE_BAD;
	if (pg->flags & KVMEM_PG_PREFETCHED)
		flags |= KVMEM_PTE_PREFETCHED;
	pte_begin(e);
	WRITE_ONCE(e->host_slot, pg->slot);
	WRITE_ONCE(e->gpu_slot, gpu_slot);
	WRITE_ONCE(e->flags, flags);
	WRITE_ONCE(e->tiers, tiers);
	pte_end(e);
}

void kvmem_pte_update(struct kvmem_ws *ws, u64 id)
{
	kvmem_pte_write(ws, id, READ_ONCE(ws->pte[id].gpu_slot));
}

void kvmem_pte_set_gpu(struct kvmem_ws *ws, u64 id, u32 gpu_slot)
{
	kvmem_pte_write(ws, id, gpu_slot);
}

/* Entries [first, end): fresh pages of the file (SETUP, SET_COUNT). */
void kvmem_pte_init(struct kvmem_ws *ws, u64 first, u64 end)
{
	u64 id;

	for (id = first; id < end; id++) {
		struct kvmem_pte *e = &ws->pte[id];

		pte_begin(e);
		WRITE_ONCE(e->page_id, id);
		WRITE_ONCE(e->gpu_slot, KVMEM_SLOT_NONE);
		pte_end(e);
		ws->pg[id].slot = KVMEM_SLOT_NONE;
		kvmem_pte_update(ws, id);
		if (!(id & 4095))
			cond_resched();
	}
	WRITE_ONCE(ws->table->n_entries, ws->page_count);
}

static void pte_account(struct kvmem_ws *ws, u64 id)
{
	struct kvmem_pte *e = &ws->pte[id];

	pte_begin(e);
	if (e->access_count != U32_MAX)
		WRITE_ONCE(e->access_count, e->access_count + 1);
	WRITE_ONCE(e->last_step, ws->step);
	pte_end(e);
}

/* Every state change wakes the sleepers of ws->wq; they re-check. */
void kvmem_ws_changed(struct kvmem_ws *ws)
{
	ws->gen++;
	wake_up_all(&ws->wq);
}

/* Sleep until some page changes state. Called and returns with ws->lock
 * held; -EINTR when a fatal signal came.
 */
int kvmem_ws_wait(struct kvmem_ws *ws)
{
	u64 gen = ws->gen;
	int ret;

	mutex_unlock(&ws->lock);
	ret = wait_event_killable(ws->wq, READ_ONCE(ws->gen) != gen);
	mutex_lock(&ws->lock);
	return ret ? -EINTR : 0;
}

/* ---- slot memory --------------------------------------------------------- */

/*
 * The memory of a slot this thread owns (off the free list, not yet used):
 * npp order-0 pages charged to the workspace's cgroup, and their vmap.
 * Called without ws->lock: 16384 allocations and a vmap for a 64 MiB page.
 */
static int slot_alloc(struct kvmem_ws *ws, struct kvmem_slot *s, gfp_t extra)
{
	gfp_t gfp = KVMEM_GFP | extra;
	struct mem_cgroup *old;
	u32 i;

	if (ws->node != NUMA_NO_NODE)
		gfp |= __GFP_THISNODE;
	old = set_active_memcg(ws->memcg);
	for (i = 0; i < ws->npp; i++) {
		s->pages[i] = alloc_pages_node(ws->node, gfp, 0);
		if (!s->pages[i])
			goto fail;
		if ((i & 1023) == 1023)
			cond_resched();
	}
	s->vaddr = vmap(s->pages, ws->npp, VM_MAP, PAGE_KERNEL);
	if (!s->vaddr)
		goto fail;
	set_active_memcg(old);
	atomic_long_add(ws->npp, &kvmem_pages_held);
	return 0;
fail:
	set_active_memcg(old);
	while (i--) {
		put_page(s->pages[i]);
		s->pages[i] = NULL;
	}
	return -ENOMEM;
}

/* Drop the module's references to a slot's memory (the slot owned by this
 * thread, or the workspace going away; no lock needed). A page someone
 * still holds (a racing fault, get_user_pages) lives on until they let go.
 */
void kvmem_slot_release(struct kvmem_ws *ws, struct kvmem_slot *s)
{
	u32 i;

	if (s->vaddr) {
		vunmap(s->vaddr);
		atomic_long_sub(ws->npp, &kvmem_pages_held);
	}
	s->vaddr = NULL;
	for (i = 0; i < ws->npp; i++) {
		if (s->pages[i])
			put_page(s->pages[i]);
		s->pages[i] = NULL;
	}
}

/* Back on the free list (ws->lock held, its memory released already). */
static void slot_put_back(struct kvmem_ws *ws, u32 slot)
{
	ws->slots[slot].used = false;
	ws->free_list[ws->n_free++] = slot;
}

void kvmem_slot_free(struct kvmem_ws *ws, u32 slot)
{
	kvmem_slot_release(ws, &ws->slots[slot]);
	slot_put_back(ws, slot);
}

/*
 * References to a slot's pages beyond the module's own, one per pte that
 * maps them, and the `pins` faults that took a page and have not mapped it
 * yet: somebody else holds a page (get_user_pages or FOLL_PIN: an O_DIRECT
 * read into the window, a registered buffer) and may write it with no
 * fault. A guess while ptes come and go (a fault between unpinning and its
 * pte counts as a holder: the cautious side); kvmem_slot_held is exact.
 */
bool kvmem_slot_maybe_held(struct kvmem_ws *ws, struct kvmem_slot *s, u32 pins)
{
	long extra = 0;
	u32 i;

	for (i = 0; i < ws->npp; i++)
		extra += page_count(s->pages[i]) - 1 - kvmem_mapcount(s->pages[i]);
	return extra > pins;
}

/* The same once the slot's ptes are zapped and no fault can map it again
 * (EVICTING): any reference but the module's own is a holder.
 */
bool kvmem_slot_held(struct kvmem_ws *ws, struct kvmem_slot *s)
{
	u32 i;

	for (i = 0; i < ws->npp; i++)
		if (page_count(s->pages[i]) != 1)
			return true;
	return false;
}

/* Remove every pte of page id from every mapping of this workspace. The
 * pages are locked meanwhile, so a fault that got the page before the zap
 * either installed its pte first (zapped here) or re-checks after.
 */
void kvmem_zap_page(struct kvmem_ws *ws, u64 id, struct kvmem_slot *s)
{
	u32 i;

	for (i = 0; i < ws->npp; i++)
		lock_page(s->pages[i]);
	unmap_mapping_range(&ws->mapping, KVMEM_MMAP_PAGE_WINDOW + id * ws->page_stride,
			    ws->page_stride, 1);
	for (i = 0; i < ws->npp; i++)
		unlock_page(s->pages[i]);
}

/* ---- filling ------------------------------------------------------------- */

/*
 * Fill an ABSENT page from the pages file. Called and returns with ws->lock
 * held (dropped for the allocation and the I/O); 0: the page is RESIDENT;
 * else it is ABSENT again, and BAD (fill_errs moved on) when the read or
 * the checksum failed. No slot or no memory (-ENOMEM) and a fatal signal
 * (-EINTR) say nothing about the page.
 */
int kvmem_fill_locked(struct kvmem_ws *ws, u64 id, bool prefetch)
{
	struct kvmem_pg *pg = &ws->pg[id];
	u64 t0 = ktime_get_ns();
	struct kvmem_slot *s;
	int err, io_err = 0;
	u32 slot;

	pg->state = KVMEM_FILLING;
	kvmem_pte_update(ws, id);
	err = kvmem_slot_get(ws, &slot);
	if (err)
		goto out;
	s = &ws->slots[slot];
	pg->slot = slot;	/* shown in the table while it fills */
	ws->busy++;
	kvmem_pte_update(ws, id);
	mutex_unlock(&ws->lock);
	err = slot_alloc(ws, s, 0);
	if (!err) {
		io_err = kvmem_read_page(ws, id, s);
		err = io_err;
		if (err)
			kvmem_slot_release(ws, s);
	}
	mutex_lock(&ws->lock);
	ws->busy--;
	if (err) {
		slot_put_back(ws, slot);
		pg->slot = KVMEM_SLOT_NONE;
	}
	if (io_err) {
		pg->flags |= KVMEM_PG_BAD;
		pg->fill_errs++;
		if (io_err == -EBADMSG)
			ws->stats.checksum_errors++;
		else
			ws->stats.read_errors++;
	} else if (!err) {
		s->used = true;
		s->page = id;
		s->ref = true;
		ws->stats.fills++;
		ws->stats.fill_bytes += ws->page_stride;
		ws->stats.fill_ns += ktime_get_ns() - t0;
		ws->stats.resident++;
		pg->flags &= ~KVMEM_PG_BAD;
		if (prefetch)
			pg->flags |= KVMEM_PG_PREFETCHED;
	}
out:
	pg->state = err ? KVMEM_ABSENT : KVMEM_RESIDENT;
	if (err)
		trace_kvmem_error(ws->ws_id, id, err);
	trace_kvmem_fill_done(ws->ws_id, id, 1, err ? 0 : ws->page_stride,
			      ktime_get_ns() - t0, err);
	kvmem_pte_update(ws, id);
	kvmem_ws_changed(ws);
	return err;
}

/* CLAIM: 1 claimed (zeroed memory, mapped without a fill until FILLED),
 * 0 resident or being filled already, -errno.
 */
int kvmem_claim_page(struct kvmem_ws *ws, u64 id)
{
	struct kvmem_pg *pg = &ws->pg[id];
	struct kvmem_slot *s;
	u32 slot;
	int err;

	mutex_lock(&ws->lock);
	if (pg->state != KVMEM_ABSENT) {
		mutex_unlock(&ws->lock);
		return 0;
	}
	pg->state = KVMEM_FILLING;	/* others wait while the slot is found */
	kvmem_pte_update(ws, id);
	err = kvmem_slot_get(ws, &slot);
	if (!err) {
		s = &ws->slots[slot];
		ws->busy++;
		mutex_unlock(&ws->lock);
		err = slot_alloc(ws, s, __GFP_ZERO);
		mutex_lock(&ws->lock);
		ws->busy--;
		if (err) {
			slot_put_back(ws, slot);
		} else {
			s->used = true;
			s->page = id;
			s->ref = true;
			pg->slot = slot;
		}
	}
	pg->state = err ? KVMEM_ABSENT : KVMEM_CLAIMED;
	kvmem_pte_update(ws, id);
	kvmem_ws_changed(ws);
	mutex_unlock(&ws->lock);
	return err ? err : 1;
}

/* A claim its caller never learnt of (CLAIM could not write the status
 * array): the page goes back to ABSENT with nothing of it kept.
 */
void kvmem_unclaim_page(struct kvmem_ws *ws, u64 id)
{
	struct kvmem_pg *pg = &ws->pg[id];
	u32 slot;

	mutex_lock(&ws->lock);
	if (pg->state != KVMEM_CLAIMED) {
		mutex_unlock(&ws->lock);
		return;
	}
	slot = pg->slot;
	pg->state = KVMEM_EVICTING;
	ws->busy++;
	kvmem_pte_update(ws, id);
	mutex_unlock(&ws->lock);
	kvmem_zap_page(ws, id, &ws->slots[slot]);
	kvmem_slot_release(ws, &ws->slots[slot]);
	mutex_lock(&ws->lock);
	ws->busy--;
	slot_put_back(ws, slot);
	pg->slot = KVMEM_SLOT_NONE;
	pg->state = KVMEM_ABSENT;
	kvmem_pte_update(ws, id);
	kvmem_ws_changed(ws);
	mutex_unlock(&ws->lock);
}

/* FILLED: a claimed page is complete. Its ptes (writable, untracked while
 * claimed) are zapped so later writes are tracked; with VERIFY the bytes
 * are checked against the sums file and a mismatch drops the page (BAD,
 * a checksum error: the file may be fine, a fault reads it). With FAILED
 * userspace says its fill failed (its read's error, a short read): the
 * page is dropped as a read error, whatever its bytes, so the counters
 * tell a disk that failed from bytes that were wrong.
 */
int kvmem_filled_page(struct kvmem_ws *ws, u64 id, u32 flags)
{
	struct kvmem_pg *pg = &ws->pg[id];
	struct kvmem_slot *s;
	int err = 0;

	mutex_lock(&ws->lock);
	if (pg->state != KVMEM_CLAIMED) {
		mutex_unlock(&ws->lock);
		return -EINVAL;
	}
	s = &ws->slots[pg->slot];
	pg->state = KVMEM_FILLING;
	ws->busy++;
	kvmem_pte_update(ws, id);
	mutex_unlock(&ws->lock);
	kvmem_zap_page(ws, id, s);
	if (flags & KVMEM_PAGES_FAILED)
		err = -EIO;
	else if (flags & KVMEM_PAGES_VERIFY)
		err = kvmem_verify_page(ws, id, s);
	if (err)
		kvmem_slot_release(ws, s);
	mutex_lock(&ws->lock);
	ws->busy--;
	if (err) {
		slot_put_back(ws, pg->slot);
		pg->slot = KVMEM_SLOT_NONE;
		pg->flags |= KVMEM_PG_BAD;
		pg->state = KVMEM_ABSENT;
		if (err == -EBADMSG)
			ws->stats.checksum_errors++;
		else
			ws->stats.read_errors++;
		trace_kvmem_error(ws->ws_id, id, err);
	} else {
		pg->state = KVMEM_RESIDENT;
		pg->flags &= ~KVMEM_PG_BAD;
		ws->stats.user_fills++;
		ws->stats.resident++;
	}
	trace_kvmem_fill_done(ws->ws_id, id, 1, err ? 0 : ws->page_stride, 0, err);
	kvmem_pte_update(ws, id);
	kvmem_ws_changed(ws);
	mutex_unlock(&ws->lock);
	return err;
}

/* ---- the window's vm_operations ----------------------------------------- */

/*
 * A fault that fills a page or waits for another's fill lets go of the
 * mmap lock when its caller allows (FAULT_FLAG_ALLOW_RETRY, not NOWAIT): it
 * takes a reference on the file (which keeps ws), unlocks, does the work
 * and returns VM_FAULT_RETRY, and the retry maps the page (the filled page
 * has its second chance on the clock). A retry that finds the page gone
 * again lets go again: a fill may write a dirty victim back, and a file
 * write (freeze protection, the inode's lock) under the mmap lock closes a
 * cycle with an O_DIRECT read of the same file into this process's memory
 * (inode lock, then get_user_pages takes the mmap lock), which lockdep
 * reported on the debug kernel. Only a fault whose caller cannot retry
 * (get_user_pages without a lock to drop, NOWAIT) fills holding it.
 */
static bool may_drop_mmap(struct vm_fault *vmf)
{
	return (vmf->flags & FAULT_FLAG_ALLOW_RETRY) &&
	       !(vmf->flags & FAULT_FLAG_RETRY_NOWAIT);
}

static struct file *drop_mmap(struct vm_fault *vmf)
{
	struct file *file = get_file(vmf->vma->vm_file);

	kvmem_release_fault_lock(vmf);
	return file;
}

/*
 * A fault that let go of the mmap lock can only return VM_FAULT_RETRY, so
 * when its fill (or the fill it waited for) failed, it leaves a note, and
 * the task's next fault on the page (the retry, or the next attempt of a
 * get_user_pages loop, which does not say TRIED) fails without reading the
 * page again, if it comes within a second and the page is as the note left
 * it (ABSENT, no fill failed since). Otherwise the note is dropped and the
 * fault goes on as any other. [lock]
 */
static void note_failed(struct kvmem_ws *ws, u64 id)
{
	struct kvmem_failed_note *n = &ws->failed[ws->failed_next];

	n->pid = current->pid;
	n->id = id;
	n->errs = ws->pg[id].fill_errs;
	n->when = jiffies;
	ws->failed_next = (ws->failed_next + 1) % KVMEM_FAILED_NOTES;
}

static bool take_note(struct kvmem_ws *ws, u64 id)
{
	struct kvmem_pg *pg = &ws->pg[id];
	bool fail = false;
	u32 i;

	for (i = 0; i < KVMEM_FAILED_NOTES; i++) {
		struct kvmem_failed_note *n = &ws->failed[i];

		if (n->pid != current->pid || n->id != id)
			continue;
		n->pid = 0;
		fail |= time_before(jiffies, n->when + HZ) && pg->state == KVMEM_ABSENT &&
			pg->fill_errs == n->errs;
	}
	return fail;
}

static vm_fault_t kvmem_fault(struct vm_fault *vmf)
{
	struct kvmem_ws *ws = vmf->vma->vm_private_data;
	u64 idx = vmf->pgoff - KVMEM_WINDOW_PGOFF;
	u64 id = div_u64(idx, ws->npp);
	u32 sub = idx - id * ws->npp;
	u32 tflags = (vmf->flags & FAULT_FLAG_WRITE) ? KVMEM_FAULT_WRITE : 0;
	/* The retry of a fault that filled or waited: it was counted then. */
	bool retry = vmf->flags & FAULT_FLAG_TRIED;
	vm_fault_t major = retry ? VM_FAULT_MAJOR : 0;
	bool waited_fill = false;
	struct kvmem_pg *pg;
	struct file *file;
	struct page *page;
	u16 errs = 0;
	int err;

	mutex_lock(&ws->lock);
	if (id >= ws->page_count) {
		mutex_unlock(&ws->lock);
		return VM_FAULT_SIGBUS;
	}
	pg = &ws->pg[id];
	if (!retry)
		ws->stats.faults++;
	if (take_note(ws, id))
		goto sigbus;
	for (;;) {
		switch (pg->state) {
		case KVMEM_RESIDENT:
		case KVMEM_WRITEBACK:
		case KVMEM_CLAIMED:
			page = ws->slots[pg->slot].pages[sub];
			get_page(page);
			if (!major && !waited_fill) {
				ws->stats.hits++;
				trace_kvmem_hit(ws->ws_id, id);
			}
			ws->slots[pg->slot].ref = true;
			pg->flags &= ~KVMEM_PG_PREFETCHED;
			pte_account(ws, id);
			kvmem_pte_update(ws, id);
			/* Pinned until the re-check, so reclaim cannot take
			 * the page between our fill and our pte.
			 */
			pg->pins++;
			ws->busy++;
			mutex_unlock(&ws->lock);
			lock_page(page);
			mutex_lock(&ws->lock);
			pg->pins--;
			ws->busy--;
			kvmem_ws_changed(ws);
			if ((pg->state == KVMEM_RESIDENT || pg->state == KVMEM_WRITEBACK ||
			     pg->state == KVMEM_CLAIMED) &&
			    ws->slots[pg->slot].pages[sub] == page) {
				mutex_unlock(&ws->lock);
				vmf->page = page;
				return VM_FAULT_LOCKED | major;
			}
			unlock_page(page);
			put_page(page);
			continue;
		case KVMEM_FILLING:
		case KVMEM_EVICTING:
			if (pg->state == KVMEM_FILLING && !waited_fill) {
				waited_fill = true;
				errs = pg->fill_errs;
				if (!retry)
					trace_kvmem_fault(ws->ws_id, id,
							  tflags | KVMEM_FAULT_WAITED);
			}
			if (may_drop_mmap(vmf)) {
				file = drop_mmap(vmf);
				kvmem_ws_wait(ws);
				if (waited_fill && pg->state == KVMEM_ABSENT &&
				    pg->fill_errs != errs)
					note_failed(ws, id);
				mutex_unlock(&ws->lock);
				fput(file);
				return VM_FAULT_RETRY;
			}
			if (kvmem_ws_wait(ws))
				goto sigbus;
			/* The fill we waited for failed to read or check the
			 * page: this fault fails too, a later one tries again.
			 * A fill that ended otherwise (no memory, its task
			 * killed) says nothing of the page: fill it here.
			 */
			if (waited_fill && pg->state == KVMEM_ABSENT && pg->fill_errs != errs)
				goto sigbus;
			continue;
		default:	/* KVMEM_ABSENT */
			trace_kvmem_fault(ws->ws_id, id, tflags);
			kvmem_prefetch_on_fault(ws, id);
			if (may_drop_mmap(vmf)) {
				file = drop_mmap(vmf);
				if (kvmem_fill_locked(ws, id, false))
					note_failed(ws, id);
				mutex_unlock(&ws->lock);
				fput(file);
				return VM_FAULT_RETRY;
			}
			err = kvmem_fill_locked(ws, id, false);
			if (err)
				goto sigbus;
			major = VM_FAULT_MAJOR;
			continue;
		}
	}
sigbus:
	mutex_unlock(&ws->lock);
	return VM_FAULT_SIGBUS;
}

/*
 * The first write to a mapped page: mark it dirty, unless it is claimed by
 * userspace (not tracked). It never waits, because the mmap lock is held
 * here and page_mkwrite cannot let go of it: a page being written back is
 * marked dirty again at once (what the write-back writes may then mix old
 * and new bytes, and its sum may not match them; the page stays DIRTY, so
 * the next write-back writes it whole, and until then the file holds a
 * page that fails its check, never one that passes with the wrong bytes);
 * a page being filled or evicted sends the write back to .fault
 * (VM_FAULT_NOPAGE: the access faults again), which waits without it.
 */
static vm_fault_t kvmem_page_mkwrite(struct vm_fault *vmf)
{
	struct kvmem_ws *ws = vmf->vma->vm_private_data;
	u64 idx = vmf->pgoff - KVMEM_WINDOW_PGOFF;
	u64 id = div_u64(idx, ws->npp);
	u32 sub = idx - id * ws->npp;
	struct page *page = vmf->page;
	struct kvmem_pg *pg = &ws->pg[id];
	bool ok;

	mutex_lock(&ws->lock);
	if ((pg->state != KVMEM_RESIDENT && pg->state != KVMEM_WRITEBACK &&
	     pg->state != KVMEM_CLAIMED) || ws->slots[pg->slot].pages[sub] != page) {
		mutex_unlock(&ws->lock);
		return VM_FAULT_NOPAGE;	/* the page left or is in transit: fault again */
	}
	/* A read-only workspace writes nothing back: only a page claimed for
	 * userspace's fill may be written.
	 */
	if (ws->rdonly && pg->state != KVMEM_CLAIMED) {
		mutex_unlock(&ws->lock);
		return VM_FAULT_SIGBUS;
	}
	if (pg->state != KVMEM_CLAIMED && !(pg->flags & KVMEM_PG_DIRTY)) {
		pg->flags |= KVMEM_PG_DIRTY;
		kvmem_pte_update(ws, id);
	}
	mutex_unlock(&ws->lock);
	lock_page(page);
	mutex_lock(&ws->lock);
	/* A write-back may have started meanwhile and cleaned the page after
	 * zapping it: then fault again, or the write would go untracked.
	 */
	ok = (pg->state == KVMEM_CLAIMED ||
	      ((pg->state == KVMEM_RESIDENT || pg->state == KVMEM_WRITEBACK) &&
	       (pg->flags & KVMEM_PG_DIRTY))) &&
	     ws->slots[pg->slot].pages[sub] == page;
	mutex_unlock(&ws->lock);
	if (!ok) {
		unlock_page(page);
		return VM_FAULT_NOPAGE;
	}
	return VM_FAULT_LOCKED;
}

const struct vm_operations_struct kvmem_window_vm_ops = {
	.fault = kvmem_fault,
	.page_mkwrite = kvmem_page_mkwrite,
};

/* The table's pages are all inserted at mmap; with ops (and no .fault) the
 * mapping is never taken for anonymous memory: a touch past them is SIGBUS.
 */
const struct vm_operations_struct kvmem_table_vm_ops = {
};

/* ---- set-up and teardown of the memory ---------------------------------- */

static size_t table_bytes(u64 page_max)
{
	return PAGE_ALIGN(sizeof(struct kvmem_pt_header) + page_max * sizeof(struct kvmem_pte));
}

/* What a workspace may hold at most: the window, the table, the page
 * states and the slot bookkeeping (SETUP reserves it of max_memory).
 */
size_t kvmem_ws_memory_bytes(u64 page_max, u64 n_slots, u32 npp)
{
	return n_slots * npp * PAGE_SIZE + table_bytes(page_max) +
	       (table_bytes(page_max) >> PAGE_SHIFT) * sizeof(struct page *) +
	       page_max * sizeof(struct kvmem_pg) +
	       n_slots * (sizeof(struct kvmem_slot) + sizeof(u32) + npp * sizeof(struct page *));
}

static int table_alloc(struct kvmem_ws *ws)
{
	u32 i;

	ws->n_table_pages = table_bytes(ws->page_max) >> PAGE_SHIFT;
	ws->table_pages = kvcalloc(ws->n_table_pages, sizeof(struct page *), KVMEM_GFP);
	if (!ws->table_pages)
		return -ENOMEM;
	for (i = 0; i < ws->n_table_pages; i++) {
		ws->table_pages[i] = alloc_page(KVMEM_GFP | __GFP_ZERO);
		if (!ws->table_pages[i])
			return -ENOMEM;
		if ((i & 1023) == 1023)
			cond_resched();
	}
	ws->table = vmap(ws->table_pages, ws->n_table_pages, VM_MAP, PAGE_KERNEL);
	return ws->table ? 0 : -ENOMEM;
}

static void table_free(struct kvmem_ws *ws)
{
	u32 i;

	if (ws->table)
		vunmap(ws->table);
	ws->table = NULL;
	for (i = 0; ws->table_pages && i < ws->n_table_pages; i++)
		if (ws->table_pages[i])
			put_page(ws->table_pages[i]);
	kvfree(ws->table_pages);
	ws->table_pages = NULL;
}

/* Called by SETUP, in its caller's context (so charged to its cgroup). */
int kvmem_ws_init_memory(struct kvmem_ws *ws, u64 host_cap)
{
	u32 i;

	ws->n_slots = div_u64(host_cap, ws->page_stride);
	ws->table_bytes = sizeof(struct kvmem_pt_header) + ws->page_max * sizeof(struct kvmem_pte);
	ws->pg = kvcalloc(ws->page_max, sizeof(*ws->pg), KVMEM_GFP);
	ws->slots = kvcalloc(ws->n_slots, sizeof(*ws->slots), KVMEM_GFP);
	ws->free_list = kvmalloc_array(ws->n_slots, sizeof(u32), KVMEM_GFP);
	ws->page_ptrs = kvcalloc((size_t)ws->n_slots * ws->npp, sizeof(struct page *), KVMEM_GFP);
	if (!ws->pg || !ws->slots || !ws->free_list || !ws->page_ptrs || table_alloc(ws)) {
		kvmem_ws_free_memory(ws);
		return -ENOMEM;
	}
	for (i = 0; i < ws->n_slots; i++) {
		ws->slots[i].pages = ws->page_ptrs + (size_t)i * ws->npp;
		/* Popped from the end: slot 0 is handed out first. */
		ws->free_list[i] = ws->n_slots - 1 - i;
	}
	ws->n_free = ws->n_slots;
	ws->stats.slots = ws->n_slots;
	ws->pte = (struct kvmem_pte *)(ws->table + 1);
	ws->table->magic = KVMEM_PT_MAGIC;
	ws->table->version = KVMEM_PT_VERSION;
	ws->table->entry_size = sizeof(struct kvmem_pte);
	ws->table->n_layers = ws->n_layers;
	kvmem_pte_init(ws, 0, ws->page_max);
	return 0;
}

void kvmem_ws_free_memory(struct kvmem_ws *ws)
{
	u32 i;

	if (ws->slots) {
		for (i = 0; i < ws->n_slots; i++)
			if (ws->slots[i].used)
				kvmem_slot_free(ws, i);
	}
	kvfree(ws->page_ptrs);
	kvfree(ws->free_list);
	kvfree(ws->slots);
	kvfree(ws->pg);
	table_free(ws);
	ws->page_ptrs = NULL;
	ws->free_list = NULL;
	ws->slots = NULL;
	ws->pg = NULL;
}

// SPDX-License-Identifier: GPL-2.0
/*
 * Reclaim and write-back. The clock over the slots proposes candidates, the
 * writable tracepoint kvmem_reclaim lets a BPF program pick one, a victim is
 * zapped from every mapping, written back when dirty and freed. SYNC and
 * release write back every dirty page. All of it is entered with ws->lock
 * held and drops it around zaps, I/O and freeing memory (kvmem_int.h,
 * "Locking").
 */
#include <linux/fs.h>
#include <linux/ktime.h>
#include <linux/mm.h>

#include "kvmem_int.h"
#include "kvmem_trace.h"

#define KVMEM_SCAN_CHUNK	256	/* slots the clock passes per hold of ws->lock */

/*
 * Write a RESIDENT page back. DIRTY is cleared as the write-back starts,
 * then the page's ptes are zapped: a write through a pte from before the
 * zap lands before the write-back reads the page, and a write after it
 * faults into page_mkwrite, which marks the page dirty again at once (it
 * does not wait: kvmem_window.c), so the next write-back writes it again.
 * (Clearing after the zap would lose a write whose page_mkwrite came in
 * between.) A page somebody holds (kvmem_slot_maybe_held) may be written
 * behind our back without a fault, so it is dirty again once the zap shows
 * it held: its bytes go to the file now, and again at the next write-back.
 */
static int writeback_locked(struct kvmem_ws *ws, u64 id)
{
	struct kvmem_pg *pg = &ws->pg[id];
	struct kvmem_slot *s = &ws->slots[pg->slot];
	u64 t0 = ktime_get_ns();
	int err;

	pg->state = KVMEM_WRITEBACK;
	pg->flags &= ~KVMEM_PG_DIRTY;
	ws->busy++;
	kvmem_pte_update(ws, id);
	mutex_unlock(&ws->lock);
	kvmem_zap_page(ws, id, s);
	mutex_lock(&ws->lock);
	if (kvmem_slot_maybe_held(ws, s, pg->pins)) {
		pg->flags |= KVMEM_PG_DIRTY;
		kvmem_pte_update(ws, id);
	}
	mutex_unlock(&ws->lock);
	err = kvmem_write_page(ws, id, s);
	mutex_lock(&ws->lock);
	ws->busy--;
	pg->state = KVMEM_RESIDENT;
	if (err) {
		pg->flags |= KVMEM_PG_DIRTY;
		ws->stats.write_errors++;
		trace_kvmem_error(ws->ws_id, id, err);
	} else {
		ws->stats.writebacks++;
		trace_kvmem_writeback(ws->ws_id, id, ws->page_stride, ktime_get_ns() - t0);
	}
	kvmem_pte_update(ws, id);
	kvmem_ws_changed(ws);
	return err;
}

/* Evict a RESIDENT page that nobody pins. On a failed write-back the page
 * stays resident and dirty; a page found held once its ptes are gone stays
 * as it was (-EBUSY). Its memory is freed without ws->lock.
 */
static int evict_locked(struct kvmem_ws *ws, u64 id, u32 reason)
{
	struct kvmem_pg *pg = &ws->pg[id];
	u32 slot = pg->slot;
	struct kvmem_slot *s = &ws->slots[slot];
	bool dirty = pg->flags & KVMEM_PG_DIRTY, held;
	u64 t0 = ktime_get_ns();
	int err = 0;

	/* From here no fault maps it and no write dirties it (they wait), so
	 * the dirty bit read now is final, and after the zap every reference
	 * to its pages but ours is a holder's.
	 */
	pg->state = KVMEM_EVICTING;
	ws->busy++;
	kvmem_pte_update(ws, id);
	mutex_unlock(&ws->lock);
	kvmem_zap_page(ws, id, s);
	held = kvmem_slot_held(ws, s);
	if (!held && dirty)
		err = kvmem_write_page(ws, id, s);
	if (!held && !err)
		kvmem_slot_release(ws, s);
	mutex_lock(&ws->lock);
	ws->busy--;
	if (held || err) {
		pg->state = KVMEM_RESIDENT;
		if (err) {
			ws->stats.write_errors++;
			trace_kvmem_error(ws->ws_id, id, err);
		}
		kvmem_pte_update(ws, id);
		kvmem_ws_changed(ws);
		return held ? -EBUSY : err;
	}
	if (dirty) {
		ws->stats.writebacks++;
		trace_kvmem_writeback(ws->ws_id, id, ws->page_stride, ktime_get_ns() - t0);
	}
	s->used = false;
	ws->free_list[ws->n_free++] = slot;
	pg->slot = KVMEM_SLOT_NONE;
	pg->state = KVMEM_ABSENT;
	pg->flags &= ~(KVMEM_PG_DIRTY | KVMEM_PG_PREFETCHED);
	ws->stats.evictions++;
	ws->stats.resident--;
	trace_kvmem_evict(ws->ws_id, id, dirty, reason);
	kvmem_pte_update(ws, id);
	kvmem_ws_changed(ws);
	return 0;
}

/* A slot whose page may leave now: resident, no fault mapping it, nobody
 * holding it.
 */
static bool evictable(struct kvmem_ws *ws, struct kvmem_slot *s)
{
	struct kvmem_pg *pg = &ws->pg[s->page];

	return s->used && pg->state == KVMEM_RESIDENT && !pg->pins &&
	       !kvmem_slot_maybe_held(ws, s, 0);
}

static bool taken(const u32 *slot_of, u32 n, u32 slot)
{
	u32 i;

	for (i = 0; i < n; i++)
		if (slot_of[i] == slot)
			return true;
	return false;
}

/*
 * Put the candidates the step's selection names last (runners-up, then
 * selected pages; each group keeps its clock order), so the module's
 * choice, candidate 0, is a page the next view does not need when there is
 * one.
 */
static void order_by_hint(struct kvmem_reclaim_ctx *c, u32 *slot_of, u32 n)
{
	struct kvmem_reclaim_ctx in = *c;
	u32 slots[KVMEM_RECLAIM_MAX], h, i, j = 0;

	memcpy(slots, slot_of, n * sizeof(*slots));
	for (h = KVMEM_HINTED_NONE; h <= KVMEM_HINTED_SELECTED; h++) {
		for (i = 0; i < n; i++) {
			if (in.hint[i] != h)
				continue;
			slot_of[j] = slots[i];
			c->page[j] = in.page[i];
			c->last_step[j] = in.last_step[i];
			c->access_count[j] = in.access_count[i];
			c->dirty[j] = in.dirty[i];
			c->hint[j] = in.hint[i];
			j++;
		}
	}
}

/*
 * Choose a victim and evict it. The clock hand passes slots, clearing the
 * referenced bit of those touched since its last pass (second chance) and
 * collecting up to KVMEM_RECLAIM_MAX unreferenced evictable ones, in clock
 * order, those the step's selection names (HINT) last; candidate 0 is the
 * module's choice. A BPF program on kvmem_reclaim
 * may name another by index; an index out of range is refused.
 * -EAGAIN: nothing can leave now; 0: a page left, or a slot came free
 * while the scan let go of the lock.
 */
static int reclaim_one(struct kvmem_ws *ws)
{
	struct kvmem_reclaim_ctx ctx = { .verdict = KVMEM_VERDICT_DEFAULT };
	u32 slot_of[KVMEM_RECLAIM_MAX];
	u32 scanned, n = 0, pick = 0, reason = KVMEM_EVICT_RECLAIM;

	for (scanned = 0; scanned < 2 * ws->n_slots && n < KVMEM_RECLAIM_MAX; scanned++) {
		u32 slot = ws->hand;
		struct kvmem_slot *s = &ws->slots[slot];
		struct kvmem_pg *pg;

		/* A long scan that found nothing yet lets the others in
		 * every KVMEM_SCAN_CHUNK slots (nothing collected to go
		 * stale meanwhile).
		 */
		if (!n && scanned && !(scanned % KVMEM_SCAN_CHUNK)) {
			mutex_unlock(&ws->lock);
			cond_resched();
			mutex_lock(&ws->lock);
			if (ws->n_free)
				return 0;
			slot = ws->hand;
			s = &ws->slots[slot];
		}
		ws->hand = (ws->hand + 1) % ws->n_slots;
		if (!s->used || !evictable(ws, s))
			continue;
		if (s->ref) {
			s->ref = false;
			continue;
		}
		/* The second round passes slots taken in the first: a page
		 * is a candidate once (a window of fewer than
		 * KVMEM_RECLAIM_MAX slots gave the same pages twice), while
		 * those whose second chance the first round used up join.
		 */
		if (taken(slot_of, n, slot))
			continue;
		pg = &ws->pg[s->page];
		slot_of[n] = slot;
		ctx.page[n] = s->page;
		ctx.last_step[n] = ws->pte[s->page].last_step;
		ctx.access_count[n] = ws->pte[s->page].access_count;
		ctx.dirty[n] = !!(pg->flags & KVMEM_PG_DIRTY);
		ctx.hint[n] = kvmem_hinted(ws, s->page);
		n++;
	}
	if (!n)
		return -EAGAIN;
	order_by_hint(&ctx, slot_of, n);
	ctx.ws_id = ws->ws_id;
	ctx.step = ws->step;
	ctx.n_candidates = n;
	trace_kvmem_reclaim(&ctx);
	if (ctx.verdict != KVMEM_VERDICT_DEFAULT) {
		if (ctx.verdict < n) {
			pick = ctx.verdict;
			reason = KVMEM_EVICT_VERDICT;
			ws->stats.verdicts++;
		} else {
			ws->stats.bad_verdicts++;
		}
	}
	return evict_locked(ws, ws->slots[slot_of[pick]].page, reason);
}

/* A free slot, evicting when there is none. May drop ws->lock. -ENOMEM:
 * every resident page is pinned or claimed, nothing will free a slot.
 */
int kvmem_slot_get(struct kvmem_ws *ws, u32 *out)
{
	u32 failed = 0;
	int err;

	for (;;) {
		if (ws->n_free) {
			*out = ws->free_list[--ws->n_free];
			return 0;
		}
		err = reclaim_one(ws);
		if (err == -EAGAIN) {
			if (!ws->busy)
				return -ENOMEM;
			err = kvmem_ws_wait(ws);
		}
		if (err == -EINTR)
			return err;
		/* A write-back error leaves the victim resident and dirty, a
		 * victim found held stays too: try others, but not forever
		 * when the disk refuses every one or every page is held.
		 */
		if (err && ++failed > ws->n_slots)
			return err == -EBUSY ? -ENOMEM : err;
	}
}

/* EVICT: 0 when the page is absent afterwards, -EBUSY when it is pinned or
 * in transit, or the write-back's error.
 */
int kvmem_evict_page(struct kvmem_ws *ws, u64 id)
{
	struct kvmem_pg *pg = &ws->pg[id];
	int err = 0;

	mutex_lock(&ws->lock);
	if (pg->state == KVMEM_RESIDENT) {
		if (evictable(ws, &ws->slots[pg->slot]))
			err = evict_locked(ws, id, KVMEM_EVICT_ASKED);
		else
			err = -EBUSY;
	} else if (pg->state != KVMEM_ABSENT) {
		err = -EBUSY;
	}
	mutex_unlock(&ws->lock);
	return err;
}

/* Write back every dirty page; the first error is returned, the others are
 * counted. Pages already on their way out are waited for.
 */
static int writeback_all_locked(struct kvmem_ws *ws)
{
	int err = 0, e;
	u32 slot;

	for (slot = 0; slot < ws->n_slots; slot++) {
		struct kvmem_slot *s = &ws->slots[slot];

		while (s->used && (ws->pg[s->page].state == KVMEM_WRITEBACK ||
				   ws->pg[s->page].state == KVMEM_EVICTING)) {
			if (kvmem_ws_wait(ws))
				return -EINTR;
		}
		if (s->used && ws->pg[s->page].state == KVMEM_RESIDENT &&
		    (ws->pg[s->page].flags & KVMEM_PG_DIRTY)) {
			e = writeback_locked(ws, s->page);
			if (e && !err)
				err = e;
		}
	}
	return err;
}

int kvmem_sync(struct kvmem_ws *ws)
{
	int err, e;

	mutex_lock(&ws->lock);
	err = writeback_all_locked(ws);
	mutex_unlock(&ws->lock);
	e = vfs_fsync(ws->pages, 1);
	if (!err)
		err = e;
	e = vfs_fsync(ws->sums, 1);
	return err ? err : e;
}

/* At release: what was written through the window reaches the file. */
void kvmem_writeback_all(struct kvmem_ws *ws)
{
	mutex_lock(&ws->lock);
	writeback_all_locked(ws);
	mutex_unlock(&ws->lock);
}

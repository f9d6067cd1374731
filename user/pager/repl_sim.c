// SPDX-License-Identifier: MIT
/*
 * Replay a step sequence against a replacement policy without any I/O: the
 * same calls the pager makes (step, hints, touch on a hit, victims and
 * insert on a miss, the step's own pages not evictable), so hit rates
 * measured here are the pager's.
 */
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "pager/repl_int.h"

struct sim {
	uint64_t *slot_page;	/* UINT64_MAX: free */
	uint64_t *slot_step;	/* step of the last fetch + 1 */
	uint64_t step;
};

static int sim_busy(void *arg, uint32_t s)
{
	struct sim *m = arg;

	return m->slot_step[s] == m->step + 1;
}

double kvmem_repl_simulate(const kvmem_repl_ops *ops, uint32_t n_slots, uint32_t n_layers,
			 const kvmem_repl_trace *t, uint64_t *hits, uint64_t *misses)
{
	uint64_t max_page = 0, h = 0, mi = 0;
	uint32_t *where, used = 0;
	struct sim m = { 0 };
	void *st;

	if (!n_slots)
		return kvmem_error(EINVAL, "replay: no slots");
	for (size_t i = 0; i < t->step_off[t->n_steps]; i++)
		if (t->pages[i] > max_page)
			max_page = t->pages[i];
	where = malloc((max_page + 1) * sizeof(*where));
	m.slot_page = malloc(n_slots * sizeof(uint64_t));
	m.slot_step = calloc(n_slots, sizeof(uint64_t));
	st = ops->create(n_slots, n_layers);
	if (!where || !m.slot_page || !m.slot_step || !st) {
		free(where);
		free(m.slot_page);
		free(m.slot_step);
		if (st)
			ops->destroy(st);
		return kvmem_error(ENOMEM, "replay: out of memory");
	}
	memset(where, 0xff, (max_page + 1) * sizeof(*where));
	for (uint32_t s = 0; s < n_slots; s++)
		m.slot_page[s] = UINT64_MAX;

	for (size_t s = 0; s < t->n_steps; s++) {
		m.step = s;
		if (ops->step)
			ops->step(st, s);
		if (t->hint_off && ops->hint)
			for (size_t i = t->hint_off[s]; i < t->hint_off[s + 1]; i++)
				ops->hint(st, t->hint_block[i], t->hint_score[i], s);
		for (size_t i = t->step_off[s]; i < t->step_off[s + 1]; i++) {
			uint64_t pg = t->pages[i];
			uint32_t slot = where[pg];

			if (slot != UINT32_MAX) {
				h++;
				ops->touch(st, slot, s);
				m.slot_step[slot] = s + 1;
				continue;
			}
			mi++;
			if (used < n_slots) {
				slot = used++;
			} else if (ops->victims(st, 1, &slot, s, sim_busy, &m) == 1) {
				ops->remove(st, slot);
				where[m.slot_page[slot]] = UINT32_MAX;
			} else {
				continue;	/* everything is in use by this step */
			}
			m.slot_page[slot] = pg;
			m.slot_step[slot] = s + 1;
			where[pg] = slot;
			ops->insert(st, slot, pg, s);
			ops->touch(st, slot, s);
		}
	}
	ops->destroy(st);
	free(where);
	free(m.slot_page);
	free(m.slot_step);
	if (hits)
		*hits = h;
	if (misses)
		*misses = mi;
	return h + mi ? (double)h / (h + mi) : 0.0;
}

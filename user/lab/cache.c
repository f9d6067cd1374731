// SPDX-License-Identifier: MIT
/*
 * The host pool a replay simulates: a replacement policy over a fixed number
 * of page slots, driven with the calls the pager makes (user/pager/
 * repl_sim.c does the same for kvmem_repl_simulate): step aging, selector
 * hints, touch on a hit, victims then insert on a miss, the step's own
 * fetched pages never evicted. Besides reads, pages written by appends come
 * in when their block is staged out, as the pager keeps them (unless told
 * not to), without counting as hits or misses.
 */
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "lab/lab_int.h"

static int busy(void *arg, uint32_t s)
{
	const struct lab_cache *c = arg;

	return c->slot_step[s] == c->step + 1;
}

int lab_cache_init(struct lab_cache *c, const kvmem_repl_ops *ops, uint32_t n_slots,
		   uint32_t n_layers)
{
	memset(c, 0, sizeof(*c));
	if (!n_slots)
		return kvmem_error(EINVAL, "lab: a host pool of no pages");
	c->ops = ops;
	c->n_slots = n_slots;
	c->slot_page = malloc(n_slots * sizeof(*c->slot_page));
	c->slot_step = calloc(n_slots, sizeof(*c->slot_step));
	c->st = ops->create(n_slots, n_layers);
	if (!c->slot_page || !c->slot_step || !c->st) {
		lab_cache_free(c);
		return kvmem_error(ENOMEM, "lab: out of memory for a pool of %u pages", n_slots);
	}
	memset(c->slot_page, 0xff, n_slots * sizeof(*c->slot_page));
	return 0;
}

void lab_cache_free(struct lab_cache *c)
{
	if (c->st)
		c->ops->destroy(c->st);
	free(c->slot_page);
	free(c->slot_step);
	free(c->where);
	memset(c, 0, sizeof(*c));
}

void lab_cache_step(struct lab_cache *c, uint64_t step)
{
	c->step = step;
	if (c->ops->step)
		c->ops->step(c->st, step);
}

void lab_cache_hint(struct lab_cache *c, uint64_t block, float score)
{
	if (c->ops->hint)
		c->ops->hint(c->st, block, score, c->step);
}

static int reach(struct lab_cache *c, uint64_t page)
{
	uint64_t n = c->n_where ? c->n_where : 1024;
	uint32_t *w;

	if (page < c->n_where)
		return 0;
	while (n <= page)
		n *= 2;
	if (!(w = realloc(c->where, n * sizeof(*w))))
		return kvmem_error(ENOMEM, "lab: out of memory for %llu pages", (unsigned long long)n);
	memset(w + c->n_where, 0xff, (n - c->n_where) * sizeof(*w));
	c->where = w;
	c->n_where = n;
	return 0;
}

/* A free slot or a victim's; UINT32_MAX when every slot is this step's. */
static uint32_t room(struct lab_cache *c)
{
	uint32_t slot;

	if (c->used < c->n_slots)
		return c->used++;
	if (c->ops->victims(c->st, 1, &slot, c->step, busy, c) != 1)
		return UINT32_MAX;
	c->ops->remove(c->st, slot);
	c->where[c->slot_page[slot]] = UINT32_MAX;
	return slot;
}

static int access_page(struct lab_cache *c, uint64_t page, int fetch)
{
	uint32_t slot;
	int rc;

	if ((rc = reach(c, page)))
		return rc;
	slot = c->where[page];
	if (slot != UINT32_MAX) {
		c->ops->touch(c->st, slot, c->step);
		if (fetch)
			c->slot_step[slot] = c->step + 1;
		return 1;
	}
	if ((slot = room(c)) == UINT32_MAX)
		return 0;
	c->slot_page[slot] = page;
	c->slot_step[slot] = fetch ? c->step + 1 : 0;
	c->where[page] = slot;
	c->ops->insert(c->st, slot, page, c->step);
	c->ops->touch(c->st, slot, c->step);
	return 0;
}

int lab_cache_read(struct lab_cache *c, uint64_t page)
{
	return access_page(c, page, 1);
}

int lab_cache_write(struct lab_cache *c, uint64_t page)
{
	return access_page(c, page, 0) < 0 ? -1 : 0;
}

// SPDX-License-Identifier: MIT
/*
 * lfu: the block fetched least often leaves first, with aging. Counts are
 * kept per block (all its layers add to one count) and survive eviction, so
 * a block that keeps coming back is recognised even when the pool is too
 * small to hold it between visits; a count halves every HALF_LIFE steps, so
 * blocks popular long ago give way to ones popular now. Ties go to the page
 * fetched longest ago.
 */
#include <stdlib.h>

#include "pager/repl_int.h"

#define HALF_LIFE 4.0

struct lfu {
	uint32_t n, n_layers;
	uint64_t *page, *last;		/* per slot */
	uint8_t *present;
	struct repl_blockvals count;	/* per block */
};

static void *lfu_create(uint32_t n_slots, uint32_t n_layers)
{
	struct lfu *f = calloc(1, sizeof(*f));

	if (!f)
		return NULL;
	f->n = n_slots;
	f->n_layers = n_layers ? n_layers : 1;
	f->page = calloc(n_slots, sizeof(uint64_t));
	f->last = calloc(n_slots, sizeof(uint64_t));
	f->present = calloc(n_slots, 1);
	if (!f->page || !f->last || !f->present) {
		free(f->page);
		free(f->last);
		free(f->present);
		free(f);
		return NULL;
	}
	return f;
}

static void lfu_destroy(void *st)
{
	struct lfu *f = st;

	free(f->page);
	free(f->last);
	free(f->present);
	repl_blockvals_free(&f->count);
	free(f);
}

static void lfu_insert(void *st, uint32_t slot, uint64_t page, uint64_t step)
{
	struct lfu *f = st;

	f->present[slot] = 1;
	f->page[slot] = page;
	f->last[slot] = step;
}

static void lfu_touch(void *st, uint32_t slot, uint64_t step)
{
	struct lfu *f = st;

	if (!f->present[slot])
		return;
	repl_blockvals_add(&f->count, f->page[slot] / f->n_layers, 1.0, step, HALF_LIFE);
	if (step > f->last[slot])
		f->last[slot] = step;
}

static void lfu_remove(void *st, uint32_t slot)
{
	((struct lfu *)st)->present[slot] = 0;
}

static double lfu_key(void *st, uint32_t s, uint64_t step)
{
	struct lfu *f = st;
	uint64_t age = step > f->last[s] ? step - f->last[s] : 0;

	/* The age term only breaks ties between equal counts. */
	return repl_blockvals_get(&f->count, f->page[s] / f->n_layers, step, HALF_LIFE) -
	       1e-9 * (double)age;
}

static uint32_t lfu_victims(void *st, uint32_t want, uint32_t *out, uint64_t step,
			    kvmem_slot_pred busy, void *arg)
{
	struct lfu *f = st;

	return repl_lowest(st, f->n, f->present, lfu_key, want, out, step, busy, arg);
}

const kvmem_repl_ops kvmem_repl_lfu = {
	.name = "lfu",
	.what = "least frequently fetched block leaves first; counts survive eviction, halve every 4 steps",
	.create = lfu_create,
	.destroy = lfu_destroy,
	.insert = lfu_insert,
	.touch = lfu_touch,
	.remove = lfu_remove,
	.victims = lfu_victims,
};

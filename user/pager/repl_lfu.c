// SPDX-License-Identifier: MIT
/*
 * lfu: the page fetched least often leaves first, with aging: a page's count
 * halves every HALF_LIFE steps, so blocks that were popular long ago give way
 * to ones popular now. Ties go to the page fetched longest ago.
 */
#include <stdlib.h>

#include "pager/repl_int.h"

#define HALF_LIFE 4.0

struct lfu {
	uint32_t n;
	double *count;		/* decayed to step `last` */
	uint64_t *last;
	uint8_t *present;
};

static void *lfu_create(uint32_t n_slots, uint32_t n_layers)
{
	struct lfu *f = calloc(1, sizeof(*f));

	if (!f)
		return NULL;
	f->n = n_slots;
	f->count = calloc(n_slots, sizeof(double));
	f->last = calloc(n_slots, sizeof(uint64_t));
	f->present = calloc(n_slots, 1);
	if (!f->count || !f->last || !f->present) {
		free(f->count);
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

	free(f->count);
	free(f->last);
	free(f->present);
	free(f);
}

static void lfu_insert(void *st, uint32_t slot, uint64_t page, uint64_t step)
{
	struct lfu *f = st;

	f->present[slot] = 1;
	f->count[slot] = 1;
	f->last[slot] = step;
}

static void lfu_touch(void *st, uint32_t slot, uint64_t step)
{
	struct lfu *f = st;

	if (!f->present[slot] || f->last[slot] > step)
		return;
	f->count[slot] = repl_decay(f->count[slot], step - f->last[slot], HALF_LIFE) + 1;
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
	return repl_decay(f->count[s], age, HALF_LIFE) - 1e-9 * (double)age;
}

static uint32_t lfu_victims(void *st, uint32_t want, uint32_t *out, uint64_t step,
			    kvm_slot_pred busy, void *arg)
{
	struct lfu *f = st;

	return repl_lowest(st, f->n, f->present, lfu_key, want, out, step, busy, arg);
}

const kvm_repl_ops kvm_repl_lfu = {
	.name = "lfu",
	.what = "least frequently fetched page leaves first; counts halve every 4 steps",
	.create = lfu_create,
	.destroy = lfu_destroy,
	.insert = lfu_insert,
	.touch = lfu_touch,
	.remove = lfu_remove,
	.victims = lfu_victims,
};

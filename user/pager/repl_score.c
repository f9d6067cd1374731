// SPDX-License-Identifier: MIT
/*
 * score: keeps the blocks the selector keeps choosing. The selector hints
 * each block's score every step (1 for chosen blocks, less for near misses);
 * a block's priority is the sum of its hints, halving every HALF_LIFE steps.
 * Every page of a block shares its priority, so a block's layers stay or
 * leave together. Fetches add a little too, so the policy behaves like an
 * aged frequency policy when nobody gives hints. Ties: oldest fetch leaves.
 */
#include <stdlib.h>

#include "pager/repl_int.h"

#define HALF_LIFE 4.0
#define TOUCH_WEIGHT 0.25

struct score {
	uint32_t n, n_layers;
	uint64_t *page, *last;		/* per slot */
	double *touch;			/* per slot, decayed to `last` */
	uint8_t *present;
	struct repl_blockvals prio;	/* per block */
};

static void *score_create(uint32_t n_slots, uint32_t n_layers)
{
	struct score *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->n = n_slots;
	c->n_layers = n_layers ? n_layers : 1;
	c->page = calloc(n_slots, sizeof(uint64_t));
	c->last = calloc(n_slots, sizeof(uint64_t));
	c->touch = calloc(n_slots, sizeof(double));
	c->present = calloc(n_slots, 1);
	if (!c->page || !c->last || !c->touch || !c->present) {
		free(c->page);
		free(c->last);
		free(c->touch);
		free(c->present);
		free(c);
		return NULL;
	}
	return c;
}

static void score_destroy(void *st)
{
	struct score *c = st;

	free(c->page);
	free(c->last);
	free(c->touch);
	free(c->present);
	repl_blockvals_free(&c->prio);
	free(c);
}

static void score_insert(void *st, uint32_t slot, uint64_t page, uint64_t step)
{
	struct score *c = st;

	c->present[slot] = 1;
	c->page[slot] = page;
	c->last[slot] = step;
	c->touch[slot] = TOUCH_WEIGHT;
}

static void score_touch(void *st, uint32_t slot, uint64_t step)
{
	struct score *c = st;

	if (!c->present[slot] || c->last[slot] > step)
		return;
	c->touch[slot] = repl_decay(c->touch[slot], step - c->last[slot], HALF_LIFE) +
			 TOUCH_WEIGHT;
	c->last[slot] = step;
}

static void score_remove(void *st, uint32_t slot)
{
	((struct score *)st)->present[slot] = 0;
}

static void score_hint(void *st, uint64_t block, float score, uint64_t step)
{
	repl_blockvals_add(&((struct score *)st)->prio, block, score, step, HALF_LIFE);
}

static double score_key(void *st, uint32_t s, uint64_t step)
{
	struct score *c = st;
	uint64_t b = c->page[s] / c->n_layers, age = step > c->last[s] ? step - c->last[s] : 0;
	double k = repl_decay(c->touch[s], age, HALF_LIFE);

	return k + repl_blockvals_get(&c->prio, b, step, HALF_LIFE) - 1e-9 * (double)age;
}

static uint32_t score_victims(void *st, uint32_t want, uint32_t *out, uint64_t step,
			      kvmem_slot_pred busy, void *arg)
{
	struct score *c = st;

	return repl_lowest(st, c->n, c->present, score_key, want, out, step, busy, arg);
}

const kvmem_repl_ops kvmem_repl_score = {
	.name = "score",
	.what = "keeps blocks the selector keeps choosing (hinted scores, halving every 4 steps)",
	.create = score_create,
	.destroy = score_destroy,
	.insert = score_insert,
	.touch = score_touch,
	.remove = score_remove,
	.hint = score_hint,
	.victims = score_victims,
};

// SPDX-License-Identifier: MIT
/* lru: the page fetched longest ago leaves first (a doubly linked list). */
#include <stdlib.h>

#include "pager/repl_int.h"

struct lru {
	uint32_t n, *prev, *next;	/* node n is the list head */
	uint8_t *present;
};

static void *lru_create(uint32_t n_slots, uint32_t n_layers)
{
	struct lru *l = calloc(1, sizeof(*l));

	if (!l)
		return NULL;
	l->n = n_slots;
	l->prev = malloc(sizeof(uint32_t) * (n_slots + 1));
	l->next = malloc(sizeof(uint32_t) * (n_slots + 1));
	l->present = calloc(n_slots, 1);
	if (!l->prev || !l->next || !l->present) {
		free(l->prev);
		free(l->next);
		free(l->present);
		free(l);
		return NULL;
	}
	l->prev[n_slots] = l->next[n_slots] = n_slots;
	return l;
}

static void lru_destroy(void *st)
{
	struct lru *l = st;

	free(l->prev);
	free(l->next);
	free(l->present);
	free(l);
}

static void unlink_slot(struct lru *l, uint32_t s)
{
	l->next[l->prev[s]] = l->next[s];
	l->prev[l->next[s]] = l->prev[s];
}

static void push_front(struct lru *l, uint32_t s)
{
	l->prev[s] = l->n;
	l->next[s] = l->next[l->n];
	l->prev[l->next[l->n]] = s;
	l->next[l->n] = s;
}

static void lru_insert(void *st, uint32_t slot, uint64_t page, uint64_t step)
{
	struct lru *l = st;

	if (l->present[slot])
		unlink_slot(l, slot);
	l->present[slot] = 1;
	push_front(l, slot);
}

static void lru_touch(void *st, uint32_t slot, uint64_t step)
{
	struct lru *l = st;

	if (!l->present[slot])
		return;
	unlink_slot(l, slot);
	push_front(l, slot);
}

static void lru_remove(void *st, uint32_t slot)
{
	struct lru *l = st;

	if (!l->present[slot])
		return;
	unlink_slot(l, slot);
	l->present[slot] = 0;
}

static uint32_t lru_victims(void *st, uint32_t want, uint32_t *out, uint64_t step,
			    kvmem_slot_pred busy, void *arg)
{
	struct lru *l = st;
	uint32_t n = 0;

	for (uint32_t s = l->prev[l->n]; s != l->n && n < want; s = l->prev[s])
		if (!busy || !busy(arg, s))
			out[n++] = s;
	return n;
}

const kvmem_repl_ops kvmem_repl_lru = {
	.name = "lru",
	.what = "least recently fetched page leaves first",
	.create = lru_create,
	.destroy = lru_destroy,
	.insert = lru_insert,
	.touch = lru_touch,
	.remove = lru_remove,
	.victims = lru_victims,
};

/* SPDX-License-Identifier: MIT */
/* Shared by the replacement policies. */
#ifndef KVMEM_PAGER_REPL_INT_H
#define KVMEM_PAGER_REPL_INT_H

#include "kvmem/pager.h"

extern const kvmem_repl_ops kvmem_repl_lru, kvmem_repl_lfu, kvmem_repl_score;

/* Victim key of a slot: lower leaves first. */
typedef double (*repl_key_fn)(void *st, uint32_t slot, uint64_t step);

/* The `want` present, non-busy slots with the lowest keys, lowest first. */
uint32_t repl_lowest(void *st, uint32_t n_slots, const uint8_t *present, repl_key_fn key,
		     uint32_t want, uint32_t *out, uint64_t step, kvmem_slot_pred busy, void *arg);

/* Per-block values decayed to a step, remembered across evictions. */
struct repl_blockvals {
	double *val;
	uint64_t *at;
	size_t n;
};
/* Make room for `block`; -1 when out of memory. */
int repl_blockvals_grow(struct repl_blockvals *bv, uint64_t block);
/* The value of `block` at `step` (0 when never set). */
double repl_blockvals_get(const struct repl_blockvals *bv, uint64_t block, uint64_t step,
			  double half_life);
/* Add x to `block`'s value at `step`. */
void repl_blockvals_add(struct repl_blockvals *bv, uint64_t block, double x, uint64_t step,
			double half_life);
void repl_blockvals_free(struct repl_blockvals *bv);

/* x halved every `half_life` steps over `steps` steps. */
double repl_decay(double x, uint64_t steps, double half_life);

#endif

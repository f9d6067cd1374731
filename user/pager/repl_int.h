/* SPDX-License-Identifier: MIT */
/* The replacement policies' ops table and what they share (private:
 * kvmem/pager.h names them, kvmem_repl_at). */
#ifndef KVMEM_PAGER_REPL_INT_H
#define KVMEM_PAGER_REPL_INT_H

#include "kvmem/pager.h"

/* ---- replacement policies ---------------------------------------------- */
/*
 * Which resident pages leave the host pool when room is needed. State is per
 * slot; the pager tells the policy about inserts, accesses and removals and
 * asks for victims, passing a predicate for slots that may not leave now
 * (pinned, being read).
 */
typedef int (*kvmem_slot_pred)(void *arg, uint32_t slot);

typedef struct kvmem_repl_ops {
	const char *name;
	const char *what;	/* one line for --help */
	void *(*create)(uint32_t n_slots, uint32_t n_layers);
	void (*destroy)(void *st);
	void (*insert)(void *st, uint32_t slot, uint64_t page, uint64_t step);
	void (*touch)(void *st, uint32_t slot, uint64_t step);
	void (*remove)(void *st, uint32_t slot);
	/* Selector feedback: block's score this step in [0, 1] (1: chosen). */
	void (*hint)(void *st, uint64_t block, float score, uint64_t step);
	void (*step)(void *st, uint64_t step);	/* step boundary: aging */
	/* Up to `want` evictable slots, best victims first; returns the count. */
	uint32_t (*victims)(void *st, uint32_t want, uint32_t *out, uint64_t step,
			    kvmem_slot_pred busy, void *arg);
} kvmem_repl_ops;

/* NULL-terminated list: lru, lfu, score. */
extern const kvmem_repl_ops *const kvmem_repl_policies[];
const kvmem_repl_ops *kvmem_repl_find(const char *name);

/*
 * A step sequence for replaying policies offline: step s fetches
 * pages[step_off[s] .. step_off[s + 1]) and, before that, hints
 * hint_block/hint_score[hint_off[s] .. hint_off[s + 1]) (hint_off may be
 * NULL). Pages of the step being fetched cannot be evicted, as in the pager.
 */
typedef struct kvmem_repl_trace {
	size_t n_steps;
	const size_t *step_off;
	const uint64_t *pages;
	const size_t *hint_off;
	const uint64_t *hint_block;
	const float *hint_score;
} kvmem_repl_trace;

/* Replay a trace on a pool of n_slots pages; returns the hit rate (or -1). */
double kvmem_repl_simulate(const kvmem_repl_ops *ops, uint32_t n_slots, uint32_t n_layers,
			 const kvmem_repl_trace *t, uint64_t *hits, uint64_t *misses);

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
/* Make room for `block`; -ENOMEM when out of memory. */
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

/* SPDX-License-Identifier: MIT */
/* The lab's replay state, private to user/lab. */
#ifndef KVMEM_LAB_INT_H
#define KVMEM_LAB_INT_H

#include <stdint.h>

#include "kvmem/lab.h"
#include "lab/trace.h"
#include "pager/repl_int.h"
#include "kvmem/store.h"

/* The oracle's masses and plans at one (block, span, budget, sink, recent,
 * queries), per step: compare reuses them across policies. */
struct lab_oracle {
	int valid, block, qtok, qspan;
	int64_t span, budget, sink, recent;
	double **mass;		/* [n_sel][n_blocks] */
	int64_t **plan;		/* [n_sel][n_plan] the oracle's view blocks */
	int *n_plan;
};

struct kvmem_lab {
	struct lab_trace t;
	char dir[4096];
	kvmem_workspace_info wi;
	int L, Hq, Hkv, D;
	int64_t n_tokens;
	int32_t *ids;
	float *k;		/* [L][n_tokens][Hkv][D]: every token's raw K */
	struct lab_oracle oc;
};

/* load.c: the workspace's tokens and raw K. */
int lab_load(kvmem_lab *lab, const char *dir);

/*
 * A page source over the lab's raw K at block size `block` (K only; V reads
 * give zeros), counting reads into a list the replay inspects. Pages are
 * built on get and freed on put.
 */
struct lab_ksrc {
	const kvmem_lab *lab;
	int block;
	struct lab_read {
		int64_t block;
		int layer;
	} *reads;
	size_t n_reads, cap_reads;
	struct lab_held {
		int64_t block;
		int layer;
		float *page;
	} *held;		/* pages got and not yet put */
	size_t n_held, cap_held;
};
void lab_ksrc_init(struct lab_ksrc *ks, kvmem_page_source *src, const kvmem_lab *lab, int block);
void lab_ksrc_free(struct lab_ksrc *ks);

/* cache.c: a host pool simulated with a replacement policy (the same calls
 * the pager makes, as kvmem_repl_simulate), plus inserts for pages written
 * by appends, which the pager keeps in its pool. */
struct lab_cache {
	const kvmem_repl_ops *ops;
	void *st;
	uint32_t n_slots, used;
	uint64_t *slot_page;	/* UINT64_MAX: free */
	uint64_t *slot_step;	/* step of the last fetch + 1 */
	uint32_t *where;	/* page -> slot, UINT32_MAX: not resident */
	uint64_t n_where;
	uint64_t step;
};
int lab_cache_init(struct lab_cache *c, const kvmem_repl_ops *ops, uint32_t n_slots,
		   uint32_t n_layers);
void lab_cache_free(struct lab_cache *c);
void lab_cache_step(struct lab_cache *c, uint64_t step);
void lab_cache_hint(struct lab_cache *c, uint64_t block, float score);
/* A read: 1 a hit, 0 a miss (brought in when a slot can be had); -1 ENOMEM. */
int lab_cache_read(struct lab_cache *c, uint64_t page);
/* A page written by an append (staged out and kept in the pool). */
int lab_cache_write(struct lab_cache *c, uint64_t page);

#endif

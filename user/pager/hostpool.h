/* SPDX-License-Identifier: MIT */
/* The pager's host pool (private: kvmem/pager.h is the pager's API). */
#ifndef KVMEM_PAGER_HOSTPOOL_H
#define KVMEM_PAGER_HOSTPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "kvmem/pager.h"

/* ---- host pool ---------------------------------------------------------- */
/*
 * Fixed-size slots in one 2 MiB-aligned anonymous mapping, advised for
 * transparent huge pages and bound to a NUMA node (libnuma), so it can be
 * registered with io_uring and pinned by CUDA as one region. Slots are handed
 * out in contiguous runs where possible, so consecutive pages of a block land
 * in consecutive slots and move as one large request.
 */
/* The public kvmem_pager_pool (a shared pool) is this type. */
typedef struct kvmem_pager_pool kvmem_hostpool;

/* cap: bytes; slot_bytes: multiple of KVMEM_IO_ALIGN; numa_node -1 = local. */
kvmem_hostpool *kvmem_hostpool_create(uint64_t cap, size_t slot_bytes, int numa_node);
void kvmem_hostpool_free(kvmem_hostpool *hp);
uint32_t kvmem_hostpool_slots(const kvmem_hostpool *hp);
uint32_t kvmem_hostpool_free_slots(const kvmem_hostpool *hp);
size_t kvmem_hostpool_slot_bytes(const kvmem_hostpool *hp);
void *kvmem_hostpool_slot(const kvmem_hostpool *hp, uint32_t slot);
/* Allocate up to `want` consecutive free slots; returns how many (0: none
 * free) and the first in *first. */
uint32_t kvmem_hostpool_alloc_run(kvmem_hostpool *hp, uint32_t want, uint32_t *first);
void kvmem_hostpool_release(kvmem_hostpool *hp, uint32_t first, uint32_t n);
int kvmem_hostpool_is_free(const kvmem_hostpool *hp, uint32_t slot);
/* The whole mapping (for io_uring / cudaHostRegister). */
void kvmem_hostpool_region(const kvmem_hostpool *hp, void **base, size_t *len);
int kvmem_hostpool_node(const kvmem_hostpool *hp);	/* -1 when NUMA is unavailable */
/* 2: reserved huge pages (MAP_HUGETLB); 1: MADV_HUGEPAGE accepted; 0 */
int kvmem_hostpool_huge(const kvmem_hostpool *hp);

/* What each slot holds, for whichever pager has it: the page id
 * (UINT64_MAX: none) and its pins. */
uint64_t *kvmem_hostpool_slot_pages(const kvmem_hostpool *hp);
uint16_t *kvmem_hostpool_slot_pins(const kvmem_hostpool *hp);

/* Shared pools (kvmem_pager_pool_create): 1 when shared; the pagers that
 * use it; reclaim asks every user but self, under the pool's lock, to give
 * back up to `want` slots (give: how many it freed; it must not wait for a
 * lock of its own). Returns the slots given back. */
int kvmem_hostpool_shared(const kvmem_hostpool *hp);
/* Pagers using the pool now (1 for a pager's own). */
uint32_t kvmem_hostpool_users(const kvmem_hostpool *hp);
/* Hold a shared pool's lock (recursive; nothing for a pager's own pool):
 * room made and the slots then taken, with no other pager between. */
void kvmem_hostpool_lock(kvmem_hostpool *hp);
void kvmem_hostpool_unlock(kvmem_hostpool *hp);
int kvmem_hostpool_attach(kvmem_hostpool *hp, void *user);
void kvmem_hostpool_detach(kvmem_hostpool *hp, void *user);
/* Ask the other users for up to `want` slots, each keeping `floor` of its
 * own (give's third argument); the slots they freed. */
uint32_t kvmem_hostpool_reclaim(kvmem_hostpool *hp, void *self, uint32_t want, uint32_t floor,
				uint32_t (*give)(void *user, uint32_t want, uint32_t floor));

kvmem_hostpool *kvmem_pager_hostpool(kvmem_pager *p);

#endif

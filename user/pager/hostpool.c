// SPDX-License-Identifier: MIT
/*
 * The host pool: fixed-size slots in one anonymous mapping of reserved huge
 * pages where the system has them, else 2 MiB aligned (so transparent huge
 * pages can back it), bound to one NUMA node, and handed out from a bitmap
 * in contiguous runs.
 */
#include <errno.h>
#include <numa.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pager/pager_int.h"

#define HUGE_2M (2u << 20)

struct kvmem_hostpool {
	uint8_t *base;		/* 2 MiB aligned */
	size_t len;		/* slots * slot_bytes, rounded to 2 MiB */
	void *map;		/* what mmap returned */
	size_t map_len;
	size_t slot_bytes;
	uint32_t n_slots, n_free, rover;
	uint64_t *used;		/* bitmap, 1 = in use */
	int node, huge;
};

static int local_node(void)
{
	int cpu = sched_getcpu();

	if (numa_available() < 0)
		return -1;
	return cpu < 0 ? 0 : numa_node_of_cpu(cpu);
}

kvmem_hostpool *kvmem_hostpool_create(uint64_t cap, size_t slot_bytes, int numa_node)
{
	kvmem_hostpool *hp;
	uint64_t n;

	if (!slot_bytes || slot_bytes % KVMEM_IO_ALIGN) {
		kvmem_error(EINVAL, "host pool: slot size %zu is not a positive multiple of %u", slot_bytes,
			  KVMEM_IO_ALIGN);
		return NULL;
	}
	n = cap / slot_bytes;
	if (!n) {
		kvmem_error(EINVAL, "host pool: cap of %llu bytes holds no page of %zu bytes",
			  (unsigned long long)cap, slot_bytes);
		return NULL;
	}
	if (n > UINT32_MAX - 1)
		n = UINT32_MAX - 1;
	hp = calloc(1, sizeof(*hp));
	if (!hp) {
		kvmem_error(ENOMEM, "host pool: out of memory");
		return NULL;
	}
	hp->slot_bytes = slot_bytes;
	hp->n_slots = hp->n_free = (uint32_t)n;
	hp->len = round_up(n * slot_bytes, HUGE_2M);
	/* Reserved 2 MiB pages where the system keeps some (vm.nr_hugepages):
	 * registration then pins 128 pages for 256 MiB, not 65536; else
	 * transparent huge pages, asked for below. */
	hp->map_len = hp->len;
	hp->map = mmap(NULL, hp->map_len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | (21 << MAP_HUGE_SHIFT), -1, 0);
	if (hp->map != MAP_FAILED) {
		hp->huge = 2;
	} else {
		hp->map_len = hp->len + HUGE_2M;
		hp->map = mmap(NULL, hp->map_len, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	}
	hp->used = calloc((n + 63) / 64, 8);
	if (hp->map == MAP_FAILED || !hp->used) {
		kvmem_error(errno, "host pool: cannot map %zu bytes: %s", hp->map_len, strerror(errno));
		if (hp->map != MAP_FAILED)
			munmap(hp->map, hp->map_len);
		free(hp->used);
		free(hp);
		return NULL;
	}
	hp->base = (uint8_t *)round_up((uintptr_t)hp->map, HUGE_2M);
	if (hp->huge != 2)
		hp->huge = madvise(hp->base, hp->len, MADV_HUGEPAGE) == 0;
	hp->node = numa_node >= 0 ? numa_node : local_node();
	if (hp->node >= 0 && numa_available() >= 0) {
		if (hp->node > numa_max_node()) {
			kvmem_error(EINVAL, "host pool: NUMA node %d does not exist (max %d)", hp->node,
				  numa_max_node());
			kvmem_hostpool_free(hp);
			return NULL;
		}
		/* Before first touch, so every page is allocated on the node. */
		numa_tonode_memory(hp->base, hp->len, hp->node);
	} else {
		hp->node = -1;
	}
	return hp;
}

void kvmem_hostpool_free(kvmem_hostpool *hp)
{
	if (!hp)
		return;
	munmap(hp->map, hp->map_len);
	free(hp->used);
	free(hp);
}

uint32_t kvmem_hostpool_slots(const kvmem_hostpool *hp) { return hp->n_slots; }
uint32_t kvmem_hostpool_free_slots(const kvmem_hostpool *hp) { return hp->n_free; }
size_t kvmem_hostpool_slot_bytes(const kvmem_hostpool *hp) { return hp->slot_bytes; }
int kvmem_hostpool_node(const kvmem_hostpool *hp) { return hp->node; }
int kvmem_hostpool_huge(const kvmem_hostpool *hp) { return hp->huge; }

void *kvmem_hostpool_slot(const kvmem_hostpool *hp, uint32_t slot)
{
	return hp->base + (size_t)slot * hp->slot_bytes;
}

void kvmem_hostpool_region(const kvmem_hostpool *hp, void **base, size_t *len)
{
	*base = hp->base;
	*len = hp->len;
}

static int used(const kvmem_hostpool *hp, uint32_t s)
{
	return (hp->used[s / 64] >> (s % 64)) & 1;
}

int kvmem_hostpool_is_free(const kvmem_hostpool *hp, uint32_t slot)
{
	return slot < hp->n_slots && !used(hp, slot);
}

/* First free slot at or after `from`, wrapping; n_slots when none. */
static uint32_t find_free(const kvmem_hostpool *hp, uint32_t from)
{
	uint32_t words = (hp->n_slots + 63) / 64;

	for (uint32_t i = 0; i <= words; i++) {
		uint32_t w = (from / 64 + i) % words;
		uint64_t bits = ~hp->used[w];

		if (i == 0)
			bits &= ~0ull << (from % 64);
		while (bits) {
			uint32_t s = w * 64 + __builtin_ctzll(bits);

			if (s < hp->n_slots)
				return s;
			bits &= bits - 1;
		}
	}
	return hp->n_slots;
}

uint32_t kvmem_hostpool_alloc_run(kvmem_hostpool *hp, uint32_t want, uint32_t *first)
{
	uint32_t s, n = 0;

	if (!hp->n_free || !want)
		return 0;
	s = find_free(hp, hp->rover < hp->n_slots ? hp->rover : 0);
	if (s == hp->n_slots)
		return 0;
	while (n < want && s + n < hp->n_slots && !used(hp, s + n)) {
		hp->used[(s + n) / 64] |= 1ull << ((s + n) % 64);
		n++;
	}
	*first = s;
	hp->n_free -= n;
	hp->rover = s + n;
	return n;
}

void kvmem_hostpool_release(kvmem_hostpool *hp, uint32_t first, uint32_t n)
{
	for (uint32_t s = first; s < first + n && s < hp->n_slots; s++) {
		if (used(hp, s)) {
			hp->used[s / 64] &= ~(1ull << (s % 64));
			hp->n_free++;
		}
	}
}

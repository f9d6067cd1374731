// SPDX-License-Identifier: MIT
/*
 * The host pool: fixed-size slots in one anonymous mapping of reserved huge
 * pages where the system has them, else 2 MiB aligned (so transparent huge
 * pages can back it), bound to one NUMA node, and handed out from a bitmap
 * in contiguous runs, lowest free slot first.
 *
 * A pool is a pager's own, or shared by several (kvmem_pager_pool_create:
 * kvmem serve's conversations): then every call that hands out or takes
 * back slots holds the pool's lock (recursive: a pager giving slots back
 * for another, under reclaim, releases them from inside it), and the pool
 * knows its pagers so one short of room can ask the others for theirs.
 * What each slot holds (page id, pins) is kept here for every user alike:
 * a slot is one pager's at a time, and only that pager touches its entry.
 */
#include <errno.h>
#include <numa.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pager/pager_int.h"

#define HUGE_2M (2u << 20)

struct kvmem_pager_pool {
	uint8_t *base;		/* 2 MiB aligned */
	size_t len;		/* slots * slot_bytes, rounded to 2 MiB */
	void *map;		/* what mmap returned */
	size_t map_len;
	size_t slot_bytes;
	uint32_t n_slots, n_free, rover;
	uint64_t *used;		/* bitmap, 1 = in use */
	uint64_t *slot_page;	/* per slot: its owner's page id, UINT64_MAX: none */
	uint16_t *slot_pin;	/* per slot: pins */
	int node, huge;
	int shared;		/* made by kvmem_pager_pool_create */
	pthread_mutex_t mu;	/* shared pools: the bitmap and the users */
	void **users;		/* shared pools: the pagers attached */
	int n_users, cap_users;
};

static void lock(kvmem_hostpool *hp)
{
	if (hp->shared)
		pthread_mutex_lock(&hp->mu);
}

static void unlock(kvmem_hostpool *hp)
{
	if (hp->shared)
		pthread_mutex_unlock(&hp->mu);
}

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
	hp->slot_page = malloc(n * sizeof(*hp->slot_page));
	hp->slot_pin = calloc(n, sizeof(*hp->slot_pin));
	if (hp->map == MAP_FAILED || !hp->used || !hp->slot_page || !hp->slot_pin) {
		int err = hp->map == MAP_FAILED ? errno : ENOMEM;

		kvmem_error(err, "host pool: cannot map %zu bytes: %s", hp->map_len, strerror(err));
		if (hp->map != MAP_FAILED)
			munmap(hp->map, hp->map_len);
		free(hp->used);
		free(hp->slot_page);
		free(hp->slot_pin);
		free(hp);
		return NULL;
	}
	for (uint64_t s = 0; s < n; s++)
		hp->slot_page[s] = UINT64_MAX;
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
	free(hp->slot_page);
	free(hp->slot_pin);
	free(hp->users);
	if (hp->shared)
		pthread_mutex_destroy(&hp->mu);
	free(hp);
}

int kvmem_pager_pool_create(const kvmem_page_geom *g, uint64_t bytes, int numa_node,
			    kvmem_hostpool **out)
{
	pthread_mutexattr_t ma;
	kvmem_hostpool *hp;

	*out = NULL;
	if (kvmem_page_geom_check(g, "shared host pool") < 0)
		return kvmem_fail();
	hp = kvmem_hostpool_create(bytes, kvmem_page_stride(g), numa_node);
	if (!hp)
		return kvmem_fail();
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
	if (pthread_mutex_init(&hp->mu, &ma)) {
		pthread_mutexattr_destroy(&ma);
		kvmem_hostpool_free(hp);
		return kvmem_error(ENOMEM, "shared host pool: cannot make its lock");
	}
	pthread_mutexattr_destroy(&ma);
	hp->shared = 1;
	*out = hp;
	return 0;
}

int kvmem_pager_pool_free(kvmem_hostpool *hp)
{
	int users;

	if (!hp)
		return 0;
	if (!hp->shared)
		return kvmem_error(EINVAL, "host pool: not a shared pool (its pager frees it)");
	pthread_mutex_lock(&hp->mu);
	users = hp->n_users;
	pthread_mutex_unlock(&hp->mu);
	if (users)
		return kvmem_error(EBUSY, "shared host pool: %d pagers still use it; close them first",
				   users);
	kvmem_hostpool_free(hp);
	return 0;
}

int kvmem_hostpool_shared(const kvmem_hostpool *hp) { return hp->shared; }
uint32_t kvmem_hostpool_users(const kvmem_hostpool *hp)
{
	kvmem_hostpool *w = (kvmem_hostpool *)hp;
	int n;

	lock(w);
	n = hp->n_users;
	unlock(w);
	return n > 1 ? (uint32_t)n : 1;
}

void kvmem_hostpool_lock(kvmem_hostpool *hp) { lock(hp); }
void kvmem_hostpool_unlock(kvmem_hostpool *hp) { unlock(hp); }
uint64_t *kvmem_hostpool_slot_pages(const kvmem_hostpool *hp) { return hp->slot_page; }
uint16_t *kvmem_hostpool_slot_pins(const kvmem_hostpool *hp) { return hp->slot_pin; }

int kvmem_hostpool_attach(kvmem_hostpool *hp, void *user)
{
	int rc = 0;

	lock(hp);
	if (hp->n_users == hp->cap_users) {
		int cap = hp->cap_users ? 2 * hp->cap_users : 8;
		void **u = realloc(hp->users, cap * sizeof(*u));

		if (!u)
			rc = kvmem_error(ENOMEM, "shared host pool: out of memory");
		else
			hp->users = u, hp->cap_users = cap;
	}
	if (!rc)
		hp->users[hp->n_users++] = user;
	unlock(hp);
	return rc;
}

void kvmem_hostpool_detach(kvmem_hostpool *hp, void *user)
{
	lock(hp);
	for (int i = 0; i < hp->n_users; i++)
		if (hp->users[i] == user) {
			hp->users[i] = hp->users[--hp->n_users];
			break;
		}
	unlock(hp);
}

uint32_t kvmem_hostpool_reclaim(kvmem_hostpool *hp, void *self, uint32_t want, uint32_t floor,
				uint32_t (*give)(void *user, uint32_t want, uint32_t floor))
{
	uint32_t got = 0;

	if (!hp->shared)
		return 0;
	/* Under the lock, so no user leaves while it is asked; each one is
	 * asked without waiting for it (give takes its lock or passes). */
	pthread_mutex_lock(&hp->mu);
	for (int i = 0; i < hp->n_users && got < want; i++)
		if (hp->users[i] != self)
			got += give(hp->users[i], want - got, floor);
	pthread_mutex_unlock(&hp->mu);
	return got;
}

uint32_t kvmem_hostpool_slots(const kvmem_hostpool *hp) { return hp->n_slots; }

uint32_t kvmem_hostpool_free_slots(const kvmem_hostpool *hp)
{
	return __atomic_load_n(&hp->n_free, __ATOMIC_RELAXED);
}

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

void kvmem_pager_pool_region(const kvmem_pager_pool *pool, void **base, size_t *len)
{
	kvmem_hostpool_region(pool, base, len);
}

static int used(const kvmem_hostpool *hp, uint32_t s)
{
	return (hp->used[s / 64] >> (s % 64)) & 1;
}

int kvmem_hostpool_is_free(const kvmem_hostpool *hp, uint32_t slot)
{
	kvmem_hostpool *w = (kvmem_hostpool *)hp;
	int f;

	lock(w);
	f = slot < hp->n_slots && !used(hp, slot);
	unlock(w);
	return f;
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

	lock(hp);
	if (!hp->n_free || !want)
		goto out;
	s = find_free(hp, hp->rover < hp->n_slots ? hp->rover : 0);
	if (s == hp->n_slots)
		goto out;
	while (n < want && s + n < hp->n_slots && !used(hp, s + n)) {
		hp->used[(s + n) / 64] |= 1ull << ((s + n) % 64);
		n++;
	}
	*first = s;
	__atomic_store_n(&hp->n_free, hp->n_free - n, __ATOMIC_RELAXED);
	hp->rover = s + n;
out:
	unlock(hp);
	return n;
}

void kvmem_hostpool_release(kvmem_hostpool *hp, uint32_t first, uint32_t n)
{
	lock(hp);
	/* Every slot below the rover is in use: the next run is the lowest
	 * free one. Memory the pool touched once is taken again before any
	 * it never touched (first touch zeroes it: a shared pool stays warm,
	 * and holds only what its users ever needed at once). */
	if (first < hp->rover)
		hp->rover = first;
	for (uint32_t s = first; s < first + n && s < hp->n_slots; s++) {
		if (used(hp, s)) {
			hp->used[s / 64] &= ~(1ull << (s % 64));
			__atomic_store_n(&hp->n_free, hp->n_free + 1, __ATOMIC_RELAXED);
		}
	}
	unlock(hp);
}

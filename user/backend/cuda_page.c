// SPDX-License-Identifier: MIT
/*
 * The cuda backend's paging path: how history pages reach view slots.
 *
 *   registered host memory  A pager's host pool, pinned and mapped once with
 *                           cudaHostRegister (host_register): the device
 *                           reads pages where the pager put them, whether
 *                           io_uring read them from NVMe by O_DIRECT or the
 *                           stage-out left them there. No bounce buffer.
 *   other host memory       (a memory source, the pager source's blocks
 *                           still filling) copied as they are (any dtype,
 *                           no conversion) into a pinned staging buffer.
 *   device memory           pages already on the GPU, read in place.
 *   the device page pool    recently placed pages of registered memory kept
 *                           on the GPU as bf16, keyed by (region, owner,
 *                           block, layer): a page that enters the view again
 *                           comes from HBM. The owner (kvmem_place.owner) is
 *                           the session whose block numbers they are: the
 *                           sessions of a server share one host pool (one
 *                           region) and each numbers its blocks from 0, so
 *                           without it the pool could keep nothing of a
 *                           shared region. Only whole pages of registered memory
 *                           are kept (a pager's staged-out blocks, which
 *                           never change); filled by the gather kernel on
 *                           its way (copy_k / copy_v), evicted by a clock.
 *                           Pages entering and leaving it are reported
 *                           to a watcher (pool_watch: the session, which
 *                           tells its source, so the module's page table
 *                           shows the GPU tier).
 *                           An fp8 backend's pool (KVMEM_CUDA_FP8_POOL=1;
 *                           off by default, not yet run on a GPU) keeps
 *                           fp8 pages instead, each slot the page's bytes
 *                           as the pager lays them out (K, V, their row
 *                           scales: kvmem_page_at), so a slot is the
 *                           page's size (0.52 of bf16's at Qwen3-8B):
 *                           cuda_view_fp8.c's place() reads a slot as it
 *                           reads the page, the same bytes.
 *
 * One place() call is one gather kernel (kernels/cuda/gather.cu) over all
 * its items: each reads its tokens from wherever they are, rounds f32 to
 * bf16, rotates K at the slot (the forward pass's rotation) and writes the
 * view. Method "batch" instead first brings registered pages to a device
 * staging buffer with one cudaMemcpyBatchAsync (adjacent pages merged into
 * one copy) and gathers from there; "pack" is the first version (CPU
 * conversion to bf16, two uploads, the scatter kernel). `kvmem bench step`
 * measures them against one large pinned copy.
 *
 * Device memory the path holds (staging, the pool, item lists) is counted
 * in the backend's total and kept under its cap.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "backend/cuda_backend.h"
#include "backend/pool_watch.h"
#include "util/hostmem.h"
#include "util/clock.h"

#define MAX_REGIONS 16
/* (region, owner) pairs the pool keeps pages of at once; a key's top 8
 * bits name one (1..255). */
#define MAX_OWNERS 255

struct region {
	char *base, *dev;	/* host address, the device's address of it */
	size_t len;
	int refs;
	uint32_t id;		/* 1..255, part of a pool key */
};

struct copy {
	const char *src;
	size_t len, dst;	/* dst: offset in the device staging */
	int item;
};

struct cuda_pages {
	int method;			/* CUDA_PLACE_* */
	struct region reg[MAX_REGIONS];
	uint32_t next_id;
	/* item lists */
	struct cuda_ring ring;	/* the gather's items (cuda_ring.c) */
	int cap_items;
	/* staging: pinned host (pages the device cannot address), device
	 * (method batch) */
	char *host_st, *dev_st;
	size_t cap_host_st, cap_dev_st;
	struct copy *copies;
	uint64_t *keys;			/* [cap_items]: an item's pool key (0: none) */
	uint32_t *hit;			/* [cap_items]: its pool slot on a hit */
	void **c_dst;
	const void **c_src;
	size_t *c_len;
	int cap_copies;
	/* the device page pool */
	struct owner {
		uint32_t region;	/* the region's id; 0: a free entry */
		uint32_t owner;
		uint64_t used;		/* tick of the last use, for reuse */
	} own[MAX_OWNERS];
	uint64_t own_tick;
	uint16_t *pool;			/* [slots][2][H][B][D] bf16; fp8: [slots] of
					 * 4 * slot_elems bytes, each a page as is */
	uint64_t pool_want;		/* bytes asked for (0: default) */
	size_t slot_elems;		/* elements of one half (K or V); fp8: a
					 * quarter of the slot's bytes */
	int pool_stride;		/* B the pool was laid out for */
	uint32_t slots, used, hand, free_hand;
	uint64_t *key;			/* [slots]: 0 free */
	uint32_t *chain, *head;		/* hash chains, UINT32_MAX ends */
	uint32_t n_head;
	uint8_t *ref;			/* clock bits */
	uint64_t *stamp;		/* the place() call that last used it */
	uint64_t *filled;		/* the place() call that filled it */
	uint64_t call;
	/* Changes whenever a slot's page leaves it or the slots are made
	 * anew: page_cached()'s tokens name the epoch they were given in. */
	uint32_t epoch;
	uint64_t dev_bytes;		/* device memory held here */
	kvmem_pool_watches watch;	/* who hears of pages entering and leaving */
	kvmem_place_stats st;
	int fp8_pool;			/* an fp8 backend's KVMEM_CUDA_FP8_POOL: 1 the
					 * pool keeps fp8 pages, 0 none, -1 a bad value */
	int hash_spread;		/* KVMEM_CUDA_POOL_HASH=spread: every key
					 * hashed alone (hash_of) */
};

/* KVMEM_CUDA_FP8_POOL: unset, empty or 1: a pool for fp8 pages (the
 * default since 2026-12-02: on the H200 a warm step at a 32K view went
 * from 34.6 to 23.9 ms with it, tests/gpu/fp8pool27.sh); 0: none, pages
 * read over PCIe; else -1 (place() says so). */
static int fp8_pool_knob(void)
{
	const char *e = getenv("KVMEM_CUDA_FP8_POOL");

	if (!e || !*e || !strcmp(e, "1"))
		return 1;
	return strcmp(e, "0") ? -1 : 0;
}

static struct cuda_pages *pages_of(struct cuda *b)
{
	if (!b->pages) {
		b->pages = calloc(1, sizeof(*b->pages));
		if (!b->pages) {
			kvmem_error(ENOMEM, "cuda: out of memory");
			return NULL;
		}
		b->pages->method = CUDA_PLACE_GATHER;
		b->pages->pool_want = b->page_pool;
		b->pages->next_id = 1;
		b->pages->fp8_pool = b->fp8 ? fp8_pool_knob() : 0;
		b->pages->hash_spread = getenv("KVMEM_CUDA_POOL_HASH") &&
					!strcmp(getenv("KVMEM_CUDA_POOL_HASH"), "spread");
	}
	return b->pages;
}

int cuda_pages_fp8_pool(struct cuda *b)
{
	struct cuda_pages *pg = pages_of(b);

	if (!pg)
		return kvmem_fail();
	if (pg->fp8_pool < 0)
		return kvmem_error(EINVAL, "cuda: KVMEM_CUDA_FP8_POOL='%s' (0: no device page pool "
				   "for fp8 pages, 1: one)", getenv("KVMEM_CUDA_FP8_POOL"));
	return pg->fp8_pool;
}

/* An fp8 page's bytes: K and V, then a 4-byte scale per row of each. */
static size_t fp8_page_bytes(const struct cuda *b, int stride)
{
	return (size_t)2 * b->c->n_kv_heads * stride * (b->c->head_dim + 4);
}

uint64_t cuda_pages_dev_bytes(const struct cuda *b)
{
	return b->pages ? b->pages->dev_bytes : 0;
}

/* ---- the device page pool ---------------------------------------------- */
static void pool_note(struct cuda_pages *pg, uint32_t s, uint32_t slot);

static void pool_free(struct cuda *b, struct cuda_pages *pg)
{
	for (uint32_t s = 0; pg->key && s < pg->slots; s++)
		if (pg->key[s])
			pool_note(pg, s, KVMEM_DEVICE_NONE);
	kvmem_pool_flush(&pg->watch);
	if (pg->pool) {
		kvmem_cuda_sync(b->ctx);	/* a gather left running reads it */
		pg->dev_bytes -= (uint64_t)pg->slots * 2 * pg->slot_elems * 2;
		kvmem_cuda_free(pg->pool);
	}
	free(pg->key);
	free(pg->chain);
	free(pg->head);
	free(pg->ref);
	free(pg->stamp);
	free(pg->filled);
	pg->pool = NULL;
	pg->key = NULL;
	pg->chain = pg->head = NULL;
	pg->ref = NULL;
	pg->stamp = NULL;
	pg->filled = NULL;
	pg->slots = pg->used = pg->hand = pg->free_hand = pg->n_head = 0;
	pg->st.pool_pages = pg->st.pool_cap = 0;
	pg->epoch++;
}

void cuda_pages_drop_pool(struct cuda *b)
{
	if (b->pages)
		pool_free(b, b->pages);
}

/* Bytes the pool may take now: what was asked (or the default), within
 * what the cap leaves. */
/* The default: twice the raw pages of the view being placed into, at
 * least 64 MiB, within half of what a cap leaves (the 1M demo under
 * --gpu-mem 24G) or, without a cap, half of the device's free memory. One
 * pool per backend: the sessions of a server share it (keyed by owner), and
 * a small conversation's backend holds a small one. Without a cap
 * pool_fill() grows it (pool_grow) while it has pages to keep: an agent's
 * step enters pages of blocks anywhere in the history (a new subject 1400
 * blocks, 6.6 GB, at Qwen3-8B), which cross PCIe at 55 GB/s unless the
 * pool holds them; on an H200 a 256K workspace's 38.65 GB of pages fit. */
static uint64_t pool_budget(struct cuda *b, struct cuda_pages *pg, int64_t view_cap)
{
	uint64_t want = pg->pool_want, used = cuda_dev_used(b), margin = CUDA_CAP_MARGIN;
	uint64_t cap = b->mem_cap, limit;
	size_t free_b = 0, total_b = 0;

	if (!want) {
		want = 2 * (uint64_t)view_cap * b->c->n_layers * b->c->n_kv_heads * b->c->head_dim * 2 * 2;
		if (want < (64ull << 20))
			want = 64ull << 20;
	}
	if (cap) {
		if (used + margin >= cap)
			return 0;
		limit = (cap - used - margin) / 2;
	} else {
		if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
			cudaGetLastError();
			free_b = 1ull << 30;
		}
		limit = free_b / 2;
	}
	if (pg->pool_want)	/* asked for (the "pool" setting): as asked, within the cap */
		return cap && want > cap - used - margin ? cap - used - margin : want;
	return want < limit ? want : limit;
}

/* A pool for pages of `stride` tokens, made on first use. */
static void pool_make(struct cuda *b, struct cuda_pages *pg, int stride, int64_t view_cap)
{
	/* fp8: a slot of the page's bytes rounded up to 256 (aligned for the
	 * gather's 16-byte loads), counted in quarters */
	const size_t half = pg->fp8_pool == 1 ?
				    ((fp8_page_bytes(b, stride) + 255) & ~(size_t)255) / 4 :
				    (size_t)b->c->n_kv_heads * stride * b->c->head_dim;
	uint64_t bytes = pool_budget(b, pg, view_cap);
	uint32_t n = (uint32_t)(bytes / (2 * half * 2) < (1u << 24) ? bytes / (2 * half * 2) : (1u << 24));

	if (pg->pool && pg->pool_stride == stride)
		return;
	pool_free(b, pg);
	if (n < 16)
		return;		/* not worth it: no pool */
	pg->n_head = 1;
	while (pg->n_head < 2 * n)
		pg->n_head *= 2;
	pg->key = calloc(n, sizeof(*pg->key));
	pg->chain = malloc(n * sizeof(*pg->chain));
	pg->head = malloc(pg->n_head * sizeof(*pg->head));
	pg->ref = calloc(n, 1);
	pg->stamp = calloc(n, sizeof(*pg->stamp));
	pg->filled = calloc(n, sizeof(*pg->filled));
	if (!pg->key || !pg->chain || !pg->head || !pg->ref || !pg->stamp || !pg->filled ||
	    kvmem_cuda_malloc((void **)&pg->pool, (size_t)n * 2 * half * 2) < 0) {
		pg->pool = NULL;
		pool_free(b, pg);	/* no pool: not an error */
		return;
	}
	memset(pg->head, 0xff, pg->n_head * sizeof(*pg->head));
	pg->slots = n;
	pg->slot_elems = half;
	pg->pool_stride = stride;
	pg->dev_bytes += (uint64_t)n * 2 * half * 2;
	pg->st.pool_cap = n;
}

static uint32_t hash_of(const struct cuda_pages *pg, uint64_t k);

/*
 * The default pool (none asked for, no cap) to twice its slots, within
 * half of the device memory free now (counting the pool's own) and what
 * is free beside the old pool while both exist; its pages kept (copied on
 * the device), the hash chains rebuilt. 0, or -1 when it cannot grow (it
 * stays as it was).
 */
static int pool_grow(struct cuda *b, struct cuda_pages *pg)
{
	const size_t slot_bytes = 2 * pg->slot_elems * 2;
	uint64_t *key = NULL, *stamp = NULL, *filled = NULL, want, room;
	uint32_t *chain = NULL, *head = NULL, n, n_head = 1;
	size_t free_b = 0, total_b = 0;
	uint8_t *ref = NULL;
	uint16_t *np = NULL;

	if (!pg->pool || pg->pool_want || b->mem_cap || pg->slots >= (1u << 24))
		return -1;
	if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
		cudaGetLastError();
		return -1;
	}
	want = 2 * (uint64_t)pg->slots;
	room = ((uint64_t)pg->slots * slot_bytes + free_b / 2) / slot_bytes;
	if (free_b > CUDA_CAP_MARGIN && (free_b - CUDA_CAP_MARGIN) / slot_bytes < room)
		room = (free_b - CUDA_CAP_MARGIN) / slot_bytes;
	if (want > room)
		want = room;
	if (want > (1u << 24))
		want = 1u << 24;
	if (want <= pg->slots + pg->slots / 8)
		return -1;	/* not worth a copy */
	n = (uint32_t)want;
	while (n_head < 2 * n)
		n_head *= 2;
	key = calloc(n, sizeof(*key));
	chain = malloc(n * sizeof(*chain));
	head = malloc(n_head * sizeof(*head));
	ref = calloc(n, 1);
	stamp = calloc(n, sizeof(*stamp));
	filled = calloc(n, sizeof(*filled));
	if (!key || !chain || !head || !ref || !stamp || !filled ||
	    kvmem_cuda_malloc((void **)&np, (size_t)n * slot_bytes) < 0) {
		cudaGetLastError();
		goto fail;
	}
	if (cudaMemcpyAsync(np, pg->pool, (size_t)pg->slots * slot_bytes, cudaMemcpyDeviceToDevice,
			    kvmem_cuda_stream(b->ctx)) != cudaSuccess ||
	    kvmem_cuda_sync(b->ctx) < 0) {
		cudaGetLastError();
		kvmem_cuda_free(np);
		goto fail;
	}
	memcpy(key, pg->key, pg->slots * sizeof(*key));
	memcpy(ref, pg->ref, pg->slots);
	memcpy(stamp, pg->stamp, pg->slots * sizeof(*stamp));
	memcpy(filled, pg->filled, pg->slots * sizeof(*filled));
	memset(head, 0xff, n_head * sizeof(*head));
	free(pg->key);
	free(pg->chain);
	free(pg->head);
	free(pg->ref);
	free(pg->stamp);
	free(pg->filled);
	kvmem_cuda_free(pg->pool);
	pg->dev_bytes += (uint64_t)(n - pg->slots) * slot_bytes;
	pg->free_hand = pg->slots;
	pg->key = key;
	pg->chain = chain;
	pg->head = head;
	pg->n_head = n_head;
	pg->ref = ref;
	pg->stamp = stamp;
	pg->filled = filled;
	pg->pool = np;
	pg->slots = n;
	pg->epoch++;
	for (uint32_t s = 0; s < n; s++)
		if (key[s]) {
			uint32_t h = hash_of(pg, key[s]);

			chain[s] = head[h];
			head[h] = s;
		}
	pg->st.pool_cap = n;
	return 0;
fail:
	free(key);
	free(chain);
	free(head);
	free(ref);
	free(stamp);
	free(filled);
	return -1;
}

static uint64_t pool_key(uint32_t oid, int64_t block, int layer)
{
	return (uint64_t)oid << 56 | ((uint64_t)block & ((1ull << 40) - 1)) << 16 |
	       (uint64_t)(layer & 0xffff);
}

/*
 * A key's chain head: its owner and block hashed, its layer added, so a
 * block's layers have adjacent heads (and, taken in order, adjacent
 * slots): the session asks for a block's layers one after another, and
 * each lookup then finds its head's cache line warm where a hash of the
 * whole key sent every layer to another line of a table of megabytes.
 */
static uint32_t hash_of(const struct cuda_pages *pg, uint64_t k)
{
	if (!pg->hash_spread) {
		uint64_t b = k >> 16;

		b ^= b >> 33;
		b *= 0xff51afd7ed558ccdull;
		b ^= b >> 33;
		return (uint32_t)((b << 6) + (k & 0xffff)) & (pg->n_head - 1);
	}
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	return (uint32_t)(k & (pg->n_head - 1));
}

static uint32_t pool_find(const struct cuda_pages *pg, uint64_t k)
{
	for (uint32_t s = pg->head[hash_of(pg, k)]; s != UINT32_MAX; s = pg->chain[s])
		if (pg->key[s] == k)
			return s;
	return UINT32_MAX;
}

/* Tell the watcher of slot s's page (if any) that it entered the pool at
 * `slot` or left it (KVMEM_DEVICE_NONE). */
static void pool_note(struct cuda_pages *pg, uint32_t s, uint32_t slot)
{
	uint64_t k = pg->key[s];
	const struct owner *o;

	if (!pg->watch.n || !k)
		return;
	o = &pg->own[(k >> 56) - 1];
	/* By base, not refs: cuda_host_unregister forgets a region's pages
	 * after its count went to 0, and those leaving must be told too. */
	for (int i = 0; i < MAX_REGIONS; i++)
		if (pg->reg[i].base && pg->reg[i].id == o->region) {
			kvmem_pool_note(&pg->watch, pg->reg[i].base, o->owner,
					(int64_t)(k >> 16 & ((1ull << 40) - 1)), (int)(k & 0xffff),
					slot);
			return;
		}
}

static void pool_unlink(struct cuda_pages *pg, uint32_t s)
{
	uint32_t *p = &pg->head[hash_of(pg, pg->key[s])];

	pool_note(pg, s, KVMEM_DEVICE_NONE);

	while (*p != s)
		p = &pg->chain[*p];
	*p = pg->chain[s];
	pg->key[s] = 0;
	pg->used--;
	pg->epoch++;
}

static void pool_link(struct cuda_pages *pg, uint32_t s, uint64_t k)
{
	uint32_t h;

	if (pg->key[s])
		pool_unlink(pg, s);
	h = hash_of(pg, k);
	pg->key[s] = k;
	pg->chain[s] = pg->head[h];
	pg->head[h] = s;
	pg->ref[s] = 0;
	pg->stamp[s] = pg->call;
	pg->filled[s] = pg->call;
	pg->used++;
}

/* A free slot for key k, evicting nothing (pool_fill's pages must not push
 * out pages a view has used); UINT32_MAX when the pool is full. */
static uint32_t pool_take_free(struct cuda_pages *pg, uint64_t k)
{
	if (pg->used >= pg->slots)
		return UINT32_MAX;
	for (uint32_t i = 0; i < pg->slots; i++) {
		uint32_t c = (pg->free_hand + i) % pg->slots;

		if (!pg->key[c]) {
			pg->free_hand = (c + 1) % pg->slots;
			pool_link(pg, c, k);
			return c;
		}
	}
	return UINT32_MAX;
}

/* A slot for key k: a free one, else the clock's victim (never one this
 * call uses). UINT32_MAX when every slot is in use by this call. */
static uint32_t pool_take(struct cuda_pages *pg, uint64_t k)
{
	uint32_t s = UINT32_MAX;

	for (uint64_t tries = 0; tries < 2ull * pg->slots + 1; tries++) {
		uint32_t c = pg->hand;

		pg->hand = (pg->hand + 1) % pg->slots;
		if (pg->stamp[c] == pg->call && pg->key[c])
			continue;
		if (pg->key[c] && pg->ref[c]) {
			pg->ref[c] = 0;
			continue;
		}
		s = c;
		break;
	}
	if (s == UINT32_MAX)
		return s;
	pool_link(pg, s, k);
	return s;
}

/* Forget every pooled page of owner entry oid (1..MAX_OWNERS). */
static void pool_forget(struct cuda_pages *pg, uint32_t oid)
{
	for (uint32_t s = 0; s < pg->slots; s++)
		if (pg->key[s] && (uint32_t)(pg->key[s] >> 56) == oid)
			pool_unlink(pg, s);
}

/* Forget the pages of region id's owner `owner`, or of all its owners
 * (all: its memory is going away), and free their entries. */
static void owner_forget(struct cuda_pages *pg, uint32_t id, uint32_t owner, int all)
{
	for (uint32_t i = 0; i < MAX_OWNERS; i++)
		if (pg->own[i].region == id && (all || pg->own[i].owner == owner)) {
			pool_forget(pg, i + 1);
			memset(&pg->own[i], 0, sizeof(pg->own[i]));
		}
}

/*
 * The pool's name (1..MAX_OWNERS) for the pages of (region r, owner); 0:
 * none. Owner 0 (a caller that names none) gets one only while the region
 * has one user. make: a new entry when there is none, the least recently
 * used one's pages forgotten when all are taken (owners are never reused,
 * so no entry can name pages of another's).
 */
static uint32_t owner_id(struct cuda_pages *pg, const struct region *r, uint32_t owner, int make)
{
	uint32_t free_i = 0, lru = 0;

	if (!owner && r->refs != 1)
		return 0;
	for (uint32_t i = 0; i < MAX_OWNERS; i++) {
		struct owner *o = &pg->own[i];

		if (o->region == r->id && o->owner == owner) {
			o->used = ++pg->own_tick;
			return i + 1;
		}
		if (!o->region) {
			if (!free_i)
				free_i = i + 1;
		} else if (!lru || o->used < pg->own[lru - 1].used) {
			lru = i + 1;
		}
	}
	if (!make)
		return 0;
	if (!free_i) {
		pool_forget(pg, lru);
		free_i = lru;
	}
	pg->own[free_i - 1] = (struct owner){ .region = r->id, .owner = owner,
					      .used = ++pg->own_tick };
	return free_i;
}

/* ---- registered host memory -------------------------------------------- */
int cuda_host_register(void *ctx, void *base, size_t len)
{
	struct cuda *b = ctx;
	struct cuda_pages *pg = pages_of(b);
	struct region *r = NULL;
	unsigned int flags = cudaHostRegisterMapped | cudaHostRegisterPortable;
	void *dev = NULL;
	cudaError_t e;

	if (!pg)
		return kvmem_fail();
	for (int i = 0; i < MAX_REGIONS; i++)
		if (pg->reg[i].refs && pg->reg[i].base == base) {
			if (pg->reg[i].len != len)
				return kvmem_error(EINVAL, "cuda: host region %p registered with %zu bytes, "
						   "now %zu", base, pg->reg[i].len, len);
			/* Two sessions on one region (a host pool pagers share):
			 * pages of a caller that names no owner no longer name
			 * one page, so the pool keeps none of those from now
			 * until one session is left; sessions' pages are keyed
			 * by their owner and stay. */
			if (pg->reg[i].refs++ == 1)
				owner_forget(pg, pg->reg[i].id, 0, 0);
			kvmem_pool_flush(&pg->watch);
			return 0;
		}
	for (int i = 0; i < MAX_REGIONS && !r; i++)
		if (!pg->reg[i].refs)
			r = &pg->reg[i];
	if (!r)
		return kvmem_error(ENOSPC, "cuda: %d host regions registered already", MAX_REGIONS);
	/* A read-only mapping (the kernel module's window: the kmod source's
	 * region) cannot be pinned for writing: the device maps it read-only,
	 * which place() needs (it only reads registered pages). */
	if (kvmem_host_writable(base, len) == 0) {
		int gpu = 0, ro = 0;

		if (cudaGetDevice(&gpu) != cudaSuccess ||
		    cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, gpu) !=
			    cudaSuccess || !ro) {
			cudaGetLastError();
			return kvmem_error(ENOTSUP, "cuda: host memory at %p (%zu bytes) is mapped "
					   "read-only and the device cannot map read-only host "
					   "memory", base, len);
		}
		flags |= cudaHostRegisterReadOnly;
	}
	e = cudaHostRegister(base, len, flags);
	if (e != cudaSuccess) {
		cudaGetLastError();
		return kvmem_error(ENOTSUP, "cuda: cannot pin %zu bytes of host memory at %p: %s", len,
				   base, cudaGetErrorString(e));
	}
	if ((e = cudaHostGetDevicePointer(&dev, base, 0)) != cudaSuccess) {
		cudaGetLastError();
		cudaHostUnregister(base);
		return kvmem_error(ENOTSUP, "cuda: no device address for host memory at %p: %s", base,
				   cudaGetErrorString(e));
	}
	*r = (struct region){ .base = base, .dev = dev, .len = len, .refs = 1, .id = pg->next_id };
	pg->next_id = pg->next_id % 255 + 1;
	return 0;
}

void cuda_host_unregister(void *ctx, void *base)
{
	struct cuda *b = ctx;
	struct cuda_pages *pg = b->pages;

	if (!pg)
		return;
	for (int i = 0; i < MAX_REGIONS; i++) {
		struct region *r = &pg->reg[i];

		if (!r->refs || r->base != base || --r->refs)
			continue;
		/* Nothing may still read it. */
		kvmem_cuda_sync(b->ctx);
		cudaHostUnregister(base);
		cudaGetLastError();
		owner_forget(pg, r->id, 0, 1);
		memset(r, 0, sizeof(*r));
	}
	kvmem_pool_flush(&pg->watch);
}

int cuda_pool_watch(void *ctx, const void *region, uint32_t owner, kvmem_pool_report_fn fn,
		    void *arg)
{
	struct cuda_pages *pg = pages_of(ctx);

	return pg ? kvmem_pool_watch_set(&pg->watch, region, owner, fn, arg) : kvmem_fail();
}

int cuda_host_pinned(void *ctx, const void *base)
{
	const struct cuda *b = ctx;
	const struct cuda_pages *pg = b->pages;

	for (int i = 0; pg && i < MAX_REGIONS; i++)
		if (pg->reg[i].refs && pg->reg[i].base == base)
			return 1;
	return 0;
}

static int has_region(const struct cuda_pages *pg)
{
	for (int i = 0; i < MAX_REGIONS; i++)
		if (pg->reg[i].refs)
			return 1;
	return 0;
}

static struct region *region_at(struct cuda_pages *pg, const void *base)
{
	for (int i = 0; i < MAX_REGIONS; i++)
		if (pg->reg[i].refs && pg->reg[i].base == base)
			return &pg->reg[i];
	return NULL;
}

int cuda_page_cached(void *ctx, const void *region, uint32_t owner, int64_t block, int layer,
		     uint64_t *token)
{
	struct cuda *b = ctx;
	struct cuda_pages *pg = b->pages;
	struct region *r;
	uint32_t oid, s;

	/* fp8 views keep no device page pool with KVMEM_CUDA_FP8_POOL=0 */
	if (b->fp8 && (!pg || pg->fp8_pool != 1))
		return 0;
	if (!pg || !pg->pool || !(r = region_at(pg, region)) || !(oid = owner_id(pg, r, owner, 0)))
		return 0;
	if ((s = pool_find(pg, pool_key(oid, block, layer))) == UINT32_MAX)
		return 0;
	if (token)
		*token = (uint64_t)pg->epoch << 32 | (s + 1);
	return 1;
}

/* The slot a cached item's token names while no page has left the pool
 * since page_cached() gave it (the epoch): no lookup. UINT32_MAX when
 * the token is stale or missing (the caller looks the page up). */
static uint32_t token_slot(const struct cuda_pages *pg, const kvmem_place *it)
{
	const uint32_t s = (uint32_t)it->cached - 1;

	if (it->page.mem != KVMEM_MEM_BACKEND || !it->cached ||
	    (uint32_t)(it->cached >> 32) != pg->epoch || s >= pg->slots || !pg->key[s] ||
	    it->stride != pg->pool_stride)
		return UINT32_MAX;
	return s;
}

/* Slot s is read by this place() call: no miss of the call evicts it, and
 * the clock passes it over once. */
static void pool_used(struct cuda_pages *pg, uint32_t s)
{
	pg->stamp[s] = pg->call;
	pg->ref[s] = 1;
}

static struct region *region_of(struct cuda_pages *pg, const void *p, size_t len)
{
	for (int i = 0; i < MAX_REGIONS; i++) {
		struct region *r = &pg->reg[i];

		if (r->refs && (const char *)p >= r->base && (const char *)p + len <= r->base + r->len)
			return r;
	}
	return NULL;
}

/* fp8 pools: the bytes of a page that a slot keeps, one run from p->k (K,
 * V, their scales, laid out as kvmem_page_at does) in registered host
 * memory; 0 when the page is not such a one (it is then not kept). */
static size_t fp8_run(struct cuda_pages *pg, const struct cuda *b, const kvmem_page *p, int stride)
{
	const size_t rows = (size_t)b->c->n_kv_heads * stride, half = rows * b->c->head_dim;
	const char *k = p->k;

	if (p->mem != KVMEM_MEM_HOST || p->dtype != KVMEM_DTYPE_FP8 ||
	    (const char *)p->v != k + half || (const char *)p->k_scale != k + 2 * half ||
	    p->v_scale != p->k_scale + rows || !region_of(pg, k, fp8_page_bytes(b, stride)))
		return 0;
	return fp8_page_bytes(b, stride);
}

/* fp8 views (cuda_view_fp8.c): the device's address of [p, p + len) when it
 * lies in registered host memory, else NULL. */
const void *cuda_pages_dev_addr(struct cuda *b, const void *p, size_t len)
{
	struct region *r;

	if (!b->pages || !(r = region_of(b->pages, p, len)))
		return NULL;
	return r->dev + ((const char *)p - r->base);
}

/* ---- room ----------------------------------------------------------------- */
static int room_items(struct cuda *b, struct cuda_pages *pg, int n)
{
	int cap = pg->cap_items ? pg->cap_items : 256;

	if (n <= pg->cap_items)
		return 0;
	while (cap < n)
		cap *= 2;
	if (cuda_ring_room(&pg->ring, b->ctx, cap, &pg->dev_bytes) < 0)
		return kvmem_fail();
	free(pg->copies);
	free(pg->c_dst);
	free(pg->c_src);
	free(pg->c_len);
	free(pg->keys);
	free(pg->hit);
	pg->keys = NULL;
	pg->hit = NULL;
	pg->copies = NULL;
	pg->c_dst = NULL;
	pg->c_src = NULL;
	pg->c_len = NULL;
	pg->cap_items = pg->cap_copies = 0;
	/* Two copies an item at most (its K and its V). */
	pg->copies = malloc(2 * (size_t)cap * sizeof(*pg->copies));
	pg->c_dst = malloc(2 * (size_t)cap * sizeof(*pg->c_dst));
	pg->c_src = malloc(2 * (size_t)cap * sizeof(*pg->c_src));
	pg->c_len = malloc(2 * (size_t)cap * sizeof(*pg->c_len));
	pg->keys = malloc((size_t)cap * sizeof(*pg->keys));
	pg->hit = malloc((size_t)cap * sizeof(*pg->hit));
	if (!pg->copies || !pg->c_dst || !pg->c_src || !pg->c_len || !pg->keys || !pg->hit)
		return kvmem_error(ENOMEM, "cuda place: out of memory");
	pg->cap_items = pg->cap_copies = cap;
	return 0;
}

static int room_host_st(struct cuda_pages *pg, size_t bytes)
{
	if (bytes <= pg->cap_host_st)
		return 0;
	cudaFreeHost(pg->host_st);
	pg->host_st = NULL;
	pg->cap_host_st = 0;
	bytes = bytes < (8u << 20) ? (8u << 20) : bytes + bytes / 2;
	if (cuda_pinned(&pg->host_st, bytes) < 0)
		return kvmem_fail();
	pg->cap_host_st = bytes;
	return 0;
}

static int room_dev_st(struct cuda *b, struct cuda_pages *pg, size_t bytes)
{
	if (bytes <= pg->cap_dev_st)
		return 0;
	/* A move not waited for may still read the copies there. */
	if (cuda_ring_quiet(&pg->ring, b->ctx) < 0)
		return kvmem_fail();
	if (pg->dev_st)
		pg->dev_bytes -= pg->cap_dev_st;
	kvmem_cuda_free(pg->dev_st);
	pg->dev_st = NULL;
	pg->cap_dev_st = 0;
	bytes = bytes < (8u << 20) ? (8u << 20) : bytes + bytes / 2;
	if (b->mem_cap && cuda_dev_used(b) + bytes > b->mem_cap) {
		cuda_pages_drop_pool(b);
		if (cuda_dev_used(b) + bytes > b->mem_cap)
			return kvmem_error(ENOMEM, "cuda place: %zu bytes of staging do not fit the "
					   "%" PRIu64 " MiB GPU cap", bytes, b->mem_cap >> 20);
	}
	if (kvmem_cuda_malloc((void **)&pg->dev_st, bytes) < 0)
		return kvmem_fail();
	pg->cap_dev_st = bytes;
	pg->dev_bytes += bytes;
	return 0;
}

static size_t elem_size(uint32_t dtype)
{
	return dtype == KVMEM_DTYPE_F32 ? 4 : 2;
}

static int cmp_copy(const void *a, const void *b)
{
	const struct copy *x = a, *y = b;

	return x->src < y->src ? -1 : x->src > y->src;
}

/* ---- place ---------------------------------------------------------------- */
int cuda_pages_method(struct cuda *b)
{
	struct cuda_pages *pg = pages_of(b);

	return pg ? pg->method : CUDA_PLACE_PACK;
}

/* A place() call begins (bf16's place_pages, fp8's cuda_pages_fp8_at):
 * room for its n items, the call's stamp, and the pool, which keeps pages
 * of registered memory only: made when there is some, sized for the view
 * being placed into. */
static int place_begin(struct cuda *b, struct cuda_pages *pg, const kvmem_place *items, int n,
		       int64_t view_cap)
{
	int rc;

	if ((rc = room_items(b, pg, n)) < 0)
		return rc;
	pg->call++;
	if (!pg->pool && n && has_region(pg))
		pool_make(b, pg, items[0].stride, view_cap);
	return 0;
}

/*
 * Items are checked by the caller (cuda_place). Every item becomes one
 * gather item; the pages that must travel first (method batch: registered
 * pages; any method: pages in memory the device cannot address) are copied
 * before the kernel runs.
 */
static int place_pages(struct cuda *b, kvmem_view *v, const kvmem_place *items, int n)
{
	const int H = b->c->n_kv_heads, D = b->c->head_dim;
	struct cuda_pages *pg = pages_of(b);
	double t0 = (double)kvmem_now_ns();
	size_t host_at = 0, dev_at = 0, host_need = 0;
	int n_copies = 0, host = 0, rc;
	kvmem_gather_item *hi, *di;

	if (!pg)
		return kvmem_fail();
	if ((rc = place_begin(b, pg, items, n, v->cap)) < 0)
		return rc;
	hi = cuda_ring_host(&pg->ring);
	/* Room for the pages of unregistered memory. */
	for (int i = 0; i < n; i++) {
		const kvmem_place *it = &items[i];
		size_t half = (size_t)H * it->stride * D * elem_size(it->page.dtype);

		if (it->page.mem == KVMEM_MEM_HOST && !region_of(pg, it->page.k, half))
			host_need += 2 * ((half + 255) & ~(size_t)255);
	}
	if (host_need && (rc = room_host_st(pg, host_need)) < 0)
		return rc;
	/* First every pool hit, stamped with this call so that no miss below
	 * evicts a page another item of the call reads. */
	for (int i = 0; i < n; i++) {
		const kvmem_place *it = &items[i];
		const size_t half = (size_t)H * it->stride * D * elem_size(it->page.dtype);
		struct region *rk = NULL;
		uint32_t oid;

		pg->keys[i] = 0;
		pg->hit[i] = token_slot(pg, it);
		if (pg->hit[i] != UINT32_MAX) {
			/* page_cached()'s slot, no page having left since */
			pg->keys[i] = pg->key[pg->hit[i]];
			pool_used(pg, pg->hit[i]);
			continue;
		}
		if (it->page.mem == KVMEM_MEM_BACKEND) {
			/* The session asked page_cached() for it: it must be here. */
			if (!(rk = region_at(pg, it->page.k)) || !pg->pool ||
			    !owner_id(pg, rk, it->owner, 0) || it->stride != pg->pool_stride)
				return kvmem_error(ESTALE, "cuda place: block %lld layer %d is not in the "
						   "device page pool", (long long)it->block, it->layer);
		} else if (it->page.mem == KVMEM_MEM_HOST && pg->pool && it->stride == pg->pool_stride &&
			   (rk = region_of(pg, it->page.k, half)) &&
			   region_of(pg, it->page.v, half) != rk) {
			rk = NULL;
		}
		/* A shared region's pages of no owner: see cuda_host_register. */
		if (!rk || !pg->pool || !(oid = owner_id(pg, rk, it->owner, 1)))
			continue;
		pg->keys[i] = pool_key(oid, it->block, it->layer);
		pg->hit[i] = pool_find(pg, pg->keys[i]);
		if (pg->hit[i] != UINT32_MAX) {
			pool_used(pg, pg->hit[i]);
		} else if (it->page.mem == KVMEM_MEM_BACKEND) {
			return kvmem_error(ESTALE, "cuda place: block %lld layer %d left the device page "
					   "pool", (long long)it->block, it->layer);
		}
	}
	for (int i = 0; i < n; i++) {
		const kvmem_place *it = &items[i];
		const size_t es = elem_size(it->page.dtype);
		const size_t half = (size_t)H * it->stride * D * es, skip = (size_t)it->u0 * D * es;
		kvmem_gather_item *g = &hi[i];
		struct region *rk = NULL, *rv = NULL;
		uint32_t slot = pg->hit[i];
		uint64_t key = pg->keys[i];

		*g = (kvmem_gather_item){ .layer = it->layer, .slot = (int32_t)it->slot, .n = it->n,
					  .head_stride = it->stride * D,
					  .dtype = (int32_t)it->page.dtype };
		if (v->rk) {	/* the raw K the view keeps beside the slots */
			g->raw_k = v->rk + ((size_t)it->layer * H * v->cap + it->slot) * D;
			g->raw_stride = (int32_t)(v->cap * D);
		}
		pg->st.tokens += it->n;
		if (it->page.mem == KVMEM_MEM_HOST) {
			rk = region_of(pg, it->page.k, half);
			rv = region_of(pg, it->page.v, half);
		}
		if (slot != UINT32_MAX) {
			/* A hit: from HBM. */
			uint16_t *pk = pg->pool + (size_t)slot * 2 * pg->slot_elems;

			g->k = pk + (size_t)it->u0 * D;
			g->v = pk + pg->slot_elems + (size_t)it->u0 * D;
			g->dtype = KVMEM_DTYPE_BF16;
			pg->st.pool_hits++;
			pg->st.pool_bytes += 2 * (uint64_t)H * it->n * D * 2;
			continue;
		}
		if (key)
			pg->st.pool_misses++;
		host = 1;	/* a page of the source's: let go when this returns */
		if (it->page.mem == KVMEM_MEM_DEVICE) {
			g->k = (const char *)it->page.k + skip;
			g->v = (const char *)it->page.v + skip;
		} else if (rk && rv) {
			pg->st.bytes_in += 2 * (size_t)H * it->n * D * es;
			if (pg->method == CUDA_PLACE_BATCH) {
				/* K and V of a pool page are one run; copied whole. */
				pg->copies[n_copies++] = (struct copy){ .src = it->page.k, .len = half,
									 .item = i };
				pg->copies[n_copies++] = (struct copy){ .src = it->page.v, .len = half,
									 .item = -1 - i };
			} else {
				g->k = rk->dev + ((const char *)it->page.k - rk->base) + skip;
				g->v = rv->dev + ((const char *)it->page.v - rv->base) + skip;
			}
		} else {
			/* Not addressable by the device: staged as it is. */
			char *hk = pg->host_st + host_at, *hv = hk + ((half + 255) & ~(size_t)255);

			memcpy(hk, it->page.k, half);
			memcpy(hv, it->page.v, half);
			host_at += 2 * ((half + 255) & ~(size_t)255);
			g->k = hk + skip;
			g->v = hv + skip;
			pg->st.bytes_in += 2 * (size_t)H * it->n * D * es;
			pg->st.bytes_staged += 2 * half;
		}
		/* A whole page of registered memory joins the pool (once: the
		 * same page may come twice, for two token ranges). */
		if (key && it->u0 == 0 && it->n == it->stride && pool_find(pg, key) == UINT32_MAX &&
		    (slot = pool_take(pg, key)) != UINT32_MAX) {
			/* Reported as entered (one it pushed out was, as leaving,
			 * in pool_unlink). */
			pool_note(pg, slot, slot);
			g->copy_k = pg->pool + (size_t)slot * 2 * pg->slot_elems;
			g->copy_v = g->copy_k + pg->slot_elems;
			pg->ref[slot] = 1;
		}
	}
	if (n_copies) {
		/* Sorted by address, adjacent ones merged: a block's layers sit
		 * side by side in the pool, so most of a batch is a few runs. */
		int runs = 0;

		qsort(pg->copies, n_copies, sizeof(*pg->copies), cmp_copy);
		for (int i = 0; i < n_copies; i++) {
			struct copy *c = &pg->copies[i];

			if (runs) {
				const char *rs = pg->c_src[runs - 1], *end = rs + pg->c_len[runs - 1];

				if (c->src <= end) {
					/* Adjacent (merged), or the same page again
					 * (two token ranges): copied once. */
					c->dst = dev_at - pg->c_len[runs - 1] + (size_t)(c->src - rs);
					if (c->src + c->len > end) {
						pg->c_len[runs - 1] += (size_t)(c->src + c->len - end);
						dev_at += (size_t)(c->src + c->len - end);
					}
					continue;
				}
			}
			c->dst = dev_at;
			pg->c_src[runs] = c->src;
			pg->c_len[runs] = c->len;
			runs++;
			dev_at += c->len;
		}
		if ((rc = room_dev_st(b, pg, dev_at)) < 0)
			return rc;
		dev_at = 0;
		for (int r = 0; r < runs; r++) {
			pg->c_dst[r] = pg->dev_st + dev_at;
			dev_at += pg->c_len[r];
		}
		for (int i = 0; i < n_copies; i++) {
			const struct copy *c = &pg->copies[i];
			int item = c->item >= 0 ? c->item : -1 - c->item;
			const kvmem_place *it = &items[item];
			const char *at = pg->dev_st + c->dst + (size_t)it->u0 * D * elem_size(it->page.dtype);

			if (c->item >= 0)
				hi[item].k = at;
			else
				hi[item].v = at;
		}
		{
			struct cudaMemcpyAttributes attr = { 0 };
			size_t idx = 0;
			cudaError_t e;

			attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
			attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
			e = cudaMemcpyBatchAsync((void *const *)pg->c_dst, (const void *const *)pg->c_src,
						 pg->c_len, (size_t)runs, &attr, &idx, 1,
						 kvmem_cuda_stream(b->ctx));
			if (e != cudaSuccess) {
				cudaGetLastError();
				return kvmem_error(EIO, "cuda place: batched copy of %d runs: %s", runs,
						   cudaGetErrorString(e));
			}
		}
	}
	/* Pool hits only: the gather is not waited for (cuda_ring.c). */
	if ((rc = cuda_ring_upload(&pg->ring, b->ctx, n, &di)) < 0 ||
	    (rc = kvmem_cuda_view_gather_bf16(b->ctx, v->k, v->v, di, n, cuda_slot_run(hi, n),
					      b->c->n_layers, H, D,
					      (int)v->cap, b->c->rope_theta)) < 0 ||
	    (rc = host || b->place_sync ? kvmem_cuda_sync(b->ctx) :
					 cuda_ring_queued(&pg->ring, b->ctx)) < 0)
		return rc;
	pg->st.calls++;
	pg->st.items += n;
	pg->st.pool_pages = pg->used;
	pg->st.ns += (uint64_t)((double)kvmem_now_ns() - t0);
	return 0;
}

/* place(), then the pool's watchers hear what entered and left it. */
int cuda_pages_place(struct cuda *b, kvmem_view *v, const kvmem_place *items, int n)
{
	int rc = place_pages(b, v, items, n);

	if (b->pages)
		kvmem_pool_flush(&b->pages->watch);
	return rc;
}

/*
 * pool_fill(): pages into free pool slots ahead of their use, over the copy
 * engines (cudaMemcpyBatchAsync, runs merged where both the host pages and
 * the slots are adjacent: a block's layers sit side by side in a pager's
 * pool, and free slots are taken in order), then one wait. Nothing is
 * evicted; the default pool grows (pool_grow) when it is full; it is made
 * here when nothing was placed yet.
 */
/* pool_fill's runs (c_src -> c_dst, c_len): one batched copy, then a wait
 * when asked (pool_fill; fp8's place() waits once, after its gather). A
 * failed copy waits for the ones before it, which read the caller's pages. */
static int fill_copies(struct cuda *b, struct cuda_pages *pg, int runs, int wait)
{
	struct cudaMemcpyAttributes attr = { 0 };
	size_t idx = 0;

	if (!runs)
		return 0;
	attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
	attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
	if (cudaMemcpyBatchAsync((void *const *)pg->c_dst, (const void *const *)pg->c_src, pg->c_len,
				 (size_t)runs, &attr, &idx, 1, kvmem_cuda_stream(b->ctx)) != cudaSuccess) {
		cudaGetLastError();
		kvmem_cuda_sync(b->ctx);
		return kvmem_error(EIO, "cuda pool fill: batched copy of %d runs", runs);
	}
	return wait ? kvmem_cuda_sync(b->ctx) : 0;
}

/* A copy of len bytes from src to dst, joined to the last of pool_fill's
 * runs when it continues it on both sides; the runs now. */
static int add_run(struct cuda_pages *pg, int runs, const void *src, void *dst, size_t len)
{
	const int l = runs - 1;

	if (runs && (const char *)pg->c_src[l] + pg->c_len[l] == (const char *)src &&
	    (char *)pg->c_dst[l] + pg->c_len[l] == (char *)dst) {
		pg->c_len[l] += len;
		return runs;
	}
	pg->c_src[runs] = src;
	pg->c_dst[runs] = dst;
	pg->c_len[runs] = len;
	return runs + 1;
}

int cuda_pool_fill(void *ctx, const kvmem_place *items, int n)
{
	struct cuda *b = ctx;
	const int H = b->c->n_kv_heads, D = b->c->head_dim;
	struct cuda_pages *pg = pages_of(b);
	double t0 = (double)kvmem_now_ns();
	int runs = 0, have = 0, rc;

	if (!pg)
		return kvmem_fail();
	if (n <= 0 || !has_region(pg))
		return 0;
	if ((rc = room_items(b, pg, n)) < 0)
		return rc;
	for (int i = 0; i < n; i++) {
		const kvmem_place *it = &items[i];
		/* fp8 (KVMEM_CUDA_FP8_POOL=1): the page whole, one run */
		const int f8 = pg->fp8_pool == 1;
		const size_t half = f8 ? fp8_run(pg, b, &it->page, it->stride) :
					 (size_t)H * it->stride * D * 2;
		struct region *r;
		uint32_t oid, slot;
		uint64_t key;
		char *dst;

		if (f8 ? !half :
			 (it->page.mem != KVMEM_MEM_HOST || it->page.dtype != KVMEM_DTYPE_BF16))
			continue;
		if (it->u0 || it->n != it->stride || !(r = region_of(pg, it->page.k, half)) ||
		    (!f8 && region_of(pg, it->page.v, half) != r))
			continue;
		/* Made for the first page it can keep (none for pages of
		 * another dtype); under a cap the pool is sized by the view's
		 * first place(). */
		if (!pg->pool && !b->mem_cap)
			pool_make(b, pg, it->stride, 0);
		if (!pg->pool)
			break;
		if (it->stride != pg->pool_stride || !(oid = owner_id(pg, r, it->owner, 1)))
			continue;
		key = pool_key(oid, it->block, it->layer);
		if (pool_find(pg, key) != UINT32_MAX) {
			have++;
			continue;
		}
		if ((slot = pool_take_free(pg, key)) == UINT32_MAX) {
			/* Full: the copies so far first (they name the old
			 * buffer), then a larger pool, if it may grow. */
			if ((rc = fill_copies(b, pg, runs, 1)) < 0)
				return rc;
			runs = 0;
			if (pool_grow(b, pg) < 0 || (slot = pool_take_free(pg, key)) == UINT32_MAX)
				break;
		}
		have++;
		/* Reported as entered, as place() reports its pages: the
		 * session's source then records the GPU tier for it. */
		pool_note(pg, slot, slot);
		dst = (char *)(pg->pool + (size_t)slot * 2 * pg->slot_elems);
		for (int h = 0; h < 2 - f8; h++)
			runs = add_run(pg, runs, h ? it->page.v : it->page.k, dst + h * half, half);
		pg->st.filled_pages++;
		pg->st.filled_bytes += (2 - f8) * half;
	}
	kvmem_pool_flush(&pg->watch);
	if ((rc = fill_copies(b, pg, runs, 1)) < 0)
		return rc;
	pg->st.pool_pages = pg->used;
	pg->st.pool_cap = pg->slots;
	pg->st.fill_ns += (uint64_t)((double)kvmem_now_ns() - t0);
	return have;
}

/*
 * fp8 views' place() with the pool (KVMEM_CUDA_FP8_POOL=1): at[i], the
 * device's address of the slot holding item i's page, or NULL (then read
 * where it is, or packed). A slot holds the page's own bytes, so a view
 * row made from it is the row made from the page. As place_pages: every
 * hit first, stamped with this call so that no miss evicts a page another
 * item reads; then a whole page of registered memory not there takes a
 * slot (a free one, else the clock's victim) and its bytes are copied in
 * (runs merged, a batched copy every FP8_FILL_ISSUE items, so the copy
 * engines start while the rest are looked at) before the gather reads
 * them. The copies are not waited for: the gather follows them on the
 * stream, and the caller waits once after it, before the pages they read
 * may go (a wait here and one after the gather cost fp8's 1,024-page call
 * a few per cent of its copy time: 0.87 of the pinned peak against bf16's
 * 0.89 on the H200; without, 0.89 against 0.89-0.90 on an H100, 2026-12-06:
 * fp8 / bf16 tokens/s 1.93-1.94, the pages' byte ratio). Returns the pages copied in (the caller
 * must wait when any were), or an error (copies already issued waited for).
 * An item the session made after page_cached() said yes (mem
 * KVMEM_MEM_BACKEND, page.k the region) must be there: -ESTALE.
 */
#define FP8_FILL_ISSUE 256
int cuda_pages_fp8_at(struct cuda *b, int64_t view_cap, const kvmem_place *items, int n,
		      const char **at)
{
	const int H = b->c->n_kv_heads, D = b->c->head_dim;
	struct cuda_pages *pg = pages_of(b);
	int runs = 0, copied = 0, rc;

	if (!pg)
		return kvmem_fail();
	if ((rc = place_begin(b, pg, items, n, view_cap)) < 0)
		return rc;
	for (int i = 0; i < n; i++) {
		const kvmem_place *it = &items[i];
		const int cached = it->page.mem == KVMEM_MEM_BACKEND;
		struct region *r = NULL;
		uint32_t oid;

		at[i] = NULL;
		pg->keys[i] = 0;
		pg->hit[i] = token_slot(pg, it);
		if (pg->hit[i] != UINT32_MAX)
			pg->keys[i] = pg->key[pg->hit[i]];
		else if (pg->pool && it->stride == pg->pool_stride && cached)
			r = region_at(pg, it->page.k);
		else if (pg->pool && it->stride == pg->pool_stride &&
			 fp8_run(pg, b, &it->page, it->stride))
			r = region_of(pg, it->page.k, 1);
		if (r && (oid = owner_id(pg, r, it->owner, !cached))) {
			pg->keys[i] = pool_key(oid, it->block, it->layer);
			pg->hit[i] = pool_find(pg, pg->keys[i]);
		}
		if (pg->hit[i] != UINT32_MAX) {
			pool_used(pg, pg->hit[i]);
		} else if (cached) {
			return kvmem_error(ESTALE, "cuda place (fp8): block %lld layer %d is not "
					   "in the device page pool", (long long)it->block,
					   it->layer);
		}
	}
	for (int i = 0; i < n; i++) {
		const kvmem_place *it = &items[i];
		const size_t bytes = fp8_page_bytes(b, it->stride);
		uint32_t slot = pg->hit[i];

		if (runs && i % FP8_FILL_ISSUE == 0) {
			if ((rc = fill_copies(b, pg, runs, 0)) < 0)
				return rc;
			runs = 0;
		}
		if (!pg->keys[i])
			continue;
		if (slot != UINT32_MAX) {
			pg->st.pool_hits++;
			pg->st.pool_bytes += 2 * (uint64_t)H * it->n * (D + 4);
		} else {
			pg->st.pool_misses++;
			/* Taken by an earlier item of this call (the same page
			 * again, another token range), or a whole page enters. */
			slot = pool_find(pg, pg->keys[i]);
			if (slot == UINT32_MAX && it->u0 == 0 && it->n == it->stride &&
			    (slot = pool_take(pg, pg->keys[i])) != UINT32_MAX) {
				pool_note(pg, slot, slot);	/* entered (as place_pages) */
				pg->ref[slot] = 1;
				pg->st.bytes_in += bytes;
				copied++;
				runs = add_run(pg, runs, it->page.k,
					       pg->pool + (size_t)slot * 2 * pg->slot_elems, bytes);
			}
		}
		if (slot != UINT32_MAX)
			at[i] = (const char *)(pg->pool + (size_t)slot * 2 * pg->slot_elems);
	}
	rc = fill_copies(b, pg, runs, 0);
	pg->st.pool_pages = pg->used;
	kvmem_pool_flush(&pg->watch);
	return rc < 0 ? rc : copied;
}

/*
 * move(): tokens already in the view to other slots, on the device. Per
 * layer with items, the raw K and V of the slots its items read are copied
 * aside first (device to device), then one gather kernel reads the layer's
 * items from the copy, as it reads bf16 pages, and writes K rotated at the
 * new slot (the rotation place() and the forward pass use: the same bits),
 * V and the raw K. The copy takes only the sources' slot ranges, packed
 * (ranges closer than MOVE_GAP tokens in one copy): what a step moves
 * costs twice its bytes through HBM, not twice the view's. A compact
 * layout's follow-up moves nearly every slot after the first change; a
 * stable one (kept blocks keep their slots) moves a few runs.
 */
#define MOVE_GAP 1024	/* a gap this short is copied: ~4 MB at 8B, less than a call */
/* Layers whose copies together take at most this many bytes share one
 * gather launch (a stable layout's follow-up moves ~22 MB a layer at 8B: a
 * launch a layer left most of the device idle); a larger layer goes alone,
 * as a compact layout's do. */
#define MOVE_GROUP_BYTES (256ull << 20)

/* The gap, or KVMEM_CUDA_MOVE_GAP's (tests set 0: a copy per run of
 * adjacent sources, so small views take the many-run path too). */
static int64_t move_gap(void)
{
	const char *e = getenv("KVMEM_CUDA_MOVE_GAP");

	return e && *e ? strtoll(e, NULL, 10) : MOVE_GAP;
}

struct move_src {
	int64_t from, end;	/* the item's source slots */
	int item;
};

struct move_run {
	int64_t from, end, off;	/* slots from..end-1, at token `off` of the copy */
};

static int by_from(const void *a, const void *b)
{
	const struct move_src *x = a, *y = b;

	return x->from < y->from ? -1 : x->from > y->from;
}

int cuda_move(void *ctx, kvmem_view *v, const kvmem_move *items, int n)
{
	struct cuda *b = ctx;
	const int H = b->c->n_kv_heads, D = b->c->head_dim, L = b->c->n_layers;
	struct cuda_pages *pg = pages_of(b);
	double t0 = (double)kvmem_now_ns();
	int64_t *staged = NULL, *off = NULL, *base = NULL, most = 0, group = 0;
	int *at = NULL, *fill = NULL, *run_at = NULL, rc = 0;
	struct move_src *src = NULL;
	struct move_run *runs = NULL;
	kvmem_gather_item *hi, *di;
	uint64_t tokens = 0;
	const int64_t gap = move_gap();

	if (!pg)
		return kvmem_fail();
	if (!v->rk)
		return kvmem_error(ENOTSUP, "cuda move: the view keeps no raw K");
	for (int i = 0; i < n; i++) {
		const kvmem_move *m = &items[i];

		if (m->layer < 0 || m->layer >= L || m->n <= 0 || m->from < 0 || m->to < 0 ||
		    m->from + m->n > v->cap || m->to + m->n > v->cap)
			return kvmem_error(EINVAL, "cuda move: bad move (layer %d, %d tokens from slot "
					   "%lld to %lld of %lld)", m->layer, m->n, (long long)m->from,
					   (long long)m->to, (long long)v->cap);
		tokens += (uint64_t)m->n;
	}
	if (!n)
		return 0;
	staged = calloc((size_t)L, sizeof(*staged));
	off = calloc((size_t)n, sizeof(*off));
	base = calloc((size_t)L, sizeof(*base));
	at = calloc((size_t)L + 1, sizeof(*at));
	fill = calloc((size_t)L, sizeof(*fill));
	run_at = calloc((size_t)L + 1, sizeof(*run_at));
	src = calloc((size_t)n, sizeof(*src));
	runs = calloc((size_t)n, sizeof(*runs));
	if (!staged || !off || !base || !at || !fill || !run_at || !src || !runs) {
		rc = kvmem_error(ENOMEM, "cuda move: out of memory");
		goto out;
	}
	/* The items by layer, each layer's by source slot; then each layer's
	 * sources merged into runs, packed one after another in the copy. */
	for (int i = 0; i < n; i++)
		at[items[i].layer + 1]++;
	for (int l = 0; l < L; l++)
		at[l + 1] += at[l];
	for (int i = 0; i < n; i++) {
		const kvmem_move *m = &items[i];

		src[at[m->layer] + fill[m->layer]++] = (struct move_src){
			.from = m->from, .end = m->from + m->n, .item = i };
	}
	for (int l = 0, r = 0; l < L; l++) {
		struct move_run *cur = NULL;

		qsort(src + at[l], (size_t)(at[l + 1] - at[l]), sizeof(*src), by_from);
		run_at[l] = r;
		for (int j = at[l]; j < at[l + 1]; j++) {
			const struct move_src *s = &src[j];

			if (!cur || s->from > cur->end + gap) {
				if (cur)
					staged[l] += cur->end - cur->from;
				cur = &runs[r++];
				*cur = (struct move_run){ .from = s->from, .end = s->end,
							  .off = staged[l] };
			} else if (s->end > cur->end) {
				cur->end = s->end;
			}
			off[s->item] = cur->off + (s->from - cur->from);
		}
		if (cur)
			staged[l] += cur->end - cur->from;
		run_at[l + 1] = r;
	}
	/* Layers in groups (MOVE_GROUP_BYTES): each layer's copy at base[l]
	 * (elements), K [H][T][D] then V; a group's copies all land before its
	 * gather writes any of its layers. `most`: the largest group's size. */
	for (int l = 0; l < L; l++) {
		const int64_t elems = 2 * (int64_t)H * staged[l] * D;

		if (group && (uint64_t)(group + elems) * 2 > MOVE_GROUP_BYTES)
			group = 0;	/* a new group from this layer */
		base[l] = group;
		group += elems;
		most = group > most ? group : most;
	}
	/* Room first (items, the copies of one group): a failure here has
	 * moved nothing, and the session places from pages instead. */
	if ((rc = room_items(b, pg, n)) < 0 ||
	    (rc = room_dev_st(b, pg, (size_t)most * 2)) < 0)
		goto out;
	memset(fill, 0, (size_t)L * sizeof(*fill));
	hi = cuda_ring_host(&pg->ring);
	for (int i = 0; i < n; i++) {
		const kvmem_move *m = &items[i];
		const int64_t T = staged[m->layer];
		const uint16_t *copy = (const uint16_t *)pg->dev_st + base[m->layer];

		hi[at[m->layer] + fill[m->layer]++] = (kvmem_gather_item){
			.k = copy + off[i] * D,
			.v = copy + (size_t)H * T * D + off[i] * D,
			.raw_k = v->rk + ((size_t)m->layer * H * v->cap + m->to) * D,
			.layer = m->layer, .slot = (int32_t)m->to, .n = m->n,
			.head_stride = (int32_t)(T * D), .dtype = KVMEM_DTYPE_BF16,
			.raw_stride = (int32_t)(v->cap * D),
		};
	}
	if ((rc = cuda_ring_upload(&pg->ring, b->ctx, n, &di)) < 0)
		goto out;
	for (int l = 0, first = 0; l < L; l++) {
		const size_t row = (size_t)D * 2, lay = (size_t)l * H * v->cap * D;
		const int64_t T = staged[l];
		uint16_t *ck = (uint16_t *)pg->dev_st + base[l], *cv = ck + (size_t)H * T * D;
		cudaStream_t st = kvmem_cuda_stream(b->ctx);

		for (int r = run_at[l]; r < run_at[l + 1]; r++) {
			const struct move_run *u = &runs[r];
			const size_t w = (size_t)(u->end - u->from) * row;

			if (cudaMemcpy2DAsync(ck + u->off * D, T * row, v->rk + lay + u->from * D,
					      v->cap * row, w, H, cudaMemcpyDeviceToDevice,
					      st) != cudaSuccess ||
			    cudaMemcpy2DAsync(cv + u->off * D, T * row, v->v + lay + u->from * D,
					      v->cap * row, w, H, cudaMemcpyDeviceToDevice,
					      st) != cudaSuccess) {
				cudaGetLastError();
				rc = kvmem_error(EIO, "cuda move: copying layer %d aside", l);
				goto out;
			}
		}
		pg->st.move_staged_tokens += (uint64_t)T;
		/* The group ends here (the next layer starts another, or none
		 * is left): its items, layers first..l, in one gather. */
		if (l + 1 < L && base[l + 1])
			continue;
		if (at[l + 1] > at[first] &&
		    (rc = kvmem_cuda_view_gather_bf16(b->ctx, v->k, v->v, di + at[first],
						      at[l + 1] - at[first], 1, L, H, D, (int)v->cap,
						      b->c->rope_theta)) < 0)
			goto out;
		first = l + 1;
	}
	/* Not waited for, as a place() from the pool: what the move wrote is
	 * read next by the stream's own work (placements, the forward pass),
	 * and its staging and items are freed only after a quiet. */
	if ((rc = b->place_sync ? kvmem_cuda_sync(b->ctx) : cuda_ring_queued(&pg->ring, b->ctx)) < 0)
		goto out;
	pg->st.moved_tokens += tokens;
	pg->st.move_ns += (uint64_t)((double)kvmem_now_ns() - t0);
out:
	free(staged);
	free(off);
	free(base);
	free(at);
	free(fill);
	free(run_at);
	free(src);
	free(runs);
	return rc < 0 ? rc : 0;
}

/*
 * fp8 place()'s fast way: every item a page of the device pool that the
 * session found with page_cached() and no page has left since (its token
 * live). One pass: the item's slot (at[i]), its stamp and clock bit, the
 * counters. 1 when every item was such (then nothing more is looked up),
 * 0 when one was not (the caller takes cuda_pages_fp8_at's way; what this
 * stamped only marks pages used).
 */
int cuda_pages_fp8_tokens(struct cuda *b, const kvmem_place *items, int n, const char **at)
{
	const uint64_t row = 2 * (uint64_t)b->c->n_kv_heads * (b->c->head_dim + 4);
	struct cuda_pages *pg = b->pages;
	uint64_t tokens = 0;

	if (!pg || !pg->pool || pg->fp8_pool != 1)
		return 0;
	pg->call++;
	for (int i = 0; i < n; i++) {
		const uint32_t s = token_slot(pg, &items[i]);

		if (s == UINT32_MAX)
			return 0;
		pool_used(pg, s);
		at[i] = (const char *)(pg->pool + (size_t)s * 2 * pg->slot_elems);
		tokens += (uint64_t)items[i].n;
	}
	pg->st.pool_hits += (uint64_t)n;
	pg->st.pool_bytes += row * tokens;
	pg->st.tokens += tokens;
	pg->st.calls++;
	pg->st.items += (uint64_t)n;
	return 1;
}

/* The time of a place() whose items are counted (cuda_pages_fp8_tokens). */
void cuda_pages_count_ns(struct cuda *b, double ns)
{
	if (b->pages)
		b->pages->st.ns += (uint64_t)ns;
}

/* Counters of the pack path (cuda_view.c), so every method reports. */
void cuda_pages_count_pack(struct cuda *b, const kvmem_place *items, int n, double ns)
{
	cuda_pages_count_fp8(b, items, n, NULL, ns);
}

/* And of fp8 views' place(): at (NULL: none), the items read from the
 * pool, whose bytes crossed into it before (counted then) or never. */
void cuda_pages_count_fp8(struct cuda *b, const kvmem_place *items, int n,
			  const char *const *at, double ns)
{
	struct cuda_pages *pg = pages_of(b);

	if (!pg)
		return;
	for (int i = 0; i < n; i++) {
		const uint64_t rows = 2 * (uint64_t)b->c->n_kv_heads * items[i].n;

		pg->st.tokens += items[i].n;
		if (at && at[i])
			continue;
		/* an fp8 page's bytes: one a value, and a row's fp32 scale */
		pg->st.bytes_in += items[i].page.dtype == KVMEM_DTYPE_FP8 ?
				   rows * ((uint64_t)b->c->head_dim + 4) :
				   rows * b->c->head_dim * elem_size(items[i].page.dtype);
	}
	pg->st.calls++;
	pg->st.items += n;
	pg->st.ns += (uint64_t)ns;
}

/* Counters of a move done elsewhere (cuda_view_fp8.c), as cuda_move keeps. */
void cuda_pages_count_move(struct cuda *b, uint64_t tokens, uint64_t staged, double ns)
{
	struct cuda_pages *pg = pages_of(b);

	if (!pg)
		return;
	pg->st.moved_tokens += tokens;
	pg->st.move_staged_tokens += staged;
	pg->st.move_ns += (uint64_t)ns;
}

void cuda_place_stats(void *ctx, kvmem_place_stats *st)
{
	struct cuda *b = ctx;

	memset(st, 0, sizeof(*st));
	if (b->pages)
		*st = b->pages->st;
}

int cuda_set(void *ctx, const char *key, const char *value)
{
	struct cuda *b = ctx;
	struct cuda_pages *pg = pages_of(b);

	if (!pg)
		return kvmem_fail();
	if (!strcmp(key, "place")) {
		if (!strcmp(value, "gather"))
			pg->method = CUDA_PLACE_GATHER;
		else if (!strcmp(value, "batch"))
			pg->method = CUDA_PLACE_BATCH;
		else if (!strcmp(value, "pack"))
			pg->method = CUDA_PLACE_PACK;
		else
			return kvmem_error(EINVAL, "cuda: place method '%s' (gather, batch, pack)", value);
		return 0;
	}
	if (!strcmp(key, "pool")) {
		char *end;
		unsigned long long v;

		if (!strcmp(value, "default")) {	/* as the backend was opened */
			pool_free(b, pg);
			pg->pool_want = b->page_pool;
			return 0;
		}
		v = strtoull(value, &end, 10);

		if (end == value || *end)
			return kvmem_error(EINVAL, "cuda: pool bytes '%s'", value);
		pool_free(b, pg);
		pg->pool_want = v;
		if (!v)
			pg->pool_want = 1;	/* no pool (below one slot) */
		return 0;
	}
	if (!strcmp(key, "place_sync")) {	/* every place() and move() waited for */
		const char *env = getenv("KVMEM_CUDA_PLACE_SYNC");

		if (!strcmp(value, "default"))	/* as the backend was opened */
			b->place_sync = env && !strcmp(env, "1");
		else if (!strcmp(value, "0") || !strcmp(value, "1"))
			b->place_sync = value[0] == '1';
		else
			return kvmem_error(EINVAL, "cuda: place_sync '%s' (0, 1 or default)", value);
		return 0;
	}
	if (!strcmp(key, "gather_threads")) {
		char *end;
		long v = strtol(value, &end, 10);

		if (end == value || *end)
			return kvmem_error(EINVAL, "cuda: gather threads '%s'", value);
		return kvmem_cuda_gather_set_threads((int)v);
	}
	return kvmem_error(EINVAL, "cuda: no setting '%s' (place, pool, place_sync, "
			   "gather_threads)", key);
}

void cuda_pages_destroy(struct cuda *b)
{
	struct cuda_pages *pg = b->pages;

	if (!pg)
		return;
	kvmem_cuda_sync(b->ctx);	/* a gather left running reads the pool */
	for (int i = 0; i < MAX_REGIONS; i++)
		if (pg->reg[i].refs) {
			cudaHostUnregister(pg->reg[i].base);
			cudaGetLastError();
		}
	pool_free(b, pg);
	kvmem_pool_watches_free(&pg->watch);
	cuda_ring_free(&pg->ring);
	cudaFreeHost(pg->host_st);
	kvmem_cuda_free(pg->dev_st);
	free(pg->copies);
	free(pg->c_dst);
	free(pg->c_src);
	free(pg->c_len);
	free(pg->keys);
	free(pg->hit);
	free(pg);
	b->pages = NULL;
}

/* ---- ceilings: one large pinned copy each way ------------------------------ */
int cuda_copy_ceilings(struct cuda *b, kvmem_ceilings *out)
{
	const size_t bytes = 1u << 30;
	cudaStream_t st = kvmem_cuda_stream(b->ctx);
	void *h = NULL, *d = NULL;
	double best[2] = { 1e30, 1e30 };
	int rc;

	if ((rc = cuda_pinned(&h, bytes)) < 0)
		return rc;
	if ((rc = kvmem_cuda_malloc(&d, bytes)) < 0)
		goto out;
	memset(h, 0x3c, bytes);
	for (int r = 0; r < 6; r++)
		for (int dir = 0; dir < 2; dir++) {
			double t0;

			if ((rc = kvmem_cuda_sync(b->ctx)) < 0)
				goto out;
			t0 = (double)kvmem_now_ns();
			if (cudaMemcpyAsync(dir ? h : d, dir ? d : h, bytes,
					    dir ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
					    st) != cudaSuccess) {
				rc = kvmem_error(EIO, "cuda ceilings: pinned copy failed");
				goto out;
			}
			if ((rc = kvmem_cuda_sync(b->ctx)) < 0)
				goto out;
			if (r && (double)kvmem_now_ns() - t0 < best[dir])
				best[dir] = (double)kvmem_now_ns() - t0;
		}
	out->h2d_gbps = bytes / best[0];
	out->d2h_gbps = bytes / best[1];
out:
	cudaFreeHost(h);
	kvmem_cuda_free(d);
	return rc;
}

// SPDX-License-Identifier: MIT
/*
 * Stage-in: fetch (hits from the host pool, misses from the stage-out buffer
 * or NVMe in one batch of large requests), release, the plan-sized stage-in
 * loop, and prefetch. Every page read from NVMe is checked against its
 * checksum before anyone can see it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pager/pager_int.h"
#include "pager/probes.h"

static int slot_busy(void *arg, uint32_t s)
{
	kvmem_pager *p = arg;
	uint64_t pg = p->slot_page[s];

	return p->slot_pin[s] || pg == UINT64_MAX || (p->pt[pg].flags & KVMEM_PTE_IN_FLIGHT);
}

static void evict(kvmem_pager *p, uint32_t s)
{
	uint64_t pg = p->slot_page[s];
	struct kvmem_pte *e = &p->pt[pg];

	PROBE_EVICT(pg, s, p->page_bytes);
	PROBE_TIER_MOVE(pg, KVMEM_TIER_HOST, 0, p->page_bytes, 0);
	e->tiers &= ~KVMEM_TIER_HOST;
	e->flags &= ~KVMEM_PTE_PREFETCHED;
	e->host_slot = KVMEM_SLOT_NONE;
	p->repl->remove(p->repl_st, s);
	p->slot_page[s] = UINT64_MAX;
	pager_slots_give(p, s, 1);
	p->st.evictions++;
}

/* Up to `want` of this pager's own pages out of the pool, best victims
 * first; how many left. */
static uint32_t evict_own(kvmem_pager *p, uint32_t want)
{
	uint64_t ev0 = p->st.evictions;
	uint32_t n, *v;

	if (!want)
		return 0;
	v = malloc(sizeof(*v) * want);
	if (!v)
		return 0;
	n = p->repl->victims(p->repl_st, want, v, p->step, slot_busy, p);
	for (uint32_t i = 0; i < n; i++)
		if (!slot_busy(p, v[i]))
			evict(p, v[i]);
	free(v);
	return (uint32_t)(p->st.evictions - ev0);
}

uint32_t pager_slots_take(kvmem_pager *p, uint32_t want, uint32_t *first)
{
	uint32_t n = kvmem_hostpool_alloc_run(p->pool, want, first);

	p->held += n;
	return n;
}

void pager_slots_give(kvmem_pager *p, uint32_t first, uint32_t n)
{
	kvmem_hostpool_release(p->pool, first, n);
	p->held -= n;
}

uint32_t pager_give_back(void *user, uint32_t want, uint32_t floor)
{
	kvmem_pager *q = user;
	uint32_t n;

	/* Never wait: q's owner may be waiting for the pool's lock, which
	 * the asking pager holds. */
	if (pthread_mutex_trylock(&q->mu))
		return 0;
	/* Writes of q's that finished unpin their pages: an idle pager's
	 * completions are reaped by no one else. */
	pager_reap(q, 0);
	n = evict_own(q, q->held <= floor ? 0 : want < q->held - floor ? want : q->held - floor);
	pthread_mutex_unlock(&q->mu);
	return n;
}

void room_pause(void)
{
	struct timespec ts = { 0, 200000 };

	nanosleep(&ts, NULL);
}

int make_room(kvmem_pager *p, uint32_t need)
{
	uint32_t have = kvmem_hostpool_free_slots(p->pool), want, n;

	if (have >= need)
		return 0;
	want = need - have;
	if (!p->shared) {
		n = evict_own(p, want);
	} else {
		uint32_t users = kvmem_hostpool_users(p->pool);
		uint32_t share = kvmem_hostpool_slots(p->pool) / (users ? users : 1);

		/* Below its share: the pages of the pagers above theirs first
		 * (a long conversation does not keep a short one thrashing). */
		n = 0;
		if (p->held < share)
			n = kvmem_hostpool_reclaim(p->pool, p, want, share, pager_give_back);
		if (n < want)
			n += evict_own(p, want - n);
		if (n < want)
			n += kvmem_hostpool_reclaim(p->pool, p, want - n, 0, pager_give_back);
	}
	if (n)
		PROBE_RECLAIM(want, n);
	return kvmem_hostpool_free_slots(p->pool) >= need ? 0 : -ENOBUFS;
}

static void set_resident(kvmem_pager *p, uint64_t pg, uint32_t s)
{
	struct kvmem_pte *e = &p->pt[pg];

	e->tiers |= KVMEM_TIER_HOST;
	e->host_slot = s;
	p->slot_page[s] = pg;
	p->repl->insert(p->repl_st, s, pg, p->step);
}

int pool_insert_slot(kvmem_pager *p, uint64_t pg, uint32_t *slot)
{
	uint64_t t = kvmem_now_ns();
	uint32_t s;
	int rc;

	if ((rc = make_room(p, 1)) < 0)
		return rc;
	if (pager_slots_take(p, 1, &s) != 1)
		return -ENOBUFS;
	set_resident(p, pg, s);
	PROBE_TIER_MOVE(pg, 0, KVMEM_TIER_HOST, p->page_bytes, kvmem_now_ns() - t);
	*slot = s;
	return 0;
}

int pool_insert_copy(kvmem_pager *p, uint64_t pg, const void *src)
{
	uint32_t s;
	int rc = pool_insert_slot(p, pg, &s);

	if (rc < 0)
		return rc;
	memcpy(kvmem_hostpool_slot(p->pool, s), src, p->page_bytes);
	return 0;
}

static int page_ok(kvmem_pager *p, uint64_t pg, const void *data)
{
	size_t L = p->g.n_layers;

	return XXH3_64bits(data, p->page_bytes) == p->sums[pg / L * (L + 1) + pg % L];
}

void read_done(kvmem_pager *p, struct io_req *r)
{
	uint64_t ns = kvmem_now_ns() - r->t_submit;

	if (r->purpose == PUR_FETCH)
		p->fetch_waiting--;
	p->st.read_requests++;
	p->st.read_ns += ns;
	if (r->res > 0) {
		struct pin_batch *b = &p->pin_batch;

		PROBE_PAGE_IN(r->first_page, r->n_pages, r->res, ns);
		if (b->requests == KVMEM_PROBE_BATCH_MAX)
			pin_batch_fire(p);
		b->lat[b->requests++] = ns;
		b->pages += r->n_pages;
		b->bytes += (uint64_t)r->res;
		b->ns += ns;
	}
	for (uint32_t k = 0; k < r->n_pages; k++) {
		uint64_t pg = r->first_page + k, need = (uint64_t)k * p->page_stride + p->page_bytes;
		uint32_t s = r->slot + k;
		struct kvmem_pte *e = &p->pt[pg];
		void *data = kvmem_hostpool_slot(p->pool, s);
		int got = r->res >= 0 && (uint64_t)r->res >= need;

		e->flags &= ~KVMEM_PTE_IN_FLIGHT;
		if (got && page_ok(p, pg, data)) {
			e->flags &= ~KVMEM_PTE_BAD;
			if (r->purpose == PUR_PREFETCH)
				e->flags |= KVMEM_PTE_PREFETCHED;
			set_resident(p, pg, s);
			p->st.pages_in++;
			p->st.bytes_in += p->page_bytes;
			PROBE_TIER_MOVE(pg, KVMEM_TIER_NVME, KVMEM_TIER_HOST, p->page_bytes, ns);
			continue;
		}
		e->flags |= KVMEM_PTE_BAD;
		e->host_slot = KVMEM_SLOT_NONE;
		p->slot_page[s] = UINT64_MAX;
		pager_slots_give(p, s, 1);
		if (!got) {
			p->st.read_errors++;
			PROBE_IO_ERROR(pg, r->res < 0 ? r->res : -EIO);
		} else {
			p->st.checksum_errors++;
		}
		if (r->purpose == PUR_FETCH && !p->read_err[0]) {
			p->read_errno = got ? EBADMSG : r->res < 0 ? -r->res : EIO;
			snprintf(p->read_err, sizeof(p->read_err),
				 "%s/pages: page %" PRIu64 " (block %" PRIu64 ", layer %u) at offset %"
				 PRIu64 ": %s", p->dir, pg, pg / p->g.n_layers,
				 (unsigned)(pg % p->g.n_layers), pg * p->page_stride,
				 got ? "checksum mismatch: corrupt, not used" :
				 r->res < 0 ? ws_strerror(p->ws, -r->res) : "short read: file truncated");
		}
	}
}

/* Start reads of sorted, distinct pages into free slots, consecutive pages
 * in one request as far as slots allow. Returns pages started. */
static size_t start_reads(kvmem_pager *p, const uint64_t *pages, size_t n, int purpose)
{
	size_t i = 0;

	while (i < n) {
		size_t j = i + 1;
		uint32_t first, got;
		struct io_req *r;

		while (j < n && pages[j] == pages[j - 1] + 1 && (j - i + 1) * p->page_stride <= p->max_read)
			j++;
		got = pager_slots_take(p, j - i, &first);
		if (!got)
			break;
		r = pager_req(p);
		if (!r) {
			pager_slots_give(p, first, got);
			break;
		}
		r->kind = IO_READ;
		r->purpose = purpose;
		r->first_page = pages[i];
		r->n_pages = got;
		r->slot = first;
		r->buf = kvmem_hostpool_slot(p->pool, first);
		r->len = (size_t)got * p->page_stride;
		r->off = pages[i] * p->page_stride;
		for (uint32_t k = 0; k < got; k++) {
			p->pt[pages[i] + k].flags |= KVMEM_PTE_IN_FLIGHT;
			p->pt[pages[i] + k].host_slot = first + k;
			p->slot_page[first + k] = pages[i] + k;
		}
		if (p->ws->ops->submit(p->ws, &p->io, r) < 0) {
			for (uint32_t k = 0; k < got; k++) {
				p->pt[pages[i] + k].flags &= ~KVMEM_PTE_IN_FLIGHT;
				p->pt[pages[i] + k].host_slot = KVMEM_SLOT_NONE;
				p->slot_page[first + k] = UINT64_MAX;
			}
			pager_slots_give(p, first, got);
			io_req_put(&p->io, r);
			break;
		}
		if (purpose == PUR_FETCH)
			p->fetch_waiting++;
		i += got;
	}
	if (i && pager_reap(p, 0) < 0)
		return i;
	return i;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* Sort page ids and drop repeats; returns how many are left. */
static size_t sort_unique(uint64_t *a, size_t n)
{
	size_t m = 0;

	qsort(a, n, sizeof(*a), cmp_u64);
	for (size_t i = 0; i < n; i++)
		if (!m || a[m - 1] != a[i])
			a[m++] = a[i];
	return m;
}

static void unpin(kvmem_pager *p, const uint64_t *pages, const uint8_t *pinned, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const struct kvmem_pte *e = &p->pt[pages[i]];

		if (pinned[i] && e->host_slot != KVMEM_SLOT_NONE && p->slot_pin[e->host_slot])
			p->slot_pin[e->host_slot]--;
	}
}

/* 0 ok, else -errno; -ENOBUFS: the pool cannot hold the request. */
static int fetch_impl(kvmem_pager *p, const uint64_t *pages, size_t n, const void **out)
{
	uint64_t total = p->n_blocks * p->g.n_layers, t0 = kvmem_now_ns(), *miss;
	const kvmem_pager_stats st0 = p->st;	/* the fetch probe's counts */
	size_t m = 0, nv = 0;
	uint8_t *pinned;
	int rc = 0;

	if (!n)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (pages[i] >= total)
			return kvmem_error(EINVAL, "%s: page %" PRIu64 " asked, the workspace has %" PRIu64
					 " pages", p->dir, pages[i], total);
	miss = malloc(n * sizeof(*miss));
	pinned = calloc(n, 1);
	if (!miss || !pinned) {
		free(miss);
		free(pinned);
		return kvmem_error(ENOMEM, "%s: out of memory", p->dir);
	}
	pager_reap(p, 0);
	p->read_err[0] = 0;
	p->read_errno = 0;
	for (size_t i = 0; i < n; i++) {
		struct kvmem_pte *e = &p->pt[pages[i]];

		if (e->tiers & KVMEM_TIER_HOST) {
			p->slot_pin[e->host_slot]++;
			pinned[i] = 1;
			p->st.host_hits++;
			PROBE_HIT(pages[i], KVMEM_TIER_HOST, p->page_bytes);
		} else {
			p->st.host_misses++;
			PROBE_MISS(pages[i], p->page_bytes);
			if (!(e->flags & KVMEM_PTE_IN_FLIGHT))
				miss[m++] = pages[i];
		}
	}
	/* A page asked twice is read once. */
	m = sort_unique(miss, m);
	/* Prefetches in flight hold slots that cannot be evicted until they
	 * land: wait for them before calling the pool too small. */
	while (make_room(p, m) < 0 && p->io.inflight)
		if (pager_reap(p, 1) < 0)
			break;
	/* A shared pool: the room made must still be there when the slots
	 * are taken (the pool's lock until then), and pagers busy in a call
	 * give nothing back: ask again for a while before giving up. */
	for (int tries = 0;; tries++) {
		kvmem_hostpool_lock(p->pool);
		if (make_room(p, m) == 0 || !p->shared || tries == ROOM_TRIES)
			break;
		kvmem_hostpool_unlock(p->pool);
		room_pause();
	}
	if (make_room(p, m) < 0) {
		kvmem_hostpool_unlock(p->pool);
		unpin(p, pages, pinned, n);
		rc = kvmem_error(ENOBUFS, "%s: host pool too small: a request needs %zu more pages, "
				 "the pool holds %u (%u free after evicting what may go)", p->dir, m,
				 kvmem_hostpool_slots(p->pool), kvmem_hostpool_free_slots(p->pool));
		goto out;
	}
	for (size_t k = 0; k < m; k++) {
		const uint8_t *src = stage_find(p, miss[k] / p->g.n_layers);

		if (!src) {
			miss[nv++] = miss[k];
			continue;
		}
		pool_insert_copy(p, miss[k], src + miss[k] % p->g.n_layers * p->page_stride);
		p->st.staging_hits++;
		PROBE_HIT(miss[k], 0, p->page_bytes);
	}
	if (start_reads(p, miss, nv, PUR_FETCH) < nv && !p->read_err[0])
		snprintf(p->read_err, sizeof(p->read_err), "%s/pages: cannot start reads: %s",
			 p->dir, kvmem_last_error());
	kvmem_hostpool_unlock(p->pool);
	while (p->fetch_waiting)
		if (pager_reap(p, 1) < 0)
			break;
	for (size_t i = 0; i < n; i++)
		while (p->pt[pages[i]].flags & KVMEM_PTE_IN_FLIGHT)
			if (pager_reap(p, 1) < 0)
				break;
	if (nv)
		p->st.fetch_wait_ns += kvmem_now_ns() - t0;
	for (size_t i = 0; i < n; i++) {
		struct kvmem_pte *e = &p->pt[pages[i]];

		if (!(e->tiers & KVMEM_TIER_HOST)) {
			if (!p->read_err[0])
				snprintf(p->read_err, sizeof(p->read_err),
					 "%s/pages: page %" PRIu64 " (block %" PRIu64 ", layer %u) could "
					 "not be brought in%s", p->dir, pages[i],
					 pages[i] / p->g.n_layers, (unsigned)(pages[i] % p->g.n_layers),
					 e->flags & KVMEM_PTE_BAD ? ": its read failed or its checksum did "
					 "not match" : "");
			rc = p->read_errno ? -p->read_errno : e->flags & KVMEM_PTE_BAD ? -EBADMSG : -EIO;
			continue;
		}
		if (!pinned[i]) {
			p->slot_pin[e->host_slot]++;
			pinned[i] = 1;
		}
		if (e->flags & KVMEM_PTE_PREFETCHED) {
			p->st.prefetch_used++;
			e->flags &= ~KVMEM_PTE_PREFETCHED;
		}
		p->repl->touch(p->repl_st, e->host_slot, p->step);
		if (e->access_count != UINT32_MAX)
			e->access_count++;
		e->last_step = p->step;
		out[i] = kvmem_hostpool_slot(p->pool, e->host_slot);
	}
	if (rc < 0) {
		unpin(p, pages, pinned, n);
		kvmem_error(-rc, "%s", p->read_err);
	}
out:
	PROBE_FETCH(n, p->st.host_hits - st0.host_hits, p->st.host_misses - st0.host_misses,
		    p->st.staging_hits - st0.staging_hits, kvmem_now_ns() - t0);
	free(miss);
	free(pinned);
	return rc;
}

int kvmem_pager_fetch(kvmem_pager *p, const uint64_t *pages, size_t n, const void **out)
{
	int rc;

	pager_lock(p);
	rc = fetch_impl(p, pages, n, out);
	pager_unlock(p);
	return rc < 0 ? rc : 0;
}

void kvmem_pager_release(kvmem_pager *p, const uint64_t *pages, size_t n)
{
	uint64_t total = p->n_blocks * p->g.n_layers;

	pager_lock(p);
	for (size_t i = 0; i < n; i++) {
		const struct kvmem_pte *e;

		if (pages[i] >= total)
			continue;
		e = &p->pt[pages[i]];
		if ((e->tiers & KVMEM_TIER_HOST) && p->slot_pin[e->host_slot])
			p->slot_pin[e->host_slot]--;
	}
	pager_unlock(p);
}

int kvmem_pager_stage_in(kvmem_pager *p, const uint64_t *pages, size_t n, kvmem_page_fn fn,
		       void *arg)
{
	size_t batch = kvmem_hostpool_slots(p->pool) / 2, i = 0;
	const void **ptr;
	int rc = 0;

	if (!batch)
		batch = 1;
	if (batch > n)
		batch = n ? n : 1;
	ptr = malloc(batch * sizeof(*ptr));
	if (!ptr)
		return kvmem_error(ENOMEM, "%s: out of memory", p->dir);
	pager_lock(p);
	while (i < n) {
		size_t k = n - i < batch ? n - i : batch;

		rc = fetch_impl(p, pages + i, k, ptr);
		if (rc == -ENOBUFS && k > 1) {
			batch = k / 2;
			rc = 0;
			continue;
		}
		if (rc < 0)
			break;
		for (size_t j = 0; j < k && rc >= 0; j++)
			rc = fn(arg, pages[i + j], ptr[j]);
		kvmem_pager_release(p, pages + i, k);
		if (rc < 0)
			break;
		i += k;
	}
	pager_unlock(p);
	free(ptr);
	return rc < 0 ? rc : 0;
}

int kvmem_pager_prefetch(kvmem_pager *p, const uint64_t *pages, size_t n)
{
	uint64_t total = p->n_blocks * p->g.n_layers, *want;
	size_t m = 0, started;

	want = malloc((n ? n : 1) * sizeof(*want));
	if (!want)
		return kvmem_error(ENOMEM, "%s: out of memory", p->dir);
	pager_lock(p);
	pager_reap(p, 0);
	for (size_t i = 0; i < n; i++) {
		struct kvmem_pte *e;

		if (pages[i] >= total)
			continue;
		e = &p->pt[pages[i]];
		if ((e->tiers & KVMEM_TIER_HOST) || (e->flags & KVMEM_PTE_IN_FLIGHT) ||
		    !(e->tiers & KVMEM_TIER_NVME))
			continue;
		want[m++] = pages[i];
	}
	m = sort_unique(want, m);
	make_room(p, m);	/* best effort: fewer pages start if it falls short */
	started = start_reads(p, want, m, PUR_PREFETCH);
	for (size_t k = 0; k < started; k++)
		PROBE_PREFETCH(want[k], p->page_bytes);
	PROBE_PREFETCH_BATCH(n, started);
	p->st.prefetch_pages += started;
	pager_unlock(p);
	free(want);
	return (int)started;
}

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

#include "pager/pager_int.h"
#include "pager/probes.h"

#define MAX_IO (8u << 20)	/* largest single read request */

static int slot_busy(void *arg, uint32_t s)
{
	kvm_pager *p = arg;
	uint64_t pg = p->slot_page[s];

	return p->slot_pin[s] || pg == UINT64_MAX || (p->pt[pg].flags & KVM_PTE_IN_FLIGHT);
}

static void evict(kvm_pager *p, uint32_t s)
{
	uint64_t pg = p->slot_page[s];
	struct kvm_pte *e = &p->pt[pg];

	PROBE_EVICT(pg, s, p->page_bytes);
	PROBE_TIER_MOVE(pg, KVM_TIER_HOST, 0, p->page_bytes, 0);
	e->tiers &= ~KVM_TIER_HOST;
	e->flags &= ~KVM_PTE_PREFETCHED;
	e->host_slot = KVM_SLOT_NONE;
	p->repl->remove(p->repl_st, s);
	p->slot_page[s] = UINT64_MAX;
	kvm_hostpool_release(p->pool, s, 1);
	p->st.evictions++;
}

int make_room(kvm_pager *p, uint32_t need)
{
	uint32_t have = kvm_hostpool_free_slots(p->pool), want, n, *v;

	if (have >= need)
		return 0;
	want = need - have;
	v = malloc(sizeof(*v) * want);
	if (!v)
		return -1;
	n = p->repl->victims(p->repl_st, want, v, p->step, slot_busy, p);
	for (uint32_t i = 0; i < n; i++)
		if (!slot_busy(p, v[i]))
			evict(p, v[i]);
	free(v);
	return kvm_hostpool_free_slots(p->pool) >= need ? 0 : -1;
}

static void set_resident(kvm_pager *p, uint64_t pg, uint32_t s)
{
	struct kvm_pte *e = &p->pt[pg];

	e->tiers |= KVM_TIER_HOST;
	e->host_slot = s;
	p->slot_page[s] = pg;
	p->repl->insert(p->repl_st, s, pg, p->step);
}

int pool_insert_copy(kvm_pager *p, uint64_t pg, const void *src)
{
	uint64_t t = now_ns();
	uint32_t s;

	if (make_room(p, 1) < 0 || kvm_hostpool_alloc_run(p->pool, 1, &s) != 1)
		return -1;
	memcpy(kvm_hostpool_slot(p->pool, s), src, p->page_bytes);
	set_resident(p, pg, s);
	PROBE_TIER_MOVE(pg, 0, KVM_TIER_HOST, p->page_bytes, now_ns() - t);
	return 0;
}

static int page_ok(kvm_pager *p, uint64_t pg, const void *data)
{
	size_t L = p->g.n_layers;

	return XXH3_64bits(data, p->page_bytes) == p->sums[pg / L * (L + 1) + pg % L];
}

void read_done(kvm_pager *p, struct io_req *r)
{
	uint64_t ns = now_ns() - r->t_submit;

	if (r->purpose == PUR_FETCH)
		p->fetch_waiting--;
	p->st.read_requests++;
	p->st.read_ns += ns;
	if (r->res > 0)
		PROBE_PAGE_IN(r->first_page, r->n_pages, r->res, ns);
	for (uint32_t k = 0; k < r->n_pages; k++) {
		uint64_t pg = r->first_page + k, need = (uint64_t)k * p->page_stride + p->page_bytes;
		uint32_t s = r->slot + k;
		struct kvm_pte *e = &p->pt[pg];
		void *data = kvm_hostpool_slot(p->pool, s);
		int got = r->res >= 0 && (uint64_t)r->res >= need;

		e->flags &= ~KVM_PTE_IN_FLIGHT;
		if (got && page_ok(p, pg, data)) {
			e->flags &= ~KVM_PTE_BAD;
			if (r->purpose == PUR_PREFETCH)
				e->flags |= KVM_PTE_PREFETCHED;
			set_resident(p, pg, s);
			p->st.pages_in++;
			p->st.bytes_in += p->page_bytes;
			PROBE_TIER_MOVE(pg, KVM_TIER_NVME, KVM_TIER_HOST, p->page_bytes, ns);
			continue;
		}
		e->flags |= KVM_PTE_BAD;
		e->host_slot = KVM_SLOT_NONE;
		p->slot_page[s] = UINT64_MAX;
		kvm_hostpool_release(p->pool, s, 1);
		if (!got) {
			p->st.read_errors++;
			PROBE_IO_ERROR(pg, r->res < 0 ? r->res : -EIO);
		} else {
			p->st.checksum_errors++;
		}
		if (r->purpose == PUR_FETCH && !p->read_err[0])
			snprintf(p->read_err, sizeof(p->read_err),
				 "%s/pages: page %" PRIu64 " (block %" PRIu64 ", layer %u) at offset %"
				 PRIu64 ": %s", p->dir, pg, pg / p->g.n_layers,
				 (unsigned)(pg % p->g.n_layers), pg * p->page_stride,
				 got ? "checksum mismatch: corrupt, not used" :
				 r->res < 0 ? strerror(-r->res) : "short read: file truncated");
	}
}

/* Start reads of sorted, distinct pages into free slots, consecutive pages
 * in one request as far as slots allow. Returns pages started. */
static size_t start_reads(kvm_pager *p, const uint64_t *pages, size_t n, int purpose)
{
	size_t i = 0;

	while (i < n) {
		size_t j = i + 1;
		uint32_t first, got;
		struct io_req *r;

		while (j < n && pages[j] == pages[j - 1] + 1 && (j - i + 1) * p->page_stride <= MAX_IO)
			j++;
		got = kvm_hostpool_alloc_run(p->pool, j - i, &first);
		if (!got)
			break;
		r = pager_req(p);
		if (!r) {
			kvm_hostpool_release(p->pool, first, got);
			break;
		}
		r->kind = IO_READ;
		r->purpose = purpose;
		r->first_page = pages[i];
		r->n_pages = got;
		r->slot = first;
		r->buf = kvm_hostpool_slot(p->pool, first);
		r->len = (size_t)got * p->page_stride;
		r->off = pages[i] * p->page_stride;
		for (uint32_t k = 0; k < got; k++) {
			p->pt[pages[i] + k].flags |= KVM_PTE_IN_FLIGHT;
			p->pt[pages[i] + k].host_slot = first + k;
			p->slot_page[first + k] = pages[i] + k;
		}
		if (io_queue(&p->io, p->fd_pages, r) < 0) {
			for (uint32_t k = 0; k < got; k++) {
				p->pt[pages[i] + k].flags &= ~KVM_PTE_IN_FLIGHT;
				p->pt[pages[i] + k].host_slot = KVM_SLOT_NONE;
				p->slot_page[first + k] = UINT64_MAX;
			}
			kvm_hostpool_release(p->pool, first, got);
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

static void unpin(kvm_pager *p, const uint64_t *pages, const uint8_t *pinned, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const struct kvm_pte *e = &p->pt[pages[i]];

		if (pinned[i] && e->host_slot != KVM_SLOT_NONE && p->slot_pin[e->host_slot])
			p->slot_pin[e->host_slot]--;
	}
}

/* 0 ok, -1 error, -2 the pool cannot hold the request. */
static int fetch_impl(kvm_pager *p, const uint64_t *pages, size_t n, const void **out)
{
	uint64_t total = p->n_blocks * p->g.n_layers, t0 = now_ns(), *miss;
	size_t m = 0, nv = 0;
	uint8_t *pinned;
	int rc = 0;

	if (!n)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (pages[i] >= total)
			return kvm_error("%s: page %" PRIu64 " asked, the workspace has %" PRIu64
					 " pages", p->dir, pages[i], total);
	miss = malloc(n * sizeof(*miss));
	pinned = calloc(n, 1);
	if (!miss || !pinned) {
		free(miss);
		free(pinned);
		return kvm_error("%s: out of memory", p->dir);
	}
	pager_reap(p, 0);
	p->read_err[0] = 0;
	for (size_t i = 0; i < n; i++) {
		struct kvm_pte *e = &p->pt[pages[i]];

		if (e->tiers & KVM_TIER_HOST) {
			p->slot_pin[e->host_slot]++;
			pinned[i] = 1;
			p->st.host_hits++;
			PROBE_HIT(pages[i], KVM_TIER_HOST, p->page_bytes);
		} else {
			p->st.host_misses++;
			if (!(e->flags & (KVM_PTE_IN_FLIGHT | KVM_PTE_MARK))) {
				e->flags |= KVM_PTE_MARK;
				miss[m++] = pages[i];
				PROBE_MISS(pages[i], p->page_bytes);
			}
		}
	}
	for (size_t k = 0; k < m; k++)
		p->pt[miss[k]].flags &= ~KVM_PTE_MARK;
	/* Prefetches in flight hold slots that cannot be evicted until they
	 * land: wait for them before calling the pool too small. */
	while (make_room(p, m) < 0 && p->io.inflight)
		if (pager_reap(p, 1) < 0)
			break;
	if (make_room(p, m) < 0) {
		unpin(p, pages, pinned, n);
		kvm_error("%s: host pool too small: a request needs %zu more pages, the pool holds %u "
			  "(%u free after evicting what may go)", p->dir, m,
			  kvm_hostpool_slots(p->pool), kvm_hostpool_free_slots(p->pool));
		rc = -2;
		goto out;
	}
	qsort(miss, m, sizeof(*miss), cmp_u64);
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
			 p->dir, kvm_last_error());
	while (p->fetch_waiting)
		if (pager_reap(p, 1) < 0)
			break;
	for (size_t i = 0; i < n; i++)
		while (p->pt[pages[i]].flags & KVM_PTE_IN_FLIGHT)
			if (pager_reap(p, 1) < 0)
				break;
	if (nv)
		p->st.fetch_wait_ns += now_ns() - t0;
	for (size_t i = 0; i < n; i++) {
		struct kvm_pte *e = &p->pt[pages[i]];

		if (!(e->tiers & KVM_TIER_HOST)) {
			if (!p->read_err[0])
				snprintf(p->read_err, sizeof(p->read_err),
					 "%s/pages: page %" PRIu64 " (block %" PRIu64 ", layer %u) could "
					 "not be brought in%s", p->dir, pages[i],
					 pages[i] / p->g.n_layers, (unsigned)(pages[i] % p->g.n_layers),
					 e->flags & KVM_PTE_BAD ? ": its read failed or its checksum did "
					 "not match" : "");
			rc = -1;
			continue;
		}
		if (!pinned[i]) {
			p->slot_pin[e->host_slot]++;
			pinned[i] = 1;
		}
		if (e->flags & KVM_PTE_PREFETCHED) {
			p->st.prefetch_used++;
			e->flags &= ~KVM_PTE_PREFETCHED;
		}
		p->repl->touch(p->repl_st, e->host_slot, p->step);
		if (e->access_count != UINT32_MAX)
			e->access_count++;
		e->last_step = p->step;
		out[i] = kvm_hostpool_slot(p->pool, e->host_slot);
	}
	if (rc < 0) {
		unpin(p, pages, pinned, n);
		kvm_error("%s", p->read_err);
	}
out:
	free(miss);
	free(pinned);
	return rc;
}

int kvm_pager_fetch(kvm_pager *p, const uint64_t *pages, size_t n, const void **out)
{
	return fetch_impl(p, pages, n, out) < 0 ? -1 : 0;
}

void kvm_pager_release(kvm_pager *p, const uint64_t *pages, size_t n)
{
	uint64_t total = p->n_blocks * p->g.n_layers;

	for (size_t i = 0; i < n; i++) {
		const struct kvm_pte *e;

		if (pages[i] >= total)
			continue;
		e = &p->pt[pages[i]];
		if ((e->tiers & KVM_TIER_HOST) && p->slot_pin[e->host_slot])
			p->slot_pin[e->host_slot]--;
	}
}

int kvm_pager_stage_in(kvm_pager *p, const uint64_t *pages, size_t n, kvm_page_fn fn,
		       void *arg)
{
	size_t batch = kvm_hostpool_slots(p->pool) / 2, i = 0;
	const void **ptr;

	if (!batch)
		batch = 1;
	if (batch > n)
		batch = n ? n : 1;
	ptr = malloc(batch * sizeof(*ptr));
	if (!ptr)
		return kvm_error("%s: out of memory", p->dir);
	while (i < n) {
		size_t k = n - i < batch ? n - i : batch;
		int rc = fetch_impl(p, pages + i, k, ptr);

		if (rc == -2 && k > 1) {
			batch = k / 2;
			continue;
		}
		if (rc < 0) {
			free(ptr);
			return -1;
		}
		for (size_t j = 0; j < k; j++) {
			if (fn(arg, pages[i + j], ptr[j]) < 0) {
				kvm_pager_release(p, pages + i, k);
				free(ptr);
				return -1;
			}
		}
		kvm_pager_release(p, pages + i, k);
		i += k;
	}
	free(ptr);
	return 0;
}

int kvm_pager_prefetch(kvm_pager *p, const uint64_t *pages, size_t n)
{
	uint64_t total = p->n_blocks * p->g.n_layers, *want;
	size_t m = 0, started;

	pager_reap(p, 0);
	want = malloc((n ? n : 1) * sizeof(*want));
	if (!want)
		return kvm_error("%s: out of memory", p->dir);
	for (size_t i = 0; i < n; i++) {
		struct kvm_pte *e;

		if (pages[i] >= total)
			continue;
		e = &p->pt[pages[i]];
		if ((e->tiers & KVM_TIER_HOST) || (e->flags & (KVM_PTE_IN_FLIGHT | KVM_PTE_MARK)) ||
		    !(e->tiers & KVM_TIER_NVME))
			continue;
		e->flags |= KVM_PTE_MARK;
		want[m++] = pages[i];
	}
	for (size_t k = 0; k < m; k++)
		p->pt[want[k]].flags &= ~KVM_PTE_MARK;
	qsort(want, m, sizeof(*want), cmp_u64);
	make_room(p, m);	/* best effort: fewer pages start if it falls short */
	started = start_reads(p, want, m, PUR_PREFETCH);
	for (size_t k = 0; k < started; k++)
		PROBE_PREFETCH(want[k], p->page_bytes);
	p->st.prefetch_pages += started;
	free(want);
	return (int)started;
}

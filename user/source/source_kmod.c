// SPDX-License-Identifier: MIT
/*
 * The page source over the kernel module (/dev/kvmem) beside the pager: one
 * truth, the workspace directory, read two ways.
 *
 *   write, stage-out, commit   the pager source inside (source_pager.c):
 *                              blocks fill in memory, full ones are staged
 *                              out, a commit makes them durable; the crash
 *                              rule is the pager's alone
 *   get of a committed page    the module's window: an absent page is
 *                              read by io_uring O_DIRECT straight into it
 *                              (kvmem_kmod_fill: no copy) where the file
 *                              system allows, else by the module (a
 *                              buffered read); the module checks the sum
 *   get of any other page      the pager source (open blocks from memory,
 *                              staged but uncommitted ones from its pool)
 *   prefetch                   committed pages into the window the same
 *                              way, the reads going on until the next get
 *                              (kvmem_kmod_fill_start), or the module's
 *                              PREFETCH; others to the pager
 *   hint                       the selection's committed pages (view,
 *                              then runners-up) to the module with the
 *                              step (KVMEM_IOC_HINT), and to the pager
 *   region                     the window over the committed pages, when
 *                              it fits the host cap (a backend pins it);
 *                              then the window never moves
 *   commit                     then the module's page count follows the
 *                              pager's committed pages, and its step
 *   device                     pages of the window a backend's device
 *                              pool took or dropped (a GPU's copies) go
 *                              to the module's table as its GPU tier
 *                              (KVMEM_IOC_GPU)
 *
 * The module's client is a reader of committed pages (kvmem_kmod_open_pager:
 * files read-only, no lock; the pager holds the writer's lock). Which reader
 * serves a block changes only while no page is out (between a put and the
 * next get), so every put goes to the reader its get came from. The window
 * is sized in pages when opened; commits past it reopen it twice as large.
 */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kmod.h"
#include "kvmem/kvmem.h"
#include "kvmem/pager.h"
#include "kvmem/source.h"
#include "kvmem/store.h"
#include "util/grow.h"

/* The window's first size in blocks when the caller names none. */
#define KSRC_BLOCKS_FIRST 1024

struct ksrc {
	kvmem_page_source inner;	/* the pager source: writes, uncommitted reads, commits */
	kvmem_pager *p;
	const kvmem_page_geom *g;
	kvmem_kmod *k;
	kvmem_kmod_opts ko;		/* the window's options, for a reopen */
	uint64_t L;
	size_t half;			/* bytes of a page's K; V follows */
	uint64_t served;		/* blocks [0, served) are read through the module */
	uint64_t target;		/* blocks the pager's last commit covers */
	uint64_t step;			/* commits through this source: the module's step */
	uint64_t out;			/* pages got and not yet put, from either reader */
	struct kvmem_ioc_stats before;	/* counters of the windows closed by growing */
	size_t fill_max;		/* pages a prefetch reads at most: half the slots */
	int region_out;			/* the window was handed out (region): it never moves */
	uint64_t *list;			/* prefetch scratch */
	size_t list_cap;
	uint32_t *slots;		/* device scratch, beside list */
	size_t slots_cap;
};

static const kvmem_page_source_ops kmod_source_ops;

/* Add the counters of st to sum (not resident and slots: those are now). */
static void add_counters(struct kvmem_ioc_stats *sum, const struct kvmem_ioc_stats *st)
{
	uint64_t *a = (uint64_t *)sum;
	const uint64_t *b = (const uint64_t *)st;

	for (size_t i = 0; i < offsetof(struct kvmem_ioc_stats, resident) / sizeof(*a); i++)
		a[i] += b[i];
}

/* A window of page_max pages over what the pager has committed. */
static int window_open(struct ksrc *s, uint64_t page_max)
{
	kvmem_kmod_opts o = s->ko;
	struct kvmem_ioc_stats st;
	int rc;

	o.page_max = page_max;
	if ((rc = kvmem_kmod_open_pager(s->p, &o, &s->k)) < 0)
		return rc;
	if ((rc = kvmem_kmod_stats(s->k, &st)) < 0) {
		kvmem_kmod_close(s->k);
		s->k = NULL;
		return rc;
	}
	s->fill_max = st.slots / 2 ? (size_t)(st.slots / 2) : 1;
	return 0;
}

/*
 * Bring the module to the pager's last commit: its page count (growing the
 * window when the commit passed it), and, while no page is out, the blocks
 * read through it.
 */
static int follow(struct ksrc *s)
{
	uint64_t want = s->target * s->L, have = kvmem_kmod_pages(s->k), room;
	size_t len;

	kvmem_kmod_window(s->k, &len);
	room = len / kvmem_kmod_page_stride(s->k) / s->L * s->L;
	/* A window handed out as the region (a backend registered it) must
	 * stay where it is: blocks past it stay the pager's. */
	if (s->region_out && want > room)
		want = room;
	if (want > room) {
		kvmem_kmod *old = s->k;
		uint64_t max = 2 * want;

		struct kvmem_ioc_stats st;

		if (s->out)
			return 0;	/* pointers into the window are out: later */
		if (kvmem_kmod_stats(old, &st) < 0)
			return kvmem_fail();
		s->k = NULL;
		if (window_open(s, max) < 0) {
			s->k = old;
			return kvmem_error_prefix("%s: growing the module's window to %" PRIu64
						  " pages", kvmem_pager_dir(s->p), max);
		}
		kvmem_kmod_close(old);
		add_counters(&s->before, &st);
		if (kvmem_kmod_step(s->k, s->step) < 0)
			return kvmem_fail();
	} else if (want > have && kvmem_kmod_set_count(s->k, want) < 0) {
		return kvmem_error_prefix("%s: the module following the commit of %" PRIu64 " blocks",
					  kvmem_pager_dir(s->p), s->target);
	}
	if (!s->out)
		s->served = want / s->L;
	return 0;
}

static int via_module(const struct ksrc *s, int64_t b, int layer)
{
	return b >= 0 && (uint64_t)b < s->served && layer >= 0 && (uint64_t)layer < s->L;
}

static int ks_write(void *ctx, int64_t b, int layer, int t0, int n, const float *k,
		    const float *v)
{
	struct ksrc *s = ctx;

	return s->inner.ops->write(s->inner.ctx, b, layer, t0, n, k, v);
}

static int ks_write_rows(void *ctx, int64_t p0, int n, const void *k, const void *v,
			 uint32_t dtype)
{
	struct ksrc *s = ctx;

	return s->inner.ops->write_rows(s->inner.ctx, p0, n, k, v, dtype);
}

static int ks_get(void *ctx, int64_t b, int layer, kvmem_page *pg)
{
	struct ksrc *s = ctx;
	const void *data;
	int rc;

	if (!s->out && s->served != s->target && follow(s) < 0)
		return kvmem_fail();
	if (via_module(s, b, layer)) {
		uint64_t id = kvmem_page_id(s->g, (uint64_t)b, (uint32_t)layer);
		int32_t st;

		/* Read it without a copy when it is absent; whatever that
		 * could not do (no slot, a failed read) the module's own read
		 * below does, and says what is wrong with the page. */
		if (kvmem_kmod_direct(s->k) && !kvmem_kmod_resident(s->k, id))
			kvmem_kmod_fill(s->k, &id, 1, &st);
		rc = kvmem_kmod_get(s->k, id, &data);
		if (rc < 0)
			return kvmem_error_prefix("%s", kvmem_pager_dir(s->p));
		pg->k = data;
		pg->v = (const char *)data + s->half;
		pg->dtype = s->g->dtype;
		pg->mem = KVMEM_MEM_HOST;
	} else if ((rc = s->inner.ops->get(s->inner.ctx, b, layer, pg))) {
		return rc;
	}
	s->out++;
	return 0;
}

static void ks_put(void *ctx, int64_t b, int layer)
{
	struct ksrc *s = ctx;

	/* A module page needs no release: reclaim may take it once it is
	 * not mapped by a fault in progress, and a touch brings it back. */
	if (!via_module(s, b, layer))
		s->inner.ops->put(s->inner.ctx, b, layer);
	if (s->out)
		s->out--;
}

static void ks_prefetch(void *ctx, const int64_t *blocks, int n)
{
	struct ksrc *s = ctx;
	size_t m = 0;

	if (n <= 0)
		return;
	if (kvmem_grow(&s->list, sizeof(*s->list), (size_t)n * s->L, &s->list_cap, 64))
		return;	/* only a hint */
	for (int i = 0; i < n; i++)
		if (via_module(s, blocks[i], 0))
			for (uint64_t l = 0; l < s->L; l++)
				s->list[m++] = (uint64_t)blocks[i] * s->L + l;
	/* Start O_DIRECT reads into the window (they end at the next get,
	 * which waits for them), at most half the window's slots so that a
	 * prefetch does not push out every page just got; else the module
	 * fills them asynchronously. The pager source takes the rest (staged
	 * blocks) and ignores what it does not hold. */
	if (m && kvmem_kmod_direct(s->k))
		kvmem_kmod_fill_start(s->k, s->list, m < s->fill_max ? m : s->fill_max);
	else if (m)
		kvmem_kmod_prefetch(s->k, s->list, m, 0);
	if (m < (size_t)n * s->L && s->inner.ops->prefetch) {
		int64_t *rest = (int64_t *)s->list;
		int r = 0;

		for (int i = 0; i < n; i++)
			if (!via_module(s, blocks[i], 0))
				rest[r++] = blocks[i];
		if (r)
			s->inner.ops->prefetch(s->inner.ctx, rest, r);
	}
}

/*
 * The selector's view of the step: the module gets the committed blocks'
 * pages, those of the view (score 1) first and the runners-up (lower
 * scores) after, with the step (KVMEM_IOC_HINT), so its reclaim lets them
 * go last and BPF policies see them; the pager's replacement policy gets
 * all of them (it keeps staged blocks by them).
 */
static void ks_hint(void *ctx, const int64_t *blocks, const float *scores, int n)
{
	struct ksrc *s = ctx;
	size_t m = 0, n_sel = 0;

	if (n > 0 && !kvmem_grow(&s->list, sizeof(*s->list), (size_t)n * s->L, &s->list_cap, 64)) {
		for (int pass = 0; pass < 2; pass++) {
			for (int i = 0; i < n; i++)
				if ((scores[i] >= 1.0f) == !pass && via_module(s, blocks[i], 0))
					for (uint64_t l = 0; l < s->L; l++)
						s->list[m++] = (uint64_t)blocks[i] * s->L + l;
			if (!pass)
				n_sel = m;
		}
		/* Only a hint: a refusal changes nothing that matters. */
		if (m)
			kvmem_kmod_hint(s->k, s->step, s->list, m, n_sel, 0);
	}
	if (s->inner.ops->hint)
		s->inner.ops->hint(s->inner.ctx, blocks, scores, n);
}

/*
 * The region a backend may register (cudaHostRegister on a GPU host,
 * host_register in kvmem/backend.h): the module's window over the
 * committed pages, so a GPU reads them where the O_DIRECT reads put them.
 * Registering pins every page it covers (the module never evicts a held
 * page), so it is offered only when the whole window fits under the host
 * cap: a larger one could not page at all (-ENOTSUP). Once handed out the
 * window never moves (follow: blocks committed past it stay the pager's).
 * -ENOENT before anything is committed.
 */
static int ks_region(void *ctx, void **base, size_t *len)
{
	struct ksrc *s = ctx;
	struct kvmem_ioc_stats st;
	uint64_t stride = kvmem_kmod_page_stride(s->k), pages = kvmem_kmod_pages(s->k);
	size_t wlen;
	void *w = kvmem_kmod_window(s->k, &wlen);

	if (kvmem_kmod_stats(s->k, &st) < 0)
		return kvmem_fail();
	if (wlen / stride > st.slots)
		return kvmem_error(ENOTSUP, "%s: the module's window (%" PRIu64 " pages) is larger "
				   "than its host cap (%" PRIu64 " pages): registering it would pin "
				   "every page, so it is not offered as a region",
				   kvmem_pager_dir(s->p), (uint64_t)(wlen / stride),
				   (uint64_t)st.slots);
	if (!pages)
		return kvmem_error(ENOENT, "%s: nothing committed yet: no region",
				   kvmem_pager_dir(s->p));
	s->region_out = 1;
	*base = w;
	*len = pages * stride;
	return 0;
}

/*
 * A backend's device page pool (a GPU's) took pages at slots or dropped
 * them (KVMEM_DEVICE_NONE): the module's table records them as the GPU
 * tier (KVMEM_IOC_GPU), so its readers and tools see three tiers. Only
 * pages read through the module have an entry there; a GPU keeps only
 * pages of the region (the window), so those are all it reports.
 */
static void ks_device(void *ctx, const kvmem_device_page *pages, int n)
{
	struct ksrc *s = ctx;
	size_t m = 0;

	if (n <= 0 || kvmem_grow(&s->list, sizeof(*s->list), (size_t)n, &s->list_cap, 64) ||
	    kvmem_grow(&s->slots, sizeof(*s->slots), (size_t)n, &s->slots_cap, 64))
		return;	/* only a report */
	for (int i = 0; i < n; i++)
		if (via_module(s, pages[i].block, pages[i].layer)) {
			s->list[m] = kvmem_page_id(s->g, (uint64_t)pages[i].block,
						   (uint32_t)pages[i].layer);
			s->slots[m++] = pages[i].slot == KVMEM_DEVICE_NONE ? KVMEM_SLOT_NONE
									     : pages[i].slot;
		}
	/* Checked whole before anything is done (ids under the page count,
	 * which only grows): nothing here can be refused but memory. */
	if (m)
		kvmem_kmod_gpu(s->k, s->list, s->slots, m);
}

static void ks_destroy(void *ctx)
{
	struct ksrc *s = ctx;

	kvmem_kmod_close(s->k);
	kvmem_page_source_destroy(&s->inner);
	free(s->list);
	free(s->slots);
	free(s);
}

static int ks_commit(void *ctx, const int32_t *ids, int64_t n, const void *app, uint32_t app_len);

static const kvmem_page_source_ops kmod_source_ops = {
	.name = "kmod",
	.write = ks_write,
	.get = ks_get,
	.put = ks_put,
	.prefetch = ks_prefetch,
	.hint = ks_hint,
	.region = ks_region,
	.destroy = ks_destroy,
	.commit = ks_commit,
	.write_rows = ks_write_rows,
	.device = ks_device,
};

int kvmem_page_source_kmod(kvmem_page_source *src, kvmem_pager *p, const kvmem_kmod_opts *o)
{
	const kvmem_page_geom *g = kvmem_pager_geom(p);
	struct ksrc *s;
	uint64_t first;
	int rc;

	if ((rc = kvmem_kmod_probe(o ? o->dev : NULL)) < 0)
		return kvmem_error_prefix("%s: the kmod page source", kvmem_pager_dir(p));
	if (g->dtype == KVMEM_DTYPE_FP8)	/* its pages would need their scales */
		return kvmem_error(ENOTSUP, "%s: the kmod page source reads f32, bf16 and f16 pages, "
				   "not fp8", kvmem_pager_dir(p));
	s = calloc(1, sizeof(*s));
	if (!s)
		return kvmem_error(ENOMEM, "%s: out of memory", kvmem_pager_dir(p));
	s->p = p;
	s->g = g;
	s->L = g->n_layers;
	s->half = kvmem_page_bytes(g) / 2;
	if (o)
		s->ko = *o;
	else
		kvmem_kmod_opts_default(&s->ko);
	if ((rc = kvmem_page_source_pager(&s->inner, p)) < 0) {
		free(s);
		return rc;
	}
	s->target = kvmem_pager_committed_tokens(p) / g->block_tokens;
	/* Room for the history there is and as much again, at least. */
	first = s->ko.page_max ? (s->ko.page_max + s->L - 1) / s->L * s->L
			       : KSRC_BLOCKS_FIRST * s->L;
	if (first < 2 * s->target * s->L)
		first = 2 * s->target * s->L;
	if ((rc = window_open(s, first)) < 0) {
		ks_destroy(s);
		return rc;
	}
	s->served = s->target;
	src->ops = &kmod_source_ops;
	src->ctx = s;
	return 0;
}

kvmem_kmod *kvmem_page_source_kmod_client(const kvmem_page_source *src)
{
	return src && src->ops == &kmod_source_ops ? ((struct ksrc *)src->ctx)->k : NULL;
}

int kvmem_page_source_kmod_stats(const kvmem_page_source *src, struct kvmem_ioc_stats *st)
{
	struct ksrc *s;
	int rc;

	if (!src || src->ops != &kmod_source_ops)
		return kvmem_error(EINVAL, "page source: not a kmod source");
	s = src->ctx;
	if ((rc = kvmem_kmod_stats(s->k, st)) < 0)
		return rc;
	add_counters(st, &s->before);
	return 0;
}

/* The pager source inside commits, then the module follows (its page
 * count, its step). */
static int ks_commit(void *ctx, const int32_t *ids, int64_t n, const void *app, uint32_t app_len)
{
	struct ksrc *s = ctx;
	int rc;

	if ((rc = kvmem_page_source_commit(&s->inner, ids, n, app, app_len)) < 0)
		return rc;
	s->target = kvmem_pager_committed_tokens(s->p) / s->g->block_tokens;
	if (kvmem_kmod_step(s->k, ++s->step) < 0)
		return kvmem_fail();
	return follow(s);
}
